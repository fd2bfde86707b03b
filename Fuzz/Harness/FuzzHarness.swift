import Foundation
@_spi(Fuzzing) import PackDelivery

#if canImport(Glibc)
    import Glibc
#endif

/// What the fuzz targets and the corpus tests run for one input: the library's entry point on the bytes,
/// in a sandbox of its own, and the checks of what the library promises beyond not crashing.
///
/// Every function takes the input's bytes and returns the problems found (empty when the library kept
/// its promises). A thrown ``PackDeliveryError`` is a fine outcome: that is how bad input is refused.
/// Crashes, hangs and memory blowups are caught by whoever runs these (libFuzzer, or the test's clock).
public enum FuzzHarness {
    /// How one input ended.
    public struct Outcome: Sendable {
        /// Nil when the library accepted the input; else the error it threw.
        public var error: PackDeliveryError?
        /// Broken promises: something written outside the staging folder, an escaping symlink, a file
        /// type a pack may not create. Empty when all is well.
        public var problems: [String]
        /// Why a receipt was refused (``Receipt/Problem``'s raw value); nil when accepted, or not a receipt.
        public var refusal: String? = nil
        public var accepted: Bool { self.error == nil && self.refusal == nil }
    }

    /// Where manifests are said to come from: a server, so pack URLs are checked as for a remote manifest.
    static let manifestBase = URL(string: "https://packs.example.com/catalog/manifest.json")!

    /// `LoadedManifest.decode`, then the URL of every pack it lists, as `fetch` resolves them before downloading.
    public static func manifest(_ data: Data) -> Outcome {
        do {
            let loaded = try LoadedManifest.decode(data, from: Self.manifestBase)
            for product in loaded.manifest.products {
                for content in product.contents { _ = try loaded.packURL(for: content) }
            }
            return Outcome(error: nil, problems: [])
        } catch {
            return Outcome(error: error, problems: [])
        }
    }

    /// `PackInspector.inspect` (as `packs manifest` runs it) on the bytes written to a file.
    public static func inspect(_ data: Data) -> Outcome {
        Self.inSandbox(data) { pack, _ throws(PackDeliveryError) in _ = try FuzzEntry.inspect(pack) }
    }

    /// `Unpacker.unpack` (with `fetch`'s default limits) of the bytes written to a file, into a fresh staging
    /// folder; then checks that nothing was written beside it and that what is inside stays inside.
    public static func unpack(_ data: Data) -> Outcome {
        Self.inSandbox(data) { pack, staging throws(PackDeliveryError) in _ = try FuzzEntry.unpack(pack, into: staging) }
    }

    /// A pack index as a delta update reads it (`FuzzEntry.index`): decoded and range-checked, planned, checked
    /// against the central directory it describes, and its small entries to fetch made into zips of their own and
    /// unpacked into a fresh staging folder; then the same checks of what is beside and inside it.
    public static func index(_ data: Data) -> Outcome {
        var outcome = Self.inSandbox(data) { _, staging throws(PackDeliveryError) in _ = try FuzzEntry.index(data, staging: staging) }
        outcome.problems += FuzzEntry.indexPromisesBroken(data)
        return outcome
    }

    // MARK: Receipts

    /// The time receipts are checked at, so seeds do not expire: 2023-11-14.
    static let receiptNow = Date(timeIntervalSince1970: 1_700_000_000)
    /// Good claims for the header target: forest, valid from `receiptNow` until 2100.
    static let goodClaims =
        #"{"exp":4102444800,"iat":1700000000,"jti":"fuzz","nbf":1700000000,"products":["com.example.forest"],"sub":"fuzz"}"#
    /// A good header for the claims target.
    static let goodHeader = #"{"alg":"EdDSA","typ":"JWT"}"#

    /// An Ed25519 key for signing fuzz inputs, and nothing else. Made once (a one-time allocation, which
    /// `lsan.supp` lets through): parsing it for each input took most of the time of one.
    static let receiptKey = try! PublisherSigningKey(
        pem: "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFAwLZi/E59n0RhIn5KgA7c+IJ0jIo4eYAZrY/tEmLeZ\n-----END PRIVATE KEY-----\n")

