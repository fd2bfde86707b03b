import CArchive
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The archive formats a pack can be written in.
public enum PackFormat: String, Sendable, CaseIterable {
    /// A zip archive (`.zip`).
    case zip
    /// An uncompressed tar (`.tar`).
    case tar
    /// A gzip-compressed tar (`.tar.gz`), written without a gzip timestamp.
    case tarGzip = "tar.gz"
    /// A bzip2-compressed tar (`.tar.bz2`).
    case tarBzip2 = "tar.bz2"
    /// An xz-compressed tar (`.tar.xz`).
    case tarXz = "tar.xz"
    /// A zstd-compressed tar (`.tar.zst`).
    case tarZstd = "tar.zst"

    /// The format an output file name asks for.
    ///
    /// - Parameter fileName: a file name or path ending in `.zip`, `.tar`, `.tar.gz` or `.tgz`,
    ///   `.tar.bz2`, `.tar.xz` or `.tar.zst` (any letter case).
    /// - Returns: `nil` for any other name.
    public init?(fileName: String) {
        let name = fileName.lowercased()
        if name.hasSuffix(".tgz") {
            self = .tarGzip
            return
        }
        guard let format = Self.allCases.first(where: { name.hasSuffix("." + $0.rawValue) }) else { return nil }
        self = format
    }
}

/// Writes a folder into a pack (a zip or a tar) with libarchive.
public enum PackWriter {
    /// The name of the metadata file at the root of a pack in Apple's hosted-content layout.
    public static let contentInfoName = "ContentInfo.plist"
    /// The folder that holds a pack's payload in Apple's hosted-content layout.
    public static let contentsFolderName = "Contents"

    /// Writes `folder`'s files into a new archive at `output`.
    ///
    /// Regular files, folders and relative symlinks that stay inside the folder are written, sorted by
    /// path, owned by 0:0, with modes normalised to 0755 (folders and files with the owner's execute
    /// bit) or 0644, and the files' modification times; gzip headers carry no timestamp. Writing the
    /// same folder twice gives the same bytes. The folder is not followed through symlinks; a hard-linked
    /// file is written once per name. A file named like `output` inside `folder` is skipped.
    ///
    /// When `contentInfo` is given, the archive gets a `ContentInfo.plist` at its root (an XML plist
    /// with the string keys `ContentVersion` and `IAPProductIdentifier`), replacing one at the top of
    /// the folder, and the payload goes under `Contents/`: a folder that already has a `Contents/`
    /// subfolder keeps its layout; otherwise everything in it is placed under `Contents/`. Without
    /// `contentInfo`, the folder is archived exactly as it is.
    ///
    /// The pack is written to a temporary file beside `output`, flushed to disk and renamed into
    /// place, so a failure leaves no half-written pack (and an earlier `output` untouched).
    ///
    /// Its ``PackIndex`` (format 2, or 3 when files share frames) goes beside it, as `<output>.index.json` (``indexURL(for:)``): its JSON
    /// compressed with zstd (read it with `zstd -dc`). A tar is
    /// written so that each file's content-defined chunks can be fetched apart: in a plain tar each chunk is a
    /// range of a file's data; in a tar.zst each chunk of a file of ``PackFrameSink/groupedFileLimit`` or more is a
    /// zstd frame of its own, smaller files share frames of up to ``PackFrameSink/groupLimit`` bytes with their tar
    /// headers (each of their chunks a slice of its frame), the other tar headers and padding are frames of their
    /// own, and the zstd seekable format's seek table ends the pack; in a
    /// tar.gz the same pieces are gzip members. Every tool reads these as ordinary archives. A zip's stored
    /// entries are chunked and its deflated entries are indexed whole; a tar.bz2 or tar.xz is indexed by entry.
    ///
    /// - Parameters:
    ///   - folder: the folder to pack.
    ///   - output: the archive to create or replace.
    ///   - format: the archive format and compression.
    ///   - contentInfo: the product identifier and content version for `ContentInfo.plist`.
    ///   - chunker: the chunk sizes.
    /// - Returns: the number of bytes of all regular files' contents, `ContentInfo.plist` included
    ///   (the pack's unpacked length, as a manifest's `unpackedLength`).
    /// - Throws: `PackDeliveryError` of kind `.usage` when the folder holds something a pack may not
    ///   (a device, FIFO or socket, an absolute or escaping symlink, a symlink through a symlink);
    ///   `.insufficientStorage` when the output filesystem is full; `.io` for other failures.
    @discardableResult
    public static func write(
        folder: URL, to output: URL, format: PackFormat,
        contentInfo: (productIdentifier: String, contentVersion: String)? = nil, chunker: Chunker = .standard
    ) throws(PackDeliveryError) -> Int64 {
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }

