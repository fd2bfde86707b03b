import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs export` of a product a trusted TUF repository vouched for, then `packs fetch DIR/manifest.json PRODUCT` of
/// that export in another home that trusts the same root (python-tuf's repository of TUFFetchTests, served by nginx):
/// the export carries the repository's metadata, and the other home installs through it with no request to the
/// server. Missing or altered metadata, an altered manifest and a home that does not trust the repository are
/// refused with exit 65 and nothing installed.
@Suite(.timeLimit(.minutes(3))) struct TUFExportTests {
    typealias Setup = TUFFetchTests.Setup

    /// The product fetched in `setup`'s home, then exported; the export folder.
    func export(_ setup: Setup, _ label: String) throws -> URL {
        let fetch = try setup.fetch()
        #expect(fetch.status == 0, "fetch: \(fetch.stderr)")
        let folder = try Fixtures.temporaryDirectory(label + "-export")
        let exported = try setup.packs(["export", "com.example.big", "--to", folder.path])
        #expect(exported.status == 0, "export: \(exported.stderr)")
        #expect(exported.stdout.contains("with the metadata of the TUF repository tuf-"), "\(exported.stdout)")
        return folder
    }

    /// Another home, trusting the repository's root when `trust` (trusting makes no request).
    func otherHome(_ setup: Setup, _ label: String, trust: Bool = true) throws -> URL {
        let home = try Fixtures.temporaryDirectory(label + "-other")
        if trust {
            let root = setup.repository.appending(path: "root.json").path
            let added = try CLI.run(home: home, ["trust", "add", root, "--repository", setup.metadataURL], timeout: 60)
            #expect(added.status == 0, "trust add: \(added.stderr)")
        }
        return home
    }

    func installOffline(_ setup: Setup, home: URL, export: URL) throws -> CLI.Result {
        let before = setup.nginx.requests().count
        let fetch = try CLI.run(home: home, ["fetch", export.appending(path: "manifest.json").path, "com.example.big"], timeout: 90)
        #expect(setup.nginx.requests().count == before, "requests: \(setup.nginx.requests().dropFirst(before))")
        return fetch
    }

    @Test func anExportCarriesTheTUFMetadataAndInstallsOfflineThroughIt() throws {
        let setup = try Setup("tuf-export-good")
        let folder = try self.export(setup, "tuf-export-good")
        let other = try self.otherHome(setup, "tuf-export-good")
        defer { for url in [folder, other] { try? FileManager.default.removeItem(at: url) } }
        let carried = try treeContents(folder.appending(path: "tuf/metadata"))
        #expect(carried["timestamp.json"] == (try setup.trusted()["timestamp.json"]))
        #expect(carried["2.targets.json"] == (try setup.trusted()["targets.json"]))
        let fetch = try self.installOffline(setup, home: other, export: folder)
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let data = other.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == setup.site.dataSHA256)
        // The other home's trusted metadata was brought up to the export's.
        let id = TrustedRepository.id(metadataURL: URL(string: setup.metadataURL)!)
        let trusted = try treeContents(other.appending(path: "tuf").appending(path: id).appending(path: "metadata"))
        #expect(trusted["timestamp.json"] == carried["timestamp.json"])
        #expect(trusted["targets.json"] == carried["targets.json"])
    }

    /// The root rotated twice (through an expired intermediate root) before the export: a home that trusts the first
    /// root walks the chain from the export's copies of versions 2 and 3, with no request.
    @Test func aHomeTrustingAnOlderRootWalksTheExportedRootChain() throws {
        let setup = try Setup("tuf-export-rotated")
        try TUFClientTests.Setup.script(setup.repository, "rotate-root")
        let folder = try self.export(setup, "tuf-export-rotated")
        let other = try self.otherHome(setup, "tuf-export-rotated")
        defer { for url in [folder, other] { try? FileManager.default.removeItem(at: url) } }
        let fetch = try self.installOffline(setup, home: other, export: folder)
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let id = TrustedRepository.id(metadataURL: URL(string: setup.metadataURL)!)
        let root = try Data(contentsOf: other.appending(path: "tuf").appending(path: id).appending(path: "metadata/root.json"))
        #expect(root == (try Data(contentsOf: setup.repository.appending(path: "metadata/3.root.json"))))
    }

    /// The export's timestamp removed, its timestamp's signed part changed (the signature no longer holds), or its
    /// manifest changed after the export: refused, nothing installed.
    @Test(arguments: ["missing", "altered", "manifest"]) func anExportWithMissingOrBadTUFMetadataIsRefused(fault: String) throws {
        let setup = try Setup("tuf-export-" + fault)
        let folder = try self.export(setup, "tuf-export-" + fault)
        let other = try self.otherHome(setup, "tuf-export-" + fault)
        defer { for url in [folder, other] { try? FileManager.default.removeItem(at: url) } }
        let timestamp = folder.appending(path: "tuf/metadata/timestamp.json")
        switch fault {
        case "missing":
            try FileManager.default.removeItem(at: timestamp)
        case "altered":
            var json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: timestamp)) as? [String: Any])
            var signed = try #require(json["signed"] as? [String: Any])
            signed["version"] = ((signed["version"] as? Int) ?? 1) + 1
            json["signed"] = signed
            try JSONSerialization.data(withJSONObject: json).write(to: timestamp)
        default:
            let manifest = folder.appending(path: "manifest.json")
            try (try Data(contentsOf: manifest) + Data(" ".utf8)).write(to: manifest)
        }
        let fetch = try self.installOffline(setup, home: other, export: folder)
        #expect(fetch.status == 65, "\(fetch.stderr)")
        let words = ["missing": "metadata is missing", "altered": "timestamp metadata version 3 was refused: threshold not met"]
        #expect(fetch.stderr.contains(words[fault] ?? "length: the manifest has"), "\(fetch.stderr)")
        #expect(!FileManager.default.fileExists(atPath: other.appending(path: "Caches/com.example.big").path))
    }

    @Test func aHomeThatDoesNotTrustTheRepositoryRefusesItsExport() throws {
        let setup = try Setup("tuf-export-untrusted")
        let folder = try self.export(setup, "tuf-export-untrusted")
        let other = try self.otherHome(setup, "tuf-export-untrusted", trust: false)
        defer { for url in [folder, other] { try? FileManager.default.removeItem(at: url) } }
        let fetch = try self.installOffline(setup, home: other, export: folder)
        #expect(fetch.status == 65, "\(fetch.stderr)")
        #expect(fetch.stderr.contains("does not trust that repository"), "\(fetch.stderr)")
        #expect(!FileManager.default.fileExists(atPath: other.appending(path: "Caches/com.example.big").path))
    }
}
