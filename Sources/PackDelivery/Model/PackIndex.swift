import CCompression
import Foundation

/// Where each file of a pack lies inside it, and of what chunks it is made: the groundwork for delta updates
/// and repairs, which fetch only the chunks of a new version that are not on disk yet, with HTTP range requests.
///
/// `packs pack` writes one beside each pack it makes, as `<pack>.index.json`; `packs manifest` indexes any other
/// pack as far as its format allows. The manifest names it with its SHA-256 and length
/// (``Manifest/Content/index``), so the manifest of a large catalog stays small and a client reads an index only
/// when it needs it.
///
/// Format 1 (zip packs only) gives each entry's range in the zip. Format 2 gives every format's entries their
/// path, kind, mode, size and SHA-256, and each file its content-defined chunks (``Chunker``): each chunk's
/// SHA-256 and length uncompressed, and the range of the pack that holds its bytes, stored as ``Storage`` says.
/// Format 3 adds ``Storage/zstdFrameSlice``: small files share a zstd frame, and each of their chunks is a slice of
/// the frame's decompressed bytes (``Chunk/frameSize``, ``Chunk/frameOffset``); several chunks then give the same
/// range. `packs pack` writes format 3 only for a pack that has such chunks; format 2 is read as before.
public struct PackIndex: Sendable, Hashable, Codable {
    /// The archive format of the pack an index describes.
    public enum Container: String, Sendable, Hashable, Codable, CaseIterable {
        case zip, tar
        case tarGzip = "tar.gz"
        case tarZstd = "tar.zst"
        case tarBzip2 = "tar.bz2"
        case tarXz = "tar.xz"
    }

    /// How a chunk's bytes are stored in the pack.
    public enum Storage: String, Sendable, Hashable, Codable {
        /// As they are: a range of a plain tar's data area, or of a stored zip entry's data.
        case raw
        /// One zstd frame, which decompresses to exactly the chunk.
        case zstdFrame = "zstd-frame"
        /// One gzip member, which decompresses to exactly the chunk.
        case gzipMember = "gzip-member"
        /// The whole compressed data of a deflated zip entry (the chunk is the whole file).
        case deflatedZipEntry = "deflated-zip-entry"
        /// A slice of one zstd frame shared with other chunks (format 3): the frame decompresses to exactly
        /// ``Chunk/frameSize`` bytes, of which the chunk is bytes ``Chunk/frameOffset`` ..< `frameOffset + size`.
        case zstdFrameSlice = "zstd-frame-slice"
    }

    /// One content-defined piece of a file.
    public struct Chunk: Sendable, Hashable, Codable {
        /// SHA-256 of the chunk's uncompressed bytes, hex.
        public var sha256: String
        /// The chunk's length uncompressed.
        public var size: Int64
        /// Where its stored bytes start in the pack.
        public var offset: Int64
        /// The length of its stored bytes in the pack.
        public var length: Int64
        public var storage: Storage
        /// For a ``Storage/zstdFrameSlice``: the length of its frame decompressed; nil for every other storage.
        public var frameSize: Int64? = nil
        /// For a ``Storage/zstdFrameSlice``: where the chunk's bytes start in its frame decompressed; nil for every
        /// other storage.
        public var frameOffset: Int64? = nil

        /// Creates a chunk.
        public init(sha256: String, size: Int64, offset: Int64, length: Int64, storage: Storage) {
            (self.sha256, self.size, self.offset, self.length, self.storage) = (sha256, size, offset, length, storage)
        }

        /// Creates a slice of a shared zstd frame (``Storage/zstdFrameSlice``).
        ///
        /// - Parameters:
        ///   - sha256: SHA-256 of the chunk's bytes, hex.
        ///   - size: the chunk's length.
        ///   - offset: where the frame starts in the pack.
        ///   - length: the frame's length in the pack.
        ///   - frameSize: the frame's length decompressed.
        ///   - frameOffset: where the chunk's bytes start in the frame decompressed.
        public init(sha256: String, size: Int64, offset: Int64, length: Int64, frameSize: Int64, frameOffset: Int64) {
            (self.sha256, self.size, self.offset, self.length, self.storage) = (sha256, size, offset, length, .zstdFrameSlice)
            (self.frameSize, self.frameOffset) = (frameSize, frameOffset)
        }
    }

