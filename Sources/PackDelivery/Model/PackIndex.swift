import Foundation

/// Where each file of a zip pack lies inside it (issue 17): the groundwork for delta updates, which fetch
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
