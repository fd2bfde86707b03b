import Foundation

extension LoadedManifest {
    /// Reads a manifest from an http(s) URL, a `file://` URL or a local path: a manifest.json, or a Metalink 4 file of one
    /// pack (a path ending in `.meta4`; see the README's "Several sources per pack").
    ///
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching an http(s) manifest.
    /// - Returns: the checked manifest with the URL it was read from.
    /// - Throws: ``PackDeliveryError``: `invalidManifest` when it is missing, unreadable or invalid; a network code when the server fails.
    public static func load(_ location: String, options: TransferOptions = TransferOptions()) throws(PackDeliveryError) -> LoadedManifest {
        try self.load(location, options: options, trusting: [])
    }

    /// Reads a manifest and, when `publishers` is not empty, checks that one of them signed it.
    ///
    /// The signature is the file beside the manifest named `manifest.json.sig` (``ManifestSignature``), over
    /// the manifest's exact bytes. A signed manifest must carry a `version`, and is refused after its `expires`.
    /// (Refusing a lower version than the last one accepted in the manifest's `scope`, or the same version with
    /// other bytes, needs a memory: see ``DownloadQueue/acceptManifest(_:)``.)
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching an http(s) manifest and its signature.
    ///   - publishers: the keys trusted to sign it; empty to read it unsigned, as ``load(_:options:)-79u4c``.
    ///   - now: the time to check `expires` against.
    /// - Returns: the checked manifest, with ``signedBy`` set when it was signed.
    /// - Throws: `untrustedManifest` when the signature is missing, made by another key, or does not match, or
    ///   the manifest has expired or has no version; otherwise as ``load(_:options:)-79u4c``.
    public static func load(
        _ location: String, options: TransferOptions = TransferOptions(), trusting publishers: [PublisherKey],
        now: Date = Date()
    ) throws(PackDeliveryError) -> LoadedManifest {
        try self.load(location, options: options, trusting: publishers, repositories: [], now: now)
    }

    /// Reads a manifest and checks it against what a home trusts: TUF repositories and publisher keys.
    ///
    /// A manifest read from under the targets URL of one of `repositories` is a TUF target: the repository's
    /// metadata is refreshed (timestamp, snapshot, targets, delegations; the trusted metadata on disk replaced only by
    /// metadata that passed), the manifest's bytes must match the target at its path (its URL relative to
    /// ``TrustedRepository/targetsBaseURL``), and each pack's length and SHA-256 must match the target at the pack's
    /// path. Any other manifest is checked against `publishers` as ``load(_:options:trusting:now:)-2r9m0`` does; when
    /// there are repositories but no publishers, it is refused.
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching the manifest, its signature and TUF metadata.
    ///   - publishers: the publisher keys trusted to sign it.
    ///   - repositories: the TUF repositories trusted (``DownloadQueue/trustedRepositories(home:)``).
    ///   - now: the time to check expiry against (a signed manifest's `expires`, and every TUF role's).
    /// - Returns: the checked manifest; ``tufRepository`` is set when a TUF repository vouched for it.
    /// - Throws: `untrustedManifest` when TUF refuses the metadata (naming the role, the version and the rule), the
    ///   manifest or a pack does not match its target, or a signature check fails; otherwise as
    ///   ``load(_:options:)-79u4c``.
    public static func load(
        _ location: String, options: TransferOptions = TransferOptions(), trusting publishers: [PublisherKey],
        repositories: [TrustedRepository], now: Date = Date()
    ) throws(PackDeliveryError) -> LoadedManifest {
        let url: URL
        if let parsed = URL(string: location), let scheme = parsed.scheme?.lowercased(), ["http", "https", "file"].contains(scheme) {
            url = parsed
        } else {
            url =
                URL(filePath: location, relativeTo: URL(filePath: FileManager.default.currentDirectoryPath, directoryHint: .isDirectory))
                .absoluteURL
        }
        let data = try Self.read(url, options: options)
        let place = url.redacted
        if url.isFileURL, let tuf = OfflineExport.Marker.read(beside: url)?.tuf {
            // An export of a product a TUF repository vouched for: checked through TUF again, from the export's copy of
            // the metadata, never by anything weaker.
            return try Self.checkExportTUF(data, from: url, tuf: tuf, repositories: repositories, now: now)
        }
        if !repositories.isEmpty,
            let loaded = try Self.checkTUF(data, from: url, options: options, repositories: repositories, publishers: publishers, now: now)
        {
            return loaded
        }
        if Metalink.names(url) {
            // A Metalink file (`.meta4`) of one pack: it carries no signature of this kind, so it is never trusted.
            guard publishers.isEmpty else {
                throw PackDeliveryError(
                    .untrustedManifest, message: "The Metalink file \(place) is not trusted: it cannot carry a publisher's signature.",
                    hint: "Use a signed manifest.json, or read the Metalink file without trusted publishers.", subject: place)
            }
            var loaded = try LoadedManifest(manifest: try Metalink.manifest(data, from: url), baseURL: url)
            loaded.source = url
            return loaded
        }
        guard !publishers.isEmpty else {
            var loaded = try self.decode(data, from: url)
            loaded.source = url
            return loaded
        }
        let signatureURL = url.deletingLastPathComponent().appending(path: ManifestSignature.fileName(for: url.lastPathComponent))
        func refuse(_ why: String, hint: String) -> PackDeliveryError {
            PackDeliveryError(.untrustedManifest, message: "The manifest at \(place) is not trusted: \(why).", hint: hint, subject: place)
        }
        let signatureData: Data
        do { signatureData = try Self.read(signatureURL, options: options) } catch {
            throw refuse(
                "it has no signature (\(signatureURL.lastPathComponent) could not be read: \(error.message))",
                hint: "Publish the manifest signed by a trusted publisher.")
        }
        guard let signature = try? JSONDecoder().decode(ManifestSignature.self, from: signatureData),
            signature.algorithm == "Ed25519", let bytes = Data(base64Encoded: signature.signature)
        else {
            throw refuse("its signature file is not an Ed25519 manifest signature", hint: "Sign the manifest again.")
        }
        guard let key = publishers.first(where: { $0.id == signature.keyID }) else {
            throw refuse(
                "it is signed by the key \(PackDeliveryError.printable(signature.keyID)), which is not trusted",
                hint: "Trust that publisher's public key, or ask for a manifest signed by one you trust.")
        }
        guard key.verifies(bytes, of: data) else {
            throw refuse(
                "its signature does not match its bytes (changed after signing, or signed with another key)",
                hint: "Nothing was downloaded; ask the publisher for an intact manifest.")
        }
        var loaded = try self.decode(data, from: url)
        guard loaded.manifest.version != nil else {
            throw refuse("it is signed but has no version", hint: "Sign it with a version.")
        }
        if let expires = loaded.manifest.expires {
            guard let date = try? Date(expires, strategy: .iso8601) else {
                throw refuse("its expiry '\(PackDeliveryError.printable(expires))' is not an ISO 8601 date", hint: "Sign it again.")
            }
            if date <= now {
                throw refuse("it expired at \(expires)", hint: "Ask the publisher for a fresh manifest.")
            }
        }
        loaded.signedBy = key.id
        loaded.source = url
        return loaded
    }

