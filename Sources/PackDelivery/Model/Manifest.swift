import Foundation

/// The catalog a content server publishes: products and their packs.
public struct Manifest: Sendable, Hashable, Codable {
    public struct Product: Sendable, Hashable, Codable {
        public var productIdentifier: String
        public var contents: [Content]
        public init(productIdentifier: String, contents: [Content]) {
            self.productIdentifier = productIdentifier
            self.contents = contents
        }
    }

    /// One pack of a product.
    public struct Content: Sendable, Hashable, Codable {
        public var contentIdentifier: String
        public var contentVersion: String
        /// Absolute, or relative to the manifest's URL.
        public var url: String
        public var contentLength: Int64
        public var sha256: String
        public var unpackedLength: Int64?
        public init(contentIdentifier: String, contentVersion: String, url: String, contentLength: Int64, sha256: String, unpackedLength: Int64? = nil) {
            self.contentIdentifier = contentIdentifier
            self.contentVersion = contentVersion
            self.url = url
            self.contentLength = contentLength
            self.sha256 = sha256
            self.unpackedLength = unpackedLength
        }
    }

    public var products: [Product]

    public init(products: [Product]) { self.products = products }

    /// The product with this identifier, or nil.
    public func product(_ identifier: String) -> Product? {
        self.products.first { $0.productIdentifier == identifier }
    }
}

/// A manifest together with the URL it was read from, so relative pack URLs resolve.
public struct LoadedManifest: Sendable {
    public var manifest: Manifest
    public var baseURL: URL

    /// The absolute URL of a content's pack.
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
    public var contentVersion: String
    public var productIdentifier: String

    enum CodingKeys: String, CodingKey {
        case contentVersion = "ContentVersion"
        case productIdentifier = "IAPProductIdentifier"
    }

    public init(contentVersion: String, productIdentifier: String) {
        self.contentVersion = contentVersion
        self.productIdentifier = productIdentifier
    }
}
