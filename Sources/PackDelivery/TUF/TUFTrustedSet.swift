import Foundation

/// The metadata a TUF client trusts during one update, and the rules by which each new file joins it: the
/// specification's client workflow (5.3 to 5.6), in the order and with the checks of python-tuf's
/// `TrustedMetadataSet`. Each `update` either adds the file or throws `untrustedManifest` and leaves the set as it
/// was — except where the specification keeps a file that was verified but has since expired or fallen behind
/// (a trusted local timestamp or snapshot), which stays only as the reference for rollback checks.
struct TUFTrustedSet {
    private(set) var root: TUFRoot
    private(set) var timestamp: TUFMetadata?
    private(set) var snapshotMeta: TUFMetaFile?
    private(set) var snapshot: TUFMetadata?
    private(set) var snapshotFiles: [String: TUFMetaFile] = [:]
    private(set) var targets: [String: TUFTargets] = [:]
    /// The reference time of this update (seconds since 1970), read once.
    let now: Int

    /// Starts from a trusted root, which must meet its own root threshold.
    init(root data: Data, now: Int) throws(PackDeliveryError) {
        let metadata = try TUFMetadata(data, type: "root", role: "root")
        let root = try TUFRoot(metadata)
        guard root.verifies(metadata, as: "root") else {
            throw TUFRefusal.error(
                "root", version: metadata.version, "threshold not met: the trusted root is not signed by its own root keys")
        }
        self.root = root
        self.now = now
    }

    /// 5.3: a new root, signed by the threshold of the trusted root and of itself, and exactly one version newer.
    mutating func updateRoot(_ data: Data) throws(PackDeliveryError) {
        precondition(self.timestamp == nil, "root is updated before timestamp")
        let metadata = try TUFMetadata(data, type: "root", role: "root")
        let root = try TUFRoot(metadata)
        guard self.root.verifies(metadata, as: "root") else {
            throw TUFRefusal.error(
                "root", version: metadata.version, "threshold not met: not signed by the root keys of version \(self.root.metadata.version)"
            )
        }
        guard metadata.version == self.root.metadata.version + 1 else {
            throw TUFRefusal.error("root", version: metadata.version, "rollback: version \(self.root.metadata.version + 1) was expected")
        }
        guard root.verifies(metadata, as: "root") else {
            throw TUFRefusal.error("root", version: metadata.version, "threshold not met: not signed by its own root keys")
        }
        self.root = root
    }

    /// 5.4: the timestamp. Returns false when it is the version already trusted (nothing to store).
    mutating func updateTimestamp(_ data: Data) throws(PackDeliveryError) -> Bool {
        precondition(self.snapshot == nil, "timestamp is updated before snapshot")
        guard !self.root.metadata.isExpired(at: self.now) else {
            throw TUFRefusal.error("root", version: self.root.metadata.version, "expired")
        }
        let metadata = try TUFMetadata(data, type: "timestamp", role: "timestamp")
        guard let meta = metadata.signed["meta"]?["snapshot.json"].flatMap(TUFMetaFile.init) else {
            throw TUFRefusal.error("timestamp", version: metadata.version, "it does not describe snapshot.json")
        }
        guard self.root.verifies(metadata, as: "timestamp") else {
            throw TUFRefusal.error("timestamp", version: metadata.version, "threshold not met")
        }
        if let trusted = self.timestamp, let trustedMeta = self.snapshotMeta {
            guard metadata.version >= trusted.version else {
                throw TUFRefusal.error("timestamp", version: metadata.version, "rollback: version \(trusted.version) is trusted")
            }
            if metadata.version == trusted.version {
                try self.checkTimestamp()
                return false
            }
            guard meta.version >= trustedMeta.version else {
                throw TUFRefusal.error(
                    "timestamp", version: metadata.version,
                    "rollback: it names snapshot version \(meta.version), version \(trustedMeta.version) is trusted")
            }
        }
        self.timestamp = metadata
        self.snapshotMeta = meta
        try self.checkTimestamp()
        return true
    }

