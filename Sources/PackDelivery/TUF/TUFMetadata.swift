import Foundation

/// A refusal of TUF metadata or of a target: always `untrustedManifest`, naming the role, the version (when known)
/// and the rule broken.
enum TUFRefusal {
    static func error(_ role: String, version: Int? = nil, _ rule: String) -> PackDeliveryError {
        let shownRole = PackDeliveryError.printable(role)
        let which = version.map { "\(shownRole) metadata version \($0)" } ?? "\(shownRole) metadata"
        return PackDeliveryError(
            .untrustedManifest, message: "The TUF \(which) was refused: \(rule).",
            hint: "The repository may be under attack, or was published wrongly; the trusted metadata was kept.", subject: role)
    }
}

/// A role's keys and threshold: `roles` of root, a delegated role, or succinct hash bins.
struct TUFRole: Sendable {
    let keyIDs: [String]
    let threshold: Int

    init?(_ json: TUFJSON) {
        guard let ids = json["keyids"]?.arrayValue, let threshold = json["threshold"]?.intValue, threshold >= 1 else { return nil }
        let keyIDs = ids.compactMap(\.stringValue)
        guard keyIDs.count == ids.count, Set(keyIDs).count == keyIDs.count else { return nil }
        self.keyIDs = keyIDs
        self.threshold = threshold
    }
}

/// `meta` entries of timestamp and snapshot: a metadata file's version, and its length and hashes when given.
struct TUFMetaFile: Sendable {
    let version: Int
    let length: Int?
    let hashes: [String: String]?

    init?(_ json: TUFJSON) {
        guard let version = json["version"]?.intValue, version >= 1 else { return nil }
        self.version = version
        if let length = json["length"] {
            guard let value = length.intValue, value >= 0 else { return nil }
            self.length = value
        } else {
            self.length = nil
        }
        if let hashes = json["hashes"] {
            guard let table = TUFTargetFile.hashTable(hashes) else { return nil }
            self.hashes = table
        } else {
            self.hashes = nil
        }
    }

    /// The rule `data` breaks against this entry's length and hashes, or nil when it matches.
    func mismatch(_ data: Data) -> String? {
        if let length, data.count != length { return "length exceeded or wrong: \(data.count) bytes, \(length) expected" }
        return self.hashes.flatMap { TUFTargetFile.hashMismatch($0, data) }
    }
}

/// One target of targets metadata.
struct TUFTargetFile: Sendable {
    let path: String
    let length: Int
    let hashes: [String: String]

    init?(path: String, _ json: TUFJSON) {
        guard let length = json["length"]?.intValue, length >= 0, let hashes = json["hashes"].flatMap(Self.hashTable) else {
            return nil
        }
        self.path = path
        self.length = length
        self.hashes = hashes
    }

    static func hashTable(_ json: TUFJSON) -> [String: String]? {
        guard let members = json.objectValue, !members.isEmpty else { return nil }
        var table: [String: String] = [:]
        for (name, value) in members {
            guard let hex = value.stringValue else { return nil }
            table[name] = hex
        }
        return table
    }

    /// The rule `data` breaks against `hashes` (every algorithm must be known and match), or nil.
    static func hashMismatch(_ hashes: [String: String], _ data: Data) -> String? {
        for (algorithm, expected) in hashes.sorted(by: { $0.key < $1.key }) {
            guard let actual = TUFDigest.hex(algorithm, of: data) else {
                return "wrong hash: the algorithm \(PackDeliveryError.printable(algorithm)) is not supported"
            }
            guard actual == expected.lowercased() else { return "wrong hash (\(algorithm))" }
        }
        return nil
    }

    /// Whether `data` is this target (length and every hash).
    func matches(_ data: Data) -> Bool { data.count == self.length && Self.hashMismatch(self.hashes, data) == nil }
}

/// One metadata file: its raw bytes as downloaded, its `signed` object and the canonical bytes signatures cover.
struct TUFMetadata: Sendable {
    let raw: Data
    let type: String
    let signed: TUFJSON
    let signedBytes: Data
    /// Signatures by key id (a key id signing twice is refused when reading).
    let signatures: [String: String]
    let version: Int
    /// Seconds since 1970 (UTC).
    let expires: Int

