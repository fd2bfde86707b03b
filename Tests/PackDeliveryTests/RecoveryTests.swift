import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Verify and repair, the launch check of recent installs and a damaged state
/// database: installed content is checked against what was installed, and damage is
/// delivered again without touching anything else.
@Suite(.timeLimit(.minutes(5))) struct RecoveryTests {
    static let samples = CLI.packageRoot.appending(path: "SampleContent")

    /// Sample packs served by nginx, with forest and atlas installed in a fresh home.
    struct Installed {
        let site: TestSite
        let nginx: NginxServer
        let home: URL
        var forest: URL { self.home.appending(path: "Caches/com.example.forest") }
        var atlas: URL { self.home.appending(path: "Caches/com.example.atlas") }

        init(_ label: String) throws {
            self.site = try TestSite.samples(label + "-site")
            self.nginx = try NginxServer(root: self.site.folder)
            self.home = try Fixtures.temporaryDirectory(label + "-home")
            let fetch = try CLI.run(
                home: self.home,
                [
                    "fetch", self.nginx.baseURL.appending(path: "manifest.json").absoluteString,
                    "com.example.forest", "com.example.atlas",
                ])
            guard fetch.status == 0 else { throw FixtureError("fetch failed: \(fetch.stderr)") }
        }
    }

    /// The regular files of a folder (relative path → bytes), excluding folders.
    static func files(_ folder: URL) throws -> [String: Data] { try treeContents(folder) }

    @Test func verifyNamesEveryDamageAndRepairRestoresOnlyThatProduct() throws {
        let installed = try Installed("verify")
        defer { installed.nginx.stop() }
        let atlasBefore = try Self.files(installed.atlas)
        var names = try Self.files(installed.forest).keys.filter { $0.hasPrefix("Contents/") && !$0.hasSuffix("/") }.sorted()
        try #require(names.count >= 3, "forest has at least three content files: \(names)")
        let (truncated, altered, deleted) = (names.removeFirst(), names.removeFirst(), names.removeFirst())
        // Truncate one file, change one byte of another (same size), delete a third, add a fourth.
        let truncatedURL = installed.forest.appending(path: truncated)
        #expect(truncate(truncatedURL.path, 1) == 0)
        let alteredURL = installed.forest.appending(path: altered)
        var bytes = try Data(contentsOf: alteredURL)
        bytes[bytes.startIndex] ^= 0xFF
        try bytes.write(to: alteredURL)
        try FileManager.default.removeItem(at: installed.forest.appending(path: deleted))
        try Data("not from the pack".utf8).write(to: installed.forest.appending(path: "Contents/extra.txt"))

        let verify = try CLI.run(home: installed.home, ["verify"])
        #expect(verify.status == 65, "damage is exit 65: \(verify.stdout) \(verify.stderr)")
        for (problem, path) in [("truncated", truncated), ("changed", altered), ("missing", deleted), ("extra", "Contents/extra.txt")] {
            #expect(verify.stdout.contains("\(problem)  \(path)"), "names \(problem) \(path): \(verify.stdout)")
        }
        #expect(verify.stdout.contains("intact com.example.atlas"), "\(verify.stdout)")
        let json = try CLI.run(home: installed.home, ["--json", "verify"])
        let document = try #require(
            try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any], "one JSON document: \(json.stdout)")
        #expect(document["intact"] as? Bool == false && (document["contents"] as? [[String: Any]])?.count == 2)

        let repair = try CLI.run(home: installed.home, ["verify", "--repair", "com.example.forest"])
        #expect(repair.status == 0, "repair: \(repair.stdout) \(repair.stderr)")
        let source = try Self.files(Self.samples.appending(path: "forest"))
        #expect(try Self.files(installed.forest) == source, "forest is byte-exact again, without the extra file")
        #expect(try Self.files(installed.atlas) == atlasBefore, "atlas was not touched")
        #expect(try CLI.run(home: installed.home, ["verify"]).status == 0)
        #expect(
            try CLI.run(home: installed.home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#),
            "the restore transaction finished")
    }

    @Test func anInstallDamagedBehindTheQueuesBackIsDeliveredAgainAtTheNextLaunch() async throws {
        let installed = try Installed("launch-check")
        defer { installed.nginx.stop() }
        let file = try #require(try Self.files(installed.forest).keys.first { $0.hasPrefix("Contents/") })
        let original = try Data(contentsOf: installed.forest.appending(path: file))
        #expect(truncate(installed.forest.appending(path: file).path, 0) == 0)

        // The next launch of the library: before anything else, the recent installs are checked.
        let queue = try DownloadQueue(home: Home(folder: installed.home))
        defer { queue.close() }
        let restored = try await #require(
            try queue.transactions().first { $0.kind == .restored && $0.productIdentifier == "com.example.forest" },
            "a restore transaction shows up for the damaged product")
        let id = try #require(restored.downloads.first { $0.state != .finished }?.id)
        let done = await waitFor(queue, id) { !$0.state.isRunning }
        #expect(done?.state == .finished, "\(String(describing: done?.error))")
        #expect(try Data(contentsOf: installed.forest.appending(path: file)) == original)
        #expect(try await queue.verify(productIDs: ["com.example.forest", "com.example.atlas"]).allSatisfy(\.isIntact))
    }

    @Test func repeatedLaunchesTakeOverOneRestoreInsteadOfAddingMore() throws {
        let installed = try Installed("launch-once")
        defer { installed.nginx.stop() }
        let file = try #require(try Self.files(installed.forest).keys.first { $0.hasPrefix("Contents/") })
        #expect(truncate(installed.forest.appending(path: file).path, 0) == 0)
        for _ in 0..<3 { #expect(try CLI.run(home: installed.home, ["status"]).status == 0) }
        let status = try CLI.run(home: installed.home, ["--json", "status"])
        let transactions =
            try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])["transactions"]
            as? [[String: Any]]
        #expect(transactions?.count == 1 && transactions?.first?["kind"] as? String == "restored", "one restore: \(status.stdout)")
        let resume = try CLI.run(home: installed.home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        #expect(try CLI.run(home: installed.home, ["verify"]).status == 0)
        #expect(try CLI.run(home: installed.home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }

    @Test(arguments: ["garbage", "truncated"])
    func aDamagedStateDatabaseIsMovedAsideAndRebuiltKeepingEveryInstalledFolder(damage: String) throws {
        let installed = try Installed("damaged-db-\(damage)")
        defer { installed.nginx.stop() }
        let database = installed.home.appending(path: "state.sqlite")
        #expect(
            !FileManager.default.fileExists(atPath: database.path + "-wal"),
            "the last process checkpointed its WAL: \((try? FileManager.default.contentsOfDirectory(atPath: installed.home.path)) ?? []) \((try? FileManager.default.attributesOfItem(atPath: database.path + "-wal")[.size]) ?? "")"
        )
        let forest = try Self.files(installed.forest)
        let handle = try FileHandle(forUpdating: database)
        if damage == "garbage" {
            try handle.seek(toOffset: 0)
            try handle.write(contentsOf: Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 37) }))
        } else {
            let size = try handle.seekToEnd()
            try handle.truncate(atOffset: size / 2)
        }
        try handle.close()

        let content = try CLI.run(home: installed.home, ["content"])
        #expect(content.status == 0, "the command works: \(content.stderr)")
        #expect(content.stderr.contains("damaged") && content.stderr.contains("rebuilt"), "says what happened: \(content.stderr)")
        #expect(
            content.stdout.contains("com.example.forest") && content.stdout.contains("com.example.atlas"),
            "both installs are known again: \(content.stdout)")
        let aside = try FileManager.default.contentsOfDirectory(atPath: installed.home.path).filter {
            $0.hasPrefix("state.sqlite.damaged-")
        }
        #expect(!aside.isEmpty, "the damaged file was kept aside")
        #expect(try Self.files(installed.forest) == forest, "installed folders are kept")
        #expect(try CLI.run(home: installed.home, ["verify"]).status == 0)
        let again = try CLI.run(home: installed.home, ["content", "com.example.forest"])
        #expect(again.status == 0 && again.stderr.isEmpty, "later commands are quiet: \(again.stderr)")
    }
}
