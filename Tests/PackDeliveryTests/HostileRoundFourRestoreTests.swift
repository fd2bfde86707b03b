import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Issue 43, items 18, 19 and 23: `packs use` takes the packs of one product, an evicted pack is fetched again on its
/// own, and two restores at once fetch each pack once (in one process and across processes).
@Suite(.timeLimit(.minutes(5))) struct HostileRoundFourRestoreTests {
    /// Item 18: `packs use A B --manifest M` bought product B and exited 0. Any argument that is not a pack of the
    /// product is a usage error (64) with one line naming it, and nothing is fetched or recorded.
    @Test func useRefusesAnythingThatIsNotAPackOfItsProduct() throws {
        let site = try BudgetSite("use-one-site", count: 2, size: 64 << 10)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("use-one-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let (a, b) = (BudgetSite.product(1), BudgetSite.product(2))

        let other = try CLI.run(home: home, ["use", a, b, "--manifest", manifest])
        #expect(other.status == 64, "another product is a usage error: \(other.status) \(other.stderr)")
        #expect(other.stderr.contains("'\(b)' is not a pack of \(a)"), "\(other.stderr)")
        #expect(other.stdout.isEmpty, "no folder printed: \(other.stdout)")
        let typo = try CLI.run(home: home, ["use", a, "com.example.nope", "--manifest", manifest])
        #expect(typo.status == 64 && typo.stderr.contains("'com.example.nope' is not a pack of"), "\(typo.status) \(typo.stderr)")
        let unknown = try CLI.run(home: home, ["use", "com.example.none", b, "--manifest", manifest])
        #expect(unknown.status == 65, "a product the manifest does not list, as fetch says it: \(unknown.status) \(unknown.stderr)")
        #expect(!nginx.requests().contains { $0.uri.hasSuffix(".tar") }, "no pack was fetched: \(nginx.requests())")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "nothing was bought: \(status.stdout)")
        #expect(try CLI.run(home: home, ["content"]).status == 64, "nothing is installed")

        // Its own pack, named or not, is fetched as before.
        let own = try CLI.run(home: home, ["use", a, a, "--manifest", manifest])
        #expect(own.status == 0, "\(own.stderr)")
        #expect(FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(a)/Contents/data.bin").path))
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(b)").path), "the other product was not bought")
        let installed = try CLI.run(home: home, ["use", a, b])
        #expect(
            installed.status == 64 && installed.stderr.contains("'\(b)' is not a pack of \(a)"),
            "without a manifest too: \(installed.stderr)")
    }

    /// Item 19: after `packs gc --to 0`, `packs use P` said "not installed, and no download of it is recorded" (64)
    /// unless `--manifest` was given again. The eviction keeps what a fetch needs: `use` alone fetches the pack again
    /// (from the recorded URL), prints its folder, and finishes the restore transaction it made.
    @Test func useFetchesAnEvictedPackAgainWithoutTheManifest() throws {
        let site = try BudgetSite("evicted-use-site", count: 1, size: 256 << 10)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("evicted-use-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let product = BudgetSite.product(1)
        let data = home.appending(path: "Caches/\(product)/Contents/data.bin")
        #expect(try CLI.run(home: home, ["fetch", manifest, product]).status == 0)
        let original = try Data(contentsOf: data)
        let gc = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(gc.status == 0 && !FileManager.default.fileExists(atPath: data.path), "evicted: \(gc.stderr)")
        #expect(try CLI.run(home: home, ["content", product]).status == 64, "evicted, not installed")

        let use = try CLI.run(home: home, ["use", product])
        #expect(use.status == 0, "the evicted pack is fetched again on its own: \(use.status) \(use.stderr)")
        #expect(use.stdout == home.appending(path: "Caches/\(product)").path + "\n", "\(use.stdout)")
        #expect(try Data(contentsOf: data) == original, "the same bytes in place")
        nginx.waitForRequests(3)
        let packs = nginx.requests().filter { $0.uri.hasSuffix("/p1.tar") }
        #expect(packs.count == 2 && packs.allSatisfy { $0.status == 200 }, "fetched once more: \(packs)")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "the restore it made was finished: \(status.stdout)")
        #expect(!status.stdout.contains("evicted"), "no longer listed as evicted: \(status.stdout)")
        let content = try CLI.run(home: home, ["content", product])
        #expect(content.status == 0 && content.stdout == use.stdout, "\(content.stderr)")
        #expect(try CLI.run(home: home, ["verify"]).status == 0)
    }

    /// Item 19, in the library: `ensureAvailable` fetches an evicted pack again with no manifest, presenting the
    /// receipt its purchase stored (a server that checks receipts serves it), and the restore it makes is reported.
    @Test func ensureAvailableFetchesAnEvictedPackAgainWithItsReceipt() async throws {
        let site = try BudgetSite("evicted-lib-site", count: 2, size: 128 << 10)
        let product = BudgetSite.product(1)
        let home = try Fixtures.temporaryDirectory("evicted-lib-home")
        let token = "r-\(UUID().uuidString)"
        let server = try FaultServer(root: site.folder) { authorization in authorization == "Bearer \(token)" ? nil : 401 }
        defer { server.stop() }
        let manifest = try await LoadedManifest.load(
            server.baseURL.appending(path: "manifest.json").absoluteString,
            options: TransferOptions(headers: ["Authorization: Bearer \(token)"]))
        let queue = try await DownloadQueue.open(home: Home(folder: home))
        defer { queue.close() }
        let bought = try await queue.add(product: product, from: manifest, receipt: token)
        _ = try await queue.delivered(transactionID: bought.id)
        try await queue.finish(bought.id)
        let evicted = try queue.evictCaches(downTo: 0)
        #expect(evicted.map(\.contentIdentifier) == [product])
        func packRequests() -> [FaultServer.Request] { server.requests().filter { $0.file == "p1.tar" } }
        #expect(packRequests().map(\.status) == [200], "bought with the receipt: \(server.requests())")

        let folders = try await queue.ensureAvailable(contentIDs: [product])
        #expect(folders.count == 1 && FileManager.default.fileExists(atPath: folders[0].appending(path: "Contents/data.bin").path))
        #expect(packRequests().map(\.status) == [200, 200], "served once more, to the stored receipt: \(server.requests())")
        #expect(try queue.evictedContent().isEmpty)
        let restores = try await queue.transactions().filter { $0.kind == .restored }
        #expect(restores.count == 1 && restores[0].downloads.map(\.contentIdentifier) == [product], "\(restores)")
        // A pack never recorded is still refused, with its code.
        await #expect(throws: PackDeliveryError.self) { _ = try await queue.ensureAvailable(contentIDs: [BudgetSite.product(2)]) }
    }

    /// Item 23: two `restoreCompletedTransactions()` at once on one queue each recorded a restore transaction, and the
    /// pack was served twice. The second joins the first: the same transactions, one restore transaction per product,
    /// one completion, and nginx serves the pack once.
    @Test func twoRestoresAtOnceOnOneQueueFetchThePackOnce() async throws {
        let size = 4 << 20
        let site = try TestSite.random("restore-twice-site", size: size)
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("restore-twice-home")
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let queue = try await DownloadQueue.open(home: Home(folder: home))
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.big", from: manifest)
        _ = try await queue.delivered(transactionID: bought.id)
        try await queue.finish(bought.id)
        let folder = try #require(queue.installedContent(forProductID: "com.example.big").first?.contentURL)
        try FileManager.default.removeItem(at: folder)
        let onePack = nginx.bodyBytesSent(path: "/big.tar")

        let completions = Mutex<[[String]]>([])
        let events = queue.events()
        let watcher = Task {
            for await event in events {
                if case .restoreCompleted(let transactions) = event { completions.withLock { $0.append(transactions.map(\.id)) } }
            }
        }
        defer { watcher.cancel() }
        async let first = queue.restoreCompletedTransactions()
        async let second = queue.restoreCompletedTransactions()
        let (a, b) = try await (first, second)
        #expect(a.map(\.id) == b.map(\.id) && a.count == 1, "the second restore joined the first: \(a.map(\.id)) \(b.map(\.id))")
        #expect(try await queue.transactions().filter { $0.kind == .restored }.count == 1, "one restore transaction for the product")
        let restored = try await queue.settled(downloadID: try #require(a.first?.downloads.first?.id))
        #expect(restored.state == .finished, "\(String(describing: restored.error))")
        let deadline = Date().addingTimeInterval(10)
        while completions.withLock({ $0.isEmpty }), Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        try await Task.sleep(for: .milliseconds(500))
        #expect(completions.withLock { $0 } == [a.map(\.id)], "one completion, for the one restore: \(completions.withLock { $0 })")
        #expect(nginx.waitForRequests(3), "nginx logged the restore's request")
        #expect(
            nginx.bodyBytesSent(path: "/big.tar") == 2 * onePack, "served once for the purchase, once for the restore: \(nginx.requests())")
    }

    /// Item 23 across processes: two `packs fetch --restore` started at once on one home, the installed folder gone.
    /// One records the restore, the other joins it; both exit 0, and nginx serves the pack's bytes once.
    @Test func twoFetchRestoresAtOnceInOneHomeServeThePackOnce() throws {
        let size = 6 << 20
        let site = try TestSite.random("restore-cli-site", size: size)
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("restore-cli-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        #expect(try CLI.run(home: home, ["fetch", manifest, "com.example.big"]).status == 0)
        try FileManager.default.removeItem(at: home.appending(path: "Caches/com.example.big"))
        #expect(nginx.waitForRequests(2))
        let onePack = nginx.bodyBytesSent(path: "/big.tar")

        let logs = try Fixtures.temporaryDirectory("restore-cli-logs")
        func start(_ name: String) throws -> Process {
            let process = Process()
            process.executableURL = URL(filePath: "/bin/sh")
            process.arguments = [
                "-c", "exec \"$0\" \"$@\" >\(logs.path)/\(name).out 2>\(logs.path)/\(name).err", CLI.binary, "--home", home.path, "--json",
                "fetch", manifest, "com.example.big", "--restore",
            ]
            try process.run()
            return process
        }
        let first = try start("first")
        let second = try start("second")
        defer { for process in [first, second] where process.isRunning { process.terminate() } }
        let deadline = Date().addingTimeInterval(60)
        while first.isRunning || second.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        #expect(!first.isRunning && !second.isRunning, "both restores ended within 60 s")
        let stderr = ["first", "second"].map { (try? String(contentsOf: logs.appending(path: "\($0).err"), encoding: .utf8)) ?? "" }
        #expect(
            first.terminationStatus == 0 && second.terminationStatus == 0,
            "both exit 0: \(first.terminationStatus) \(second.terminationStatus) \(stderr)")
        #expect(nginx.waitForRequests(3), "nginx logged the restore's request")
        let packs = nginx.requests().filter { $0.uri.hasSuffix("/big.tar") }
        #expect(packs.count == 2, "one request for the purchase, one for both restores: \(packs)")
        #expect(nginx.bodyBytesSent(path: "/big.tar") == 2 * onePack, "the restore's bytes were served once")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "both runs finished what they recorded: \(status.stdout)")
        #expect(try CLI.run(home: home, ["verify"]).status == 0)
    }
}
