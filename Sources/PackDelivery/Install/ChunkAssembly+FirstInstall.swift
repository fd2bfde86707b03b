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

/// A first install of an indexed tar or tar.zst pack, written once (issue 29, "Write each byte once"): the
/// install is a chunked update from nothing (``ChunkPlan`` with nothing reused), whose verified chunks are written
/// straight into the files of the new version's tree (`downloads/<id>.delta/tree`) at their offsets, instead of
/// into a file per chunk. No archive is kept.
///
/// What is durable, in `downloads/<id>.delta/`:
/// - `tree/`: the folders and symlinks, made first by the unpacker (with all its checks), then the files as their
///   chunks arrive;
/// - `verified`: the numbers (in ``ChunkPlan/fetch``) of the chunks written and synced, 4 bytes each, appended and
///   synced only after the files holding them were synced. Its existence says the folders and symlinks are made.
///
/// A range's bytes are never kept in a file: they go from the transfer straight into a ``ChunkSink``, which checks
/// each chunk as its last byte arrives and writes it into the files. A resume (after a pause, a kill or a power cut)
/// fetches only the chunks the record does not name.
extension ChunkAssembly {
    var tree: URL { self.folder.appending(path: "tree") }
    var record: URL { self.folder.appending(path: "verified") }

    /// Where each fetched chunk goes: the entry number and offset of every place in a file that holds it.
    static func destinations(_ plan: ChunkPlan) -> Destinations {
        var destinations = Destinations(count: plan.fetch.count)
        for build in plan.build {
            var offset: Int64 = 0
            for piece in build.pieces {
                if case .fetched(let number) = piece.source { destinations.add(number, entry: build.number, offset: offset) }
                offset += piece.size
            }
        }
        return destinations
    }

    /// The places of each fetched chunk, kept flat: most chunks have one place, so one entry number and one offset a
    /// chunk, and the other places in a dictionary. A 1 GiB pack has about 25,000 chunks: 400 KB here, against 1.6 MB
    /// as an array of arrays (one allocation a chunk), held through the whole install.
    struct Destinations: Sendable {
        private var entries: [Int]
        private var offsets: [Int64]
        private var more: [Int: [(entry: Int, offset: Int64)]] = [:]

        init(count: Int) {
            self.entries = Array(repeating: -1, count: count)
            self.offsets = Array(repeating: 0, count: count)
        }

        mutating func add(_ number: Int, entry: Int, offset: Int64) {
            if self.entries[number] < 0 {
                (self.entries[number], self.offsets[number]) = (entry, offset)
            } else {
                self.more[number, default: []].append((entry, offset))
            }
        }

        /// The first place of chunk `number` (where the pack holds it, for a pack that `packs pack` wrote), or nil.
        func first(_ number: Int) -> (entry: Int, offset: Int64)? {
            self.entries[number] >= 0 ? (self.entries[number], self.offsets[number]) : nil
        }

        /// The other places of chunk `number`, in the order they were added: copies of a chunk that repeats.
        func copies(_ number: Int) -> [(entry: Int, offset: Int64)] { self.more[number] ?? [] }
    }

