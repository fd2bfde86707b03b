import Foundation
import GRDB
import Logging
import Synchronization

/// What ``DownloadQueue/exportForOffline(product:to:trusting:options:)`` wrote: a folder that installs the product on
/// another machine with no network (`packs fetch DIR/manifest.json PRODUCT`).
///
/// The folder holds the manifest as this home read it (its exact bytes, so that its signature, `manifest.json.sig`
/// beside it, still holds), `export.json`, and under `packs/` each of the product's packs and indexes as served, at
/// ``LoadedManifest/exportedPath(_:)`` of its URL in the manifest. A local manifest with `export.json` beside it
/// resolves each pack and index to its copy there when it exists, before any network source: the manifest is never
/// rewritten (a signed manifest would no longer verify), and the copies are checked against the SHA-256 and length
/// the signed manifest gives, as any fetch's.
public struct OfflineExport: Sendable, Hashable {
    /// The export's manifest, `DIR/manifest.json`.
    public var manifest: URL
    /// Whether the manifest was written with its signature (`manifest.json.sig`).
    public var signed: Bool
    /// The content identifiers of the packs written.
    public var packs: [String]
    /// Bytes of packs and indexes written.
    public var bytes: Int64
    /// The ``TrustedRepository/id`` of the TUF repository that vouched for the manifest, when one did: the export then
    /// holds its metadata (`tuf/metadata/`), and reading the export checks the manifest and packs through TUF again.
    public var tufRepository: String?

    /// The file beside an exported manifest that marks the folder as an export.
    public static let markerName = "export.json"
}

extension LoadedManifest {
    /// Where an export keeps a pack or index whose URL in the manifest is `text`, relative to the export's folder:
    /// `packs/HOST/PATH` of the URL (a relative one as if served by `relative`), without its query; nil for a URL with
    /// no path or one that climbs out (`..`).
    public static func exportedPath(_ text: String) -> String? {
        guard let base = URL(string: "http://relative/"), let url = URL(string: text, relativeTo: base)?.absoluteURL else { return nil }
        let components = url.path.split(separator: "/").map(String.init)
        guard !components.isEmpty, !components.contains(where: { $0 == ".." || $0 == "." }) else { return nil }
        return (["packs", url.host() ?? "local"] + components).joined(separator: "/")
    }

    /// The export's folder when this manifest was read from one (a local file with ``OfflineExport/markerName`` beside it).
    var exportFolder: URL? {
        guard self.baseURL.isFileURL else { return nil }
        let folder = self.baseURL.deletingLastPathComponent()
        return FileManager.default.fileExists(atPath: folder.appending(path: OfflineExport.markerName).path) ? folder : nil
    }

    /// The export's copy of the pack or index `text`, when this manifest was read from an export that holds it.
    func exportedCopy(_ text: String) -> URL? {
        guard let folder = self.exportFolder, let path = Self.exportedPath(text) else { return nil }
        let copy = folder.appending(path: path)
        return FileManager.default.fileExists(atPath: copy.path) ? copy : nil
    }
}

extension DownloadQueue {
    /// Writes what another machine needs to install `product` with no network (issue 46): the manifest its newest
    /// transaction was added from, read again from there as is (with its signature when it has one), and each of its
    /// packs and indexes, fetched and checked against the SHA-256 and length the manifest gives (see ``OfflineExport``).
    ///
    /// - Parameters:
    ///   - product: a product with a transaction in this home.
    ///   - folder: where to write (created when missing).
    ///   - publishers: keys trusted to sign the manifest, besides the home's (``trustedPublishers(home:)``); when there
    ///     are any, the manifest must verify.
    ///   - options: transfer options for the fetches.
    /// - Throws: `notInstalled` when no transaction of `product` recorded its manifest; `untrustedManifest`; a
    ///   `checksumMismatch` or `lengthMismatch` naming a pack the server serves otherwise than the manifest says;
    ///   network and I/O errors.
    public func exportForOffline(
        product: String, to folder: URL, trusting publishers: [PublisherKey] = [], options: TransferOptions = TransferOptions()
    ) throws(PackDeliveryError) -> OfflineExport {
        let source = try self.exportSource(product)
        try Self.makeFolder(folder)
        // A former export's marker and TUF metadata go first: the manifest written next is checked as this export's.
        unlink(folder.appending(path: OfflineExport.markerName).path)
        try? FileManager.default.removeItem(at: folder.appending(path: "tuf"))
        let data = try LoadedManifest.fetchBytes(source, options: options)
        let manifestFile = folder.appending(path: "manifest.json")
        let signatureURL = source.deletingLastPathComponent().appending(path: ManifestSignature.fileName(for: source.lastPathComponent))
        let signature = try? LoadedManifest.fetchBytes(signatureURL, options: options)
        let signatureFile = folder.appending(path: ManifestSignature.fileName(for: "manifest.json"))
        try Self.write(data, to: manifestFile)
        if let signature { try Self.write(signature, to: signatureFile) } else { unlink(signatureFile.path) }
        // Under a TUF repository this home trusts, the manifest is checked through TUF, and the export carries the
        // repository's metadata; otherwise the export's own copy is checked: signed by a trusted publisher when this
        // home trusts any.
        let tuf = try self.exportTUF(data, source: source, folder: folder, options: options)
        if tuf == nil {
            let trusted = publishers + (try DownloadQueue.trustedPublishers(home: self.home))
            _ = try LoadedManifest.load(manifestFile.path, options: options, trusting: trusted)
        }
        let original = try LoadedManifest.decode(data, from: source)
        guard let entry = original.manifest.products.first(where: { $0.productIdentifier == product }) else {
            throw PackDeliveryError(
                .unknownProduct, message: "The manifest \(source.redacted) no longer lists '\(PackDeliveryError.printable(product))'.",
                subject: product)
        }
        var export = OfflineExport(manifest: manifestFile, signed: signature != nil, packs: [], bytes: 0, tufRepository: tuf?.repository)
        let fetcher = ExportFetcher(options: options, logger: self.logger)
        defer { fetcher.shutdown() }
        for content in entry.contents {
            guard let path = LoadedManifest.exportedPath(content.url) else {
                throw PackDeliveryError(
                    .unsupportedURL, message: "The pack \(content.contentIdentifier) has a URL an export cannot keep a copy of.",
                    subject: content.contentIdentifier)
            }
            let url = try original.packURL(for: content)
            try fetcher.fetch(url, to: folder.appending(path: path), length: content.contentLength, sha256: content.sha256)
            export.bytes += content.contentLength
            if let index = content.index, let resolved = original.resolvedIndex(for: content),
                let indexPath = LoadedManifest.exportedPath(index.url),
                let indexURL = URL(string: resolved.url)
            {
                try fetcher.fetch(indexURL, to: folder.appending(path: indexPath), length: index.length, sha256: index.sha256)
                export.bytes += index.length
            }
            export.packs.append(content.contentIdentifier)
        }
        let marker = OfflineExport.Marker(format: 1, product: product, tuf: tuf)
        try Self.write(marker.encoded(), to: folder.appending(path: OfflineExport.markerName))
        return export
    }

