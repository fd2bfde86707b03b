import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs repo` keeps a TUF repository folder, served by nginx, that python-tuf's `ngclient.Updater` accepts (run
/// from python3, installed by scripts/install-deps) and that `packs fetch` installs from, each step run with its own
/// key file.
@Suite(.timeLimit(.minutes(3))) struct TUFRepoToolTests {
    final class Setup {
        let keys: URL
        let repository: URL
        let site: TestSite
        let home: URL
        let client: URL
        let nginx: NginxServer
        /// What `packs repo add` printed: `added PATH to ROLE` a line.
        var added = ""
        var metadataURL: String { self.nginx.baseURL.appending(path: "metadata/").absoluteString }
        var targetsURL: String { self.nginx.baseURL.appending(path: "targets/").absoluteString }

        /// A repository whose targets are `manifest.json`, `big.tar` and its index: in the top-level targets, or, with
        /// `bins`, in that many hash bins (`bins-…`, the key `bins`).
        init(_ label: String, bins: Int? = nil) throws {
            self.keys = try Fixtures.temporaryDirectory(label + "-keys")
            self.repository = try Fixtures.temporaryDirectory(label + "-repo")
            self.home = try Fixtures.temporaryDirectory(label + "-home")
            self.client = try Fixtures.temporaryDirectory(label + "-client")
            self.site = try TestSite.random(label + "-site", size: 30_000)
            self.nginx = try NginxServer(root: self.repository)
            for name in ["root", "root2", "timestamp", "snapshot", "targets", "studio", "bins"] {
                try self.tool(["keygen", self.key(name).replacingOccurrences(of: ".key", with: "")])
            }
            try self.tool([
                "repo", "init", self.repository.path, "--root-key", self.key("root"), "--timestamp-key", self.key("timestamp"),
                "--snapshot-key", self.key("snapshot"), "--targets-key", self.key("targets"),
            ])
            var role = ["--key", self.key("targets")]
            if let bins {
                try self.tool([
                    "repo", "delegate", self.repository.path, "bins", "--bins", String(bins), "--key", self.key("targets"),
                    "--delegate-key",
                    self.key("bins"),
                ])
                role = ["--role", "bins", "--key", self.key("bins")]
            }
            let files = ["manifest.json", "big.tar", "big.tar.index.json"].map { self.site.folder.appending(path: $0).path }
            self.added = try self.tool(["repo", "add", self.repository.path] + files + ["--from", self.site.folder.path] + role)
            try self.publish()
        }

        deinit {
            self.nginx.stop()
            for folder in [self.keys, self.repository, self.home, self.client, self.site.folder] {
                try? FileManager.default.removeItem(at: folder)
            }
        }

        func key(_ name: String) -> String { self.keys.appending(path: name + ".key").path }

        /// `packs ARGS…`, which must succeed.
        @discardableResult func tool(_ arguments: [String]) throws -> String {
            let result = try Fixtures.run(CLI.binary, arguments, timeout: 60)
            guard result.status == 0 else { throw FixtureError("packs \(arguments): \(result.stderr)") }
            return result.stdout
        }

        /// A new snapshot (snapshot key) and timestamp (timestamp key alone).
        func publish() throws {
            try self.tool(["repo", "sign", self.repository.path, "--key", self.key("snapshot")])
            try self.tool(["repo", "timestamp", self.repository.path, "--key", self.key("timestamp")])
        }

        /// python-tuf's ngclient.Updater downloads `manifest.json` byte for byte, and a home that trusts the first
        /// root installs `com.example.big` from it with `packs fetch`.
        func expectPythonTUFAndPacksInstallTheManifest() throws {
            let python = try self.ngclient("manifest.json")
            #expect(python.status == 0, "\(python.stderr)")
            let downloaded = python.stdout.split(separator: " ").last.map { String($0).trimmingCharacters(in: .whitespacesAndNewlines) }
            #expect(try downloaded.map { try Data(contentsOf: URL(filePath: $0)) } == (try Data(contentsOf: self.site.manifestURL)))
            let trust = try CLI.run(
                home: self.home,
                ["trust", "add", self.repository.appending(path: "metadata/1.root.json").path, "--repository", self.metadataURL])
            #expect(trust.status == 0, "\(trust.stderr)")
            let fetch = try CLI.run(home: self.home, ["fetch", self.targetsURL + "manifest.json", "com.example.big"])
            #expect(fetch.status == 0, "\(fetch.stderr)")
            let data = self.home.appending(path: "Caches/com.example.big/Contents/data.bin")
            #expect(try Fixtures.sha256Hex(of: data) == self.site.dataSHA256)
        }

        /// python-tuf's ngclient.Updater: refreshes from the repository's first root, downloads `target`, and prints
        /// the trusted root's version and the downloaded file's path.
        func ngclient(_ target: String) throws -> (status: Int32, stdout: String, stderr: String) {
            let script = """
                import os, shutil, sys
                from tuf.ngclient import Updater
                meta, root, url, targets, out, name = sys.argv[1:7]
                if not os.path.exists(os.path.join(meta, "root.json")):
                    os.makedirs(meta, exist_ok=True)
                    shutil.copyfile(root, os.path.join(meta, "root.json"))
                os.makedirs(out, exist_ok=True)
                updater = Updater(meta, url, out, targets, bootstrap=None)
                updater.refresh()
                info = updater.get_targetinfo(name)
                if info is None:
                    sys.exit("no target " + name)
                path = updater.download_target(info)
                print(updater._trusted_set.root.version, path)
                """
            return try Fixtures.run(
                "python3",
                [
                    "-c", script, self.client.appending(path: "metadata").path,
                    self.repository.appending(path: "metadata/1.root.json").path, self.metadataURL, self.targetsURL,
                    self.client.appending(path: "targets").path, target,
                ], timeout: 60)
        }
    }

    @Test func aRepositoryWrittenByPacksRepoIsAcceptedByPythonTUFAndInstallsWithFetch() throws {
        let setup = try Setup("tuf-repo-tool")
        try setup.expectPythonTUFAndPacksInstallTheManifest()
    }

    /// The root key rotated (old and new root keys), a delegated role with its own key: python-tuf walks to root
    /// version 2 and finds the delegated target; `packs fetch` walks there too.
    @Test func aRotatedRootAndADelegatedRoleAreAcceptedByPythonTUFAndPacks() throws {
        let setup = try Setup("tuf-repo-rotate")
        let trust = try CLI.run(
            home: setup.home,
            ["trust", "add", setup.repository.appending(path: "metadata/1.root.json").path, "--repository", setup.metadataURL])
        #expect(trust.status == 0, "\(trust.stderr)")
        try setup.tool(["repo", "rotate", setup.repository.path, "--root-key", setup.key("root"), "--new-key", setup.key("root2")])
        try setup.tool([
            "repo", "delegate", setup.repository.path, "studio", "--paths", "studio/*", "--key", setup.key("targets"), "--delegate-key",
            setup.key("studio"),
        ])
        let note = setup.keys.appending(path: "note.txt")
        try Data("a studio's target\n".utf8).write(to: note)
        try setup.tool([
            "repo", "add", setup.repository.path, note.path, "--prefix", "studio/", "--role", "studio", "--key", setup.key("studio"),
        ])
        try setup.publish()
        let python = try setup.ngclient("studio/note.txt")
        #expect(python.status == 0, "\(python.stderr)")
        #expect(python.stdout.hasPrefix("2 "), "\(python.stdout)")
        let fetch = try CLI.run(home: setup.home, ["fetch", setup.targetsURL + "manifest.json", "com.example.big"])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let metadata = setup.home.appending(path: "tuf").appending(path: TrustedRepository.id(metadataURL: URL(string: setup.metadataURL)!))
        let root = try Data(contentsOf: metadata.appending(path: "metadata/root.json"))
        #expect(root == (try Data(contentsOf: setup.repository.appending(path: "metadata/2.root.json"))))
    }

    /// `packs repo delegate --bins 16`, then `packs repo add --role bins`: each target goes to its bin (by the SHA-256 of
    /// its path) and only those bins get a version 2; the snapshot lists the 16 bins. python-tuf's ngclient.Updater
    /// downloads a target from its bin, and `packs fetch` installs the product, every file of it found through a bin.
    @Test func targetsInHashBinsAreFoundByPythonTUFAndInstalledByFetch() throws {
        let setup = try Setup("tuf-repo-bins", bins: 16)
        let bins = (0..<16).map { "bins-" + String($0, radix: 16) }
        let changed = Set(setup.added.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) })
        #expect(!changed.isEmpty && changed.isSubset(of: Set(bins)), "\(setup.added)")
        let metadata = setup.repository.appending(path: "metadata")
        for bin in bins {
            #expect(FileManager.default.fileExists(atPath: metadata.appending(path: "1.\(bin).json").path), "1.\(bin).json")
            #expect(
                FileManager.default.fileExists(atPath: metadata.appending(path: "2.\(bin).json").path) == changed.contains(bin),
                "2.\(bin).json: only the bins that changed are signed again")
        }
        let snapshot =
            try JSONSerialization.jsonObject(with: Data(contentsOf: metadata.appending(path: "2.snapshot.json"))) as? [String: Any]
        let meta = ((snapshot?["signed"] as? [String: Any])?["meta"] as? [String: Any]) ?? [:]
        #expect(Set(meta.keys) == Set(bins.map { $0 + ".json" } + ["targets.json"]), "\(meta.keys.sorted())")

        try setup.expectPythonTUFAndPacksInstallTheManifest()
    }

    /// A target in another bin than its own: `packs repo add --role` with the wrong bin is refused (exit 64, nothing
    /// signed); metadata edited by hand to list `manifest.json` in the wrong bin, validly signed by the bins' key, is
    /// refused by python-tuf's ngclient.Updater (no such target) and by `packs fetch` (exit 65, nothing installed),
    /// while the other targets still download.
    @Test func aTargetInTheWrongHashBinIsRefused() throws {
        let setup = try Setup("tuf-repo-wrong-bin", bins: 16)
        let line = setup.added.split(separator: "\n").first { $0.hasPrefix("added manifest.json to ") }
        let right = try #require(line.flatMap { $0.split(separator: " ").last.map(String.init) }, "\(setup.added)")
        let wrong = "bins-" + String((Int(right.dropFirst(5), radix: 16) ?? 0) ^ 1, radix: 16)
        let manifest = setup.site.manifestURL.path
        let refused = try Fixtures.run(
            CLI.binary, ["repo", "add", setup.repository.path, manifest, "--role", wrong, "--key", setup.key("bins")], timeout: 60)
        #expect(refused.status == 64, "\(refused.stderr)")
        #expect(refused.stderr.contains("belongs in the hash bin \(right), not \(wrong)"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: setup.repository.appending(path: "metadata/2.\(wrong).json").path))

        try setup.tool(["repo", "remove", setup.repository.path, "manifest.json", "--role", "bins", "--key", setup.key("bins")])
        let edit = """
            import sys
            from cryptography.hazmat.primitives.serialization import load_pem_private_key
            from securesystemslib.signer import CryptoSigner
            from tuf.api.metadata import Metadata, TargetFile
            repo, wrong, key, target = sys.argv[1:5]
            state = f"{repo}/state/{wrong}.json"
            md = Metadata.from_file(state)
            md.signed.targets["manifest.json"] = TargetFile.from_file("manifest.json", target)
            md.signed.version += 1
            with open(key, "rb") as f:
                md.sign(CryptoSigner(load_pem_private_key(f.read(), None)))
            md.to_file(state)
            md.to_file(f"{repo}/metadata/{md.signed.version}.{wrong}.json")
            Metadata.from_file(f"{repo}/state/targets.json").signed.verify_delegate(wrong, md.signed_bytes, md.signatures)
            print("signed")
            """
        let edited = try Fixtures.run("python3", ["-c", edit, setup.repository.path, wrong, setup.key("bins"), manifest], timeout: 60)
        #expect(edited.status == 0 && edited.stdout.contains("signed"), "\(edited.stderr)")
        try setup.publish()

        let python = try setup.ngclient("manifest.json")
        #expect(python.status != 0 && python.stderr.contains("no target manifest.json"), "\(python.stdout) \(python.stderr)")
        #expect(try setup.ngclient("big.tar").status == 0, "the other targets still download")
        let trust = try CLI.run(
            home: setup.home,
            ["trust", "add", setup.repository.appending(path: "metadata/1.root.json").path, "--repository", setup.metadataURL])
        #expect(trust.status == 0, "\(trust.stderr)")
        let fetch = try CLI.run(home: setup.home, ["fetch", setup.targetsURL + "manifest.json", "com.example.big"])
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(fetch.stderr.contains("not a target"), "\(fetch.stderr)")
        #expect(!FileManager.default.fileExists(atPath: setup.home.appending(path: "Caches/com.example.big").path))
    }
}
