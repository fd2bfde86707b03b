import Foundation

extension OfflineExport {
    /// `export.json`: the product, and for a product a TUF repository vouched for, that repository and the manifest's
    /// target path.
    struct Marker: Codable, Sendable {
        var format: Int
        var product: String
        var tuf: TUF?

        /// The TUF repository of an export: its ``TrustedRepository/id`` and the manifest's target path in it. The
        /// export holds the repository's metadata under `tuf/metadata/`, named as the repository serves it.
        struct TUF: Codable, Sendable, Hashable {
            var repository: String
            var manifestTarget: String
        }

        /// The marker beside the manifest file `url`, or nil when there is none (or it cannot be read).
        static func read(beside url: URL) -> Marker? {
            let file = url.deletingLastPathComponent().appending(path: OfflineExport.markerName)
            let data = try? SmallFile.read(file.path, limit: 1 << 20) {
                PackDeliveryError(.invalidManifest, message: "\($0) is too large.")
            }
            return data.flatMap { $0 }.flatMap { try? JSONDecoder().decode(Marker.self, from: $0) }
        }

        func encoded() -> Data {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            return ((try? encoder.encode(self)) ?? Data()) + Data("\n".utf8)
        }
    }

    /// The folder of an export's TUF metadata.
    static func metadataFolder(_ folder: URL) -> URL { folder.appending(path: "tuf/metadata", directoryHint: .isDirectory) }
}

extension DownloadQueue {
    /// For a manifest read from under a TUF repository this home trusts: checks `data` through TUF (the home's metadata
    /// refreshed, the manifest and every pack matched against their targets) and copies the repository's metadata into
    /// the export, with every root version after the first (fetched from the repository) so that a home that trusts
    /// an older root walks to the current one. Nil when the manifest is under no trusted repository.
    func exportTUF(
        _ data: Data, source: URL, folder: URL, options: TransferOptions
    ) throws(PackDeliveryError) -> OfflineExport.Marker.TUF? {
        let repositories = try DownloadQueue.trustedRepositories(home: self.home)
        guard let repository = TUFManifestCheck.repository(for: source, in: repositories),
            let target = repository.targetPath(of: source)
        else { return nil }
        _ = try LoadedManifest.checkTUF(data, from: source, options: options, repositories: [repository], publishers: [], now: Date())
        let out = OfflineExport.metadataFolder(folder)
        try Home.makeDirectories(out)
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: repository.metadataFolder.path)) ?? []).sorted()
        var rootVersion = 1
        for name in names where name.hasSuffix(".json") {
            let file = repository.metadataFolder.appending(path: name)
            let read = try SmallFile.read(file.path, limit: 64 << 20) { TUFRefusal.error(name, "the stored copy \($0) is too large") }
            guard let bytes = read else { continue }
            try Self.write(bytes, to: out.appending(path: name))
            guard name != "timestamp.json", let version = TUFJSON.parse(bytes)?["signed"]?["version"]?.intValue else { continue }
            try Self.write(bytes, to: out.appending(path: "\(version).\(name)"))
            if name == "root.json" { rootVersion = version }
        }
        let sameOrigin = Download.origin(repository.metadataURL) == Download.origin(source)
        let storage = TUFStorage(
            folder: repository.metadataFolder, metadataURL: repository.metadataURL,
            options: sameOrigin ? options : options.withoutCredentials)
        for version in 2..<max(2, rootVersion) {
            let root = try storage.fetch("\(version).root.json", role: "root", version: version, limit: TUFStorage.rootMaxLength)
            try Self.write(root, to: out.appending(path: "\(version).root.json"))
        }
        return OfflineExport.Marker.TUF(repository: repository.id, manifestTarget: target)
    }
}

extension LoadedManifest {
    /// Checks a manifest read from an export of a product a TUF repository vouched for: the home must trust that
    /// repository; its trusted metadata is brought up to date from the export's copy (by the whole client workflow:
    /// root chain, expiry, rollback, thresholds, hashes), and the manifest's bytes and every pack must match their
    /// targets. No network is used. Anything missing or refused is `untrustedManifest`.
    static func checkExportTUF(
        _ data: Data, from url: URL, tuf: OfflineExport.Marker.TUF, repositories: [TrustedRepository], now: Date
    ) throws(PackDeliveryError) -> LoadedManifest {
        let place = url.redacted
        func refuse(_ why: String, hint: String) -> PackDeliveryError {
            PackDeliveryError(
                .untrustedManifest, message: "The exported manifest \(place) is not trusted: \(why).", hint: hint, subject: place)
        }
        guard let trusted = repositories.first(where: { $0.id == tuf.repository }) else {
            throw refuse(
                "the TUF repository \(PackDeliveryError.printable(tuf.repository)) vouched for it, and this home does not trust that repository",
                hint: "Nothing was installed; trust that repository's root in this home first.")
        }
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: ";?#")
        guard let encoded = tuf.manifestTarget.addingPercentEncoding(withAllowedCharacters: allowed),
            let original = TUFStorage.url(trusted.targetsBaseURL, appending: encoded),
            trusted.targetPath(of: original) == tuf.manifestTarget
        else {
            throw refuse("its export names no valid target path for it", hint: "Nothing was installed; export the product again.")
        }
        let offline = TrustedRepository(
            id: trusted.id, metadataURL: OfflineExport.metadataFolder(url.deletingLastPathComponent()),
            targetsBaseURL: trusted.targetsBaseURL, metadataFolder: trusted.metadataFolder)
        let check = TUFManifestCheck(repository: offline, options: TransferOptions(), now: now)
        do throws(PackDeliveryError) {
            var updater = try check.checkManifest(data, url: original)
            try check.checkPacks(try Self.decode(data, from: original), updater: &updater)
        } catch  where error.code != .untrustedManifest {
            throw refuse(
                "the export's TUF metadata is missing or unreadable (\(error.message))",
                hint: "Nothing was installed; export the product again from a home that trusts the repository.")
        }
        var loaded = try Self.decode(data, from: url)
        loaded.source = url
        loaded.tufRepository = trusted.id
        return loaded
    }
}