    /// The pack an index describes.
    public struct Pack: Sendable, Hashable, Codable {
        /// The pack's length in bytes: every range of the index lies inside it.
        public var length: Int64
        /// The pack's SHA-256, hex.
        public var sha256: String

        /// Creates a description.
        public init(length: Int64, sha256: String) {
            (self.length, self.sha256) = (length, sha256)
        }
    }

    /// The sizes the files were chunked with (``Chunker``), which a client cuts its installed files with to find
    /// the chunks it has.
    public struct Chunking: Sendable, Hashable, Codable {
        /// `fastcdc`: FastCDC with normalized chunking and ``Chunker``'s gear table.
        public var algorithm: String
        public var minimum: Int
        public var average: Int
        public var maximum: Int
        /// The normalization level (``Chunker/normalization``); absent in indexes written before it was recorded,
        /// which were all cut at level 2 (``Chunker/unrecordedNormalization``).
        public var normalization: Int? = nil

        /// The record of a chunker's sizes.
        public init(_ chunker: Chunker) {
            (self.algorithm, self.minimum, self.average, self.maximum) = ("fastcdc", chunker.minimum, chunker.average, chunker.maximum)
            self.normalization = chunker.normalization
        }

        /// The record of sizes as an index gives them, whether or not a chunker uses them.
        init(algorithm: String, minimum: Int, average: Int, maximum: Int, normalization: Int?) {
            (self.algorithm, self.minimum, self.average, self.maximum) = (algorithm, minimum, average, maximum)
            self.normalization = normalization
        }

        /// The chunker these sizes describe; nil when no chunker uses them.
        public var chunker: Chunker? {
            guard self.algorithm == "fastcdc" else { return nil }
            return Chunker(
                minimum: self.minimum, average: self.average, maximum: self.maximum,
                normalization: self.normalization ?? Chunker.unrecordedNormalization)
        }
    }

    /// One entry of the pack, in the pack's order (for a zip: that of its central directory).
    public struct Entry: Sendable, Hashable, Codable {
        /// What the entry is.
        public enum Kind: String, Sendable, Hashable, Codable {
            case file, directory, symlink
        }
        /// The path inside the pack, `/`-separated (a leading `./` dropped).
        public var path: String
        public var kind: Kind
        /// Bytes once uncompressed (a symlink's: its target text).
        public var size: Int64
        /// SHA-256 of the uncompressed bytes (a symlink's target text), hex; nil for a directory.
        public var sha256: String?
        /// The zip compression method: 0 stored, 8 deflate, …; 0 in a tar pack's index.
        public var method: Int
        /// Where the entry's local header starts in a zip pack; 0 in a tar pack's index.
        public var offset: Int64
        /// Bytes from `offset` to the next entry of a zip pack: the local header, the data and any data descriptor;
        /// 0 in a tar pack's index (which has no such range: its files are found by their chunks).
        public var length: Int64
        /// The unix mode (type and permissions), as a zip's central directory or a tar header gives it; in format 1
        /// only when the zip entry was made on unix. A delta update needs it: a local header does not say that an
        /// entry is a symlink or executable.
        public var mode: Int? = nil
        /// The file's chunks, in order; nil when the pack's format does not let them be fetched apart (a
        /// third-party tar.zst of one frame), and always in format 1. Their sizes add up to `size`.
        public var chunks: [Chunk]? = nil
        /// A symlink's target text (format 2, when it is UTF-8), so that a chunked delta update can make the link;
        /// its SHA-256 is the entry's.
        public var target: String? = nil

        /// Creates an entry.
        public init(
            path: String, kind: Kind, size: Int64, sha256: String?, method: Int, offset: Int64, length: Int64, mode: Int? = nil,
            chunks: [Chunk]? = nil, target: String? = nil
        ) {
            (self.path, self.kind, self.size, self.sha256, self.method, self.offset, self.length, self.mode, self.chunks) =
                (path, kind, size, sha256, method, offset, length, mode, chunks)
            self.target = target
        }

