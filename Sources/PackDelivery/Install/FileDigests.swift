import Dispatch
import Foundation
import Synchronization

/// The SHA-256 of every file an unpack writes (recorded for `packs verify` and delta updates), computed on a
/// queue of its own when the unpack's thread also decompresses.
///
/// Decompressing, parsing, writing and hashing, the unpack's thread was the slowest of a streamed fetch: it
/// fell behind the download and caught up after the last byte. With ``onQueue``, the unpack copies each
/// block into a 1 MiB chunk and hands full chunks to a serial queue (many small files share a chunk): a
/// 1 GiB tar.zst fetch took 0.82–0.88 of the time it took with the hashes on the unpack's thread. For a
/// plain tar, whose unpack only copies, the catch-up vanished too, but the download itself slowed by as
/// much: on two cores the fetch is bound by its total CPU, which the copy and the second thread raise
/// (1.11 of the time in the best-balanced run, 0.1–0.9 CPU-s more). So a plain tar's blocks are hashed
/// where they are, as before.
///
/// Used from one thread (the unpack's), which calls ``begin()``, ``add(_:)``, ``addZeros(_:)``, ``end()``
/// per file and ``finish()`` once.
final class FileDigests {
    /// One step of the hashing, in order.
    private enum Step {
        case begin
        case bytes(Range<Int>)
        case zeros(Int64)
        case end(Int)
    }

    /// Bytes and the steps that use them, handed to the queue as a whole.
    ///
    /// `@unchecked Sendable`: a chunk has one owner at a time. The unpack's thread fills it, hands it to the
    /// queue and never touches it again; the queue hashes it and puts it on the spare list, from which the
    /// unpack's thread takes it back (through the mutex, which orders the two).
    private final class Chunk: @unchecked Sendable {
        let data = UnsafeMutableRawBufferPointer.allocate(byteCount: FileDigests.chunkSize, alignment: 16)
        var count = 0
        var steps: [Step] = []

        deinit { self.data.deallocate() }
    }

    /// The queue's side: one hasher, the digests made, and chunks to reuse.
    ///
    /// `@unchecked Sendable`: `hasher` (not thread-safe) is touched only by blocks on `queue`, which is serial;
    /// everything else is behind a mutex, a semaphore or immutable.
    private final class Worker: @unchecked Sendable {
        let queue = DispatchQueue(label: "PackDelivery.file-digests")
        let hasher = SHA256Hasher()
        let digests = Mutex<[Int: String]>([:])
        let spare = Mutex<[Chunk]>([])
        /// Chunks handed over and not yet hashed, at most `FileDigests.chunksInFlight`.
        let slots = DispatchSemaphore(value: FileDigests.chunksInFlight)

        func hash(_ chunk: Chunk) {
            var made: [(Int, String)] = []
            for step in chunk.steps {
                switch step {
                case .begin: self.hasher.reset()
                case .bytes(let range): self.hasher.update(UnsafeRawBufferPointer(rebasing: chunk.data[range]))
                case .zeros(let count): FileDigests.hashZeros(self.hasher, count: count)
                case .end(let id): made.append((id, self.hasher.hexDigest()))
                }
            }
            if !made.isEmpty { self.digests.withLock { for (id, digest) in made { $0[id] = digest } } }
            chunk.count = 0
            chunk.steps.removeAll(keepingCapacity: true)
            self.spare.withLock { $0.append(chunk) }
            self.slots.signal()
        }
    }

    static let chunkSize = 1 << 20
    /// At most this many chunks wait for the queue (so at most 4 MiB per unpack).
    static let chunksInFlight = 4

    // Made on first use: an unpack that hashes on its own thread allocates neither.
    private lazy var worker = Worker()
    private lazy var chunk = Chunk()
    private var nextID = 0
    /// Hash on the queue (true) or on the calling thread; set before the first ``begin()``.
    var onQueue = true
    /// The calling thread's hasher and digests, when not ``onQueue``.
    private let hasher = SHA256Hasher()
    private var digests: [Int: String] = [:]

    /// Starts the next file. - Returns: the id its digest is found under in ``finish()``.
    func begin() -> Int {
        if !self.onQueue { self.hasher.reset() } else { self.chunk.steps.append(.begin) }
        defer { self.nextID += 1 }
        return self.nextID
    }

    /// The file's next bytes.
    func add(_ bytes: UnsafeRawBufferPointer) {
        guard self.onQueue else { return self.hasher.update(bytes) }
        var rest = bytes
        while !rest.isEmpty {
            let chunk = self.chunk
            let room = Self.chunkSize - chunk.count
            if room == 0 {
                self.flush()
                continue
            }
            let part = UnsafeRawBufferPointer(rebasing: rest.prefix(room))
            UnsafeMutableRawBufferPointer(rebasing: chunk.data[chunk.count..<(chunk.count + part.count)]).copyMemory(from: part)
            chunk.steps.append(.bytes(chunk.count..<(chunk.count + part.count)))
            chunk.count += part.count
            rest = UnsafeRawBufferPointer(rebasing: rest.dropFirst(part.count))
        }
    }

    /// `count` zero bytes (a hole of a sparse file).
    func addZeros(_ count: Int64) {
        guard count > 0 else { return }
        if !self.onQueue { Self.hashZeros(self.hasher, count: count) } else { self.chunk.steps.append(.zeros(count)) }
    }

    /// The file begun last is complete.
    func end() {
        if !self.onQueue { self.digests[self.nextID - 1] = self.hasher.hexDigest() } else { self.chunk.steps.append(.end(self.nextID - 1)) }
    }

    /// Waits for every chunk to be hashed. - Returns: the digests by id (of files that were ended).
    func finish() -> [Int: String] {
        guard self.onQueue else { return self.digests }
        self.flush()
        self.worker.queue.sync {}
        return self.worker.digests.withLock { $0 }
    }

    /// Hands the current chunk to the queue, waiting while `chunksInFlight` chunks are queued.
    private func flush() {
        guard !self.chunk.steps.isEmpty else { return }
        self.worker.slots.wait()
        let full = self.chunk
        self.chunk = self.worker.spare.withLock { $0.popLast() } ?? Chunk()
        let worker = self.worker
        worker.queue.async { worker.hash(full) }
    }

    private static let zeros = [UInt8](repeating: 0, count: 64 << 10)

    /// Feeds `count` zero bytes to `hasher`.
    static func hashZeros(_ hasher: SHA256Hasher, count: Int64) {
        var left = count
        while left > 0 {
            let step = Int(min(left, Int64(Self.zeros.count)))
            Self.zeros.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[0..<step])) }
            left -= Int64(step)
        }
    }
}
