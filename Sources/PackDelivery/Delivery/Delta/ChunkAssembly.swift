import CArchive
import CCompression
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The installer's side of a chunked delta update, in its folder (`downloads/<id>.delta`): the chunks found in the
/// installed files, the fetched ranges decoded into one file per chunk (`c<SHA-256>`, kept only once its SHA-256
/// matches, made durable before it counts as kept), and the new version's tree written from them. The fetching is
/// ``DeltaTransfer``'s, through the transfer engine.
struct ChunkAssembly {
    /// `downloads/<id>.delta`.
    var folder: URL
    var index: PackIndex
    /// The installed version's folder.
    var installed: URL
    var writer: any FileWriting
    var isCancelled: () -> Bool
    /// The seed folders, by number (``ChunkPlan/LocalChunk/seed``).
    var seeds: [URL] = []

    func chunkFile(_ sha256: String) -> URL { self.folder.appending(path: "c\(sha256.lowercased())") }

    /// Files to cut for chunks: `files`, paths relative to `root`, the installed version's folder (`seed` nil) or the
    /// seed folder number `seed` (``SeedFolders``).
    struct Candidates {
        var root: URL
        var files: [String]
        var seed: Int?
    }

    /// The file that holds a chunk found on this machine: in the installed version's folder, or in a seed folder.
    func file(of local: ChunkPlan.LocalChunk) -> URL {
        (local.seed.map { self.seeds[$0] } ?? self.installed).appending(path: local.path)
    }

    /// The chunks of the installed files `seeds` whose SHA-256 is in `wanted`, found by cutting each file (read once)
    /// as the new pack's files were cut, and hashing each chunk. A file that cannot be read is passed over.
    ///
    /// - Throws: ``DeltaAssembly/Stopped`` when `isCancelled` says stop.
    static func inventory(
        of seeds: [InstalledFileRecord], root: URL, chunker: Chunker, wanted: Set<String>, isCancelled: () -> Bool
    ) throws(DeltaAssembly.Stopped) -> [String: ChunkPlan.LocalChunk] {
        try Self.inventory(
            of: [Candidates(root: root, files: seeds.map(\.path), seed: nil)], chunker: chunker, wanted: wanted, isCancelled: isCancelled,
            dropped: { _, _ in })
    }