    private func checkTimestamp() throws(PackDeliveryError) {
        if let timestamp = self.timestamp, timestamp.isExpired(at: self.now) {
            throw TUFRefusal.error("timestamp", version: timestamp.version, "expired")
        }
    }

    /// 5.5: the snapshot. `trusted` for the copy stored locally, whose length and hashes are not checked again.
    mutating func updateSnapshot(_ data: Data, trusted: Bool) throws(PackDeliveryError) {
        guard let meta = self.snapshotMeta, self.targets.isEmpty else { preconditionFailure("snapshot is updated after timestamp") }
        try self.checkTimestamp()
        if !trusted, let why = meta.mismatch(data) { throw TUFRefusal.error("snapshot", version: meta.version, why) }
        let metadata = try TUFMetadata(data, type: "snapshot", role: "snapshot")
        guard let table = metadata.signed["meta"]?.objectValue else {
            throw TUFRefusal.error("snapshot", version: metadata.version, "it has no meta")
        }
        var files: [String: TUFMetaFile] = [:]
        for (name, json) in table {
            guard let file = TUFMetaFile(json) else {
                throw TUFRefusal.error("snapshot", version: metadata.version, "its entry \(PackDeliveryError.printable(name)) is malformed")
            }
            files[name] = file
        }
        guard self.root.verifies(metadata, as: "snapshot") else {
            throw TUFRefusal.error("snapshot", version: metadata.version, "threshold not met")
        }
        if self.snapshot != nil {
            for (name, old) in self.snapshotFiles {
                guard let new = files[name] else {
                    throw TUFRefusal.error(
                        "snapshot", version: metadata.version, "rollback: \(PackDeliveryError.printable(name)) is no longer listed")
                }
                guard new.version >= old.version else {
                    throw TUFRefusal.error(
                        "snapshot", version: metadata.version,
                        "rollback: it names \(PackDeliveryError.printable(name)) version \(new.version), version \(old.version) is trusted")
                }
            }
        }
        self.snapshot = metadata
        self.snapshotFiles = files
        try self.checkSnapshot()
    }

    private func checkSnapshot() throws(PackDeliveryError) {
        guard let snapshot = self.snapshot, let meta = self.snapshotMeta else { return }
        if snapshot.isExpired(at: self.now) { throw TUFRefusal.error("snapshot", version: snapshot.version, "expired") }
        guard snapshot.version == meta.version else {
            throw TUFRefusal.error("snapshot", version: snapshot.version, "mix-and-match: the timestamp names version \(meta.version)")
        }
    }

    /// 5.6: top-level or delegated targets, delegated by `delegator` (root for the top-level targets).
    mutating func updateTargets(_ data: Data, role: String, delegator: String) throws(PackDeliveryError) {
        guard self.snapshot != nil else { preconditionFailure("targets are updated after snapshot") }
        try self.checkTimestamp()
        try self.checkSnapshot()
        guard let meta = self.snapshotFiles["\(role).json"] else {
            throw TUFRefusal.error(role, "the snapshot does not list it")
        }
        if let why = meta.mismatch(data) { throw TUFRefusal.error(role, version: meta.version, why) }
        let metadata = try TUFMetadata(data, type: "targets", role: role)
        let targets = try TUFTargets(metadata, role: role)
        guard self.delegatorVerifies(metadata, role: role, delegator: delegator) else {
            throw TUFRefusal.error(role, version: metadata.version, "threshold not met for the role delegated by \(delegator)")
        }
        guard metadata.version == meta.version else {
            throw TUFRefusal.error(role, version: metadata.version, "mix-and-match: the snapshot names version \(meta.version)")
        }
        guard !metadata.isExpired(at: self.now) else { throw TUFRefusal.error(role, version: metadata.version, "expired") }
        self.targets[role] = targets
    }

    /// Whether `metadata` of `role` meets the threshold `delegator` (root, or loaded targets) sets for it.
    func delegatorVerifies(_ metadata: TUFMetadata, role: String, delegator: String) -> Bool {
        if delegator == "root" { return self.root.verifies(metadata, as: role) }
        guard let parent = self.targets[delegator] else { preconditionFailure("the delegator is loaded first") }
        return parent.verifies(metadata, as: role)
    }
}
