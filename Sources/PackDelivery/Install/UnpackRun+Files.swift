import CArchive
import CLinux
import Foundation

// Files, links and the errors of one unpack (``UnpackRun``).
extension UnpackRun {
    // MARK: Files

    /// What the blocks of one file left behind: its logical end (holes included), the end of the last bytes written,
    /// how far the hash follows the bytes in order, and the digest ``UnpackRun/digests`` makes of them.
    struct WrittenFile {
        var fileEnd: Int64 = 0
        var dataEnd: Int64 = 0
        /// The hash covers [0, hashedEnd); holes hash as zeros.
        var hashedEnd: Int64 = 0
        /// Blocks arrived in order, so the hash needs no second read.
        var inOrder: Bool
        var digest: Int
    }

    func writeFile(
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
        var written = WrittenFile(inOrder: self.hashFiles, digest: self.hashFiles ? self.digests.begin() : 0)
        try self.writeBlocks(fd, into: &written, components, entry: entry, progress: progress)
        try self.record(fd, archiveEntry, written, key: key, components, entry: entry)
        try self.setModeAndTime(fd, archiveEntry, mode: mode, components, entry: entry)
        closed = true
        if close(fd) != 0 { throw self.failure("write", components, errno: errno, entry: entry) }
    }

    /// Writes the entry's data blocks at their offsets, charging each (and the hole it opens) to the byte limit
    /// before writing it, and hashing the blocks that arrive in order.
    private func writeBlocks(
        _ fd: Int32, into written: inout WrittenFile, _ components: [[UInt8]], entry: String, progress: (Int64) -> Void
    ) throws(PackDeliveryError) {
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
            let charge = Int64(size) + max(0, offset - written.fileEnd)
            if charge > self.maxBytes - self.bytes {
                throw PackDeliveryError.unpackLimitExceeded("bytes", limit: self.limits.maxBytes, entry: entry)
            }
            if size > 0, let buffer {
                try self.writeAll(fd, buffer, size, at: offset, components, entry: entry)
                written.dataEnd = max(written.dataEnd, end)
                if written.dataEnd - writebackStart >= Unpacker.writebackStep {
                    // Start writing this stretch out now, while the unpack goes on: the fsync before the rename
                    // then waits for the tail only. 1 GiB pack of 4 files on ext4: "installing" 1.9 → 0.4 s, the
                    // whole fetch 5.0 → 4.7 s (median of 3, file://); the disk, not the CPU, is then the limit.
                    _ = clinux_start_writeback(fd, writebackStart, written.dataEnd - writebackStart)
                    writebackStart = written.dataEnd
                }
                if written.inOrder, offset >= written.hashedEnd {
                    self.digests.addZeros(offset - written.hashedEnd)
                    self.digests.add(UnsafeRawBufferPointer(start: buffer, count: size))
                    written.hashedEnd = end
                } else {
                    written.inOrder = false
                }
            }
            written.fileEnd = max(written.fileEnd, end)
            self.bytes += charge
            if self.bytes - self.lastProgress >= Unpacker.progressInterval {
                self.lastProgress = self.bytes
                progress(self.bytes)
            }
        }
    }

    /// Gives the file its full size (a sparse file may end in a hole) and records its size and digest.
    private func record(
        _ fd: Int32, _ archiveEntry: OpaquePointer, _ written: WrittenFile, key: [UInt8], _ components: [[UInt8]], entry: String
    ) throws(PackDeliveryError) {
        var fileEnd = written.fileEnd
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
        if fileEnd > written.dataEnd, ftruncate(fd, off_t(fileEnd)) != 0 {
            throw self.failure("extend", components, errno: errno, entry: entry)
        }
        if self.streaming, self.zipEntries != nil, fileEnd < Int64(unpackPathMax) { self.zipSymlinkAllowance += fileEnd }
        if !self.hashFiles {
            // The pack's index gives the digest (IndexDigests), once the unpack's sizes are held to it.
            self.records[key] = (.file, fileEnd, "")
        } else if written.inOrder {
            self.digests.addZeros(fileEnd - written.hashedEnd)
            self.digests.end()
            self.records[key] = (.file, fileEnd, "")
            self.pendingDigests[key] = written.digest
        } else {
            // Blocks out of order (rare sparse layouts): hash what was written, once, here.
            let hasher = self.entryHasher
            hasher.reset()
            do throws(PackDeliveryError) { try hasher.update(fileDescriptor: fd, length: fileEnd) } catch {
                throw self.failure("read back", components, errno: Int32(error.underlying?.value ?? Int(EIO)), entry: entry)
            }
            self.records[key] = (.file, fileEnd, hasher.hexDigest())
        }
    }

    func setModeAndTime(_ fd: Int32, _ archiveEntry: OpaquePointer, mode: mode_t, _ components: [[UInt8]], entry: String)
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
    func adoptFile(
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

    func writeAll(_ fd: Int32, _ buffer: UnsafeRawPointer, _ size: Int, at offset: Int64, _ components: [[UInt8]], entry: String)
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

    func makeSymlink(_ components: [[UInt8]], key: [UInt8], target: [UInt8], entry: String) throws(PackDeliveryError) {
        if target.isEmpty { throw PackDeliveryError.unsafeEntry(entry, "it is a symlink with an empty target") }
        let shownTarget = String(decoding: target, as: UTF8.self)
        if target.first == unpackSlash {
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
        for part in target.split(separator: unpackSlash, omittingEmptySubsequences: true) {
            if part.count == 1, part.first == unpackDot { continue }
            passedThrough.append(Self.join(state))
            if part.count == 2, part.first == unpackDot, part.last == unpackDot {
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

    func link(_ components: [[UInt8]], key: [UInt8], to rawTarget: [UInt8], entry: String) throws(PackDeliveryError) {
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

    func cancelled() -> PackDeliveryError {
        PackDeliveryError(
            .cancelled, message: "Unpacking '\(self.archiveURL.lastPathComponent)' was cancelled.",
            subject: self.stagingPath)
    }

    func failure(_ operation: String, _ components: [[UInt8]], errno code: Int32, entry: String) -> PackDeliveryError {
        if code == ENAMETOOLONG {
            return PackDeliveryError.unsafeEntry(entry, "its name is too long for the filesystem")
        }
        let path = self.stagingPath + "/" + String(decoding: Self.join(components), as: UTF8.self)
        return Self.fileError(operation, path: path, errno: code, stagingPath: self.stagingPath)
    }

    static func fileError(_ operation: String, path: String, errno code: Int32, stagingPath: String) -> PackDeliveryError {
        if code == ENOSPC || code == EDQUOT {
            return PackDeliveryError.insufficientStorage(path: stagingPath, needed: nil, available: nil, errno: code)
        }
        return PackDeliveryError.io(operation, path: path, errno: code)
    }

    static func isEmptyDirectory(_ fd: Int32, path: String) throws(PackDeliveryError) -> Bool {
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
                name[0] == unpackDot && (name[1] == 0 || (name[1] == unpackDot && name[2] == 0))
            }
            if !isDotOrDotDot { return false }
        }
        return true
    }

    static func join(_ components: [[UInt8]]) -> [UInt8] {
        var joined: [UInt8] = []
        for component in components {
            if !joined.isEmpty { joined.append(unpackSlash) }
            joined.append(contentsOf: component)
        }
        return joined
    }

    static func bytes(_ string: UnsafePointer<CChar>?) -> [UInt8]? {
        guard let string else { return nil }
        return Array(UnsafeRawBufferPointer(start: string, count: strlen(string)))
    }

    /// Calls a `*at` function with one path component. A component that is empty, `.`, `..` or
    /// holds a `/` never reaches the kernel (it fails with EINVAL): a second line of defence, since
    /// `O_NOFOLLOW` does not stop `..`.
    static func withComponent(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> Int32) -> Int32 {
        let isDotOrDotDot = bytes.allSatisfy { $0 == unpackDot } && bytes.count <= 2
        let isSafe = !bytes.isEmpty && !isDotOrDotDot && !bytes.contains(unpackSlash) && !bytes.contains(0)
        guard isSafe else {
            errno = EINVAL
            return -1
        }
        return Self.withCName(bytes, body)
    }

    static func withCName<R>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        var terminated = bytes
        terminated.append(0)
        return terminated.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
    }
}
