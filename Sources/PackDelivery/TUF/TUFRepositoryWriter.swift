import Foundation

/// Keeps a TUF repository folder that nginx or a CDN serves, signing with Ed25519 keys made by `packs keygen`
/// (PEM): `metadata/` (`N.root.json` and `root.json`, `timestamp.json`, `N.snapshot.json`, `N.targets.json`,
/// `N.ROLE.json`), `targets/` (each target under its path and, for consistent snapshots, under `HASH.NAME`), and
/// `state/` (the newest version of each targets role and of the snapshot, unversioned, as the next step reads them).
///
/// Each step needs only its own key: ``addTargets(folder:files:role:key:expires:now:)`` and
/// ``removeTargets(folder:paths:role:key:expires:now:)`` the role's key, ``signSnapshot(folder:key:expires:now:)``
/// the snapshot key, ``timestamp(folder:key:expires:now:)`` the online timestamp key alone,
/// ``rotate(folder:role:newKey:rootKeys:expires:now:)`` the root keys. A targets change reaches clients after
/// `signSnapshot` and `timestamp`.
public enum TUFRepositoryWriter {
    /// Creates a repository: root version 1 (consistent snapshots, a threshold of 1 for each role), empty targets,
    /// snapshot and timestamp version 1.
    ///
    /// - Throws: `invalidArgument` when the folder already holds a repository; `fileSystem`.
    public static func initialize(
        folder: URL, root: PublisherSigningKey, timestamp: PublisherSigningKey, snapshot: PublisherSigningKey,
        targets: PublisherSigningKey, now: Date = Date()
    ) throws(PackDeliveryError) {
        let layout = Layout(folder)
        guard !FileManager.default.fileExists(atPath: layout.metadata.appending(path: "1.root.json").path) else {
            throw PackDeliveryError(.invalidArgument, message: "\(folder.path) already holds a TUF repository.", subject: folder.path)
        }
        var keys: [String: TUFJSON] = [:]
        var roles: [String: TUFJSON] = [:]
        for (name, key) in [("root", root), ("timestamp", timestamp), ("snapshot", snapshot), ("targets", targets)] {
            let (id, json) = try Self.keyJSON(key.publicKey)
            keys[id] = json
            roles[name] = .object(["keyids": .array([.string(id)]), "threshold": .integer(1)])
        }
        let rootSigned = Self.signed(
            "root", version: 1, expires: now, days: 365,
            ["keys": .object(keys), "roles": .object(roles), "consistent_snapshot": .bool(true)])
        try layout.makeFolders()
        try Self.writeRoot(layout, try Self.sign(rootSigned, with: [root]), version: 1)
        let targetsSigned = Self.signed("targets", version: 1, expires: now, days: 90, ["targets": .object([:])])
        try layout.writeRole("targets", try Self.sign(targetsSigned, with: [targets]), version: 1)
        try Self.signSnapshot(folder: folder, key: snapshot, now: now)
        try Self.timestamp(folder: folder, key: timestamp, now: now)
    }

    /// Adds (or replaces) targets of `role` (`targets` or a delegated role): each file copied under its path, and its
    /// length and SHA-256 in the role's next version, signed by `key`.
    ///
    /// - Parameters:
    ///   - folder: the repository folder.
    ///   - files: target paths (`packs/forest.tar`) and the files holding their bytes.
    ///   - role: `targets`, or a delegated role.
    ///   - key: the role's key.
    ///   - days: how many days the new version is valid.
    ///   - now: the time expiry counts from.
    public static func addTargets(
        folder: URL, files: [(path: String, file: URL)], role: String = "targets", key: PublisherSigningKey, expires days: Int = 90,
        now: Date = Date()
    ) throws(PackDeliveryError) {
        let layout = Layout(folder)
        var signed = try layout.state(role)
        var table = signed["targets"]?.objectValue ?? [:]
        for (path, file) in files {
            guard let data = FileManager.default.contents(atPath: file.path) else {
                throw PackDeliveryError(
                    .invalidArgument, message: "Cannot read \(PackDeliveryError.printable(file.path)).", subject: file.path)
            }
            let sha256 = TUFDigest.hex("sha256", of: data) ?? ""
            try layout.writeTarget(path, data, sha256: sha256)
            table[path] = .object(["length": .integer(data.count), "hashes": .object(["sha256": .string(sha256)])])
        }
        signed = Self.bumped(signed, expires: now, days: days, ["targets": .object(table)])
        try layout.writeRole(role, try Self.sign(signed, with: [key]), version: signed["version"]?.intValue ?? 1)
    }