    /// `Receipt.verify` of a token whose header is the input, with good claims, properly signed: only the header
    /// decides. Accepted, the header must read (by JSONSerialization) as an object with `alg` `EdDSA` and no `crit`.
    public static func receiptHeader(_ data: Data) -> Outcome {
        let json = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        return Self.receipt(header: data, claims: Data(Self.goodClaims.utf8)) { receipt in
            var problems: [String] = []
            if receipt != nil {
                if json?["alg"] as? String != "EdDSA" { problems.append("accepted a header whose alg is not EdDSA") }
                if json?["crit"] != nil { problems.append("accepted a header with crit") }
            }
            return problems
        }
    }

    /// `Receipt.verify` of a token whose claims are the input, with a good header, properly signed. Accepted, the
    /// receipt must say what JSONSerialization reads in the claims (a repeated claim read two ways differs here).
    public static func receiptClaims(_ data: Data) -> Outcome {
        let json = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        return Self.receipt(header: Data(Self.goodHeader.utf8), claims: data) { receipt in
            guard let receipt else { return [] }
            guard let json else { return ["accepted claims that JSONSerialization does not read as an object"] }
            func seconds(_ key: String) -> Double? { (json[key] as? NSNumber)?.doubleValue }
            var problems: [String] = []
            if json["products"] as? [String] != receipt.products { problems.append("products differ from JSONSerialization's") }
            if json["sub"] as? String != receipt.subject { problems.append("sub differs from JSONSerialization's") }
            if json["jti"] as? String != receipt.id { problems.append("jti differs from JSONSerialization's") }
            if seconds("exp") != receipt.expires.timeIntervalSince1970 { problems.append("exp differs from JSONSerialization's") }
            if seconds("nbf") != receipt.notBefore.timeIntervalSince1970 { problems.append("nbf differs from JSONSerialization's") }
            if seconds("iat") != receipt.issuedAt.timeIntervalSince1970 { problems.append("iat differs from JSONSerialization's") }
            if receipt.expires <= Self.receiptNow { problems.append("accepted an expired receipt") }
            return problems
        }
    }

    /// A Metalink file read as `fetch` reads a `.meta4` manifest. Accepted, none of the ways libxml2 may read its
    /// bytes (UTF-8, UTF-16 and UTF-32 in either byte order, after any byte order mark) shows a document type
    /// declaration or an entity declaration, and it names a product.
    public static func metalink(_ data: Data) -> Outcome {
        let identifiers: [String]
        do { identifiers = try FuzzEntry.metalink(data) } catch { return Outcome(error: error, problems: []) }
        var problems: [String] = []
        let encodings: [String.Encoding] = [.utf8, .utf16LittleEndian, .utf16BigEndian, .utf32LittleEndian, .utf32BigEndian]
        for encoding in encodings {
            for bom in [0, 2, 3, 4] where bom <= data.count {
                guard let text = String(data: data.dropFirst(bom), encoding: encoding) else { continue }
                for marker in ["<!DOCTYPE", "<!ENTITY"] where text.range(of: marker, options: .caseInsensitive) != nil {
                    problems.append("accepted a Metalink file with \(marker) read as \(encoding)")
                }
            }
        }
        if identifiers.isEmpty { problems.append("accepted a Metalink file that names no product") }
        return Outcome(error: nil, problems: problems)
    }

    /// Signs `header.claims` (base64url) with ``receiptKey``, verifies it at ``receiptNow``, and checks the result
    /// with `promises`, given the receipt when accepted.
    private static func receipt(header: Data, claims: Data, promises: (Receipt?) -> [String]) -> Outcome {
        func base64URL(_ data: Data) -> String {
            data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }
        let key = Self.receiptKey
        let input = base64URL(header) + "." + base64URL(claims)
        guard let signature = try? key.sign(Data(input.utf8)) else { return Outcome(error: nil, problems: ["cannot sign"]) }
        switch Receipt.verify(input + "." + base64URL(signature), keys: [key.publicKey], now: Self.receiptNow) {
        case .success(let receipt):
            return Outcome(error: nil, problems: promises(receipt))
        case .failure(let refusal):
            var problems = promises(nil)
            if refusal.problem == .signature { problems.append("a properly signed token failed its signature check") }
            return Outcome(error: nil, problems: problems, refusal: refusal.problem.rawValue)
        }
    }

