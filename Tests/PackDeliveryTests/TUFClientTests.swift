import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs tuf-client` (the real binary, tuf-conformance's interface) against repositories that python-tuf's
/// `tuf.api.metadata` builds (scripts/tuf-repo.py), served by nginx: a good repository refreshes and downloads a
/// target byte for byte; each attack is refused with exit 1, and the trusted metadata on disk keeps its bytes.
@Suite(.timeLimit(.minutes(3))) struct TUFClientTests {
    /// A python-tuf repository served by nginx, and a client's metadata and target folders.
    final class Setup {
        let repository: URL
        let client: URL
        let nginx: NginxServer
        var metadataDir: URL { self.client.appending(path: "metadata") }
        var targetDir: URL { self.client.appending(path: "targets") }

        init(_ label: String) throws {
            self.repository = try Fixtures.temporaryDirectory(label + "-repo")
            self.client = try Fixtures.temporaryDirectory(label + "-client")
            try Self.script(self.repository, "init")
            self.nginx = try NginxServer(root: self.repository)
            let initialize = try self.packs([
                "--metadata-dir", self.metadataDir.path, "init", self.repository.appending(path: "root.json").path,
            ])
            #expect(initialize.status == 0, "init: \(initialize.stderr)")
        }

        deinit {
            self.nginx.stop()
            try? FileManager.default.removeItem(at: self.repository)
            try? FileManager.default.removeItem(at: self.client)
        }

        /// Runs scripts/tuf-repo.py on the repository.
        static func script(_ repository: URL, _ arguments: String...) throws {
            let script = CLI.packageRoot.appending(path: "scripts/tuf-repo.py").path
            let result = try Fixtures.run("python3", [script, repository.path] + arguments, timeout: 60)
            guard result.status == 0 else { throw FixtureError("tuf-repo.py \(arguments): \(result.stderr)") }
        }

        func change(_ arguments: String...) throws {
            let script = CLI.packageRoot.appending(path: "scripts/tuf-repo.py").path
            let result = try Fixtures.run("python3", [script, self.repository.path] + arguments, timeout: 60)
            guard result.status == 0 else { throw FixtureError("tuf-repo.py \(arguments): \(result.stderr)") }
        }

        func packs(_ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
            try Fixtures.run(CLI.binary, ["tuf-client"] + arguments, timeout: 60)
        }

        func refresh() throws -> (status: Int32, stdout: String, stderr: String) {
            try self.packs([
                "--metadata-url", self.nginx.baseURL.appending(path: "metadata").absoluteString, "--metadata-dir", self.metadataDir.path,
                "refresh",
            ])
        }

        func download(_ names: String...) throws -> (status: Int32, stdout: String, stderr: String) {
            try self.packs(
                ["--metadata-url", self.nginx.baseURL.appending(path: "metadata").absoluteString, "--metadata-dir", self.metadataDir.path]
                    + names.flatMap { ["--target-name", $0] }
                    + [
                        "--target-dir", self.targetDir.path, "--target-base-url",
                        self.nginx.baseURL.appending(path: "targets").absoluteString,
                        "download",
                    ])
        }

        /// The trusted metadata on disk, by file name.
        func trusted() throws -> [String: Data] { try treeContents(self.metadataDir) }

        /// The `version` of a trusted role's stored metadata.
        func version(_ role: String) throws -> Int? {
            let data = try Data(contentsOf: self.metadataDir.appending(path: role + ".json"))
            let json = try JSONSerialization.jsonObject(with: data) as? [String: Any]
            return (json?["signed"] as? [String: Any])?["version"] as? Int
        }
    }

    static let hello = Data("hello from a TUF repository\n".utf8)

    @Test func aGoodRepositoryRefreshesAndDownloadsATargetByteForByte() throws {
        let setup = try Setup("tuf-good")
        let refresh = try setup.refresh()
        #expect(refresh.status == 0, "\(refresh.stderr)")
        let stored = try setup.trusted()
        #expect(Set(stored.keys) == ["root.json", "timestamp.json", "snapshot.json", "targets.json"])
        // Stored as downloaded, byte for byte, under unversioned names.
        let served = setup.repository.appending(path: "metadata")
        #expect(stored["timestamp.json"] == (try Data(contentsOf: served.appending(path: "timestamp.json"))))
        #expect(stored["snapshot.json"] == (try Data(contentsOf: served.appending(path: "1.snapshot.json"))))
        #expect(stored["targets.json"] == (try Data(contentsOf: served.appending(path: "1.targets.json"))))
        let download = try setup.download("files/hello.txt", "studio/a.txt")
        #expect(download.status == 0, "\(download.stderr)")
        let files = try treeContents(setup.targetDir)
        #expect(files["files%2Fhello.txt"] == Self.hello)
        #expect(files["studio%2Fa.txt"] == Data("studio target a\n".utf8))
        #expect(try setup.trusted()["studio.json"] == (try Data(contentsOf: served.appending(path: "1.studio.json"))))
    }

    @Test func aTimestampRolledBackIsRefusedAndTheTrustedOneKept() throws {
        let setup = try Setup("tuf-rollback")
        try setup.change("timestamp")
        #expect(try setup.refresh().status == 0)
        #expect(try setup.version("timestamp") == 2)
        let before = try setup.trusted()
        try setup.change("serve-timestamp", "1")
        let refresh = try setup.refresh()
        #expect(refresh.status == 1)
        #expect(refresh.stderr.contains("timestamp metadata version 1") && refresh.stderr.contains("rollback"), "\(refresh.stderr)")
        #expect(try setup.trusted() == before)
    }

    @Test func anExpiredTimestampIsRefused() throws {
        let setup = try Setup("tuf-expired")
        #expect(try setup.refresh().status == 0)
        let before = try setup.trusted()
        try setup.change("expired-timestamp")
        let refresh = try setup.refresh()
        #expect(refresh.status == 1)
        #expect(refresh.stderr.contains("timestamp metadata version 2") && refresh.stderr.contains("expired"), "\(refresh.stderr)")
        #expect(try setup.trusted() == before)
    }

    @Test func anExpiredTimestampIsRefusedByTheClockLibfaketimeSets() throws {
        let setup = try Setup("tuf-faketime")
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/faketime"), "faketime is installed (scripts/install-deps)")
        #expect(try setup.refresh().status == 0)
        let before = try setup.trusted()
        let later = try Fixtures.run(
            "faketime",
            [
                "-f", "+400d", CLI.binary, "tuf-client", "--metadata-url", setup.nginx.baseURL.appending(path: "metadata").absoluteString,
                "--metadata-dir", setup.metadataDir.path, "refresh",
            ], timeout: 60)
        #expect(later.status == 1)
        #expect(later.stderr.contains("expired"), "\(later.stderr)")
        #expect(try setup.trusted() == before)
    }

    @Test func aThresholdOfTwoMetByOneKeyListedTwiceIsRefused() throws {
        let setup = try Setup("tuf-duplicate-key")
        #expect(try setup.refresh().status == 0)
        let before = try setup.trusted()
        try setup.change("duplicate-root-key")
        let refresh = try setup.refresh()
        #expect(refresh.status == 1)
        #expect(refresh.stderr.contains("root metadata version 2") && refresh.stderr.contains("threshold not met"), "\(refresh.stderr)")
        #expect(try setup.trusted() == before)
    }

    @Test func theRootRotatesOverThreeVersionsThroughAnExpiredIntermediateRoot() throws {
        let setup = try Setup("tuf-rotation")
        #expect(try setup.refresh().status == 0)
        try setup.change("rotate-root")
        let refresh = try setup.refresh()
        #expect(refresh.status == 0, "\(refresh.stderr)")
        #expect(try setup.trusted()["root.json"] == (try Data(contentsOf: setup.repository.appending(path: "metadata/3.root.json"))))
        #expect(try setup.version("root") == 3)
    }

    @Test func aTargetWhoseHashDoesNotMatchIsRefusedAndNotWritten() throws {
        let setup = try Setup("tuf-bad-target")
        #expect(try setup.refresh().status == 0)
        let before = try setup.trusted()
        try setup.change("corrupt-target")
        let download = try setup.download("files/hello.txt")
        #expect(download.status == 1)
        #expect(download.stderr.contains("wrong hash"), "\(download.stderr)")
        #expect(try treeContents(setup.targetDir).isEmpty)
        #expect(try setup.trusted() == before)
    }

    @Test func endlessDataIsRefusedAtTheTimestampLimit() throws {
        let setup = try Setup("tuf-endless")
        #expect(try setup.refresh().status == 0)
        let before = try setup.trusted()
        try setup.change("endless-timestamp")
        let refresh = try setup.refresh()
        #expect(refresh.status == 1)
        #expect(refresh.stderr.contains("timestamp") && refresh.stderr.contains("length exceeded"), "\(refresh.stderr)")
        #expect(try setup.trusted() == before)
    }

    @Test func aDelegatedRoleSigningOutsideItsPathsIsNotFound() throws {
        let setup = try Setup("tuf-outside")
        #expect(try setup.refresh().status == 0)
        let download = try setup.download("other/b.txt")
        #expect(download.status == 1)
        #expect(download.stderr.contains("No target"), "\(download.stderr)")
        #expect(try treeContents(setup.targetDir).isEmpty)
    }

    /// A root whose threshold needs an ed25519, an rsassa-pss-sha256 and an ecdsa-sha2-nistp256 signature is
    /// accepted; the next root, with the rsa or the ecdsa signature of another text, is refused.
    @Test(arguments: ["rsa", "ecdsa"]) func everyKeyTypeIsCheckedThroughOpenSSL(broken: String) throws {
        let setup = try Setup("tuf-key-types-" + broken)
        try setup.change("key-types")
        let refresh = try setup.refresh()
        #expect(refresh.status == 0, "\(refresh.stderr)")
        #expect(try setup.version("root") == 2)
        let before = try setup.trusted()
        try setup.change("key-types-broken", broken)
        let refused = try setup.refresh()
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("root metadata version 3") && refused.stderr.contains("threshold not met"), "\(refused.stderr)")
        #expect(try setup.trusted() == before)
    }

    /// Fast-forward recovery: a timestamp pushed to version 3 (as an attacker with the timestamp key could), then the
    /// timestamp key rotated in root and the timestamp started again at version 1: the client accepts it.
    @Test func aRotatedTimestampKeyRecoversFromAFastForwardedTimestamp() throws {
        let setup = try Setup("tuf-fast-forward")
        try setup.change("timestamp")
        try setup.change("timestamp")
        #expect(try setup.refresh().status == 0)
        #expect(try setup.version("timestamp") == 3)
        try setup.change("rotate-timestamp-key")
        let refresh = try setup.refresh()
        #expect(refresh.status == 0, "\(refresh.stderr)")
        #expect(try setup.version("root") == 2)
        let served = try Data(contentsOf: setup.repository.appending(path: "metadata/timestamp.json"))
        #expect(try setup.trusted()["timestamp.json"] == served)
        #expect(try setup.version("timestamp") == 1)
    }

    /// Signatures cover securesystemslib's canonical JSON: targets whose path and custom field hold non-ASCII text
    /// (escaped as \\u in the file, a surrogate pair among them), quotes, backslashes and control characters verify,
    /// and the target with such a path downloads.
    @Test func canonicalJSONMatchesSecuresystemslibOnUnusualText() throws {
        let setup = try Setup("tuf-canonical")
        try setup.change("unusual-text")
        let download = try setup.download("files/caf\u{e9} \"quoted\" \\ back.txt")
        #expect(download.status == 0, "\(download.stderr)")
        #expect(try setup.version("targets") == 2)
        #expect(try treeContents(setup.targetDir) == ["files%2Fcaf%C3%A9%20%22quoted%22%20%5C%20back.txt": Self.hello])
    }
}
