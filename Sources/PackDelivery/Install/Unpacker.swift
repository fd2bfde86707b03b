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
    ///   - decryption: the archive is a preload pack's ciphertext (a tar, compressed or not), decrypted as it is read.
    /// - Returns: the bytes and entries written.
    /// - Throws: `PackDeliveryError` of kind `.badData` for an unsafe entry, a corrupt or truncated
    ///   archive, a file that is not an archive, or a limit exceeded; `.insufficientStorage` when the
    ///   filesystem is full (ENOSPC, EDQUOT); `.io` for other local failures; `.cancelled` when
    ///   `isCancelled` returned true. What was written so far stays in `staging`.
    static func unpack(
        archive: URL, into staging: URL, limits: UnpackLimits, listing: ZipDirectories.Listing? = nil,
        progress: (Int64) -> Void = { _ in }, isCancelled: @escaping () -> Bool = { false }, writer: any FileWriting = SystemFileWriter(),
        growing: GrowingFile? = nil, hashFiles: Bool = true, decryption: PreloadPack.Decryption? = nil
    ) throws(PackDeliveryError) -> UnpackSummary {
        var directory = listing
        if directory == nil, growing == nil, decryption == nil { directory = try ZipDirectories.listing(archive) }
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }
        let run = try UnpackRun(
            archive: archive, staging: staging, limits: limits, writer: writer, isCancelled: isCancelled, growing: growing,
            listing: directory, hashFiles: hashFiles, decryption: decryption)
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

let unpackNameMax = 255
let unpackPathMax = Int(PATH_MAX)
let unpackSlash = UInt8(ascii: "/")
let unpackDot = UInt8(ascii: ".")
