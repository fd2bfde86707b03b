import Foundation
import Synchronization
import Testing

@testable import PackDelivery

/// The queue's own decisions (slots, order, space, watchdog, saving), driven with event sequences: no sockets, no sleeps.
@Suite(.timeLimit(.minutes(5))) struct QueueMachineTests {
    static let sha = String(repeating: "ab", count: 32)
    static let big: Int64 = 1 << 40

    static func machine(_ n: Int, length: Int64 = 1000, unpacked: Int64? = nil) -> DownloadMachine {
        DownloadMachine(
            download: Download(
                id: "d-\(n)", transactionID: "t-\(n)", productIdentifier: "p\(n)", contentIdentifier: "p\(n)", contentVersion: "1",
                contentLength: length, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
                contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/p\(n).zip")!, sha256: Self.sha,
                unpackedLength: unpacked, destination: .caches, bytesReceived: 0))
    }

    /// The ids the actions ask to measure space for (the next downloads to start), in order.
    static func admitted(_ actions: [QueueMachine.Action]) -> [String] {
        actions.compactMap { if case .measureSpace(let id, _) = $0 { return id } else { return nil } }
    }

    /// Admits every download the actions ask about with plenty of space; returns the ids that started.
    static func admitAll(_ queue: inout QueueMachine, _ actions: [QueueMachine.Action]) -> [String] {
        var started: [String] = []
        var pending = Self.admitted(actions)
        while !pending.isEmpty {
            let id = pending.removeFirst()
            let more = queue.admit(id, available: Self.big, path: "/home")
            if more.contains(where: { if case .run(id, .startTransfer) = $0 { return true } else { return false } }) { started.append(id) }
            pending += Self.admitted(more)
        }
        return started
    }

    /// Runs a started download to finished.
    static func complete(_ queue: inout QueueMachine, _ id: String) -> [QueueMachine.Action] {
        _ = queue.handle(id, .transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)))
        return queue.handle(id, .installFinished(token: 1, result: .success(URL(filePath: "/c/\(id)"))))
    }

    /// The first `paused` report of a download paused mid-transfer carries the bytes its transfer kept, and comes once.
    @Test func theFirstPausedReportCarriesTheBytesTheStoppedTransferKept() {
        var queue = QueueMachine(concurrency: 1)
        #expect(Self.admitAll(&queue, queue.own(Self.machine(0), position: 0)) == ["d-0"])
        _ = queue.handle("d-0", .transferProgress(token: 1, bytes: 400, validator: nil))
        var reported: [Download] = []
        func collect(_ actions: [QueueMachine.Action]) {
            for case .notify(let id) in actions { reported += [queue.download(id)].compactMap { $0 } }
        }
        let pause = queue.handle("d-0", .pause(.user, nil))
        #expect(pause.contains(.run(id: "d-0", .stopTransfer(token: 1))) && pause.contains(.save), "stopped and saved at once")
        collect(pause)
        let stopped = queue.handle("d-0", .transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 650)))
        #expect(stopped.contains(.save), "the bytes kept at the pause are saved at once")
        collect(stopped)
        let paused = reported.filter { $0.state == .paused }
        #expect(paused.map(\.bytesReceived) == [650], "one paused report, with the bytes kept: \(paused.map(\.bytesReceived))")
    }

    /// Waiting downloads take free slots by priority, then in the order they were added; a new priority moves a waiting
    /// download, and never stops a running one.
    @Test func freeSlotsGoByPriorityThenInOrderAndANewPriorityMovesAWaitingDownload() {
        var queue = QueueMachine(concurrency: 1)
        let priorities: [DownloadPriority] = [.essential, .background, .prefetch, .restore, .essential, .restore, .userInitiated]
        var actions: [QueueMachine.Action] = []
        for (n, priority) in priorities.enumerated() {
            var machine = Self.machine(n)
            _ = machine.setPriority(priority)
            actions += queue.own(machine, position: 0)
        }
        #expect(Self.admitAll(&queue, actions) == ["d-0"], "the first added takes the free slot")
        // d-1 (background) is raised above everything but userInitiated; the running d-0 is not stopped.
        let raised = queue.handle("d-1", .setPriority(.essential))
        #expect(!raised.contains { if case .run(_, .stopTransfer) = $0 { return true } else { return false } })
        #expect(raised.contains(.save), "a new priority is saved at once")
        #expect(queue.download("d-1")?.priority == .essential)
        var order: [String] = []
        var next = Self.complete(&queue, "d-0")
        while true {
            let started = Self.admitAll(&queue, next)
            guard let id = started.first else { break }
            order.append(id)
            next = Self.complete(&queue, id)
        }
        #expect(
            order == ["d-6", "d-1", "d-4", "d-3", "d-5", "d-2"], "userInitiated, essential in order, restore in order, prefetch: \(order)")
    }

    /// What the user waits for now never waits for work nobody waits for: with every slot held by restore, prefetch or
    /// background work, a user-initiated download starts beside it (each such download lends its slot to one), and
    /// nothing running is stopped. Essential work lends nothing, and nothing but a user-initiated download borrows.
    @Test func aUserInitiatedDownloadStartsBesideBackgroundWorkThatHoldsEverySlot() {
        var queue = QueueMachine(concurrency: 1)
        func add(_ n: Int, _ priority: DownloadPriority) -> [QueueMachine.Action] {
            var machine = Self.machine(n)
            _ = machine.setPriority(priority)
            return queue.own(machine, position: 0)
        }
        #expect(Self.admitAll(&queue, add(0, .background)) == ["d-0"])
        #expect(Self.admitAll(&queue, add(1, .essential)).isEmpty, "essential work waits for a free slot")
        let urgent = add(2, .userInitiated)
        #expect(!urgent.contains { if case .run(_, .stopTransfer) = $0 { true } else { false } }, "nothing running is stopped")
        // A new priority while it is being admitted neither admits it twice nor frees the slot it holds.
        let raised = queue.handle("d-2", .setPriority(.essential)) + queue.handle("d-2", .setPriority(.userInitiated))
        #expect(Self.admitted(raised).isEmpty && queue.disagreements().isEmpty, "\(queue.disagreements())")
        #expect(Self.admitAll(&queue, urgent) == ["d-2"], "started beside the background download")
        #expect(queue.running == ["d-0", "d-2"] && queue.disagreements().isEmpty)
        #expect(Self.admitAll(&queue, add(3, .userInitiated)).isEmpty, "one background download lends one slot")
        _ = queue.handle("d-0", .setPriority(.prefetch))
        // The background download ends: the one beside it takes its slot, and the rest wait for it.
        #expect(Self.admitAll(&queue, Self.complete(&queue, "d-0")).isEmpty)
        #expect(queue.running == ["d-2"] && queue.disagreements().isEmpty)
        #expect(Self.admitAll(&queue, Self.complete(&queue, "d-2")) == ["d-3"], "by priority: the second user-initiated one")
        #expect(Self.admitAll(&queue, Self.complete(&queue, "d-3")) == ["d-1"])
        // Essential work running lends nothing.
        #expect(Self.admitAll(&queue, add(4, .userInitiated)).isEmpty, "essential work runs alone in the one slot")
    }

    /// The agent's homes follow the same rule across queues: one home's background work lends its slot to another
    /// home's user-initiated download, not to its essential one.
    @Test func theMachinesAdmissionOrderLendsBackgroundSlotsToUserInitiatedDownloadsOfAnyHome() {
        let board = AdmissionBoard()
        let grants = Mutex<[Int: AdmissionBoard.Grant]>([:])
        let (a, _) = board.join(total: 1) { grant in grants.withLock { $0[0] = grant } }
        let (b, _) = board.join(total: 1) { grant in grants.withLock { $0[1] = grant } }
        board.report(a, AdmissionBoard.Demand(running: 1, beside: 0, lending: 1, heads: []))
        let essential = AdmissionBoard.Head(rank: DownloadPriority.essential.rank, sequence: 1)
        board.report(b, AdmissionBoard.Demand(running: 0, beside: 0, lending: 0, heads: [essential]))
        #expect(grants.withLock { $0[1] } == AdmissionBoard.Grant(slots: 0, lent: 0), "essential work waits for a free slot")
        let urgent = AdmissionBoard.Head(rank: DownloadPriority.userInitiated.rank, sequence: 2)
        board.report(b, AdmissionBoard.Demand(running: 0, beside: 0, lending: 0, heads: [urgent, essential]))
        #expect(grants.withLock { $0[1] } == AdmissionBoard.Grant(slots: 0, lent: 1), "the background slot is lent")
        board.report(b, AdmissionBoard.Demand(running: 0, beside: 1, lending: 0, heads: [essential]))
        #expect(grants.withLock { $0[1] } == AdmissionBoard.Grant(slots: 0, lent: 1), "held while it runs; nothing more lent")
        // Home A's background download ends, an essential one waiting there: the borrowed slot becomes B's own.
        board.report(a, AdmissionBoard.Demand(running: 0, beside: 0, lending: 0, heads: [essential]))
        #expect(grants.withLock { $0[1] } == AdmissionBoard.Grant(slots: 1, lent: 0), "\(String(describing: grants.withLock { $0[1] }))")
        #expect(grants.withLock { $0[0] }?.slots == 0, "A's essential download waits for the one slot")
    }

    @Test func slotsAreBoundedAndTheRestWaitInOrder() {
        var queue = QueueMachine(concurrency: 2)
        var actions: [QueueMachine.Action] = []
        for n in 0..<5 { actions += queue.own(Self.machine(n), position: 0) }
        #expect(Self.admitAll(&queue, actions) == ["d-0", "d-1"])
        #expect(queue.running == ["d-0", "d-1"])
        let after = Self.complete(&queue, "d-0")
        #expect(after.contains(.settled(transactionID: "t-0")))
        #expect(Self.admitAll(&queue, after) == ["d-2"], "a finished download frees its slot for the next in line")
        #expect(queue.running == ["d-1", "d-2"])
    }

    @Test func aDownloadThatDoesNotFitPausesForSpaceAndTheNextStarts() {
        var queue = QueueMachine(concurrency: 1, spaceMargin: 100)
        let actions =
            queue.own(Self.machine(0, length: 1000, unpacked: 5000), position: 0) + queue.own(Self.machine(1, length: 10), position: 0)
        #expect(Self.admitted(actions) == ["d-0"])
        let refused = queue.admit("d-0", available: 5000, path: "/home")
        let paused = queue.download("d-0")
        #expect(paused?.state == .paused && paused?.pauseReason == .insufficientStorage)
        #expect(paused?.error?.neededBytes == 6100 && paused?.error?.availableBytes == 5000 && paused?.error?.code == .insufficientStorage)
        #expect(Self.admitted(refused) == ["d-1"], "the slot goes to the next download")
        #expect(
            queue.admit("d-1", available: 5000, path: "/home").brief.contains(.run(id: "d-1", .startTransfer(token: 1, fromZero: false))))
    }

    @Test func aDownloadPausedForSpaceWaitsAgainOnceATickSeesRoom() {
        var queue = QueueMachine(concurrency: 1, spaceMargin: 0)
        _ = queue.own(Self.machine(0, length: 1000, unpacked: 1000), position: 0)
        _ = queue.admit("d-0", available: 10, path: "/home")
        #expect(queue.tick(now: Date(), available: [.caches: 1999]).isEmpty, "still too small")
        #expect(queue.download("d-0")?.state == .paused)
        let actions = queue.tick(now: Date(), available: [.caches: 2000])
        #expect(Self.admitted(actions) == ["d-0"])
        #expect(
            queue.admit("d-0", available: 2000, path: "/home").brief.contains(.run(id: "d-0", .startTransfer(token: 2, fromZero: false))))
    }

    @Test func aUserPauseOfADownloadPausedForSpaceOutlastsTheSpaceReturning() {
        var queue = QueueMachine(concurrency: 1, spaceMargin: 0)
        _ = queue.own(Self.machine(0, length: 1000, unpacked: 1000), position: 0)
        _ = queue.admit("d-0", available: 10, path: "/home")
        _ = queue.handle("d-0", .pause(.user, nil))
        #expect(queue.download("d-0")?.pauseReason == .user, "the user's pause replaces the pause for space")
        #expect(queue.tick(now: Date(), available: [.caches: 1 << 30]).isEmpty, "space returning starts nothing")
        #expect(queue.download("d-0")?.state == .paused && queue.download("d-0")?.pauseReason == .user)
    }

    @Test func sizesFromOutsideNeverOverflowTheSpaceCheck() {
        // A `contentLength` of 2^63-1 trapped in the space check.
        var queue = QueueMachine(concurrency: 1)
        let huge = Self.machine(0, length: .max, unpacked: .max)
        #expect(queue.needed(huge.download, writesOnce: false) == .max && queue.needed(huge.download, writesOnce: true) == .max)
        _ = queue.own(huge, position: 0)
        _ = queue.admit("d-0", available: Self.big, path: "/home")
        #expect(queue.download("d-0")?.state == .paused && queue.download("d-0")?.pauseReason == .insufficientStorage)
    }

    @Test func aResumedDownloadKeepsItsPlaceInLine() {
        var queue = QueueMachine(concurrency: 1)
        var actions: [QueueMachine.Action] = []
        for n in 0..<3 { actions += queue.own(Self.machine(n), position: 0) }
        #expect(Self.admitAll(&queue, actions) == ["d-0"])
        _ = queue.handle("d-1", .pause(.user, nil))
        #expect(queue.download("d-1")?.state == .paused)
        #expect(Self.admitted(queue.handle("d-1", .resume)).isEmpty, "no free slot yet")
        #expect(Self.admitAll(&queue, Self.complete(&queue, "d-0")) == ["d-1"], "d-1 was added before d-2, so it goes first")
    }

    @Test func progressIsSavedAtMostAtTheTickAndStateChangesAtOnce() {
        var queue = QueueMachine(concurrency: 1)
        _ = Self.admitAll(&queue, queue.own(Self.machine(0), position: 3))
        _ = queue.takeChanges(includingProgress: true)
        let actions = queue.handle("d-0", .transferProgress(token: 1, bytes: 500, validator: nil))
        #expect(actions == [.notify(id: "d-0")], "progress is reported, not saved at once")
        #expect(queue.takeChanges(includingProgress: false).isEmpty)
        let taken = queue.takeChanges(includingProgress: true)
        #expect(taken.count == 1 && taken[0].machine.download.bytesReceived == 500 && taken[0].position == 3)
        #expect(queue.handle("d-0", .pause(.user, nil)).contains(.save))
        #expect(queue.takeChanges(includingProgress: false).map(\.machine.state) == [.paused])
    }

    @Test func settledDownloadsLeaveTheMachineOnceSaved() {
        var queue = QueueMachine(concurrency: 1)
        _ = Self.admitAll(&queue, queue.own(Self.machine(0), position: 0) + queue.own(Self.machine(1), position: 0))
        _ = queue.handle("d-1", .cancel)
        _ = Self.complete(&queue, "d-0")
        let taken = queue.takeChanges(includingProgress: false)
        #expect(Set(taken.map(\.machine.state)) == [.finished, .cancelled])
        #expect(queue.entries.isEmpty && queue.running.isEmpty)
    }

    @Test func theWatchdogTicksOnlyActiveDownloads() {
        var queue = QueueMachine(concurrency: 1)
        var stuck = Self.machine(0)
        stuck = DownloadMachine(download: stuck.download, retryPolicy: .init(maxAttempts: 1, watchdog: 5))
        _ = Self.admitAll(&queue, queue.own(stuck, position: 0) + queue.own(Self.machine(1), position: 0))
        let actions = queue.tick(now: Date().addingTimeInterval(60))
        #expect(actions.contains(.run(id: "d-0", .stopTransfer(token: 1))))
        #expect(queue.download("d-0")?.state == .failed && queue.download("d-0")?.error?.code == .stalled)
        #expect(Self.admitted(actions) == ["d-1"], "the failed download's slot goes to the next")
        #expect(queue.download("d-1")?.state == .waiting || queue.download("d-1")?.state == .active)
    }

    @Test func closingPausesEverythingAndStartsNothingMore() {
        var queue = QueueMachine(concurrency: 1)
        _ = Self.admitAll(&queue, queue.own(Self.machine(0), position: 0) + queue.own(Self.machine(1), position: 0))
        let actions = queue.pauseAll(.interrupted, closing: true)
        #expect(actions.contains(.run(id: "d-0", .stopTransfer(token: 1))))
        #expect(Self.admitted(actions).isEmpty)
        #expect(queue.download("d-0")?.pauseReason == .interrupted && queue.download("d-1")?.pauseReason == .interrupted)
        #expect(Self.admitted(queue.handle("d-1", .resume)).isEmpty, "a closed queue starts nothing")
    }

    @Test func eventsForDownloadsItDoesNotOwnChangeNothing() {
        var queue = QueueMachine(concurrency: 1)
        #expect(queue.handle("d-9", .cancel).isEmpty)
        #expect(queue.admit("d-9", available: 0, path: "/home").isEmpty)
    }

    /// A short version of a whole catalog's queue: the order holds over thousands of downloads. Scale (10,000 packs end to
    /// end) is benchmark case 9's; this keeps the machine tests under 2 s.
    @Test func twoThousandDownloadsEachStartOnceInOrder() {
        var queue = QueueMachine(concurrency: 4)
        var pending: [String] = []
        var actions: [QueueMachine.Action] = []
        for n in 0..<2_000 { actions += queue.own(Self.machine(n), position: 0) }
        var started: [String] = []
        while true {
            let now = Self.admitAll(&queue, actions)
            started += now
            pending += now
            guard !pending.isEmpty else { break }
            actions = Self.complete(&queue, pending.removeFirst())
            _ = queue.takeChanges(includingProgress: false)
        }
        #expect(started == (0..<2_000).map { "d-\($0)" })
        #expect(queue.entries.isEmpty)
    }

    /// The sets the queue keeps beside the machines (slots, paused for space, paused for the network) always say what
    /// the stages say, after every event of 200 seeded random sequences over six downloads and two slots.
    @Test func theDerivedSetsAlwaysMatchTheStages() {
        for seed in 1...200 {
            var random = SplitMix(state: UInt64(seed))
            var queue = QueueMachine(concurrency: 2, spaceMargin: 0, meteredLimit: 500)
            // A download the queue asks about is admitted later, with room or not, after other events: harsher than the
            // driver, which admits it in the same turn. (That found an admission asked twice dropping the slot of a
            // download the first one had started: seed 2.)
            var pending: [String] = []
            for n in 0..<6 { pending += Self.admitted(queue.own(Self.machine(n, length: 1000, unpacked: 1000), position: 0)) }
            for step in 0..<60 {
                let id = "d-\(random.next() % 6)"
                let token = queue.machine(id)?.token ?? 0
                let kind = random.next() % 12
                let before = queue.machine(id)?.stage
                let actions: [QueueMachine.Action]
                switch kind {
                case 0 where !pending.isEmpty:
                    actions = queue.admit(pending.removeFirst(), available: random.next() % 2 == 0 ? 1500 : 3000, path: "/home")
                case 1: actions = queue.handle(id, .pause(.user, nil))
                case 2: actions = queue.handle(id, .resume)
                case 3: actions = queue.handle(id, .cancel)
                case 4:
                    actions = queue.handle(
                        id, .transferFinished(token: token, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)))
                case 5:
                    let failure = TransferFailure(error: PackDeliveryError(.networkFailure, message: "reset"), retryable: true)
                    actions = queue.handle(id, .transferFinished(token: token, outcome: .failed(failure, bytesOnDisk: 100)))
                case 6: actions = queue.handle(id, .installFinished(token: token, result: .success(URL(filePath: "/c/\(id)"))))
                case 7: actions = queue.networkChanged(metered: random.next() % 2 == 0)
                case 8: actions = queue.handle(id, .allowMetered)
                case 9: actions = queue.handle(id, .setPriority(DownloadPriority.allCases[Int(random.next() % 5)]))
                case 10: actions = queue.tick(now: Date(), available: [.caches: random.next() % 2 == 0 ? 1500 : 3000])
                default: actions = queue.handle(id, .retryDue(token: token))
                }
                pending += Self.admitted(actions)
                let disagreements = queue.disagreements()
                #expect(
                    disagreements.isEmpty,
                    "seed \(seed), step \(step), event \(kind) on \(id) in \(String(describing: before)): \(disagreements)")
                if !disagreements.isEmpty { return }
            }
        }
    }

}

