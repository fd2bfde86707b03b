import Foundation

/// Where each file of a zip pack lies inside it: the groundwork for delta updates, which fetch
/// only the files of a new version that changed, with HTTP range requests.
///
/// `packs manifest` writes one beside each zip pack, as `<pack>.index.json`, and the manifest names it with
/// its SHA-256 and length (``Manifest/Content/index``), so the manifest of a large catalog stays small and a
/// client reads an index only when it needs it. Tar packs have no index: a tar has no directory, and a
/// compressed tar cannot be entered in the middle.
public struct PackIndex: Sendable, Hashable, Codable {
    /// One entry of the zip, in the order of its central directory.
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
        /// The zip compression method: 0 stored, 8 deflate, …
        public var method: Int
        /// Where the entry's local header starts in the pack.
        public var offset: Int64
        /// Bytes from `offset` to the next entry: the local header, the data and any data descriptor.
        public var length: Int64
        /// The unix mode (type and permissions) from the central directory, when the entry was made on unix.
        /// A delta update needs it: a local header does not say that an entry is a symlink or executable.
        public var mode: Int? = nil

        /// Creates an entry.
        public init(path: String, kind: Kind, size: Int64, sha256: String?, method: Int, offset: Int64, length: Int64, mode: Int? = nil) {
            (self.path, self.kind, self.size, self.sha256, self.method, self.offset, self.length, self.mode) =
                (path, kind, size, sha256, method, offset, length, mode)
        }
    }

    /// The version of this format: 1.
    public var format: Int = 1
    public var entries: [Entry]

    /// Creates an index.
    ///
    /// - Parameter entries: the pack's entries.
    public init(entries: [Entry]) {
        self.entries = entries
    }
}

extension PackIndex {
    /// The largest index read: as large as a manifest may be. The manifest gives an index's length, so a larger
    /// one is refused before it is fetched.
    static let maxBytes: Int64 = 64 << 20

    /// Decodes and checks an index's bytes, as a delta update reads them.
    ///
    /// Its JSON objects are counted before anything is built, so an index of more than `maxEntries` entries is
    /// refused in constant memory. Every number is then range-checked where it is decoded: sizes, offsets and
    /// lengths between 0 and 2^50 (a length of at least a local header's 30 bytes), a method and a mode of 16
    /// bits (as a zip stores them), a SHA-256 of 64 hex digits for every entry but a folder, and a path of at most
    /// 65,535 bytes (a zip's name field) without NUL.
    /// - Throws: `DeltaRefusal` (`indexUnusable`) saying what is wrong, naming the entry.
    static func decode(_ data: Data, maxEntries: Int) throws(DeltaRefusal) -> PackIndex {
        guard data.count <= Self.maxBytes else {
            throw DeltaRefusal(.indexUnusable, "the pack's index is \(data.count) bytes, more than the \(Self.maxBytes) an index may have")
        }
        // The root object, and one per entry.
        guard Self.objectCount(data, stoppingAfter: maxEntries + 1) <= maxEntries + 1 else {
            throw DeltaRefusal(.indexUnusable, "the pack's index lists more than \(maxEntries) entries, more than a pack may hold")
        }
        guard let index = try? JSONDecoder().decode(PackIndex.self, from: data) else {
            throw DeltaRefusal(.indexUnusable, "the pack's index cannot be read")
        }
        guard index.format == 1 else {
            throw DeltaRefusal(.indexUnusable, "the pack's index has format \(index.format), not 1")
        }
        for entry in index.entries {
            if let problem = Self.problem(entry) {
                throw DeltaRefusal(.indexUnusable, "the pack's index gives \(PackDeliveryError.printable(entry.path)) \(problem)")
            }
        }
        return index
    }

    /// What is out of range in an entry, or nil.
    static func problem(_ entry: Entry) -> String? {
        let sizes = 0...LoadedManifest.maxSize
        return if entry.path.isEmpty || entry.path.utf8.count > 0xFFFF || entry.path.utf8.contains(0) {
            "a path that no zip entry can have"
        } else if !sizes.contains(entry.size) {
            "a size of \(entry.size), outside 0…2^50 bytes"
        } else if !sizes.contains(entry.offset) {
            "an offset of \(entry.offset), outside 0…2^50"
        } else if !(30...LoadedManifest.maxSize).contains(entry.length) {
            "a length of \(entry.length), outside 30…2^50 bytes"
        } else if !(0...0xFFFF).contains(entry.method) {
            "a method of \(entry.method), outside 0…65535"
        } else if let mode = entry.mode, !(0...0xFFFF).contains(mode) {
            "a mode of \(mode), outside 0…0o177777"
        } else if let sha256 = entry.sha256, sha256.utf8.count != 64 || !sha256.utf8.allSatisfy(LoadedManifest.isASCIIHexDigit) {
            "a sha256 that is not 64 hex digits"
        } else if entry.kind != .directory, entry.sha256 == nil {
            "no SHA-256"
        } else {
            nil
        }
    }

    /// The number of JSON objects in `data` (its `{` outside strings), counted without parsing, up to one more
    /// than `limit`.
    static func objectCount(_ data: Data, stoppingAfter limit: Int) -> Int {
        data.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) -> Int in
            var count = 0
            var inString = false
            var escaped = false
            for byte in bytes {
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = true
                    } else if byte == UInt8(ascii: "\"") {
                        inString = false
                    }
                } else if byte == UInt8(ascii: "\"") {
                    inString = true
                } else if byte == UInt8(ascii: "{") {
                    count += 1
                    if count > limit { break }
                }
            }
            return count
        }
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