    /// Removes targets of `role` from its next version (the files stay, for clients still on the old snapshot).
    public static func removeTargets(
        folder: URL, paths: [String], role: String = "targets", key: PublisherSigningKey, expires days: Int = 90, now: Date = Date()
    ) throws(PackDeliveryError) {
        let layout = Layout(folder)
        var signed = try layout.state(role)
        var table = signed["targets"]?.objectValue ?? [:]
        for path in paths {
            guard table.removeValue(forKey: path) != nil else {
                throw PackDeliveryError(
                    .invalidArgument, message: "The role \(role) has no target \(PackDeliveryError.printable(path)).", subject: path)
            }
        }
        signed = Self.bumped(signed, expires: now, days: days, ["targets": .object(table)])
        try layout.writeRole(role, try Self.sign(signed, with: [key]), version: signed["version"]?.intValue ?? 1)
    }

    /// Delegates the target paths matching `paths` (TUF patterns, `studio/*`) from the top-level targets to a new role
    /// `name` signed by `delegateKey`: targets' next version (signed by `targetsKey`) and the role's version 1.
    public static func delegate(
        folder: URL, name: String, paths: [String], terminating: Bool = false, targetsKey: PublisherSigningKey,
        delegateKey: PublisherSigningKey, expires days: Int = 90, now: Date = Date()
    ) throws(PackDeliveryError) {
        guard !["root", "timestamp", "snapshot", "targets"].contains(name), !name.isEmpty else {
            throw PackDeliveryError(.invalidArgument, message: "A delegated role cannot be named \(name).", subject: name)
        }
        let layout = Layout(folder)
        var signed = try layout.state("targets")
        let (id, keyJSON) = try Self.keyJSON(delegateKey.publicKey)
        var delegations = signed["delegations"]?.objectValue ?? ["keys": .object([:]), "roles": .array([])]
        var keys = delegations["keys"]?.objectValue ?? [:]
        keys[id] = keyJSON
        var roles = (delegations["roles"]?.arrayValue ?? []).filter { $0["name"]?.stringValue != name }
        roles.append(
            .object([
                "name": .string(name), "keyids": .array([.string(id)]), "threshold": .integer(1), "terminating": .bool(terminating),
                "paths": .array(paths.map { .string($0) }),
            ]))
        delegations["keys"] = .object(keys)
        delegations["roles"] = .array(roles)
        signed = Self.bumped(signed, expires: now, days: days, ["delegations": .object(delegations)])
        try layout.writeRole("targets", try Self.sign(signed, with: [targetsKey]), version: signed["version"]?.intValue ?? 1)
        if (try? layout.state(name)) == nil {
            let role = Self.signed("targets", version: 1, expires: now, days: days, ["targets": .object([:])])
            try layout.writeRole(name, try Self.sign(role, with: [delegateKey]), version: 1)
        }
    }

    /// A new snapshot version naming the newest version of every targets role, signed by the snapshot key.
    public static func signSnapshot(folder: URL, key: PublisherSigningKey, expires days: Int = 7, now: Date = Date())
        throws(PackDeliveryError)
    {
        let layout = Layout(folder)
        var meta: [String: TUFJSON] = [:]
        for role in try layout.targetsRoles() {
            let version = try layout.state(role)["version"]?.intValue ?? 1
            meta["\(role).json"] = .object(["version": .integer(version)])
        }
        let previous = try? layout.state("snapshot")
        let signed =
            previous.map { Self.bumped($0, expires: now, days: days, ["meta": .object(meta)]) }
            ?? Self.signed("snapshot", version: 1, expires: now, days: days, ["meta": .object(meta)])
        try layout.writeRole("snapshot", try Self.sign(signed, with: [key]), version: signed["version"]?.intValue ?? 1)
    }

