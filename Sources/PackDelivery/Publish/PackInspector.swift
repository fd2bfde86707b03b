import CArchive
import Foundation

/// Reads what a manifest needs to know about a pack without unpacking it.
enum PackInspector {
    struct Summary: Sendable, Hashable {
        var contentInfo: ContentInfo?
        /// Sum of the regular files' sizes.
        var unpackedLength: Int64
    }

    /// The most decompressed bytes an inspection reads (a manifest describes packs it is given, not bombs).
    static let maxDecompressed: Int64 = 1 << 40

    static func inspect(_ archive: URL) throws(PackDeliveryError) -> Summary {
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }
        let source = try ArchiveReader(archive, maxDecompressed: Self.maxDecompressed)
        let reader = source.reader
        var summary = Summary(contentInfo: nil, unpackedLength: 0)
        var entry: OpaquePointer?
        var entries = 0
        while true {
            let status = archive_read_next_header(reader, &entry)
            if status == ARCHIVE_EOF { break }
            guard status == ARCHIVE_OK || status == ARCHIVE_WARN, let entry else {
                throw source.error(nil)
            }
            entries += 1
            // A name with no valid encoding has no C string: it is not ContentInfo.plist, whatever it is.
            let raw = archive_entry_pathname(entry) ?? archive_entry_pathname_utf8(entry)
            let path = raw.map { String(cString: $0) }.map { $0.hasPrefix("./") ? String($0.dropFirst(2)) : $0 } ?? ""
            guard UInt32(archive_entry_filetype(entry)) & 0o170000 == 0o100000 else { continue }
            let (sum, overflow) = summary.unpackedLength.addingReportingOverflow(max(0, archive_entry_size(entry)))
            summary.unpackedLength = overflow ? .max : sum
            if path == "ContentInfo.plist" {
                var data = Data()
                var buffer = [UInt8](repeating: 0, count: 64 << 10)
                while true {
                    let count = archive_read_data(reader, &buffer, buffer.count)
                    if count < 0 { throw source.error(path) }
                    if count == 0 { break }
                    data.append(contentsOf: buffer[0..<count])
                    if data.count > 1 << 20 { break }
                }
                summary.contentInfo = try? PropertyListDecoder().decode(ContentInfo.self, from: data)
                if summary.contentInfo == nil {
                    throw PackDeliveryError(
                        .contentInfoMismatch,
                        message:
                            "\(archive.lastPathComponent) has a ContentInfo.plist without the string keys ContentVersion and IAPProductIdentifier.",
                        hint: "Rebuild the pack with a ContentInfo.plist that names its product and version.", subject: archive.path)
                }
            }
        }
        if entries == 0 {
            throw PackDeliveryError(
                .emptyPack, message: "\(archive.lastPathComponent) holds no files at all.", hint: "Rebuild the pack.", subject: archive.path
            )
        }
        return summary
    }
}

extension PackInspector {
    /// A name as an index records it: without a leading `./`, and a folder without its trailing `/`.
    private static func normalized(_ name: UnsafePointer<CChar>?) -> String {
        Self.normalized(name.map { String(cString: $0) } ?? "")
    }

    static func normalized(_ name: String) -> String {
        var path = Substring(name)
        while path.hasPrefix("./") { path = path.dropFirst(2) }
        while path.hasSuffix("/") { path = path.dropLast() }
        return String(path)
    }
}

/// Builds a manifest for the packs in a folder, as content pipelines publish it.
public enum ManifestBuilder {
    static let packExtensions = [".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst"]