        let folderPath = folder.path
        var skip: (dev_t, ino_t)?
        var outputStat = stat()
        if lstat(output.path, &outputStat) == 0 { skip = (outputStat.st_dev, outputStat.st_ino) }

        var scanner = PackFolderScanner(root: folderPath, skip: skip)
        var items = try scanner.scan(
            omittingTopLevel: contentInfo == nil ? nil : Array(Self.contentInfoName.utf8))
        try PackFolderScanner.checkSymlinks(items, root: folderPath)

        if let contentInfo {
            let contents = Array(Self.contentsFolderName.utf8)
            let hasContentsFolder = items.contains { $0.path == contents && $0.kind == .directory }
            let newest = (items.map(\.mtime.0).max() ?? 0, 0)
            if !hasContentsFolder {
                for index in items.indices { items[index].path = contents + [UInt8(ascii: "/")] + items[index].path }
                items.append(PackItem(path: contents, source: nil, kind: .directory, mode: 0o755, size: 0, mtime: newest))
            }
            let plist = try Self.contentInfoPlist(
                productIdentifier: contentInfo.productIdentifier,
                contentVersion: contentInfo.contentVersion)
            items.append(
                PackItem(
                    path: Array(Self.contentInfoName.utf8), source: nil, kind: .generated(plist),
                    mode: 0o644, size: Int64(plist.count), mtime: newest))
        }
        items.sort { $0.path.lexicographicallyPrecedes($1.path) }

        var writer = try PackArchiveWriter(output: output, format: format, chunker: chunker)
        do {
            var total: Int64 = 0
            for item in items {
                try writer.add(item, folderPath: folderPath)
                if item.isRegularFile { total += item.size }
            }
            var index = try writer.finish()
            // A pack libarchive wrote (zip, tar.bz2, tar.xz) is indexed by reading it back.
            if index == nil { index = try PackIndexer.index(output, chunker: chunker).index }
            if let index { try PackIndexer.write(index, to: Self.indexURL(for: output)) }
            return total
        } catch {
            writer.abandon()
            throw error
        }
    }

    /// Where the index of the pack at `pack` goes: `<pack>.index.json` beside it (zstd-compressed JSON; a reader
    /// also takes plain JSON, as indexes were before).
    public static func indexURL(for pack: URL) -> URL {
        pack.deletingLastPathComponent().appending(path: pack.lastPathComponent + ".index.json")
    }

    /// The XML property list of a pack's `ContentInfo.plist`.
    static func contentInfoPlist(productIdentifier: String, contentVersion: String) throws(PackDeliveryError) -> Data {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .xml
        do {
            return try encoder.encode(ContentInfo(contentVersion: contentVersion, productIdentifier: productIdentifier))
        } catch {
            throw PackDeliveryError(
                .invalidArgument, message: "Could not encode \(Self.contentInfoName): \(error).",
                subject: Self.contentInfoName)
        }
    }
}

// MARK: - Scanning the folder

/// One entry to write: its path in the archive and where its bytes come from.
private struct PackItem {
    enum Kind: Equatable {
        case directory
        case file
        case symlink([UInt8])
        case generated(Data)
    }