    /// A new timestamp version naming the newest snapshot (its version, length and SHA-256), signed by the online
    /// timestamp key alone: run it from cron well within `days`.
    public static func timestamp(folder: URL, key: PublisherSigningKey, expires days: Int = 1, now: Date = Date()) throws(PackDeliveryError)
    {
        let layout = Layout(folder)
        let snapshot = try layout.read(layout.state.appending(path: "snapshot.json"))
        guard let version = TUFJSON.parse(snapshot)?["signed"]?["version"]?.intValue else {
            throw PackDeliveryError(.invalidArgument, message: "The repository's snapshot cannot be read.", subject: folder.path)
        }
        let meta: TUFJSON = .object([
            "snapshot.json": .object([
                "version": .integer(version), "length": .integer(snapshot.count),
                "hashes": .object(["sha256": .string(TUFDigest.hex("sha256", of: snapshot) ?? "")]),
            ])
        ])
        let file = layout.metadata.appending(path: "timestamp.json")
        let previous = (try? layout.read(file)).flatMap { TUFJSON.parse($0)?["signed"] }
        let signed =
            previous.map { Self.bumped($0, expires: now, days: days, ["meta": meta]) }
            ?? Self.signed("timestamp", version: 1, expires: now, days: days, ["meta": meta])
        try SmallFile.write(try Self.sign(signed, with: [key]), to: file)
    }

    /// A new root version in which `role`'s keys are replaced by `newKey`, signed by `rootKeys` (for the root role:
    /// the old root key and the new one, so that clients walking the chain accept it).
    public static func rotate(
        folder: URL, role: String, newKey: PublisherKey, rootKeys: [PublisherSigningKey], expires days: Int = 365, now: Date = Date()
    ) throws(PackDeliveryError) {
        guard ["root", "timestamp", "snapshot", "targets"].contains(role) else {
            throw PackDeliveryError(
                .invalidArgument, message: "Only root, timestamp, snapshot and targets keys are in root.", subject: role)
        }
        let layout = Layout(folder)
        guard let signed = TUFJSON.parse(try layout.read(layout.metadata.appending(path: "root.json")))?["signed"] else {
            throw PackDeliveryError(.invalidArgument, message: "The repository's root cannot be read.", subject: folder.path)
        }
        var keys = signed["keys"]?.objectValue ?? [:]
        var roles = signed["roles"]?.objectValue ?? [:]
        let old = roles[role]?["keyids"]?.arrayValue?.compactMap(\.stringValue) ?? []
        let (id, keyJSON) = try Self.keyJSON(newKey)
        keys[id] = keyJSON
        roles[role] = .object(["keyids": .array([.string(id)]), "threshold": .integer(1)])
        let stillUsed = Set(roles.values.flatMap { $0["keyids"]?.arrayValue?.compactMap(\.stringValue) ?? [] })
        for keyID in old where !stillUsed.contains(keyID) { keys.removeValue(forKey: keyID) }
        let next = Self.bumped(signed, expires: now, days: days, ["keys": .object(keys), "roles": .object(roles)])
        try Self.writeRoot(layout, try Self.sign(next, with: rootKeys), version: next["version"]?.intValue ?? 1)
    }

    // MARK: Metadata

    private static func keyJSON(_ key: PublisherKey) throws(PackDeliveryError) -> (String, TUFJSON) {
        let body = key.pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        guard let der = Data(base64Encoded: body), der.count == 44 else {
            throw PackDeliveryError(.invalidArgument, message: "The key \(key.id) is not an Ed25519 public key.")
        }
        let hex = der.suffix(32).map { String(format: "%02x", $0) }.joined()
        let json: TUFJSON = .object([
            "keytype": .string("ed25519"), "scheme": .string("ed25519"), "keyval": .object(["public": .string(hex)]),
        ])
        return (TUFDigest.hex("sha256", of: json.canonical ?? Data()) ?? "", json)
    }

    private static func signed(_ type: String, version: Int, expires now: Date, days: Int, _ fields: [String: TUFJSON]) -> TUFJSON {
        var members = fields
        members["_type"] = .string(type)
        members["spec_version"] = .string("1.0.31")
        members["version"] = .integer(version)
        members["expires"] = .string(Self.time(now.addingTimeInterval(TimeInterval(days) * 86_400)))
        return .object(members)
    }