    /// Describes every pack in `folder` (product and version from its `ContentInfo.plist`; length, sha256,
    /// unpackedLength measured), with URLs relative to the folder.
    ///
    /// Every pack gets an index (``PackIndex``) beside it, `<pack>.index.json`: the one `packs pack` wrote when
    /// it still describes the pack (same length and SHA-256), else one made by reading the pack, as far as its
    /// format allows (a tar compressed as one stream by another tool: by entry, without chunks). Indexes are
    /// zstd-compressed JSON; one that is plain JSON (written before indexes were compressed) and still describes
    /// its pack is compressed in place, its JSON unchanged.
    ///
    /// Packs are the files ending in `.zip`, `.tar`, `.tar.gz`, `.tgz`, `.tar.bz2`, `.tar.xz` or `.tar.zst`,
    /// read in name order. A product's first pack gets the product identifier as its content identifier;
    /// further packs of the same product get `<product>.<file name without extension>`.
    /// - Parameters:
    ///   - folder: the folder holding the packs.
    ///   - note: called with each thing an index could not give, naming the pack.
    /// - Returns: one product per product identifier found, in the order first seen.
    /// - Throws: `usage` when the folder cannot be listed; `badData` for a pack without a usable
    ///   `ContentInfo.plist` or one that is not a readable archive; `io` when a pack cannot be read.
    public static func build(folder: URL, note: (String) -> Void = { _ in }) throws(PackDeliveryError) -> Manifest {
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: folder.path).sorted() } catch {
            throw PackDeliveryError(
                .invalidArgument, message: "Cannot list the folder \(folder.path).", hint: "Pass a folder that holds packs.",
                subject: folder.path)
        }
        var products: [String: [Manifest.Content]] = [:]
        var order: [String] = []
        for name in names where Self.packExtensions.contains(where: { name.hasSuffix($0) }) {
            let url = folder.appending(path: name)
            let description = try PreloadPack.description(of: url)
            let summary: PackInspector.Summary
            if let description {
                summary = PackInspector.Summary(contentInfo: description.contentInfo, unpackedLength: description.unpackedLength)
            } else {
                summary = try PackInspector.inspect(url)
            }
            guard let info = summary.contentInfo else {
                throw PackDeliveryError(
                    .contentInfoMismatch, message: "\(name) has no ContentInfo.plist, so its product and version are unknown.",
                    hint: "Build the pack with a ContentInfo.plist that names its product and version.", subject: url.path)
            }
            let length = (try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int64) ?? 0
            // The first pack of a product is named after it; further packs of the same product after their file.
            let stem = Self.packExtensions.first(where: { name.hasSuffix($0) }).map { String(name.dropLast($0.count)) } ?? name
            let identifier = products[info.productIdentifier] == nil ? info.productIdentifier : "\(info.productIdentifier).\(stem)"
            var content = Manifest.Content(
                contentIdentifier: identifier, contentVersion: info.contentVersion,
                url: name.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? name,
                contentLength: length, sha256: try SHA256Hasher.hexDigest(ofFile: url),
                unpackedLength: summary.unpackedLength)
            if let description {
                // The index describes the plain pack, whose ranges are those of the encrypted one.
                content.index = try Self.index(of: url, length: description.plain.length, sha256: description.plain.sha256, note: note)
                content.preload = description.preload
            } else {
                content.index = try Self.index(of: url, length: length, sha256: content.sha256, note: note)
            }
            if products[info.productIdentifier] == nil { order.append(info.productIdentifier) }
            products[info.productIdentifier, default: []].append(content)
        }
        return Manifest(products: order.map { Manifest.Product(productIdentifier: $0, contents: products[$0] ?? []) })
    }

    /// The reference to a pack's index: the one beside it when it describes this pack, else a new one.
    private static func index(of pack: URL, length: Int64, sha256: String, note: (String) -> Void) throws(PackDeliveryError)
        -> Manifest.IndexReference
    {
        let target = PackWriter.indexURL(for: pack)
        if let data = try? Data(contentsOf: target),
            let index = try? PackIndex.decode(data, maxEntries: Int.max / 2, containers: Set(PackIndex.Container.allCases)),
            index.format >= 2, index.pack == PackIndex.Pack(length: length, sha256: sha256)
        {
            // An index made before indexes were compressed: the same JSON, compressed (a chunked tar.zst could not
            // be indexed by chunk again from the pack).
            guard data.starts(with: PackIndex.zstdMagic) else { return try PackIndexer.write(json: data, to: target) }
            let name = target.lastPathComponent
            return Manifest.IndexReference(
                url: name.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? name,
                sha256: try SHA256Hasher.hexDigest(ofFile: target), length: Int64(data.count))
        }
        let made = try PackIndexer.index(pack)
        made.notes.forEach(note)
        return try PackIndexer.write(made.index, to: target)
    }

    /// Writes `folder/manifest.json` (atomically) and returns the manifest.
    ///
    /// - Parameter folder: the folder holding the packs; the manifest goes into it.
    /// - Returns: the manifest written, as ``build(folder:note:)`` makes it.
    /// - Throws: what ``build(folder:note:)`` throws; `io` when `manifest.json` cannot be written.
    @discardableResult
    public static func write(folder: URL) throws(PackDeliveryError) -> Manifest {
        try self.write(folder: folder, signing: nil)
    }

    /// Writes `folder/manifest.json` and, with a key, its detached signature `manifest.json.sig`
    /// (``ManifestSignature``, over the manifest file's exact bytes).
    ///
    /// - Parameters:
    ///   - folder: the folder holding the packs; the manifest goes into it.
    ///   - key: the publisher's key, or nil for an unsigned manifest.
    ///   - version: the manifest's version; nil for one more than that of the `manifest.json` it replaces, else 1.
    ///   - expires: when the signed manifest stops being valid; nil for never.
    ///   - scope: what the signed manifest's version counts (``Manifest/scope``); nil for that of the `manifest.json`
    ///     it replaces, else the identifier of the folder's one product, else the folder's name.
    ///   - note: called with each thing a pack's index could not give, naming the pack.
    ///   - mirrors: base URLs the packs are also served from (``Manifest/mirrors``), tried in this order before the
    ///     manifest's own URL; nil or empty for none.
    /// - Returns: the manifest written.
    /// - Throws: what ``build(folder:note:)`` throws; `invalidArgument` for an unusable scope; `invalidManifest` when no
    ///   version is given and the manifest it replaces has the largest one; `io` when a file cannot be written.
    @discardableResult
    public static func write(
        folder: URL, signing key: PublisherSigningKey?, version: Int? = nil, expires: Date? = nil, scope: String? = nil,
        note: (String) -> Void = { _ in }, mirrors: [String]? = nil
    ) throws(PackDeliveryError) -> Manifest {
        try self.write(
            folder: folder, signing: key, version: version, expires: expires, scope: scope, delivery: [:], note: note, mirrors: mirrors)
    }

    /// As ``write(folder:signing:version:expires:scope:note:mirrors:)``, giving packs a ``DeliveryPolicy`` (`"delivery"`
    /// in the manifest, covered by its signature like every field); packs not named say nothing, which is essential.
    ///
    /// - Parameters:
    ///   - folder: the folder holding the packs; the manifest goes into it.
    ///   - key: the publisher's key, or nil for an unsigned manifest.
    ///   - version: the manifest's version; nil for one more than that of the `manifest.json` it replaces, else 1.
    ///   - expires: when the signed manifest stops being valid; nil for never.
    ///   - scope: what the signed manifest's version counts; nil as in ``write(folder:signing:version:expires:scope:note:mirrors:)``.
    ///   - delivery: policies by content identifier.
    ///   - note: called with each thing a pack's index could not give, naming the pack.
    ///   - mirrors: base URLs the packs are also served from (``Manifest/mirrors``); nil or empty for none.
    /// - Returns: the manifest written.
    /// - Throws: as ``write(folder:signing:version:expires:scope:note:mirrors:)``; `invalidArgument` for a content identifier
    ///   in `delivery` that no pack has.
    @discardableResult
    public static func write(
        folder: URL, signing key: PublisherSigningKey?, version: Int? = nil, expires: Date? = nil, scope: String? = nil,
        delivery: [String: DeliveryPolicy], note: (String) -> Void = { _ in }, mirrors: [String]? = nil
    ) throws(PackDeliveryError) -> Manifest {
        var manifest = try self.build(folder: folder, note: note)
        var unused = Set(delivery.keys)
        for product in manifest.products.indices {
            for content in manifest.products[product].contents.indices {
                let identifier = manifest.products[product].contents[content].contentIdentifier
                guard let policy = delivery[identifier] else { continue }
                manifest.products[product].contents[content].delivery = policy
                unused.remove(identifier)
            }
        }
        if let name = unused.sorted().first {
            let known = manifest.products.flatMap { $0.contents.map(\.contentIdentifier) }.prefix(20).joined(separator: ", ")
            throw PackDeliveryError(
                .invalidArgument, message: "No pack in \(folder.path) has the content identifier '\(PackDeliveryError.printable(name))'.",
                hint: "Packs: \(PackDeliveryError.printable(known)).", subject: name)
        }
        if let mirrors, !mirrors.isEmpty {
            manifest.mirrors = mirrors
            // The same checks a client makes, so a publisher learns of a bad mirror before the clients do.
            _ = try LoadedManifest(manifest: manifest, baseURL: folder.appending(path: "manifest.json"))
        }
        let target = folder.appending(path: "manifest.json")
        if key != nil {
            let previous = (try? Data(contentsOf: target)).flatMap { try? JSONDecoder().decode(Manifest.self, from: $0) }
            let (next, overflow) = (previous?.version ?? 0).addingReportingOverflow(1)
            if version == nil, overflow {
                throw PackDeliveryError(
                    .invalidManifest,
                    message:
                        "The manifest.json it replaces has version \(previous?.version ?? 0), the largest there is: no later version can follow it.",
                    hint: "Sign it in a new scope or with a new publisher key, whose versions start again at 1.", subject: target.path)
            }
            manifest.version = version ?? next
            manifest.expires = expires.map { $0.formatted(.iso8601) }
            let scope =
                scope ?? previous?.scope
                ?? (manifest.products.count == 1 ? manifest.products[0].productIdentifier : folder.standardizedFileURL.lastPathComponent)
            if let problem = scope.isEmpty ? "it is empty" : LoadedManifest.textProblem(scope, maxBytes: 255).map({ "it has \($0)" }) {
                throw PackDeliveryError(
                    .invalidArgument, message: "The scope '\(PackDeliveryError.printable(scope))' cannot be used: \(problem).",
                    hint: "Name the scope the manifest's version counts in, such as its product's identifier.", subject: folder.path)
            }
            manifest.scope = scope
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        do {
            let data = try encoder.encode(manifest)
            let signaturePath = folder.appending(path: ManifestSignature.fileName(for: "manifest.json"))
            if let key {
                let signature = try JSONEncoder().encode(try ManifestSignature(signing: data, with: key))
                // The signature first: a client never sees a new manifest beside an old signature for long.
                try signature.write(to: signaturePath, options: .atomic)
            } else {
                try? FileManager.default.removeItem(at: signaturePath)
            }
            try data.write(to: target, options: .atomic)
        } catch let error as PackDeliveryError {
            throw error
        } catch {
            throw PackDeliveryError(
                .fileSystem, message: "Cannot write \(target.path): \(error.localizedDescription).", subject: folder.path)
        }
        return manifest
    }
}
