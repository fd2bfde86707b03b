import Foundation

/// A delegated targets role: who may sign it, and which target paths it may sign for.
struct TUFDelegatedRole: Sendable {
    let name: String
    let role: TUFRole
    let terminating: Bool
    let paths: [String]?
    let pathHashPrefixes: [String]?

    init?(_ json: TUFJSON) {
        guard let name = json["name"]?.stringValue, let role = TUFRole(json), let terminating = json["terminating"]?.boolValue else {
            return nil
        }
        let paths = json["paths"].map { $0.arrayValue?.compactMap(\.stringValue) }
        let prefixes = json["path_hash_prefixes"].map { $0.arrayValue?.compactMap(\.stringValue) }
        // Exactly one of the two, each a list of strings.
        guard (paths == nil) != (prefixes == nil), paths.map({ $0 != nil }) ?? true, prefixes.map({ $0 != nil }) ?? true else {
            return nil
        }
        if let paths = paths ?? nil, paths.count != json["paths"]?.arrayValue?.count { return nil }
        if let prefixes = prefixes ?? nil, prefixes.count != json["path_hash_prefixes"]?.arrayValue?.count { return nil }
        self.name = name
        self.role = role
        self.terminating = terminating
        self.paths = paths ?? nil
        self.pathHashPrefixes = prefixes ?? nil
    }

    /// Whether the target path is delegated to this role.
    func delegates(_ target: String) -> Bool {
        if let paths {
            return paths.contains { TUFPathPattern.matches(pattern: $0, path: target) }
        }
        if let prefixes = self.pathHashPrefixes {
            let hash = TUFDigest.sha256(target).map { String(format: "%02x", $0) }.joined()
            return prefixes.contains { hash.hasPrefix($0) }
        }
        return false
    }
}

/// Succinct hash bins (TAP 15): 2^bitLength roles named `prefix-XX`, all with the same keys and threshold.
struct TUFSuccinctRoles: Sendable {
    let role: TUFRole
    let bitLength: Int
    let namePrefix: String

    init?(_ json: TUFJSON) {
        guard let role = TUFRole(json), let bits = json["bit_length"]?.intValue, (1...32).contains(bits),
            let prefix = json["name_prefix"]?.stringValue
        else { return nil }
        self.role = role
        self.bitLength = bits
        self.namePrefix = prefix
    }

    private var suffixLength: Int { String((1 << self.bitLength) - 1, radix: 16).count }

    /// The bin a target path belongs to.
    func roleName(for target: String) -> String {
        let hash = TUFDigest.sha256(target)
        let first = hash.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        return self.roleName(bin: Int(first >> UInt32(32 - self.bitLength)))
    }

    /// The name of bin number `bin` (`0..<2^bitLength`).
    func roleName(bin: Int) -> String {
        let hex = String(bin, radix: 16)
        return "\(self.namePrefix)-\(String(repeating: "0", count: self.suffixLength - hex.count))\(hex)"
    }

    /// Whether `name` is one of the bins.
    func contains(_ name: String) -> Bool {
        let start = self.namePrefix + "-"
        guard name.hasPrefix(start) else { return false }
        let suffix = name.dropFirst(start.count)
        guard suffix.count == self.suffixLength, let bin = Int(suffix, radix: 16), suffix.allSatisfy(\.isHexDigit) else { return false }
        return bin >= 0 && bin < (1 << self.bitLength)
    }
}

/// Targets metadata (top-level or delegated): its targets and its delegations.
struct TUFTargets: Sendable {
    let metadata: TUFMetadata
    let targets: [String: TUFTargetFile]
    let keys: [String: TUFKey]
    let roles: [TUFDelegatedRole]
    let succinct: TUFSuccinctRoles?