    /// `signed` with its version one higher, a new expiry and `fields` replaced.
    private static func bumped(_ signed: TUFJSON, expires now: Date, days: Int, _ fields: [String: TUFJSON]) -> TUFJSON {
        var members = signed.objectValue ?? [:]
        for (name, value) in fields { members[name] = value }
        members["version"] = .integer((signed["version"]?.intValue ?? 0) + 1)
        members["expires"] = .string(Self.time(now.addingTimeInterval(TimeInterval(days) * 86_400)))
        return .object(members)
    }

    private static func sign(_ signed: TUFJSON, with keys: [PublisherSigningKey]) throws(PackDeliveryError) -> Data {
        guard let bytes = signed.canonical else {
            throw PackDeliveryError(.invalidArgument, message: "Metadata with a fraction cannot be signed.")
        }
        var signatures: [TUFJSON] = []
        for key in keys {
            let (id, _) = try Self.keyJSON(key.publicKey)
            let signature = try key.sign(bytes).map { String(format: "%02x", $0) }.joined()
            signatures.append(.object(["keyid": .string(id), "sig": .string(signature)]))
        }
        return TUFJSON.object(["signatures": .array(signatures), "signed": signed]).canonical ?? Data()
    }

    private static func writeRoot(_ layout: Layout, _ data: Data, version: Int) throws(PackDeliveryError) {
        try SmallFile.write(data, to: layout.metadata.appending(path: "\(version).root.json"))
        try SmallFile.write(data, to: layout.metadata.appending(path: "root.json"))
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`.
    static func time(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
            Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
    }
}

/// The folders of a repository a ``TUFRepositoryWriter`` keeps.
private struct Layout {
    let folder: URL
    var metadata: URL { self.folder.appending(path: "metadata") }
    var targets: URL { self.folder.appending(path: "targets") }
    var state: URL { self.folder.appending(path: "state") }

    init(_ folder: URL) { self.folder = folder }

    func makeFolders() throws(PackDeliveryError) {
        for folder in [self.metadata, self.targets, self.state] { try Home.makeDirectories(folder) }
    }

    func read(_ url: URL) throws(PackDeliveryError) -> Data {
        guard
            let data = try SmallFile.read(
                url.path, limit: 64 << 20, tooLarge: { PackDeliveryError(.invalidArgument, message: "\($0) is too large.") })
        else {
            throw PackDeliveryError(
                .invalidArgument,
                message: "\(url.path) is missing: is \(self.folder.path) a repository folder (metadata, targets and state)?",
                subject: url.path)
        }
        return data
    }

    /// The `signed` part of the newest version of a targets role or the snapshot.
    func state(_ role: String) throws(PackDeliveryError) -> TUFJSON {
        let url = self.state.appending(path: TUFStorage.quote(role) + ".json")
        guard let signed = TUFJSON.parse(try self.read(url))?["signed"] else {
            throw PackDeliveryError(.invalidArgument, message: "\(url.path) is not TUF metadata.", subject: url.path)
        }
        return signed
    }

    /// The targets roles whose newest version is in `state/`, by name.
    func targetsRoles() throws(PackDeliveryError) -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: self.state.path)) ?? []
        return names.filter { $0.hasSuffix(".json") && $0 != "snapshot.json" }.map { String($0.dropLast(5)).removingPercentEncoding ?? "" }
            .sorted()
    }

    func writeRole(_ role: String, _ data: Data, version: Int) throws(PackDeliveryError) {
        let quoted = TUFStorage.quote(role)
        try SmallFile.write(data, to: self.metadata.appending(path: "\(version).\(quoted).json"))
        try SmallFile.write(data, to: self.state.appending(path: "\(quoted).json"))
    }

    /// A target's bytes under its path, and under `HASH.NAME` beside it (consistent snapshots).
    func writeTarget(_ path: String, _ data: Data, sha256: String) throws(PackDeliveryError) {
        guard !path.isEmpty, !path.hasPrefix("/"), !path.split(separator: "/").contains(where: { $0 == ".." || $0 == "." }) else {
            throw PackDeliveryError(
                .invalidArgument, message: "The target path \(PackDeliveryError.printable(path)) is not relative.", subject: path)
        }
        let plain = self.targets.appending(path: path)
        try Home.makeDirectories(plain.deletingLastPathComponent())
        try SmallFile.write(data, to: plain)
        try SmallFile.write(data, to: plain.deletingLastPathComponent().appending(path: "\(sha256).\(plain.lastPathComponent)"))
    }
}
