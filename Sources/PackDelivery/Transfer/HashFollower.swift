import Foundation
import Synchronization

/// Hashes a partial file on a thread of its own, following the writer from the page cache, and makes
/// what it has hashed durable from time to time.
///
/// The transfer thread only receives and writes; SHA-256 runs beside it. The writer reports how far the
/// file is written (``advance(to:)``), restarts it from zero (``restart()``), and at the end asks for the
/// digest of the first `length` bytes (``finish(length:then:)``), which arrives once hashing has caught
/// up — or an error, when the file cannot be read or is shorter than written (changed by someone else):
/// the follower never waits silently.
///
/// Every ``syncInterval`` seconds it `fdatasync`s the file and reports how many bytes are durable, so
/// that a checkpoint never records more than a power cut would leave (the partial file's own sync runs
/// here, never on the network thread).
final class HashFollower: Sendable {
    private struct State {
        /// Bytes the writer has written and will not change.
        var written: Int64 = 0
        /// Bumped by restart(): the hash starts over.
        var generation = 0
        var finish: (length: Int64, then: @Sendable (Result<String, PackDeliveryError>) -> Void)?
        var cancelled = false
        /// The written offset at the last wake-up (wake-ups come per MiB, not per piece).
        var signalled: Int64 = 0
    }

    /// Seconds between syncs of the partial file.
    static let syncInterval: TimeInterval = 2
    /// The writer wakes the follower once this much more is written.
    static let wakeEvery: Int64 = 1 << 20

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let onDurable: @Sendable (Int64) -> Void

    /// Starts hashing `file` from byte 0 on a new thread.
    /// - Parameters:
    ///   - file: the partial file; the follower opens it for reading itself.
    ///   - onDurable: called on the follower's thread with the bytes made durable by each sync.
    init(file: URL, length: Int64 = 1 << 20, onDurable: @escaping @Sendable (Int64) -> Void = { _ in }) {
        self.onDurable = onDurable
        let path = file.path
        let chunk = Int(min(1 << 20, max(4096, length)))
        let thread = Thread { [self] in self.run(path: path, chunk: chunk) }
        thread.name = "PackDelivery.hash"
        thread.start()
    }

    /// The writer has written the file up to `offset`.
    func advance(to offset: Int64) {
        let signal = self.state.withLock { state -> Bool in
            state.written = max(state.written, offset)
            guard state.written - state.signalled >= Self.wakeEvery else { return false }
            state.signalled = state.written
            return true
        }
        if signal { self.wake.signal() }
    }

    /// The writer truncated the file and writes it again from byte 0.
    func restart() {
        self.state.withLock {
            $0.generation += 1
            $0.written = 0
            $0.signalled = 0
        }
        self.wake.signal()
    }

    /// Calls `then` (on the follower's thread) with the hex digest of the first `length` bytes, once hashed,
    /// or with the error that kept them from being read.
    func finish(length: Int64, then: @escaping @Sendable (Result<String, PackDeliveryError>) -> Void) {
        self.state.withLock {
            $0.written = length
            $0.finish = (length, then)
        }
        self.wake.signal()
    }

    /// Stops hashing; nothing is reported.
    func cancel() {
        self.state.withLock { $0.cancelled = true }
        self.wake.signal()
    }

    private func run(path: String, chunk: Int) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        defer { if fd >= 0 { close(fd) } }
        var failure: PackDeliveryError? = fd < 0 ? .io("open the partial download for hashing", path: path, errno: errno) : nil
        let hasher = SHA256Hasher()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
        defer { buffer.deallocate() }
        var hashed: Int64 = 0
        var generation = 0
        var durable: Int64 = 0
        var lastSync = Date()
        while true {
            let (target, current, finish, cancelled) = self.state.withLock { ($0.written, $0.generation, $0.finish, $0.cancelled) }
            if cancelled { return }
            if let failure {
                // Nothing more can be hashed: say so when the writer asks for the digest.
                if let finish {
                    finish.then(.failure(failure))
                    return
                }
                self.wake.wait()
                continue
            }
            if current != generation {
                generation = current
                hasher.reset()
                hashed = 0
                durable = 0
                continue
            }
            if hashed < target {
                let want = Int(min(Int64(chunk), target - hashed))
                let got = pread(fd, buffer.baseAddress, want, off_t(hashed))
                if got < 0 {
                    if errno == EINTR { continue }
                    failure = .io("read the partial download for hashing", path: path, errno: errno)
                    continue
                }
                if got == 0 {
                    if finish != nil, self.state.withLock({ $0.generation }) == generation {
                        // The writer is done, yet the file ends early: something else truncated it.
                        failure = PackDeliveryError(
                            .fileSystem,
                            message:
                                "The partial download \(path) is \(hashed) bytes long, shorter than the \(target) bytes written: something else changed it.",
                            hint: "It will be fetched again.", subject: path)
                        continue
                    }
                    // The writer truncated the file and a restart() is on its way; look again shortly.
                    _ = self.wake.wait(timeout: .now() + 0.1)
                    continue
                }
                // A restart while reading makes these bytes stale: only count them in the same generation.
                if self.state.withLock({ $0.generation }) == generation {
                    hasher.update(UnsafeRawBufferPointer(rebasing: buffer[0..<got]))
                    hashed += Int64(got)
                }
                continue
            }
            if let finish, hashed == finish.length {
                finish.then(.success(hasher.hexDigest()))
                return
            }
            if hashed - durable >= Self.wakeEvery, Date().timeIntervalSince(lastSync) >= Self.syncInterval {
                // Only what was hashed (and so written) counts as durable after this sync.
                lastSync = Date()
                if fdatasync(fd) == 0 {
                    durable = hashed
                    self.onDurable(durable)
                }
            }
            _ = self.wake.wait(timeout: .now() + Self.syncInterval)
        }
    }
}
