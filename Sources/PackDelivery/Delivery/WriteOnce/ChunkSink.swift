import CLinux
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Takes one request of a first install as it arrives: the pack's bytes from its first window's start to its last
/// window's end, in order (consecutive windows of ``ChunkPlan/windows(_:in:window:)``). Each chunk's stored bytes are
/// gathered, decoded as its storage says, checked against its SHA-256 and written into the tree's files; the bytes
/// between chunks (tar headers, padding) and between windows are passed over. A chunk that does not match is noted in
/// ``bad`` and nothing of it is written (but for a large chunk, which is streamed: ``StreamedChunk``; its bytes are
/// written as they arrive and count only once they matched). At each window's end the chunks written since the last one go to the
/// ``SinkCommitter`` as a ``CommitBatch`` (synced and recorded on its worker), and the sink goes on with the next
/// window: nothing waits for a window's end but the commit, which runs beside the transfer.
///
/// The work is spread over the cores: the transfer thread gathers each chunk's stored bytes (one copy, from the
/// transfer's buffer) and hands about ``checkBytes`` of chunks at a time to a check (decoding and SHA-256, the most CPU
/// of the install) on the ``WorkerPool``; `writes` takes the checked chunks in the pack's order, writes them into the
/// files (``DirectFile``) and hands each window's batch to the committer. Measured on 2 cores (when the checks ran on
/// libdispatch's global queue, one at a time beside the transfer), queues of their own that ran two at once made the
/// install no faster, as the writes set its pace (their direct writes, one at a time: ext4 serializes the writes that extend a file). At most
/// ``checksInFlight`` checks run or wait to be written (`consume` waits for room beyond that), and at most
/// ``SinkCommitter/batchesInFlight`` batches wait to be committed. Read its results only after ``drain()``.
final class ChunkSink: TransferSink, @unchecked Sendable {
    // Safe: `consume` runs on the transfer thread, one call at a time, and alone runs `take` and changes `position`,
    // `next`, `window`, `stored`, `gathered` and the streaming fields while the transfer runs (then `drain`, on the run's thread once the
    // transfer reported `.finished`: the engine's report orders the two); each check runs on a thread of its own with
    // its own bytes and result (``Check``), which `writes` reads only after the check ended (its semaphore). `writes`, a
    // serial queue, alone changes `batch`, `files`, `lastFile`, `bad`, `checkError`, `writeError` and `state` (and
    // hands batches to the committer, a `Sendable` type of its own); `failed` is atomic. The run's thread reads the
    // state only after `drain()` (the last check handed over, then a `writes.sync`), and starts the next request's sink
    // (which shares `state`) only after that.
    /// The checks (each of ``checkBytes`` or so of chunks) running or waiting to be written, at most: 1 MiB of the pack
    /// between the transfer and the disk. With 2 (512 KiB), a direct write that took its time held a check's slot and
    /// with it the transfer, so every stage waited on another and the cores were half idle: the 1 GiB install took
    /// 1.31-1.67 s against 0.96-1.20 s with 4, for 0.5 MB more peak RSS (alternated 6 times, `curl -o` 1.06-1.22 s).
    static let checksInFlight = 4
    /// The stored bytes of the chunks one check takes, about: enough that handing them from thread to thread (a wake-up
    /// each) costs little against checking them (a check a chunk, about 25,000 a GiB, spent a fifth of the CPU in
    /// futex wake-ups), few enough that the checks in flight hold little memory.
    static let checkBytes = 256 << 10
    /// The decoded bytes of the chunks one check takes, at most (but for one chunk): the stored bytes alone do not bound
    /// them, as an index may declare chunks that decode to far more than they are stored in (issue 43). 1 MiB: a check
    /// of ``checkBytes`` of common chunks, compressed to half, decodes to 512 KiB, and stays as it was.
    static let checkDecodedBytes: Int64 = 1 << 20
    private let writes = DispatchQueue(label: "PackDelivery.chunk-sink.write")
    private let checking = DispatchSemaphore(value: ChunkSink.checksInFlight)
    private let failed = Atomic<Bool>(false)
    private let assembly: ChunkAssembly
    private let chunks: [PackIndex.Chunk]
    private let destinations: ChunkAssembly.Destinations
    private let state: FirstInstallState
    private let committer: SinkCommitter
    /// The request's chunk numbers, by offset in the pack.
    private let order: [Int]
    /// For each window, how many of `order`'s chunks lie in it and the windows before it.
    private let ends: [Int]
    /// The pack offset of the next byte to arrive.
    private var position: Int64
    private var next = 0
    /// The window that `order[next]` lies in (the windows before it were handed over).
    private var window = 0
    /// The stored bytes of chunk `order[next]` gathered so far.
    private var stored: [UInt8] = []
    /// The chunks gathered for the next check: each chunk (or the slices of one shared frame) with its stored bytes
    /// (nil: they could not be gathered), and their size.
    private var gathered: [(numbers: [Int], stored: [UInt8]?)] = []
    private var gatheredBytes = 0
    /// The bytes the gathered chunks decode to (a shared frame and its slices), which their check holds until written.
    private var gatheredDecoded: Int64 = 0
    /// The large chunk (or slices of a large frame) being streamed (``StreamedChunk``), its stored bytes received so
    /// far, and its numbers.
    private var streaming: StreamedChunk?
    private var streamed: Int64 = 0
    private var streamedNumbers: [Int] = []
    /// What the window being written wrote (on `writes`): its chunks, its files and the folders of those it opened.
    private var batch = CommitBatch()
    /// The files open for writing (on `writes`): at a window's end each one written in it is flushed and handed over
    /// (a descriptor of its own), and only the one written last stays open, as the next window most likely goes on
    /// with it.
    private var files: [Int: DirectFile] = [:]
    private var lastFile: Int?
    /// The chunks that did not match.
    private(set) var bad: [Int] = []
    /// Why the sink ended the transfer: a chunk that did not match (``endAtFirstBad``), or a write that failed.
    var error: (any Error)? { self.checkError ?? self.writeError }
    private var checkError: (any Error)?
    private var writeError: (any Error)?
    /// What ends the transfer at the first chunk that does not match (a pack with several sources: the rest comes from
    /// another), or nil to note it in ``bad`` and go on (one source: it is fetched once more).
    private let endAtFirstBad: (any Error)?