    /// The chunks verified by an earlier attempt, from the record; when there is none, a fresh tree with the plan's
    /// folders and symlinks (made by the unpacker) and an empty record.
    func prepareTree(_ plan: ChunkPlan) throws -> Set<Int> {
        var info = stat()
        if stat(self.record.path, &info) == 0, lstat(self.tree.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR,
            let data = try? Data(contentsOf: self.record)
        {
            return Self.recordedChunks(data).filter { $0 < plan.fetch.count }
        }
        unlink(self.record.path)
        try Installer.removeTree(self.tree)
        if mkdir(self.tree.path, 0o755) != 0 { throw Installer.fileError("create the new version's folder", self.tree.path, errno) }
        if !plan.directories.isEmpty || !plan.links.isEmpty {
            let links = self.folder.appending(path: "links.tar")
            let size = try self.writeLinks(plan, to: links)
            defer { unlink(links.path) }
            _ = try Unpacker.unpack(
                archive: links, into: self.tree,
                limits: UnpackLimits(maxBytes: size + 1, maxEntries: plan.directories.count + plan.links.count + 1),
                isCancelled: self.isCancelled, writer: self.writer)
        }
        try Durability.syncFolder(self.tree)
        try DeltaAssembly.writeDurably(Data(), to: self.record)
        try Durability.syncFolder(self.folder)
        return []
    }

    /// The chunk numbers a `verified` record holds: 4 bytes each, little-endian (a torn last entry is left out).
    static func recordedChunks(_ data: Data) -> Set<Int> {
        var numbers = Set<Int>()
        let bytes = [UInt8](data)
        for start in stride(from: 0, to: bytes.count - bytes.count % 4, by: 4) {
            numbers.insert(Int(bytes[start]) | Int(bytes[start + 1]) << 8 | Int(bytes[start + 2]) << 16 | Int(bytes[start + 3]) << 24)
        }
        return numbers
    }

    /// The staging buffer of a file being written (``DirectFile``): direct writes of 512 KiB, half the default, as the
    /// install's peak RSS has little room (measured: the same time as 1 MiB).
    static let stagingBytes = 512 << 10

    /// Writes a verified chunk at its offsets into the tree's files (opened once, kept in `files`; the files written, and
    /// the folders they are opened in, noted in `batch`): long runs of a file go to the device with `O_DIRECT` (``DirectFile``), past the
    /// page cache, whose writes cost most of a core per GiB here; the copies of a chunk that repeats go aside
    /// (``DirectFile/writeAside(_:at:)``).
    /// - Returns: the entry number of the chunk's first place: the file the next chunks most likely go on with.
    func write(
        _ bytes: [UInt8], chunk number: Int, destinations: Destinations, files: inout [Int: DirectFile], batch: inout CommitBatch,
        directories: inout Set<String>
    ) throws -> Int? {
        guard let first = destinations.first(number) else { return nil }
        try bytes.withUnsafeBytes { bytes in
            try self.file(first.entry, files: &files, batch: &batch, directories: &directories).write(bytes, at: first.offset)
            // A copy (the chunk repeats) goes in aside: as a run of its own it would end the run of the file's bytes
            // arriving in order, at a cost of two short direct writes and four small ones (775 copies in case 10's
            // tar.zst of 1 GiB: 6,611 writes in all, 4,829 with the copies aside).
            for copy in destinations.copies(number) {
                try self.file(copy.entry, files: &files, batch: &batch, directories: &directories).writeAside(bytes, at: copy.offset)
            }
        }
        return first.entry
    }

    /// The open file of entry `entry` (opened when it is not, and kept in `files`), noted as written in `batch`.
    private func file(_ entry: Int, files: inout [Int: DirectFile], batch: inout CommitBatch, directories: inout Set<String>) throws
        -> DirectFile
    {
        if let open = files[entry] {
            batch.written.insert(entry)
            return open
        }
        let fd = try self.openFile(entry, directories: &directories, folders: &batch.folders)
        let file = DirectFile(
            fd: fd, file: self.tree.appending(path: self.index.entries[entry].path), writer: self.writer, stagingBytes: Self.stagingBytes)
        files[entry] = file
        batch.written.insert(entry)
        return file
    }

    /// Makes a batch's chunks count as written: the files that hold them are synced, and the folders in which they were
    /// opened (so that their names are durable), then the chunks are added to the record (synced); the batch's
    /// descriptors are closed whatever happens.
    func commit(_ batch: CommitBatch) throws {
        defer { for fd in batch.files.values { close(fd) } }
        // Synced before counted: a chunk in the record is on disk in every file that holds it.
        for (entry, fd) in batch.files where Durability.syncData(fd) != 0 {
            throw PackDeliveryError.io("sync", path: self.tree.appending(path: self.index.entries[entry].path).path, errno: errno)
        }
        for folder in batch.folders { try Durability.syncFolder(URL(filePath: folder)) }
        if !batch.numbers.isEmpty { try self.append(batch.numbers) }
    }

    /// Opens (creating it, and the folders above it, when missing) the file of entry `number` in the tree, never
    /// through a symlink; adds the folder that holds it to `folders`, which the caller syncs before any of its chunks
    /// counts as written (its name durable).
    func openFile(_ number: Int, directories: inout Set<String>, folders: inout Set<String>) throws -> Int32 {
        let path = self.index.entries[number].path
        let components = try DeltaAssembly.components(path)
        try DeltaAssembly.makeDirectories(Array(components.dropLast()), in: self.tree, made: &directories)
        let target = self.tree.appending(path: path)
        let fd = open(target.path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            if errno == ELOOP {
                throw PackDeliveryError(
                    .unsafeEntry, message: "The pack's index places a file at '\(PackDeliveryError.printable(path))', which is a symlink.",
                    hint: "Nothing was installed; the pack's index is wrong.", subject: path)
            }
            throw Installer.fileError("create", target.path, errno)
        }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            close(fd)
            throw PackDeliveryError(
                .unsafeEntry, message: "The pack's index places a file at '\(PackDeliveryError.printable(path))', which is not a file.",
                hint: "Nothing was installed; the pack's index is wrong.", subject: path)
        }
        folders.insert(target.deletingLastPathComponent().path)
        return fd
    }

