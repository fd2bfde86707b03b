import Foundation

/// The metadata folder of a TUF client, and the repository it fetches from.
///
/// Metadata is stored as downloaded, byte for byte, under unversioned names (`root.json`, `timestamp.json`,
/// `snapshot.json`, `targets.json`, and a delegated role's name percent-encoded as Python's
/// `urllib.parse.quote(name, "")` does), each written to a temporary file that is synced and renamed over the old
/// one, then the folder synced: a power cut leaves the old file or the new one, never a mix.
struct TUFStorage: Sendable {
    let folder: URL
    let metadataURL: URL
    let options: TransferOptions

    /// python-tuf's default limits, in bytes, on a metadata file whose length nothing names.
    static let rootMaxLength = 512_000
    static let timestampMaxLength = 16_384
    static let snapshotMaxLength = 2_000_000
    static let targetsMaxLength = 5_000_000

    /// Python's `urllib.parse.quote(text, safe="")`: everything but letters, digits and `_.-~` percent-encoded.
    static func quote(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case 0x30...0x39, 0x41...0x5A, 0x61...0x7A, UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "-"), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }

    func localURL(_ role: String) -> URL { self.folder.appending(path: Self.quote(role) + ".json") }

    /// The stored copy of a role's metadata, or nil when there is none.
    func load(_ role: String) throws(PackDeliveryError) -> Data? {
        try SmallFile.read(self.localURL(role).path, limit: 64 << 20) { path in
            TUFRefusal.error(role, "the stored copy \(PackDeliveryError.printable(path)) is too large")
        }
    }

    /// Stores verified metadata atomically and durably.
    func store(_ data: Data, role: String) throws(PackDeliveryError) {
        try SmallFile.write(data, to: self.localURL(role))
    }

    /// Fetches `name` under the metadata URL, refusing more than `limit` bytes.
    /// A `file:` metadata URL is a folder of metadata files (an offline export's `tuf/metadata/`): `name` is read
    /// from it as is, and a missing file answers as a 404 would.
    func fetch(_ name: String, role: String, version: Int?, limit: Int) throws(PackDeliveryError) -> Data {
        if self.metadataURL.isFileURL {
            let path = self.metadataURL.path + (self.metadataURL.path.hasSuffix("/") ? "" : "/") + name
            let data = try SmallFile.read(path, limit: limit) { _ in
                TUFRefusal.error(role, version: version, "length exceeded: more than \(limit) bytes")
            }
            guard let data else {
                throw PackDeliveryError(
                    .httpStatus, message: "The TUF metadata file \(PackDeliveryError.printable(name)) is missing.", subject: role,
                    httpStatus: 404)
            }
            return data
        }
        guard let url = Self.url(self.metadataURL, appending: name) else {
            throw PackDeliveryError(.invalidArgument, message: "The metadata URL \(self.metadataURL.redacted) cannot name \(name).")
        }
        return try Self.fetch(url, role: role, version: version, limit: limit, options: self.options)
    }

    /// `base` with a percent-encoded relative path added to its path (after a `/`), its query kept: a signed URL's
    /// query string stays a query string.
    static func url(_ base: URL, appending encodedPath: String) -> URL? {
        guard var components = URLComponents(url: base, resolvingAgainstBaseURL: false) else { return nil }
        var path = components.percentEncodedPath
        if !path.hasSuffix("/") { path += "/" }
        components.percentEncodedPath = path + encodedPath
        return components.url
    }

    static func fetch(_ url: URL, role: String, version: Int?, limit: Int, options: TransferOptions) throws(PackDeliveryError) -> Data {
        do throws(PackDeliveryError) {
            return try Curl.fetch(url, options: options, maxBytes: limit)
        } catch  where error.code == .invalidManifest {
            // Curl.fetch's only invalidManifest: more bytes than the limit.
            throw TUFRefusal.error(role, version: version, "length exceeded: more than \(limit) bytes")
        }
    }
}
