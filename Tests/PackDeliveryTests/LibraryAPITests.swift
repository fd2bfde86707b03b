import Foundation
import Logging
import PackDelivery
import PackServer
import PackTestSupport
import Synchronization
import Testing

/// The library as a store client embeds it — main-actor observation, one await per
/// operation, StoreKit's missing pieces (explicit start, restore, removed transactions, throughput),
/// credentials that change, manifests built in memory, and the bugs of the first round.
@Suite(.timeLimit(.minutes(5))) struct LibraryAPITests {
    /// Sample packs served by `packs serve`'s server, and a queue on a fresh home.
    struct Shop {
        let site: TestSite
        let server: RunningPackServer
        let queue: DownloadQueue
        let manifest: LoadedManifest
        let home: URL

        init(_ label: String, token: String? = nil, configuration: DownloadQueue.Configuration = .init(resumeWhenSpaceReturns: false))
            async throws
        {
            self.site = try TestSite.samples(label + "-site")
            self.server = try await PackServer.start(
                PackServerConfiguration(directory: self.site.folder, port: 0, token: token), logger: Logger(label: "test"))
            self.home = try Fixtures.temporaryDirectory(label + "-home")
            self.queue = try await DownloadQueue.open(home: Home(folder: self.home), configuration: configuration)
            var manifest = try self.site.manifest()
            for index in manifest.products.indices {
                for pack in manifest.products[index].contents.indices {
                    manifest.products[index].contents[pack].url =
                        self.server.baseURL.appending(path: manifest.products[index].contents[pack].url).absoluteString
                }
            }
            // A manifest built in memory, as a backend that hands out per-purchase URLs would.
            self.manifest = try LoadedManifest(manifest: manifest, baseURL: self.server.baseURL.appending(path: "manifest.json"))
        }

        func stop() async {
            await self.queue.close()
            await self.server.stop()
        }
    }

    /// Marks the main queue, which serves the main actor (libdispatch may drain it from another thread on Linux).
    static let mainQueueKey = DispatchSpecificKey<Bool>()

    /// A view model on the main actor, as an app has one.
    @MainActor final class ViewModel: DownloadQueueMainActorObserver {
        var progress: [String: Double] = [:]
        var rates: [Double] = []
        var removed: [String] = []
        var restored: [[Transaction]] = []
        var offMain = 0

        func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
            if DispatchQueue.getSpecific(key: LibraryAPITests.mainQueueKey) != true { self.offMain += 1 }
        }
        func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
            if DispatchQueue.getSpecific(key: LibraryAPITests.mainQueueKey) != true { self.offMain += 1 }
            for download in downloads {
                self.progress[download.id] = download.progress
                if let rate = download.bytesPerSecond { self.rates.append(rate) }
            }
        }
        func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction]) {
            self.removed += transactions.map(\.id)
        }
        func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction]) {
            self.restored.append(transactions)
        }
    }

    @MainActor @Test func aMainActorObserverGetsEveryCallbackOnTheMainActorAndOneAwaitSettlesATransaction() async throws {
        DispatchQueue.main.setSpecific(key: Self.mainQueueKey, value: true)
        let shop = try await Shop("main-actor")
        let model = ViewModel()
        shop.queue.add(model)
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        let settled = try await shop.queue.settled(transactionID: transaction.id)
        #expect(settled.isFinishable && settled.downloads.allSatisfy { $0.state == .finished })
        try await shop.queue.finish(transaction.id)
        // Let the main queue deliver what is in flight.
        for _ in 0..<50 where !model.removed.contains(transaction.id) { try await Task.sleep(for: .milliseconds(20)) }
        #expect(model.offMain == 0, "every callback ran on the main queue, the main actor's")
        #expect(model.progress.values.contains(1.0), "progress reached the model")
        #expect(model.removed == [transaction.id], "finishing reports the transaction as removed")
        await shop.stop()
    }

    @Test func cancellingAWaitStopsTheWaitNotTheDownload() async throws {
        let site = try TestSite.random("cancel-wait", size: 600_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .slow(bytesPerSecond: 400_000)).absoluteString
        let loaded = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        let queue = try await DownloadQueue.open(home: Home(folder: try Fixtures.temporaryDirectory("cancel-wait-home")))
        let transaction = try await queue.add(product: "com.example.big", from: loaded)
        let waiting = Task { try await queue.settled(transactionID: transaction.id) }
        try await Task.sleep(for: .milliseconds(300))
        waiting.cancel()
        do {
            _ = try await waiting.value
            Issue.record("a cancelled wait must end before the download does")
        } catch let error as PackDeliveryError {
            #expect(error.code == .cancelled)
        }
        let id = try #require(transaction.downloads.first?.id)
        let done = try await queue.settled(downloadID: id)
        #expect(done.state == .finished, "the download went on: \(String(describing: done.error))")
        await queue.close()
    }

    @Test func addingWithoutStartingMovesNoByteUntilStart() async throws {
        let shop = try await Shop("explicit-start")
        let transaction = try await shop.queue.add(product: "com.example.ocean", from: shop.manifest, start: false)
        let download = try #require(transaction.downloads.first)
        #expect(
            download.state == .paused && download.pauseReason == .notStarted && download.contentLength > 0,
            "the size is known before any byte moves")
        try await Task.sleep(for: .milliseconds(500))
        #expect(FileManager.default.fileExists(atPath: shop.home.appending(path: "Caches/com.example.ocean").path) == false)
        // Resuming everything does not count as the user's yes.
        #expect(try shop.queue.resume().isEmpty)
        let still = try #require(try await shop.queue.transactions().first { $0.id == transaction.id }?.downloads.first)
        #expect(still.state == .paused && still.pauseReason == .notStarted, "resume() started a download added with start: false")
        try await shop.queue.start([download.id])
        let done = try await shop.queue.settled(downloadID: download.id)
        #expect(done.state == .finished)
        await shop.stop()
    }

    /// One await per purchase (issue 30, item 5): `delivered` waits through a pause and its resume, returns on the
    /// pause only when asked, and ends with the download's own error when it fails for good or is cancelled.
    @Test func oneAwaitDeliversAPurchaseThroughAPauseAndEndsWithTheErrorOfAFailureOrACancel() async throws {
        let site = try TestSite.random("delivered", size: 600_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .slow(bytesPerSecond: 300_000)).absoluteString
        let slow = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false)
        // Each purchase below fetches the whole pack again (an update from the installed copy would fetch nothing).
        configuration.deltaUpdates = false
        let queue = try await DownloadQueue.open(
            home: Home(folder: try Fixtures.temporaryDirectory("delivered-home")), configuration: configuration)

        // Paused by the user mid-download: the one await goes on through the pause and the resume.
        let transaction = try await queue.add(product: "com.example.big", from: slow)
        let id = try #require(transaction.downloads.first?.id)
        let whole = Task { try await queue.delivered(transactionID: transaction.id) }
        _ = try #require(await waitFor(queue, id) { $0.bytesReceived > 0 }, "bytes arrive")
        try queue.pause([id])
        let atPause = try await queue.delivered(transactionID: transaction.id, returningOnPause: true)
        #expect(atPause.downloads.map(\.state) == [.paused] && !atPause.isFinishable, "asked to, it returns on the pause")
        try queue.resume([id])
        let delivered = try await whole.value
        #expect(delivered.isFinishable && delivered.downloads.map(\.state) == [.finished], "the first await waited through the pause")
        let folder = try #require(delivered.downloads.first?.contentURL)
        #expect(try Fixtures.sha256Hex(of: folder.appending(path: "Contents/data.bin")) == site.dataSHA256)
        try await queue.finish(delivered.id)

        // Cancelled mid-download: the await ends with `cancelled` naming the transaction, which is finishable.
        let again = try await queue.add(product: "com.example.big", from: slow, force: true)
        let againID = try #require(again.downloads.first?.id)
        let cancelledWait = Task { try await queue.delivered(transactionID: again.id) }
        _ = try #require(await waitFor(queue, againID) { $0.bytesReceived > 0 }, "bytes arrive")
        try queue.cancel([againID])
        do {
            let value = try await cancelledWait.value
            Issue.record("a cancelled download is not a delivery: \(value.downloads.map(\.state))")
        } catch let error as PackDeliveryError {
            #expect(error.code == .cancelled && error.subject == again.id, "\(error)")
        }
        try await queue.finish(again.id)

        // A pack whose SHA-256 is not the manifest's fails for good: the await throws that error, by its code.
        manifest.products[0].contents[0].sha256 = String(repeating: "0", count: 64)
        manifest.products[0].contents[0].url = server.url("big.tar").absoluteString
        let wrong = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        let bad = try await queue.add(product: "com.example.big", from: wrong, force: true)
        do {
            let value = try await queue.delivered(transactionID: bad.id)
            Issue.record("a failed download is not a delivery: \(value.downloads.map(\.state))")
        } catch  where error.code == .checksumMismatch {
            #expect(error.subject != nil)
        } catch {
            Issue.record("the download's own error, not \(error)")
        }
        await queue.close()
    }

    /// Issue 30, item 6, as an app sees it: an active download that moves again shows no stale error (here a reset,
    /// then a node that ignores ranges, so the retry starts over from zero), and the first `paused` update of a
    /// paused download carries the bytes it keeps on disk.
    @Test func aMovingDownloadShowsNoStaleErrorAndItsFirstPausedUpdateHasTheBytesKept() async throws {
        let site = try TestSite.random("stale-error", size: 1_500_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url =
            server.url("big.tar", fault: .resetOnceThenIgnoreRange(afterBytes: 1_000_000)).absoluteString
        let resets = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        // Rate-limited, so that the retry reports progress while it is still below where the reset left it.
        var configuration = DownloadQueue.Configuration(
            transfer: TransferOptions(maxBytesPerSecond: 1_000_000), resumeWhenSpaceReturns: false, maxRetryDelay: 0.2)
        configuration.deltaUpdates = false
        let home = try Fixtures.temporaryDirectory("stale-error-home")
        let queue = try await DownloadQueue.open(home: Home(folder: home), configuration: configuration)
        let transaction = try await queue.add(product: "com.example.big", from: resets)
        let id = try #require(transaction.downloads.first?.id)
        var failedAt: Int64?
        var stale: [Download] = []
        var movedAfterTheError = 0
        for await event in queue.events(downloadID: id) {
            guard case .downloadUpdated(let download) = event else { continue }
            if failedAt == nil, download.error != nil { failedAt = download.bytesReceived }
            if let failedAt, download.state == .active, download.phase == .downloading, download.bytesReceived != failedAt {
                movedAfterTheError += 1
                if download.error != nil { stale.append(download) }
            }
            if !download.state.isRunning { break }
        }
        #expect(failedAt != nil, "the reset was reported as the download's error")
        #expect(movedAfterTheError > 0, "progress was reported after the error")
        #expect(stale.isEmpty, "moving again, yet still showing \(stale.first?.error?.code.rawValue ?? ""): \(stale.map(\.bytesReceived))")
        #expect(try await queue.settled(downloadID: id).state == .finished)
        #expect(server.requests().filter { $0.file == "big.tar" }.map(\.status) == [200, 200], "the retry started over")

        // Paused mid-download: the first paused update says what the partial file holds.
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .slow(bytesPerSecond: 300_000)).absoluteString
        var slow = configuration
        slow.transfer = TransferOptions()
        let pausingHome = try Fixtures.temporaryDirectory("first-pause-home")
        let pausing = try await DownloadQueue.open(home: Home(folder: pausingHome), configuration: slow)
        let plain = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        let second = try await pausing.add(product: "com.example.big", from: plain)
        let secondID = try #require(second.downloads.first?.id)
        let updates = pausing.events(downloadID: secondID)
        _ = try #require(await waitFor(pausing, secondID) { $0.bytesReceived > 200_000 }, "bytes arrive")
        try pausing.pause([secondID])
        var firstPaused: Download?
        for await event in updates {
            guard case .downloadUpdated(let download) = event, !download.state.isRunning else { continue }
            #expect(download.state == .paused, "the pause came before the end of the download")
            firstPaused = download
            break
        }
        let partial = try #require(partialArchive(pausingHome))
        let onDisk = try #require(try FileManager.default.attributesOfItem(atPath: partial.path)[.size] as? Int64)
        #expect(firstPaused?.bytesReceived == onDisk, "the first paused update: \(firstPaused?.bytesReceived ?? -1), on disk: \(onDisk)")
        await pausing.close()
        await queue.close()
    }

    /// A second queue on the same home (as a second process would be) awaits a download the first one runs: it
    /// sees none of its events, only what the database says.
    @Test(.timeLimit(.minutes(1))) func settledFollowsADownloadAnotherQueueRuns() async throws {
        let shop = try await Shop("settled-other")
        let other = try await DownloadQueue.open(home: Home(folder: shop.home))
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        let settled = try await other.settled(transactionID: transaction.id)
        #expect(settled.isFinishable && settled.downloads.allSatisfy { $0.state == .finished })
        await other.close()
        await shop.stop()
    }

    /// `delivered` follows a purchase another queue on the same home (as another process would) delivers: it sees none
    /// of its events, only what the database says, through the same wait as `settled`.
    @Test(.timeLimit(.minutes(1))) func deliveredFollowsAPurchaseAnotherQueueDelivers() async throws {
        let shop = try await Shop("delivered-other")
        let other = try await DownloadQueue.open(home: Home(folder: shop.home))
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        let delivered = try await other.delivered(transactionID: transaction.id)
        #expect(delivered.isFinishable && delivered.downloads.allSatisfy { $0.state == .finished })
        try await other.finish(delivered.id)
        await other.close()
        await shop.stop()
    }

    /// close() from an observer's callback returns (it used to wait for that very callback).
    @Test(.timeLimit(.minutes(1))) func anObserverMayCloseTheQueue() async throws {
        final class Closer: DownloadQueueObserver {
            let closed = Mutex(false)
            func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
                queue.close()
                self.closed.withLock { $0 = true }
            }
            func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {}
        }
        let shop = try await Shop("observer-close")
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        _ = try await shop.queue.settled(transactionID: transaction.id)
        let closer = Closer()
        shop.queue.add(closer)  // the open transaction is delivered to it at once, and it closes the queue
        let deadline = ContinuousClock.now + .seconds(20)
        while !closer.closed.withLock({ $0 }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        #expect(closer.closed.withLock { $0 }, "close() from an observer callback did not return within 20 s")
        await #expect(throws: PackDeliveryError.self) { try await shop.queue.add(product: "com.example.atlas", from: shop.manifest) }
        await shop.stop()
    }

    @Test func aRestoreDeliversEveryRecordedProductAndSaysWhenItIsDone() async throws {
        let shop = try await Shop("restore")
        for product in ["com.example.forest", "com.example.atlas"] {
            let transaction = try await shop.queue.add(product: product, from: shop.manifest)
            _ = try await shop.queue.settled(transactionID: transaction.id)
            try await shop.queue.finish(transaction.id)
        }
        // Intact: the restore completes at once, without downloading.
        let events = shop.queue.events()
        let intact = try await shop.queue.restoreCompletedTransactions()
        #expect(intact.count == 2 && intact.allSatisfy { $0.kind == .restored && $0.isFinishable })
        // One product's content is gone: only it downloads again, and the restore reports once, at the end.
        #expect(try await shop.queue.finish(intact.map(\.id)).count == 2)
        try FileManager.default.removeItem(at: shop.home.appending(path: "Caches/com.example.atlas"))
        let partial = try await shop.queue.restoreCompletedTransactions(productIDs: ["com.example.atlas"])
        #expect(partial.count == 1 && partial[0].downloads.first?.state == .waiting)
        var completions = 0
        for await event in events {
            if case .restoreCompleted(let transactions) = event {
                completions += 1
                if completions == 2 {
                    #expect(transactions.map(\.id) == partial.map(\.id) && transactions.allSatisfy(\.isFinishable))
                    break
                }
            }
        }
        #expect(FileManager.default.fileExists(atPath: shop.home.appending(path: "Caches/com.example.atlas/ContentInfo.plist").path))
        await shop.stop()
    }

    @Test func credentialsComeFromTheProviderAndAreRenewedOnceWhenRefused() async throws {
        final class Calls: Sendable {
            let refused = Atomic<Int>(0)
            let total = Atomic<Int>(0)
        }
        let calls = Calls()
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false)
        // The first token has expired; a fresh one is given when the server refuses it.
        configuration.credentials = { request in
            calls.total.add(1, ordering: .relaxed)
            if request.refused { calls.refused.add(1, ordering: .relaxed) }
            return ["Authorization: Bearer " + (request.refused ? "s3cret" : "expired")]
        }
        let shop = try await Shop("credentials", token: "s3cret", configuration: configuration)
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        let settled = try await shop.queue.settled(transactionID: transaction.id)
        #expect(settled.isFinishable, "\(settled.downloads.map { String(describing: $0.error) })")
        #expect(calls.refused.load(ordering: .relaxed) == 1 && calls.total.load(ordering: .relaxed) == 2)
        await shop.stop()

        // Credentials that stay wrong pause the download, waiting for new ones.
        var wrong = DownloadQueue.Configuration(resumeWhenSpaceReturns: false)
        wrong.credentials = { _ in ["Authorization: Bearer nope"] }
        let refused = try await Shop("credentials-wrong", token: "s3cret", configuration: wrong)
        let id = try #require(try await refused.queue.add(product: "com.example.forest", from: refused.manifest).downloads.first?.id)
        let paused = try await refused.queue.settled(downloadID: id)
        #expect(
            paused.state == .paused && paused.pauseReason == .unauthorized && paused.error?.code == .unauthorized
                && paused.error?.httpStatus == 401)
        await refused.stop()
    }

    /// A transaction says where it is (`state`, as the CLI's JSON does), and verify and repair have async twins that
    /// keep the typed error.
    @Test func aTransactionHasAStateAndVerifyAndRepairCanBeAwaited() async throws {
        let shop = try await Shop("state-and-async")
        let transaction = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        #expect(transaction.state == .purchased)
        let settled = try await shop.queue.settled(transactionID: transaction.id)
        #expect(settled.state == .purchased && settled.isFinishable)
        let finished = try await shop.queue.finish([transaction.id])
        #expect(finished.map(\.state) == [.finished], "\(finished.map(\.state))")
        let results: [VerifyResult] = try await shop.queue.verify(productIDs: ["com.example.forest"])
        #expect(results.count == 1 && results.allSatisfy(\.isIntact))
        let repairs: [Transaction] = try await shop.queue.repair()
        #expect(repairs.isEmpty, "nothing to repair")
        await shop.queue.close()
        do {
            _ = try await shop.queue.verify()
            Issue.record("verify after close must throw")
        } catch {
            #expect(error.code == .queueClosed, "a typed error: \(error.code)")
        }
        await shop.server.stop()
    }

    @Test func aClosedQueueRefusesNewWorkAndItsStreamsEnd() async throws {
        let shop = try await Shop("closed")
        await shop.queue.close()
        // Add after close recorded a transaction that waited forever.
        do {
            try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
            Issue.record("add after close must be refused")
        } catch {
            #expect(error.code == .queueClosed)
        }
        // Every other call says the same, by its code (it said `database`, "Connection is closed", before).
        let queue = shop.queue
        let calls: [(String, () throws(PackDeliveryError) -> Void)] = [
            ("transactions", { () throws(PackDeliveryError) in _ = try queue.transactions() }),
            ("pause", { () throws(PackDeliveryError) in try queue.pause(["d-x"]) }),
            ("cancel", { () throws(PackDeliveryError) in try queue.cancel(["d-x"]) }),
            ("resume", { () throws(PackDeliveryError) in _ = try queue.resume() }),
            ("finish", { () throws(PackDeliveryError) in try queue.finish("t-x") }),
            ("installedContent", { () throws(PackDeliveryError) in _ = try queue.installedContent() }),
            ("verify", { () throws(PackDeliveryError) in _ = try queue.verify() }),
            ("repair", { () throws(PackDeliveryError) in _ = try queue.repair() }),
            ("deleteContent", { () throws(PackDeliveryError) in _ = try queue.deleteContent(forProductID: "com.example.forest") }),
            ("setReceipt", { () throws(PackDeliveryError) in _ = try queue.setReceipt("r", forTransactions: ["t-x"]) }),
            ("trustedPublishers", { () throws(PackDeliveryError) in _ = try queue.trustedPublishers() }),
        ]
        for (name, call) in calls {
            do throws(PackDeliveryError) {
                try call()
                Issue.record("\(name) after close must throw")
            } catch {
                #expect(error.code == .queueClosed, "\(name): \(error.code) \(error.message)")
            }
        }
        #expect(queue.contentURL(forProductID: "com.example.forest") == nil, "documented: nil after close")
        #expect(try CLI.run(home: shop.home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#), "nothing was recorded")
        // A stream asked for after close never finished.
        var count = 0
        for await _ in shop.queue.events() { count += 1 }
        #expect(count == 0)
        await shop.server.stop()
    }

    @Test func contentURLIsTheNewestPackAsDocumented() async throws {
        // The documentation and the code now agree: the most recently installed pack.
        let shop = try await Shop("newest")
        let forest = try await shop.queue.add(product: "com.example.forest", from: shop.manifest)
        _ = try await shop.queue.settled(transactionID: forest.id)
        try await Task.sleep(for: .milliseconds(20))
        let again = try await shop.queue.add(product: "com.example.forest", from: shop.manifest, force: true)
        _ = try await shop.queue.settled(transactionID: again.id)
        let newest = try shop.queue.installedContent(forProductID: "com.example.forest").max { $0.installedAt < $1.installedAt }
        #expect(shop.queue.contentURL(forProductID: "com.example.forest") == newest?.contentURL)
        await shop.stop()
    }

    @Test func aManifestBuiltInMemoryIsCheckedLikeADecodedOne() throws {
        let bad = Manifest(products: [
            .init(
                productIdentifier: "p",
                contents: [
                    .init(
                        contentIdentifier: "p", contentVersion: "1", url: "p.zip", contentLength: 1 << 60,
                        sha256: String(repeating: "a", count: 64))
                ])
        ])
        #expect(throws: PackDeliveryError.self) { try LoadedManifest(manifest: bad, baseURL: URL(string: "https://h/m.json")!) }
        do { _ = try LoadedManifest(manifest: bad, baseURL: URL(string: "https://h/m.json")!) } catch {
            #expect(error.code == .invalidManifest)
        }
    }
}