/// "This version is already installed", ownership of content ids, and taking over downloads of a dead
/// process: decided from facts, with no I/O.
@Suite(.timeLimit(.minutes(5))) struct QueueDecisionTests {
    static let sha = String(repeating: "ab", count: 32)
    static let product = Manifest.Product(
        productIdentifier: "p",
        contents: [
            .init(contentIdentifier: "p.a", contentVersion: "2", url: "a.zip", contentLength: 100, sha256: Self.sha),
            .init(contentIdentifier: "p.b", contentVersion: "1", url: "b.zip", contentLength: 200, sha256: Self.sha),
        ])
    static let urls = [URL(string: "http://h/a.zip")!, URL(string: "http://h/b.zip")!]

    static func install(_ content: String, product: String = "p", version: String, destination: Destination = .caches) -> InstallRecord {
        InstallRecord(
            destination: destination, contentIdentifier: content, productIdentifier: product, contentVersion: version,
            contentURL: "/home/Caches/\(content)", installedAt: Date(), downloadID: "d-old", fileCount: 1, byteCount: 1)
    }

    static func plan(installs: [InstallRecord], present: Set<String>, force: Bool = false, destination: Destination = .caches) -> Result<
        [Download], PackDeliveryError
    > {
        var counter = 0
        return AddPlan.downloads(
            for: Self.product, transactionID: "t", urls: Self.urls, destination: destination, force: force,
            installs: Dictionary(grouping: installs, by: \.contentIdentifier), presentFolders: present,
            newID: {
                counter += 1
                return "d-\(counter)"
            })
    }

    @Test func aVersionInstalledWithItsFolderFinishesAtOnceUnlessForced() throws {
        let installs = [Self.install("p.a", version: "2"), Self.install("p.b", version: "0")]
        let present: Set<String> = ["/home/Caches/p.a", "/home/Caches/p.b"]
        let downloads = try Self.plan(installs: installs, present: present).get()
        #expect(downloads.map(\.state) == [.finished, .waiting], "p.a 2 is installed; p.b 1 is newer than 0")
        #expect(downloads[0].contentURL?.path == "/home/Caches/p.a" && downloads[0].progress == 1)
        #expect(try Self.plan(installs: installs, present: present, force: true).get().map(\.state) == [.waiting, .waiting])
        #expect(
            try Self.plan(installs: installs, present: ["/home/Caches/p.b"]).get().map(\.state) == [.waiting, .waiting],
            "a missing folder is fetched again")
        #expect(
            try Self.plan(installs: installs, present: present, destination: .documents).get().map(\.state) == [.waiting, .waiting],
            "installed in caches does not count for documents")
    }

    @Test func aContentIdOfAnotherProductIsRefused() {
        guard case .failure(let error) = Self.plan(installs: [Self.install("p.b", product: "q", version: "1")], present: []) else {
            Issue.record("must be refused")
            return
        }
        #expect(error.code == .contentIdentifierTaken && error.message.contains("q") && error.message.contains("p.b"))
    }

    static func record(state: DownloadState, phase: DownloadPhase? = nil, verified: Bool = false, stagingInode: Int64? = nil)
        -> DownloadRecord
    {
        var download = Download(
            id: "d-1", transactionID: "t-1", productIdentifier: "p", contentIdentifier: "p", contentVersion: "1",
            contentLength: 1000, state: state, phase: phase, progress: 0.5, timeRemaining: -1, pauseReason: nil,
            contentURL: nil, error: nil, url: URL(string: "http://h/p")!, sha256: Self.sha, unpackedLength: nil,
            destination: .caches, bytesReceived: 500)
        download.retryDate = Date()
        return DownloadRecord(
            download, position: 0, validator: "\"e\"", partialPath: nil, stagingInode: stagingInode, retriedFromZero: false,
            verified: verified)
    }

    @Test func aRunningDownloadIsPausedAsInterruptedKeepingTheBytesOnDisk() {
        let machine = Adoption.machine(
            .init(record: Self.record(state: .active, phase: .downloading), archiveBytes: 700, recoveredInstall: nil), retryPolicy: .init())
        #expect(machine.state == .paused && machine.download.pauseReason == .interrupted && machine.download.phase == nil)
        #expect(machine.download.bytesReceived == 700 && machine.download.progress == 0.7 && machine.validator == "\"e\"")
        #expect(machine.download.retryDate == nil && !machine.verified)
        let paused = Adoption.machine(
            .init(record: Self.record(state: .paused), archiveBytes: nil, recoveredInstall: nil), retryPolicy: .init())
        #expect(paused.state == .paused && paused.download.bytesReceived == 0, "no archive, no bytes")
    }

    @Test func aVerificationHoldsOnlyForACompleteArchiveAndIsCheckedAgain() {
        let complete = Adoption.machine(
            .init(record: Self.record(state: .active, phase: .unpacking, verified: true), archiveBytes: 1000, recoveredInstall: nil),
            retryPolicy: .init())
        #expect(complete.verified && complete.recheckArchive)
        let cut = Adoption.machine(
            .init(record: Self.record(state: .active, phase: .unpacking, verified: true), archiveBytes: 600, recoveredInstall: nil),
            retryPolicy: .init())
        #expect(!cut.verified && !cut.recheckArchive && cut.download.bytesReceived == 600, "a power cut shortened it: download the rest")
    }

    @Test func aMoveInterruptedByACrashIsRecoveredOrRolledBack() {
        #expect(Adoption.needsInstallRecovery(Self.record(state: .active, phase: .installing)))
        #expect(Adoption.needsInstallRecovery(Self.record(state: .active, phase: .unpacking, stagingInode: 42)))
        #expect(!Adoption.needsInstallRecovery(Self.record(state: .active, phase: .unpacking)))
        #expect(Adoption.discardsStaging(Self.record(state: .active, phase: .unpacking)))
        #expect(!Adoption.discardsStaging(Self.record(state: .paused)), "a paused download has no staging in use")
        let recovered = Adoption.machine(
            .init(
                record: Self.record(state: .active, phase: .installing, stagingInode: 42), archiveBytes: 1000,
                recoveredInstall: URL(filePath: "/home/Caches/p")), retryPolicy: .init())
        #expect(recovered.state == .finished && recovered.download.contentURL?.path == "/home/Caches/p" && recovered.download.progress == 1)
    }

    /// When a wait on a transaction ends, for each mix of download states: `settled` at the first moment nothing
    /// runs; `delivered` only when everything finished, with the error of a failed or cancelled download, and on a
    /// pause only when asked.
    @Test func aWaitForADeliveryEndsOnlyWhenEverythingFinishedOrOneFailedOrWasCancelled() {
        func transaction(_ states: [DownloadState]) -> Transaction {
            Transaction(
                id: "t-1", productIdentifier: "p", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false,
                downloads: states.enumerated().map { n, state in
                    var download = QueueMachineTests.machine(n).download
                    download.state = state
                    download.transactionID = "t-1"
                    if state == .failed { download.error = PackDeliveryError(.checksumMismatch, message: "bad", subject: "u") }
                    if state == .paused { download.pauseReason = .insufficientStorage }
                    return download
                })
        }
        func verdict(_ states: [DownloadState], _ goal: TransactionWait.Goal) -> String {
            switch TransactionWait.verdict(transaction(states), goal: goal) {
            case .wait: "wait"
            case .done: "done"
            case .failed(let error): error.code.rawValue
            }
        }
        let table: [([DownloadState], settled: String, delivered: String, returningOnPause: String)] = [
            ([.active, .finished], "wait", "wait", "wait"),
            ([.waiting], "wait", "wait", "wait"),
            ([.finished, .finished], "done", "done", "done"),
            ([.paused, .finished], "done", "wait", "done"),
            ([.paused, .active], "wait", "wait", "wait"),
            ([.failed, .active], "wait", "checksumMismatch", "checksumMismatch"),
            ([.failed, .paused], "done", "checksumMismatch", "checksumMismatch"),
            ([.cancelled, .active], "wait", "wait", "wait"),
            ([.cancelled, .finished], "done", "cancelled", "cancelled"),
            ([.cancelled, .paused], "done", "wait", "done"),
        ]
        for row in table {
            #expect(verdict(row.0, .settled) == row.settled, "settled, \(row.0)")
            #expect(verdict(row.0, .delivered(returningOnPause: false)) == row.delivered, "delivered, \(row.0)")
            #expect(verdict(row.0, .delivered(returningOnPause: true)) == row.returningOnPause, "delivered returning on pause, \(row.0)")
        }
    }
}
