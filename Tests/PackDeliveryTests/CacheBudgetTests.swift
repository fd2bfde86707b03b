import Foundation
@_spi(Testing) import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A site of one-pack products `com.example.p1`…, each pack (`p<i>.tar`) a file of random bytes of `size`.
struct BudgetSite {
    let folder: URL
    var manifestURL: String = ""
    let count: Int

    init(_ label: String, count: Int, size: Int, priorities: [Int: Int] = [:]) throws {
        self.folder = try Fixtures.temporaryDirectory(label)
        self.count = count
        for index in 1...count {
            let content = try Fixtures.temporaryDirectory("\(label)-c\(index)")
            try Fixtures.randomFile(at: content.appending(path: "Contents/data.bin"), size: size)
            try PackWriter.write(
                folder: content, to: self.folder.appending(path: "p\(index).tar"), format: .tar,
                contentInfo: (productIdentifier: Self.product(index), contentVersion: "1.0"))
        }
        var manifest = try ManifestBuilder.write(folder: self.folder)
        if !priorities.isEmpty {
            for product in manifest.products.indices {
                for pack in manifest.products[product].contents.indices {
                    let identifier = manifest.products[product].contents[pack].contentIdentifier
                    if let index = Int(identifier.dropFirst("com.example.p".count)), let priority = priorities[index] {
                        manifest.products[product].contents[pack].preservationPriority = priority
                    }
                }
            }
            try JSONEncoder().encode(manifest).write(to: self.folder.appending(path: "manifest.json"))
        }
    }

    static func product(_ index: Int) -> String { "com.example.p\(index)" }
}

/// Runs `packs ARGS…` with its standard output sent to standard error (`exec`, so the pid is packs'), to watch it.
func watchedPacks(home: URL, _ arguments: [String], environment: [String: String]? = nil) throws -> WatchedProcess {
    try WatchedProcess("/bin/sh", ["-c", "exec \"$0\" \"$@\" 1>&2", CLI.binary, "--home", home.path] + arguments, environment: environment)
}

/// Cached packs evicted to keep a budget or to make room: in order (preservation priority, then least recently used),
/// never documents, leased packs (even by another process, until it dies) or packs of unfinished transactions.
@Suite(.timeLimit(.minutes(5)))
struct CacheBudgetTests {
    static func fetch(_ home: URL, _ site: BudgetSite, _ index: Int, _ extra: [String] = []) throws -> CLI.Result {
        let manifest = site.folder.appending(path: "manifest.json")
        return try CLI.run(
            home: home, ["--json", "fetch", site.manifestURL.isEmpty ? manifest.path : site.manifestURL, BudgetSite.product(index)] + extra)
    }

    static func installed(_ home: URL, _ index: Int) -> Bool {
        FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(BudgetSite.product(index))/Contents/data.bin").path)
    }

    static func evictedEvents(_ result: CLI.Result, event: String = "evicted") -> [String] {
        result.events.filter { $0["event"] as? String == event }.compactMap { $0["contentIdentifier"] as? String }
    }