    // MARK: The sandbox

    /// What `sentinel/keep` holds. (Made per call: a global `Data` initialised once is reported by
    /// LeakSanitizer, which cannot see references stored with Swift's enum tag bits.)
    static var sentinelText: Data { Data("the unpacker must never touch this\n".utf8) }

    /// Runs `body` in a fresh folder holding `pack` (the bytes), `staging/` (empty, 0700) and `sentinel/keep`,
    /// checks that the folder still holds exactly that afterwards, and removes it.
    private static func inSandbox(_ data: Data, _ body: (URL, URL) throws(PackDeliveryError) -> Void) -> Outcome {
        var template = Array((NSTemporaryDirectory() + "/packs-fuzz-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else {
            return Outcome(error: nil, problems: ["cannot create a sandbox: errno \(errno)"])
        }
        let root = URL(filePath: String(cString: made), directoryHint: .isDirectory)
        defer { try? FileManager.default.removeItem(at: root) }
        let pack = root.appending(path: "pack")
        let staging = root.appending(path: "staging")
        let sentinel = root.appending(path: "sentinel")
        do {
            try data.write(to: pack)
            try FileManager.default.createDirectory(at: sentinel, withIntermediateDirectories: false)
            try Self.sentinelText.write(to: sentinel.appending(path: "keep"))
        } catch {
            return Outcome(error: nil, problems: ["cannot fill the sandbox: \(error)"])
        }
        guard mkdir(staging.path, 0o700) == 0 else {
            return Outcome(error: nil, problems: ["cannot create the staging folder: errno \(errno)"])
        }

        var outcome = Outcome(error: nil, problems: [])
        do {
            try body(pack, staging)
        } catch {
            outcome.error = error
        }
        outcome.problems = Self.check(root: root, pack: pack, data: data, staging: staging, sentinel: sentinel)
        return outcome
    }

    /// The sandbox's promises: nothing added, removed or changed beside the staging folder; the staging
    /// folder still a real folder; inside it only folders, files and symlinks that resolve inside it.
    private static func check(root: URL, pack: URL, data: Data, staging: URL, sentinel: URL) -> [String] {
        var problems: [String] = []
        let names = Set(Self.list(Array(root.path.utf8)) ?? [])
        if names != [Array("pack".utf8), Array("staging".utf8), Array("sentinel".utf8)] {
            let shown = names.map { String(decoding: $0, as: UTF8.self) }.sorted()
            problems.append("the staging folder's parent now holds \(shown), not [pack, sentinel, staging]")
        }
        if Self.list(Array(sentinel.path.utf8)) != [Array("keep".utf8)]
            || Self.contents(of: sentinel.appending(path: "keep").path) != Self.sentinelText
        {
            problems.append("the sentinel folder beside the staging folder changed")
        }
        if Self.contents(of: pack.path) != data {
            problems.append("the pack itself changed")
        }
        let stagingPath = Array(staging.path.utf8)
        guard Self.fileType(stagingPath) == S_IFDIR else {
            problems.append("the staging folder is no longer a folder")
            return problems
        }
        problems += Self.checkTree(stagingPath, relative: [])
        return problems
    }

    /// Walks a folder without following symlinks: every item is a folder, a regular file or a symlink that,
    /// followed the way the kernel follows it, stays inside the staging folder. Names are bytes: a pack's
    /// names need not be UTF-8.
    private static func checkTree(_ staging: [UInt8], relative: [[UInt8]]) -> [String] {
        let path = Self.join(staging, relative)
        guard let names = Self.list(path) else { return ["cannot list \(Self.shown(path))"] }
        var problems: [String] = []
        for name in names {
            let item = relative + [name]
            let itemPath = Self.join(staging, item)
            switch Self.fileType(itemPath) {
            case S_IFDIR:
                problems += Self.checkTree(staging, relative: item)
            case S_IFREG:
                break
            case S_IFLNK:
                if Self.leavesFolder(staging, link: item) {
                    problems.append(
                        "the symlink \(Self.shown(Self.join([], item))) -> \(Self.shown(Self.readLink(itemPath) ?? [])) leads outside the staging folder"
                    )
                }
            case nil:
                problems.append("cannot lstat \(Self.shown(Self.join([], item)))")
            case let type?:
                problems.append("\(Self.shown(Self.join([], item))) has file type \(String(type, radix: 8)), not a folder, file or symlink")
            }
        }
        return problems
    }

    /// Whether following the symlink `link` (components below `staging`) leaves `staging`: its target is
    /// resolved component by component, following the symlinks it meets inside the staging folder as the
    /// kernel would, so a `..` after a symlink counts from where that symlink leads. A missing component is
    /// taken as a folder (the kernel would stop there; so this errs towards reporting). Loops do not escape.
    static func leavesFolder(_ staging: [UInt8], link: [[UInt8]]) -> Bool {
        let slash = UInt8(ascii: "/")
        let dot = UInt8(ascii: ".")
        var folder = Array(link.dropLast())  // real folders only: `..` from here is the parent on disk too
        var pending: [[UInt8]] = []
        var hops = 0
        func follow(_ item: [[UInt8]]) -> Bool {  // queues a symlink's target; false for an absolute or empty one
            guard let target = Self.readLink(Self.join(staging, item)), target.first != nil, target.first != slash else { return false }
            pending.insert(contentsOf: target.split(separator: slash).map(Array.init), at: 0)
            return true
        }
        guard follow(link) else { return true }
        while !pending.isEmpty {
            let part = pending.removeFirst()
            if part == [dot] { continue }
            if part == [dot, dot] {
                if folder.isEmpty { return true }
                folder.removeLast()
                continue
            }
            let next = folder + [part]
            if Self.fileType(Self.join(staging, next)) == S_IFLNK {
                hops += 1
                if hops > 40 { return false }  // ELOOP: the kernel gives up without leaving
                if !follow(next) { return true }
            } else {
                folder = next
            }
        }
        return false
    }

    // MARK: Files by their bytes

    /// A file's bytes, or nil. (Not `Data(contentsOf:)`: Foundation 6.3.1 leaks 4 KiB reading an empty file,
    /// which LeakSanitizer would report as the fuzz input's fault.)
    static func contents(of path: String) -> Data? {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let got = read(fd, &buffer, buffer.count)
            if got < 0, errno == EINTR { continue }
            guard got >= 0 else { return nil }
            if got == 0 { return data }
            data.append(contentsOf: buffer[0..<got])
        }
    }

