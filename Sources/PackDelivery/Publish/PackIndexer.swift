import CArchive
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Indexes a pack by reading it (``PackIndex``, format 2), as far as its format allows: the packs `packs pack`
/// compresses with libarchive (zip, tar.bz2, tar.xz), and third-party packs `packs manifest` finds.
///
/// Every entry gets its path, kind, mode, size and SHA-256. A plain tar's files and a zip's stored entries are
/// cut into chunks that are ranges of the pack; a zip's deflated entry is one chunk, its compressed data. A
/// compressed tar written by another tool is one compressed stream, so its files get no chunks: a client fetches
/// such a pack whole.
enum PackIndexer {
    /// An index, and what it could not give.
    struct Result {
        var index: PackIndex
        /// One sentence per limit met (no chunks for a compressed tar, a zip entry compressed otherwise), naming
        /// the pack.
        var notes: [String]
    }

    /// Indexes the pack at `archive`.
    ///
    /// - Parameters:
    ///   - archive: a zip or a tar, compressed or not.
    ///   - chunker: the chunk sizes.
    /// - Throws: `corruptArchive` when the pack cannot be read; `unsafeEntry` for a zip whose two directories
    ///   disagree; `io` when the file cannot be read.
    static func index(_ archive: URL, chunker: Chunker = .standard) throws(PackDeliveryError) -> Result {
        let name = archive.lastPathComponent
        let listing = try ZipDirectories.listing(archive)
        if let listing { try ZipDirectories.check(listing) }
        let container = try listing != nil ? .zip : Self.tarContainer(archive)
        let pack = PackIndex.Pack(length: try Self.length(archive), sha256: try SHA256Hasher.hexDigest(ofFile: archive))
        // A plain tar's data areas are ranges of the file; a zip's stored entries are placed after reading.
        let rawTar = container == .tar
        var notes: [String] = []
        if container != .zip && !rawTar {
            notes.append(
                "\(name): a \(container.rawValue) compressed as one stream by another tool cannot be entered in the middle, so it is indexed by entry only (paths, modes, sizes, SHA-256), without chunks: clients fetch it whole. A pack written with one compressed frame per chunk (as PackWriter writes them) can be."
            )
        }

        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }
        let source = try ArchiveReader(archive, maxDecompressed: PackInspector.maxDecompressed)
        let reader = source.reader
        let stream = ChunkStream(chunker: chunker)
        let hasher = SHA256Hasher()
        let chunkHasher = SHA256Hasher()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 << 10, alignment: 16)
        defer { buffer.deallocate() }
        var entries: [PackIndex.Entry] = []
        var sparse = false
        var entry: OpaquePointer?
        while true {
            let status = archive_read_next_header(reader, &entry)
            if status == ARCHIVE_EOF { break }
            guard status == ARCHIVE_OK || status == ARCHIVE_WARN, let entry else { throw source.error(nil) }
            let path = PackInspector.normalized(
                (archive_entry_pathname_utf8(entry) ?? archive_entry_pathname(entry)).map { String(cString: $0) } ?? "")
            let mode = Int(archive_entry_mode(entry)) & 0xFFFF
            // The folder the pack was made from (`./`) is not an entry of the index.
            if path.isEmpty || path == "." { continue }
            switch UInt32(archive_entry_filetype(entry)) & 0o170000 {
            case 0o040000:
                entries.append(.init(path: path, kind: .directory, size: 0, sha256: nil, method: 0, offset: 0, length: 0, mode: mode))
            case 0o120000:
                let target = Array(
                    ((archive_entry_symlink_utf8(entry) ?? archive_entry_symlink(entry)).map { String(cString: $0) } ?? "").utf8)
                hasher.reset()
                target.withUnsafeBytes { hasher.update($0) }
                entries.append(
                    .init(
                        path: path, kind: .symlink, size: Int64(target.count), sha256: hasher.hexDigest(), method: 0, offset: 0,
                        length: 0, mode: mode, target: String(validating: target, as: UTF8.self)))
            default:
                let isSparse = archive_entry_sparse_count(entry) > 0
                sparse = sparse || isSparse
                let chunked = (rawTar && !isSparse) || container == .zip
                // Where the data starts: in a plain tar, the parser's position once the headers are read.
                let start = rawTar ? archive_filter_bytes(reader, 0) : 0
                entries.append(
                    try Self.file(
                        path, mode: mode, start: start, chunked: chunked, source: source, stream: stream,
                        hashers: (hasher, chunkHasher), buffer: buffer))
            }
        }
        if sparse { notes.append("\(name): its sparse files are indexed without chunks: their data is not one range of the tar.") }
        if let listing { entries = Self.placed(entries, in: listing, name: name, notes: &notes) }
        let chunking = entries.contains { $0.chunks?.isEmpty == false } ? PackIndex.Chunking(chunker) : nil
        return Result(index: PackIndex(container: container, pack: pack, chunking: chunking, entries: entries), notes: notes)
    }

    /// The index entry of the regular file whose header was just read: its size, SHA-256 and, when `chunked`, its
    /// chunks (each a range of the pack from `start`), read from its data.
    private static func file(
        _ path: String, mode: Int, start: Int64, chunked: Bool, source: ArchiveReader, stream: ChunkStream,
        hashers: (file: SHA256Hasher, chunk: SHA256Hasher), buffer: UnsafeMutableRawBufferPointer
    ) throws(PackDeliveryError) -> PackIndex.Entry {
        let (hasher, chunkHasher) = hashers
        hasher.reset()
        var size: Int64 = 0
        var chunks: [PackIndex.Chunk] = []
        func add(_ chunk: UnsafeRawBufferPointer) {
            chunkHasher.reset()
            chunkHasher.update(chunk)
            let offset = chunks.last.map { $0.offset + $0.length } ?? start
            chunks.append(
                .init(sha256: chunkHasher.hexDigest(), size: Int64(chunk.count), offset: offset, length: Int64(chunk.count), storage: .raw))
        }
        while true {
            let count = archive_read_data(source.reader, buffer.baseAddress, buffer.count)
            if count < 0 { throw source.error(path) }
            if count == 0 { break }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[..<count])
            hasher.update(bytes)
            stream.add(bytes, add)
            size += Int64(count)
        }
        stream.finish(add)
        return .init(
            path: path, kind: .file, size: size, sha256: hasher.hexDigest(), method: 0, offset: 0, length: 0,
            mode: mode == 0 ? 0o100644 : mode, chunks: chunked ? chunks : nil)
    }

    /// A zip's entries, in the order of its central directory, with their ranges: a stored entry's chunks moved
    /// to its data, a deflated entry made one chunk of its compressed data.
    private static func placed(
        _ read: [PackIndex.Entry], in listing: ZipDirectories.Listing, name: String, notes: inout [String]
    ) -> [PackIndex.Entry] {
        var byPath: [String: PackIndex.Entry] = [:]
        for entry in read { byPath[entry.path] = entry }
        let starts = listing.entries.map(\.localOffset).sorted()
        var others = 0
        let placed = listing.entries.compactMap { central -> PackIndex.Entry? in
            let path = PackInspector.normalized(String(decoding: central.name, as: UTF8.self))
            guard var entry = byPath[path] ?? byPath[String(path.drop { $0 == "/" })] else { return nil }
            let next = starts.first { $0 > central.localOffset } ?? listing.directoryOffset
            (entry.method, entry.offset, entry.length) = (Int(central.method), central.localOffset, next - central.localOffset)
            entry.mode = central.unixMode ?? entry.mode
            guard entry.kind == .file else { return entry }
            let encrypted = central.flags & 1 != 0
            if encrypted || central.compressedSize < 0 || central.dataOffset + central.compressedSize > next
                || (central.method == 0 && central.compressedSize != entry.size)
            {
                entry.chunks = nil
                others += 1
            } else if central.method == 0 {
                entry.chunks = entry.chunks?.map { chunk in
                    var moved = chunk
                    moved.offset = central.dataOffset + (chunk.offset)
                    return moved
                }
            } else if central.method == 8, let sha256 = entry.sha256, entry.size > 0 {
                entry.chunks = [
                    .init(
                        sha256: sha256, size: entry.size, offset: central.dataOffset, length: central.compressedSize,
                        storage: .deflatedZipEntry)
                ]
            } else {
                entry.chunks = entry.size == 0 ? [] : nil
                if entry.size > 0 { others += 1 }
            }
            return entry
        }
        if others > 0 {
            notes.append(
                "\(name): \(others) of its entries are neither stored nor deflated (or are encrypted): they are indexed without chunks.")
        }
        return placed
    }

    /// The tar's compression, by its first bytes.
    private static func tarContainer(_ archive: URL) throws(PackDeliveryError) -> PackIndex.Container {
        let fd = open(archive.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open the pack", path: archive.path, errno: errno) }
        defer { close(fd) }
        var magic = [UInt8](repeating: 0, count: 6)
        let count = magic.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        let head = Array(magic.prefix(max(0, count)))
        return if head.starts(with: [0x1F, 0x8B]) {
            .tarGzip
        } else if head.starts(with: [0x28, 0xB5, 0x2F, 0xFD]) {
            .tarZstd
        } else if head.starts(with: Array("BZh".utf8)) {
            .tarBzip2
        } else if head.starts(with: [0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00]) {
            .tarXz
        } else {
            .tar
        }
    }

    private static func length(_ archive: URL) throws(PackDeliveryError) -> Int64 {
        var info = stat()
        guard stat(archive.path, &info) == 0 else { throw .io("read the attributes of", path: archive.path, errno: errno) }
        return Int64(info.st_size)
    }

    /// Writes an index to `target` atomically (a temporary file beside it, flushed, renamed): its JSON, compressed
    /// with zstd (``PackIndex/compressed(_:)``), which every reader detects (``PackIndex/json(_:)``).
    ///
    /// - Returns: the manifest's reference to it, with its file name as URL, and the SHA-256 and length of the
    ///   compressed file: the bytes a client fetches and checks.
    @discardableResult
    static func write(_ index: PackIndex, to target: URL) throws(PackDeliveryError) -> Manifest.IndexReference {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            return try Self.write(json: try encoder.encode(index), to: target)
        } catch let error as PackDeliveryError {
            throw error
        } catch {
            throw PackDeliveryError(
                .fileSystem, message: "Cannot write \(target.path): \(error.localizedDescription).", subject: target.path)
        }
    }

    /// Writes an index's JSON to `target`, compressed, atomically.
    ///
    /// - Returns: the manifest's reference to it.
    static func write(json: Data, to target: URL) throws(PackDeliveryError) -> Manifest.IndexReference {
        let name = target.lastPathComponent
        do {
            guard let data = PackIndex.compressed(json) else {
                throw PackDeliveryError(.fileSystem, message: "zstd could not compress the index \(target.path).", subject: target.path)
            }
            try data.write(to: target, options: .atomic)
            return Manifest.IndexReference(
                url: name.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? name,
                sha256: try SHA256Hasher.hexDigest(ofFile: target), length: Int64(data.count))
        } catch let error as PackDeliveryError {
            throw error
        } catch {
            throw PackDeliveryError(
                .fileSystem, message: "Cannot write \(target.path): \(error.localizedDescription).", subject: target.path)
        }
    }
}
