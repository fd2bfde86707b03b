import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Issue 43, "Fail-open security": credentials kept from third-party mirrors, a home that fails closed when a
/// trusted key no longer reads or its store was rebuilt, a replayed manifest of another scope, and a Metalink DTD in
/// UTF-16. The real `packs` binary, real OpenSSL keys, FaultServer origins on two ports, files on disk.
@Suite(.timeLimit(.minutes(3))) struct HostileRoundFourTrustTests {
    /// A publisher key pair made by `packs keygen`: (key path, pub path, id).
    static func publisher(_ label: String) throws -> (key: String, pub: String, id: String) {
        let keys = try Fixtures.temporaryDirectory(label + "-keys")
        let keygen = try Fixtures.run(CLI.binary, ["keygen", keys.appending(path: "publisher").path], timeout: 60)
        #expect(keygen.status == 0, "\(keygen.stderr)")
        let pub = keys.appending(path: "publisher.pub").path
        let id = try PublisherKey(pem: String(contentsOfFile: pub, encoding: .utf8)).id
        return (keys.appending(path: "publisher.key").path, pub, id)
    }

    /// `packs manifest FOLDER --sign KEY EXTRA…`, which must succeed.
    static func sign(_ site: TestSite, _ key: String, _ extra: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let result = try Fixtures.run(CLI.binary, ["manifest", site.folder.path, "--sign", key] + extra, timeout: 60)
        #expect(result.status == 0, "\(result.stderr)", sourceLocation: sourceLocation)
    }

    /// Runs SQL on a home's state database with python's sqlite3 (as a careless operator or a bad disk would).
    static func sql(_ home: URL, _ statement: String, _ arguments: [String] = []) throws {
        let result = try Fixtures.run(
            "/usr/bin/python3",
            [
                "-c",
                "import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1])\ndb.execute(sys.argv[2], sys.argv[3:])\ndb.commit()",
                home.appending(path: "state.sqlite").path, statement,
            ] + arguments, timeout: 30)
        #expect(result.status == 0, "\(result.stderr)")
    }

    static func installed(_ home: URL, _ product: String) -> Bool {
        FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(product)").path)
    }

    // MARK: 1. Credentials and mirrors

    /// The pack's only source is a mirror on another origin (another port): it gets the plain header, and neither
    /// `Authorization`, `Cookie`, `Proxy-Authorization` nor a `--secret-header`; the manifest's origin got them all.
    @Test func credentialHeadersGoToTheManifestsOriginOnly() throws {
        let site = try TestSite.random("r4-headers", size: 256 << 10)
        let origin = try FaultServer(root: site.folder)
        defer { origin.stop() }
        let mirror = try FaultServer(root: site.folder)
        defer { mirror.stop() }
        try site.editManifest { $0.mirrors = [mirror.url("").absoluteString] }
        let home = try Fixtures.temporaryDirectory("r4-headers-home")
        let fetch = try CLI.run(
            home: home,
            [
                "fetch", origin.url("manifest.json").absoluteString, "com.example.big", "--header", "Authorization: Bearer S3CRET",
                "--header", "cookie: session=C00KIE", "--header", "Proxy-Authorization: Basic PR0XY", "--secret-header",
                "X-Api-Key: AP1KEY", "--header", "X-Plain: visible",
            ])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(mirror.bodyBytesSent("big.tar") > 0, "the mirror served the pack: \(mirror.requests())")
        let atMirror = mirror.requests().map(\.headers)
        #expect(!atMirror.isEmpty && atMirror.allSatisfy { $0["x-plain"] == "visible" }, "\(atMirror)")
        for name in ["authorization", "cookie", "proxy-authorization", "x-api-key"] {
            #expect(atMirror.allSatisfy { $0[name] == nil }, "the mirror never sees \(name): \(atMirror)")
        }
        let atOrigin = try #require(origin.requests().first { $0.file == "manifest.json" }?.headers)
        #expect(atOrigin["authorization"] == "Bearer S3CRET" && atOrigin["x-api-key"] == "AP1KEY", "\(atOrigin)")
        for secret in ["S3CRET", "C00KIE", "PR0XY", "AP1KEY"] {
            #expect(!fetch.stderr.contains(secret) && !fetch.stdout.contains(secret))
        }
    }

    // MARK: 2. A trusted key that no longer reads

    /// A trusted key's row turned into garbage, an RSA key or nothing: the home refuses unsigned manifests, Metalink
    /// files and signed ones alike, naming the key and the repair; `trust list` shows it and exits 65; removing it and
    /// trusting the key again repairs the home.
    @Test(arguments: ["garbage", "rsa", "empty"])
    func anUnreadableTrustedKeyFailsClosed(_ damage: String) throws {
        let publisher = try Self.publisher("r4-key-\(damage)")
        let site = try TestSite.samples("r4-key-\(damage)-site")
        let home = try Fixtures.temporaryDirectory("r4-key-\(damage)-home")
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        let pem: String
        switch damage {
        case "garbage": pem = "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n"
        case "rsa":
            let folder = try Fixtures.temporaryDirectory("r4-key-rsa")
            let key = folder.appending(path: "rsa.key").path
            let made = try Fixtures.run(
                "/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", key], timeout: 60)
            #expect(made.status == 0, "\(made.stderr)")
            let pub = try Fixtures.run("/usr/bin/openssl", ["pkey", "-in", key, "-pubout"], timeout: 60)
            #expect(pub.status == 0 && pub.stdout.contains("BEGIN PUBLIC KEY"), "\(pub.stderr)")
            pem = pub.stdout
        default: pem = ""
        }
        try Self.sql(home, "UPDATE trustedPublishers SET pem = ?", [pem])

        let list = try CLI.run(home: home, ["trust", "list"])
        #expect(list.status == 65, "\(list.stdout) \(list.stderr)")
        #expect(list.stdout.contains(publisher.id) && list.stdout.contains("unreadable"), "\(list.stdout)")
        #expect(list.stderr.contains("packs trust remove '\(publisher.id)'"), "\(list.stderr)")

        let unsigned = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(unsigned.status == 65, "\(unsigned.stderr)")
        #expect(
            unsigned.stderr.contains(publisher.id) && unsigned.stderr.contains("cannot be read")
                && unsigned.stderr.contains("packs trust remove"), "\(unsigned.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        let meta4 = site.folder.appending(path: "pack.meta4")
        try """
        <?xml version="1.0" encoding="UTF-8"?>
        <metalink xmlns="urn:ietf:params:xml:ns:metalink"><file name="com.m.x"><size>10</size>\
        <hash type="sha-256">\(String(repeating: "ab", count: 32))</hash><url>http://127.0.0.1:1/x.tar</url></file></metalink>
        """.write(to: meta4, atomically: true, encoding: .utf8)
        let metalink = try CLI.run(home: home, ["fetch", meta4.path, "com.m.x"])
        #expect(metalink.status == 65 && metalink.stderr.contains(publisher.id), "\(metalink.stderr)")
        try Self.sign(site, publisher.key)
        let signed = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(signed.status == 65 && signed.stderr.contains(publisher.id), "every manifest is refused: \(signed.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        // The library refuses by code.
        #expect { try DownloadQueue.trustedPublishers(home: Home(folder: home)) } throws: {
            ($0 as? PackDeliveryError)?.code == .unreadableTrustedKey && ($0 as? PackDeliveryError)?.subject == publisher.id
        }

        // The repair the message names.
        let remove = try CLI.run(home: home, ["trust", "remove", publisher.id])
        #expect(remove.status == 0, "\(remove.stderr)")
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        let listed = try CLI.run(home: home, ["trust", "list"])
        #expect(listed.status == 0 && listed.stdout == publisher.id + "\n", "\(listed.stdout) \(listed.stderr)")
        let repaired = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(repaired.status == 0, "\(repaired.stderr)")
        let missing = try CLI.run(home: home, ["trust", "remove", "0000000000000000"])
        #expect(missing.status == 64 && missing.stderr.contains("trusts no publisher key"), "\(missing.stderr)")
    }

    // MARK: 3. A rebuilt store

    /// Damages the first 4 KiB of a home's `state.sqlite` (its header: the file no longer reads as a database).
    static func damage(_ home: URL) throws {
        let database = home.appending(path: "state.sqlite")
        #expect(!FileManager.default.fileExists(atPath: database.path + "-wal"), "the last process checkpointed its WAL")
        let handle = try FileHandle(forUpdating: database)
        try handle.seek(toOffset: 0)
        try handle.write(contentsOf: Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 37) }))
        try handle.close()
    }

    /// A home that trusts a publisher and accepted its version 2: after 4 KiB of `state.sqlite` are damaged and
    /// `packs status` rebuilds it, the rebuild message says the trust was kept; an unsigned manifest is refused, and
    /// so is the rollback to version 1; version 3 installs.
    /// A trusted TUF repository whose record no longer reads (garbage, or too large to be one) fails closed like a
    /// publisher key, and the hint says how a repository is trusted again: from its root, not from a publisher key.
    @Test(arguments: ["garbage", "huge"])
    func anUnreadableTUFRepositoryRecordFailsClosed(_ damage: String) throws {
        let site = try TestSite.samples("r4-tuf-\(damage)-site")
        let home = try Fixtures.temporaryDirectory("r4-tuf-\(damage)-home")
        let id = "tuf-0123456789abcdef"
        let record = home.appending(path: "tuf/\(id)/repository.json")
        try FileManager.default.createDirectory(at: record.deletingLastPathComponent(), withIntermediateDirectories: true)
        try (damage == "garbage" ? Data("not a record".utf8) : Data(repeating: 0x20, count: 2 << 20)).write(to: record)

        let fetch = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(
            fetch.stderr.contains(id) && fetch.stderr.contains("packs trust remove '\(id)'")
                && fetch.stderr.contains("--repository") && !fetch.stderr.contains("PUBLISHER.pub"), "\(fetch.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        #expect(try CLI.run(home: home, ["trust", "remove", id]).status == 0)
        let unsigned = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(unsigned.status == 0, "trusting nothing again, an unsigned manifest installs: \(unsigned.stderr)")
    }

    @Test func aRebuiltStoreKeepsItsTrust() throws {
        let publisher = try Self.publisher("r4-rebuild")
        let site = try TestSite.samples("r4-rebuild-site")
        let home = try Fixtures.temporaryDirectory("r4-rebuild-home")
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        try Self.sign(site, publisher.key, ["--manifest-version", "2"])
        #expect(try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.atlas"]).status == 0)
        try Self.damage(home)

        let status = try CLI.run(home: home, ["status"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stderr.contains("rebuilt") && status.stderr.contains("trust was kept"), "\(status.stderr)")
        let unsignedSite = try TestSite.samples("r4-rebuild-unsigned")
        let unsigned = try CLI.run(home: home, ["fetch", unsignedSite.manifestURL.path, "com.example.forest"])
        #expect(unsigned.status == 65 && unsigned.stderr.contains("no signature"), "\(unsigned.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        try Self.sign(site, publisher.key, ["--manifest-version", "1"])
        let rollback = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(rollback.status == 65 && rollback.stderr.contains("rollback"), "the mark was kept too: \(rollback.stderr)")
        try Self.sign(site, publisher.key, ["--manifest-version", "3"])
        let newer = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(newer.status == 0, "\(newer.stderr)")
    }

    /// When the trust cannot be read back (`trust.json` gone too), the rebuilt home refuses every manifest until its
    /// trust is set again, and says so.
    @Test func aRebuiltStoreWhoseTrustIsLostRefusesManifests() throws {
        let publisher = try Self.publisher("r4-lost")
        let site = try TestSite.samples("r4-lost-site")
        let home = try Fixtures.temporaryDirectory("r4-lost-home")
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        try FileManager.default.removeItem(at: home.appending(path: "trust.json"))
        try Self.damage(home)
        let status = try CLI.run(home: home, ["status"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(
            status.stderr.contains("trusted could not be read back") && status.stderr.contains("every manifest is refused"),
            "\(status.stderr)")
        let unsigned = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(unsigned.status == 65 && unsigned.stderr.contains(TrustedPublisherRecord.lostTrustID), "\(unsigned.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        #expect(try CLI.run(home: home, ["trust", "remove", TrustedPublisherRecord.lostTrustID]).status == 0)
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        try Self.sign(site, publisher.key)
        let signed = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(signed.status == 0, "\(signed.stderr)")
    }

    // MARK: 4. A replayed manifest of another scope

    /// Version 2 signed for the scope `new` is accepted at a URL; the older version 1 of the same publisher signed for
    /// `msite`, served at the same URL, is refused (the scope is pinned to the URL on first use).
    @Test func anOlderManifestOfAnotherScopeAtTheSameURLIsRefused() throws {
        let publisher = try Self.publisher("r4-scope")
        let site = try TestSite.samples("r4-scope-site")
        let home = try Fixtures.temporaryDirectory("r4-scope-home")
        try Self.sign(site, publisher.key, ["--manifest-version", "2", "--scope", "new"])
        let fetch = ["fetch", site.manifestURL.path, "com.example.forest", "--trust", publisher.pub]
        #expect(try CLI.run(home: home, fetch).status == 0)
        #expect(try CLI.run(home: home, ["remove", "com.example.forest"]).status == 0)
        try FileManager.default.removeItem(at: site.manifestURL)
        try Self.sign(site, publisher.key, ["--manifest-version", "1", "--scope", "msite"])
        let replay = try CLI.run(home: home, fetch)
        #expect(replay.status == 65, "\(replay.stderr)")
        #expect(replay.stderr.contains("'msite'") && replay.stderr.contains("'new'") && replay.stderr.contains("scope"), "\(replay.stderr)")
        #expect(!Self.installed(home, "com.example.forest"))
        // The same scope goes on counting.
        try FileManager.default.removeItem(at: site.manifestURL)
        try Self.sign(site, publisher.key, ["--manifest-version", "3", "--scope", "new"])
        let current = try CLI.run(home: home, fetch)
        #expect(current.status == 0, "\(current.stderr)")
    }

    // MARK: 5. Metalink DTDs in UTF-16

    static func metalink(name: String, prolog: String = "", encoding: String = "UTF-16") -> String {
        """
        <?xml version="1.0" encoding="\(encoding)"?>
        \(prolog)<metalink xmlns="urn:ietf:params:xml:ns:metalink">
          <file name="\(name)"><size>10</size><hash type="sha-256">\(String(repeating: "ab", count: 32))</hash>
            <url priority="1">http://127.0.0.1:1/a.tar</url></file>
        </metalink>
        """
    }

    /// A UTF-16 `.meta4` (little- and big-endian, with and without a BOM) with a DTD that defines the entity its file
    /// name uses is refused, exit 65, saying why; the same file without the DTD reads.
    @Test(arguments: ["LE", "BE", "LE-no-BOM", "BE-no-BOM"])
    func aMetalinkDTDInUTF16IsRefused(_ order: String) throws {
        let folder = try Fixtures.temporaryDirectory("r4-meta4-\(order)")
        let little = order.hasPrefix("LE")
        let bom: [UInt8] = order.hasSuffix("no-BOM") ? [] : little ? [0xFF, 0xFE] : [0xFE, 0xFF]
        func encode(_ text: String) -> Data {
            Data(bom) + text.data(using: little ? .utf16LittleEndian : .utf16BigEndian)!
        }
        let hostile = folder.appending(path: "hostile.meta4")
        try encode(Self.metalink(name: "&n;", prolog: "<!DOCTYPE metalink [<!ENTITY n \"com.m.x\">]>\n")).write(to: hostile)
        let home = try Fixtures.temporaryDirectory("r4-meta4-\(order)-home")
        let fetch = try CLI.run(home: home, ["fetch", hostile.path, "com.m.x"])
        #expect(fetch.status == 65 && fetch.stderr.contains("document type declaration"), "\(fetch.stderr)")
        #expect {
            try LoadedManifest.load(hostile.path)
        } throws: {
            ($0 as? PackDeliveryError)?.code == .invalidManifest
        }
        let plain = folder.appending(path: "plain.meta4")
        try encode(Self.metalink(name: "com.m.x")).write(to: plain)
        let loaded = try LoadedManifest.load(plain.path)
        #expect(loaded.manifest.products.map(\.productIdentifier) == ["com.m.x"])
    }
}