        private enum CodingKeys: String, CodingKey {
            case path, kind, size, sha256, method, offset, length, mode, chunks, target
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            self.path = try container.decode(String.self, forKey: .path)
            self.kind = try container.decode(Kind.self, forKey: .kind)
            self.size = try container.decode(Int64.self, forKey: .size)
            self.sha256 = try container.decodeIfPresent(String.self, forKey: .sha256)
            // A tar pack's entries have no zip range: absent, read as 0.
            self.method = try container.decodeIfPresent(Int.self, forKey: .method) ?? 0
            self.offset = try container.decodeIfPresent(Int64.self, forKey: .offset) ?? 0
            self.length = try container.decodeIfPresent(Int64.self, forKey: .length) ?? 0
            self.mode = try container.decodeIfPresent(Int.self, forKey: .mode)
            self.chunks = try container.decodeIfPresent([Chunk].self, forKey: .chunks)
            self.target = try container.decodeIfPresent(String.self, forKey: .target)
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(self.path, forKey: .path)
            try container.encode(self.kind, forKey: .kind)
            try container.encode(self.size, forKey: .size)
            try container.encodeIfPresent(self.sha256, forKey: .sha256)
            // A zip entry's range is at least its 30-byte local header; a tar entry has none.
            if self.length > 0 {
                try container.encode(self.method, forKey: .method)
                try container.encode(self.offset, forKey: .offset)
                try container.encode(self.length, forKey: .length)
            }
            try container.encodeIfPresent(self.mode, forKey: .mode)
            try container.encodeIfPresent(self.chunks, forKey: .chunks)
            try container.encodeIfPresent(self.target, forKey: .target)
        }
    }

    /// The version of this format: 1 (zip entries only), 2 (every format, with chunks) or 3 (as 2, with slices of
    /// shared zstd frames).
    public var format: Int = 1
    /// The pack's format: always `zip` in format 1.
    public var container: Container = .zip
    /// The pack's length and SHA-256 (format 2).
    public var pack: Pack? = nil
    /// The sizes the chunks were cut with (format 2, when any file has chunks).
    public var chunking: Chunking? = nil
    public var entries: [Entry]

    /// Creates an index of format 1 (a zip's entries).
    ///
    /// - Parameter entries: the pack's entries.
    public init(entries: [Entry]) {
        self.entries = entries
    }

    /// Creates an index of format 2.
    ///
    /// - Parameters:
    ///   - container: the pack's format.
    ///   - pack: the pack's length and SHA-256.
    ///   - chunking: the chunker's sizes, when files have chunks.
    ///   - entries: the pack's entries.
    public init(container: Container, pack: Pack, chunking: Chunking?, entries: [Entry]) {
        (self.format, self.container, self.pack, self.chunking, self.entries) = (2, container, pack, chunking, entries)
    }

    private enum CodingKeys: String, CodingKey {
        case format, container, pack, chunking, entries
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.format = try container.decode(Int.self, forKey: .format)
        self.container = try container.decodeIfPresent(Container.self, forKey: .container) ?? .zip
        self.pack = try container.decodeIfPresent(Pack.self, forKey: .pack)
        self.chunking = try container.decodeIfPresent(Chunking.self, forKey: .chunking)
        self.entries = try container.decode([Entry].self, forKey: .entries)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.format, forKey: .format)
        if self.format >= 2 {
            try container.encode(self.container, forKey: .container)
            try container.encodeIfPresent(self.pack, forKey: .pack)
            try container.encodeIfPresent(self.chunking, forKey: .chunking)
        }
        try container.encode(self.entries, forKey: .entries)
    }
}

extension PackIndex {
    /// The largest index read: as large as a manifest may be. The manifest gives an index's length, so a larger
    /// one is refused before it is fetched.
    static let maxBytes: Int64 = 64 << 20

    /// The most chunks an index may list (a 64 MiB index holds fewer than this).
    static let maxChunks = 1 << 20

    /// The largest chunk but a whole deflated zip entry: 64 MiB, as ``Chunker`` allows.
    static let maxChunkSize: Int64 = 64 << 20