    /// Reads metadata of the role `role` and type `type`; refuses what is not well-formed TUF 1.x metadata.
    init(_ raw: Data, type: String, role: String) throws(PackDeliveryError) {
        func refuse(_ why: String, version: Int? = nil) -> PackDeliveryError { TUFRefusal.error(role, version: version, why) }
        guard let json = TUFJSON.parse(raw), let signed = json["signed"], let list = json["signatures"]?.arrayValue else {
            throw refuse("it is not TUF metadata (JSON with signed and signatures)")
        }
        guard signed["_type"]?.stringValue == type else { throw refuse("its type is not \(type)") }
        guard let version = signed["version"]?.intValue, version >= 1 else { throw refuse("it has no valid version") }
        guard let spec = signed["spec_version"]?.stringValue, Self.supports(spec) else {
            throw refuse("its spec_version is not 1.x", version: version)
        }
        guard let expiresText = signed["expires"]?.stringValue, let expires = Self.parseTime(expiresText) else {
            throw refuse("its expires is not a UTC time (YYYY-MM-DDTHH:MM:SSZ)", version: version)
        }
        guard let signedBytes = signed.canonical else { throw refuse("it holds a number that is not an integer", version: version) }
        var signatures: [String: String] = [:]
        for entry in list {
            guard let keyID = entry["keyid"]?.stringValue, let sig = entry["sig"]?.stringValue else {
                throw refuse("a signature is malformed", version: version)
            }
            guard signatures[keyID] == nil else { throw refuse("key \(PackDeliveryError.printable(keyID)) signs twice", version: version) }
            signatures[keyID] = sig
        }
        self.raw = raw
        self.type = type
        self.signed = signed
        self.signedBytes = signedBytes
        self.signatures = signatures
        self.version = version
        self.expires = expires
    }

    static func supports(_ spec: String) -> Bool {
        let parts = spec.split(separator: ".", omittingEmptySubsequences: false)
        return (2...3).contains(parts.count) && parts[0] == "1" && parts.allSatisfy { !$0.isEmpty && $0.allSatisfy(\.isNumber) }
    }

    /// `YYYY-MM-DDTHH:MM:SSZ` as seconds since 1970.
    static func parseTime(_ text: String) -> Int? {
        let bytes = Array(text.utf8)
        guard bytes.count == 20, bytes[4] == 0x2D, bytes[7] == 0x2D, bytes[10] == 0x54, bytes[13] == 0x3A, bytes[16] == 0x3A,
            bytes[19] == 0x5A
        else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            guard bytes[range].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int(String(decoding: bytes[range], as: UTF8.self))
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
            let minute = number(14..<16), let second = number(17..<19), (1...12).contains(month), (1...31).contains(day),
            hour < 24, minute < 60, second < 60
        else { return nil }
        // Days from civil (Howard Hinnant's algorithm).
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146097 + doe - 719468
        return days * 86400 + hour * 3600 + minute * 60 + second
    }

    /// Whether it has expired at `now` (seconds since 1970): python-tuf's rule, `now >= expires`.
    func isExpired(at now: Int) -> Bool { now >= self.expires }

    /// The keys and the role named `name` a delegator (root or targets) gives, when it delegates to it.
    static func verifies(
        _ metadata: TUFMetadata, as name: String, keys: [String: TUFKey], role: TUFRole
    ) -> Bool {
        var counted: [TUFKey] = []
        for keyID in role.keyIDs {
            guard let key = keys[keyID], let signature = metadata.signatures[keyID], !counted.contains(key) else { continue }
            if key.verifies(signature, of: metadata.signedBytes) { counted.append(key) }
        }
        return counted.count >= role.threshold
    }
}

/// The `signed` part of root metadata.
struct TUFRoot: Sendable {
    let metadata: TUFMetadata
    let keys: [String: TUFKey]
    let roles: [String: TUFRole]
    let consistentSnapshot: Bool

    init(_ metadata: TUFMetadata) throws(PackDeliveryError) {
        let signed = metadata.signed
        guard let keys = signed["keys"].flatMap(Self.keyTable), let roleTable = signed["roles"]?.objectValue else {
            throw TUFRefusal.error("root", version: metadata.version, "its keys or roles are malformed")
        }
        var roles: [String: TUFRole] = [:]
        for name in ["root", "timestamp", "snapshot", "targets"] {
            guard let json = roleTable[name], let role = TUFRole(json) else {
                throw TUFRefusal.error("root", version: metadata.version, "the role \(name) is missing or malformed")
            }
            roles[name] = role
        }
        if let flag = signed["consistent_snapshot"], flag.boolValue == nil {
            throw TUFRefusal.error("root", version: metadata.version, "consistent_snapshot is not a boolean")
        }
        self.metadata = metadata
        self.keys = keys
        self.roles = roles
        self.consistentSnapshot = signed["consistent_snapshot"]?.boolValue ?? false
    }

    static func keyTable(_ json: TUFJSON) -> [String: TUFKey]? {
        guard let members = json.objectValue else { return nil }
        var keys: [String: TUFKey] = [:]
        for (keyID, value) in members {
            guard let key = TUFKey(value) else { return nil }
            keys[keyID] = key
        }
        return keys
    }

    /// Whether `metadata` meets the threshold of this root's role `name` (a top-level role).
    func verifies(_ metadata: TUFMetadata, as name: String) -> Bool {
        guard let role = self.roles[name] else { return false }
        return TUFMetadata.verifies(metadata, as: name, keys: self.keys, role: role)
    }
}