    /// Adds chunk numbers to the record, durably.
    private func append(_ numbers: [Int]) throws {
        let fd = open(self.record.path, O_WRONLY | O_APPEND | O_CLOEXEC)
        guard fd >= 0 else { throw Installer.fileError("open", self.record.path, errno) }
        defer { close(fd) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(numbers.count * 4)
        for number in numbers {
            let value = UInt32(truncatingIfNeeded: number)
            bytes += [UInt8(value & 0xff), UInt8(value >> 8 & 0xff), UInt8(value >> 16 & 0xff), UInt8(value >> 24)]
        }
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        if written != bytes.count { throw DeltaAssembly.writeFailure(written, file: self.record, needed: Int64(bytes.count)) }
        guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync", path: self.record.path, errno: errno) }
    }

    /// The new version's tree, once every chunk is written: each file (empty ones created now) held to the size the
    /// index gives it and recorded with the SHA-256 the index gives it, its mode set; each symlink held to the index.
    ///
    /// The files are not hashed here (issue 29, "Installs without client-side digests"): each of their chunks was
    /// checked against the index as it arrived, and the index is covered by the manifest's SHA-256, so the install
    /// hashes each byte once. What that cannot show, an index whose file SHA-256 is not that of its own chunks (a
    /// publisher's bug), `verify` shows: it compares the installed file with the recorded, publisher's, SHA-256 and
    /// reports the file changed, as for a pack installed whole with the index's digests (``IndexDigests``).
    ///
    /// - Throws: `checksumMismatch` naming the first file whose size, or symlink whose target, is not the index's.
    func finish(_ plan: ChunkPlan) throws -> DeltaTree {
        var directories: Set<String> = [""]
        var folders: Set<String> = []
        var files: [InstalledFile] = []
        var bytes: Int64 = 0
        for build in plan.build {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            let entry = self.index.entries[build.number]
            let fd = try self.openFile(build.number, directories: &directories, folders: &folders)
            defer { close(fd) }
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw Installer.fileError("inspect", self.tree.appending(path: entry.path).path, errno) }
            // Every chunk is written (and checked) at its offset, so a file has its size; an empty file its 0 bytes.
            guard Int64(info.st_size) == entry.size, let digest = entry.sha256?.lowercased() else {
                throw PackDeliveryError(
                    .checksumMismatch,
                    message:
                        "The file \(PackDeliveryError.printable(entry.path)), built from the chunks the pack's index gives, does not have the size the index gives it.",
                    hint: "Nothing was installed; the pack's index is wrong.", subject: entry.path)
            }
            // As the unpacker sets modes: permissions up to 0o755, always readable and writable by the owner.
            if fchmod(fd, mode_t(((entry.mode ?? 0o644) & 0o755) | 0o600)) != 0 {
                throw Installer.fileError("set the mode of", self.tree.appending(path: entry.path).path, errno)
            }
            files.append(InstalledFile(path: entry.path, kind: .file, size: entry.size, sha256: digest))
            bytes += entry.size
        }
        // The names of the files made here (empty ones) are durable, as those of the files written before.
        for folder in folders { try Durability.syncFolder(URL(filePath: folder)) }
        for link in plan.links {
            let entry = self.index.entries[link.number]
            var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = readlink(self.tree.appending(path: entry.path).path, &buffer, buffer.count)
            guard count > 0, Self.sha256(Array(buffer[..<count])) == entry.sha256?.lowercased() else {
                throw PackDeliveryError(
                    .checksumMismatch,
                    message: "The symlink \(PackDeliveryError.printable(entry.path)) could not be made as the pack's index gives it.",
                    hint: "Nothing was installed; the pack's index is wrong.", subject: entry.path)
            }
            files.append(InstalledFile(path: entry.path, kind: .symlink, size: entry.size, sha256: entry.sha256?.lowercased() ?? ""))
            bytes += entry.size
        }
        // Every folder above an entry, and the folders the index lists.
        for entry in self.index.entries {
            var components = entry.path.split(separator: "/").map(String.init)
            if entry.kind != .directory { components.removeLast() }
            var relative = ""
            for component in components {
                relative = relative.isEmpty ? component : relative + "/" + component
                directories.insert(relative)
            }
        }
        return DeltaTree(
            folder: self.tree,
            summary: UnpackSummary(bytes: bytes, entries: self.index.entries.count, files: files, directories: directories.sorted()))
    }
}

