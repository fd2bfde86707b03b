import Foundation

/// A TUF repository a home trusts: where its metadata is, the URL its targets are under, and the folder of its
/// trusted metadata (started from a root the publisher handed over).
///
/// A manifest read from under ``targetsBaseURL`` is a TUF target: before anything is recorded or downloaded, the
/// repository's metadata is refreshed (timestamp, snapshot, targets, delegations), the manifest's bytes must match
/// the target at its path (its URL relative to ``targetsBaseURL``), and each pack's length and SHA-256 must match the
/// target at its own path. See `LoadedManifest.load(_:options:trusting:repositories:now:)`.
public struct TrustedRepository: Sendable, Hashable {
    /// The repository's id (`tuf-` and 16 hex digits of the SHA-256 of its metadata URL): what names it in
    /// ``DownloadQueue/untrust(id:)`` and `packs trust list`.
    public var id: String
    /// Where the repository's metadata (`timestamp.json`, `N.root.json`, …) is.
    public var metadataURL: URL
    /// The URL its targets are under: manifests and packs there are checked through TUF.
    public var targetsBaseURL: URL
    /// The folder of its trusted metadata, in the home's state folder.
    public var metadataFolder: URL

    /// The default targets URL of a metadata URL: `targets/` beside its last folder (`…/metadata/` → `…/targets/`).
    public static func defaultTargetsURL(for metadataURL: URL) -> URL {
        let folder = metadataURL.absoluteString.hasSuffix("/") ? metadataURL : metadataURL.appending(path: "")
        return URL(string: "../targets/", relativeTo: folder)?.absoluteURL ?? folder
    }

    /// The id of the repository whose metadata is at `metadataURL`.
    public static func id(metadataURL: URL) -> String {
        "tuf-" + TUFDigest.sha256(metadataURL.absoluteString).prefix(8).map { String(format: "%02x", $0) }.joined()
    }

    /// The target path of `url` in this repository (percent-decoded, relative to ``targetsBaseURL``; a query, such as
    /// a signed URL's, is not part of it), or nil when it is not under it: another scheme, host, port or path, a
    /// fragment, or a `..` segment.
    public func targetPath(of url: URL) -> String? {
        guard let base = URLComponents(url: self.targetsBaseURL, resolvingAgainstBaseURL: true),
            let other = URLComponents(url: url.absoluteURL, resolvingAgainstBaseURL: true),
            base.scheme?.lowercased() == other.scheme?.lowercased(), base.host?.lowercased() == other.host?.lowercased(),
            base.port == other.port, other.fragment == nil
        else { return nil }
        var prefix = base.percentEncodedPath
        if !prefix.hasSuffix("/") { prefix += "/" }
        let path = other.percentEncodedPath
        guard path.hasPrefix(prefix), path.count > prefix.count else { return nil }
        let relative = String(path.dropFirst(prefix.count))
        guard let decoded = relative.removingPercentEncoding, !decoded.split(separator: "/").contains("..") else { return nil }
        return decoded
    }
}

/// A home's trusted TUF repositories: one folder each in `tuf/` of the state folder, holding `repository.json`
/// (the URLs) and `metadata/` (the trusted metadata, stored as verified). Kept apart from the state database, so a
/// rebuilt database neither forgets them nor their metadata's versions (TUF's rollback marks).
enum TrustedRepositories {
    private struct Record: Codable {
        var metadataURL: String
        var targetsBaseURL: String
    }

    static func folder(_ home: Home) -> URL { home.stateFolder.appending(path: "tuf") }