    /// The names in a folder (without `.` and `..`), or nil when it cannot be listed.
    static func list(_ path: [UInt8]) -> [[UInt8]]? {
        guard let directory = Self.withCPath(path, { opendir($0) }) else { return nil }
        defer { closedir(directory) }
        var names: [[UInt8]] = []
        while let item = readdir(directory) {
            let name = withUnsafeBytes(of: item.pointee.d_name) { Array($0.prefix { $0 != 0 }) }
            if name != Array(".".utf8), name != Array("..".utf8) { names.append(name) }
        }
        return names
    }

    /// `lstat`'s file type (`S_IFDIR`, `S_IFLNK`, …), or nil.
    static func fileType(_ path: [UInt8]) -> mode_t? {
        var info = stat()
        guard Self.withCPath(path, { lstat($0, &info) }) == 0 else { return nil }
        return info.st_mode & S_IFMT
    }

    static func readLink(_ path: [UInt8]) -> [UInt8]? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = Self.withCPath(path) { cPath in buffer.withUnsafeMutableBufferPointer { readlink(cPath, $0.baseAddress!, $0.count) } }
        return count < 0 ? nil : buffer[0..<count].map { UInt8(bitPattern: $0) }
    }

    static func join(_ base: [UInt8], _ components: [[UInt8]]) -> [UInt8] {
        var path = base
        for component in components {
            if !path.isEmpty { path.append(UInt8(ascii: "/")) }
            path += component
        }
        return path
    }

    static func shown(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    static func withCPath<R>(_ path: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        (path + [0]).withUnsafeBufferPointer { $0.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) } }
    }
}
