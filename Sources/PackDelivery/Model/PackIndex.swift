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
