import CArchive
import CLinux
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Limits on what one pack may unpack to, checked on what is actually written.
struct UnpackLimits: Sendable, Hashable {
    /// The most bytes the pack may unpack to: file contents, including the holes of sparse files.
    var maxBytes: Int64
    /// The most archive entries (headers) the pack may hold.
    var maxEntries: Int

    init(maxBytes: Int64, maxEntries: Int = 100_000) {
        self.maxBytes = maxBytes
        self.maxEntries = maxEntries
    }
}

/// What an unpack wrote.
struct UnpackSummary: Sendable, Hashable {
    /// Bytes of file contents written (a sparse file's holes count as written).
    var bytes: Int64
    /// Archive entries read, whatever their type (implicitly created folders are not counted).
    var entries: Int
    /// Every regular file (hard links included) and symlink, with its size and SHA-256 computed while it was written
    /// (a regular file's SHA-256 is empty when ``filesHashed`` is false).
    var files: [InstalledFile] = []
    /// Whether regular files were hashed as they were written; when not, their digests come from the pack's index
    /// (``IndexDigests``). Symlinks' targets are always hashed.
    var filesHashed = true
    /// The hard links made, by path, with the path of the file each links to.
    var hardLinks: [String: String] = [:]
    /// Every folder created, implicit ones included, relative to the staging folder (`""` is the staging folder).
    var directories: [String] = []
    /// The pack is a zip: its entries in the order read (for ``Unpacker/adopt(archive:listing:streamed:into:limits:isCancelled:)``).
    var zipEntries: [ZipEntryRead]? = nil
}

/// A zip entry as an unpack read it.
struct ZipEntryRead: Sendable, Hashable {
    /// Its name as stored.
    var name: [UInt8]
    /// Where its local header starts in the pack.
    var offset: Int64
}

/// Unpacks a pack from an untrusted server into a private staging folder.
///
/// Every header is checked here, not left to libarchive's extraction flags, and everything is created
/// relative to directory descriptors with `O_NOFOLLOW`/`O_EXCL`, so nothing is ever written through a
/// symlink or outside the staging folder. The whole pack is rejected (an error is thrown; the caller
/// removes the staging folder) when any entry:
/// - has an absolute path or a `..` component;
/// - is a device node, a FIFO, a socket or of an unknown type;
/// - is a symlink whose target is absolute, leaves the staging folder (resolved lexically from the
///   link's own folder), or passes through another symlink (and a later symlink may not be created
///   where an earlier link's target passes through);
/// - is a hard link to anything but a regular file extracted earlier from the same pack;
/// - would be written through a symlink, or changes the type of an earlier entry;
/// - duplicates an earlier file, symlink or hard link (a repeated folder entry is allowed; it updates
///   the folder's mode);
/// - has a name component longer than `NAME_MAX` (255 bytes) or a full path longer than `PATH_MAX`.
///
/// Modes: setuid, setgid and sticky bits and group/other write are dropped (`mode & 0o755`); files
/// keep owner read/write, folders owner read/write/search. Owners are never changed. File
/// modification times are restored from the headers; folders' are not.
///
/// The calling thread's locale (not the process's) is switched to `C.UTF-8` for the duration, so
/// that libarchive decodes UTF-8 names in zip and pax headers instead of refusing them.
enum Unpacker {
    /// How much output passes between two calls of the `progress` closure.
    static let progressInterval: Int64 = 1 << 20
    /// A file's bytes are handed to the kernel's writeback every this many bytes (`sync_file_range`).
    static let writebackStep: Int64 = 8 << 20