    /// Decodes and checks an index's bytes, as a delta update reads them: every reader of an index calls this.
    ///
    /// The bytes are the index file as served: JSON, or JSON compressed with zstd (as `packs pack` writes it since
    /// the index was compressed), told apart by zstd's magic number. Compressed, they are decoded into at most
    /// ``maxBytes`` (``json(_:)``). Its JSON objects are counted before anything is built, so an index of more than `maxEntries` entries (or
    /// more than ``maxChunks`` chunks) is refused in constant memory. Every number is then range-checked where it
    /// is decoded: sizes, offsets and lengths between 0 and 2^50 (a zip entry's length at least a local header's 30
    /// bytes), a method and a mode of 16 bits (as a zip stores them), a SHA-256 of 64 hex digits for every entry
    /// but a folder, and a path of at most 65,535 bytes (a zip's name field), relative, without NUL, `.` or `..`.
    /// In formats 2 and 3 every range lies inside the pack, no two chunks' ranges overlap (but slices of one shared
    /// frame, format 3, which give the same range and frame size), a slice lies inside its frame, a file's chunks add
    /// up to its size, and each chunk is stored as the pack's format allows.
    /// - Parameters:
    ///   - file: the index file's bytes, JSON or zstd-compressed JSON.
    ///   - maxEntries: the most entries accepted.
    ///   - containers: the pack formats the reader can use; by default zip only (what zip delta updates read).
    /// - Throws: `DeltaRefusal` (`indexUnusable`) saying what is wrong, naming the entry.
    static func decode(_ file: consuming Data, maxEntries: Int, containers: Set<Container> = [.zip]) throws(DeltaRefusal) -> PackIndex {
        guard file.count <= Self.maxBytes else {
            throw DeltaRefusal(.indexUnusable, "the pack's index is \(file.count) bytes, more than the \(Self.maxBytes) an index may have")
        }
        let data = try Self.json(file)
        // The file's bytes are let go before the JSON is decoded (when its caller gave them up): compressed, they are
        // 1 MB of a 1 GiB pack's index, held at the decoding's peak.
        _ = consume file
        // One object per entry, in the root's array; then the root, `pack`, `chunking` and the chunks.
        let counts = Self.objectCount(data, entriesAfter: maxEntries, totalAfter: maxEntries + Self.maxChunks + 3)
        guard counts.shallow <= maxEntries else {
            throw DeltaRefusal(.indexUnusable, "the pack's index lists more than \(maxEntries) entries, more than a pack may hold")
        }
        guard counts.total <= maxEntries + Self.maxChunks + 3 else {
            throw DeltaRefusal(.indexUnusable, "the pack's index lists more than \(Self.maxChunks) chunks, more than an index may hold")
        }
        // Read in one pass when written plainly (as `packs pack` writes it); any other JSON as before.
        guard let index = Self.plainlyDecoded(data) ?? (try? JSONDecoder().decode(PackIndex.self, from: data)) else {
            throw DeltaRefusal(.indexUnusable, "the pack's index cannot be read")
        }
        guard (1...3).contains(index.format) else {
            throw DeltaRefusal(.indexUnusable, "the pack's index has format \(index.format), not 1, 2 or 3")
        }
        guard containers.contains(index.container) else {
            throw DeltaRefusal(
                .indexUnusable, "the pack's index describes a \(index.container.rawValue) pack, which this reader cannot use")
        }
        if let problem = index.format >= 2 ? Self.packProblem(index) : nil {
            throw DeltaRefusal(.indexUnusable, "the pack's index \(problem)")
        }
        var paths = Set<String>()
        var ranges: [ChunkRange] = []
        for entry in index.entries {
            let zipRange = index.container == .zip
            if let problem = Self.problem(entry, zipRange: zipRange)
                ?? (index.format >= 2 ? Self.problemV2(entry, in: index, ranges: &ranges) : nil)
            {
                throw DeltaRefusal(.indexUnusable, "the pack's index gives \(PackDeliveryError.printable(entry.path)) \(problem)")
            }
            if index.format >= 2, !paths.insert(entry.path).inserted {
                throw DeltaRefusal(.indexUnusable, "the pack's index lists \(PackDeliveryError.printable(entry.path)) twice")
            }
        }
        if let (before, after) = Self.overlap(&ranges) {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index gives two chunks overlapping ranges (bytes \(before.offset)+\(before.length) and \(after.offset)+\(after.length))"
            )
        }
        return index
    }

    /// The range of the pack a chunk is stored in; `frameSize` for a slice of a shared frame, else nil.
    struct ChunkRange: Hashable {
        var offset: Int64
        var length: Int64
        var frameSize: Int64?
    }

    /// Two ranges of `ranges` (sorted here by offset) that overlap, or nil: identical ranges overlap only when
    /// both are slices of the same frame (the same decompressed size); every other overlap is refused.
    static func overlap(_ ranges: inout [ChunkRange]) -> (ChunkRange, ChunkRange)? {
        ranges.sort { ($0.offset, $0.length) < ($1.offset, $1.length) }
        for (before, after) in zip(ranges, ranges.dropFirst()) where before.offset + before.length > after.offset {
            if before == after, before.frameSize != nil { continue }
            return (before, after)
        }
        return nil
    }

    /// The first bytes of a zstd frame (RFC 8878), little-endian 0xFD2FB528.
    static let zstdMagic: [UInt8] = [0x28, 0xB5, 0x2F, 0xFD]

    /// The zstd level indexes are compressed with: its optimal parser takes 16 % more off an index's JSON than
    /// level 9 (the SHA-256s' hex digits are most of it), and a publisher compresses an index once.
    static let compressionLevel: Int32 = 19

    /// An index file's JSON: the bytes as they are, or, when they start with zstd's magic number, decompressed.
    ///
    /// Decompression is capped at ``maxBytes``: frames that claim more (in their headers) are refused before
    /// anything is decoded, and frames that do not say how much they hold are decoded into at most that much
    /// (memory that is only touched as it is written), refused once they would produce more. One frame or several
    /// are read, and nothing may follow them.
    /// - Parameter file: the index file's bytes (at most ``maxBytes``, as ``decode(_:maxEntries:containers:)`` checks).
    /// - Throws: `DeltaRefusal` (`indexUnusable`) when the frames cannot be decoded or hold more than ``maxBytes``.
    static func json(_ file: Data) throws(DeltaRefusal) -> Data {
        guard file.starts(with: Self.zstdMagic) else { return file }
        let claims = file.withUnsafeBytes { Self.frameClaims($0) }
        guard let claims else { throw DeltaRefusal(.indexUnusable, "the pack's index is not whole zstd frames") }
        if let claimed = claims, claimed > UInt64(Self.maxBytes) {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index claims to decompress to \(claimed) bytes, more than the \(Self.maxBytes) an index may have")
        }
        let capacity = claims.map { Int($0) } ?? Int(Self.maxBytes)
        // Not zeroed: pages that are never written are never touched.
        let output = UnsafeMutableRawBufferPointer.allocate(byteCount: max(capacity, 1), alignment: 16)
        var handedOver = false
        defer { if !handedOver { output.deallocate() } }
        let result = file.withUnsafeBytes { ZSTD_decompress(output.baseAddress, capacity, $0.baseAddress, $0.count) }
        if ZSTD_isError(result) == 0, claims != nil, let base = output.baseAddress {
            // The frames said how much they hold: the JSON is returned in place, not copied (3.5 MB for a 1 GiB pack's
            // index, held while it is decoded).
            handedOver = true
            return Data(bytesNoCopy: base, count: result, deallocator: .custom { pointer, _ in pointer.deallocate() })
        }
        guard ZSTD_isError(result) == 0 else {
            guard ZSTD_getErrorCode(result) == ZSTD_error_dstSize_tooSmall else {
                throw DeltaRefusal(
                    .indexUnusable, "the pack's index cannot be decompressed (zstd: \(String(cString: ZSTD_getErrorName(result))))")
            }
            throw DeltaRefusal(
                .indexUnusable,
                claims == nil
                    ? "the pack's index decompresses to more than the \(Self.maxBytes) bytes an index may have"
                    : "the pack's index decompresses to more than the \(capacity) bytes its zstd frames claim")
        }
        return Data(UnsafeRawBufferPointer(rebasing: output[..<result]))
    }

    /// The bytes zstd frames claim to hold, from their headers, added up: nil when they are not whole frames;
    /// `.some(nil)` when a frame does not say.
    private static func frameClaims(_ input: UnsafeRawBufferPointer) -> UInt64?? {
        var (start, total, known) = (0, UInt64(0), true)
        while start < input.count {
            let frame = UnsafeRawBufferPointer(rebasing: input[start...])
            let length = ZSTD_findFrameCompressedSize(frame.baseAddress, frame.count)
            let size = ZSTD_getFrameContentSize(frame.baseAddress, frame.count)
            guard ZSTD_isError(length) == 0, length > 0, size != ZSTD_CONTENTSIZE_ERROR else { return nil }
            if size == ZSTD_CONTENTSIZE_UNKNOWN {
                known = false
            } else {
                // Saturates: a claim past 2^63 is refused all the same.
                total = min(total &+ min(size, UInt64(Int64.max)), UInt64(Int64.max))
            }
            start += length
        }
        return .some(known ? total : nil)
    }

    /// An index's JSON, compressed as `packs pack` writes index files: one zstd frame that gives its size.
    ///
    /// - Parameter json: the JSON.
    /// - Returns: the frame, or nil when zstd fails (it does not, but for memory).
    static func compressed(_ json: Data) -> Data? {
        let bound = ZSTD_compressBound(json.count)
        var out = Data(count: bound)
        let count = out.withUnsafeMutableBytes { output in
            json.withUnsafeBytes { ZSTD_compress(output.baseAddress, bound, $0.baseAddress, $0.count, Self.compressionLevel) }
        }
        guard ZSTD_isError(count) == 0 else { return nil }
        out.count = count
        return out
    }

    /// What is wrong in a format 2 index as a whole, or nil.
    private static func packProblem(_ index: PackIndex) -> String? {
        guard let pack = index.pack else { return "does not give the pack's length and SHA-256" }
        if !(0...LoadedManifest.maxSize).contains(pack.length) { return "gives the pack a length of \(pack.length), outside 0…2^50 bytes" }
        if !Self.isDigest(pack.sha256) { return "gives the pack a sha256 that is not 64 hex digits" }
        if let chunking = index.chunking, chunking.chunker == nil {
            return
                "gives chunk sizes no chunker uses (\(chunking.minimum), \(chunking.average), \(chunking.maximum), normalization \(chunking.normalization.map(String.init) ?? "absent"))"
        }
        return nil
    }

    /// What is out of range in an entry, in either format, or nil.
    ///
    /// - Parameters:
    ///   - entry: the entry.
    ///   - zipRange: whether the entry has a zip entry's range (format 1, or a zip pack's format 2 index), or none.
    static func problem(_ entry: Entry, zipRange: Bool = true) -> String? {
        let sizes = 0...LoadedManifest.maxSize
        return if entry.path.isEmpty || entry.path.utf8.count > 0xFFFF || entry.path.utf8.contains(0) {
            "a path that no zip entry can have"
        } else if entry.path.hasPrefix("/") || entry.path.split(separator: "/", omittingEmptySubsequences: false).contains("..") {
            "a path that leaves the pack's folder"
        } else if !sizes.contains(entry.size) {
            "a size of \(entry.size), outside 0…2^50 bytes"
        } else if zipRange, !sizes.contains(entry.offset) {
            "an offset of \(entry.offset), outside 0…2^50"
        } else if zipRange, !(30...LoadedManifest.maxSize).contains(entry.length) {
            "a length of \(entry.length), outside 30…2^50 bytes"
        } else if zipRange, !(0...0xFFFF).contains(entry.method) {
            "a method of \(entry.method), outside 0…65535"
        } else if !zipRange, entry.offset != 0 || entry.length != 0 || entry.method != 0 {
            "a zip entry's range in a pack that is not a zip"
        } else if let mode = entry.mode, !(0...0xFFFF).contains(mode) {
            "a mode of \(mode), outside 0…0o177777"
        } else if let sha256 = entry.sha256, !Self.isDigest(sha256) {
            "a sha256 that is not 64 hex digits"
        } else if entry.kind != .directory, entry.sha256 == nil {
            "no SHA-256"
        } else {
            nil
        }
    }

    /// What format 2 requires of an entry and its chunks beyond ``problem(_:zipRange:)``, or nil; adds the chunks'
    /// ranges to `ranges`.
    private static func problemV2(_ entry: Entry, in index: PackIndex, ranges: inout [ChunkRange]) -> String? {
        let packLength = index.pack?.length ?? 0
        guard let mode = entry.mode else { return "no mode" }
        let type = mode & 0o170000
        let wanted =
            switch entry.kind {
            case .file: 0o100000
            case .directory: 0o040000
            case .symlink: 0o120000
            }
        if type != wanted { return "a mode of 0o\(String(mode, radix: 8)), which is not a \(entry.kind.rawValue)'s" }
        if entry.path.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0.isEmpty || $0 == "." }) {
            return "a path with an empty or `.` part"
        }
        if let target = entry.target {
            let hasher = SHA256Hasher()
            Array(target.utf8).withUnsafeBytes { hasher.update($0) }
            if entry.kind != .symlink {
                return "a symlink's target, but it is not a symlink"
            } else if Int64(target.utf8.count) != entry.size || hasher.hexDigest() != entry.sha256?.lowercased() {
                return "a symlink target that does not match its size and SHA-256"
            }
        }
        if index.container == .zip, entry.offset + entry.length > packLength {
            return "a range (bytes \(entry.offset)+\(entry.length)) that ends after the pack's \(packLength) bytes"
        }
        guard let chunks = entry.chunks else { return nil }
        if entry.kind != .file, !chunks.isEmpty { return "chunks, but it is not a file" }
        var total: Int64 = 0
        // Once per entry, not per chunk (an array made 25,000 times for a 1 GiB pack).
        let storages: [Storage] =
            switch index.container {
            case .tar: [.raw]
            case .tarZstd: index.format >= 3 ? [.zstdFrame, .zstdFrameSlice] : [.zstdFrame]
            case .tarGzip: [.gzipMember]
            case .zip: entry.method == 0 ? [.raw] : [.deflatedZipEntry]
            case .tarBzip2, .tarXz: []
            }
        for chunk in chunks {
            let maxSize = chunk.storage == .deflatedZipEntry ? LoadedManifest.maxSize : Self.maxChunkSize
            if !storages.contains(chunk.storage) {
                return "a chunk stored as \(chunk.storage.rawValue), which a \(index.container.rawValue) pack cannot hold"
            } else if !Self.isDigest(chunk.sha256) {
                return "a chunk whose sha256 is not 64 hex digits"
            } else if !(1...maxSize).contains(chunk.size) {
                return "a chunk of \(chunk.size) bytes, outside 1…\(maxSize)"
            } else if !(0...LoadedManifest.maxSize).contains(chunk.offset) || !(1...LoadedManifest.maxSize).contains(chunk.length)
                || chunk.offset + chunk.length > packLength
            {
                return "a chunk at bytes \(chunk.offset)+\(chunk.length), outside the pack's \(packLength) bytes"
            } else if let problem = Self.sliceProblem(chunk) {
                return problem
            } else if chunk.storage == .raw, chunk.length != chunk.size {
                return "a chunk stored raw in \(chunk.length) bytes that holds \(chunk.size)"
            } else if chunk.storage == .deflatedZipEntry, chunks.count != 1 {
                return "a deflated zip entry cut into \(chunks.count) chunks"
            } else if index.container == .zip, chunk.offset < entry.offset || chunk.offset + chunk.length > entry.offset + entry.length {
                return "a chunk at bytes \(chunk.offset)+\(chunk.length), outside its zip entry"
            }
            total += chunk.size
            if total > entry.size { break }
            ranges.append(ChunkRange(offset: chunk.offset, length: chunk.length, frameSize: chunk.frameSize))
        }
        if total != entry.size {
            return "chunks that hold \(total > entry.size ? "more" : "fewer") bytes than its size of \(entry.size)"
        }
        return nil
    }

    /// What is wrong in a chunk's frame fields, or nil: a slice gives a frame of 1…``maxChunkSize`` bytes
    /// decompressed and lies inside it; any other chunk gives no frame fields.
    private static func sliceProblem(_ chunk: Chunk) -> String? {
        guard chunk.storage == .zstdFrameSlice else {
            return chunk.frameSize != nil || chunk.frameOffset != nil
                ? "a chunk stored as \(chunk.storage.rawValue) with a frame slice's fields" : nil
        }
        guard let frameSize = chunk.frameSize, let frameOffset = chunk.frameOffset else {
            return "a frame slice without its frame's size and offset"
        }
        if !(1...Self.maxChunkSize).contains(frameSize) {
            return "a frame slice whose frame decompresses to \(frameSize) bytes, outside 1…\(Self.maxChunkSize)"
        } else if frameOffset < 0 || frameOffset > frameSize - chunk.size {
            return "a frame slice at bytes \(frameOffset)+\(chunk.size), outside its frame's \(frameSize) bytes"
        }
        return nil
    }

    static func isDigest(_ text: String) -> Bool {
        // Over the string's bytes in place when it has them (a native string does), with a test of two comparisons
        // per byte: 25,000 chunk digests of a 1 GiB pack's index took 58 million instructions through the UTF-8 view.
        text.utf8.withContiguousStorageIfAvailable { $0.count == 64 && $0.allSatisfy(Self.isHexDigit) }
            ?? (text.utf8.count == 64 && text.utf8.allSatisfy(Self.isHexDigit))
    }

    /// Whether `byte` is an ASCII hex digit (as ``LoadedManifest/isASCIIHexDigit(_:)``): 0-9, or a-f in either case
    /// (setting the bit 0x20 lowers A-F and leaves no other byte in a-f).
    @inline(__always)
    private static func isHexDigit(_ byte: UInt8) -> Bool {
        byte &- UInt8(ascii: "0") < 10 || (byte | 0x20) &- UInt8(ascii: "a") < 6
    }

    /// The number of JSON objects in `data` (its `{` outside strings), counted without parsing, up to one more
    /// than `limit`.
    static func objectCount(_ data: Data, stoppingAfter limit: Int) -> Int {
        Self.objectCount(data, entriesAfter: limit, totalAfter: limit).total
    }

    /// The number of JSON objects in `data` (its `{` outside strings) that are elements of the root's arrays (an
    /// index's entries), and of all, counted without parsing; the count stops at one more than either limit.
    static func objectCount(_ data: Data, entriesAfter shallowLimit: Int, totalAfter totalLimit: Int) -> (shallow: Int, total: Int) {
        data.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) -> (shallow: Int, total: Int) in
            var (shallow, total, depth) = (0, 0, 0)
            var at = 0
            while at < bytes.count {
                let byte = bytes[at]
                at += 1
                if byte == UInt8(ascii: "\"") {
                    // A string ends at the first quote after an even run of backslashes (each pair one escaped
                    // backslash), found with memchr: most of an index's bytes are its strings' (the digests).
                    at = Self.stringEnd(bytes, after: at)
                } else if byte == UInt8(ascii: "{") {
                    total += 1
                    if depth == 2 { shallow += 1 }
                    depth += 1
                    if total > totalLimit || shallow > shallowLimit { break }
                } else if byte == UInt8(ascii: "[") {
                    depth += 1
                } else if byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") {
                    depth -= 1
                }
            }
            return (shallow, total)
        }
    }

    /// Where the bytes after a string's closing quote start, for a string whose bytes start at `start`; the end of
    /// `bytes` when the string is not closed.
    private static func stringEnd(_ bytes: UnsafeRawBufferPointer, after start: Int) -> Int {
        guard let base = bytes.baseAddress else { return bytes.count }
        var at = start
        while at < bytes.count, let found = memchr(base + at, Int32(UInt8(ascii: "\"")), bytes.count - at) {
            let quote = base.distance(to: UnsafeRawPointer(found))
            var backslashes = 0
            while quote - backslashes - 1 >= start, bytes[quote - backslashes - 1] == UInt8(ascii: "\\") { backslashes += 1 }
            if backslashes % 2 == 0 { return quote + 1 }
            at = quote + 1
        }
        return bytes.count
    }
}

extension Manifest {
    /// Where a pack's ``PackIndex`` is, and how to know it is the right one.
    public struct IndexReference: Sendable, Hashable, Codable {
        /// The index's URL: absolute, or relative to the manifest's URL.
        public var url: String
        /// The index file's SHA-256, hex.
        public var sha256: String
        /// The index file's length in bytes.
        public var length: Int64

        /// Creates a reference.
        ///
        /// - Parameters:
        ///   - url: the index's URL.
        ///   - sha256: its SHA-256.
        ///   - length: its length.
        public init(url: String, sha256: String, length: Int64) {
            self.url = url
            self.sha256 = sha256
            self.length = length
        }
    }
}
