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

    /// The chunks verified by an earlier attempt, from the record, that the tree still holds (``stillInTree(_:plan:destinations:)``);
    /// when there is no record, or the tree is not the plan's (a file that is not a file, a symlink changed), a fresh tree
    /// with the plan's folders and symlinks (made by the unpacker) and an empty record.
    func prepareTree(_ plan: ChunkPlan, destinations: Destinations) throws -> Set<Int> {
        var info = stat()
        if stat(self.record.path, &info) == 0, lstat(self.tree.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR,
            let data = try? Data(contentsOf: self.record), self.treeHoldsThePlan(plan)
        {
            let recorded = Self.recordedChunks(data).filter { $0 < plan.fetch.count }
            return try self.stillInTree(recorded, plan: plan, destinations: destinations)
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
        try bytes.withUnsafeBytes { bytes in
            try self.write(bytes, chunk: number, at: 0, destinations: destinations, files: &files, batch: &batch, directories: &directories)
        }
    }

    /// Writes bytes of a chunk, from byte `at` of it on, at their offsets into the tree's files, as above: a whole
    /// chunk, or a piece of a large one streamed (``StreamedChunk``).
    /// - Returns: the entry number of the chunk's first place.
    func write(
        _ bytes: UnsafeRawBufferPointer, chunk number: Int, at delta: Int64, destinations: Destinations, files: inout [Int: DirectFile],
        batch: inout CommitBatch, directories: inout Set<String>
    ) throws -> Int? {
        guard let first = destinations.first(number) else { return nil }
        try self.file(first.entry, files: &files, batch: &batch, directories: &directories).write(bytes, at: first.offset + delta)
        // A copy (the chunk repeats) goes in aside: as a run of its own it would end the run of the file's bytes
        // arriving in order, at a cost of two short direct writes and four small ones (775 copies in case 10's
        // tar.zst of 1 GiB: 6,611 writes in all, 4,829 with the copies aside).
        for copy in destinations.copies(number) {
            try self.file(copy.entry, files: &files, batch: &batch, directories: &directories).writeAside(bytes, at: copy.offset + delta)
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
