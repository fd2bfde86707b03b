import Foundation

/// A client of a repository of The Update Framework (TUF, specification 1.0): it keeps the repository's trusted
/// metadata in a folder, refreshes it by the specification's client workflow, and downloads targets whose length
/// and hashes that metadata vouches for.
///
/// ```swift
/// try TUFUpdater.initialize(metadataFolder: folder, trustedRoot: rootBytes)   // once, with a root from the publisher
/// var updater = TUFUpdater(metadataFolder: folder, metadataURL: metadataURL, targetBaseURL: targetsURL)
/// try updater.refresh()
/// if let target = try updater.targetInfo("packs/forest.zip") {
///     let file = try updater.download(target, into: downloads)
/// }
/// ```
/// Roots are walked version by version (at most 32 per refresh), each signed by the threshold of the old root
/// and of the new one; timestamp, snapshot and targets are checked for signatures, expiry, rollback,
/// mix-and-match, length and hashes; delegated roles are searched in preorder with their path patterns, hash
/// prefixes, succinct hash bins and terminating flags. Key types: ed25519, ecdsa-sha2-nistp256,
/// rsassa-pss-sha256. Every refusal is `untrustedManifest`, naming the role, the version and the rule broken, and
/// the trusted metadata in the folder is only ever replaced by metadata that passed.
///
/// Not `Sendable`-safe to share: use one updater from one task at a time.
public struct TUFUpdater {
    /// A target the verified targets metadata names: its path, length and hashes.
    public struct Target: Sendable, Hashable {
        /// The target's path in the repository (`packs/forest.zip`).
        public let path: String
        /// Its length in bytes.
        public let length: Int
        /// Its hashes by algorithm (`sha256`, `sha512`), hex.
        public let hashes: [String: String]
        /// The role whose metadata names it (`targets`, or a delegated role).
        public var role: String = "targets"
        /// The version of that role's metadata.
        public var roleVersion: Int = 0
    }

    /// The most root versions walked in one refresh.
    public static let maxRootRotations = 32
    /// The most delegated roles visited looking for one target.
    public static let maxDelegations = 32

    private let storage: TUFStorage
    private let targetBaseURL: URL?
    private let clock: @Sendable () -> Date
    private var trusted: TUFTrustedSet?

    /// A client of the repository whose metadata is at `metadataURL`, keeping its trusted metadata in
    /// `metadataFolder` (which must hold a trusted `root.json`; see ``initialize(metadataFolder:trustedRoot:)``).
    ///
    /// - Parameters:
    ///   - metadataFolder: the folder of trusted metadata.
    ///   - metadataURL: where the repository's metadata is (http or https).
    ///   - targetBaseURL: where its targets are, for ``download(_:into:)``.
    ///   - options: timeouts and rate limits of the requests.
    ///   - clock: the time expiry is checked against; by default the system's time as libc's `time()` reads it.
    public init(
        metadataFolder: URL, metadataURL: URL, targetBaseURL: URL? = nil, options: TransferOptions = TransferOptions(),
        clock: @escaping @Sendable () -> Date = { Date(timeIntervalSince1970: TimeInterval(time(nil))) }
    ) {
        self.storage = TUFStorage(folder: metadataFolder, metadataURL: metadataURL, options: options)
        self.targetBaseURL = targetBaseURL
        self.clock = clock
    }

    /// Starts a metadata folder from a root the publisher handed over out of band: stores it, unchecked, as
    /// `root.json`.
    ///
    /// - Throws: `fileSystem` when it cannot be written.
    public static func initialize(metadataFolder: URL, trustedRoot: Data) throws(PackDeliveryError) {
        try Home.makeDirectories(metadataFolder)
        try SmallFile.write(trustedRoot, to: metadataFolder.appending(path: "root.json"))
    }

    /// Brings the trusted root, timestamp, snapshot and top-level targets up to date (client workflow 5.3–5.6).
    ///
    /// - Throws: `untrustedManifest` when the repository's metadata breaks a rule, a network or HTTP error when it
    ///   cannot be fetched, `fileSystem` when the folder cannot be read or written.
    public mutating func refresh() throws(PackDeliveryError) {
        guard let rootData = try self.storage.load("root") else {
            throw TUFRefusal.error("root", "no trusted root.json in the metadata folder")
        }
        var set = try TUFTrustedSet(root: rootData, now: Int(self.clock().timeIntervalSince1970.rounded(.down)))
        try self.loadRoot(&set)
        try self.loadTimestamp(&set)
        try self.loadSnapshot(&set)
        try self.loadTargets(&set, role: "targets", delegator: "root")
        self.trusted = set
    }

