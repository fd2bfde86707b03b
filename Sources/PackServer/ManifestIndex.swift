import Foundation
import Logging
import PackDelivery
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Which products list which pack: `DIR/manifest.json` read as `products[].contents[].url`, each URL
/// resolved against `/manifest.json` (relative URLs are the norm; an absolute URL counts by its
/// path). Read again whenever the file changes (its inode, modification time or size), so a
/// content pipeline can publish a new manifest while the server runs.
final class ManifestIndex: Sendable {
    private struct Snapshot {
        var key: [Int]
        var owners: [String: [String]]
        var preloads: [String: PreloadEntry] = [:]
    }

    /// The products whose packs a preload key opens, and its release date as the manifest gives it.
    struct PreloadEntry: Sendable, Hashable {
        var products: [String]
        var releases: String
    }

    /// The manifest file, absolute.
    let manifestPath: String
    private let logger: Logger
    private let snapshot = Mutex<Snapshot?>(nil)

    /// - Parameters:
    ///   - folder: The served folder's root (absolute, resolved).
    ///   - logger: Told when the manifest cannot be read.
    init(folder: String, logger: Logger) {
        self.manifestPath = folder + "/manifest.json"
        self.logger = logger
    }

    /// What a request for `requestTarget` (a path, maybe with a query; percent-encoded) asks for.
    ///
    /// - Returns: The resource, or `nil` when the path is not one (bad percent-encoding, NUL,
    ///   `..` above the root): such a request is refused.
    func resource(forRequestTarget requestTarget: String) -> ProtectedResource? {
        guard let path = Self.normalizedPath(requestTarget) else { return nil }
        // The catalog's detached signature goes with it (a signed catalog is served whole, see catalog(for:logger:)).
        if path == "/manifest.json" || path == "/manifest.json.sig" {
            return ProtectedResource(kind: .catalog, path: path)
        }
        if let products = self.owners()[path] {
            return ProtectedResource(kind: .pack(productIdentifiers: products), path: path)
        }
        return ProtectedResource(kind: .unlisted, path: path)
    }

    /// The products of the packs the manifest marks with this preload key, and the key's release date (the latest
    /// when packs disagree); nil when no pack names the key.
    func preload(keyID: String) -> PreloadEntry? {
        self.current().preloads[keyID]
    }

    /// Pack path → the products that list it, from the manifest as it is on disk now.
    private func owners() -> [String: [String]] { self.current().owners }

    private func current() -> Snapshot {
        var info = stat()
        let key: [Int] =
            stat(self.manifestPath, &info) == 0
            ? [Int(info.st_ino), Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec), Int(info.st_size)] : []
        if let current = self.snapshot.withLock({ $0 }), current.key == key {
            return current
        }
        var loaded = self.load()
        loaded.key = key
        self.snapshot.withLock { $0 = loaded }
        return loaded
    }

    private struct ManifestShape: Decodable {
        struct Product: Decodable {
            struct Content: Decodable {
                struct Index: Decodable { var url: String }
                struct Preload: Decodable {
                    var keyID: String
                    var releases: String
                }
                var url: String
                var preload: Preload?
                /// A zip pack's index (`<pack>.index.json`) belongs to the same products as the pack.
                var index: Index?
            }
            var productIdentifier: String
            var contents: [Content]
        }
        var products: [Product]
    }

    private func load() -> Snapshot {
        guard let data = FileManager.default.contents(atPath: self.manifestPath) else {
            self.logger.warning("No manifest at \(self.manifestPath): every pack counts as unlisted.")
            return Snapshot(key: [], owners: [:])
        }
        guard let manifest = try? JSONDecoder().decode(ManifestShape.self, from: data) else {
            self.logger.error("\(self.manifestPath) is not a manifest (products[].contents[].url): every pack counts as unlisted.")
            return Snapshot(key: [], owners: [:])
        }
        var owners: [String: [String]] = [:]
        var preloads: [String: PreloadEntry] = [:]
        for product in manifest.products {
            for content in product.contents {
                if let preload = content.preload {
                    var entry = preloads[preload.keyID] ?? PreloadEntry(products: [], releases: preload.releases)
                    if !entry.products.contains(product.productIdentifier) { entry.products.append(product.productIdentifier) }
                    if let date = Manifest.Content.Preload.date(preload.releases),
                        Manifest.Content.Preload.date(entry.releases).map({ date > $0 }) ?? true
                    {
                        entry.releases = preload.releases
                    }
                    preloads[preload.keyID] = entry
                }
                for url in [content.url] + (content.index.map { [$0.url] } ?? []) {
                    guard let path = Self.packPath(url) else { continue }
                    if !(owners[path]?.contains(product.productIdentifier) ?? false) {
                        owners[path, default: []].append(product.productIdentifier)
                    }
                }
            }
        }
        return Snapshot(key: [], owners: owners, preloads: preloads)
    }

    /// `manifest.json` with only `products` (those a receipt names), every other field as published; `nil` to
    /// serve the file as it is: when it is signed (`manifest.json.sig` beside it — filtering would break the
    /// signature, so a signed catalog is served whole to any valid receipt; publish one signed manifest per
    /// product to keep them apart), or when it cannot be read as JSON.
    func catalog(for products: [String], logger: Logger) -> Data? {
        guard access(self.manifestPath + ".sig", F_OK) != 0 else { return nil }
        guard let data = FileManager.default.contents(atPath: self.manifestPath),
            var manifest = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any],
            let all = manifest["products"] as? [[String: Any]]
        else { return nil }
        let wanted = Set(products)
        manifest["products"] = all.filter { ($0["productIdentifier"] as? String).map(wanted.contains) ?? false }
        return try? JSONSerialization.data(withJSONObject: manifest, options: [.sortedKeys, .withoutEscapingSlashes])
    }

    /// A manifest URL as a path from the site's root: absolute URLs by their path, relative ones
    /// resolved against `/manifest.json`.
    static func packPath(_ url: String) -> String? {
        if let parsed = URL(string: url), parsed.scheme != nil {
            return self.normalizedPath(parsed.path(percentEncoded: true))
        }
        return self.normalizedPath(url.hasPrefix("/") ? url : "/" + url)
    }

    /// A request target as nginx maps it to a file: the query and fragment dropped,
    /// percent-decoded, empty and `.` segments removed, `..` applied. `nil` when it is not a path
    /// (bad percent-encoding, NUL, invalid UTF-8, `..` above the root).
    static func normalizedPath(_ target: String) -> String? {
        let path = target.prefix { $0 != "?" && $0 != "#" }
        guard let bytes = ServedFolder.percentDecoded(path), !bytes.contains(0), let decoded = String(validating: bytes, as: UTF8.self)
        else { return nil }
        var segments: [Substring] = []
        for segment in decoded.split(separator: "/", omittingEmptySubsequences: true) {
            switch segment {
            case ".": continue
            case "..":
                guard !segments.isEmpty else { return nil }
                segments.removeLast()
            default: segments.append(segment)
            }
        }
        return "/" + segments.joined(separator: "/")
    }
}