    /// - Parameter windows: consecutive windows, in the pack's order.
    init(
        _ windows: [ChunkPlan.Range], assembly: ChunkAssembly, chunks: [PackIndex.Chunk], destinations: ChunkAssembly.Destinations,
        state: FirstInstallState, committer: SinkCommitter, endAtFirstBad: (any Error)? = nil
    ) {
        self.endAtFirstBad = endAtFirstBad
        self.assembly = assembly
        self.chunks = chunks
        self.destinations = destinations
        self.state = state
        self.committer = committer
        var order: [Int] = []
        var ends: [Int] = []
        for window in windows {
            order += window.chunks.sorted { chunks[$0].offset < chunks[$1].offset }
            ends.append(order.count)
        }
        (self.order, self.ends) = (order, ends)
        self.position = windows.first?.start ?? 0
    }

    deinit { for file in self.files.values { file.close() } }

    func consume(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard !self.failed.load(ordering: .acquiring), !self.committer.failed else { return false }
        self.take(bytes)
        return true
    }

    /// Waits until every byte handed over is checked and written (or the sink failed).
    func drain() {
        self.check()
        self.writes.sync {}
    }

    /// Hands what was written since the last window's end to the committer (after ``drain()``, once the transfer
    /// ended, whole or not: what was checked and written before the end still counts).
    func handOverRest() { self.writes.sync { self.handOver() } }

