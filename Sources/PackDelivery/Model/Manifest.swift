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
        /// Where the pack's ``PackIndex`` is, for a zip pack indexed by `packs manifest`; nil otherwise.
        public var index: IndexReference? = nil
        /// How much the pack is worth keeping in the caches (`"preservationPriority"`): when space is needed, packs
        /// with the lowest go first, then the least recently used. Nil (absent) counts as 0.
        public var preservationPriority: Int? = nil
        /// More places the same pack (the same bytes) is served from, tried after ``url`` in this order: absolute, or
        /// relative (resolved, like ``url``, against each of the manifest's ``Manifest/mirrors`` and then its own URL).
        /// Nil for none.
        public var urls: [String]? = nil
        /// When the pack is delivered (`"delivery"`): nil, as in a manifest that says nothing, is essential.
        public var delivery: DeliveryPolicy? = nil
        /// ``delivery``, essential when the manifest says nothing.
        public var deliveryPolicy: DeliveryPolicy { self.delivery ?? .essential }
        /// Marks the pack as a preload (`"preload"`): its bytes are encrypted, and it installs once its key is released.
        /// Nil for a plain pack.
        public var preload: Preload? = nil
        /// Creates a pack entry.
        ///
        /// - Parameters:
        ///   - contentIdentifier: the pack's identifier.
        ///   - contentVersion: the pack's version.
        ///   - url: the pack's URL, absolute or relative to the manifest.
        ///   - contentLength: the pack's size in bytes.
        ///   - sha256: the pack's SHA-256 in hex.
        ///   - unpackedLength: the unpacked size in bytes, when known.
        public init(
            contentIdentifier: String, contentVersion: String, url: String, contentLength: Int64, sha256: String,
            unpackedLength: Int64? = nil
        ) {
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
    /// A signed manifest's version, one more with each publication of its ``scope``: a client that trusts the
    /// publisher refuses a lower one than it last accepted in that scope (a rollback to old content), and the
    /// same one unless its bytes are those it accepted. Nil in an unsigned manifest.
    public var version: Int?
    /// When a signed manifest stops being valid (ISO 8601, UTC), so an old one cannot be replayed for ever.
    public var expires: String?
    /// What a signed manifest's ``version`` counts: the publisher numbers the manifests of each scope on their
    /// own (one per product, one per catalog), and a client keeps a rollback mark per publisher and scope.
    /// Nil in an unsigned manifest, and in one signed before scopes (those share one mark per publisher).
    public var scope: String?
    /// Base URLs that relative pack and index URLs resolve against, in this order, before the manifest's own URL:
    /// a pack is fetched from the first that works, and a transfer that fails at one continues from the kept bytes at
    /// the next. Covered by the signature like every other byte of the manifest. Nil for none (relative URLs then
    /// resolve against the manifest's URL only).
    public var mirrors: [String]? = nil
    /// Whether credentials (a receipt, a credential provider's headers) go to every source of a pack. Nil or false:
    /// only to sources of the same origin (scheme, host and port) as the manifest, so a third-party mirror never sees them.
    public var credentialsToAllSources: Bool? = nil

    /// Creates a manifest.
    ///
    /// - Parameters:
    ///   - products: the products it lists.
    ///   - version: its version, for a signed manifest.
    ///   - expires: when it expires (ISO 8601), for a signed manifest.
    ///   - scope: what its version counts, for a signed manifest.
    public init(products: [Product], version: Int? = nil, expires: String? = nil, scope: String? = nil) {
        self.products = products
        self.version = version
        self.expires = expires
        self.scope = scope
    }

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
    /// The ``PublisherKey/id`` whose signature was checked, when it was loaded trusting publishers.
    public var signedBy: String? = nil
    /// The ``TrustedRepository/id`` of the TUF repository whose targets metadata vouched for it and for each of its
    /// packs, when it was loaded with trusted repositories.
    public var tufRepository: String? = nil
    /// The SHA-256 (hex) of the bytes it was decoded from; nil for one built in memory. A signed manifest's
    /// rollback mark keeps it, so the same version is accepted again only with the same bytes.
    public var sha256: String? = nil
    /// Where the manifest was read from (by ``load(_:options:)-79u4c``); `nil` for one built in memory.
    ///
    /// A transaction added from it records this URL: when a pack's URL stops working (401 or 403 after the
    /// credentials were renewed, 404, 410 — a presigned URL that expired, a pack moved), the queue reads the
    /// manifest again from here and continues from the kept bytes at the pack's new URL, provided its SHA-256
    /// and length are unchanged.
    public var source: URL? = nil

    /// A manifest built in memory (a backend that hands out per-purchase URLs), checked as a decoded one is.
    ///
    /// - Parameters:
    ///   - manifest: the products and packs.
    ///   - baseURL: what relative pack URLs resolve against, and where the manifest "came from" (a `file://` URL
    ///     allows `file://` packs; an http(s) one only http(s) packs).
    /// - Throws: `invalidManifest` naming the first problem (see ``decode(_:from:)``).
    public init(manifest: Manifest, baseURL: URL) throws(PackDeliveryError) {
        try Self.check(manifest, place: baseURL.redacted)
        self.manifest = manifest
        self.baseURL = baseURL
    }

    /// What relative URLs resolve against, in order: each mirror (as a folder), then the manifest's own URL (unless it
    /// is a local file and mirrors are listed).
    var bases: [URL] {
        var bases: [URL] = []
        for mirror in self.manifest.mirrors ?? [] {
            // A mirror is a folder: `…/packs` and `…/packs/` are the same (a query or fragment is not part of a mirror).
            if let url = URL(string: mirror.hasSuffix("/") ? mirror : mirror + "/") { bases.append(url) }
        }
        // A local manifest that lists mirrors names where its packs are served: its own folder is not one of them.
        if bases.isEmpty || !self.baseURL.isFileURL { bases.append(self.baseURL) }
        return bases
    }

    /// The schemes a pack or index URL may have: http(s), and `file` for a local manifest's.
    private var allowedSchemes: Set<String> { self.baseURL.isFileURL ? ["http", "https", "file"] : ["http", "https"] }

    /// Every URL a text from the manifest names: itself when absolute, else resolved against each base in order; only
    /// the export's copy of it when the manifest was read from an export that holds one (``OfflineExport``).
    private func resolve(_ text: String) -> [URL] {
        if let copy = self.exportedCopy(text) { return [copy] }
        if let url = URL(string: text), url.scheme != nil { return [url.absoluteURL] }
        return self.bases.compactMap { URL(string: text, relativeTo: $0)?.absoluteURL }
    }

    /// A content's index reference with its URL made absolute, or nil when it has none or names a scheme that
    /// is not allowed (a pack without a usable index is simply never updated by delta). A relative index URL resolves
    /// against the first base; a pack fetched from another source fetches it from there (see ``Download/sources``).
    func resolvedIndex(for content: Manifest.Content) -> Manifest.IndexReference? {
        guard var reference = content.index, let url = self.resolve(reference.url).first,
            let scheme = url.scheme?.lowercased(), self.allowedSchemes.contains(scheme)
        else { return nil }
        reference.url = url.absoluteString
        return reference
    }

    /// The absolute URL of a content's pack: the first of ``packURLs(for:)``.
    ///
    /// A manifest read over http(s) may only name http(s) packs; a local manifest may also name `file://` packs.
    /// - Parameter content: a pack of this manifest.
    /// - Returns: the pack's URL resolved against the first mirror, or ``baseURL`` when there is none.
    /// - Throws: ``PackDeliveryError`` with code `unsupportedURL` when the result's scheme is not allowed.
    public func packURL(for content: Manifest.Content) throws(PackDeliveryError) -> URL {
        try self.packURLs(for: content)[0]
    }

    /// Every place a content's pack is fetched from, in the order they are tried: its `url`, then each of its `urls`,
    /// each relative one resolved against every mirror in order and then against ``baseURL``; without repeats.
    ///
    /// - Parameter content: a pack of this manifest.
    /// - Returns: at least one URL.
    /// - Throws: ``PackDeliveryError`` with code `unsupportedURL` when one of them has a scheme that is not allowed.
    public func packURLs(for content: Manifest.Content) throws(PackDeliveryError) -> [URL] {
        var urls: [URL] = []
        var seen: Set<String> = []
        for text in [content.url] + (content.urls ?? []) {
            let resolved = self.resolve(text)
            for url in resolved {
                guard let scheme = url.scheme?.lowercased(), self.allowedSchemes.contains(scheme) else {
                    let which =
                        self.baseURL.isFileURL
                        ? "an http(s) or file URL" : "an http(s) URL (a manifest from a server may not name local files)"
                    throw PackDeliveryError(
                        .unsupportedURL,
                        message:
                            "The manifest gives '\(PackDeliveryError.printable(Self.redact(text)))' as a URL of \(PackDeliveryError.printable(content.contentIdentifier)), which is not \(which).",
                        hint: "Fix the manifest's url, urls or mirrors fields.", subject: Self.redact(text))
                }
                if seen.insert(url.absoluteString).inserted { urls.append(url) }
            }
            if resolved.isEmpty {
                throw PackDeliveryError(
                    .unsupportedURL,
                    message:
                        "The manifest gives '\(PackDeliveryError.printable(Self.redact(text)))' as a URL of \(PackDeliveryError.printable(content.contentIdentifier)), which is not a URL.",
                    hint: "Fix the manifest's url or urls fields.", subject: Self.redact(text))
            }
        }
        return urls
    }

    /// Decodes and checks a manifest's bytes.
    ///
    /// A `scope`, when given, must be 1 to 255 bytes without control characters. Every size (an index's length too)
    /// must lie between 0 and 2^50 bytes, every SHA-256 must be 64 ASCII hex digits, identifiers
    /// may not hold control characters, `/`, a leading `.` or more than 255 bytes, no two products share an
    /// identifier, and no two packs share a content identifier.
    /// - Parameters:
    ///   - data: the manifest's JSON.
    ///   - baseURL: where the bytes came from, for relative pack URLs and error messages.
    /// - Returns: the manifest with its base URL.
    /// - Throws: ``PackDeliveryError`` with code `invalidManifest`, naming the location and the first problem.
    public static func decode(_ data: Data, from baseURL: URL) throws(PackDeliveryError) -> LoadedManifest {
        let manifest: Manifest
        let place = baseURL.redacted
        do {
            manifest = try JSONDecoder().decode(Manifest.self, from: data)
        } catch {
            throw PackDeliveryError(
                .invalidManifest, message: "The manifest at \(place) cannot be read: \(Self.describe(error, data: data)).",
                hint: "Check that the URL points at a manifest.json.", subject: place)
        }
        var loaded = try LoadedManifest(manifest: manifest, baseURL: baseURL)
        let hasher = SHA256Hasher()
        data.withUnsafeBytes { hasher.update($0) }
        loaded.sha256 = hasher.hexDigest()
        return loaded
    }

    /// The checks every manifest passes, decoded or built in memory.
    /// What is wrong with one pack's entry of a manifest, as a phrase ("a contentLength of -1, outside 0…2^50 bytes"),
    /// or nil.
    private static func problem(of content: Manifest.Content) -> String? {
        if let problem = Self.identifierProblem(content.contentIdentifier) {
            "an unusable contentIdentifier: \(problem)"
        } else if Self.reservedNames.contains(content.contentIdentifier.lowercased()) {
            "a contentIdentifier that names a file PackDelivery keeps beside installed content"
        } else if !(0...Self.maxSize).contains(content.contentLength) {
            "a contentLength of \(content.contentLength), outside 0…2^50 bytes"
        } else if let unpacked = content.unpackedLength, !(0...Self.maxSize).contains(unpacked) {
            "an unpackedLength of \(unpacked), outside 0…2^50 bytes"
        } else if content.sha256.utf8.count != 64 || !content.sha256.utf8.allSatisfy(Self.isASCIIHexDigit) {
            "a sha256 that is not 64 hex digits (0-9, a-f)"
        } else if let problem = Self.textProblem(content.contentVersion, maxBytes: 255) {
            "a contentVersion with \(problem)"
        } else if let problem = Self.textProblem(content.url, maxBytes: 8192) {
            "a url with \(problem)"
        } else if let index = content.index, !(0...Self.maxSize).contains(index.length) {
            "an index length of \(index.length), outside 0…2^50 bytes"
        } else if let index = content.index,
            index.sha256.utf8.count != 64 || !index.sha256.utf8.allSatisfy(Self.isASCIIHexDigit)
        {
            "an index sha256 that is not 64 hex digits (0-9, a-f)"
        } else if let index = content.index, let problem = Self.textProblem(index.url, maxBytes: 8192) {
            "an index url with \(problem)"
        } else if let preload = content.preload, !PreloadKey.isKeyID(preload.keyID) {
            "a preload keyID that is not 1 to 64 hex digits (0-9, a-f)"
        } else if let preload = content.preload, preload.releaseDate == nil {
            "a preload releases date that is not ISO 8601"
        } else if let urls = content.urls, urls.count > Self.maxSources {
            "\(urls.count) urls, more than \(Self.maxSources)"
        } else if let problem = content.urls?.lazy.compactMap({ Self.textProblem($0, maxBytes: 8192) }).first {
            "a url in urls with \(problem)"
        } else {
            nil
        }
    }

    private static func check(_ manifest: Manifest, place: String) throws(PackDeliveryError) {
        if let scope = manifest.scope,
            let problem = scope.isEmpty ? "an empty scope" : Self.textProblem(scope, maxBytes: 255).map({ "a scope with \($0)" })
        {
            throw PackDeliveryError(
                .invalidManifest, message: "The manifest at \(place) has \(problem).",
                hint: "A scope names what the manifest's version counts, such as its product; sign it again.", subject: place)
        }
        if let mirrors = manifest.mirrors {
            if mirrors.count > Self.maxSources {
                throw PackDeliveryError(
                    .invalidManifest, message: "The manifest at \(place) lists \(mirrors.count) mirrors, more than \(Self.maxSources).",
                    hint: "List at most \(Self.maxSources) mirrors.", subject: place)
            }
            for mirror in mirrors {
                let problem: String? =
                    if let problem = Self.textProblem(mirror, maxBytes: 8192) {
                        "a mirror with \(problem)"
                    } else if let url = URL(string: mirror), let scheme = url.scheme?.lowercased(), url.host != nil || scheme == "file",
                        ["http", "https", "file"].contains(scheme)
                    {
                        nil
                    } else {
                        "a mirror '\(PackDeliveryError.printable(Self.redact(mirror)))' that is not an absolute http(s) URL"
                    }
                if let problem {
                    throw PackDeliveryError(
                        .invalidManifest, message: "The manifest at \(place) has \(problem).", hint: "Fix the manifest's mirrors.",
                        subject: place)
                }
            }
        }
        var products: Set<String> = []
        var contents: [String: String] = [:]
        for product in manifest.products {
            let productID = PackDeliveryError.printable(product.productIdentifier)
            if let problem = Self.identifierProblem(product.productIdentifier) {
                throw PackDeliveryError(
                    .invalidManifest, message: "The manifest at \(place) has an unusable productIdentifier '\(productID)': \(problem).",
                    hint: "Product identifiers are reverse-DNS names like com.example.forest.", subject: place)
            }
            guard products.insert(product.productIdentifier).inserted else {
                throw PackDeliveryError(
                    .invalidManifest, message: "The manifest at \(place) lists the product \(productID) twice.", subject: place)
            }
            for content in product.contents {
                let contentID = PackDeliveryError.printable(content.contentIdentifier)
                let problem = Self.problem(of: content)
                if let problem {
                    throw PackDeliveryError(
                        .invalidManifest, message: "The manifest at \(place) gives \(productID)/\(contentID) \(problem).",
                        hint: "Fix the manifest.", subject: place)
                }
                if let other = contents.updateValue(product.productIdentifier, forKey: content.contentIdentifier) {
                    throw PackDeliveryError(
                        .invalidManifest,
                        message:
                            "The manifest at \(place) gives the contentIdentifier \(contentID) to two packs (of \(PackDeliveryError.printable(other)) and \(productID)).",
                        hint: "Every pack needs a contentIdentifier of its own: it names the folder it installs into.", subject: place)
                }
            }
        }
    }

    /// The most mirrors a manifest, and the most `urls` a pack, may list.
    static let maxSources = 16

    /// The largest size a manifest may give (1 PiB): sums of a few such sizes never overflow `Int64`.
    static let maxSize: Int64 = 1 << 50
    /// Names the home keeps beside installed content (compared in lowercase).
    static let reservedNames: Set<String> = [
        "cachedir.tag", "packdelivery", "state.sqlite", "state.sqlite-wal", "state.sqlite-shm",
        "state.reserve", "state.sqlite.open-lock", "locks",
    ]

    static func isASCIIHexDigit(_ byte: UInt8) -> Bool {
        (0x30...0x39).contains(byte) || (0x41...0x46).contains(byte) || (0x61...0x66).contains(byte)
    }

    /// Why an identifier cannot name a folder, or nil.
    static func identifierProblem(_ identifier: String) -> String? {
        if identifier.isEmpty { return "it is empty" }
        if let problem = Self.textProblem(identifier, maxBytes: 255) { return "it has \(problem)" }
        if identifier.contains("/") { return "it holds a '/'" }
        if identifier.hasPrefix(".") { return "it starts with '.'" }
        return nil
    }

    /// Why a text from the manifest cannot be shown or used as is (control characters, too long), or nil.
    static func textProblem(_ text: String, maxBytes: Int) -> String? {
        if text.utf8.count > maxBytes { return "more than \(maxBytes) bytes" }
        if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control || $0 == "\u{2028}" || $0 == "\u{2029}" }) {
            return "control characters (such as ESC, CR, LF, TAB or DEL)"
        }
        return nil
    }

    /// A URL from the manifest without its query string or user info, for messages.
    static func redact(_ url: String) -> String {
        URL(string: url).map(\.redacted) ?? String(url.prefix { $0 != "?" && $0 != "@" })
    }

    /// Says what is wrong without calling valid JSON "not JSON". JSONDecoder's own errors say little (often
    /// only "not valid JSON", without a path), so the bytes are parsed again and the structure walked.
    private static func describe(_ error: any Error, data: Data) -> String {
        let parsed: Any
        do {
            parsed = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        } catch {
            let detail = ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String) ?? ""
            if detail.contains("not representable") {
                return "it holds a number too large to represent (\(PackDeliveryError.printable(String(detail.prefix(80)))))"
            }
            if detail.lowercased().contains("nested") { return "it nests arrays or objects too deeply (more than 512 levels)" }
            return "it is not JSON" + (detail.isEmpty ? "" : " (\(PackDeliveryError.printable(String(detail.prefix(120)))))")
        }
        if let problem = Self.firstProblem(in: parsed) { return problem }
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            return "the field '\(key.stringValue)' is missing\(Self.path(context))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context),
            DecodingError.dataCorrupted(let context):
            return "a value\(Self.path(context)) does not fit a manifest"
        default:
            return "it does not fit a manifest"
        }
    }

    /// The first place where parsed JSON differs from a manifest's shape, or nil.
    static func firstProblem(in json: Any) -> String? {
        guard let root = json as? [String: Any] else { return "it is JSON, but not a manifest object with a products array" }
        guard let products = root["products"] as? [Any] else {
            return root["products"] == nil ? "the field 'products' is missing" : "'products' is not an array"
        }
        func isString(_ value: Any?) -> Bool { value is String }
        func wholeNumber(_ value: Any?) -> (ok: Bool, shown: String) {
            guard let number = value as? NSNumber, !(value is Bool) else { return (false, value.map { "\($0)" } ?? "missing") }
            let type = String(cString: number.objCType)
            if type == "d" || type == "f" {
                return (number.doubleValue.rounded() == number.doubleValue && abs(number.doubleValue) < 9.2e18, "\(number.doubleValue)")
            }
            return (true, number.stringValue)
        }
        for (index, item) in products.enumerated() {
            guard let product = item as? [String: Any] else { return "products.\(index) is not an object" }
            if !isString(product["productIdentifier"]) { return "products.\(index).productIdentifier is not a string" }
            guard let contents = product["contents"] as? [Any] else { return "products.\(index).contents is not an array" }
            for (position, entry) in contents.enumerated() {
                let place = "products.\(index).contents.\(position)"
                guard let content = entry as? [String: Any] else { return "\(place) is not an object" }
                for key in ["contentIdentifier", "contentVersion", "url", "sha256"] where !isString(content[key]) {
                    return content[key] == nil ? "the field '\(key)' is missing at \(place)" : "\(place).\(key) is not a string"
                }
                let length = wholeNumber(content["contentLength"])
                if !length.ok {
                    return
                        "\(place).contentLength is \(PackDeliveryError.printable(String(length.shown.prefix(40)))), not a whole number of bytes"
                }
                if let unpacked = content["unpackedLength"], !(unpacked is NSNull) {
                    let value = wholeNumber(unpacked)
                    if !value.ok {
                        return
                            "\(place).unpackedLength is \(PackDeliveryError.printable(String(value.shown.prefix(40)))), not a whole number of bytes"
                    }
                }
            }
        }
        return nil
    }

    private static func path(_ context: DecodingError.Context) -> String {
        let path = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        return path.isEmpty ? "" : " at \(PackDeliveryError.printable(path))"
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