    /// The chunks of the files of `folders` whose SHA-256 is in `wanted`, as above, the first folder that holds a chunk
    /// giving it. A seed folder one of whose files fails to read (an I/O error: a failing disk, a stick unplugged) gives
    /// nothing: it is dropped whole, and `dropped` is told its number and the error. A file that is gone or not readable
    /// is passed over (one changed since is caught when its chunks are read back, each against its SHA-256).
    ///
    /// - Throws: ``DeltaAssembly/Stopped`` when `isCancelled` says stop.
    static func inventory(
        of folders: [Candidates], chunker: Chunker, wanted: Set<String>, isCancelled: () -> Bool, dropped: (Int, Int32) -> Void
    ) throws(DeltaAssembly.Stopped) -> [String: ChunkPlan.LocalChunk] {
        var found: [String: ChunkPlan.LocalChunk] = [:]
        guard !wanted.isEmpty else { return found }
        let stream = ChunkStream(chunker: chunker)
        let hasher = SHA256Hasher()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        for folder in folders {
            var own: [String: ChunkPlan.LocalChunk] = [:]
            var failure: Int32?
            for path in folder.files {
                if isCancelled() { throw DeltaAssembly.Stopped() }
                let fd = open(folder.root.appending(path: path).path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
                guard fd >= 0 else {
                    if folder.seed != nil, ![ENOENT, EACCES, ELOOP, ENOTDIR].contains(errno) { failure = errno }
                    if failure != nil { break } else { continue }
                }
                defer { close(fd) }
                var info = stat()
                guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { continue }
                var offset: Int64 = 0
                let error = Self.cut(fd, stream: stream, buffer: buffer) { chunk in
                    hasher.reset()
                    hasher.update(chunk)
                    let digest = hasher.hexDigest()
                    if wanted.contains(digest), own[digest] == nil, found[digest] == nil {
                        own[digest] = ChunkPlan.LocalChunk(path: path, offset: offset, size: Int64(chunk.count), seed: folder.seed)
                    }
                    offset += Int64(chunk.count)
                }
                if let error, folder.seed != nil {
                    failure = error
                    break
                }
            }
            if let failure, let seed = folder.seed {
                dropped(seed, failure)
                continue
            }
            found.merge(own) { old, _ in old }
        }
        return found
    }

    /// Cuts the file `fd` into chunks, read to its end, each handed to `add` in order.
    /// - Returns: the error of a read that failed (the chunks handed over before are then not all the file's).
    private static func cut(
        _ fd: Int32, stream: ChunkStream, buffer: UnsafeMutableRawBufferPointer, _ add: (UnsafeRawBufferPointer) -> Void
    ) -> Int32? {
        while true {
            let count = read(fd, buffer.baseAddress, buffer.count)
            if count < 0, errno == EINTR { continue }
            if count < 0 {
                let error = errno
                stream.finish { _ in }
                return error
            }
            if count == 0 { break }
            stream.add(UnsafeRawBufferPointer(rebasing: buffer[..<count]), add)
        }
        stream.finish(add)
        return nil
    }

    /// A complete range's file (the pack's bytes `range.start..<range.end`): each of its chunks decoded as its
    /// storage says, checked against its SHA-256, and kept in a file of its own (synced, renamed into place); then the
    /// range's file is removed.
    ///
    /// - Returns: the chunks (numbers in `chunks`) whose bytes do not match: they are not kept.
    func keep(_ range: ChunkPlan.Range, chunks: [PackIndex.Chunk], from file: URL) throws -> [Int] {
        let input = open(file.path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw Installer.fileError("open", file.path, errno) }
        defer { close(input) }
        var bad: [Int] = []
        var frames = FrameCache()
        for number in range.chunks {
            let chunk = chunks[number]
            if StreamedChunk.isLarge(chunk), StreamedChunk.canStream(chunk.storage) {
                if try !self.keepStreamed(chunk, in: input, from: range.start, file: file) { bad.append(number) }
                continue
            }
            guard let bytes = try Self.verifiedChunk(chunk, in: input, from: range.start, file: file, frames: &frames) else {
                bad.append(number)
                continue
            }
            try self.write(bytes, to: self.chunkFile(chunk.sha256))
        }
        try Durability.syncFolder(self.folder)
        unlink(file.path)
        return bad
    }

    /// A large chunk (``StreamedChunk``) kept as the others, but decoded and hashed from the range's file a piece at a
    /// time into its file (`.part`, synced, renamed once it matched): an index may declare chunks and frames of up to
    /// 64 MiB, which are never all in memory (issue 43). A slice of a large frame decodes the frame on its own.
    /// - Returns: whether it matched (else nothing is kept).
    private func keepStreamed(_ chunk: PackIndex.Chunk, in input: Int32, from start: Int64, file: URL) throws -> Bool {
        let target = self.chunkFile(chunk.sha256)
        let part = target.path + ".part"
        let fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Installer.fileError("create", part, errno) }
        defer { close(fd) }
        let streamed = StreamedChunk([0], chunks: [chunk])
        var stored = [UInt8](repeating: 0, count: Int(min(chunk.length, Int64(StreamedChunk.outputBytes))))
        var done: Int64 = 0
        while done < chunk.length {
            if stored.count > chunk.length - done { stored.removeLast(stored.count - Int(chunk.length - done)) }
            let count = stored.withUnsafeMutableBytes { pread(input, $0.baseAddress, $0.count, off_t(chunk.offset - start + done)) }
            guard count == stored.count else { throw Installer.fileError("read", file.path, count < 0 ? errno : EIO) }
            try streamed.feed(stored) { bytes, _, at in
                let written = self.writer.pwrite(fd, bytes.baseAddress!, bytes.count, at)
                if written != bytes.count { throw DeltaAssembly.writeFailure(written, file: target, needed: Int64(bytes.count)) }
            }
            done += Int64(count)
        }
        guard streamed.finish().first?.matched == true else {
            unlink(part)
            return false
        }
        guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync the fetched chunk", path: part, errno: errno) }
        guard rename(part, target.path) == 0 else { throw PackDeliveryError.io("keep the fetched chunk", path: part, errno: errno) }
        return true
    }

