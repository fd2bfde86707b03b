import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs fetch` in a home that trusts a TUF root (`packs trust add root.json --repository URL`): the manifest and its
/// pack are targets of a repository python-tuf's `tuf.api.metadata` builds (scripts/tuf-repo.py), served by nginx. A
/// good manifest installs; a tampered manifest, a pack whose hash differs from its target and expired metadata are
/// refused with exit 65 before anything is recorded or any pack byte is requested, and the trusted metadata on disk
/// keeps its bytes.
@Suite(.timeLimit(.minutes(3))) struct TUFFetchTests {
    /// A python-tuf repository whose targets are a manifest and its pack (`big.tar`), served by nginx, and a home that
    /// trusts its root.
    final class Setup {
        let repository: URL
        let site: TestSite
        let home: URL
        let nginx: NginxServer
        var metadataURL: String { self.nginx.baseURL.appending(path: "metadata/").absoluteString }
        var manifestURL: String { self.nginx.baseURL.appending(path: "targets/manifest.json").absoluteString }
        /// The home's trusted metadata of the repository.
        var metadataDir: URL {
            self.home.appending(path: "tuf").appending(path: TrustedRepository.id(metadataURL: URL(string: self.metadataURL)!))
                .appending(path: "metadata")
        }

        init(_ label: String, trust: Bool = true) throws {
            self.repository = try Fixtures.temporaryDirectory(label + "-repo")
            self.site = try TestSite.random(label + "-site", size: 40_000)
            self.home = try Fixtures.temporaryDirectory(label + "-home")
            try TUFClientTests.Setup.script(self.repository, "init")
            try TUFClientTests.Setup.script(self.repository, "add-targets", self.site.folder.path)
            self.nginx = try NginxServer(root: self.repository)
            guard trust else { return }
            let added = try self.packs([
                "trust", "add", self.repository.appending(path: "root.json").path, "--repository", self.metadataURL,
            ])
            #expect(added.status == 0, "trust add: \(added.stderr)")
        }

        deinit {
            self.nginx.stop()
            for folder in [self.repository, self.site.folder, self.home] { try? FileManager.default.removeItem(at: folder) }
        }

        func packs(_ arguments: [String], environment: [String: String] = [:]) throws -> CLI.Result {
            try CLI.run(home: self.home, arguments, timeout: 90, environment: environment)
        }

        func fetch(_ extra: [String] = []) throws -> CLI.Result {
            try self.packs(["fetch", self.manifestURL, "com.example.big"] + extra)
        }

        /// Brings the home's trusted metadata up to date (through the conformance wrapper, over the same folder).
        func refresh() throws {
            let result = try Fixtures.run(
                CLI.binary, ["tuf-client", "--metadata-url", self.metadataURL, "--metadata-dir", self.metadataDir.path, "refresh"],
                timeout: 60)
            #expect(result.status == 0, "refresh: \(result.stderr)")
        }

        func trusted() throws -> [String: Data] { try treeContents(self.metadataDir) }

        /// No transaction recorded, nothing installed, no pack byte requested.
        func expectNothingRecordedOrDownloaded(sourceLocation: SourceLocation = #_sourceLocation) throws {
            #expect(
                !FileManager.default.fileExists(atPath: self.home.appending(path: "Caches/com.example.big").path),
                sourceLocation: sourceLocation)
            let status = try self.packs(["--json", "status"])
            #expect(status.stdout.contains(#"{"transactions":[]}"#), "\(status.stdout)", sourceLocation: sourceLocation)
            let packRequests = self.nginx.requests().filter { $0.uri.contains("big.tar") }
            #expect(packRequests.isEmpty, "pack requests: \(packRequests)", sourceLocation: sourceLocation)
        }

        /// Publishes `manifest.json` changed by `change` as the repository's new manifest target (the pack's target
        /// unchanged).
        func publishManifest(_ change: (inout Manifest) -> Void) throws {
            let folder = try Fixtures.temporaryDirectory("tuf-fetch-manifest")
            defer { try? FileManager.default.removeItem(at: folder) }
            var manifest = try self.site.manifest()
            change(&manifest)
            try JSONEncoder().encode(manifest).write(to: folder.appending(path: "manifest.json"))
            try TUFClientTests.Setup.script(self.repository, "add-targets", folder.path)
        }
    }

    @Test func aManifestAndPackVouchedForByTUFInstall() throws {
        let setup = try Setup("tuf-fetch-good")
        let fetch = try setup.fetch()
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let data = setup.home.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == setup.site.dataSHA256)
        // The metadata is stored as served, byte for byte.
        let served = setup.repository.appending(path: "metadata")
        #expect(try setup.trusted()["timestamp.json"] == (try Data(contentsOf: served.appending(path: "timestamp.json"))))
        #expect(try setup.trusted()["targets.json"] == (try Data(contentsOf: served.appending(path: "2.targets.json"))))
        let list = try setup.packs(["trust", "list"])
        #expect(list.status == 0 && list.stdout.contains("TUF repository \(setup.metadataURL)"), "\(list.stdout)")
    }

    /// A fetch when nothing changed in the repository: the metadata it asks for is the next root (404, as the
    /// specification's step 5.3 requires) and timestamp.json, and nothing else; the numbers are printed for the record.
    @Test func aRefreshWhenNothingChangedAsksForTheNextRootAndTheTimestampOnly() throws {
        let setup = try Setup("tuf-fetch-unchanged")
        #expect(try setup.fetch().status == 0)
        let first = setup.nginx.requests().count
        let again = try setup.fetch()
        #expect(again.status == 0, "\(again.stderr)")
        let metadata = setup.nginx.requests().dropFirst(first).filter { $0.uri.hasPrefix("/metadata/") }
        #expect(metadata.map(\.uri) == ["/metadata/2.root.json", "/metadata/timestamp.json"], "\(metadata)")
        #expect(metadata.map(\.status) == [404, 200], "\(metadata)")
        let timestampBytes = setup.nginx.bodyBytesSent(path: "/metadata/timestamp.json") / 2
        #expect(timestampBytes <= 1024, "timestamp.json: \(timestampBytes) bytes")
        let rootBytes = setup.nginx.bodyBytesSent(path: "/metadata/2.root.json") / 2
        print(
            "TUF refresh, nothing changed: \(metadata.count) metadata requests, 2.root.json (404) \(rootBytes) bytes, timestamp.json \(timestampBytes) bytes"
        )
    }

    @Test func aTamperedManifestIsRefusedAndNothingRecorded() throws {
        let setup = try Setup("tuf-fetch-tampered")
        try setup.refresh()
        let before = try setup.trusted()
        // The served manifest changes (valid JSON still, one pack's URL elsewhere); its target does not.
        let served = setup.repository.appending(path: "targets/manifest.json")
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: served))
        manifest.products[0].contents[0].unpackedLength = 1
        try JSONEncoder().encode(manifest).write(to: served)
        let fetch = try setup.fetch()
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(fetch.stderr.contains("targets metadata version 2") && fetch.stderr.contains("manifest.json"), "\(fetch.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
        #expect(try setup.trusted() == before)
    }

    @Test func aPackWhoseHashDiffersFromItsTargetIsRefusedBeforeAnyPackByte() throws {
        let setup = try Setup("tuf-fetch-pack-hash")
        try setup.publishManifest { manifest in
            manifest.products[0].contents[0].sha256 = String(repeating: "ab", count: 32)
        }
        let fetch = try setup.fetch()
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(
            fetch.stderr.contains("targets metadata version 3") && fetch.stderr.contains("wrong hash (sha256)")
                && fetch.stderr.contains("'big.tar'"), "\(fetch.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
    }

    @Test func anExpiredTimestampIsRefusedAndTheTrustedMetadataKept() throws {
        let setup = try Setup("tuf-fetch-expired")
        try setup.refresh()
        let before = try setup.trusted()
        try TUFClientTests.Setup.script(setup.repository, "expired-timestamp")
        let fetch = try setup.fetch()
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(fetch.stderr.contains("timestamp metadata version 3") && fetch.stderr.contains("expired"), "\(fetch.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
        #expect(try setup.trusted() == before)
    }

    /// Expiry is checked against the time libc reads: 400 days later (libfaketime), the year-long timestamp expired.
    @Test func metadataExpiredByTheClockLibfaketimeSetsIsRefused() throws {
        try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/faketime"), "faketime is installed (scripts/install-deps)")
        let setup = try Setup("tuf-fetch-faketime")
        try setup.refresh()
        let before = try setup.trusted()
        let later = try Fixtures.run(
            "faketime", ["-f", "+400d", CLI.binary, "--home", setup.home.path, "fetch", setup.manifestURL, "com.example.big"], timeout: 90)
        #expect(later.status == 65, "\(later.stderr)")
        #expect(later.stderr.contains("expired"), "\(later.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
        #expect(try setup.trusted() == before)
    }

    /// A home that trusts only a TUF repository refuses a manifest from outside its targets; once the repository is
    /// no longer trusted, the same manifest reads unsigned again.
    @Test func aManifestOutsideTheTrustedTargetsIsRefusedUntilTheRepositoryIsRemoved() throws {
        let setup = try Setup("tuf-fetch-outside")
        let outside = try setup.packs(["fetch", setup.site.manifestURL.path, "com.example.big"])
        #expect(outside.status == 65, "\(outside.stderr)")
        #expect(outside.stderr.contains("not under the targets of a TUF repository"), "\(outside.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
        let id = TrustedRepository.id(metadataURL: URL(string: setup.metadataURL)!)
        let removed = try setup.packs(["trust", "remove", id])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(!FileManager.default.fileExists(atPath: setup.metadataDir.path))
        let again = try setup.packs(["fetch", setup.site.manifestURL.path, "com.example.big"])
        #expect(again.status == 0, "\(again.stderr)")
    }

    /// A trusted repository whose record was lost (a `trust add` killed midway, a file removed) refuses every manifest,
    /// naming the repository, until it is removed and trusted again: never read as "nothing trusted", which would take an
    /// unsigned manifest from anywhere.
    @Test func aRepositoryWhoseRecordIsLostRefusesEveryManifest() throws {
        let setup = try Setup("tuf-fetch-lost")
        let id = TrustedRepository.id(metadataURL: URL(string: setup.metadataURL)!)
        try FileManager.default.removeItem(at: setup.metadataDir.deletingLastPathComponent().appending(path: "repository.json"))
        let unsigned = try setup.packs(["fetch", setup.site.manifestURL.path, "com.example.big"])
        #expect(unsigned.status == 65, "\(unsigned.stderr)")
        #expect(unsigned.stderr.contains(id), "\(unsigned.stderr)")
        let vouched = try setup.fetch()
        #expect(vouched.status == 65, "\(vouched.stderr)")
        try setup.expectNothingRecordedOrDownloaded()
    }

    /// A root whose signature does not match (its version changed after signing) is refused with exit 65 and nothing
    /// is trusted; `--targets` without `--repository` is a usage error.
    @Test func aRootNotSignedByItsOwnKeysIsNotTrusted() throws {
        let setup = try Setup("tuf-fetch-bad-root", trust: false)
        var json = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: setup.repository.appending(path: "root.json"))) as? [String: Any])
        var signed = try #require(json["signed"] as? [String: Any])
        signed["version"] = 7
        json["signed"] = signed
        let forged = setup.home.appending(path: "forged-root.json")
        try JSONSerialization.data(withJSONObject: json).write(to: forged)
        let added = try setup.packs(["trust", "add", forged.path, "--repository", setup.metadataURL])
        #expect(added.status == 65, "\(added.stderr)")
        #expect(added.stderr.contains("root metadata version 7") && added.stderr.contains("threshold not met"), "\(added.stderr)")
        #expect(!FileManager.default.fileExists(atPath: setup.home.appending(path: "tuf").path))
        let usage = try setup.packs(["trust", "add", forged.path, "--targets", setup.metadataURL])
        #expect(usage.status == 64, "\(usage.stderr)")
    }

    /// The library: a queue trusts a root; the loaded manifest names the repository that vouched for it, and an
    /// injected clock a year and more later makes the same load a refusal coded `untrustedManifest`.
    @Test func theLibraryTrustsARootAndChecksExpiryAgainstAnInjectedClock() throws {
        let setup = try Setup("tuf-fetch-library", trust: false)
        let queue = try DownloadQueue(home: Home(folder: setup.home))
        defer { queue.close() }
        let root = try Data(contentsOf: setup.repository.appending(path: "root.json"))
        let repository = try queue.trust(root: root, metadataURL: URL(string: setup.metadataURL)!)
        #expect(repository.targetsBaseURL.absoluteString == setup.nginx.baseURL.appending(path: "targets/").absoluteString)
        let repositories = try queue.trustedRepositories()
        let loaded = try LoadedManifest.load(setup.manifestURL, trusting: [], repositories: repositories)
        #expect(loaded.tufRepository == repository.id)
        do {
            _ = try LoadedManifest.load(
                setup.manifestURL, trusting: [], repositories: repositories, now: Date().addingTimeInterval(400 * 86_400))
            Issue.record("a manifest under expired metadata was accepted")
        } catch {
            #expect(error.code == .untrustedManifest, "\(error.message)")
        }
    }
}
