import Foundation

#if canImport(FoundationXML)
    import FoundationXML
#endif

/// A Metalink 4 file (RFC 5854, `.meta4`) that describes one pack, read as a manifest of one product with one pack:
/// the file's `<identity>` (or its `name`) is the product's and the pack's identifier, its `<version>` (or the first 12
/// digits of its SHA-256) the pack's version (a pack's ContentInfo.plist must agree with both), its `<size>` the length, its `<hash type="sha-256">` the SHA-256, and its `<url>`
/// elements, lowest `priority` first (those without one last, in the file's order), the pack's `url` and `urls`.
///
/// Refused, with `invalidManifest`: more or fewer than one `<file>`, no SHA-256 or size, no http(s) URL, and any
/// document type declaration (so no entity is ever defined or expanded, nor an external one fetched).
/// `<metaurl>` elements name metadata (a torrent, another metalink), not the pack's bytes, and are passed over.
enum Metalink {
    /// The Metalink 4 namespace.
    static let namespace = "urn:ietf:params:xml:ns:metalink"

    /// Whether a manifest location names a Metalink file (its path ends in `.meta4`).
    static func names(_ url: URL) -> Bool { url.pathExtension.lowercased() == "meta4" }

    /// The manifest a Metalink file describes.
    ///
    /// - Parameters:
    ///   - data: the file's bytes.
    ///   - url: where it was read from (for errors, and what relative URLs resolve against).
    /// - Returns: a manifest of one product with one pack.
    /// - Throws: `invalidManifest` naming what is wrong.
    static func manifest(_ data: Data, from url: URL) throws(PackDeliveryError) -> Manifest {
        let place = url.redacted
        func refuse(_ why: String) -> PackDeliveryError {
            PackDeliveryError(
                .invalidManifest, message: "The Metalink file \(place) cannot be used: \(why).",
                hint: "A .meta4 manifest describes one file with its size, a sha-256 hash and http(s) URLs.", subject: place)
        }
        // The encoding is decided first, as libxml2 decides it; then the text in that encoding is checked.
        // Entities are never defined, so never expanded (no "billion laughs"), and no external one is fetched.
        let text: String
        switch MetalinkEncoding.decode(data) {
        case .success(let decoded): text = decoded
        case .failure(let problem): throw refuse(problem.why)
        }
        if text.range(of: "<!DOCTYPE", options: .caseInsensitive) != nil || text.range(of: "<!ENTITY", options: .caseInsensitive) != nil {
            throw refuse("it has a document type declaration, which a Metalink file does not need")
        }
        let reader = Reader()
        let parser = XMLParser(data: data)
        parser.shouldProcessNamespaces = true
        parser.shouldResolveExternalEntities = false
        parser.delegate = reader
        guard parser.parse(), reader.problem == nil else {
            throw refuse(
                reader.problem
                    ?? "it is not well-formed XML (\(parser.parserError.map { "\($0.localizedDescription)" } ?? "unknown error"))")
        }
        guard reader.sawMetalink else { throw refuse("its root is not a Metalink 4 <metalink> element") }
        guard reader.files.count == 1, let file = reader.files.first else {
            throw refuse("it describes \(reader.files.count) files; a manifest source describes exactly one pack")
        }
        guard let name = file.name, !name.isEmpty else { throw refuse("its <file> has no name") }
        let identifier = file.identity ?? name
        guard let sha256 = file.sha256?.lowercased() else {
            throw refuse("its file \(PackDeliveryError.printable(name)) has no sha-256 hash")
        }
        guard let size = file.size else { throw refuse("its file \(PackDeliveryError.printable(name)) has no <size>") }
        let urls = file.urls.enumerated()
            .sorted { ($0.element.priority ?? Int.max, $0.offset) < ($1.element.priority ?? Int.max, $1.offset) }
            .map(\.element.url)
            .filter { ["http", "https"].contains(URL(string: $0)?.scheme?.lowercased() ?? "") }
        guard let first = urls.first else { throw refuse("its file \(PackDeliveryError.printable(name)) has no http(s) <url>") }
        var content = Manifest.Content(
            contentIdentifier: identifier, contentVersion: file.version ?? String(sha256.prefix(12)), url: first, contentLength: size,
            sha256: sha256)
        if urls.count > 1 { content.urls = Array(urls.dropFirst()) }
        return Manifest(products: [Manifest.Product(productIdentifier: identifier, contents: [content])])
    }

    /// One `<file>` as read.
    struct File {
        var name: String?
        var size: Int64?
        var sha256: String?
        var version: String?
        var identity: String?
        var urls: [(url: String, priority: Int?)] = []
    }

    /// Gathers the `<file>` elements of a Metalink document: the elements of the Metalink namespace directly under a
    /// `<file>` (a `<hash>` inside `<pieces>` is a piece's, not the file's).
    private final class Reader: NSObject, XMLParserDelegate {
        var files: [File] = []
        var sawMetalink = false
        var problem: String?
        private var path: [String] = []
        private var text = ""
        private var hashType: String?
        private var priority: Int?

        func parser(
            _ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?, qualifiedName: String?,
            attributes: [String: String] = [:]
        ) {
            let name = namespaceURI == Metalink.namespace ? elementName : "{other}"
            if self.path.isEmpty, name == "metalink" { self.sawMetalink = true }
            if name == "file", self.path == ["metalink"] { self.files.append(File(name: attributes["name"])) }
            self.path.append(name)
            self.text = ""
            self.hashType = attributes["type"]?.lowercased()
            self.priority = attributes["priority"].flatMap { Int($0) }
        }

        func parser(_ parser: XMLParser, foundCharacters string: String) {
            // A value is short: text beyond that is not a Metalink's.
            if self.text.utf8.count < 4096 { self.text += string }
        }

        func parser(_ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName: String?) {
            defer { self.path.removeLast() }
            guard self.path.count == 3, self.path[0] == "metalink", self.path[1] == "file", !self.files.isEmpty else { return }
            let value = self.text.trimmingCharacters(in: .whitespacesAndNewlines)
            let index = self.files.count - 1
            switch self.path[2] {
            case "size":
                guard let size = Int64(value), size >= 0 else {
                    self.problem = "its <size> '\(PackDeliveryError.printable(value))' is not a byte count"
                    return
                }
                self.files[index].size = size
            case "hash" where self.hashType == "sha-256":
                guard value.count == 64, value.allSatisfy(\.isHexDigit) else {
                    self.problem = "its sha-256 hash '\(PackDeliveryError.printable(value))' is not 64 hex digits"
                    return
                }
                self.files[index].sha256 = value
            case "version":
                self.files[index].version = value
            case "identity":
                self.files[index].identity = value
            case "url":
                self.files[index].urls.append((value, self.priority))
            default:
                break
            }
        }
    }
}