    /// A chunk's bytes from a complete range's file (`input`, the pack's bytes from `start` on), decoded as its
    /// storage says (a slice's frame decompressed once for the slices of it that follow one another, in `frames`);
    /// nil when they do not match its SHA-256.
    static func verifiedChunk(_ chunk: PackIndex.Chunk, in input: Int32, from start: Int64, file: URL, frames: inout FrameCache)
        throws -> [UInt8]?
    {
        let bytes = try frames.decode(chunk) { () throws -> [UInt8] in
            var stored = [UInt8](repeating: 0, count: Int(chunk.length))
            let count = stored.withUnsafeMutableBytes { pread(input, $0.baseAddress, $0.count, off_t(chunk.offset - start)) }
            guard count == stored.count else { throw Installer.fileError("read", file.path, count < 0 ? errno : EIO) }
            return stored
        }
        guard let bytes, Self.sha256(bytes) == chunk.sha256.lowercased() else { return nil }
        return bytes
    }

    /// The shared zstd frame last decompressed, so that its slices, which follow one another in a range, decompress
    /// it once. Holds at most one frame (at most ``PackIndex/maxChunkSize`` bytes, as the index was checked).
    struct FrameCache {
        private var range: PackIndex.ChunkRange?
        /// The frame's bytes; nil when it did not decompress to exactly the size the index gives.
        private var frame: [UInt8]?

        init() {}

        /// A chunk's bytes from its stored bytes (which `stored` gives, read only when needed), decoded as its storage
        /// says: a slice is cut from its frame, decompressed into at most the frame's size; nil when they do not decode
        /// to exactly the chunk's size (a slice: when the frame does not decompress to exactly its size).
        mutating func decode(_ chunk: PackIndex.Chunk, stored: () throws -> [UInt8]) rethrows -> [UInt8]? {
            guard chunk.storage == .zstdFrameSlice else {
                return ChunkAssembly.decode(try stored(), storage: chunk.storage, size: Int(chunk.size))
            }
            guard let frameSize = chunk.frameSize, let frameOffset = chunk.frameOffset, frameSize > 0, frameOffset >= 0,
                frameOffset <= frameSize - chunk.size
            else { return nil }
            let range = PackIndex.ChunkRange(offset: chunk.offset, length: chunk.length, frameSize: frameSize)
            if range != self.range {
                let bytes = try stored()
                self.range = range
                self.frame = ChunkAssembly.decode(bytes, storage: .zstdFrame, size: Int(frameSize))
            }
            guard let frame = self.frame else { return nil }
            return Array(frame[Int(frameOffset)..<Int(frameOffset + chunk.size)])
        }
    }

