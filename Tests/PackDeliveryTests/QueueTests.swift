import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A writer that behaves like a filesystem with `space` bytes free: past it, ENOSPC.
final class DiskFullWriter: FileWriting {
    private let space: Atomic<Int64>

    init(space: Int64) { self.space = Atomic(space) }

    /// Frees room again (Int64.max: no limit).
    func setSpace(_ bytes: Int64) { self.space.store(bytes, ordering: .relaxed) }

    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        let left = self.space.load(ordering: .relaxed)
        if left <= 0 {
            errno = ENOSPC
            return -1
        }
        let allowed = Int(min(Int64(count), left))
        let written = Glibc.pwrite(fd, buffer, allowed, off_t(offset))
        if written > 0 { self.space.subtract(Int64(written), ordering: .relaxed) }
        return written
    }
}

/// An observer in the shape of Apple's "Test an Interrupted Transaction": it records what it is told.
final class RecordingObserver: DownloadQueueObserver {
    let transactions = Mutex<[Transaction]>([])
    let downloads = Mutex<[Download]>([])
    let finishes: Bool

    init(finishes: Bool) { self.finishes = finishes }

    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
        self.transactions.withLock { $0 += transactions }
        guard self.finishes else { return }  // the "ignore the update" half of the test
        for transaction in transactions where transaction.isFinishable && !transaction.isFinished {
            try? queue.finish(transaction.id)
        }
    }

    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        self.downloads.withLock { $0 += downloads }
        guard self.finishes else { return }
        for download in downloads where download.state == .finished {
            if let transaction = try? queue.transactions().first(where: { $0.id == download.transactionID }), transaction.isFinishable {
                try? queue.finish(transaction.id)
            }
        }
    }
}

