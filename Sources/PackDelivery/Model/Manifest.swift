import Foundation

/// The catalog a content server publishes: products and their packs.
public struct Manifest: Sendable, Hashable, Codable {
    /// A product and the packs it delivers.
    public struct Product: Sendable, Hashable, Codable {
        /// The product's identifier, a reverse-DNS name like `com.example.forest`.
        public var productIdentifier: String
        /// The product's packs; a transaction gets one download per pack, in this order.
        public var contents: [Content]
        /// Creates a product.
        ///
        /// - Parameters:
        ///   - productIdentifier: the product's identifier.
        ///   - contents: the product's packs, in download order.
        public init(productIdentifier: String, contents: [Content]) {
            self.productIdentifier = productIdentifier
            self.contents = contents
        }
    }

    /// One pack of a product.
    public struct Content: Sendable, Hashable, Codable {
        /// The pack's identifier, also the name of the folder it installs into.
        public var contentIdentifier: String
        /// The pack's version; a pack whose version is already installed is not downloaded again unless forced.
        public var contentVersion: String
        /// The pack's URL: absolute, or relative to the manifest's URL.
        public var url: String
        /// The pack's size in bytes.
        public var contentLength: Int64
        /// The pack's SHA-256, as 64 hex digits.
        public var sha256: String
        /// The total size of the pack's regular files once unpacked, in bytes; nil when unknown.
        public var unpackedLength: Int64?
        /// Creates a pack entry.
        ///
        /// - Parameters:
        ///   - contentIdentifier: the pack's identifier.
        ///   - contentVersion: the pack's version.
        ///   - url: the pack's URL, absolute or relative to the manifest.
        ///   - contentLength: the pack's size in bytes.
        ///   - sha256: the pack's SHA-256 in hex.
        ///   - unpackedLength: the unpacked size in bytes, when known.
        public init(contentIdentifier: String, contentVersion: String, url: String, contentLength: Int64, sha256: String, unpackedLength: Int64? = nil) {
            self.contentIdentifier = contentIdentifier
            self.contentVersion = contentVersion
            self.url = url
            self.contentLength = contentLength
            self.sha256 = sha256
            self.unpackedLength = unpackedLength
        }
    }

    /// The products the server offers.
    public var products: [Product]

    /// Creates a manifest.
    ///
    /// - Parameter products: the products it lists.
    public init(products: [Product]) { self.products = products }

    /// The product with this identifier, or nil.
    ///
    /// - Parameter identifier: a product identifier.
    /// - Returns: the first product with that identifier, or nil when the manifest does not list it.
    public func product(_ identifier: String) -> Product? {
        self.products.first { $0.productIdentifier == identifier }
    }
}

/// A manifest together with the URL it was read from, so relative pack URLs resolve.
public struct LoadedManifest: Sendable {
    /// The decoded, checked manifest.
    public var manifest: Manifest
    /// The URL the manifest was read from; relative pack URLs resolve against it.
    public var baseURL: URL

    /// The absolute URL of a content's pack.
    ///
    /// - Parameter content: a pack of this manifest.
    /// - Returns: the pack's URL resolved against ``baseURL``.
    /// - Throws: ``PackDeliveryError`` of kind `badData` when the result is not an http(s) or file URL.
    public func packURL(for content: Manifest.Content) throws(PackDeliveryError) -> URL {
        guard let url = URL(string: content.url, relativeTo: self.baseURL)?.absoluteURL,
              let scheme = url.scheme?.lowercased(), ["http", "https", "file"].contains(scheme)
        else {
            throw PackDeliveryError(kind: .badData, message: "The manifest gives '\(content.url)' as the URL of \(content.contentIdentifier), which is not an http(s) or file URL.",
                                    hint: "Fix the manifest's url field.", subject: content.url)
        }
        return url
    }

    /// Decodes and checks a manifest's bytes.
    ///
    /// - Parameters:
    ///   - data: the manifest's JSON.
    ///   - baseURL: where the bytes came from, for relative pack URLs and error messages.
    /// - Returns: the manifest with its base URL.
    /// - Throws: ``PackDeliveryError`` of kind `badData` naming the location and the first problem.
    public static func decode(_ data: Data, from baseURL: URL) throws(PackDeliveryError) -> LoadedManifest {
        let manifest: Manifest
        do {
            manifest = try JSONDecoder().decode(Manifest.self, from: data)
        } catch {
            throw PackDeliveryError(kind: .badData, message: "The manifest at \(baseURL.absoluteString) is not valid manifest JSON: \(Self.describe(error)).",
                                    hint: "Check that the URL points at a manifest.json.", subject: baseURL.absoluteString)
        }
        for product in manifest.products {
            for content in product.contents {
                let problem: String? =
                    if content.contentLength < 0 { "a negative contentLength" }
                    else if content.sha256.count != 64 || !content.sha256.allSatisfy(\.isHexDigit) { "a sha256 that is not 64 hex digits" }
                    else if content.contentIdentifier.isEmpty || content.contentIdentifier.contains("/") || content.contentIdentifier.hasPrefix(".") { "an unusable contentIdentifier" }
                    else if (content.unpackedLength ?? 0) < 0 { "a negative unpackedLength" }
                    else { nil }
                if let problem {
                    throw PackDeliveryError(kind: .badData, message: "The manifest at \(baseURL.absoluteString) gives \(product.productIdentifier)/\(content.contentIdentifier) \(problem).",
                                            hint: "Fix the manifest (packs manifest DIR writes a correct one).", subject: baseURL.absoluteString)
                }
            }
            if product.productIdentifier.isEmpty || product.productIdentifier.contains("/") || product.productIdentifier.hasPrefix(".") {
                throw PackDeliveryError(kind: .badData, message: "The manifest at \(baseURL.absoluteString) has an unusable productIdentifier '\(product.productIdentifier)'.",
                                        hint: "Product identifiers are reverse-DNS names like com.example.forest.", subject: baseURL.absoluteString)
            }
        }
        return LoadedManifest(manifest: manifest, baseURL: baseURL)
    }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            return "missing field '\(key.stringValue)'\(Self.path(context))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            return "wrong type\(Self.path(context))"
        case DecodingError.dataCorrupted(let context):
            return context.codingPath.isEmpty ? "not JSON" : "bad value\(Self.path(context))"
        default:
            return "\(error)"
        }
    }

    private static func path(_ context: DecodingError.Context) -> String {
        let path = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        return path.isEmpty ? "" : " at \(path)"
    }
}

/// The `ContentInfo.plist` at the root of a pack in Apple's hosted-content layout.
public struct ContentInfo: Sendable, Hashable, Codable {
    /// The pack's content version (key `ContentVersion`).
    public var contentVersion: String
    /// The product the pack belongs to (key `IAPProductIdentifier`).
    public var productIdentifier: String

    enum CodingKeys: String, CodingKey {
        case contentVersion = "ContentVersion"
        case productIdentifier = "IAPProductIdentifier"
    }

    /// Creates a `ContentInfo`.
    ///
    /// - Parameters:
    ///   - contentVersion: the pack's content version.
    ///   - productIdentifier: the product the pack belongs to.
    public init(contentVersion: String, productIdentifier: String) {
        self.contentVersion = contentVersion
        self.productIdentifier = productIdentifier
    }
}
