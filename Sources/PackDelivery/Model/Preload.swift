import CCrypto
import Foundation

/// The key a preload pack is encrypted with: 32 bytes for AES-256-GCM.
///
/// Its bytes never appear in a description, an error or a log line: ``description`` shows only ``keyID``. Keep a key
/// only as long as it is needed.
public struct PreloadKey: Sendable, Hashable, CustomStringConvertible {
    /// The length of a key in bytes.
    public static let length = 32

    /// The key's bytes.
    let bytes: [UInt8]

    /// The key's public name: the first 32 hex digits of the SHA-256 of its bytes. A manifest names a preload's key
    /// by it, and a client asks the key server for `GET /keys/<keyID>`; it tells nothing about the key itself.
    public let keyID: String

    /// A key from its 32 bytes.
    ///
    /// - Parameter bytes: exactly ``length`` bytes.
    /// - Throws: `invalidArgument` for any other length.
    public init(bytes: some Collection<UInt8>) throws(PackDeliveryError) {
        guard bytes.count == Self.length else {
            throw PackDeliveryError(
                .invalidArgument, message: "A preload key is \(Self.length) bytes, not \(bytes.count).",
                hint: "A preload key is a file of exactly 32 random bytes.")
        }
        self.bytes = Array(bytes)
        let hasher = SHA256Hasher()
        self.bytes.withUnsafeBytes { hasher.update($0) }
        self.keyID = String(hasher.hexDigest().prefix(32))
    }

    /// A key read from a file that holds exactly its 32 bytes.
    ///
    /// - Parameter url: the key file.
    /// - Throws: `invalidArgument` when the file cannot be read or is not 32 bytes long (the error names the file,
    ///   never its bytes).
    public init(contentsOf url: URL) throws(PackDeliveryError) {
        let data: Data?
        do {
            data = try SmallFile.read(url.path, limit: 4096) { path in
                PackDeliveryError(.invalidArgument, message: "\(path) is too long for a preload key.", subject: path)
            }
        } catch {
            throw PackDeliveryError(
                .invalidArgument, message: "Cannot read the preload key \(PackDeliveryError.printable(url.path)).",
                subject: url.path)
        }
        guard let data, data.count == Self.length else {
            throw PackDeliveryError(
                .invalidArgument,
                message: "\(PackDeliveryError.printable(url.path)) is not a preload key: a key file holds exactly 32 bytes.",
                hint: "A preload key is a file of exactly 32 random bytes.", subject: url.path)
        }
        try self.init(bytes: data)
    }

    /// A new random key (from the system's cryptographically secure generator).
    public static func generate() -> PreloadKey {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<Self.length).map { _ in UInt8.random(in: 0...255, using: &generator) }
        // 32 bytes: cannot fail.
        return try! PreloadKey(bytes: bytes)
    }

    /// The key's bytes, to store in a key file or serve to a client holding a receipt.
    public var data: Data { Data(self.bytes) }

    /// `PreloadKey(<keyID>)`: never the key.
    public var description: String { "PreloadKey(\(self.keyID))" }

    /// Whether `text` reads as a key id: 1 to 64 lower-case hex digits (it goes into a URL path).
    public static func isKeyID(_ text: String) -> Bool {
        (1...64).contains(text.utf8.count) && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}

extension Manifest.Content {
    /// Marks a pack as a preload (`"preload"`): its bytes are encrypted (``PreloadPack``) with the key ``keyID``
    /// names, which the key server hands out from ``releases`` on.
    public struct Preload: Sendable, Hashable, Codable {
        /// The key's id (``PreloadKey/keyID``).
        public var keyID: String
        /// When the key is released: an ISO 8601 date and time (`2026-12-01T00:00:00Z`).
        public var releases: String

        /// Creates a preload mark.
        ///
        /// - Parameters:
        ///   - keyID: the key's id.
        ///   - releases: the release date, ISO 8601.
        public init(keyID: String, releases: String) {
            (self.keyID, self.releases) = (keyID, releases)
        }

        /// ``releases`` as a date, or nil when it does not read as ISO 8601.
        public var releaseDate: Date? { Self.date(self.releases) }

        /// An ISO 8601 date and time (`2026-12-01T00:00:00Z`, fractional seconds allowed), or nil.
        public static func date(_ text: String) -> Date? {
            if let date = try? Date.ISO8601FormatStyle().parse(text) { return date }
            return try? Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(text)
        }
    }
}