    /// Streams `archive` into the existing, empty folder `staging`.
    ///
    /// - Parameters:
    ///   - archive: a zip, or a tar that is plain or compressed with gzip, bzip2, xz or zstd.
    ///   - staging: an existing, empty folder that only this unpack writes to.
    ///   - limits: the most bytes and entries the pack may unpack to.
    ///   - listing: the zip's central directory when the caller has read it; read here otherwise (unless the pack
    ///     is still `growing`). A zip's files are recorded with the CRC-32s it gives (libarchive checks each
    ///     file's bytes against it).
    ///   - progress: called with the bytes written so far, about every MiB and once at the end.
    ///   - isCancelled: polled between blocks of data and between entries.
    ///   - writer: writes the files' bytes (tests pass one that fails like a full disk).
    ///   - growing: the partial file, when the pack is read while it downloads.
    ///   - hashFiles: hash each regular file as it is written; false when the pack's index gives the digests.
    /// - Returns: the bytes and entries written.
    /// - Throws: `PackDeliveryError` of kind `.badData` for an unsafe entry, a corrupt or truncated
    ///   archive, a file that is not an archive, or a limit exceeded; `.insufficientStorage` when the
    ///   filesystem is full (ENOSPC, EDQUOT); `.io` for other local failures; `.cancelled` when
    ///   `isCancelled` returned true. What was written so far stays in `staging`.
    static func unpack(
        archive: URL, into staging: URL, limits: UnpackLimits, listing: ZipDirectories.Listing? = nil,
        progress: (Int64) -> Void = { _ in }, isCancelled: @escaping () -> Bool = { false }, writer: any FileWriting = SystemFileWriter(),
        growing: GrowingFile? = nil, hashFiles: Bool = true
    ) throws(PackDeliveryError) -> UnpackSummary {
        var directory = listing
        if directory == nil, growing == nil { directory = try ZipDirectories.listing(archive) }
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }
        let run = try UnpackRun(
            archive: archive, staging: staging, limits: limits, writer: writer, isCancelled: isCancelled, growing: growing,
            listing: directory, hashFiles: hashFiles)
        return try run.run(progress: progress, isCancelled: isCancelled)
    }

    /// Finishes a zip that was unpacked while it downloaded.
    ///
    /// Read as it arrives, a zip can only be read by its local headers, which carry neither the files' types
    /// (a symlink arrives as a file holding its target) nor their modes: those are in the central directory at
    /// the end, which is what an unpack of the whole archive follows. So the complete, verified archive is read
    /// once more, by its central directory, with every check of ``unpack(archive:into:limits:progress:isCancelled:writer:growing:)``,
    /// into the new, empty folder `staging`; but a regular file's bytes are not unpacked again: the file the
    /// streamed unpack wrote for the same entry is moved in, once its size matches the central directory's, and
    /// given the central directory's mode. Folders and symlinks are made from the central directory.
    ///
    /// - Parameters:
    ///   - archive: the complete zip, already verified.
    ///   - listing: its central directory (``ZipDirectories/listing(_:)``), already checked.
    ///   - streamed: the folder and summary of the streamed unpack; the folder is emptied of the files moved.
    ///   - staging: an existing, empty folder.
    /// - Throws: any error the unpack of the whole archive could throw, and `corruptArchive` when the entries
    ///   the central directory lists are not those the local headers gave, in the same order, of the same
    ///   sizes and CRC-32s. The caller then unpacks the whole archive instead, which settles it.
    static func adopt(
        archive: URL, listing: ZipDirectories.Listing, streamed: (folder: URL, summary: UnpackSummary), into staging: URL,
        limits: UnpackLimits, isCancelled: @escaping () -> Bool = { false }
    ) throws(PackDeliveryError) -> UnpackSummary {
        guard let read = streamed.summary.zipEntries else { throw UnpackRun.notAdoptable("it was not read as a zip") }
        // The local headers read as the zip arrived must be exactly those its central directory points at: a
        // stream can be made to stop early, or to read a header the directory skips, with the same names.
        guard listing.entries.map(\.localOffset).sorted() == read.map(\.offset).sorted() else {
            throw UnpackRun.notAdoptable("its local headers are not the ones its central directory points at")
        }
        // The stream checked each entry's data against the CRC-32 of its local header or data descriptor; a whole
        // unpack checks it against the central directory's. Adopt only when the two are the same.
        if let entry = listing.entries.first(where: { $0.localCRC != $0.crc }) {
            throw UnpackRun.notAdoptable(
                "'\(PackDeliveryError.printable(String(decoding: entry.name, as: UTF8.self)))' has another CRC-32 in the central directory")
        }
        var files: [String: InstalledFile] = [:]
        for file in streamed.summary.files {
            // A symlink would mean the local headers gave types of their own; names that decode alike are ambiguous.
            guard file.kind == .file, files.updateValue(file, forKey: file.path) == nil else {
                throw UnpackRun.notAdoptable("'\(PackDeliveryError.printable(file.path))' cannot be matched")
            }
        }
        let folder = open(streamed.folder.path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard folder >= 0 else { throw .io("open the streamed unpack's folder", path: streamed.folder.path, errno: errno) }
        defer { close(folder) }
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }
        let run = try UnpackRun(
            archive: archive, staging: staging, limits: limits, writer: SystemFileWriter(), isCancelled: isCancelled,
            growing: nil, listing: listing, adopting: UnpackRun.Adoption(folderFD: folder, names: read.map(\.name), files: files),
            hashFiles: streamed.summary.filesHashed)
        return try run.run(progress: { _ in }, isCancelled: isCancelled)
    }
}

// MARK: - Thread locale

/// Switches the calling thread's `LC_CTYPE` to `C.UTF-8` (thread-local: `uselocale`, not `setlocale`).
struct ArchiveThreadLocale {
    private let previous: locale_t?
    private let installed: locale_t?

    static func useUTF8() -> ArchiveThreadLocale {
        // A plain loop: `names.lazy.compactMap { newlocale(…) }.first` called newlocale twice for the found
        // name (once to find it, once to return it) and leaked one locale per unpack (found by LeakSanitizer).
        for name in ["C.UTF-8", "C.utf8", "en_US.UTF-8"] {
            if let utf8 = newlocale(Int32(LC_CTYPE_MASK), name, nil) {
                let previous = uselocale(utf8)
                return ArchiveThreadLocale(previous: previous, installed: utf8)
            }
        }
        return ArchiveThreadLocale(previous: nil, installed: nil)
    }

    func restore() {
        guard let installed else { return }
        if let previous { _ = uselocale(previous) }
        freelocale(installed)
    }
}

// MARK: - Constants

/// File type bits as libarchive reports them (the `AE_IF*` macros are casts Swift cannot import).
enum ArchiveFileType {
    static let mask: UInt32 = 0o170000
    static let regular: UInt32 = 0o100000
    static let directory: UInt32 = 0o040000
    static let symlink: UInt32 = 0o120000
    static let characterDevice: UInt32 = 0o020000
    static let blockDevice: UInt32 = 0o060000
    static let fifo: UInt32 = 0o010000
    static let socket: UInt32 = 0o140000
}

private let unpackNameMax = 255
private let unpackPathMax = Int(PATH_MAX)
private let slash = UInt8(ascii: "/")
private let dot = UInt8(ascii: ".")

// MARK: - One unpack

/// The state of one unpack: the libarchive reader, the staging folder's descriptor and what has been
/// created so far. Not thread-safe; lives for one `Unpacker.unpack` call.
private final class UnpackRun {
    private enum Node { case directory, file, symlink }

