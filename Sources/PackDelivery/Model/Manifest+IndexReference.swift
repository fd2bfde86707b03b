import Foundation

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