    private func loadRoot(_ set: inout TUFTrustedSet) throws(PackDeliveryError) {
        let original = set.root
        defer { self.forgetRotated(from: original, to: set.root) }
        let first = set.root.metadata.version + 1
        for version in first..<(first + Self.maxRootRotations) {
            let data: Data
            do throws(PackDeliveryError) {
                data = try self.storage.fetch("\(version).root.json", role: "root", version: version, limit: TUFStorage.rootMaxLength)
            } catch  where error.httpStatus == 404 || error.httpStatus == 403 {
                return
            }
            try set.updateRoot(data)
            try self.storage.store(data, role: "root")
        }
    }

    /// 5.3.11, fast-forward recovery: when the new root rotated the timestamp keys, the stored timestamp is deleted;
    /// when it rotated the snapshot keys, the stored timestamp and snapshot are. (A stored file the new keys do not
    /// verify is ignored anyway; deleting it keeps a stale one from outliving a refresh that fails later.)
    private func forgetRotated(from original: TUFRoot, to root: TUFRoot) {
        func rotated(_ role: String) -> Bool {
            guard let old = original.roles[role], let new = root.roles[role] else { return false }
            return Set(old.keyIDs) != Set(new.keyIDs) || old.threshold != new.threshold
        }
        let snapshotRotated = rotated("snapshot")
        guard snapshotRotated || rotated("timestamp") else { return }
        unlink(self.storage.localURL("timestamp").path)
        if snapshotRotated { unlink(self.storage.localURL("snapshot").path) }
        try? Durability.syncFolder(self.storage.folder)
    }

    private func loadTimestamp(_ set: inout TUFTrustedSet) throws(PackDeliveryError) {
        // A stored timestamp that no longer verifies (its keys rotated in root) is set aside: fast-forward recovery.
        if let local = try? self.storage.load("timestamp") { _ = try? set.updateTimestamp(local) }
        let data = try self.storage.fetch("timestamp.json", role: "timestamp", version: nil, limit: TUFStorage.timestampMaxLength)
        if try set.updateTimestamp(data) { try self.storage.store(data, role: "timestamp") }
    }

    private func loadSnapshot(_ set: inout TUFTrustedSet) throws(PackDeliveryError) {
        if let local = try? self.storage.load("snapshot") {
            do {
                try set.updateSnapshot(local, trusted: true)
                return
            } catch {}
        }
        guard let meta = set.snapshotMeta else { return }
        let name = set.root.consistentSnapshot ? "\(meta.version).snapshot.json" : "snapshot.json"
        let data = try self.storage.fetch(name, role: "snapshot", version: meta.version, limit: meta.length ?? TUFStorage.snapshotMaxLength)
        try set.updateSnapshot(data, trusted: false)
        try self.storage.store(data, role: "snapshot")
    }

    private func loadTargets(_ set: inout TUFTrustedSet, role: String, delegator: String) throws(PackDeliveryError) {
        if let loaded = set.targets[role] {
            // Reached again through another delegator (a diamond): it must meet this delegator's threshold too,
            // not inherit the authority of the path that loaded it.
            guard set.delegatorVerifies(loaded.metadata, role: role, delegator: delegator) else {
                throw TUFRefusal.error(role, version: loaded.metadata.version, "threshold not met for the role delegated by \(delegator)")
            }
            return
        }
        if let local = try? self.storage.load(role) {
            do {
                try set.updateTargets(local, role: role, delegator: delegator)
                return
            } catch {}
        }
        guard let meta = set.snapshotFiles["\(role).json"] else { throw TUFRefusal.error(role, "the snapshot does not list it") }
        let quoted = TUFStorage.quote(role)
        let name = set.root.consistentSnapshot ? "\(meta.version).\(quoted).json" : "\(quoted).json"
        let data = try self.storage.fetch(name, role: role, version: meta.version, limit: meta.length ?? TUFStorage.targetsMaxLength)
        try set.updateTargets(data, role: role, delegator: delegator)
        try self.storage.store(data, role: role)
    }

