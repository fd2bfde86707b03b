import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// A client that trusts a publisher refuses (exit 65, nothing downloaded, the
/// reason named) a manifest with no signature or a bad one, an expired one, and a rollback to a lower version.
/// The real `packs` binary, real OpenSSL Ed25519 keys, manifests read from disk.
@Suite(.timeLimit(.minutes(2))) struct SignedManifestTests {
    /// A site of the sample packs, a publisher key pair made by `packs keygen`, and an empty home.
    struct Signed {
        let site: TestSite
        let keys: URL
        let home: URL
        var key: String { self.keys.appending(path: "publisher.key").path }
        var pub: String { self.keys.appending(path: "publisher.pub").path }
        var manifest: String { self.site.manifestURL.path }

        init(_ label: String) throws {
            self.site = try TestSite.samples(label + "-site")
            self.keys = try Fixtures.temporaryDirectory(label + "-keys")
            self.home = try Fixtures.temporaryDirectory(label + "-home")
            let keygen = try Self.tool(["keygen", self.keys.appending(path: "publisher").path])
            #expect(keygen.status == 0, "\(keygen.stderr)")
        }

        /// `packs ARGS…` for the commands that take no home (keygen, manifest).
        static func tool(_ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
            try Fixtures.run(CLI.binary, arguments, timeout: 60)
        }

        func sign(_ extra: [String] = []) throws {
            let result = try Self.tool(["manifest", self.site.folder.path, "--sign", self.key] + extra)
            #expect(result.status == 0, "\(result.stderr)")
        }

        func fetch(_ extra: [String] = []) throws -> CLI.Result {
            try CLI.run(home: self.home, ["fetch", self.manifest, "com.example.forest"] + extra)
        }

        /// Nothing was recorded or installed.
        func expectNothingDownloaded(sourceLocation: SourceLocation = #_sourceLocation) throws {
            #expect(
                !FileManager.default.fileExists(atPath: self.home.appending(path: "Caches/com.example.forest").path),
                sourceLocation: sourceLocation)
            let status = try CLI.run(home: self.home, ["--json", "status"])
            #expect(status.stdout.contains(#"{"transactions":[]}"#), "\(status.stdout)", sourceLocation: sourceLocation)
        }
    }

    @Test func theKeysAreEd25519InPEMAndThePrivateOneIsPrivate() throws {
        let signed = try Signed("sig-keys")
        let attributes = try FileManager.default.attributesOfItem(atPath: signed.key)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        #expect(try String(contentsOfFile: signed.key, encoding: .utf8).hasPrefix("-----BEGIN PRIVATE KEY-----"))
        #expect(try String(contentsOfFile: signed.pub, encoding: .utf8).hasPrefix("-----BEGIN PUBLIC KEY-----"))
        // OpenSSL's own tool reads them as Ed25519.
        let openssl = try Fixtures.run("/usr/bin/openssl", ["pkey", "-in", signed.key, "-noout", "-text"], timeout: 20)
        #expect(openssl.status != 0 || openssl.stdout.contains("ED25519"), "\(openssl.stdout)")
        // An existing key is never overwritten.
        let again = try Signed.tool(["keygen", signed.keys.appending(path: "publisher").path])
        #expect(again.status == 64 && again.stderr.contains("never overwritten"), "\(again.stderr)")
    }

    @Test func aSignedManifestFromATrustedPublisherInstalls() throws {
        let signed = try Signed("sig-ok")
        try signed.sign(["--expires", "30d"])
        let manifest = try JSONSerialization.jsonObject(with: Data(contentsOf: signed.site.manifestURL)) as? [String: Any]
        #expect(manifest?["version"] as? Int == 1 && manifest?["expires"] is String)
        let fetch = try signed.fetch(["--trust", signed.pub])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(FileManager.default.fileExists(atPath: signed.home.appending(path: "Caches/com.example.forest/ContentInfo.plist").path))
    }

    @Test func oneChangedByteIsRefused() throws {
        let signed = try Signed("sig-tampered")
        try signed.sign()
        var bytes = try Data(contentsOf: signed.site.manifestURL)
        let index = try #require(bytes.firstIndex(of: UInt8(ascii: "1")))  // the version, 1 → 2
        bytes[index] = UInt8(ascii: "2")
        try bytes.write(to: signed.site.manifestURL)
        let fetch = try signed.fetch(["--trust", signed.pub])
        #expect(fetch.status == 65 && fetch.stderr.contains("does not match"), "\(fetch.stderr)")
        try signed.expectNothingDownloaded()
    }

    @Test func aMissingSignatureOrAnotherPublishersIsRefused() throws {
        let signed = try Signed("sig-missing")
        try signed.sign()
        // Signed by a key the client does not trust.
        let other = try Signed("sig-other")
        let otherTrust = try signed.fetch(["--trust", other.pub])
        #expect(otherTrust.status == 65 && otherTrust.stderr.contains("not trusted"), "\(otherTrust.stderr)")
        // No signature at all.
        try FileManager.default.removeItem(at: signed.site.folder.appending(path: "manifest.json.sig"))
        let fetch = try signed.fetch(["--trust", signed.pub])
        #expect(fetch.status == 65 && fetch.stderr.contains("no signature"), "\(fetch.stderr)")
        try signed.expectNothingDownloaded()
    }

    @Test func anExpiredManifestIsRefused() throws {
        let signed = try Signed("sig-expired")
        let key = try PublisherSigningKey(pem: String(contentsOfFile: signed.key, encoding: .utf8))
        try ManifestBuilder.write(folder: signed.site.folder, signing: key, expires: Date().addingTimeInterval(-60))
        let fetch = try signed.fetch(["--trust", signed.pub])
        #expect(fetch.status == 65 && fetch.stderr.contains("expired"), "\(fetch.stderr)")
        try signed.expectNothingDownloaded()
        // The library says the same by code, and a manifest still valid now is refused once its time has passed.
        try signed.sign(["--expires", "1h"])
        let publisher = try PublisherKey(pem: String(contentsOfFile: signed.pub, encoding: .utf8))
        #expect(try LoadedManifest.load(signed.manifest, trusting: [publisher]).signedBy == publisher.id)
        #expect { try LoadedManifest.load(signed.manifest, trusting: [publisher], now: Date().addingTimeInterval(7_200)) } throws: {
            ($0 as? PackDeliveryError)?.code == .untrustedManifest
        }
    }

    @Test func aRollbackToALowerVersionIsRefused() throws {
        let signed = try Signed("sig-rollback")
        try signed.sign(["--manifest-version", "2"])
        #expect(try signed.fetch(["--trust", signed.pub]).status == 0)
        try signed.sign(["--manifest-version", "1"])
        let site = try CLI.run(home: signed.home, ["remove", "com.example.forest"])
        #expect(site.status == 0, "\(site.stderr)")
        let fetch = try signed.fetch(["--trust", signed.pub])
        #expect(fetch.status == 65 && fetch.stderr.contains("rollback"), "\(fetch.stderr)")
        try signed.expectNothingDownloaded()
        // The same version again is no rollback; a higher one is accepted.
        try signed.sign(["--manifest-version", "3"])
        #expect(try signed.fetch(["--trust", signed.pub]).status == 0)
    }

    @Test func aTrustedPublisherOfTheHomeMakesEveryFetchNeedItsSignature() throws {
        let signed = try Signed("sig-home")
        let trust = try CLI.run(home: signed.home, ["trust", "add", signed.pub])
        #expect(trust.status == 0, "\(trust.stderr)")
        // Unsigned: refused without any --trust on the command line.
        let unsigned = try signed.fetch()
        #expect(unsigned.status == 65 && unsigned.stderr.contains("no signature"), "\(unsigned.stderr)")
        try signed.expectNothingDownloaded()
        try signed.sign()
        let fetch = try signed.fetch()
        #expect(fetch.status == 0, "\(fetch.stderr)")
    }

    /// A publisher's key pair made by `packs keygen` in a folder of its own: (key path, pub path, public key).
    static func publisher(_ label: String) throws -> (key: String, pub: String, publicKey: PublisherKey) {
        let keys = try Fixtures.temporaryDirectory(label + "-keys")
        let keygen = try Signed.tool(["keygen", keys.appending(path: "publisher").path])
        #expect(keygen.status == 0, "\(keygen.stderr)")
        let pub = keys.appending(path: "publisher.pub").path
        return (keys.appending(path: "publisher.key").path, pub, try PublisherKey(pem: String(contentsOfFile: pub, encoding: .utf8)))
    }

    /// `packs manifest FOLDER --sign KEY EXTRA…`, which must succeed.
    static func sign(_ site: TestSite, _ key: String, _ extra: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let result = try Signed.tool(["manifest", site.folder.path, "--sign", key] + extra)
        #expect(result.status == 0, "\(result.stderr)", sourceLocation: sourceLocation)
    }

    /// The installed version of `product` in `home`, and its data file's SHA-256.
    static func installed(_ home: URL, _ product: String) throws -> (version: String?, sha256: String?) {
        let event = try CLI.run(home: home, ["--json", "content", product]).events.first
        guard let version = event?["contentVersion"] as? String, let folder = event?["contentURL"] as? String else { return (nil, nil) }
        return (version, try? Fixtures.sha256Hex(of: URL(filePath: folder).appending(path: "Contents/data.bin")))
    }

    @Test func perProductManifestsOfOnePublisherKeepVersionsOfTheirOwn() throws {
        let publisher = try Self.publisher("sig-scope")
        let x = try TestSite.random("sig-scope-x", product: "com.example.x", size: 64 << 10)
        let y = try TestSite.random("sig-scope-y", product: "com.example.y", size: 64 << 10)
        let home = try Fixtures.temporaryDirectory("sig-scope-home")
        func fetch(_ site: TestSite, _ product: String) throws -> CLI.Result {
            try CLI.run(home: home, ["fetch", site.manifestURL.path, product, "--trust", publisher.pub])
        }
        try Self.sign(x, publisher.key, ["--manifest-version", "4"])
        try Self.sign(y, publisher.key)
        // Each folder's manifest names what its versions count: its one product, by default.
        #expect(try x.manifest().scope == "com.example.x" && y.manifest().scope == "com.example.y")
        #expect(try y.manifest().version == 1)
        #expect(try fetch(x, "com.example.x").status == 0)
        let other = try fetch(y, "com.example.y")
        #expect(other.status == 0, "product y's version 1 is no rollback of product x's version 4: \(other.stderr)")
        #expect(try Self.installed(home, "com.example.y").sha256 == y.dataSHA256)

        // Within a scope, a rollback is still refused, and the other scope's mark is untouched.
        try Self.sign(y, publisher.key, ["--manifest-version", "2"])
        #expect(try fetch(y, "com.example.y").status == 0)
        try Self.sign(y, publisher.key, ["--manifest-version", "1"])
        let rollback = try fetch(y, "com.example.y")
        #expect(
            rollback.status == 65 && rollback.stderr.contains("rollback") && rollback.stderr.contains("com.example.y"), "\(rollback.stderr)"
        )
        try Self.sign(x, publisher.key, ["--manifest-version", "3"])
        let rollbackX = try fetch(x, "com.example.x")
        #expect(rollbackX.status == 65 && rollbackX.stderr.contains("version 4"), "\(rollbackX.stderr)")
        // A scope is part of the signed bytes: moving a manifest into another scope breaks its signature.
        let bytes = try String(contentsOf: x.manifestURL, encoding: .utf8)
            .replacingOccurrences(of: #""scope" : "com.example.x""#, with: #""scope" : "com.example.z""#)
        try #require(bytes.contains("com.example.z"))
        try bytes.write(to: x.manifestURL, atomically: true, encoding: .utf8)
        let moved = try fetch(x, "com.example.x")
        #expect(moved.status == 65 && moved.stderr.contains("does not match"), "\(moved.stderr)")
    }

    @Test func anEqualVersionIsAcceptedOnlyWithTheSameBytes() throws {
        let publisher = try Self.publisher("sig-equal")
        let new = try TestSite.random("sig-equal-new", version: "2.0", size: 64 << 10)
        let old = try TestSite.random("sig-equal-old", version: "1.0", size: 48 << 10)
        try Self.sign(new, publisher.key, ["--manifest-version", "5"])
        try Self.sign(old, publisher.key, ["--manifest-version", "5"])
        let home = try Fixtures.temporaryDirectory("sig-equal-home")
        func fetch(_ site: TestSite) throws -> CLI.Result {
            try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.big", "--trust", publisher.pub])
        }
        #expect(try fetch(new).status == 0)
        #expect(try Self.installed(home, "com.example.big").version == "2.0")
        // The same manifest again is fine (a second device, a retry).
        #expect(try fetch(new).status == 0)
        // Another manifest signed with the same version, offering the older content, is refused.
        let replaced = try fetch(old)
        #expect(
            replaced.status == 65 && replaced.stderr.contains("version 5") && replaced.stderr.contains("different"),
            "\(replaced.stderr)")
        let installed = try Self.installed(home, "com.example.big")
        #expect(installed.version == "2.0" && installed.sha256 == new.dataSHA256, "the installed content stays")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "nothing was recorded: \(status.stdout)")
        // The library refuses it by code.
        let queue = try DownloadQueue(home: Home(folder: home))
        defer { queue.close() }
        #expect { try queue.acceptManifest(try LoadedManifest.load(old.manifestURL.path, trusting: [publisher.publicKey])) } throws: {
            ($0 as? PackDeliveryError)?.code == .untrustedManifest
        }
    }

    @Test func aHomeThatTrustedAPublisherBeforeScopesKeepsItsMark() throws {
        let publisher = try Self.publisher("sig-migrate")
        let site = try TestSite.random("sig-migrate-site", version: "2.0", size: 64 << 10)
        let home = try Fixtures.temporaryDirectory("sig-migrate-home")
        #expect(try CLI.run(home: home, ["trust", "add", publisher.pub]).status == 0)
        // The home as a release before scopes left it: version 4 accepted from this publisher, one mark per key.
        let legacy = try Fixtures.run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("DROP TABLE IF EXISTS manifestMarks")
                db.execute("DELETE FROM grdb_migrations WHERE identifier LIKE '%rollback marks%'")
                db.execute("CREATE TABLE IF NOT EXISTS manifestVersions (keyID TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL)")
                db.execute("INSERT OR REPLACE INTO manifestVersions (keyID, version) VALUES (?, 4)", (sys.argv[2],))
                db.commit()
                """, home.appending(path: "state.sqlite").path, publisher.publicKey.id,
            ], timeout: 30)
        #expect(legacy.status == 0, "\(legacy.stderr)")
        // A manifest signed before scopes existed: no scope field.
        let signingKey = try PublisherSigningKey(pem: String(contentsOfFile: publisher.key, encoding: .utf8))
        func signUnscoped(_ version: Int, expires: String? = nil) throws {
            let manifest = Manifest(products: try site.manifest().products, version: version, expires: expires)
            let data = try JSONEncoder().encode(manifest)
            try JSONEncoder().encode(try ManifestSignature(signing: data, with: signingKey))
                .write(to: site.folder.appending(path: "manifest.json.sig"))
            try data.write(to: site.manifestURL)
        }
        func fetch() throws -> CLI.Result { try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.big"]) }
        try signUnscoped(3)
        let rollback = try fetch()
        #expect(rollback.status == 65 && rollback.stderr.contains("rollback"), "the old mark still holds: \(rollback.stderr)")
        try signUnscoped(4)
        #expect(try fetch().status == 0, "the version of the old mark, whose bytes the home never kept, is accepted once")
        try signUnscoped(4, expires: "2999-01-01T00:00:00Z")
        let replaced = try fetch()
        #expect(replaced.status == 65 && replaced.stderr.contains("different"), "then its bytes are kept: \(replaced.stderr)")
        // The publisher's scoped manifests count from 1, beside the old mark.
        try FileManager.default.removeItem(at: site.manifestURL)
        try Self.sign(site, publisher.key, ["--manifest-version", "1"])
        let scoped = try fetch()
        #expect(scoped.status == 0, "\(scoped.stderr)")
    }
}