    /// What ``Unpacker/adopt(archive:listing:streamed:into:limits:isCancelled:)`` takes from a streamed unpack.
    struct Adoption {
        /// The streamed unpack's folder (it holds no symlinks: checked by the caller).
        let folderFD: Int32
        /// The entries' names as the streamed unpack read them, in order.
        let names: [[UInt8]]
        /// Its regular files, by path.
        let files: [String: InstalledFile]
    }

    private let archiveURL: URL
    private let stagingPath: String
    private let limits: UnpackLimits
    private let writer: any FileWriting
    private let source: ArchiveReader
    private var reader: OpaquePointer { self.source.reader }
    /// One hash context for symlinks and files written out of order, reset before each (an `EVP_MD_CTX` per
    /// file cost a malloc and free each).
    private let entryHasher = SHA256Hasher()
    /// Regular files' digests, made on a queue beside this thread.
    private let digests = FileDigests()
    /// Files whose digest ``digests`` makes: its id, by path (a hard link shares its target's).
    private var pendingDigests: [[UInt8]: Int] = [:]
    /// Whether regular files are hashed as they are written (else the index gives their digests).
    private let hashFiles: Bool
    /// The hard links made: the path of the file each links to, by path.
    private var hardLinks: [[UInt8]: [UInt8]] = [:]
    private let rootFD: Int32

    /// Every path created so far (components joined by `/`), including implicit folders.
    private var nodes: [[UInt8]: Node] = [:]
    /// Size and SHA-256 of every file and symlink created, by path.
    private var records: [[UInt8]: (kind: InstalledFile.Kind, size: Int64, sha256: String)] = [:]
    /// The CRC-32 of each zip entry by its name as stored, from the central directory; empty for other packs.
    private let directoryCRCs: [[UInt8]: UInt32]
    /// The CRC-32 of the entries read, by path.
    private var crcs: [[UInt8]: UInt32] = [:]
    /// Paths that some symlink's target passes through as a folder; no symlink may be created there.
    private var traversedBySymlinks: Set<[UInt8]> = []
    /// The last parent folder opened, kept open because entries usually come folder by folder.
    private var cachedDirectory: (path: [UInt8], fd: Int32)?

    private var bytes: Int64 = 0
    private var entries = 0
    private var lastProgress: Int64 = 0
    private var lastEntryName: String?
    /// The entries read so far, once the pack turned out to be a zip.
    private var zipEntries: [ZipEntryRead]?
    /// What a streamed zip's files may add to the byte limit: up to a symlink target's worth each.
    private var zipSymlinkAllowance: Int64 = 0
    private let adoption: Adoption?
    /// The pack is read while it downloads.
    private let streaming: Bool

    /// The most bytes of file contents. A zip read by its local headers cannot tell a symlink from a file (the
    /// target arrives as the file's bytes), so each file shorter than `PATH_MAX` adds its size (it may be a
    /// symlink), and the file being written a `PATH_MAX`; the central directory's pass (`Unpacker.adopt`) then
    /// holds its regular files to the limit itself.
    private var maxBytes: Int64 {
        guard self.streaming, self.zipEntries != nil else { return self.limits.maxBytes }
        return self.limits.maxBytes + self.zipSymlinkAllowance + Int64(unpackPathMax)
    }