    /// The target named `path`, found by walking the delegations in preorder, or nil when no role that may sign
    /// for it names it. Refreshes first when this updater has not.
    ///
    /// - Throws: what ``refresh()`` throws, and `untrustedManifest` when a delegated role's metadata is refused.
    public mutating func targetInfo(_ path: String) throws(PackDeliveryError) -> Target? {
        if self.trusted == nil { try self.refresh() }
        guard var set = self.trusted else { return nil }
        defer { self.trusted = set }
        var toVisit: [(role: String, delegator: String)] = [("targets", "root")]
        var visited = 0
        while visited < Self.maxDelegations, let next = toVisit.popLast() {
            let (role, delegator) = next
            try self.loadTargets(&set, role: role, delegator: delegator)
            guard let targets = set.targets[role] else { return nil }
            if let file = targets.targets[path] {
                return Target(path: path, length: file.length, hashes: file.hashes, role: role, roleVersion: targets.metadata.version)
            }
            visited += 1
            var children: [(role: String, delegator: String)] = []
            for child in targets.roles(for: path) {
                children.append((child.name, role))
                if child.terminating {
                    toVisit.removeAll()
                    break
                }
            }
            toVisit += children.reversed()
        }
        return nil
    }

    /// The version of the trusted metadata of `role` after a refresh (`timestamp`, `snapshot`, `targets`, or a delegated
    /// role already visited), or nil.
    public func trustedVersion(_ role: String) -> Int? {
        guard let set = self.trusted else { return nil }
        switch role {
        case "root": return set.root.metadata.version
        case "timestamp": return set.timestamp?.version
        case "snapshot": return set.snapshot?.version
        default: return set.targets[role]?.metadata.version
        }
    }

    /// The local file of a target in `folder`: its path percent-encoded into one file name.
    public static func localURL(of target: Target, in folder: URL) -> URL {
        folder.appending(path: TUFStorage.quote(target.path))
    }

    /// Downloads a target into `folder` (as ``localURL(of:in:)``), unless a file there already matches it; the
    /// bytes are checked against the target's length and every hash before the file is written.
    ///
    /// - Returns: the file.
    /// - Throws: `untrustedManifest` when the bytes do not match (nothing is written), a network or HTTP error,
    ///   `invalidArgument` when no target base URL was given, `fileSystem`.
    public mutating func download(_ target: Target, into folder: URL) throws(PackDeliveryError) -> URL {
        let local = Self.localURL(of: target, in: folder)
        let file = TUFTargetFile(path: target.path, length: target.length, hashes: target.hashes)
        if let existing = try? SmallFile.read(local.path, limit: target.length, tooLarge: { _ in .init(.fileSystem, message: "") }),
            file.matches(existing)
        {
            return local
        }
        guard let base = self.targetBaseURL else {
            throw PackDeliveryError(
                .invalidArgument, message: "No target base URL was given to download \(PackDeliveryError.printable(target.path)).")
        }
        var name = target.path
        if self.trusted?.root.consistentSnapshot == true, let hash = target.hashes.sorted(by: { $0.key < $1.key }).first?.value {
            let slash = name.lastIndex(of: "/").map { name.index(after: $0) } ?? name.startIndex
            name = String(name[..<slash]) + hash + "." + String(name[slash...])
        }
        var allowed = CharacterSet.urlPathAllowed
        allowed.remove(charactersIn: ";")
        let encoded = name.addingPercentEncoding(withAllowedCharacters: allowed) ?? name
        guard let url = TUFStorage.url(base, appending: encoded) else {
            throw PackDeliveryError(
                .invalidArgument, message: "The target base URL cannot name \(PackDeliveryError.printable(target.path)).")
        }
        let data = try TUFStorage.fetch(
            url, role: "target \(target.path)", version: nil, limit: target.length, options: self.storage.options)
        guard data.count == target.length else {
            throw TUFRefusal.error("target \(target.path)", "length: \(data.count) bytes, \(target.length) expected")
        }
        if let why = TUFTargetFile.hashMismatch(target.hashes, data) { throw TUFRefusal.error("target \(target.path)", why) }
        try Home.makeDirectories(folder)
        try SmallFile.write(data, to: local)
        return local
    }
}

extension TUFTargetFile {
    init(path: String, length: Int, hashes: [String: String]) {
        self.path = path
        self.length = length
        self.hashes = hashes
    }
}