    private func take(_ bytes: UnsafeRawBufferPointer) {
        var rest = bytes[...]
        while !rest.isEmpty, self.next < self.order.count {
            let number = self.order[self.next]
            let chunk = self.chunks[number]
            if self.position < chunk.offset {
                let skip = Int(min(Int64(rest.count), chunk.offset - self.position))
                rest = rest.dropFirst(skip)
                self.position += Int64(skip)
                continue
            }
            let have = self.streaming != nil ? self.streamed : Int64(self.stored.count)
            // A chunk that starts before the bytes arriving (an index with overlapping chunks) cannot be read here.
            guard self.position == chunk.offset + have else {
                self.gathered.append(([number], nil))
                self.stored.removeAll(keepingCapacity: true)
                self.advance()
                continue
            }
            if have == 0, self.streaming == nil, StreamedChunk.isLarge(chunk), StreamedChunk.canStream(chunk.storage) {
                self.startStream(self.group(number))
            }
            let take = Int(min(Int64(rest.count), chunk.length - have))
            if let streaming = self.streaming {
                self.stream(UnsafeRawBufferPointer(rebasing: rest.prefix(take)), into: streaming)
            } else {
                // A new buffer for each chunk: the last one's bytes are being checked.
                if self.stored.isEmpty { self.stored.reserveCapacity(Int(min(chunk.length, 4 << 20))) }
                self.stored.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest.prefix(take)))
            }
            rest = rest.dropFirst(take)
            self.position += Int64(take)
            if have + Int64(take) == chunk.length {
                if let streaming = self.streaming {
                    self.endStream(streaming)
                    continue
                }
                // The other slices of a shared frame: the same stored bytes, cut from the frame decompressed once.
                let numbers = self.group(number)
                self.gathered.append((numbers, self.stored))
                self.gatheredBytes += self.stored.count
                // What the check will hold decoded: the chunk, or the frame and its slices.
                self.gatheredDecoded += numbers.reduce(chunk.frameSize ?? 0) { $0 + self.chunks[$1].size }
                if self.gatheredBytes >= Self.checkBytes || self.gatheredDecoded >= Self.checkDecodedBytes { self.check() }
                for _ in numbers { self.advance() }
                self.stored = []
            }
        }
        self.position += Int64(rest.count)
    }

    /// Chunk `number` (`order[next]`) and, when it is a slice of a shared frame, the slices of the same frame after it.
    private func group(_ number: Int) -> [Int] {
        let chunk = self.chunks[number]
        var numbers = [number]
        while self.next + numbers.count < self.order.count, chunk.storage == .zstdFrameSlice,
            self.chunks[self.order[self.next + numbers.count]].offset == chunk.offset,
            self.chunks[self.order[self.next + numbers.count]].length == chunk.length
        {
            numbers.append(self.order[self.next + numbers.count])
        }
        return numbers
    }

    /// Starts streaming a large chunk (or the slices of a large frame), after the chunks gathered before it went to
    /// their check, so that the writes keep the pack's order.
    private func startStream(_ numbers: [Int]) {
        self.check()
        self.streaming = StreamedChunk(numbers, chunks: self.chunks)
        self.streamed = 0
        self.streamedNumbers = numbers
    }

    /// Hands a piece of a streamed chunk's stored bytes to `writes`, which decodes, hashes and writes it; at most
    /// ``checksInFlight`` pieces (or checks) wait there.
    private func stream(_ bytes: UnsafeRawBufferPointer, into streaming: StreamedChunk) {
        let piece = [UInt8](bytes)
        self.streamed += Int64(piece.count)
        self.checking.wait()
        self.writes.async { [self] in
            defer { self.checking.signal() }
            guard self.writeError == nil, self.checkError == nil else { return }
            do {
                try streaming.feed(piece) { bytes, number, at in
                    self.lastFile =
                        try self.assembly.write(
                            bytes, chunk: number, at: at, destinations: self.destinations, files: &self.files, batch: &self.batch,
                            directories: &self.state.directories) ?? self.lastFile
                }
            } catch {
                self.writeError = error
                self.failed.store(true, ordering: .releasing)
            }
        }
    }

    /// The streamed chunk's last stored byte arrived: `writes` records the chunks that matched, and notes the others
    /// as ``bad``, as a check's results.
    private func endStream(_ streaming: StreamedChunk) {
        self.writes.async { [self] in
            guard self.writeError == nil, self.checkError == nil else { return }
            for (number, matched) in streaming.finish() {
                if matched {
                    self.batch.numbers.append(number)
                } else {
                    self.noteBad(number)
                }
            }
        }
        self.streaming = nil
        for _ in self.streamedNumbers { self.advance() }
    }

    /// A chunk that did not match: noted, and the transfer ended when ``endAtFirstBad`` says so (on `writes`).
    private func noteBad(_ number: Int) {
        self.bad.append(number)
        if let endAtFirstBad = self.endAtFirstBad {
            self.checkError = endAtFirstBad
            self.failed.store(true, ordering: .releasing)
        }
    }

    /// On to the next chunk; at a window's end, the window's chunks are checked, and handed over once written.
    private func advance() {
        self.next += 1
        while self.window < self.ends.count, self.next >= self.ends[self.window] {
            self.window += 1
            self.check()
            self.writes.async { [self] in self.handOver() }
        }
    }

    /// Hands the chunks written since the last call to the committer (on `writes`), their files flushed (staged bytes
    /// written into them). When a flush fails, nothing is handed over: a resume fetches those chunks again.
    private func handOver() {
        var batch = self.batch
        self.batch = CommitBatch()
        do {
            for (entry, file) in self.files where batch.written.contains(entry) {
                try file.flush()
                let copy = dup(file.fd)
                guard copy >= 0 else {
                    throw PackDeliveryError.io("duplicate the descriptor of", path: self.assembly.tree.path, errno: errno)
                }
                batch.files[entry] = copy
            }
        } catch {
            for fd in batch.files.values { close(fd) }
            if self.writeError == nil { self.writeError = error }
            self.failed.store(true, ordering: .releasing)
            return
        }
        for (entry, file) in self.files where entry != self.lastFile {
            file.close()
            self.files[entry] = nil
        }
        self.committer.submit(batch)
    }

    /// What one check found: each chunk's decoded bytes, or nil for one that does not match. Written by its check
    /// alone, and read by `writes` only after the check ended.
    private final class Check: @unchecked Sendable {
        // Safe: `results` is set once by the check, which then signals `done`; it is read only after `done.wait()`
        // returned, which orders the two.
        var results: [(number: Int, bytes: [UInt8]?)] = []
        let done = DispatchSemaphore(value: 0)
    }

    /// Checks the chunks gathered (each chunk, or the slices of one shared frame, from its stored bytes) on another
    /// thread, and has `writes` write those that match, in the order they arrived.
    private func check() {
        guard !self.gathered.isEmpty else { return }
        let gathered = self.gathered
        (self.gathered, self.gatheredBytes, self.gatheredDecoded) = ([], 0, 0)
        self.checking.wait()
        let check = Check()
        let chunks = self.chunks
        WorkerPool.shared.run {
            defer { check.done.signal() }
            for (numbers, stored) in gathered {
                var frames = ChunkAssembly.FrameCache()
                for number in numbers {
                    let chunk = chunks[number]
                    guard let stored, let bytes = frames.decode(chunk, stored: { stored }),
                        ChunkAssembly.sha256(bytes) == ChunkPlan.lowercase(chunk.sha256)
                    else {
                        check.results.append((number, nil))
                        continue
                    }
                    check.results.append((number, bytes))
                }
            }
        }
        self.writes.async { [self] in
            defer { self.checking.signal() }
            check.done.wait()
            for (number, bytes) in check.results {
                // After a write failed, or a chunk that did not match ended the transfer, nothing more is written; after
                // a chunk that did not match otherwise, the chunks checked after it still are (a resume does not fetch
                // them again).
                guard self.writeError == nil, self.checkError == nil else { return }
                guard let bytes else {
                    self.noteBad(number)
                    continue
                }
                do {
                    self.lastFile =
                        try self.assembly.write(
                            bytes, chunk: number, destinations: self.destinations, files: &self.files, batch: &self.batch,
                            directories: &self.state.directories) ?? self.lastFile
                    self.batch.numbers.append(number)
                } catch {
                    self.writeError = error
                    self.failed.store(true, ordering: .releasing)
                }
            }
        }
    }
}