    /// The manifest checked through the TUF repository whose targets `url` is under; nil when it is under none and
    /// `publishers` are to check it.
    static func checkTUF(
        _ data: Data, from url: URL, options: TransferOptions, repositories: [TrustedRepository], publishers: [PublisherKey], now: Date
    ) throws(PackDeliveryError) -> LoadedManifest? {
        guard let repository = TUFManifestCheck.repository(for: url, in: repositories) else {
            guard publishers.isEmpty else { return nil }
            let place = url.redacted
            throw PackDeliveryError(
                .untrustedManifest,
                message:
                    "The manifest at \(place) is not trusted: it is not under the targets of a TUF repository this home trusts, and no publisher key is trusted to sign it.",
                hint: "Nothing was downloaded; read the manifest from under the repository's targets URL.", subject: place)
        }
        // The manifest's credentials (a receipt, a token) go to the metadata only on the manifest's own origin.
        let sameOrigin = Download.origin(repository.metadataURL) == Download.origin(url)
        let check = TUFManifestCheck(repository: repository, options: sameOrigin ? options : options.withoutCredentials, now: now)
        var updater = try check.checkManifest(data, url: url)
        var loaded =
            Metalink.names(url)
            ? try LoadedManifest(manifest: try Metalink.manifest(data, from: url), baseURL: url) : try self.decode(data, from: url)
        loaded.source = url
        try check.checkPacks(loaded, updater: &updater)
        loaded.tufRepository = repository.id
        return loaded
    }

    private static func read(_ url: URL, options: TransferOptions) throws(PackDeliveryError) -> Data {
        url.isFileURL ? try Self.readLocal(url.path) : try Curl.fetch(url, options: options)
    }

    /// The largest manifest read.
    static let maxBytes = 64 << 20

    /// Reads a local manifest: a regular file (never a FIFO or device, which could block forever) of at most 64 MiB.
    static func readLocal(_ path: String) throws(PackDeliveryError) -> Data {
        let shown = PackDeliveryError.printable(path)
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            let why = code == ENOENT ? "no such file" : String(cString: strerror(code))
            throw PackDeliveryError(
                code == EMFILE || code == ENFILE ? .tooManyOpenFiles : .invalidManifest,
                message: "Cannot read the manifest \(shown): \(why).",
                hint: "Pass the path or URL of a manifest.json.", subject: path, underlying: .init(.errno, Int(code)))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            throw PackDeliveryError(
                .invalidManifest, message: "Cannot read the manifest \(shown): it is not a regular file.",
                hint: "Pass the path or URL of a manifest.json.", subject: path)
        }
        guard info.st_size <= Self.maxBytes else {
            throw PackDeliveryError(
                .invalidManifest, message: "The manifest \(shown) is larger than \(Self.maxBytes) bytes, too large for a manifest.",
                subject: path)
        }
        var data = Data(count: Int(info.st_size))
        var done = 0
        while done < data.count {
            let got = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done)) }
            if got < 0, errno == EINTR { continue }
            guard got > 0 else {
                let code = got < 0 ? errno : EIO
                throw PackDeliveryError(
                    .invalidManifest, message: "Cannot read the manifest \(shown): \(String(cString: strerror(code))).",
                    subject: path, underlying: .init(.errno, Int(code)))
            }
            done += got
        }
        return data
    }
}