/// The shared state of a first install's requests: the folders made so far. Used by one request's sink at a time.
final class FirstInstallState {
    var directories: Set<String> = [""]
}

/// Chunks of a first install written and not yet counted: the chunk numbers, the files that hold them (a descriptor
/// of each, flushed, closed by ``ChunkAssembly/commit(_:)``) and the folders those files were opened in.
struct CommitBatch: Sendable {
    var numbers: [Int] = []
    var files: [Int: Int32] = [:]
    var folders: Set<String> = []
    /// The entries of the files written in the window (their descriptors go in `files` when it is handed over).
    var written: Set<Int> = []
}

/// Takes one request of a first install as it arrives: the pack's bytes from its first window's start to its last
/// window's end, in order (consecutive windows of ``ChunkPlan/windows(_:in:window:)``). Each chunk's stored bytes are
/// gathered, decoded as its storage says, checked against its SHA-256 and written into the tree's files; the bytes
/// between chunks (tar headers, padding) and between windows are passed over. A chunk that does not match is noted in
/// ``bad`` and nothing of it is written. At each window's end the chunks written since the last one go to the
/// ``SinkCommitter`` as a ``CommitBatch`` (synced and recorded on its worker), and the sink goes on with the next
/// window: nothing waits for a window's end but the commit, which runs beside the transfer.
///
/// The work is spread over the cores: the transfer thread gathers each chunk's stored bytes (one copy, from the
/// transfer's buffer) and hands about ``checkBytes`` of chunks at a time to a check (decoding and SHA-256, the most CPU
/// of the install) on the global queue; `writes` takes the checked chunks in the pack's order, writes them into the
/// files (``DirectFile``) and hands each window's batch to the committer. On 2 cores the checks run one at a time (the
/// transfer is the pool's other thread): measured, queues of their own that ran two at once made the install no faster,
/// as the writes set its pace (their direct writes, one at a time: ext4 serializes the writes that extend a file). At most
/// ``checksInFlight`` checks run or wait to be written (`consume` waits for room beyond that), and at most
/// ``SinkCommitter/batchesInFlight`` batches wait to be committed. Read its results only after ``drain()``.
final class ChunkSink: TransferSink, @unchecked Sendable {
    // Safe: `consume` runs on the transfer thread, one call at a time, and alone runs `take` and changes `position`,
    // `next`, `window`, `stored` and `gathered` while the transfer runs (then `drain`, on the run's thread once the
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
            // A chunk that starts before the bytes arriving (an index with overlapping chunks) cannot be read here.
            guard self.position == chunk.offset + Int64(self.stored.count) else {
                self.gathered.append(([number], nil))
                self.stored.removeAll(keepingCapacity: true)
                self.advance()
                continue
            }
            let take = Int(min(Int64(rest.count), chunk.length - Int64(self.stored.count)))
            // A new buffer for each chunk: the last one's bytes are being checked.
            if self.stored.isEmpty { self.stored.reserveCapacity(Int(min(chunk.length, 4 << 20))) }
            self.stored.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest.prefix(take)))
            rest = rest.dropFirst(take)
            self.position += Int64(take)
            if Int64(self.stored.count) == chunk.length {
                // The other slices of a shared frame: the same stored bytes, cut from the frame decompressed once.
                var numbers = [number]
                while self.next + numbers.count < self.order.count, chunk.storage == .zstdFrameSlice,
                    self.chunks[self.order[self.next + numbers.count]].offset == chunk.offset,
                    self.chunks[self.order[self.next + numbers.count]].length == chunk.length
                {
                    numbers.append(self.order[self.next + numbers.count])
                }
                self.gathered.append((numbers, self.stored))
                self.gatheredBytes += self.stored.count
                if self.gatheredBytes >= Self.checkBytes { self.check() }
                for _ in numbers { self.advance() }
                self.stored = []
            }
        }
        self.position += Int64(rest.count)
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
        (self.gathered, self.gatheredBytes) = ([], 0)
        self.checking.wait()
        let check = Check()
        let chunks = self.chunks
        DispatchQueue.global().async {
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
                    self.bad.append(number)
                    if let endAtFirstBad = self.endAtFirstBad {
                        self.checkError = endAtFirstBad
                        self.failed.store(true, ordering: .releasing)
                    }
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