/// Commits the batches of a first install's sinks (``ChunkAssembly/commit(_:)``: files synced, chunks recorded), in
/// order, on a worker of its own, while the transfer goes on. After a batch failed to commit, the later ones are not
/// recorded (their files are closed), and the sinks end their transfers.
final class SinkCommitter: @unchecked Sendable {
    // Safe: `assembly` is a constant copy of a struct of constants (URLs, the index, a `Sendable` writer, and an
    // `isCancelled` closure that only reads an atomic flag), used only by `commit`, on the serial `queue`; the sinks use
    // their own copies on their own queues. `failure` is under a mutex, and the semaphore and queue are thread-safe.
    /// The batches handed over and not committed yet, at most: the window being committed. The next window's batch waits
    /// for it on the sink's `writes` queue, and with it the transfer, so that at most two windows (the one committing and
    /// the one arriving) are lost to a kill, as with a request a window. The stall watchdog counts that wait: a commit of a
    /// window, 16 MiB at most, that takes longer than the stall timeout is a disk too slow to install on.
    static let batchesInFlight = 1
    private let assembly: ChunkAssembly
    private let queue = DispatchQueue(label: "PackDelivery.chunk-commit")
    private let room = DispatchSemaphore(value: SinkCommitter.batchesInFlight)
    private let failure = Mutex<(any Error)?>(nil)

    init(_ assembly: ChunkAssembly) { self.assembly = assembly }

    /// Whether a batch failed to commit.
    var failed: Bool { self.failure.withLock { $0 != nil } }

    /// Commits `batch` on the worker, after those handed over before it; waits while ``batchesInFlight`` wait.
    func submit(_ batch: CommitBatch) {
        guard !batch.numbers.isEmpty || !batch.files.isEmpty else { return }
        self.room.wait()
        self.queue.async { [self] in
            defer { self.room.signal() }
            guard !self.failed else {
                for fd in batch.files.values { close(fd) }
                return
            }
            do { try self.assembly.commit(batch) } catch { self.failure.withLock { $0 = $0 ?? error } }
            // The window's buffers, freed on the sink's threads, are given back rather than kept in their heaps.
            _ = clinux_malloc_trim(0)
        }
    }

    /// Waits for the batches handed over; throws what committing one threw (again at each call).
    func wait() throws {
        self.queue.sync {}
        if let error = self.failure.withLock({ $0 }) { throw error }
    }

    /// Waits for the batches handed over, whatever their outcome.
    func waitQuietly() { self.queue.sync {} }
}
