import CArchive
import CLinux
import Foundation

// MARK: - One unpack

/// The state of one unpack: the libarchive reader, the staging folder's descriptor and what has been
/// created so far. Not thread-safe; lives for one `Unpacker.unpack` call.
final class UnpackRun {
    enum Node { case directory, file, symlink }

    /// What ``Unpacker/adopt(archive:listing:streamed:into:limits:isCancelled:)`` takes from a streamed unpack.
    struct Adoption {
        /// The streamed unpack's folder (it holds no symlinks: checked by the caller).
        let folderFD: Int32
        /// The entries' names as the streamed unpack read them, in order.
        let names: [[UInt8]]
        /// Its regular files, by path.
        let files: [String: InstalledFile]
    }

    let archiveURL: URL
    let stagingPath: String
    let limits: UnpackLimits
    let writer: any FileWriting
    let source: ArchiveReader
    var reader: OpaquePointer { self.source.reader }
    /// One hash context for symlinks and files written out of order, reset before each (an `EVP_MD_CTX` per
    /// file cost a malloc and free each).
    let entryHasher = SHA256Hasher()
    /// Regular files' digests, made on a queue beside this thread.
    let digests = FileDigests()
    /// Files whose digest ``digests`` makes: its id, by path (a hard link shares its target's).
    var pendingDigests: [[UInt8]: Int] = [:]
    /// Whether regular files are hashed as they are written (else the index gives their digests).
    let hashFiles: Bool
    /// The hard links made: the path of the file each links to, by path.
    var hardLinks: [[UInt8]: [UInt8]] = [:]
    let rootFD: Int32

    /// Every path created so far (components joined by `/`), including implicit folders.
    var nodes: [[UInt8]: Node] = [:]
    /// Size and SHA-256 of every file and symlink created, by path.
    var records: [[UInt8]: (kind: InstalledFile.Kind, size: Int64, sha256: String)] = [:]
    /// The CRC-32 of each zip entry by its name as stored, from the central directory; empty for other packs.
    let directoryCRCs: [[UInt8]: UInt32]
    /// The CRC-32 of the entries read, by path.
    var crcs: [[UInt8]: UInt32] = [:]
    /// Paths that some symlink's target passes through as a folder; no symlink may be created there.
    var traversedBySymlinks: Set<[UInt8]> = []
    /// The last parent folder opened, kept open because entries usually come folder by folder.
    var cachedDirectory: (path: [UInt8], fd: Int32)?

    var bytes: Int64 = 0
    var entries = 0
    var lastProgress: Int64 = 0
    var lastEntryName: String?
    /// The entries read so far, once the pack turned out to be a zip.
    var zipEntries: [ZipEntryRead]?
    /// What a streamed zip's files may add to the byte limit: up to a symlink target's worth each.
    var zipSymlinkAllowance: Int64 = 0
    let adoption: Adoption?
    /// The pack is read while it downloads.
    let streaming: Bool

    /// The most bytes of file contents. A zip read by its local headers cannot tell a symlink from a file (the
    /// target arrives as the file's bytes), so each file shorter than `PATH_MAX` adds its size (it may be a
    /// symlink), and the file being written a `PATH_MAX`; the central directory's pass (`Unpacker.adopt`) then
    /// holds its regular files to the limit itself.
    var maxBytes: Int64 {
        guard self.streaming, self.zipEntries != nil else { return self.limits.maxBytes }
        return self.limits.maxBytes + self.zipSymlinkAllowance + Int64(unpackPathMax)
    }

    init(
        archive: URL, staging: URL, limits: UnpackLimits, writer: any FileWriting, isCancelled: @escaping () -> Bool,
        growing: GrowingFile?, listing: ZipDirectories.Listing? = nil, adopting adoption: Adoption? = nil, hashFiles: Bool = true,
        decryption: PreloadPack.Decryption? = nil
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
            self.source = try ArchiveReader(
                archive, maxDecompressed: limits.maxBytes, isCancelled: isCancelled, growing: growing, decryption: decryption)
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

    var libarchiveMessage: String { self.source.message }

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

    func extract(_ entry: OpaquePointer, progress: (Int64) -> Void, isCancelled: () -> Bool) throws(PackDeliveryError) {
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
    func normalize(_ raw: [UInt8], entry: String) throws(PackDeliveryError) -> [[UInt8]] {
        if raw.isEmpty { throw PackDeliveryError.corruptArchive("entry \(self.entries) has an empty name") }
        var start = 0
        while raw.count - start >= 2, raw[start] == unpackDot, raw[start + 1] == unpackSlash { start += 2 }
        if start < raw.count, raw[start] == unpackSlash {
            throw PackDeliveryError.unsafeEntry(entry, "its path is absolute")
        }
        var components: [[UInt8]] = []
        var length = 0
        for part in raw[start...].split(separator: unpackSlash, omittingEmptySubsequences: true) {
            if part.count == 1, part.first == unpackDot { continue }
            if part.count == 2, part.first == unpackDot, part.last == unpackDot {
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

    func requireNew(_ key: [UInt8], entry: String) throws(PackDeliveryError) {
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

    func makeDirectory(_ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String) throws(PackDeliveryError) {
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
    func createDirectory(in parent: Int32, _ components: [[UInt8]], key: [UInt8], mode: mode_t, entry: String)
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
    func parentDirectory(_ components: [[UInt8]], entry: String) throws(PackDeliveryError) -> Int32 {
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
    func openDirectory(_ components: [[UInt8]], entry: String) throws(PackDeliveryError) -> Int32 {
        try self.walk(components, createMissing: false, entry: entry)
    }

    /// Opens `components` one by one from the staging folder with `O_NOFOLLOW | O_DIRECTORY`,
    /// refusing files and symlinks on the way. Returns an owned descriptor.
    func walk(_ components: [[UInt8]], createMissing: Bool, entry: String) throws(PackDeliveryError) -> Int32 {
        var fd = self.rootFD
        var prefix: [UInt8] = []
        for index in components.indices {
            let component = components[index]
            if !prefix.isEmpty { prefix.append(unpackSlash) }
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
}