    /// The path inside the archive, `/`-separated, no trailing slash.
    var path: [UInt8]
    /// The path relative to the folder, for items read from it.
    var source: [UInt8]?
    var kind: Kind
    var mode: mode_t
    var size: Int64
    var mtime: (Int, Int)

    var isRegularFile: Bool {
        switch self.kind {
        case .file, .generated: true
        case .directory, .symlink: false
        }
    }
}

/// Lists a folder with `openat`/`fdopendir`/`fstatat`, keeping names as raw bytes.
private struct PackFolderScanner {
    let root: String
    let skip: (dev_t, ino_t)?
    private var items: [PackItem] = []

    init(root: String, skip: (dev_t, ino_t)?) {
        self.root = root
        self.skip = skip
    }

    mutating func scan(omittingTopLevel omitted: [UInt8]?) throws(PackDeliveryError) -> [PackItem] {
        let fd = open(self.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw PackWriterErrors.file("open the folder", path: self.root, errno: errno) }
        self.items = []
        try self.scan(directory: fd, relative: [], omitting: omitted)  // closes fd
        return self.items
    }

    /// Scans the open folder `fd` (closed on return) whose path relative to the root is `relative`.
    private mutating func scan(directory fd: Int32, relative: [UInt8], omitting omitted: [UInt8]?) throws(PackDeliveryError) {
        guard let stream = fdopendir(fd) else {
            let code = errno
            close(fd)
            throw PackWriterErrors.file("list the folder", path: self.shown(relative), errno: code)
        }
        defer { closedir(stream) }
        var names: [[UInt8]] = []
        while true {
            errno = 0
            guard let item = readdir(stream) else {
                if errno != 0 { throw PackWriterErrors.file("list the folder", path: self.shown(relative), errno: errno) }
                break
            }
            let name = withUnsafeBytes(of: item.pointee.d_name) { Array($0.prefix(while: { $0 != 0 })) }
            if name == [UInt8(ascii: ".")] || name == [UInt8(ascii: "."), UInt8(ascii: ".")] { continue }
            if let omitted, name == omitted { continue }
            names.append(name)
        }
        names.sort { $0.lexicographicallyPrecedes($1) }
        for name in names {
            let path = relative.isEmpty ? name : relative + [UInt8(ascii: "/")] + name
            var info = stat()
            let status = Self.withCName(name) { fstatat(fd, $0, &info, AT_SYMLINK_NOFOLLOW) }
            if status != 0 { throw PackWriterErrors.file("read the attributes of", path: self.shown(path), errno: errno) }
            if let skip, skip.0 == info.st_dev, skip.1 == info.st_ino { continue }
            let mtime = (Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec))
            switch info.st_mode & S_IFMT {
            case S_IFDIR:
                self.items.append(PackItem(path: path, source: path, kind: .directory, mode: 0o755, size: 0, mtime: mtime))
                let child = Self.withCName(name) { openat(fd, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
                guard child >= 0 else { throw PackWriterErrors.file("open the folder", path: self.shown(path), errno: errno) }
                try self.scan(directory: child, relative: path, omitting: nil)
            case S_IFREG:
                let mode: mode_t = info.st_mode & 0o100 != 0 ? 0o755 : 0o644
                self.items.append(PackItem(path: path, source: path, kind: .file, mode: mode, size: Int64(info.st_size), mtime: mtime))
            case S_IFLNK:
                var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
                let count = Self.withCName(name) { cName in
                    buffer.withUnsafeMutableBytes { readlinkat(fd, cName, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
                }
                guard count >= 0 else { throw PackWriterErrors.file("read the symlink", path: self.shown(path), errno: errno) }
                self.items.append(
                    PackItem(path: path, source: path, kind: .symlink(Array(buffer[..<count])), mode: 0o777, size: 0, mtime: mtime))
            default:
                throw PackDeliveryError(
                    .invalidArgument, message: "'\(self.shown(path))' is not a file, folder or symlink, so it cannot go into a pack.",
                    hint: "Remove it from the folder, then pack again.", subject: self.shown(path))
            }
        }
    }

    /// Refuses symlinks the unpacker would refuse: absolute, leaving the folder, or passing through
    /// another symlink.
    static func checkSymlinks(_ items: [PackItem], root: String) throws(PackDeliveryError) {
        var symlinks: Set<[UInt8]> = []
        for item in items { if case .symlink = item.kind { symlinks.insert(item.path) } }
        let slash = UInt8(ascii: "/")
        for item in items {
            guard case .symlink(let target) = item.kind else { continue }
            let shown = root + "/" + String(decoding: item.path, as: UTF8.self)
            let shownTarget = String(decoding: target, as: UTF8.self)
            func refuse(_ why: String) -> PackDeliveryError {
                PackDeliveryError(
                    .invalidArgument, message: "The symlink '\(shown)' points to '\(shownTarget)', \(why), so it cannot go into a pack.",
                    hint: "Make it a relative link that stays inside the folder, or replace it with the file.",
                    subject: shown)
            }
            if target.isEmpty || target.first == slash { throw refuse("an absolute path") }
            var state = Array(item.path.split(separator: slash).dropLast().map { Array($0) })
            for part in target.split(separator: slash, omittingEmptySubsequences: true) {
                if part.elementsEqual([UInt8(ascii: ".")]) { continue }
                if symlinks.contains(state.joined(separator: [slash]).map { $0 }) {
                    throw refuse("through another symlink")
                }
                if part.elementsEqual([UInt8(ascii: "."), UInt8(ascii: ".")]) {
                    if state.isEmpty { throw refuse("outside the folder") }
                    state.removeLast()
                } else {
                    state.append(Array(part))
                }
            }
        }
    }

    private func shown(_ relative: [UInt8]) -> String {
        relative.isEmpty ? self.root : self.root + "/" + String(decoding: relative, as: UTF8.self)
    }

    static func withCName<R>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        var terminated = bytes
        terminated.append(0)
        return terminated.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
    }
}

private enum PackWriterErrors {
    static func file(_ operation: String, path: String, errno code: Int32) -> PackDeliveryError {
        PackDeliveryError.io(operation, path: path, errno: code)
    }
}

// MARK: - Writing the archive

/// One libarchive writer into a temporary file beside the output. Not thread-safe.
private struct PackArchiveWriter {
    private let output: URL
    private let temporaryPath: String
    private let fd: Int32
    private let archive: OpaquePointer
    /// Where a file's bytes are read into; freed by `finish` or `abandon`.
    private let buffer: UnsafeMutableRawBufferPointer
    private var finished = false
    /// For a tar, tar.gz or tar.zst: where the tar stream goes, piece by piece; nil for the formats libarchive
    /// compresses (zip, tar.bz2, tar.xz).
    private let sink: PackFrameSink?
    private let chunks: ChunkStream
    private let hasher = SHA256Hasher()
    private let chunkHasher = SHA256Hasher()
    private let container: PackIndex.Container
    private var entries: [PackIndex.Entry] = []
    /// Retains the sink for libarchive's callbacks, which are given it unretained.
    private var sinkContext: Unmanaged<PackFrameSink>?
    /// Whether small files share frames (a tar.zst): their chunks are then slices of the frame being gathered.
    private let grouping: Bool
    /// The shared frames, each as `(offset, length, decompressed size)` once cut; the last may still be gathering.
    private var groups: [(offset: Int64, length: Int64, size: Int64)] = []
    /// Whether the pending piece holds slices: it is then the shared frame `groups.last`, filled in when cut.
    private var gathering = false
    /// The slices written: chunk `chunk` of entry `entry` lies in shared frame `group`; their ranges are filled in at
    /// the end, once every frame is cut.
    private var slices: [(entry: Int, chunk: Int, group: Int)] = []

    init(output: URL, format: PackFormat, chunker: Chunker) throws(PackDeliveryError) {
        self.output = output
        let directory = output.deletingLastPathComponent().path
        self.temporaryPath = directory + "/." + output.lastPathComponent + "." + UUID().uuidString + ".tmp"
        let fd = open(self.temporaryPath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw PackWriterErrors.file("create the pack", path: self.temporaryPath, errno: errno) }
        guard let archive = archive_write_new() else {
            close(fd)
            unlink(self.temporaryPath)
            throw PackDeliveryError.io("start writing the pack", path: output.path, errno: ENOMEM)
        }
        self.fd = fd
        self.archive = archive
        self.buffer = .allocate(byteCount: 1 << 20, alignment: 16)
        self.chunks = ChunkStream(chunker: chunker)
        self.container = PackIndex.Container(rawValue: format.rawValue) ?? .zip
        self.grouping = format == .tarZstd
        // zstd's and gzip's own default levels, as libarchive's filters use them.
        self.sink =
            switch format {
            case .tar: PackFrameSink(fd: fd, path: output.path, framing: .raw)
            case .tarZstd: PackFrameSink(fd: fd, path: output.path, framing: .zstd(level: 3))
            case .tarGzip: PackFrameSink(fd: fd, path: output.path, framing: .gzip(level: 6))
            case .zip, .tarBzip2, .tarXz: nil
            }

        var status: Int32
        switch format {
        case .zip:
            status = archive_write_set_format_zip(archive)
        case .tar, .tarGzip, .tarBzip2, .tarXz, .tarZstd:
            status = archive_write_set_format_pax_restricted(archive)
        }
        if status == ARCHIVE_OK, let sink = self.sink {
            // Unblocked, so that each write reaches the sink at once and the sink knows where a header ends.
            status = archive_write_add_filter_none(archive)
            if status == ARCHIVE_OK { status = archive_write_set_bytes_per_block(archive, 0) }
            let context = Unmanaged.passRetained(sink)
            self.sinkContext = context
            if status == ARCHIVE_OK {
                status = archive_write_open(
                    archive, context.toOpaque(), nil,
                    { _, context, bytes, count in
                        guard let context, let bytes else { return -1 }
                        let sink = Unmanaged<PackFrameSink>.fromOpaque(context).takeUnretainedValue()
                        sink.append(UnsafeRawBufferPointer(start: bytes, count: count))
                        return count
                    }, nil)
            }
        } else if status == ARCHIVE_OK {
            switch format {
            case .zip, .tar: status = archive_write_add_filter_none(archive)
            case .tarGzip:
                status = archive_write_add_filter_gzip(archive)
                // No timestamp in the gzip header, so the same folder gives the same bytes.
                if status == ARCHIVE_OK { status = archive_write_set_filter_option(archive, "gzip", "timestamp", nil) }
            case .tarBzip2: status = archive_write_add_filter_bzip2(archive)
            case .tarXz: status = archive_write_add_filter_xz(archive)
            case .tarZstd: status = archive_write_add_filter_zstd(archive)
            }
            if status == ARCHIVE_OK, format != .zip {
                status = archive_write_set_bytes_in_last_block(archive, 1)
            }
            if status == ARCHIVE_OK { status = archive_write_open_fd(archive, fd) }
        }
        if status != ARCHIVE_OK {
            let error = Self.archiveError(archive, "start writing", output: output)
            archive_write_free(archive)
            self.sinkContext?.release()
            self.buffer.deallocate()
            close(fd)
            unlink(self.temporaryPath)
            throw error
        }
    }

    mutating func add(_ item: PackItem, folderPath: String) throws(PackDeliveryError) {
        guard let entry = archive_entry_new() else {
            throw PackDeliveryError.io("start writing the pack", path: self.output.path, errno: ENOMEM)
        }
        defer { archive_entry_free(entry) }
        PackFolderScanner.withCName(item.path) { archive_entry_copy_pathname(entry, $0) }
        archive_entry_set_uid(entry, 0)
        archive_entry_set_gid(entry, 0)
        archive_entry_set_mtime(entry, time_t(item.mtime.0), item.mtime.1)
        switch item.kind {
        case .directory:
            archive_entry_set_filetype(entry, ArchiveFileType.directory)
        case .file, .generated:
            archive_entry_set_filetype(entry, ArchiveFileType.regular)
            archive_entry_set_size(entry, item.size)
        case .symlink(let target):
            archive_entry_set_filetype(entry, ArchiveFileType.symlink)
            PackFolderScanner.withCName(target) { archive_entry_copy_symlink(entry, $0) }
        }
        archive_entry_set_perm(entry, item.mode)
        // A small file joins the shared frame being gathered, which is cut first when the file would take it past
        // its limit (with room for the file's headers).
        if self.grouping, self.isGrouped(item), let sink = self.sink,
            Int64(sink.pendingCount) + item.size + 4096 > Int64(PackFrameSink.groupLimit)
        {
            try self.cut()
        }
        if archive_write_header(self.archive, entry) < ARCHIVE_WARN {
            throw self.sink?.failure
                ?? Self.archiveError(
                    self.archive, "write the entry '\(String(decoding: item.path, as: UTF8.self))' of", output: self.output)
        }
        var record = PackIndex.Entry(
            path: String(decoding: item.path, as: UTF8.self), kind: .file, size: item.size, sha256: nil, method: 0, offset: 0, length: 0,
            mode: Int(item.mode), chunks: [])
        switch item.kind {
        case .directory:
            record.kind = .directory
            record.mode = 0o040000 | Int(item.mode)
            record.size = 0
            record.chunks = nil
        case .symlink(let target):
            self.hasher.reset()
            target.withUnsafeBytes { self.hasher.update($0) }
            (record.kind, record.size, record.sha256, record.chunks) = (.symlink, Int64(target.count), self.hasher.hexDigest(), nil)
            record.mode = 0o120000 | Int(item.mode)
            record.target = String(validating: target, as: UTF8.self)
        case .generated(let data):
            record.mode = 0o100000 | Int(item.mode)
            self.hasher.reset()
            if !data.isEmpty {
                let bytes = [UInt8](data)
                let copied = min(bytes.count, self.buffer.count)
                UnsafeMutableRawBufferPointer(rebasing: self.buffer[..<copied]).copyBytes(from: bytes[..<copied])
                guard copied == bytes.count else {
                    throw PackDeliveryError(.internalError, message: "A generated file of \(bytes.count) bytes does not fit in a pack.")
                }
                try self.startData(item)
                try self.addData(UnsafeRawBufferPointer(rebasing: self.buffer[..<copied]), item: item, into: &record)
            }
            try self.finishData(item: item, into: &record)
        case .file:
            record.mode = 0o100000 | Int(item.mode)
            self.hasher.reset()
            if item.size > 0 { try self.startData(item) }
            try self.copyFile(item, folderPath: folderPath, into: &record)
            try self.finishData(item: item, into: &record)
        }
        // Folders and symlinks are headers only: a run of them stays in one piece, up to a limit.
        if let sink = self.sink, sink.pendingCount >= PackFrameSink.maxHeaderRun { try self.cut() }
        self.entries.append(record)
    }

    /// Whether a file's chunks are slices of a shared frame: a file smaller than ``PackFrameSink/groupedFileLimit``.
    /// A generated file (`ContentInfo.plist`, which changes with every version) keeps a frame of its own, so that an
    /// update does not fetch the small files around it.
    private func isGrouped(_ item: PackItem) -> Bool {
        switch item.kind {
        case .file: item.size < Int64(PackFrameSink.groupedFileLimit)
        case .generated, .directory, .symlink: false
        }
    }

    /// Ends the piece of tar headers (and the padding before them) ahead of a file's first chunk; a small file's
    /// chunks join the shared frame being gathered instead.
    private mutating func startData(_ item: PackItem) throws(PackDeliveryError) {
        guard self.grouping, self.isGrouped(item) else { return try self.cut() }
        if !self.gathering {
            self.gathering = true
            self.groups.append((0, 0, 0))
        }
    }

    /// Ends the current piece (``PackFrameSink/cut()``); when it is a shared frame, notes where it lies.
    private mutating func cut() throws(PackDeliveryError) {
        guard let sink = self.sink else { return }
        let size = Int64(sink.pendingCount)
        let range = try sink.cut()
        if self.gathering {
            self.gathering = false
            guard let range else {
                throw PackDeliveryError(.internalError, message: "A shared frame of \(self.output.path) was not written.")
            }
            self.groups[self.groups.count - 1] = (range.offset, range.length, size)
        }
    }

    /// Writes a file's bytes: chunk by chunk, each a piece of its own, when the pack is chunked.
    private mutating func addData(_ bytes: UnsafeRawBufferPointer, item: PackItem, into record: inout PackIndex.Entry)
        throws(PackDeliveryError)
    {
        self.hasher.update(bytes)
        guard self.sink != nil else {
            let written = archive_write_data(self.archive, bytes.baseAddress!, bytes.count)
            if written != bytes.count { throw self.dataError(item) }
            return
        }
        var chunks = record.chunks ?? []
        try self.chunks.add(bytes) { (chunk: UnsafeRawBufferPointer) throws(PackDeliveryError) in
            chunks.append(try self.writeChunk(chunk, item: item, number: chunks.count))
        }
        record.chunks = chunks
    }

    private mutating func finishData(item: PackItem, into record: inout PackIndex.Entry) throws(PackDeliveryError) {
        if self.sink != nil {
            var chunks = record.chunks ?? []
            try self.chunks.finish { (chunk: UnsafeRawBufferPointer) throws(PackDeliveryError) in
                chunks.append(try self.writeChunk(chunk, item: item, number: chunks.count))
            }
            record.chunks = chunks
        }
        record.sha256 = self.hasher.hexDigest()
    }

    private mutating func writeChunk(_ chunk: UnsafeRawBufferPointer, item: PackItem, number: Int) throws(PackDeliveryError)
        -> PackIndex.Chunk
    {
        let start = Int64(self.sink?.pendingCount ?? 0)
        let written = archive_write_data(self.archive, chunk.baseAddress!, chunk.count)
        if written != chunk.count { throw self.sink?.failure ?? self.dataError(item) }
        if self.gathering, let sink = self.sink {
            // A slice: its frame's range is filled in at the end, once the frame is cut.
            guard Int64(sink.pendingCount) - start == Int64(chunk.count) else {
                throw PackDeliveryError(
                    .internalError, message: "A chunk of \(String(decoding: item.path, as: UTF8.self)) was not written whole.")
            }
            self.chunkHasher.reset()
            self.chunkHasher.update(chunk)
            self.slices.append((self.entries.count, number, self.groups.count - 1))
            return PackIndex.Chunk(
                sha256: self.chunkHasher.hexDigest(), size: Int64(chunk.count), offset: 0, length: 0, frameSize: 0, frameOffset: start)
        }
        guard let sink = self.sink, let (offset, length) = try sink.cut() else {
            throw PackDeliveryError(.internalError, message: "A chunk of \(String(decoding: item.path, as: UTF8.self)) was not written.")
        }
        self.chunkHasher.reset()
        self.chunkHasher.update(chunk)
        let storage: PackIndex.Storage =
            switch sink.framing {
            case .raw: .raw
            case .zstd: .zstdFrame
            case .gzip: .gzipMember
            }
        return PackIndex.Chunk(
            sha256: self.chunkHasher.hexDigest(), size: Int64(chunk.count), offset: offset, length: length, storage: storage)
    }

    private mutating func copyFile(_ item: PackItem, folderPath: String, into record: inout PackIndex.Entry) throws(PackDeliveryError) {
        let path = folderPath + "/" + String(decoding: item.source ?? item.path, as: UTF8.self)
        let fd = PackFolderScanner.withCName(Array(folderPath.utf8) + [UInt8(ascii: "/")] + (item.source ?? item.path)) {
            open($0, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        }
        guard fd >= 0 else { throw PackWriterErrors.file("read", path: path, errno: errno) }
        defer { close(fd) }
        var remaining = item.size
        let buffer = self.buffer
        while true {
            let wanted = remaining > 0 ? Int(min(Int64(buffer.count), remaining)) : 1
            let count = read(fd, buffer.baseAddress!, wanted)
            if count < 0 {
                if errno == EINTR { continue }
                throw PackWriterErrors.file("read", path: path, errno: errno)
            }
            if count == 0 {
                if remaining > 0 { throw Self.changed(path) }
                break
            }
            if remaining == 0 { throw Self.changed(path) }
            try self.addData(UnsafeRawBufferPointer(rebasing: buffer[..<count]), item: item, into: &record)
            remaining -= Int64(count)
        }
    }

    private func dataError(_ item: PackItem) -> PackDeliveryError {
        Self.archiveError(self.archive, "write the entry '\(String(decoding: item.path, as: UTF8.self))' of", output: self.output)
    }

    /// Closes the archive, flushes it to disk and renames it into place.
    ///
    /// - Returns: the pack's index, when it was written chunk by chunk; nil for a zip, a tar.bz2 or a tar.xz.
    mutating func finish() throws(PackDeliveryError) -> PackIndex? {
        if archive_write_close(self.archive) != ARCHIVE_OK {
            throw self.sink?.failure ?? Self.archiveError(self.archive, "finish", output: self.output)
        }
        var index: PackIndex?
        if let sink = self.sink {
            // The end of the archive joins the shared frame being gathered, if any, which is then cut.
            try self.cut()
            let pack = try sink.finish()
            for slice in self.slices {
                let group = self.groups[slice.group]
                self.entries[slice.entry].chunks?[slice.chunk].offset = group.offset
                self.entries[slice.entry].chunks?[slice.chunk].length = group.length
                self.entries[slice.entry].chunks?[slice.chunk].frameSize = group.size
            }
            index = PackIndex(container: self.container, pack: pack, chunking: .init(self.chunks.chunker), entries: self.entries)
            // Format 2 readers cannot read slices: a pack without them keeps format 2.
            if !self.slices.isEmpty { index?.format = 3 }
        }
        archive_write_free(self.archive)
        self.sinkContext?.release()
        self.sinkContext = nil
        self.buffer.deallocate()
        self.finished = true
        defer { close(self.fd) }
        if fsync(self.fd) != 0 {
            let code = errno
            unlink(self.temporaryPath)
            throw PackWriterErrors.file("flush", path: self.output.path, errno: code)
        }
        if rename(self.temporaryPath, self.output.path) != 0 {
            let code = errno
            unlink(self.temporaryPath)
            throw PackWriterErrors.file("move the pack into place at", path: self.output.path, errno: code)
        }
        return index
    }

    /// Frees the writer and removes the temporary file after a failure.
    func abandon() {
        guard !self.finished else { return }
        archive_write_fail(self.archive)
        archive_write_free(self.archive)
        self.sinkContext?.release()
        self.buffer.deallocate()
        close(self.fd)
        unlink(self.temporaryPath)
    }

    private static func changed(_ path: String) -> PackDeliveryError {
        PackDeliveryError(
            .fileSystem, message: "The file '\(path)' changed while it was being packed.",
            hint: "Pack again once nothing writes to the folder.", subject: path)
    }

    private static func archiveError(_ archive: OpaquePointer, _ operation: String, output: URL) -> PackDeliveryError {
        let code = archive_errno(archive)
        if code == ENOSPC || code == EDQUOT {
            return PackDeliveryError.insufficientStorage(
                path: output.deletingLastPathComponent().path, needed: nil, available: nil, errno: code)
        }
        let detail = archive_error_string(archive).map { String(cString: $0) } ?? "unknown libarchive error"
        return PackDeliveryError(
            .fileSystem, message: "Could not \(operation) the pack '\(output.path)': \(detail).",
            subject: output.path, underlying: .init(.libarchive, Int(code)))
    }
}
