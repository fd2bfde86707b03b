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
    /// When `role` is the name prefix of the hash bins the top-level targets delegates to (see
    /// ``delegateHashBins(folder:namePrefix:count:targetsKey:binsKey:expires:now:)``), each target goes to its bin and
    /// only the bins that change get a new version.
    ///
    /// - Parameters:
    ///   - folder: the repository folder.
    ///   - files: target paths (`packs/forest.tar`) and the files holding their bytes.
    ///   - role: `targets`, a delegated role, the hash bins' name prefix, or one bin.
    ///   - key: the role's key.
    ///   - days: how many days the new version is valid.
    ///   - now: the time expiry counts from.
    /// - Throws: `invalidArgument` when a file cannot be read, a path is not relative, or `role` names a bin another
    ///   than the path's; `fileSystem`.
    public static func addTargets(
        folder: URL, files: [(path: String, file: URL)], role: String = "targets", key: PublisherSigningKey, expires days: Int = 90,
        now: Date = Date()
    ) throws(PackDeliveryError) {
        let layout = Layout(folder)
        let roles = try Self.roles(of: files.map(\.path), role: role, layout: layout)
        var entries: [String: TUFJSON] = [:]
        for (path, file) in files {
            guard let data = FileManager.default.contents(atPath: file.path) else {
                throw PackDeliveryError(
                    .invalidArgument, message: "Cannot read \(PackDeliveryError.printable(file.path)).", subject: file.path)
            }
            let sha256 = TUFDigest.hex("sha256", of: data) ?? ""
            try layout.writeTarget(path, data, sha256: sha256)
            entries[path] = .object(["length": .integer(data.count), "hashes": .object(["sha256": .string(sha256)])])
        }
        for (name, paths) in Self.grouped(roles) {
            try Self.changeTargets(layout, role: name, key: key, days: days, now: now) { table throws(PackDeliveryError) in
                for path in paths { table[path] = entries[path] }
            }
        }
    }

    /// The role each target path goes to when added to `role` (see ``addTargets(folder:files:role:key:expires:now:)``):
    /// `role` itself, or, when it is the name prefix of the hash bins, each path's bin.
    ///
    /// - Throws: `invalidArgument` when `role` names a bin another than a path's, or the repository cannot be read.
    public static func roles(of paths: [String], role: String = "targets", folder: URL) throws(PackDeliveryError) -> [String: String] {
        try Self.roles(of: paths, role: role, layout: Layout(folder))
    }

    /// Removes targets of `role` (as in ``addTargets(folder:files:role:key:expires:now:)``: a bin prefix sends each
    /// path to its bin) from its next version (the files stay, for clients still on the old snapshot).
    public static func removeTargets(
        folder: URL, paths: [String], role: String = "targets", key: PublisherSigningKey, expires days: Int = 90, now: Date = Date()
    ) throws(PackDeliveryError) {
        let layout = Layout(folder)
        for (name, paths) in Self.grouped(try Self.roles(of: paths, role: role, layout: layout)) {
            try Self.changeTargets(layout, role: name, key: key, days: days, now: now) { table throws(PackDeliveryError) in
                for path in paths where table.removeValue(forKey: path) == nil {
                    throw PackDeliveryError(
                        .invalidArgument, message: "The role \(name) has no target \(PackDeliveryError.printable(path)).", subject: path)
                }
            }
        }
    }

    /// The next version of a targets role, its `targets` table changed by `change`, signed by `key`.
    private static func changeTargets(
        _ layout: Layout, role: String, key: PublisherSigningKey, days: Int, now: Date,
        _ change: (inout [String: TUFJSON]) throws(PackDeliveryError) -> Void
    ) throws(PackDeliveryError) {
        var signed = try layout.state(role)
        var table = signed["targets"]?.objectValue ?? [:]
        try change(&table)
        signed = Self.bumped(signed, expires: now, days: days, ["targets": .object(table)])
        try layout.writeRole(role, try Self.sign(signed, with: [key]), version: signed["version"]?.intValue ?? 1)
    }

    /// The role each path goes to: `role` itself, or, when `role` is the name prefix of the top-level targets' hash
    /// bins, the path's bin (the first `bit_length` bits of the SHA-256 of the path). A bin named for a path of
    /// another bin is refused: clients look for a target in its own bin only.
    private static func roles(of paths: [String], role: String, layout: Layout) throws(PackDeliveryError) -> [String: String] {
        guard role != "targets", let bins = try Self.hashBins(layout), role == bins.namePrefix || bins.contains(role) else {
            return Dictionary(paths.map { ($0, role) }, uniquingKeysWith: { first, _ in first })
        }
        var roles: [String: String] = [:]
        for path in paths {
            let bin = bins.roleName(for: path)
            guard role == bins.namePrefix || role == bin else {
                throw PackDeliveryError(
                    .invalidArgument,
                    message: "The target \(PackDeliveryError.printable(path)) belongs in the hash bin \(bin), not \(role).",
                    hint: "Name the bins' prefix (--role \(bins.namePrefix)) and each target goes to its own bin.", subject: path)
            }
            roles[path] = bin
        }
        return roles
    }

    /// The paths of each role, by role.
    private static func grouped(_ roles: [String: String]) -> [(role: String, paths: [String])] {
        Dictionary(grouping: roles.keys, by: { roles[$0] ?? "" }).map { ($0.key, $0.value.sorted()) }.sorted { $0.role < $1.role }
    }

    /// The succinct hash bins the newest top-level targets delegates to, if any.
    private static func hashBins(_ layout: Layout) throws(PackDeliveryError) -> TUFSuccinctRoles? {
        try layout.state("targets")["delegations"]?["succinct_roles"].flatMap(TUFSuccinctRoles.init)
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
        guard delegations["succinct_roles"] == nil else {
            throw PackDeliveryError(
                .invalidArgument, message: "The top-level targets delegates to hash bins, so it cannot delegate named roles too.",
                hint: "Add the targets to the hash bins (--role with their name prefix).", subject: name)
        }
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

    /// Delegates every target path from the top-level targets to `count` succinct hash bins (TUF 1.0.x
    /// `succinct_roles`: `bit_length` log2 of `count`, `name_prefix`, one key, a threshold of 1), named
    /// `PREFIX-0`…`PREFIX-N` in hex of one width (`bins-000`…`bins-3ff` for 1,024): the top-level targets' next version
    /// (signed by `targetsKey`) and version 1 of every bin (signed by `binsKey`), all written at once, as python-tuf's
    /// example does, so that the snapshot lists each bin a client may look in. A target then goes to the bin of the
    /// first `bit_length` bits of the SHA-256 of its path: pass `namePrefix` as the role of
    /// ``addTargets(folder:files:role:key:expires:now:)``.
    ///
    /// - Parameters:
    ///   - folder: the repository folder.
    ///   - namePrefix: the bins' name prefix (`bins`): the role to add their targets to.
    ///   - count: how many bins: a power of two from 2 to 65,536. The snapshot lists each (≈ 31 bytes a bin) and a
    ///     client downloads the snapshot and the bins it looks in: for 100,000 targets, 1,024 bins of ≈ 100 targets.
    ///   - targetsKey: the top-level targets key.
    ///   - binsKey: the one key of every bin.
    ///   - days: how many days the new versions are valid.
    ///   - now: the time expiry counts from.
    /// - Throws: `invalidArgument` when `count` is not such a power of two, the top-level targets already delegates,
    ///   or `namePrefix` is a top-level role's name; `fileSystem`.
    public static func delegateHashBins(
        folder: URL, namePrefix: String, count: Int, targetsKey: PublisherSigningKey, binsKey: PublisherSigningKey,
        expires days: Int = 90, now: Date = Date()
    ) throws(PackDeliveryError) {
        guard (2...65_536).contains(count), count & (count - 1) == 0 else {
            throw PackDeliveryError(
                .invalidArgument, message: "\(count) hash bins: the number of bins must be a power of two from 2 to 65536.",
                hint: "Pick about one bin per 100 targets (1024 for 100,000).")
        }
        guard !["root", "timestamp", "snapshot", "targets"].contains(namePrefix), !namePrefix.isEmpty else {
            throw PackDeliveryError(.invalidArgument, message: "Hash bins cannot be named \(namePrefix).", subject: namePrefix)
        }
        let layout = Layout(folder)
        var signed = try layout.state("targets")
        if let delegations = signed["delegations"] {
            throw PackDeliveryError(
                .invalidArgument,
                message: "The top-level targets already delegates (\(delegations["succinct_roles"] == nil ? "named roles" : "hash bins")).",
                hint: "Hash bins take every target path: start a new repository, or keep the named roles.", subject: namePrefix)
        }
        let (id, keyJSON) = try Self.keyJSON(binsKey.publicKey)
        let succinct: TUFJSON = .object([
            "keyids": .array([.string(id)]), "threshold": .integer(1), "bit_length": .integer(count.trailingZeroBitCount),
            "name_prefix": .string(namePrefix),
        ])
        guard let bins = TUFSuccinctRoles(succinct) else { preconditionFailure("succinct_roles as TUF defines them") }
        signed = Self.bumped(
            signed, expires: now, days: days, ["delegations": .object(["keys": .object([id: keyJSON]), "succinct_roles": succinct])])
        // The bins first: a repository whose targets names bins always has them.
        let empty = try Self.sign(Self.signed("targets", version: 1, expires: now, days: days, ["targets": .object([:])]), with: [binsKey])
        for bin in 0..<count {
            try layout.writeRole(bins.roleName(bin: bin), empty, version: 1)
        }
        try layout.writeRole("targets", try Self.sign(signed, with: [targetsKey]), version: signed["version"]?.intValue ?? 1)
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
