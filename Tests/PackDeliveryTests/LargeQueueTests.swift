import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

/// A machine's whole queue (issue 44: 100,000 downloads over 10 homes in the benchmark's case 19d), in one queue:
/// 20,000 downloads wait behind 4 slots, each holding a machine that never ran (``DownloadMachine``'s running state is
/// out of line and shared until it starts). A waiting one still answers for itself, is paused, resumed and cancelled,
/// and the queue starts them by priority, then first come, first served, as slots free.
@Suite(.timeLimit(.minutes(2))) struct LargeQueueTests {
    static let count = 20_000

    /// Finishes a running download (whatever its token), and returns the ids the queue started next.
    /// - Parameter rows: the store's rows, saved as the driver saves them (else the changes are taken, not kept).
    static func finish(_ queue: inout QueueMachine, _ id: String, rows: Rows? = nil) throws -> [String] {
        let token = try #require(queue.machine(id)?.token, "\(id) is owned")
        let sha = DeliveryPolicyMachineTests.sha
        _ = queue.handle(id, .transferFinished(token: token, outcome: .completed(sha256: sha, length: 1000, resumedFrom: 0)))
        let actions = queue.handle(id, .installFinished(token: token, result: .success(URL(filePath: "/c/\(id)"))))
        #expect(queue.download(id)?.state == .finished, "\(id) finished")
        if let rows { rows.save(&queue) } else { _ = queue.takeChanges(includingProgress: true) }
        return QueueMachineTests.admitAll(&queue, actions)
    }

    @Test func twentyThousandWaitingDownloadsAnswerAndStartByPriorityAsSlotsFree() throws {
        let clock = ContinuousClock()
        let began = clock.now
        var queue = QueueMachine(concurrency: 4)
        queue.reserve(Self.count)
        // Background work, and one essential download in each thousand (d-999, d-1999, …).
        var actions: [QueueMachine.Action] = []
        for n in 0..<Self.count {
            let priority: DownloadPriority = n % 1000 == 999 ? .essential : .background
            actions += queue.own(MeteredMachineTests.download("d-\(n)", length: 1000, priority: priority), position: 0)
        }
        let started = QueueMachineTests.admitAll(&queue, actions)
        _ = queue.takeChanges(includingProgress: true)
        #expect(started == ["d-0", "d-1", "d-2", "d-3"], "the first four take the slots: \(started)")

        // Far from the head, a waiting download says what it is.
        let deep = try #require(queue.download("d-12345"), "a waiting download answers")
        #expect(deep.state == .waiting && deep.priority == .background && deep.bytesReceived == 0 && deep.pauseReason == nil)
        // Paused by the user, moved up, cancelled: each says so at once, and starts nothing (every slot is taken).
        #expect(QueueMachineTests.admitted(queue.handle("d-1999", .pause(.user, nil))).isEmpty)
        #expect(queue.download("d-1999")?.state == .paused && queue.download("d-1999")?.pauseReason == .user)
        #expect(queue.handle("d-18000", .setPriority(.essential)).contains(.priorityChanged(id: "d-18000")))
        let cancel = queue.handle("d-2999", .cancel)
        #expect(queue.download("d-2999")?.state == .cancelled && cancel.contains(.settled(transactionID: "t-d-2999")))
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")

        // Slots free one by one: the essential downloads first, in order of arrival (d-18000 among them, by its own
        // arrival), then the background work from where it stopped. The paused one waits until it is resumed, and then
        // goes next: it arrived before every essential download still waiting.
        var order: [String] = []
        var running = started
        for turn in 0..<30 {
            if turn == 5 {
                #expect(QueueMachineTests.admitted(queue.handle("d-1999", .resume)).isEmpty, "no slot is free yet")
                #expect(queue.download("d-1999")?.state == .waiting)
            }
            let next = try Self.finish(&queue, running.removeFirst())
            running += next
            order += next
        }
        let essentials = [999, 3999, 4999, 5999, 6999, 1999] + [7999, 8999, 9999, 10999, 11999, 12999, 13999, 14999, 15999]
        let expected = essentials.map { "d-\($0)" } + ["d-16999", "d-17999", "d-18000", "d-18999", "d-19999"]
        #expect(Array(order.prefix(expected.count)) == expected, "\(order)")
        #expect(Array(order.dropFirst(expected.count)) == (4..<(4 + 30 - expected.count)).map { "d-\($0)" }, "\(order)")
        #expect(!order.contains("d-2999"), "the cancelled download never starts")
        #expect(queue.download("d-12345")?.state == .waiting, "still waiting, deep in the queue")
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")
        #expect(clock.now - began < .seconds(60), "20,000 downloads owned and 30 turns took \(clock.now - began)")
    }

    /// The store's rows of a queue's downloads, as the driver writes them (``DownloadRecord``) and reads them back.
    final class Rows: Sendable {
        let rows = Mutex<[String: DownloadRecord]>([:])
        func write(_ machine: DownloadMachine, position: Int = 0) {
            let record = DownloadRecord(
                machine.download, position: position, validator: machine.validator, partialPath: nil, stagingInode: machine.stagingInode,
                retriedFromZero: machine.retriedFromZero, verified: machine.verified)
            self.rows.withLock { $0[record.id] = record }
        }
        /// The loader a queue's driver gives its machine: a compact download's machine, made from its row.
        var loader: @Sendable (String) -> DownloadMachine? {
            { id in self.rows.withLock { $0[id] }.map { DownloadMachine(download: $0.download) } }
        }
        /// Saves the queue's changes as the driver does, then lets it keep the saved ones compact.
        func save(_ queue: inout QueueMachine) {
            let taken = queue.takeChanges(includingProgress: true)
            for (machine, position) in taken { self.write(machine, position: position) }
            queue.compact(taken.map(\.machine.download.id))
        }
    }

    /// The windowed queue (issue 44, case 19d): with a store to read them back from, the 19,996 downloads that wait
    /// behind the 4 slots are kept compact, holding no machine, and still answer for themselves exactly as they were
    /// added; a pause, resume, priority change and cancel of a deep one behave as with every machine kept, and the start
    /// order is the same, by priority and then arrival.
    @Test func waitingDownloadsFarFromTheHeadAreKeptAsRowsAndReadBackExactly() throws {
        let clock = ContinuousClock()
        let began = clock.now
        let rows = Rows()
        var queue = QueueMachine(concurrency: 4)
        queue.loader = rows.loader
        queue.reserve(Self.count)
        func machine(_ n: Int) -> DownloadMachine {
            MeteredMachineTests.download("d-\(n)", length: 1000, priority: n % 1000 == 999 ? .essential : .background)
        }
        // Recorded first, then owned as saved: as `DownloadQueue.record` does.
        var actions: [QueueMachine.Action] = []
        for n in 0..<Self.count {
            rows.write(machine(n))
            actions += queue.own(machine(n), position: 0, saved: true)
        }
        let started = QueueMachineTests.admitAll(&queue, actions)
        rows.save(&queue)
        #expect(started == ["d-0", "d-1", "d-2", "d-3"], "the first four take the slots: \(started)")
        #expect(queue.compactCount == Self.count - 4, "all but the 4 running are compact: \(queue.compactCount)")

        // Far from the head, a compact download is read back as it was added, field for field.
        #expect(queue.download("d-12345") == machine(12345).download, "\(String(describing: queue.download("d-12345")))")
        #expect(queue.liveDownload("d-12345") == nil, "its row is all of it")
        #expect(queue.compactCount == Self.count - 4, "a read keeps it compact")
        // Paused by the user, moved up, cancelled: each says so at once, starts nothing, and is compact again once saved.
        #expect(QueueMachineTests.admitted(queue.handle("d-1999", .pause(.user, nil))).isEmpty)
        #expect(queue.download("d-1999")?.state == .paused && queue.download("d-1999")?.pauseReason == .user)
        #expect(queue.handle("d-18000", .setPriority(.essential)).contains(.priorityChanged(id: "d-18000")))
        let cancel = queue.handle("d-2999", .cancel)
        #expect(queue.download("d-2999")?.state == .cancelled && cancel.contains(.settled(transactionID: "t-d-2999")))
        rows.save(&queue)
        #expect(queue.compactCount == Self.count - 5, "the cancelled one is gone, the others compact: \(queue.compactCount)")
        #expect(queue.download("d-1999")?.pauseReason == .user && queue.download("d-18000")?.priority == .essential)
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")

        var order: [String] = []
        var running = started
        for turn in 0..<30 {
            if turn == 5 {
                #expect(QueueMachineTests.admitted(queue.handle("d-1999", .resume)).isEmpty, "no slot is free yet")
                #expect(queue.download("d-1999")?.state == .waiting)
            }
            let next = try Self.finish(&queue, running.removeFirst(), rows: rows)
            rows.save(&queue)
            running += next
            order += next
        }
        let essentials = [999, 3999, 4999, 5999, 6999, 1999] + [7999, 8999, 9999, 10999, 11999, 12999, 13999, 14999, 15999]
        let expected = essentials.map { "d-\($0)" } + ["d-16999", "d-17999", "d-18000", "d-18999", "d-19999"]
        #expect(Array(order.prefix(expected.count)) == expected, "\(order)")
        #expect(Array(order.dropFirst(expected.count)) == (4..<(4 + 30 - expected.count)).map { "d-\($0)" }, "\(order)")
        #expect(queue.download("d-12345") == machine(12345).download, "still waiting, deep in the queue, as added")
        #expect(queue.compactCount == queue.entries.count - 4, "only the 4 running are loaded: \(queue.compactCount)")
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")
        #expect(clock.now - began < .seconds(60), "20,000 downloads owned and 30 turns took \(clock.now - began)")
    }

    /// The compact form changes nothing anyone sees: seeded random events on 6 downloads behind 2 slots (pauses,
    /// resumes, cancels, priorities, failures and retries, metered changes, admissions with room or not, ticks), saved after
    /// each as the driver saves, give the same actions and the same downloads with compact entries read back from their
    /// rows as with every machine kept.
    @Test func compactEntriesActAndAnswerAsKeptMachinesDoUnderRandomEvents() {
        let now = Date()
        var compacted = 0
        for seed in 1...200 {
            var random = SplitMix(state: UInt64(seed))
            let rows = Rows()
            var compact = QueueMachine(concurrency: 2, spaceMargin: 0, meteredLimit: 500)
            compact.loader = rows.loader
            var kept = QueueMachine(concurrency: 2, spaceMargin: 0, meteredLimit: 500)
            var pending: [String] = []
            for n in 0..<6 {
                let machine = QueueMachineTests.machine(n, length: 1000, unpacked: 1000)
                rows.write(machine)
                let actions = compact.own(machine, position: 0, saved: true)
                #expect(actions == kept.own(machine, position: 0, saved: true), "seed \(seed): owning d-\(n)")
                pending += QueueMachineTests.admitted(actions)
            }
            for step in 0..<60 {
                let id = "d-\(random.next() % 6)"
                let token = kept.machine(id)?.token ?? 0
                let kind = random.next() % 12
                let space: Int64 = random.next() % 2 == 0 ? 1500 : 3000
                let flag = random.next() % 2 == 0
                let priority = DownloadPriority.allCases[Int(random.next() % 5)]
                let admitted = kind == 0 ? pending.first : nil
                if admitted != nil { pending.removeFirst() }
                func apply(_ queue: inout QueueMachine) -> [QueueMachine.Action] {
                    switch kind {
                    case 0 where admitted != nil: return queue.admit(admitted!, available: space, path: "/home", now: now)
                    case 1: return queue.handle(id, .pause(.user, nil), now: now, jitter: 0.5)
                    case 2: return queue.handle(id, .resume, now: now, jitter: 0.5)
                    case 3: return queue.handle(id, .cancel, now: now, jitter: 0.5)
                    case 4:
                        let outcome = TransferOutcome.completed(sha256: QueueMachineTests.sha, length: 1000, resumedFrom: 0)
                        return queue.handle(id, .transferFinished(token: token, outcome: outcome), now: now, jitter: 0.5)
                    case 5:
                        let failure = TransferFailure(error: PackDeliveryError(.networkFailure, message: "reset"), retryable: true)
                        return queue.handle(
                            id, .transferFinished(token: token, outcome: .failed(failure, bytesOnDisk: 100)), now: now, jitter: 0.5)
                    case 6: return queue.handle(id, .installFinished(token: token, result: .success(URL(filePath: "/c/\(id)"))), now: now)
                    case 7: return queue.networkChanged(metered: flag)
                    case 8: return queue.handle(id, .allowMetered, now: now, jitter: 0.5)
                    case 9: return queue.handle(id, .setPriority(priority), now: now, jitter: 0.5)
                    // Without space measured: the downloads a tick finds room for resume in the order of a set, which
                    // differs between two queues (Swift seeds each set's hashing apart), and so would their admissions.
                    case 10: return queue.tick(now: now)
                    default: return queue.handle(id, .retryDue(token: token), now: now, jitter: 0.5)
                    }
                }
                let actions = apply(&compact)
                #expect(actions == apply(&kept), "seed \(seed), step \(step), event \(kind) on \(id)")
                pending += QueueMachineTests.admitted(actions)
                rows.save(&compact)
                _ = kept.takeChanges(includingProgress: true)
                compacted += compact.compactCount
                for n in 0..<6 {
                    #expect(compact.download("d-\(n)") == kept.download("d-\(n)"), "seed \(seed), step \(step): d-\(n)")
                    #expect(compact.machine("d-\(n)")?.token == kept.machine("d-\(n)")?.token, "seed \(seed), step \(step): d-\(n)")
                }
                #expect(compact.disagreements().isEmpty, "seed \(seed), step \(step): \(compact.disagreements())")
            }
        }
        #expect(compacted > 10_000, "entries were compact after \(compacted) of 72,000 (download, step) pairs")
    }

    /// Through a real queue and its SQLite store: 300 purchases behind one slot (the first served at 2 KB/s). The 299
    /// waiting downloads are kept as their rows, with no machine; each answers exactly as it was added, a deep one is
    /// paused and resumed, and one moved up starts next when the slot frees, before those that arrived earlier.
    @Test func aQueueKeepsItsWaitingDownloadsAsRowsAndStartsThemInOrder() async throws {
        let site = try TestSite.random("compact-rows", size: 200_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        let pack = try #require(try site.manifest().products.first?.contents.first)
        let products = (0..<300).map { n in
            var content = pack
            content.contentIdentifier = "com.example.p\(n)"
            content.url = server.url("big.tar", fault: .slow(bytesPerSecond: 2000)).absoluteString
            return Manifest.Product(productIdentifier: "com.example.p\(n)", contents: [content])
        }
        let manifest = try LoadedManifest(manifest: Manifest(products: products), baseURL: server.baseURL.appending(path: "manifest.json"))
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false)
        configuration.concurrency = 1
        let queue = try await DownloadQueue.open(
            home: Home(folder: try Fixtures.temporaryDirectory("compact-rows-home")), configuration: configuration)
        let added = try await queue.add(products: products.map(\.productIdentifier), from: manifest)
        var byProduct: [String: Download] = [:]
        for download in added.flatMap(\.downloads) { byProduct[download.productIdentifier] = download }
        let ids = (0..<300).map { byProduct["com.example.p\($0)"]!.id }
        func compact(_ count: Int, _ what: String) async throws {
            let deadline = Date().addingTimeInterval(20)
            while queue.driven({ $0.machine.compactCount }) != count, Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
            #expect(queue.driven { $0.machine.compactCount } == count, "waited 20 s for \(count) compact downloads: \(what)")
        }

        _ = try MeteredTests.waitFor(queue, ids[0], "the first purchase downloading") { $0.state == .active }
        try await compact(299, "the 299 waiting")
        // Deep in the queue: read from its row, field for field as added.
        let deep = try #require(try queue.downloads([ids[250]]).first)
        #expect(deep == byProduct["com.example.p250"], "\(deep)")
        #expect(deep.state == .waiting && deep.bytesReceived == 0 && deep.priority == .essential)
        #expect(queue.driven { $0.machine.compactCount } == 299, "a read keeps it compact")

        // Paused and resumed: says so at once; compact again once saved.
        try queue.pause([ids[250]])
        let paused = try #require(try queue.downloads([ids[250]]).first)
        #expect(paused.state == .paused && paused.pauseReason == .user, "\(paused.state) \(String(describing: paused.pauseReason))")
        try await compact(299, "the paused one saved")
        #expect(try queue.resume([ids[250]]) == [ids[250]])
        #expect(try queue.downloads([ids[250]]).first?.state == .waiting)
        // Moved up: it starts next, before the 199 that arrived before it.
        #expect(try queue.setPriority([ids[200]], .userInitiated) == [ids[200]])
        try await compact(299, "the resumed and the moved one saved")
        try queue.cancel([ids[0]])
        _ = try MeteredTests.waitFor(queue, ids[200], "the moved-up purchase downloading next") { $0.state == .active }
        let others = try queue.downloads(Array(ids[1..<200]) + Array(ids[201...]))
        #expect(others.allSatisfy { $0.state == .waiting }, "\(others.filter { $0.state != .waiting }.map(\.productIdentifier))")
        try await compact(298, "all but the cancelled and the running")
        try queue.cancel([ids[200]])
        _ = try MeteredTests.waitFor(queue, ids[1], "then the next in order of arrival") { $0.state == .active }
        await queue.close()
    }

    /// What a queue keeps inline for each download: an error out of line (one word in a download that has none), and a
    /// machine whose running state is out of line too.
    @Test func aWaitingDownloadKeepsItsErrorAndRunningStateOutOfLine() {
        #expect(MemoryLayout<PackDeliveryError?>.size == MemoryLayout<Int>.size, "\(MemoryLayout<PackDeliveryError?>.size)")
        #expect(
            MemoryLayout<DownloadMachine>.size <= MemoryLayout<Download>.size + 160,
            "a machine is \(MemoryLayout<DownloadMachine>.size) bytes, its download \(MemoryLayout<Download>.size)")
    }
}