    /// The repositories `home` trusts, by id.
    static func list(_ home: Home) throws(PackDeliveryError) -> [TrustedRepository] {
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: Self.folder(home).path)) ?? []).sorted()
        var list: [TrustedRepository] = []
        for name in names where name.hasPrefix("tuf-") && !name.contains(".") {
            let folder = Self.folder(home).appending(path: name)
            let file = folder.appending(path: "repository.json")
            // A folder without its record is refused, not skipped: skipping it would stop checking that repository's
            // manifests through TUF (a home trusting nothing else would then take unsigned ones).
            let data = try SmallFile.read(
                file.path, limit: 1 << 20,
                tooLarge: {
                    PackDeliveryError(
                        .unreadableTrustedKey, message: "The record of the trusted TUF repository '\(name)' (\($0)) is too large.",
                        hint: "Remove the repository '\(name)' from what this home trusts, then trust its root again.", subject: name)
                })
            guard let data, let record = try? JSONDecoder().decode(Record.self, from: data), let metadata = URL(string: record.metadataURL),
                let targets = URL(string: record.targetsBaseURL)
            else {
                throw PackDeliveryError(
                    .unreadableTrustedKey,
                    message:
                        "The trusted TUF repository '\(name)' of this home cannot be read; every manifest is refused until it is repaired.",
                    hint: "Remove the repository '\(name)' from what this home trusts, then trust its root again.", subject: name)
            }
            list.append(
                TrustedRepository(
                    id: name, metadataURL: metadata, targetsBaseURL: targets, metadataFolder: folder.appending(path: "metadata")))
        }
        return list
    }

    /// Trusts a repository from its root: checks that the root is TUF root metadata signed by its own threshold, then
    /// stores it (replacing the trusted metadata of the same repository, if any).
    static func add(_ home: Home, root: Data, metadataURL: URL, targetsBaseURL: URL) throws(PackDeliveryError) -> TrustedRepository {
        for url in [metadataURL, targetsBaseURL] {
            guard let scheme = url.scheme?.lowercased(), ["http", "https"].contains(scheme), url.host != nil else {
                throw PackDeliveryError(
                    .invalidArgument, message: "\(url.redacted) is not an http(s) URL.",
                    hint: "Give the repository's metadata and targets URLs.")
            }
        }
        _ = try TUFTrustedSet(root: root, now: 0)
        let id = TrustedRepository.id(metadataURL: metadataURL)
        let folder = Self.folder(home).appending(path: id)
        let repository = TrustedRepository(
            id: id, metadataURL: metadataURL, targetsBaseURL: targetsBaseURL, metadataFolder: folder.appending(path: "metadata"))
        let record = Record(metadataURL: metadataURL.absoluteString, targetsBaseURL: targetsBaseURL.absoluteString)
        let data: Data
        do { data = try JSONEncoder().encode(record) } catch { throw PackDeliveryError(.fileSystem, message: "Cannot encode \(id).") }
        guard FileManager.default.fileExists(atPath: folder.path) else {
            // A new repository is built aside and renamed into place whole: a kill leaves it trusted or not at all.
            let staging = Self.folder(home).appending(path: ".adding-\(id)-\(getpid())")
            try? FileManager.default.removeItem(at: staging)
            defer { try? FileManager.default.removeItem(at: staging) }
            try TUFUpdater.initialize(metadataFolder: staging.appending(path: "metadata"), trustedRoot: root)
            try SmallFile.write(data, to: staging.appending(path: "repository.json"))
            guard rename(staging.path, folder.path) == 0 else { throw .io("rename", path: folder.path, errno: errno) }
            try Durability.syncFolder(Self.folder(home))
            return repository
        }
        // Replaced in place: a kill midway leaves the record without its metadata, which refuses every manifest of the
        // repository until it is trusted again (never a manifest taken unchecked).
        try? FileManager.default.removeItem(at: repository.metadataFolder)
        try TUFUpdater.initialize(metadataFolder: repository.metadataFolder, trustedRoot: root)
        try SmallFile.write(data, to: folder.appending(path: "repository.json"))
        return repository
    }

    /// Stops trusting a repository: removes its folder. Returns false when there is none.
    static func remove(_ home: Home, id: String) throws(PackDeliveryError) -> Bool {
        guard id.hasPrefix("tuf-"), !id.contains("/"), !id.contains(".") else { return false }
        let folder = Self.folder(home).appending(path: id)
        guard FileManager.default.fileExists(atPath: folder.path) else { return false }
        // Renamed away first, so a fetch never sees half a repository.
        let doomed = Self.folder(home).appending(path: ".removed-\(id)-\(getpid())")
        guard rename(folder.path, doomed.path) == 0 else { throw .io("rename", path: folder.path, errno: errno) }
        try? Durability.syncFolder(Self.folder(home))
        try? FileManager.default.removeItem(at: doomed)
        return true
    }
}