    init(
        archive: URL, staging: URL, limits: UnpackLimits, writer: any FileWriting, isCancelled: @escaping () -> Bool,
        growing: GrowingFile?, listing: ZipDirectories.Listing? = nil, adopting adoption: Adoption? = nil, hashFiles: Bool = true
    ) throws(PackDeliveryError) {
        self.hashFiles = hashFiles
        // Names are unique among files (a repeated one is refused as it is read); a folder may repeat.
        self.directoryCRCs = Dictionary((listing?.entries ?? []).map { ($0.name, $0.crc) }, uniquingKeysWith: { first, _ in first })
        self.writer = writer
        self.adoption = adoption
        self.streaming = growing != nil
        self.archiveURL = archive
        self.stagingPath = staging.path
        self.limits = limits

        let rootFD = open(staging.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard rootFD >= 0 else {
            throw Self.fileError("open the staging folder", path: staging.path, errno: errno, stagingPath: staging.path)
        }
        let empty: Bool
        do { empty = try Self.isEmptyDirectory(rootFD, path: staging.path) } catch {
            close(rootFD)
            throw error
        }
        guard empty else {
            close(rootFD)
            throw PackDeliveryError(
                .invalidArgument, message: "The staging folder '\(staging.path)' is not empty.",
                hint: "Unpack into a new, empty folder.", subject: staging.path)
        }

        do {
            self.source = try ArchiveReader(archive, maxDecompressed: limits.maxBytes, isCancelled: isCancelled, growing: growing)
        } catch {
            close(rootFD)
            throw error
        }
        self.rootFD = rootFD
    }

    deinit {
        if let cachedDirectory { close(cachedDirectory.fd) }
        close(self.rootFD)
    }

    private var libarchiveMessage: String { self.source.message }

    // MARK: Entries

    func run(progress: (Int64) -> Void, isCancelled: () -> Bool) throws(PackDeliveryError) -> UnpackSummary {
        while true {
            if isCancelled() { throw self.cancelled() }
            var entry: OpaquePointer?
            let status = archive_read_next_header(self.reader, &entry)
            if status == ARCHIVE_EOF { break }
            // ARCHIVE_WARN on a header (e.g. a name that is not valid UTF-8) is tolerated: every
            // header is checked below. ARCHIVE_RETRY (a damaged header skipped) and worse are not.
            guard status == ARCHIVE_OK || status == ARCHIVE_WARN, let entry else {
                throw self.source.error(self.lastEntryName)
            }
            if !self.source.checkBounds() { throw self.source.error(self.lastEntryName) }
            try self.extract(entry, progress: progress, isCancelled: isCancelled)
        }
        if let adoption, adoption.names.count != self.entries {
            throw Self.notAdoptable("the local headers gave \(adoption.names.count) entries, the central directory \(self.entries)")
        }
        let made = self.hashFiles ? self.digests.finish() : [:]
        for (key, id) in self.pendingDigests {
            guard let digest = made[id] else { throw PackDeliveryError(.internalError, message: "A file's digest was not made.") }
            self.records[key]?.sha256 = digest
        }
        progress(self.bytes)
        var summary = UnpackSummary(bytes: self.bytes, entries: self.entries, zipEntries: self.zipEntries)
        summary.filesHashed = self.hashFiles
        summary.hardLinks = Dictionary(
            uniqueKeysWithValues: self.hardLinks.map {
                (String(decoding: $0.key, as: UTF8.self), String(decoding: $0.value, as: UTF8.self))
            })
        summary.files = self.records.map { path, record in
            InstalledFile(
                path: String(decoding: path, as: UTF8.self), kind: record.kind, size: record.size, sha256: record.sha256,
                crc32: self.crcs[path])
        }.sorted { $0.path < $1.path }
        summary.directories =
            [""] + self.nodes.compactMap { path, node in node == .directory ? String(decoding: path, as: UTF8.self) : nil }.sorted()
        return summary
    }

    private func extract(_ entry: OpaquePointer, progress: (Int64) -> Void, isCancelled: () -> Bool) throws(PackDeliveryError) {
        guard let rawName = Self.bytes(archive_entry_pathname(entry)) ?? Self.bytes(archive_entry_pathname_utf8(entry)) else {
            throw PackDeliveryError.unsafeEntry("<entry \(self.entries + 1)>", "its name cannot be read (\(self.libarchiveMessage))")
        }
        let name = String(decoding: rawName, as: UTF8.self)
        self.lastEntryName = name
        if self.entries == 0 {
            if archive_format(self.reader) & 0xFF0000 == ARCHIVE_FORMAT_ZIP { self.zipEntries = [] }
            // Files' hashes go to a queue of their own when this thread also decompresses (a compressed tar, a zip's
            // deflated entries): see FileDigests.
            self.digests.onQueue = self.zipEntries != nil || self.source.isCompressed
        }
        self.zipEntries?.append(ZipEntryRead(name: rawName, offset: Int64(archive_read_header_position(self.reader))))
        if let adoption, self.entries >= adoption.names.count || adoption.names[self.entries] != rawName {
            throw Self.notAdoptable(
                "the central directory's entry \(self.entries + 1), '\(PackDeliveryError.printable(name))', is not the local headers' one")
        }
        self.entries += 1
        self.source.entries = self.entries
        if self.entries > self.limits.maxEntries {
            throw PackDeliveryError.unpackLimitExceeded("entries", limit: Int64(self.limits.maxEntries), entry: name)
        }
        let components = try self.normalize(rawName, entry: name)
        let key = Self.join(components)
        if let crc = self.directoryCRCs[rawName] { self.crcs[key] = crc }

        if let target = Self.bytes(archive_entry_hardlink(entry)) ?? Self.bytes(archive_entry_hardlink_utf8(entry)) {
            try self.requireNew(key, entry: name)
            try self.link(components, key: key, to: target, entry: name)
            return
        }
        let type = UInt32(archive_entry_filetype(entry)) & ArchiveFileType.mask
        let perm = UInt32(archive_entry_perm(entry))
        switch type {
        case ArchiveFileType.directory:
            try self.makeDirectory(components, key: key, mode: mode_t((perm & 0o755) | 0o700), entry: name)
        case ArchiveFileType.regular:
            try self.requireNew(key, entry: name)
            try self.writeFile(
                entry, components, key: key, mode: mode_t((perm & 0o755) | 0o600), entry: name,
                progress: progress, isCancelled: isCancelled)
        case ArchiveFileType.symlink:
            guard let target = Self.bytes(archive_entry_symlink(entry)) ?? Self.bytes(archive_entry_symlink_utf8(entry)) else {
                throw PackDeliveryError.unsafeEntry(name, "it is a symlink without a readable target")
            }
            try self.requireNew(key, entry: name)
            try self.makeSymlink(components, key: key, target: target, entry: name)
        case ArchiveFileType.characterDevice:
            throw PackDeliveryError.unsafeEntry(name, "it is a character device")
        case ArchiveFileType.blockDevice:
            throw PackDeliveryError.unsafeEntry(name, "it is a block device")
        case ArchiveFileType.fifo:
            throw PackDeliveryError.unsafeEntry(name, "it is a FIFO (named pipe)")
        case ArchiveFileType.socket:
            throw PackDeliveryError.unsafeEntry(name, "it is a socket")
        default:
            throw PackDeliveryError.unsafeEntry(name, "it has an unsupported file type (mode \(String(type, radix: 8)))")
        }
    }

    /// Splits an entry name into checked components: leading `./` stripped, empty and `.` components
    /// dropped. An empty result is the staging folder itself.
    private func normalize(_ raw: [UInt8], entry: String) throws(PackDeliveryError) -> [[UInt8]] {
        if raw.isEmpty { throw PackDeliveryError.corruptArchive("entry \(self.entries) has an empty name") }
        var start = 0
        while raw.count - start >= 2, raw[start] == dot, raw[start + 1] == slash { start += 2 }
        if start < raw.count, raw[start] == slash {
            throw PackDeliveryError.unsafeEntry(entry, "its path is absolute")
        }
        var components: [[UInt8]] = []
        var length = 0
        for part in raw[start...].split(separator: slash, omittingEmptySubsequences: true) {
            if part.count == 1, part.first == dot { continue }
            if part.count == 2, part.first == dot, part.last == dot {
                throw PackDeliveryError.unsafeEntry(entry, "its path has a '..' component")
            }
            if part.count > unpackNameMax {
                throw PackDeliveryError.unsafeEntry(
                    entry,
                    "a component of its name is \(part.count) bytes long, more than the filesystem's limit of \(unpackNameMax) bytes (NAME_MAX)"
                )
            }
            components.append(Array(part))
            length += part.count + 1
        }
        let fullLength = self.stagingPath.utf8.count + length
        if !components.isEmpty, fullLength >= unpackPathMax {
            throw PackDeliveryError.unsafeEntry(
                entry,
                "its path would be \(fullLength) bytes long, more than the filesystem's limit of \(unpackPathMax - 1) bytes (PATH_MAX)")
        }
        return components
    }

    private func requireNew(_ key: [UInt8], entry: String) throws(PackDeliveryError) {
        if key.isEmpty {
            throw PackDeliveryError.unsafeEntry(entry, "it would replace the staging folder itself")
        }
        switch self.nodes[key] {
        case nil: return
        case .directory: throw PackDeliveryError.unsafeEntry(entry, "it would replace an earlier folder of the same name")
        case .file: throw PackDeliveryError.unsafeEntry(entry, "it duplicates an earlier file of the same name")
        case .symlink: throw PackDeliveryError.unsafeEntry(entry, "it would replace or write through an earlier symlink of the same name")
        }
    }

    // MARK: Folders

    private func makeDirectory(_ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String) throws(PackDeliveryError) {
        if components.isEmpty { return }  // "." or "./": the staging folder itself
        switch self.nodes[key] {
        case .file: throw PackDeliveryError.unsafeEntry(entry, "it would turn an earlier file into a folder")
        case .symlink: throw PackDeliveryError.unsafeEntry(entry, "it would turn an earlier symlink into a folder")
        case .directory:
            let fd = try self.openDirectory(components, entry: entry)
            defer { close(fd) }
            if fchmod(fd, mode) != 0 { throw self.failure("set the mode of", components, errno: errno, entry: entry) }
        case nil:
            let parent = try self.parentDirectory(components, entry: entry)
            try self.createDirectory(in: parent, components, key: key, mode: mode, entry: entry)
        }
    }

    /// `mkdirat` + `fchmod` through an `O_NOFOLLOW` descriptor, so the mode does not depend on the umask.
    private func createDirectory(in parent: Int32, _ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String)
        throws(PackDeliveryError)
    {
        let last = components[components.count - 1]
        if Self.withComponent(last, { mkdirat(parent, $0, 0o700) }) != 0 {
            throw self.failure("create the folder", components, errno: errno, entry: entry)
        }
        self.nodes[key] = .directory
        let fd = Self.withComponent(last) { openat(parent, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw self.failure("open the folder", components, errno: errno, entry: entry) }
        defer { close(fd) }
        if fchmod(fd, mode) != 0 { throw self.failure("set the mode of", components, errno: errno, entry: entry) }
    }

    /// The folder that holds `components`' last component, created (mode 0755) where missing.
    /// The descriptor is borrowed: it belongs to the run (root or cache) and must not be closed.
    private func parentDirectory(_ components: [[UInt8]], entry: String) throws(PackDeliveryError) -> Int32 {
        let parentComponents = Array(components.dropLast())
        if parentComponents.isEmpty { return self.rootFD }
        let key = Self.join(parentComponents)
        if let cachedDirectory, cachedDirectory.path == key { return cachedDirectory.fd }
        let fd = try self.walk(parentComponents, createMissing: true, entry: entry)
        if let cachedDirectory { close(cachedDirectory.fd) }
        self.cachedDirectory = (key, fd)
        return fd
    }

    /// Opens an existing folder that an earlier entry created; the caller closes the descriptor.
    private func openDirectory(_ components: [[UInt8]], entry: String) throws(PackDeliveryError) -> Int32 {
        try self.walk(components, createMissing: false, entry: entry)
    }

    /// Opens `components` one by one from the staging folder with `O_NOFOLLOW | O_DIRECTORY`,
    /// refusing files and symlinks on the way. Returns an owned descriptor.
    private func walk(_ components: [[UInt8]], createMissing: Bool, entry: String) throws(PackDeliveryError) -> Int32 {
        var fd = self.rootFD
        var prefix: [UInt8] = []
        for index in components.indices {
            let component = components[index]
            if !prefix.isEmpty { prefix.append(slash) }
            prefix.append(contentsOf: component)
            let here = Array(components[...index])
            switch self.nodes[prefix] {
            case .file:
                if fd != self.rootFD { close(fd) }
                throw PackDeliveryError.unsafeEntry(entry, "its folder '\(String(decoding: prefix, as: UTF8.self))' is a file")
            case .symlink:
                if fd != self.rootFD { close(fd) }
                throw PackDeliveryError.unsafeEntry(
                    entry, "it would be written through the symlink '\(String(decoding: prefix, as: UTF8.self))'")
            case nil:
                guard createMissing else {
                    if fd != self.rootFD { close(fd) }
                    throw PackDeliveryError.unsafeEntry(entry, "its folder '\(String(decoding: prefix, as: UTF8.self))' does not exist")
                }
                do {
                    try self.createDirectory(in: fd, here, key: prefix, mode: 0o755, entry: entry)
                } catch {
                    if fd != self.rootFD { close(fd) }
                    throw error
                }
            case .directory:
                break
            }
            let next = Self.withComponent(component) { openat(fd, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
            let code = errno
            if fd != self.rootFD { close(fd) }
            guard next >= 0 else { throw self.failure("open the folder", here, errno: code, entry: entry) }
            fd = next
        }
        return fd
    }

    // MARK: Files

    private func writeFile(
        _ archiveEntry: OpaquePointer, _ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String,
        progress: (Int64) -> Void, isCancelled: () -> Bool
    ) throws(PackDeliveryError) {
        if let adoption { return try self.adoptFile(archiveEntry, components, key: key, mode: mode, entry: entry, from: adoption) }
        let parent = try self.parentDirectory(components, entry: entry)
        let fd = Self.withComponent(components[components.count - 1]) {
            openat(parent, $0, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        }
        guard fd >= 0 else { throw self.failure("create the file", components, errno: errno, entry: entry) }
        self.nodes[key] = .file
        var closed = false
        defer { if !closed { close(fd) } }

        var fileEnd: Int64 = 0  // logical end so far, holes included
        var dataEnd: Int64 = 0  // end of the last bytes actually written
        let digest = self.hashFiles ? self.digests.begin() : 0
        var hashedEnd: Int64 = 0  // the hash covers [0, hashedEnd); holes hash as zeros
        var inOrder = self.hashFiles  // blocks arrived in order, so the hash needs no second read
        var writebackStart: Int64 = 0  // bytes before this were handed to the kernel's writeback
        while true {
            if !self.source.checkBounds() { throw self.source.error(entry) }
            var buffer: UnsafeRawPointer?
            var size = 0
            var offset: la_int64_t = 0
            let status = archive_read_data_block(self.reader, &buffer, &size, &offset)
            if status == ARCHIVE_EOF { break }
            // ARCHIVE_WARN here is a failed check such as a zip CRC mismatch: the data is corrupt.
            guard status == ARCHIVE_OK else {
                throw self.source.error(entry)
            }
            guard offset >= 0 else {
                throw PackDeliveryError.corruptArchive("a block has a negative offset", entry: entry)
            }
            // Charge the data plus any hole it opens, before writing, so a bomb stops at the limit.
            let (end, overflow) = offset.addingReportingOverflow(Int64(size))
            guard !overflow else { throw PackDeliveryError.corruptArchive("a block lies beyond any file size", entry: entry) }
            let charge = Int64(size) + max(0, offset - fileEnd)
            if charge > self.maxBytes - self.bytes {
                throw PackDeliveryError.unpackLimitExceeded("bytes", limit: self.limits.maxBytes, entry: entry)
            }
            if size > 0, let buffer {
                try self.writeAll(fd, buffer, size, at: offset, components, entry: entry)
                dataEnd = max(dataEnd, end)
                if dataEnd - writebackStart >= Unpacker.writebackStep {
                    // Start writing this stretch out now, while the unpack goes on: the fsync before the rename
                    // then waits for the tail only. 1 GiB pack of 4 files on ext4: "installing" 1.9 → 0.4 s, the
                    // whole fetch 5.0 → 4.7 s (median of 3, file://); the disk, not the CPU, is then the limit.
                    _ = clinux_start_writeback(fd, writebackStart, dataEnd - writebackStart)
                    writebackStart = dataEnd
                }
                if inOrder, offset >= hashedEnd {
                    self.digests.addZeros(offset - hashedEnd)
                    self.digests.add(UnsafeRawBufferPointer(start: buffer, count: size))
                    hashedEnd = end
                } else {
                    inOrder = false
                }
            }
            fileEnd = max(fileEnd, end)
            self.bytes += charge
            if self.bytes - self.lastProgress >= Unpacker.progressInterval {
                self.lastProgress = self.bytes
                progress(self.bytes)
            }
        }
        // A sparse file that ends in a hole: libarchive reports no block for it, only the size.
        if archive_entry_sparse_count(archiveEntry) > 0, archive_entry_size_is_set(archiveEntry) != 0 {
            let size = Int64(archive_entry_size(archiveEntry))
            if size > fileEnd {
                if size - fileEnd > self.maxBytes - self.bytes {
                    throw PackDeliveryError.unpackLimitExceeded("bytes", limit: self.limits.maxBytes, entry: entry)
                }
                self.bytes += size - fileEnd
                fileEnd = size
            }
        }
        if fileEnd > dataEnd, ftruncate(fd, off_t(fileEnd)) != 0 {
            throw self.failure("extend", components, errno: errno, entry: entry)
        }
        if self.streaming, self.zipEntries != nil, fileEnd < Int64(unpackPathMax) { self.zipSymlinkAllowance += fileEnd }
        if !self.hashFiles {
            // The pack's index gives the digest (IndexDigests), once the unpack's sizes are held to it.
            self.records[key] = (.file, fileEnd, "")
        } else if inOrder {
            self.digests.addZeros(fileEnd - hashedEnd)
            self.digests.end()
            self.records[key] = (.file, fileEnd, "")
            self.pendingDigests[key] = digest
        } else {
            // Blocks out of order (rare sparse layouts): hash what was written, once, here.
            let hasher = self.entryHasher
            hasher.reset()
            do throws(PackDeliveryError) { try hasher.update(fileDescriptor: fd, length: fileEnd) } catch {
                throw self.failure("read back", components, errno: Int32(error.underlying?.value ?? Int(EIO)), entry: entry)
            }
            self.records[key] = (.file, fileEnd, hasher.hexDigest())
        }
        try self.setModeAndTime(fd, archiveEntry, mode: mode, components, entry: entry)
        closed = true
        if close(fd) != 0 { throw self.failure("write", components, errno: errno, entry: entry) }
    }

    private func setModeAndTime(_ fd: Int32, _ archiveEntry: OpaquePointer, mode: mode_t, _ components: [[UInt8]], entry: String)
        throws(PackDeliveryError)
    {
        if fchmod(fd, mode) != 0 { throw self.failure("set the mode of", components, errno: errno, entry: entry) }
        if archive_entry_mtime_is_set(archiveEntry) != 0 {
            let mtime = timespec(tv_sec: time_t(archive_entry_mtime(archiveEntry)), tv_nsec: Int(archive_entry_mtime_nsec(archiveEntry)))
            var times = [mtime, mtime]
            _ = futimens(fd, &times)  // best effort
        }
    }

    /// A regular file of a zip read by its central directory: the file the streamed unpack wrote for it is moved
    /// in, with the central directory's mode, instead of unpacking its bytes again (libarchive skips them).
    private func adoptFile(
        _ archiveEntry: OpaquePointer, _ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String,
        from adoption: Adoption
    ) throws(PackDeliveryError) {
        let path = String(decoding: key, as: UTF8.self)
        guard let file = adoption.files[path] else {
            throw Self.notAdoptable("'\(PackDeliveryError.printable(path))' was not unpacked as a file")
        }
        if archive_entry_size_is_set(archiveEntry) != 0, Int64(archive_entry_size(archiveEntry)) != file.size {
            throw Self.notAdoptable("'\(PackDeliveryError.printable(path))' has another size in the central directory")
        }
        if file.size > self.maxBytes - self.bytes {
            throw PackDeliveryError.unpackLimitExceeded("bytes", limit: self.limits.maxBytes, entry: entry)
        }
        let parent = try self.parentDirectory(components, entry: entry)
        let moved = Self.withCName(key) { from in
            Self.withComponent(components[components.count - 1]) { renameat(adoption.folderFD, from, parent, $0) }
        }
        if moved != 0 { throw Self.notAdoptable("'\(PackDeliveryError.printable(path))' could not be moved (errno \(errno))") }
        self.nodes[key] = .file
        let fd = Self.withComponent(components[components.count - 1]) { openat(parent, $0, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw self.failure("open", components, errno: errno, entry: entry) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, Int64(info.st_size) == file.size else {
            throw Self.notAdoptable("'\(PackDeliveryError.printable(path))' is not the file the streamed unpack wrote")
        }
        try self.setModeAndTime(fd, archiveEntry, mode: mode, components, entry: entry)
        self.records[key] = (.file, file.size, file.sha256)
        self.bytes += file.size
    }

    /// The streamed unpack of a zip does not match its central directory: the caller unpacks the whole archive.
    static func notAdoptable(_ why: String) -> PackDeliveryError {
        PackDeliveryError(.corruptArchive, message: "The zip's central directory does not match its local headers as they arrived: \(why).")
    }

    private func writeAll(_ fd: Int32, _ buffer: UnsafeRawPointer, _ size: Int, at offset: Int64, _ components: [[UInt8]], entry: String)
        throws(PackDeliveryError)
    {
        var done = 0
        while done < size {
            let written = self.writer.pwrite(fd, buffer + done, size - done, offset + Int64(done))
            if written < 0 {
                if errno == EINTR { continue }
                throw self.failure("write", components, errno: errno, entry: entry)
            }
            if written == 0 { throw self.failure("write", components, errno: EIO, entry: entry) }
            done += written
        }
    }

    // MARK: Links

    private func makeSymlink(_ components: [[UInt8]], key: [UInt8], target: [UInt8], entry: String) throws(PackDeliveryError) {
        if target.isEmpty { throw PackDeliveryError.unsafeEntry(entry, "it is a symlink with an empty target") }
        let shownTarget = String(decoding: target, as: UTF8.self)
        if target.first == slash {
            throw PackDeliveryError.unsafeEntry(entry, "it is a symlink to the absolute path '\(shownTarget)'")
        }
        if target.count >= unpackPathMax {
            throw PackDeliveryError.unsafeEntry(entry, "it is a symlink whose target is longer than \(unpackPathMax - 1) bytes (PATH_MAX)")
        }
        if self.traversedBySymlinks.contains(key) {
            throw PackDeliveryError.unsafeEntry(entry, "an earlier symlink's target passes through this path, so it may not be a symlink")
        }
        // Resolve the target lexically from the link's own folder. Every state but the last is a
        // folder the kernel will pass through: none may be a symlink now, or become one later.
        var state = Array(components.dropLast())
        var passedThrough: [[UInt8]] = []
        for part in target.split(separator: slash, omittingEmptySubsequences: true) {
            if part.count == 1, part.first == dot { continue }
            passedThrough.append(Self.join(state))
            if part.count == 2, part.first == dot, part.last == dot {
                if state.isEmpty {
                    throw PackDeliveryError.unsafeEntry(entry, "it is a symlink to '\(shownTarget)', which leads outside the pack's folder")
                }
                state.removeLast()
            } else {
                state.append(Array(part))
            }
        }
        for path in passedThrough where self.nodes[path] == .symlink {
            throw PackDeliveryError.unsafeEntry(
                entry, "it is a symlink to '\(shownTarget)', which passes through the symlink '\(String(decoding: path, as: UTF8.self))'")
        }
        let parent = try self.parentDirectory(components, entry: entry)
        let status = Self.withCName(target) { targetName in
            Self.withComponent(components[components.count - 1]) { symlinkat(targetName, parent, $0) }
        }
        if status != 0 { throw self.failure("create the symlink", components, errno: errno, entry: entry) }
        self.nodes[key] = .symlink
        let hasher = self.entryHasher
        hasher.reset()
        target.withUnsafeBytes { hasher.update($0) }
        self.records[key] = (.symlink, Int64(target.count), hasher.hexDigest())
        self.traversedBySymlinks.formUnion(passedThrough)
    }

    private func link(_ components: [[UInt8]], key: [UInt8], to rawTarget: [UInt8], entry: String) throws(PackDeliveryError) {
        let shownTarget = String(decoding: rawTarget, as: UTF8.self)
        let target: [[UInt8]]
        do {
            target = try self.normalize(rawTarget, entry: entry)
        } catch {
            throw PackDeliveryError.unsafeEntry(
                entry, "it is a hard link to '\(shownTarget)', which lies outside the pack's folder or is not a valid path")
        }
        guard !target.isEmpty, self.nodes[Self.join(target)] == .file else {
            throw PackDeliveryError.unsafeEntry(
                entry, "it is a hard link to '\(shownTarget)', which is not a file extracted earlier from this pack")
        }
        let targetParentComponents = Array(target.dropLast())
        let targetParent = targetParentComponents.isEmpty ? self.rootFD : try self.openDirectory(targetParentComponents, entry: entry)
        defer { if targetParent != self.rootFD { close(targetParent) } }
        let parent = try self.parentDirectory(components, entry: entry)
        let status = Self.withComponent(target[target.count - 1]) { oldName in
            Self.withComponent(components[components.count - 1]) { linkat(targetParent, oldName, parent, $0, 0) }
        }
        if status != 0 { throw self.failure("create the hard link", components, errno: errno, entry: entry) }
        self.nodes[key] = .file
        self.records[key] = self.records[Self.join(target)]
        self.pendingDigests[key] = self.pendingDigests[Self.join(target)]
        self.hardLinks[key] = Self.join(target)
    }

    // MARK: Errors and helpers

    private func cancelled() -> PackDeliveryError {
        PackDeliveryError(
            .cancelled, message: "Unpacking '\(self.archiveURL.lastPathComponent)' was cancelled.",
            subject: self.stagingPath)
    }

    private func failure(_ operation: String, _ components: [[UInt8]], errno code: Int32, entry: String) -> PackDeliveryError {
        if code == ENAMETOOLONG {
            return PackDeliveryError.unsafeEntry(entry, "its name is too long for the filesystem")
        }
        let path = self.stagingPath + "/" + String(decoding: Self.join(components), as: UTF8.self)
        return Self.fileError(operation, path: path, errno: code, stagingPath: self.stagingPath)
    }

    private static func fileError(_ operation: String, path: String, errno code: Int32, stagingPath: String) -> PackDeliveryError {
        if code == ENOSPC || code == EDQUOT {
            return PackDeliveryError.insufficientStorage(path: stagingPath, needed: nil, available: nil, errno: code)
        }
        return PackDeliveryError.io(operation, path: path, errno: code)
    }

    private static func isEmptyDirectory(_ fd: Int32, path: String) throws(PackDeliveryError) -> Bool {
        let copy = dup(fd)
        guard copy >= 0 else { throw .io("list the staging folder", path: path, errno: errno) }
        guard let directory = fdopendir(copy) else {
            let code = errno
            close(copy)
            throw .io("list the staging folder", path: path, errno: code)
        }
        defer { closedir(directory) }
        while let item = readdir(directory) {
            let isDotOrDotDot = withUnsafeBytes(of: item.pointee.d_name) { name in
                name[0] == dot && (name[1] == 0 || (name[1] == dot && name[2] == 0))
            }
            if !isDotOrDotDot { return false }
        }
        return true
    }

    private static func join(_ components: [[UInt8]]) -> [UInt8] {
        var joined: [UInt8] = []
        for component in components {
            if !joined.isEmpty { joined.append(slash) }
            joined.append(contentsOf: component)
        }
        return joined
    }

    private static func bytes(_ string: UnsafePointer<CChar>?) -> [UInt8]? {
        guard let string else { return nil }
        return Array(UnsafeRawBufferPointer(start: string, count: strlen(string)))
    }

    /// Calls a `*at` function with one path component. A component that is empty, `.`, `..` or
    /// holds a `/` never reaches the kernel (it fails with EINVAL): a second line of defence, since
    /// `O_NOFOLLOW` does not stop `..`.
    private static func withComponent(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> Int32) -> Int32 {
        let isDotOrDotDot = bytes.allSatisfy { $0 == dot } && bytes.count <= 2
        let isSafe = !bytes.isEmpty && !isDotOrDotDot && !bytes.contains(slash) && !bytes.contains(0)
        guard isSafe else {
            errno = EINVAL
            return -1
        }
        return Self.withCName(bytes, body)
    }

    private static func withCName<R>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        var terminated = bytes
        terminated.append(0)
        return terminated.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
    }
}