    /// The manifest URL recorded by the newest transaction of `product`, finished or not.
    private func exportSource(_ product: String) throws(PackDeliveryError) -> URL {
        let text = try self.store.read { db in
            try String.fetchOne(
                db,
                sql: """
                    SELECT transactionAccess.manifestURL FROM transactionAccess JOIN transactions ON transactions.id = transactionAccess.transactionID
                    WHERE transactions.productIdentifier = ? AND transactionAccess.manifestURL IS NOT NULL
                    ORDER BY transactions.createdAt DESC LIMIT 1
                    """, arguments: [product])
        }
        guard let text, let url = URL(string: text) else {
            throw PackDeliveryError(
                .notInstalled,
                message: "No transaction of '\(PackDeliveryError.printable(product))' in this home recorded the manifest it came from.",
                hint: "Fetch the product from its manifest first.", subject: product)
        }
        return url
    }

    private static func makeFolder(_ folder: URL) throws(PackDeliveryError) {
        do { try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true) } catch {
            throw PackDeliveryError.io(
                "create the export folder", path: folder.path, errno: Self.fileErrno(of: error))
        }
    }

    /// The `errno` under a Foundation file error (EIO when it has none).
    static func fileErrno(of error: any Error) -> Int32 {
        ((error as NSError).userInfo[NSUnderlyingErrorKey] as? NSError).map { Int32($0.code) } ?? EIO
    }

    /// Writes `data` to `file` durably (a temporary file, synced, renamed).
    static func write(_ data: Data, to file: URL) throws(PackDeliveryError) {
        try DeltaAssembly.writeDurably(data, to: file)
    }
}

extension LoadedManifest {
    /// The bytes at `url` (a local file or http(s)), as a manifest or signature is read.
    static func fetchBytes(_ url: URL, options: TransferOptions) throws(PackDeliveryError) -> Data {
        url.isFileURL ? try Self.readLocal(url.path) : try Curl.fetch(url, options: options)
    }
}

/// Fetches an export's packs one at a time through a transfer engine of its own (retries are the caller's).
final class ExportFetcher: Sendable {
    private let engine: TransferEngine
    private let options: TransferOptions
    private let finished = Mutex<TransferOutcome?>(nil)
    private let ended = DispatchSemaphore(value: 0)
    private let made = Atomic<Int>(0)

    init(options: TransferOptions, logger: Logger) {
        self.options = options
        self.engine = TransferEngine(logger: logger, onEvent: { _ in })
    }

    func shutdown() { self.engine.shutdown() }

    /// Fetches `url` into `file` (its folders made), then checks its length and SHA-256.
    func fetch(_ url: URL, to file: URL, length: Int64, sha256: String) throws(PackDeliveryError) {
        do { try FileManager.default.createDirectory(at: file.deletingLastPathComponent(), withIntermediateDirectories: true) } catch {
            throw PackDeliveryError.io("create", path: file.deletingLastPathComponent().path, errno: DownloadQueue.fileErrno(of: error))
        }
        let part = URL(filePath: file.path + ".part")
        unlink(part.path)
        self.finished.withLock { $0 = nil }
        let number = self.made.add(1, ordering: .relaxed).newValue
        self.engine.start(
            TransferRequest(
                id: TransferID(download: "export", token: number), url: url, file: part, expectedLength: length, validator: nil,
                fromZero: true, options: self.options, writer: SystemFileWriter(),
                report: { [self] event in
                    if case .finished(_, let outcome) = event {
                        self.finished.withLock { $0 = outcome }
                        self.ended.signal()
                    }
                }))
        self.ended.wait()
        switch self.finished.withLock({ $0 }) {
        case .completed?: break
        case .failed(let failure, _)?:
            unlink(part.path)
            throw failure.error
        default:
            unlink(part.path)
            throw PackDeliveryError(.internalError, message: "The export's fetch of \(url.redacted) stopped.", subject: url.redacted)
        }
        let digest = try SHA256Hasher.hexDigest(ofFile: part)
        guard digest == sha256.lowercased() else {
            unlink(part.path)
            throw PackDeliveryError(
                .checksumMismatch, message: "\(url.redacted) does not match the SHA-256 the manifest gives it.", subject: url.redacted)
        }
        guard rename(part.path, file.path) == 0 else { throw PackDeliveryError.io("keep", path: file.path, errno: errno) }
    }
}