    init(_ metadata: TUFMetadata, role: String) throws(PackDeliveryError) {
        func refuse(_ why: String) -> PackDeliveryError { TUFRefusal.error(role, version: metadata.version, why) }
        guard let table = metadata.signed["targets"]?.objectValue else { throw refuse("it has no targets") }
        var targets: [String: TUFTargetFile] = [:]
        for (path, json) in table {
            guard let file = TUFTargetFile(path: path, json) else {
                throw refuse("the target \(PackDeliveryError.printable(path)) is malformed")
            }
            targets[path] = file
        }
        self.metadata = metadata
        self.targets = targets
        guard let delegations = metadata.signed["delegations"] else {
            self.keys = [:]
            self.roles = []
            self.succinct = nil
            return
        }
        guard let keys = delegations["keys"].flatMap(TUFRoot.keyTable) else { throw refuse("its delegations' keys are malformed") }
        self.keys = keys
        switch (delegations["roles"], delegations["succinct_roles"]) {
        case (let roles?, nil):
            guard let list = roles.arrayValue else { throw refuse("its delegated roles are malformed") }
            var parsed: [TUFDelegatedRole] = []
            for json in list {
                guard let role = TUFDelegatedRole(json), !["root", "timestamp", "snapshot", "targets"].contains(role.name),
                    !parsed.contains(where: { $0.name == role.name })
                else { throw refuse("a delegated role is malformed or named twice") }
                parsed.append(role)
            }
            self.roles = parsed
            self.succinct = nil
        case (nil, let succinct?):
            guard let bins = TUFSuccinctRoles(succinct) else { throw refuse("its succinct_roles are malformed") }
            self.roles = []
            self.succinct = bins
        default:
            throw refuse("its delegations need exactly one of roles and succinct_roles")
        }
    }

    /// The role this metadata delegates as `name` (a named role or a hash bin), if any.
    func delegatedRole(_ name: String) -> TUFRole? {
        if let role = self.roles.first(where: { $0.name == name }) { return role.role }
        if let succinct, succinct.contains(name) { return succinct.role }
        return nil
    }

    /// Whether `metadata` meets the threshold of the role `name` this metadata delegates.
    func verifies(_ metadata: TUFMetadata, as name: String) -> Bool {
        guard let role = self.delegatedRole(name) else { return false }
        return TUFMetadata.verifies(metadata, as: name, keys: self.keys, role: role)
    }

    /// The roles to look in for `target`, in order, with whether each is terminating.
    func roles(for target: String) -> [(name: String, terminating: Bool)] {
        if let succinct { return [(succinct.roleName(for: target), false)] }
        return self.roles.filter { $0.delegates(target) }.map { ($0.name, $0.terminating) }
    }
}

/// TUF's path patterns: the pattern and the path split at `/` must have as many parts, and each part matches as
/// Python's `fnmatch.fnmatchcase` (`*`, `?`, `[seq]`, `[!seq]`).
enum TUFPathPattern {
    static func matches(pattern: String, path: String) -> Bool {
        let patternParts = pattern.split(separator: "/", omittingEmptySubsequences: false)
        let pathParts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard patternParts.count == pathParts.count else { return false }
        return zip(patternParts, pathParts).allSatisfy { Self.fnmatch(Array($0.unicodeScalars), Array($1.unicodeScalars)) }
    }

    private static func fnmatch(_ pattern: [Unicode.Scalar], _ text: [Unicode.Scalar]) -> Bool {
        // Iterative glob with backtracking to the last `*`.
        var p = 0
        var t = 0
        var star: (p: Int, t: Int)?
        while t < text.count {
            if p < pattern.count, pattern[p] == "*" {
                star = (p, t)
                p += 1
                continue
            }
            if p < pattern.count, let next = Self.single(pattern, p, text[t]) {
                p = next
                t += 1
                continue
            }
            guard let saved = star else { return false }
            p = saved.p + 1
            t = saved.t + 1
            star = (saved.p, saved.t + 1)
        }
        while p < pattern.count, pattern[p] == "*" { p += 1 }
        return p == pattern.count
    }

    /// When the pattern element at `p` matches `c`, the index after it.
    private static func single(_ pattern: [Unicode.Scalar], _ p: Int, _ c: Unicode.Scalar) -> Int? {
        switch pattern[p] {
        case "?": return p + 1
        case "[":
            var i = p + 1
            var negate = false
            if i < pattern.count, pattern[i] == "!" {
                negate = true
                i += 1
            }
            var matched = false
            var first = true
            while i < pattern.count, pattern[i] != "]" || first {
                first = false
                if i + 2 < pattern.count, pattern[i + 1] == "-", pattern[i + 2] != "]" {
                    if pattern[i] <= c, c <= pattern[i + 2] { matched = true }
                    i += 3
                } else {
                    if pattern[i] == c { matched = true }
                    i += 1
                }
            }
            // No closing bracket: `[` is literal.
            guard i < pattern.count else { return c == "[" ? p + 1 : nil }
            return matched != negate ? i + 1 : nil
        default:
            return pattern[p] == c ? p + 1 : nil
        }
    }
}
