import Foundation
import Synchronization

/// Hashes a partial file on a thread of its own, following the writer from the page cache.
///
/// The transfer thread only receives and writes; SHA-256 runs beside it. The writer reports how far the file is written (``advance(to:)``), restarts it from
/// zero (``restart()``), and at the end asks for the digest of the first `length` bytes
/// (``finish(length:then:)``), which arrives once hashing has caught up.
final class HashFollower: Sendable {
    private struct State {
        /// Bytes the writer has written and will not change.
        var written: Int64 = 0
        /// Bumped by restart(): the hash starts over.
        var generation = 0
        var finish: (length: Int64, then: @Sendable (String) -> Void)?
        var cancelled = false
    }

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)

    /// Starts hashing `file` from byte 0 on a new thread.
    /// - Parameter file: the partial file; the follower opens it for reading itself.
    init(file: URL) {
        let path = file.path
        let thread = Thread { [self] in self.run(path: path) }
        thread.name = "PackDelivery.hash"
        thread.start()
    }

    /// The writer has written the file up to `offset`.
    func advance(to offset: Int64) {
        self.state.withLock { $0.written = max($0.written, offset) }
        self.wake.signal()
    }

    /// The writer truncated the file and writes it again from byte 0.
    func restart() {
        self.state.withLock { $0.generation += 1; $0.written = 0 }
        self.wake.signal()
    }

    /// Calls `then` (on the follower's thread) with the hex digest of the first `length` bytes, once hashed.
    func finish(length: Int64, then: @escaping @Sendable (String) -> Void) {
        self.state.withLock { $0.written = length; $0.finish = (length, then) }
        self.wake.signal()
    }

    /// Stops hashing; nothing is reported.
    func cancel() {
        self.state.withLock { $0.cancelled = true }
        self.wake.signal()
    }

    private func run(path: String) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        defer { if fd >= 0 { close(fd) } }
        let hasher = SHA256Hasher()
        let chunk = 1 << 20
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
        defer { buffer.deallocate() }
        var hashed: Int64 = 0
        var generation = 0
        while true {
            let (target, current, finish, cancelled) = self.state.withLock { ($0.written, $0.generation, $0.finish, $0.cancelled) }
            if cancelled || fd < 0 { return }
            if current != generation {
                generation = current
                hasher.reset()
                hashed = 0
                continue
            }
            if hashed < target {
                let want = Int(min(Int64(chunk), target - hashed))
                let got = pread(fd, buffer.baseAddress, want, off_t(hashed))
                if got <= 0 {
                    if got < 0 && errno == EINTR { continue }
                    // Shorter than the writer said: it truncated the file and a restart() is on its way.
                    self.wake.wait()
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
                finish.then(hasher.hexDigest())
                return
            }
            self.wake.wait()
        }
    }
}