    @Test func evictionGoesByPreservationPriorityThenLeastRecentlyUsedAndNeverTakesDocuments() throws {
        // p2 is worth keeping (priority 5); p5 goes to documents.
        var site = try BudgetSite("budget-order-site", count: 5, size: 1 << 20, priorities: [2: 5])
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("budget-order-home")
        #expect(try Self.fetch(home, site, 5, ["--to", "documents"]).status == 0)
        for index in 1...3 { #expect(try Self.fetch(home, site, index).status == 0) }
        // p1 is used after p3 was installed: p3 is now the least recently used.
        #expect(try CLI.run(home: home, ["content", BudgetSite.product(1)]).status == 0)

        let dryRun = try CLI.run(home: home, ["--json", "gc", "--to", "0", "--dry-run"])
        #expect(dryRun.status == 0, "stderr: \(dryRun.stderr)")
        #expect(
            Self.evictedEvents(dryRun, event: "wouldEvict") == ["com.example.p3", "com.example.p1", "com.example.p2"],
            "\(dryRun.stdout)")
        #expect((1...3).allSatisfy { Self.installed(home, $0) }, "a dry run deletes nothing")

        // Three cached MiB and one more to come, in a budget of 2.5 MiB: two go, in order.
        let fourth = try Self.fetch(home, site, 4, ["--cache-budget", "2560K"])
        #expect(fourth.status == 0, "stderr: \(fourth.stderr)")
        #expect(Self.evictedEvents(fourth) == ["com.example.p3", "com.example.p1"], "\(fourth.stdout)")
        #expect(!Self.installed(home, 3) && !Self.installed(home, 1) && Self.installed(home, 2) && Self.installed(home, 4))
        #expect(FileManager.default.fileExists(atPath: home.appending(path: "Documents/com.example.p5/Contents/data.bin").path))

        // Everything that may go goes; documents stay.
        let gc = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(gc.status == 0, "stderr: \(gc.stderr)")
        #expect(!Self.installed(home, 2) && !Self.installed(home, 4))
        #expect(FileManager.default.fileExists(atPath: home.appending(path: "Documents/com.example.p5/Contents/data.bin").path))
        let content = try CLI.run(home: home, ["content"])
        #expect(content.status == 0, "stderr: \(content.stderr)")
        #expect(content.stdout.contains("com.example.p3\t1.0\t(evicted)") && content.stdout.contains("com.example.p5\t1.0\t"))
        let status = try CLI.run(home: home, ["--json", "status"])
        let document = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let evicted = (document["evicted"] as? [[String: Any]])?.compactMap { $0["contentIdentifier"] as? String }
        #expect(Set(evicted ?? []) == Set((1...4).map(BudgetSite.product)), "\(status.stdout)")
        #expect(
            ((try? FileManager.default.contentsOfDirectory(atPath: home.appending(path: "Caches/.packdelivery/trash").path)) ?? [])
                .isEmpty, "the trash is emptied")
    }

    @Test func aLeaseInAnotherProcessBlocksEvictionUntilThatProcessDies() throws {
        var site = try BudgetSite("budget-lease-site", count: 2, size: 1 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("budget-lease-home")
        for index in 1...2 { #expect(try Self.fetch(home, site, index).status == 0) }

        let holder = try watchedPacks(home: home, ["lease", BudgetSite.product(1)])
        #expect(holder.waitForStderr("leased l-", timeout: 30), "the lease was taken: \(holder.stderr)")
        let blocked = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(blocked.status == 75, "the leased pack keeps the caches above 0: \(blocked.stdout) \(blocked.stderr)")
        #expect(blocked.stdout.contains("com.example.p2") && !blocked.stdout.contains("com.example.p1"), "\(blocked.stdout)")
        #expect(Self.installed(home, 1) && !Self.installed(home, 2))

        holder.kill()
        let freed = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(freed.status == 0, "stderr: \(freed.stderr)")
        #expect(freed.stdout.contains("evicted  com.example.p1"), "\(freed.stdout)")
        #expect(!Self.installed(home, 1))
    }

    @Test func aLeaseInThisProcessBlocksEvictionUntilItEnds() async throws {
        var site = try BudgetSite("budget-lib-site", count: 2, size: 256 << 10)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("budget-lib-home")
        for index in 1...2 { #expect(try Self.fetch(home, site, index).status == 0) }
        let queue = try DownloadQueue(home: Home(folder: home))
        defer { queue.close() }
        let lease = try queue.beginAccessing(contentIdentifiers: [BudgetSite.product(2)])
        let events = queue.events()
        final class Watcher: DownloadQueueObserver {
            let evicted = Mutex<[String]>([])
            func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {}
            func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {}
            func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent) {
                self.evicted.withLock { $0.append(content.contentIdentifier) }
            }
        }
        let watcher = Watcher()
        queue.add(watcher)
        let first = try queue.evictCaches(downTo: 0)
        #expect(first.map(\.contentIdentifier) == [BudgetSite.product(1)])
        var iterator = events.makeAsyncIterator()
        var seen: [String] = []
        while let event = await iterator.next() {
            if case .evicted(let content) = event {
                seen.append(content.contentIdentifier)
                break
            }
        }
        #expect(seen == [BudgetSite.product(1)], "an evicted event")
        let deadline = ContinuousClock.now + .seconds(20)
        while watcher.evicted.withLock({ $0.isEmpty }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(watcher.evicted.withLock { $0 } == [BudgetSite.product(1)], "the observer's evicted callback, waited for 20 s")
        #expect(try queue.endAccessing(lease))
        #expect(try queue.evictCaches(downTo: 0).map(\.contentIdentifier) == [BudgetSite.product(2)])
        #expect(try queue.evictedContent().count == 2 && queue.installedContent().isEmpty)
        #expect(queue.contentURL(forProductID: BudgetSite.product(1)) == nil)
    }

    /// By a purchase, or by a restore (`fetch --restore`).
    @Test(arguments: [false, true])
    func anEvictedPackIsFetchedAgain(restore: Bool) throws {
        var site = try BudgetSite("budget-again-\(restore)-site", count: 1, size: 1 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("budget-again-\(restore)-home")
        #expect(try Self.fetch(home, site, 1).status == 0)
        let before = try Fixtures.sha256Hex(of: home.appending(path: "Caches/com.example.p1/Contents/data.bin"))
        #expect(try CLI.run(home: home, ["gc", "--to", "0"]).status == 0)
        let content = try CLI.run(home: home, ["content", BudgetSite.product(1)])
        #expect(content.status != 0 && content.stderr.contains("evicted"), "\(content.stderr)")

        let again = try Self.fetch(home, site, 1, restore ? ["--restore"] : [])
        #expect(again.status == 0, "stderr: \(again.stderr)")
        #expect(try Fixtures.sha256Hex(of: home.appending(path: "Caches/com.example.p1/Contents/data.bin")) == before)
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "no longer evicted: \(status.stdout)")
        let verify = try CLI.run(home: home, ["verify", BudgetSite.product(1)])
        #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
        nginx.waitForRequests(2)
        #expect(nginx.requests().filter { $0.uri == "/p1.tar" }.count == 2, "fetched once, then once again after the eviction")
    }

    @Test func theHomeSettingIsTheBudgetOfEveryCommand() throws {
        var site = try BudgetSite("budget-setting-site", count: 3, size: 1 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("budget-setting-home")
        #expect(try CLI.run(home: home, ["config", "cache-budget", "2560K"]).status == 0)
        #expect(try CLI.run(home: home, ["config", "cache-budget"]).stdout == "\(2560 << 10)\n")
        for index in 1...3 { #expect(try Self.fetch(home, site, index).status == 0) }
        #expect(!Self.installed(home, 1) && Self.installed(home, 2) && Self.installed(home, 3))
        #expect(try CLI.run(home: home, ["config", "cache-budget", "none"]).status == 0)
        #expect(try CLI.run(home: home, ["config", "cache-budget"]).stdout == "none\n")
    }
}

/// A full disk resolved by eviction: a real small filesystem (tmpfs).
@Suite(.timeLimit(.minutes(5)), .enabled(if: Tmpfs.available, "mounting a tmpfs needs root; CacheBudgetTests cover the budget"))
struct CacheDiskFullTests {
    @Test func aFullDiskIsResolvedByEvictingCachedPacksBeforePausing() throws {
        let disk = try Tmpfs(megabytes: 32)
        var site = try BudgetSite("budget-full-site", count: 4, size: 4 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = disk.folder.appending(path: "home")
        for index in 1...3 { #expect(try CacheBudgetTests.fetch(home, site, index).status == 0) }
        // A fourth pack needs its 4 MiB twice (archive and files) and the 4 MiB margin: leave 5 MiB.
        disk.fill(leaving: 5 << 20)
        let fourth = try CacheBudgetTests.fetch(home, site, 4)
        #expect(fourth.status == 0, "room was made instead of pausing: \(fourth.stderr)")
        #expect(CacheBudgetTests.evictedEvents(fourth) == ["com.example.p1", "com.example.p2"], "\(fourth.stdout)")
        #expect(CacheBudgetTests.installed(home, 3) && CacheBudgetTests.installed(home, 4), "no more than needed was evicted")
    }

    /// 1 MiB left, less than any pack, as much as SQLite needs to open the state database (with none at all, opening it
    /// fails first, exit 74, before anything can be evicted): the eviction's rename and record still go through.
    @Test func aNearlyFullDiskIsResolvedByEviction() throws {
        let disk = try Tmpfs(megabytes: 40)
        var site = try BudgetSite("budget-nobyte-site", count: 5, size: 4 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = disk.folder.appending(path: "home")
        for index in 1...4 { #expect(try CacheBudgetTests.fetch(home, site, index).status == 0) }
        disk.fill(leaving: 1 << 20)
        let fifth = try CacheBudgetTests.fetch(home, site, 5)
        #expect(fifth.status == 0, "room was made instead of pausing: \(fifth.stderr)")
        let evicted = CacheBudgetTests.evictedEvents(fifth)
        #expect(evicted.count >= 3 && evicted == (1...evicted.count).map(BudgetSite.product), "in order: \(evicted)")
        #expect(CacheBudgetTests.installed(home, 5))
    }
}

private let evictionPowerCutSkipped = Comment(rawValue: PowerCutDisk.unavailableReason ?? "")

/// Power cuts during an eviction: each pack is either installed and verifying, or evicted and recorded as such.
@Suite(.timeLimit(.minutes(5)), .serialized, .enabled(if: PowerCutDisk.unavailableReason == nil, evictionPowerCutSkipped))
struct EvictionPowerCutTests {
    enum Moment: String, CaseIterable, Sendable {
        /// The folder was renamed into the trash and synced; the record is not committed.
        case afterTheMove = "eviction-moved"
        /// `packs gc` exited 0.
        case afterExit = "exit"
    }

    @Test(arguments: Moment.allCases)
    func aCutDuringAnEvictionLeavesEachPackInstalledOrEvictedAndRecorded(moment: Moment) throws {
        var site = try BudgetSite("evict-cut-\(moment.rawValue)-site", count: 2, size: 1 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        site.manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let disk = try PowerCutDisk("evict-cut-\(moment.rawValue)", megabytes: 64)
        let home = disk.mountPoint.appending(path: "home")
        for index in 1...2 { #expect(try CacheBudgetTests.fetch(home, site, index).status == 0) }

        if moment == .afterExit {
            #expect(try CLI.run(home: home, ["gc", "--to", "0"]).status == 0)
            try disk.cut()
        } else {
            var environment = ProcessInfo.processInfo.environment
            environment["PACKS_TEST_PAUSE_AT"] = moment.rawValue
            let gc = try WatchedProcess(CLI.binary, ["--home", home.path, "gc", "--to", "0"], environment: environment)
            #expect(gc.waitForStderr("paused at \(moment.rawValue)", timeout: 60), "gc reached the move: \(gc.stderr)")
            try disk.cut()
            gc.kill()
        }
        try disk.remount()

        var evicted: [Int] = []
        for index in 1...2 {
            let product = BudgetSite.product(index)
            let content = try CLI.run(home: home, ["content", product])
            if content.status == 0 {
                let verify = try CLI.run(home: home, ["verify", product])
                #expect(verify.status == 0, "\(moment.rawValue): \(product) is installed and verifies: \(verify.stdout) \(verify.stderr)")
            } else {
                #expect(content.stderr.contains("was evicted"), "\(moment.rawValue): \(product) is recorded evicted: \(content.stderr)")
                #expect(!CacheBudgetTests.installed(home, index))
                evicted.append(index)
            }
        }
        // The first pack's folder had reached the trash: its eviction is recorded (rolled forward) at the next launch.
        #expect(evicted == (moment == .afterExit ? [1, 2] : [1]), "\(moment.rawValue): evicted \(evicted)")
        #expect(
            ((try? FileManager.default.contentsOfDirectory(atPath: home.appending(path: "Caches/.packdelivery/trash").path)) ?? [])
                .isEmpty, "\(moment.rawValue): the trash is emptied")
        let again = try CacheBudgetTests.fetch(home, site, 1)
        #expect(again.status == 0 && CacheBudgetTests.installed(home, 1), "\(moment.rawValue): fetched again: \(again.stderr)")
        #expect(try CLI.run(home: home, ["verify", BudgetSite.product(1)]).status == 0)
    }
}