/// Waits for a download to reach a state the predicate accepts, through the queue's events.
func waitFor(_ queue: DownloadQueue, _ id: String, timeout: TimeInterval = 60, _ predicate: @escaping @Sendable (Download) -> Bool) async
    -> Download?
{
    await withTaskGroup(of: Download?.self) { group in
        group.addTask {
            // The stream starts with the transactions as they are, then every change: no gap to miss one in.
            for await event in queue.events() {
                switch event {
                case .downloadUpdated(let download):
                    if download.id == id, predicate(download) { return download }
                case .transactionUpdated(let transaction):
                    if let download = transaction.downloads.first(where: { $0.id == id }), predicate(download) { return download }
                default:
                    continue
                }
            }
            return nil
        }
        group.addTask {
            try? await Task.sleep(for: .seconds(timeout))
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

@Suite(.timeLimit(.minutes(5))) struct QueueTests {
    static func options() -> DownloadQueue.Configuration {
        DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1)
    }

    @Test func anInterruptedTransactionIsDeliveredAgainOnTheNextLaunch() async throws {
        let site = try TestSite.random("relaunch-site", size: 1 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("relaunch-home"))
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)

        // First launch: the observer ignores the update, so the transaction is never finished.
        var first: DownloadQueue? = try DownloadQueue(home: home, configuration: Self.options())
        let ignoring = RecordingObserver(finishes: false)
        first!.add(ignoring)
        let transaction = try await first!.add(product: "com.example.big", from: manifest)
        let id = try #require(transaction.downloads.first?.id)
        let done = await waitFor(first!, id) { $0.state == .finished }
        #expect(done?.progress == 1.0 && done?.contentURL != nil)
        await first!.close()
        first = nil

        // Second launch: the unfinished transaction arrives as soon as an observer is added.
        let second = try DownloadQueue(home: home, configuration: Self.options())
        let finishing = RecordingObserver(finishes: true)
        second.add(finishing)
        var delivered: [Transaction] = []
        for _ in 0..<200 where delivered.isEmpty {
            delivered = finishing.transactions.withLock { $0 }.filter { $0.id == transaction.id }
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(delivered.first?.downloads.first?.state == .finished)
        for _ in 0..<200 where await (try? second.transactions())?.isEmpty == false { try await Task.sleep(for: .milliseconds(10)) }
        await #expect(try second.transactions().isEmpty, "the observer finished it on the second launch")
        #expect(second.contentURL(forProductID: "com.example.big") != nil, "content stays findable after finish")
        #expect(ignoring.downloads.withLock { $0 }.last?.state == .finished)
        await second.close()
    }

    @Test func aDownloadRunningAtShutdownResumesOnItsOwnAtTheNextLaunch() async throws {
        let site = try TestSite.random("autoresume-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 2 << 20)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("autoresume-home"))
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        var first: DownloadQueue? = try DownloadQueue(home: home, configuration: Self.options())
        let id = try await #require(try first!.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let partway = await waitFor(first!, id) { $0.progress > 0.2 }
        #expect(partway != nil)
        await first!.close()
        first = nil

        let second = try DownloadQueue(home: home, configuration: Self.options())
        let finished = await waitFor(second, id) { $0.state == .finished }
        #expect(finished?.progress == 1.0)
        // Resumed, not restarted: the second launch asked for the rest from past the first fifth (a bound on the bytes
        // served could not tell: under CPU starvation more of the limited body sat in socket buffers at close).
        nginx.waitForRequests(2)
        let packRequests = nginx.requests().filter { $0.uri.hasSuffix("/big.tar") }
        let starts = packRequests.dropFirst().map { $0.range.flatMap { Int($0.dropFirst("bytes=".count).prefix { $0.isNumber }) } ?? 0 }
        #expect(
            !starts.isEmpty && starts.allSatisfy { $0 >= (4 << 20) / 5 }, "every later request resumed from the bytes kept: \(packRequests)"
        )
        await second.close()
    }

    /// `resume` reaches a download another process runs, as `pause` and `cancel` do: here this process's queue owns
    /// the paused download and `packs resume ID`, another process, resumes it. (It returned [] and the download stayed
    /// paused until its owner died.)
    @Test func resumeReachesADownloadAnotherProcessRuns() async throws {
        let site = try TestSite.random("resume-across-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 2 << 20)
        defer { nginx.stop() }
        let folder = try Fixtures.temporaryDirectory("resume-across-home")
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let queue = try DownloadQueue(home: Home(folder: folder), configuration: Self.options())
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        #expect(await waitFor(queue, id) { $0.progress > 0.1 } != nil, "the download runs")
        try queue.pause([id])
        #expect(await waitFor(queue, id) { $0.state == .paused } != nil, "paused by its owner")
        let other = try CLI.run(home: folder, ["resume", id])
        #expect(other.status == 0, "\(other.stderr)")
        let finished = await waitFor(queue, id, timeout: 30) { $0.state == .finished }
        #expect(finished != nil, "the owner resumed it on the other process's request and finished it")
    }

    /// A queue's listeners see the downloads another process runs on the same home, as that process saves them:
    /// progress, then the pause another process asked for. (They got no update in 40 s, and showed "active" after
    /// the pause.)
    @Test func listenersSeeTheDownloadsAnotherProcessRuns() async throws {
        let site = try TestSite.random("others-site", size: 8 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let folder = try Fixtures.temporaryDirectory("others-home")
        let queue = try DownloadQueue(home: Home(folder: folder), configuration: Self.options())
        defer { queue.close() }
        let fetch = try CLI.start(
            home: folder, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"])
        defer { if fetch.isRunning { fetch.terminate() } }
        // The other process's download, seen moving through this queue's events (it is not this queue's).
        let seen = await withTaskGroup(of: (id: String, progress: [Double])?.self) { group in
            group.addTask {
                var progress: [Double] = []
                for await event in queue.events() {
                    guard case .downloadUpdated(let download) = event, download.productIdentifier == "com.example.big" else { continue }
                    if download.state == .active { progress.append(download.progress) }
                    if progress.filter({ $0 > 0 }).count >= 2 { return (download.id, progress) }
                }
                return nil
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(30))
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        let (id, progress) = try #require(seen, "no progress of the other process's download reached this queue's events in 30 s")
        #expect(progress == progress.sorted(), "progress never goes backwards: \(progress)")
        let pause = try CLI.run(home: folder, ["pause", id])
        #expect(pause.status == 0, "\(pause.stderr)")
        let paused = await waitFor(queue, id, timeout: 30) { $0.state == .paused }
        #expect(paused != nil, "the pause, made by another process in the one that runs the download, reached this queue")
    }

    /// One delivery per product: a second add of a product whose packs are being delivered (a double "buy") joins
    /// the running transaction; the pack is served once.
    @Test func aSecondAddOfAProductBeingDeliveredJoinsItAndThePackIsServedOnce() async throws {
        let site = try TestSite.random("join-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 2 << 20)
        defer { nginx.stop() }
        let folder = try Fixtures.temporaryDirectory("join-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let manifest = try await LoadedManifest.load(manifestURL)
        let queue = try DownloadQueue(home: Home(folder: folder), configuration: Self.options())
        defer { queue.close() }
        let first = try await queue.add(product: "com.example.big", from: manifest)
        let second = try await queue.add(product: "com.example.big", from: manifest)
        #expect(second.id == first.id, "the second add joins the first")
        #expect(try await queue.transactions().count == 1, "one transaction recorded")
        let id = try #require(first.downloads.first?.id)
        #expect(await waitFor(queue, id) { $0.progress > 0.1 } != nil, "the download runs")
        #expect(await waitFor(queue, id) { $0.state == .finished } != nil)
        #expect(nginx.bodyBytesSent(path: "/big.tar") < (4 << 20) + (1 << 20), "served once: \(nginx.bodyBytesSent(path: "/big.tar"))")
        let forced = try await queue.add(product: "com.example.big", from: manifest, force: true)
        #expect(forced.id != first.id, "force records a new one")
    }

    @Test func diskFullWhileDownloadingPausesKeepsTheBytesAndResumes() async throws {
        let size = 3 << 20
        let site = try TestSite.random("enospc-download-site", size: size)
        // Paced, so that what nginx counts as sent is what reached the client before the disk filled.
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("enospc-download-home"))
        let writer = DiskFullWriter(space: 1 << 20)
        var configuration = Self.options()
        configuration.writer = writer
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)

        let paused = try #require(await waitFor(queue, id) { $0.state != .active && $0.state != .waiting })
        #expect(paused.state == .paused && paused.pauseReason == .insufficientStorage)
        #expect(paused.error?.code == .insufficientStorage && paused.error?.underlying == .init(.errno, Int(ENOSPC)))
        let archive = home.cachesFolder.appending(path: ".packdelivery/downloads/\(id).pack")
        let kept = try #require(try FileManager.default.attributesOfItem(atPath: archive.path)[.size] as? Int64)
        // Everything up to the last complete write is kept (a write cut short by the full disk is cut back).
        #expect(kept <= 1 << 20 && kept > (1 << 20) - (512 << 10), "kept \(kept)")
        #expect(paused.bytesReceived == kept)

        writer.setSpace(.max)
        try queue.resume([id])
        let finished = try #require(await waitFor(queue, id) { $0.state == .finished || $0.state == .failed })
        #expect(finished.state == .finished)
        // The resume asked only for the missing bytes, and got them.
        let requests = nginx.requests().filter { $0.uri == "/big.tar" }
        #expect(requests.count == 2 && requests.last?.range == "bytes=\(kept)-" && requests.last?.status == 206, "\(requests)")
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }

    /// Unpacking after the download (a zip, or streaming turned off): the archive is complete and kept.
    @Test func diskFullWhileUnpackingKeepsTheArchiveAndResumeOnlyUnpacks() async throws {
        let site = try TestSite.random("enospc-unpack-site", size: 2 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let pack = try #require(try site.manifest().products.first?.contents.first)
        let home = Home(folder: try Fixtures.temporaryDirectory("enospc-unpack-home"))
        // Room for the whole download and 100 KB of its unpacked content.
        let writer = DiskFullWriter(space: pack.contentLength + 100_000)
        var configuration = Self.options()
        configuration.writer = writer
        configuration.streamingUnpack = false
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)

        let paused = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(paused.state == .paused && paused.pauseReason == .insufficientStorage, "\(paused)")
        let archive = home.cachesFolder.appending(path: ".packdelivery/downloads/\(id).pack")
        #expect(
            (try? FileManager.default.attributesOfItem(atPath: archive.path)[.size] as? Int64) == pack.contentLength, "the archive is kept")
        #expect(leftovers(home.stateFolder) == ["Caches/.packdelivery/downloads/\(id).pack"], "the staging folder is removed")
        #expect(!FileManager.default.fileExists(atPath: home.cachesFolder.appending(path: "com.example.big").path))

        writer.setSpace(.max)
        try queue.resume([id])
        let finished = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(finished.state == .finished)
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(nginx.requests().filter { $0.uri == "/big.tar" }.count == 1, "resuming only unpacked: no second download")
        #expect(leftovers(home.stateFolder) == [])
    }

    /// Unpacking while downloading, the two share the space: whichever write fills the disk, the download pauses
    /// for space with nothing half-installed, and a resume completes it without fetching a kept byte again.
    @Test func diskFullWhileStreamingPausesAndResumeCompletesFromTheKeptBytes() async throws {
        let site = try TestSite.random("enospc-stream-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 8 << 20)
        defer { nginx.stop() }
        let pack = try #require(try site.manifest().products.first?.contents.first)
        let home = Home(folder: try Fixtures.temporaryDirectory("enospc-stream-home"))
        let writer = DiskFullWriter(space: pack.contentLength + 100_000)
        var configuration = Self.options()
        configuration.writer = writer
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let paused = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(paused.state == .paused && paused.pauseReason == .insufficientStorage, "\(paused)")
        #expect(!FileManager.default.fileExists(atPath: home.cachesFolder.appending(path: "com.example.big").path))
        // The unpack that ran beside the download removes its folder as it stops, a moment after the pause.
        for _ in 0..<200 where !leftovers(home.stateFolder).allSatisfy({ $0.hasSuffix(".pack") }) {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(leftovers(home.stateFolder).allSatisfy { $0.hasSuffix(".pack") }, "no staging left: \(leftovers(home.stateFolder))")
        let archive = home.cachesFolder.appending(path: ".packdelivery/downloads/\(id).pack")
        let kept = try #require(try FileManager.default.attributesOfItem(atPath: archive.path)[.size] as? Int64)

        writer.setSpace(.max)
        try queue.resume([id])
        let finished = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(finished.state == .finished, "\(finished.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        let requests = nginx.requests().filter { $0.uri == "/big.tar" }
        if kept < pack.contentLength {
            #expect(requests.count == 2 && requests.last?.range == "bytes=\(kept)-", "resumed from the \(kept) bytes kept: \(requests)")
        } else {
            #expect(requests.count == 1, "the archive was complete: only unpacked again: \(requests)")
        }
        #expect(leftovers(home.stateFolder) == [])
    }

    @Test func aDownloadPausedForSpaceResumesOnItsOwnWhenThereIsRoom() async throws {
        let site = try TestSite.random("autospace-site", size: 2 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 8 << 20)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("autospace-home"))
        let writer = DiskFullWriter(space: 512 << 10)
        var configuration = Self.options()
        configuration.writer = writer
        configuration.resumeWhenSpaceReturns = true
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let paused = try #require(await waitFor(queue, id) { $0.state == .paused })
        #expect(paused.pauseReason == .insufficientStorage)
        // The filesystem (statvfs) has room again; nobody calls resume.
        writer.setSpace(.max)
        let finished = try #require(await waitFor(queue, id, timeout: 30) { $0.state == .finished })
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }

    @Test func closingEndsLiveEventStreams() async throws {
        let queue = try DownloadQueue(home: Home(folder: try Fixtures.temporaryDirectory("close-home")), configuration: Self.options())
        let stream = queue.events()
        await queue.close()
        var count = 0
        for await _ in stream { count += 1 }
        #expect(count == 0, "nothing was open; the stream just ends")
    }

    @Test func aTransactionIsReportedFinishableWhenItsLastDownloadSettles() async throws {
        let site = try TestSite.samples("finishable-site")
        let home = Home(folder: try Fixtures.temporaryDirectory("finishable-home"))
        let queue = try DownloadQueue(home: home, configuration: Self.options())
        defer { queue.close() }
        let stream = queue.events()
        let transaction = try await queue.add(product: "com.example.forest", from: try LoadedManifest.load(site.manifestURL.path))
        for await event in stream {
            if case .transactionUpdated(let update) = event, update.id == transaction.id, update.isFinishable {
                try await queue.finish(update.id)
                break
            }
        }
        await #expect(try queue.transactions().isEmpty)
        #expect(queue.contentURL(forProductID: "com.example.forest") != nil)
    }

    @Test func aBoundedNumberRunAtOnceAndTheRestWaitInOrder() async throws {
        let site = try TestSite.samples("concurrency-site")
        let nginx = try NginxServer(root: site.folder, limitRate: 256 << 10)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("concurrency-home"))
        var configuration = Self.options()
        configuration.concurrency = 1
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let stream = queue.events()
        var ids: [String] = []
        for product in ["com.example.ocean", "com.example.forest", "com.example.atlas"] {
            await ids += try queue.add(product: product, from: manifest).downloads.map(\.id)
        }
        var states: [String: DownloadState] = [:]
        var startOrder: [String] = []
        var mostActive = 0
        for await event in stream {
            guard case .downloadUpdated(let download) = event else { continue }
            if download.state == .active, states[download.id] != .active { startOrder.append(download.id) }
            states[download.id] = download.state
            mostActive = max(mostActive, states.values.filter { $0 == .active }.count)
            if ids.allSatisfy({ states[$0] == .finished }) { break }
        }
        #expect(mostActive == 1)
        #expect(startOrder == ids, "waiting downloads start in the order they were added")
    }

    @Test func cancelDeletesThePartialDataAndPauseKeepsIt() async throws {
        let site = try TestSite.random("cancel-site", size: 32 << 20)  // 32 s at 1 MiB/s: the pause always lands mid-transfer
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = Home(folder: try Fixtures.temporaryDirectory("cancel-home"))
        // The whole-pack path, whose partial archive this watches (a first install that writes each byte once is WriteOnceTests').
        var options = Self.options()
        options.deltaUpdates = false
        let queue = try DownloadQueue(home: home, configuration: options)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let transaction = try await queue.add(product: "com.example.big", from: manifest)
        let id = try #require(transaction.downloads.first?.id)
        #expect(await waitFor(queue, id) { $0.bytesReceived > 0 } != nil)

        // Pause from another thread: data kept.
        await Task.detached { try? queue.pause([id]) }.value
        let paused = try #require(await waitFor(queue, id) { $0.state == .paused })
        let archive = home.cachesFolder.appending(path: ".packdelivery/downloads/\(id).pack")
        #expect(FileManager.default.fileExists(atPath: archive.path) && paused.bytesReceived > 0)
        #expect(throws: PackDeliveryError.self) { try queue.finish(transaction.id) }

        try queue.resume([id])
        #expect(await waitFor(queue, id) { $0.state == .active && $0.bytesReceived > paused.bytesReceived } != nil)
        try queue.cancel([id])
        let cancelled = try #require(await waitFor(queue, id) { $0.state == .cancelled })
        #expect(cancelled.bytesReceived == 0)
        // Gone within a moment of the cancelled event: the driver removes it at once, and the transfer thread once more
        // after the stop (a transfer start it had not yet taken could create it again, empty, in between).
        let deadline = Date().addingTimeInterval(5)
        while FileManager.default.fileExists(atPath: archive.path), Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(!FileManager.default.fileExists(atPath: archive.path), "the partial download is still there 5 s after the cancel")
        try await queue.finish(transaction.id)
        await #expect(try queue.transactions().isEmpty)
        #expect(queue.contentURL(forProductID: "com.example.big") == nil)
    }
}
