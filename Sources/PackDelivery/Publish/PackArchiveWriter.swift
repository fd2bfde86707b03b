import CArchive
import Foundation

/// One libarchive writer into a temporary file beside the output. Not thread-safe.
struct PackArchiveWriter {
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
