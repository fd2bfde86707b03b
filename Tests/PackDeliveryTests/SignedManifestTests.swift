import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Issue 15, signed manifests: a client that trusts a publisher refuses (exit 65, nothing downloaded, the
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
}
