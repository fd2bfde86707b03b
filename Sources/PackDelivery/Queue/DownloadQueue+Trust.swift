import Foundation

/// One publisher key a home trusts, as recorded: readable or not.
public struct TrustedPublisherRecord: Sendable, Hashable {
    /// The key's id, recorded when it was trusted (``PublisherKey/id``): what names it, readable or not.
    public var id: String
    /// The key; nil when its record no longer reads as an Ed25519 public key (then the home refuses every manifest).
    public var key: PublisherKey?
    /// The id of the record a rebuilt state database gets when the trust it had could not be read back: it reads as
    /// no key, so every manifest is refused until it is removed (``DownloadQueue/untrust(id:)``) and trust set again.
    public static let lostTrustID = "trust-lost-in-rebuild"
}

// Signed manifests: what this home trusts, and rollback protection.
extension DownloadQueue {
    /// The publishers this home trusts (added with ``trust(_:)``), besides any a caller passes itself.
    ///
    /// - Throws: `unreadableTrustedKey` when a trusted key's record no longer reads as a key (garbage, another kind of
    ///   key, nothing): the home then trusts nothing it can check, so it refuses every manifest (and Metalink file)
    ///   rather than reading them unsigned. Remove it with ``untrust(id:)``.
    public func trustedPublishers() throws(PackDeliveryError) -> [PublisherKey] {
        try Self.readable(try self.trustedPublisherRecords())
    }

    /// The publishers a home trusts, read without opening a queue (so a manifest can be checked before the
    /// queue holds its files and threads); none for a home that has no state database yet.
    ///
    /// - Throws: as ``trustedPublishers()``.
    public static func trustedPublishers(home: Home) throws(PackDeliveryError) -> [PublisherKey] {
        guard FileManager.default.fileExists(atPath: home.databaseURL.path) else { return [] }
        let store = try Store(url: home.databaseURL, busyTimeout: 15)
        defer { store.close() }
        return try Self.readable(Self.records(try store.trustedPublisherRows()))
    }

    /// Every trusted key as recorded, those that no longer read as a key included (``TrustedPublisherRecord/key`` nil).
    public func trustedPublisherRecords() throws(PackDeliveryError) -> [TrustedPublisherRecord] {
        try self.requireOpen()
        return Self.records(try self.store.trustedPublisherRows())
    }

    /// Trusts a publisher for this home: manifests loaded with ``trustedPublishers()`` must then be signed.
    public func trust(_ publisher: PublisherKey) throws(PackDeliveryError) {
        try self.requireOpen()
        try self.store.trust(id: publisher.id, pem: publisher.pem)
    }

    /// Stops trusting a publisher key, readable or not, named by its recorded id (``TrustedPublisherRecord/id``), or a
    /// TUF repository named by its ``TrustedRepository/id`` (its trusted metadata is removed with it).
    ///
    /// - Returns: false when this home trusts no key and no repository of that id.
    @discardableResult
    public func untrust(id: String) throws(PackDeliveryError) -> Bool {
        try self.requireOpen()
        if try TrustedRepositories.remove(self.home, id: id) { return true }
        return try self.store.untrust(id: id)
    }

    /// Trusts a TUF repository for this home, from a root the publisher handed over out of band: from then on a
    /// manifest read from under `targetsBaseURL` is checked through TUF, with each of its packs, before anything is
    /// recorded or downloaded (`LoadedManifest.load(_:options:trusting:repositories:now:)`). Trusting the same
    /// metadata URL again starts its trusted metadata over from `root`.
    ///
    /// - Parameters:
    ///   - root: the repository's `root.json`, as published (any version; later ones are walked to by each refresh).
    ///   - metadataURL: where its metadata is.
    ///   - targetsBaseURL: the URL its targets are under; by default `targets/` beside the metadata folder
    ///     (``TrustedRepository/defaultTargetsURL(for:)``).
    /// - Returns: the repository, with its id.
    /// - Throws: `untrustedManifest` when `root` is not TUF root metadata signed by its own root threshold,
    ///   `invalidArgument` for a URL that is not http(s), `fileSystem`.
    @discardableResult
    public func trust(root: Data, metadataURL: URL, targetsBaseURL: URL? = nil) throws(PackDeliveryError) -> TrustedRepository {
        try self.requireOpen()
        return try TrustedRepositories.add(
            self.home, root: root, metadataURL: metadataURL,
            targetsBaseURL: targetsBaseURL ?? TrustedRepository.defaultTargetsURL(for: metadataURL))
    }