    /// Writes a verified chunk to `target` durably: a temporary file, synced, renamed.
    private func write(_ bytes: [UInt8], to target: URL) throws {
        let part = target.path + ".part"
        let fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Installer.fileError("create", part, errno) }
        defer { close(fd) }
        let written = bytes.withUnsafeBytes { self.writer.pwrite(fd, $0.baseAddress!, $0.count, 0) }
        if written != bytes.count { throw DeltaAssembly.writeFailure(written, file: target, needed: Int64(bytes.count)) }
        guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync the fetched chunk", path: part, errno: errno) }
        guard rename(part, target.path) == 0 else { throw PackDeliveryError.io("keep the fetched chunk", path: part, errno: errno) }
    }

    /// A chunk's bytes from its stored bytes; nil when they do not decode to exactly `size` bytes.
    static func decode(_ stored: [UInt8], storage: PackIndex.Storage, size: Int) -> [UInt8]? {
        switch storage {
        case .raw:
            return stored.count == size ? stored : nil
        case .zstdFrame:
            // Not zeroed first: the frame writes every byte, or the result is thrown away.
            var matched = false
            let out = [UInt8](unsafeUninitializedCapacity: size) { output, count in
                let result = stored.withUnsafeBytes { ZstdContexts.decompress(into: UnsafeMutableRawBufferPointer(output), from: $0) }
                matched = ZSTD_isError(result) == 0 && result == size
                count = matched ? size : 0
            }
            return matched ? out : nil
        case .zstdFrameSlice:
            // Cut from its frame by ``FrameCache``, which knows the frame's size.
            return nil
        case .gzipMember:
            // zlib keeps a pointer to its stream: the stream must not move between calls.
            let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
            stream.initialize(to: z_stream())
            defer { stream.deallocate() }
            guard inflateInit2_(stream, 31, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else { return nil }
            defer { inflateEnd(stream) }
            // One byte more than wanted: a member that holds more does not end in it.
            var out = [UInt8](repeating: 0, count: size + 1)
            var input = stored
            let status = out.withUnsafeMutableBytes { output in
                input.withUnsafeMutableBytes { bytes in
                    stream.pointee.next_in = bytes.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    stream.pointee.avail_in = uInt(bytes.count)
                    stream.pointee.next_out = output.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    stream.pointee.avail_out = uInt(output.count)
                    return inflate(stream, Z_FINISH)
                }
            }
            guard status == Z_STREAM_END, stream.pointee.total_out == size, stream.pointee.avail_in == 0 else { return nil }
            out.removeLast()
            return out
        case .deflatedZipEntry:
            return nil
        }
    }

    static func sha256(_ bytes: [UInt8]) -> String {
        let hasher = SHA256Hasher()
        bytes.withUnsafeBytes { hasher.update($0) }
        return hasher.hexDigest()
    }

    /// The new version's tree: folders and symlinks made by the unpacker (from a tar of them, with all its checks),
    /// unchanged files linked (or copied) from the installed version, and every other file written from its chunks in
    /// order, each chunk checked again as it is read and the file against the SHA-256 the index gives it.
    func assemble(_ plan: ChunkPlan) throws -> DeltaTree {
        let tree = self.folder.appending(path: "tree")
        try Installer.removeTree(tree)
        if mkdir(tree.path, 0o755) != 0 { throw Installer.fileError("create the new version's folder", tree.path, errno) }
        var directories: Set<String> = [""]
        var files: [InstalledFile] = []
        var bytes: Int64 = 0
        if !plan.directories.isEmpty || !plan.links.isEmpty {
            let links = self.folder.appending(path: "links.tar")
            let size = try self.writeLinks(plan, to: links)
            defer { unlink(links.path) }
            let summary = try Unpacker.unpack(
                archive: links, into: tree,
                limits: UnpackLimits(maxBytes: size + 1, maxEntries: plan.directories.count + plan.links.count + 1),
                isCancelled: self.isCancelled, writer: self.writer)
            directories.formUnion(summary.directories)
            let made = Dictionary(summary.files.map { ($0.path, $0) }, uniquingKeysWith: { a, _ in a })
            for link in plan.links {
                let entry = self.index.entries[link.number]
                guard let file = made[entry.path], file.kind == .symlink, file.sha256 == entry.sha256?.lowercased() else {
                    throw Self.tryAgain(
                        PackDeliveryError(
                            .contentDamaged,
                            message:
                                "The symlink \(PackDeliveryError.printable(entry.path)) could not be made as the pack's index gives it.",
                            hint: "It is tried again.", subject: entry.path))
                }
                files.append(file)
                bytes += entry.size
            }
        }
        let placing = DeltaAssembly(
            folder: self.folder, index: self.index, directory: ZipDirectories.Directory(entries: [], offset: 0, size: 0),
            installed: self.installed, writer: self.writer, isCancelled: self.isCancelled)
        for reused in plan.reuse {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            let components = try DeltaAssembly.components(reused.path)
            try DeltaAssembly.makeDirectories(Array(components.dropLast()), in: tree, made: &directories)
            try placing.place(self.installed.appending(path: reused.from), at: tree.appending(path: reused.path), size: reused.size)
            files.append(InstalledFile(path: reused.path, kind: .file, size: reused.size, sha256: reused.sha256))
            bytes += reused.size
        }
        var sources: [String: Int32] = [:]
        defer { for fd in sources.values { close(fd) } }
        for build in plan.build {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            files.append(try self.write(build, plan: plan, in: tree, directories: &directories, sources: &sources))
            bytes += self.index.entries[build.number].size
        }
        return DeltaTree(
            folder: tree,
            summary: UnpackSummary(bytes: bytes, entries: self.index.entries.count, files: files, directories: directories.sorted()))
    }

    /// Writes one file of the new version from its chunks.
    private func write(
        _ build: ChunkPlan.Build, plan: ChunkPlan, in tree: URL, directories: inout Set<String>, sources: inout [String: Int32]
    ) throws -> InstalledFile {
        let entry = self.index.entries[build.number]
        let components = try DeltaAssembly.components(entry.path)
        try DeltaAssembly.makeDirectories(Array(components.dropLast()), in: tree, made: &directories)
        let target = tree.appending(path: entry.path)
        let fd = open(target.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw Installer.fileError("create", target.path, errno) }
        defer { close(fd) }
        let hasher = SHA256Hasher()
        var offset: Int64 = 0
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.copyBytes, alignment: 16)
        defer { buffer.deallocate() }
        for piece in build.pieces {
            guard
                try self.copy(
                    piece, into: fd, at: offset, target: (target, entry.size), hashing: hasher, buffer: buffer, sources: &sources)
            else {
                let source: String
                switch piece.source {
                case .local(let local) where local.seed != nil:
                    source = "the seed file \(PackDeliveryError.printable(self.file(of: local).path)) changed or could not be read"
                case .local(let local):
                    source = "the installed file \(PackDeliveryError.printable(local.path)) changed during the delta update"
                case .fetched:
                    source = "a fetched chunk kept on disk changed"
                    unlink(self.chunkFile(piece.sha256).path)
                }
                throw Self.tryAgain(
                    PackDeliveryError(
                        .contentDamaged,
                        message: "A chunk of \(PackDeliveryError.printable(entry.path)) could not be read back: \(source).",
                        hint: "It is tried again.", subject: entry.path))
            }
            offset += piece.size
        }
        let digest = hasher.hexDigest()
        guard offset == entry.size, digest == entry.sha256?.lowercased() else {
            throw PackDeliveryError(
                .checksumMismatch,
                message:
                    "The file \(PackDeliveryError.printable(entry.path)), built from the chunks the pack's index gives, does not match the SHA-256 the index gives it.",
                hint: "Nothing was installed and the installed version is untouched; the pack's index is wrong.", subject: entry.path)
        }
        // As the unpacker sets modes: permissions up to 0o755, always readable and writable by the owner.
        if fchmod(fd, mode_t(((entry.mode ?? 0o644) & 0o755) | 0o600)) != 0 {
            throw Installer.fileError("set the mode of", target.path, errno)
        }
        return InstalledFile(path: entry.path, kind: .file, size: entry.size, sha256: digest)
    }

    /// A source of the update changed under it (an installed file, a kept chunk): the attempt fails and is tried
    /// again, planned afresh.
    static func tryAgain(_ error: PackDeliveryError) -> TransferFailure {
        TransferFailure(error: error, retryable: true, countsAlways: true)
    }

    /// The bytes a piece is copied with at a time: a chunk may be up to 64 MiB, never all in memory (issue 43).
    static let copyBytes = 1 << 20

    /// Copies a piece, from an installed file or a kept chunk, to `offset` of the file `fd`, a block at a time, each
    /// block hashed into `hashing` (the file's SHA-256) and the piece's own; false when they cannot all be read or do
    /// not have the piece's SHA-256 (what was written is then not the piece's). `target` is the file and its size, for
    /// the error of a write that fails.
    func copy(
        _ piece: ChunkPlan.Piece, into fd: Int32, at offset: Int64, target: (file: URL, size: Int64), hashing: SHA256Hasher,
        buffer: UnsafeMutableRawBufferPointer, sources: inout [String: Int32]
    ) throws -> Bool {
        let input: Int32
        var start: Int64 = 0
        var owned: Int32 = -1
        defer { if owned >= 0 { close(owned) } }
        switch piece.source {
        case .local(let local):
            let path = self.file(of: local).path
            var fd = sources[path] ?? -1
            if fd < 0 {
                fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
                guard fd >= 0 else { return false }
                sources[path] = fd
            }
            (input, start) = (fd, local.offset)
        case .fetched:
            owned = open(self.chunkFile(piece.sha256).path, O_RDONLY | O_CLOEXEC)
            guard owned >= 0 else { return false }
            input = owned
        }
        let own = SHA256Hasher()
        var done: Int64 = 0
        while done < piece.size {
            let want = Int(min(Int64(buffer.count), piece.size - done))
            let count = pread(input, buffer.baseAddress, want, off_t(start + done))
            guard count == want else { return false }
            let block = UnsafeRawBufferPointer(rebasing: buffer[..<count])
            own.update(block)
            hashing.update(block)
            let written = self.writer.pwrite(fd, block.baseAddress!, count, offset + done)
            if written != count {
                throw DeltaAssembly.writeFailure(written, file: target.file, needed: target.size - offset - done)
            }
            done += Int64(count)
        }
        return own.hexDigest() == piece.sha256
    }

    /// Writes the plan's folders and symlinks as a tar, for the unpacker.
    /// - Returns: the bytes of the symlinks' targets.
    func writeLinks(_ plan: ChunkPlan, to url: URL) throws -> Int64 {
        guard let archive = archive_write_new() else { throw PackDeliveryError.io("write", path: url.path, errno: ENOMEM) }
        defer { archive_write_free(archive) }
        func failure() -> PackDeliveryError {
            PackDeliveryError(
                .internalError,
                message:
                    "The folders and symlinks of the delta update could not be written: \(archive_error_string(archive).map { String(cString: $0) } ?? "unknown error")."
            )
        }
        guard archive_write_set_format_pax_restricted(archive) == ARCHIVE_OK, archive_write_open_filename(archive, url.path) == ARCHIVE_OK
        else { throw failure() }
        var size: Int64 = 0
        func add(_ entry: PackIndex.Entry, target: String?) throws {
            guard let record = archive_entry_new() else { throw PackDeliveryError.io("write", path: url.path, errno: ENOMEM) }
            defer { archive_entry_free(record) }
            archive_entry_set_pathname_utf8(record, entry.path)
            archive_entry_set_filetype(record, target == nil ? ArchiveFileType.directory : ArchiveFileType.symlink)
            archive_entry_set_perm(record, mode_t((entry.mode ?? 0o755) & 0o7777))
            if let target { archive_entry_set_symlink_utf8(record, target) }
            guard archive_write_header(archive, record) >= ARCHIVE_WARN else { throw failure() }
        }
        let links = Dictionary(plan.links.map { ($0.number, $0) }, uniquingKeysWith: { a, _ in a })
        // In the index's order, as the pack has them.
        for (number, entry) in self.index.entries.enumerated() {
            if let link = links[number] {
                let target = try link.target ?? self.installedTarget(link.from ?? "", of: entry)
                size += Int64(target.utf8.count)
                try add(entry, target: target)
            } else if entry.kind == .directory {
                try add(entry, target: nil)
            }
        }
        guard archive_write_close(archive) == ARCHIVE_OK else { throw failure() }
        return size
    }

    /// The target of an installed symlink, which must be the one the index gives `entry`.
    private func installedTarget(_ path: String, of entry: PackIndex.Entry) throws -> String {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink(self.installed.appending(path: path).path, &buffer, buffer.count)
        let target = count > 0 ? String(validating: buffer[..<count], as: UTF8.self) : nil
        guard let target, Self.sha256(Array(target.utf8)) == entry.sha256?.lowercased() else {
            throw Self.tryAgain(
                PackDeliveryError(
                    .contentDamaged, message: "The installed symlink \(PackDeliveryError.printable(path)) changed during the delta update.",
                    hint: "It is tried again.", subject: path))
        }
        return target
    }
}
