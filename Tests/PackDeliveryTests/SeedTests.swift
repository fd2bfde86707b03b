import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// `packs fetch --seed DIR` (issue 46, installs from local media): chunks found in a folder on this machine, verified
/// against the pack's index, are copied instead of fetched, in a first install. Real nginx, real files, the built
/// `packs`; trees compared with `bsdtar -xf` of the pack, bytes served counted from nginx's log.
@Suite(.serialized, .timeLimit(.minutes(6))) struct SeedTests {
    static let product = WriteOnceTests.product
    static let format = PackFormat.tarZstd
    static var pack: String { WriteOnceTests.packName(Self.format) }

    /// Version 1's content, version 2's (1% of it changed: 256 KiB of the big file and one small file), and a site
    /// serving version 2.
    struct Versions {
        var v1: URL
        var v2: URL
        var site: URL
        var folders: [URL]

        func remove() { for folder in self.folders { try? FileManager.default.removeItem(at: folder) } }
    }

    static func versions(_ label: String) throws -> Versions {
        let v1 = try WriteOnceTests.content(label + "-v1")
        let v2 = try Fixtures.temporaryDirectory(label + "-v2")
        try FileManager.default.removeItem(at: v2)
        try FileManager.default.copyItem(at: v1, to: v2)
        let big = try FileHandle(forWritingTo: v2.appending(path: "Contents/big.bin"))
        try big.seek(toOffset: 10 << 20)
        try big.write(contentsOf: Data(chunkedPackBytes(256 << 10, seed: 46)))
        try big.close()
        try Fixtures.randomFile(at: v2.appending(path: "Contents/small/f3.bin"), size: 200 << 10)
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try WriteOnceTests.publish(v2, site: site, format: Self.format)
        return Versions(v1: v1, v2: v2, site: site, folders: [v1, v2, site])
    }

    /// A copy of `folder` in a new temporary folder (a seed on "another disk").
    static func copy(_ folder: URL, _ label: String) throws -> URL {
        let copy = try Fixtures.temporaryDirectory(label)
        try FileManager.default.removeItem(at: copy)
        try FileManager.default.copyItem(at: folder, to: copy)
        return copy
    }

    @Test func aFirstInstallSeededWithTheEarlierVersionFetchesOnlyWhatChanged() throws {
        let versions = try Self.versions("seed-v1")
        defer { versions.remove() }
        let seed = try Self.copy(versions.v1, "seed-v1-seed")
        let home = try Fixtures.temporaryDirectory("seed-v1-home")
        defer { for folder in [seed, home] { try? FileManager.default.removeItem(at: folder) } }
        let nginx = try NginxServer(root: versions.site)
        defer { nginx.stop() }
        let packLength = try WriteOnceTests.length(versions.site.appending(path: Self.pack))

        let fetch = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, Self.product, "--seed", seed.path])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(
            try treeContents(installed) == (try WriteOnceTests.reference(versions.site, Self.format, "seed-v1-bsdtar")), "byte for byte")
        nginx.waitForRequests(2)
        let served = nginx.bodyBytesSent(path: "/" + Self.pack)
        print("seeded first install: \(served) bytes of the \(packLength)-byte pack served")
        #expect(served > 0 && served <= packLength / 20, "only the changed chunks served: \(served) of \(packLength)")
        #expect(!fetch.stderr.contains("warning"), "no seed dropped: \(fetch.stderr)")
        let verify = try CLI.run(home: home, ["verify"])
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    @Test func aSeedFileChangedAfterTheCopyIsCaughtByItsChunksAndFetched() throws {
        let versions = try Self.versions("seed-changed")
        defer { versions.remove() }
        let seed = try Self.copy(versions.v2, "seed-changed-seed")
        let home = try Fixtures.temporaryDirectory("seed-changed-home")
        defer { for folder in [seed, home] { try? FileManager.default.removeItem(at: folder) } }
        // The same version, one file changed in the seed since: 64 KiB in the middle of the big file.
        let big = try FileHandle(forWritingTo: seed.appending(path: "Contents/big.bin"))
        try big.seek(toOffset: 5 << 20)
        try big.write(contentsOf: Data(repeating: 0x5a, count: 64 << 10))
        try big.close()
        let nginx = try NginxServer(root: versions.site)
        defer { nginx.stop() }
        let packLength = try WriteOnceTests.length(versions.site.appending(path: Self.pack))

        let fetch = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, Self.product, "--seed", seed.path])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(
            try treeContents(installed) == (try WriteOnceTests.reference(versions.site, Self.format, "seed-changed-bsdtar")),
            "byte for byte, the changed chunks not installed")
        nginx.waitForRequests(2)
        let served = nginx.bodyBytesSent(path: "/" + Self.pack)
        print("seeded with a changed file: \(served) bytes of the \(packLength)-byte pack served")
        #expect(served > 0, "the changed chunks fetched")
        #expect(served <= packLength / 50, "only the changed chunks: \(served) of \(packLength)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The seed folder removed while the install runs (after its chunks were found, before they are copied): the
    /// attempt is tried again, the seed dropped with a warning on stderr, and the rest fetched from the network.
    @Test func aSeedRemovedMidInstallIsDroppedWithAWarningAndTheRestFetched() throws {
        let seed = try Fixtures.temporaryDirectory("seed-gone-seed")
        defer { try? FileManager.default.removeItem(at: seed) }
        try Self.loseSeedMidInstall(seed: seed, label: "seed-gone", warned: true) { try FileManager.default.removeItem(at: seed) }
    }

    /// The seed on a disk that goes away while the install runs (a tmpfs, unmounted lazily, as a USB disk pulled out):
    /// the install finishes byte for byte. Files of the seed already open stay readable after a lazy unmount, so whether
    /// the seed is dropped (with its warning) or read to the end depends on how far the install got.
    @Test(.enabled(if: Tmpfs.available, "mounting a tmpfs needs root; the removed-seed test covers the same fallback"))
    func aSeedOnATmpfsUnmountedMidInstallFallsBackToTheNetwork() throws {
        let disk = try Tmpfs(megabytes: 128)
        defer { disk.unmount() }
        try Self.loseSeedMidInstall(seed: disk.folder, label: "seed-unmounted", warned: false) { disk.unmount() }
    }

    /// Fills `seed` with version 1, fetches version 2 seeded with it from a slow server, calls `lose` once the install
    /// planned from the seed, and checks the install finished byte for byte (`warned`: with a warning naming the seed).
    static func loseSeedMidInstall(seed: URL, label: String, warned: Bool, lose: () throws -> Void) throws {
        let versions = try Self.versions(label)
        defer { versions.remove() }
        for item in try FileManager.default.contentsOfDirectory(atPath: versions.v1.path) {
            try FileManager.default.copyItem(at: versions.v1.appending(path: item), to: seed.appending(path: item))
        }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        defer { try? FileManager.default.removeItem(at: home) }
        // Slow enough that the changed chunks (about 500 KiB) take half a second.
        let nginx = try NginxServer(root: versions.site, limitRate: 1 << 20)
        defer { nginx.stop() }
        let fetch = try WatchedProcess(
            CLI.binary,
            [
                "--home", home.path, "fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, Self.product, "--seed",
                seed.path,
            ])
        defer { fetch.kill() }
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        let planned = waitUntil(timeout: 60) {
            let folders = (try? FileManager.default.contentsOfDirectory(atPath: downloads.path)) ?? []
            return folders.contains { FileManager.default.fileExists(atPath: downloads.appending(path: "\($0)/verified").path) }
        }
        #expect(planned, "the install planned from the seed and started fetching")
        try lose()
        let status = fetch.waitForExit(timeout: 120)
        #expect(status == 0, "installed: \(fetch.stderr)")
        if warned {
            #expect(fetch.stderr.contains("warning: the seed \(seed.path) is dropped"), "the seed dropped, said on stderr: \(fetch.stderr)")
        }
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(
            try treeContents(installed) == (try WriteOnceTests.reference(versions.site, Self.format, label + "-bsdtar")), "byte for byte")
        let verify = try CLI.run(home: home, ["verify"])
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// A signed manifest whose pack and index URLs are absolute (on nginx): fetched on one home, exported, then fetched
    /// from the export on a second home in a network namespace of its own, the server stopped: installs byte for byte, checked against the trusted
    /// publisher, and `packs verify` passes. The export keeps the manifest's bytes and signature as served.
    @Test func anExportInstallsOnASecondHomeWithNoNetwork() throws {
        let versions = try Self.versions("export")
        defer { versions.remove() }
        let folders = try (0..<3).map { try Fixtures.temporaryDirectory("export-\($0)") }
        defer { for folder in folders { try? FileManager.default.removeItem(at: folder) } }
        let (first, second, export) = (folders[0].appending(path: "home"), folders[1].appending(path: "home"), folders[2])
        let nginx = try NginxServer(root: versions.site)
        var stopped = false
        defer { if !stopped { nginx.stop() } }
        // Absolute URLs, a version, signed.
        let manifestFile = versions.site.appending(path: "manifest.json")
        var json = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: manifestFile)) as? [String: Any])
        json["version"] = 1
        var products = try #require(json["products"] as? [[String: Any]])
        for (p, product) in products.enumerated() {
            var contents = try #require(product["contents"] as? [[String: Any]])
            for (c, content) in contents.enumerated() {
                var content = content
                content["url"] = nginx.baseURL.appending(path: try #require(content["url"] as? String)).absoluteString
                if var index = content["index"] as? [String: Any] {
                    index["url"] = nginx.baseURL.appending(path: try #require(index["url"] as? String)).absoluteString
                    content["index"] = index
                }
                contents[c] = content
            }
            products[p]["contents"] = contents
        }
        json["products"] = products
        let bytes = try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys])
        try bytes.write(to: manifestFile)
        let key = try PublisherSigningKey.generate()
        try JSONEncoder().encode(try ManifestSignature(signing: bytes, with: key))
            .write(to: versions.site.appending(path: "manifest.json.sig"))
        let pub = folders[2].deletingLastPathComponent().appending(path: "\(folders[2].lastPathComponent).pub")
        defer { try? FileManager.default.removeItem(at: pub) }
        try key.publicKey.pem.write(to: pub, atomically: true, encoding: .utf8)

        let url = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let fetch = try CLI.run(home: first, ["fetch", url, Self.product, "--trust", pub.path])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let exported = try CLI.run(home: first, ["export", Self.product, "--to", export.path, "--trust", pub.path])
        #expect(exported.status == 0, "\(exported.stdout)\(exported.stderr)")
        #expect(try Data(contentsOf: export.appending(path: "manifest.json")) == bytes, "the manifest's bytes as served")
        #expect(FileManager.default.fileExists(atPath: export.appending(path: "manifest.json.sig").path), "its signature kept")
        nginx.stop()
        stopped = true

        // No network at all: in a network namespace of its own (a loopback that is down, no route) where `unshare` may
        // make one (as root, as CI runs); with the server stopped either way.
        let arguments = ["--home", second.path, "fetch", export.appending(path: "manifest.json").path, Self.product, "--trust", pub.path]
        let isolated = (try? Fixtures.run("unshare", ["--net", "--", "true"], timeout: 10).status) == 0
        if !isolated { print("SeedTests: unshare --net is not allowed here; the offline install runs with the server stopped only") }
        let offline =
            isolated
            ? try Fixtures.run("unshare", ["--net", "--", CLI.binary] + arguments, timeout: 120)
            : try Fixtures.run(CLI.binary, arguments, timeout: 120)
        #expect(offline.status == 0, "installed with no network (namespace: \(isolated)): \(offline.stderr)")
        let installed = second.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try WriteOnceTests.reference(versions.site, Self.format, "seed-bsdtar")), "byte for byte")
        let verify = try CLI.run(home: second, ["verify"])
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
        // Another publisher's key: the export's manifest is refused, as any fetch's.
        let other = try PublisherSigningKey.generate()
        try other.publicKey.pem.write(to: pub, atomically: true, encoding: .utf8)
        let refused = try CLI.run(
            home: folders[1].appending(path: "third"),
            ["fetch", export.appending(path: "manifest.json").path, Self.product, "--trust", pub.path])
        #expect(refused.status == 65, "untrusted: \(refused.status) \(refused.stderr)")
    }

    @Test func aSeedThatIsNotAFolderIsAUsageErrorAndNothingIsRecorded() throws {
        let parent = try Fixtures.temporaryDirectory("seed-bad")
        defer { try? FileManager.default.removeItem(at: parent) }
        let home = parent.appending(path: "home")
        let fetch = try CLI.run(
            home: home, ["fetch", "http://127.0.0.1:9/manifest.json", Self.product, "--seed", parent.appending(path: "missing").path])
        #expect(fetch.status == 64, "usage error: \(fetch.status) \(fetch.stderr)")
        #expect(fetch.stderr.contains("--seed") && fetch.stderr.contains("no such folder"), "\(fetch.stderr)")
        #expect(!FileManager.default.fileExists(atPath: home.path), "no home made, nothing recorded")
    }
}