    /// The TUF repositories this home trusts (added with ``trust(root:metadataURL:targetsBaseURL:)``).
    ///
    /// - Throws: `unreadableTrustedKey` when one cannot be read (the home then refuses every manifest).
    public func trustedRepositories() throws(PackDeliveryError) -> [TrustedRepository] {
        try self.requireOpen()
        return try TrustedRepositories.list(self.home)
    }

    /// The TUF repositories a home trusts, read without opening a queue.
    ///
    /// - Throws: as ``trustedRepositories()``.
    public static func trustedRepositories(home: Home) throws(PackDeliveryError) -> [TrustedRepository] {
        try TrustedRepositories.list(home)
    }

    private static func records(_ rows: [(id: String, pem: String)]) -> [TrustedPublisherRecord] {
        rows.map { TrustedPublisherRecord(id: $0.id, key: try? PublisherKey(pem: $0.pem)) }
    }

    /// The keys, or `unreadableTrustedKey` naming the first that cannot be read: a home fails closed.
    private static func readable(_ records: [TrustedPublisherRecord]) throws(PackDeliveryError) -> [PublisherKey] {
        if let broken = records.first(where: { $0.key == nil }) {
            let id = PackDeliveryError.printable(broken.id)
            let why =
                broken.id == TrustSnapshot.unknownTrustID
                ? "the state database was rebuilt and the publishers it trusted could not be read back"
                : "its record is not an Ed25519 public key"
            throw PackDeliveryError(
                .unreadableTrustedKey,
                message:
                    "The trusted publisher key '\(id)' of this home cannot be read (\(why)); every manifest is refused until it is repaired.",
                hint: "Remove the key '\(id)' from the publishers this home trusts, then trust the publisher's public key again.",
                subject: broken.id)
        }
        return records.compactMap(\.key)
    }

    /// Refuses a rollback: a signed manifest whose version is lower than the last one this home accepted from
    /// its publisher in its ``Manifest/scope`` (an old manifest replayed, pointing at old content), or equal to it
    /// with other bytes (another manifest signed with the same version), or whose scope is not the one first accepted
    /// from its publisher at the same URL (an older manifest of another scope replayed there). Records its version and
    /// bytes, and pins its scope to its URL on first use, otherwise.
    ///
    /// - Parameter manifest: a manifest loaded with ``LoadedManifest/load(_:options:trusting:now:)-2r9m0``; an unsigned
    ///   one is accepted as it is.
    /// - Throws: `untrustedManifest` for a rollback or a change of scope.
    public func acceptManifest(_ manifest: LoadedManifest) throws(PackDeliveryError) {
        try self.requireOpen()
        guard let keyID = manifest.signedBy, let version = manifest.manifest.version else { return }
        let scope = manifest.manifest.scope ?? ""
        guard
            let conflict = try self.store.acceptManifest(
                version: version, scope: scope, sha256: manifest.sha256, keyID: keyID, url: manifest.pinnedLocation)
        else { return }
        let place = manifest.baseURL.redacted
        let publisher = "the same publisher" + (scope.isEmpty ? "" : " for the scope \(PackDeliveryError.printable(scope))")
        let (why, hint) =
            switch conflict {
            case .rollback(let last):
                (
                    "its version \(version) is lower than version \(last), already accepted from \(publisher) (a rollback)",
                    "Nothing was downloaded; ask the publisher for the current manifest."
                )
            case .otherBytes:
                (
                    "its version \(version) was already accepted from \(publisher) with different content (a manifest changed without a new version, or a replaced one)",
                    "Nothing was downloaded; the publisher must sign each changed manifest with a higher version."
                )
            case .otherScope(let pinned):
                (
                    "it is signed for the scope '\(PackDeliveryError.printable(scope))', but this publisher's manifests at this URL were accepted for the scope '\(PackDeliveryError.printable(pinned))' (an older manifest of another scope replayed, or a scope changed)",
                    "Nothing was downloaded; ask the publisher for the current manifest, signed for the scope '\(PackDeliveryError.printable(pinned))'."
                )
            }
        throw PackDeliveryError(.untrustedManifest, message: "The manifest at \(place) is not trusted: \(why).", hint: hint, subject: place)
    }
}

extension LoadedManifest {
    /// Where the manifest was read from, as a signed manifest's scope is pinned to it: scheme, host, port and path,
    /// without credentials, query or fragment (a token in the query changes; the place does not).
    var pinnedLocation: String {
        let url = self.source ?? self.baseURL
        if url.isFileURL { return "file://" + url.standardizedFileURL.path }
        return Download.origin(url) + (url.path.isEmpty ? "/" : url.path)
    }
}
