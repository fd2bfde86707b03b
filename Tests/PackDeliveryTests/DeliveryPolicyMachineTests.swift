import Foundation
import Testing

@testable import PackDelivery

/// Delivery policies decided with no I/O: what a transaction's downloads start as (``AddPlan``), the order the queue
/// admits them in (``QueueMachine``), when a transaction is finishable and a delivery waited for is over
/// (``TransactionWait``), and the `priorityChanged` report. No sockets, no sleeps.
@Suite(.timeLimit(.minutes(2))) struct DeliveryPolicyMachineTests {
    static let sha = String(repeating: "ab", count: 32)

    static func product(_ id: String, _ policies: [DeliveryPolicy?]) -> Manifest.Product {
        Manifest.Product(
            productIdentifier: id,
            contents: policies.enumerated().map { n, policy in
                var content = Manifest.Content(
                    contentIdentifier: "\(id).\(n)", contentVersion: "1", url: "\(id).\(n).zip", contentLength: 1000, sha256: Self.sha)
                content.delivery = policy
                return content
            })
    }

    static func plan(_ product: Manifest.Product, priority: DownloadPriority = .essential) throws -> [Download] {
        var next = 0
        return try AddPlan.downloads(
            for: product, transactionID: "t-\(product.productIdentifier)",
            urls: product.contents.map { URL(string: "http://127.0.0.1/\($0.url)")! }, destination: .caches, force: false,
            priority: priority, installs: [:], presentFolders: [],
            newID: {
                next += 1
                return "d-\(product.productIdentifier)-\(next)"
            }
        ).get()
    }

    /// Admits every download the actions ask about with plenty of space; returns the ids that started.
    static func admitAll(_ queue: inout QueueMachine, _ actions: [QueueMachine.Action]) -> [String] {
        var started: [String] = []
        var pending = actions.compactMap { if case .measureSpace(let id, _) = $0 { return id } else { return nil } }
        while !pending.isEmpty {
            let id = pending.removeFirst()
            let more = queue.admit(id, available: 1 << 40, path: "/home")
            if more.contains(where: { if case .run(id, .startTransfer) = $0 { return true } else { return false } }) { started.append(id) }
            pending += more.compactMap { if case .measureSpace(let id, _) = $0 { return id } else { return nil } }
        }
        return started
    }

    @Test func aManifestThatSaysNothingIsEssentialAndEachPolicyStartsAsItSays() throws {
        let downloads = try Self.plan(Self.product("p", [nil, .essential, .prefetch, .onDemand]))
        #expect(downloads.map(\.delivery) == [.essential, .essential, .prefetch, .onDemand])
        #expect(downloads.map(\.priority) == [.essential, .essential, .prefetch, .essential])
        #expect(downloads.map(\.state) == [.waiting, .waiting, .waiting, .paused], "an on-demand pack is recorded, not fetched")
        #expect(downloads[3].pauseReason == .onDemand)
        // A restore's essential packs start at restore, its prefetch packs still at prefetch.
        let restored = try Self.plan(Self.product("r", [nil, .prefetch]), priority: .restore)
        #expect(restored.map(\.priority) == [.restore, .prefetch])
    }

    @Test func aTransactionIsFinishableAndDeliveredOnceItsEssentialPacksAre() throws {
        var downloads = try Self.plan(Self.product("p", [.essential, .prefetch, .onDemand]))
        var transaction = Transaction(
            id: "t-p", productIdentifier: "p", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false, downloads: downloads
        )
        #expect(!transaction.isFinishable)
        #expect(TransactionWait.verdict(transaction, goal: .delivered(returningOnPause: false)) == .wait)
        downloads[0].state = .finished
        transaction.downloads = downloads
        #expect(transaction.isFinishable, "the prefetch pack waits and the on-demand one is not asked for")
        #expect(TransactionWait.verdict(transaction, goal: .delivered(returningOnPause: false)) == .done)
        // A prefetch pack that fails does not fail the purchase.
        transaction.downloads[1].state = .failed
        #expect(TransactionWait.verdict(transaction, goal: .delivered(returningOnPause: false)) == .done)
        // Every pack essential (a manifest that says nothing): as before, each one.
        let plain = try Self.plan(Self.product("q", [nil, nil]))
        var old = Transaction(
            id: "t-q", productIdentifier: "q", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false, downloads: plain)
        old.downloads[0].state = .finished
        #expect(!old.isFinishable)
    }

    @Test func aNewPriorityOfAWaitingDownloadIsReportedAndOfARunningOneIsNot() throws {
        var queue = QueueMachine(concurrency: 1)
        var actions: [QueueMachine.Action] = []
        for download in try Self.plan(Self.product("p", [.essential, .prefetch, .onDemand])) {
            actions += queue.own(DownloadMachine(download: download), position: 0)
        }
        #expect(Self.admitAll(&queue, actions) == ["d-p-1"])
        #expect(queue.handle("d-p-2", .setPriority(.userInitiated)).contains(.priorityChanged(id: "d-p-2")))
        #expect(queue.handle("d-p-3", .setPriority(.userInitiated)).contains(.priorityChanged(id: "d-p-3")), "paused, on demand")
        #expect(!queue.handle("d-p-2", .setPriority(.userInitiated)).contains(.priorityChanged(id: "d-p-2")), "the same priority again")
        #expect(!queue.handle("d-p-1", .setPriority(.background)).contains(.priorityChanged(id: "d-p-1")), "running: not queued")
    }
}

/// Restores and prefetch packs in the queue's admission order (machine tests of ``QueueMachine``).
extension QueueMachineTests {
    @Test func aRestoreAddedLaterStartsBeforeQueuedPrefetchWork() throws {
        var queue = QueueMachine(concurrency: 1)
        var actions: [QueueMachine.Action] = []
        let purchase = try DeliveryPolicyMachineTests.plan(
            DeliveryPolicyMachineTests.product("p", [.essential, .prefetch, .prefetch, .prefetch]))
        for download in purchase {
            actions += queue.own(DownloadMachine(download: download), position: 0)
        }
        var order = DeliveryPolicyMachineTests.admitAll(&queue, actions)
        #expect(order == ["d-p-1"])
        // The restore comes while the purchase's essential pack runs and its prefetch packs wait.
        for download in try DeliveryPolicyMachineTests.plan(DeliveryPolicyMachineTests.product("r", [nil, nil]), priority: .restore) {
            actions = queue.own(DownloadMachine(download: download), position: 0)
            #expect(DeliveryPolicyMachineTests.admitAll(&queue, actions).isEmpty, "every slot is taken")
        }
        while let running = queue.running.first {
            _ = queue.handle(running, .transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)))
            let next = queue.handle(running, .installFinished(token: 1, result: .success(URL(filePath: "/c/\(running)"))))
            order += DeliveryPolicyMachineTests.admitAll(&queue, next)
        }
        #expect(order == ["d-p-1", "d-r-1", "d-r-2", "d-p-2", "d-p-3", "d-p-4"], "restore before queued prefetch: \(order)")
    }
}

/// Metered connections, decided in ``QueueMachine``: which downloads wait for an unmetered one, at admission and while
/// they transfer, and when they go again. No sockets, no sleeps.
@Suite(.timeLimit(.minutes(2))) struct MeteredMachineTests {
    static func download(_ id: String, length: Int64, priority: DownloadPriority, delivery: DeliveryPolicy = .essential) -> DownloadMachine
    {
        var download = Download(
            id: id, transactionID: "t-\(id)", productIdentifier: "p", contentIdentifier: id, contentVersion: "1", contentLength: length,
            state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil, contentURL: nil, error: nil,
            url: URL(string: "http://127.0.0.1/\(id).tar")!, sha256: DeliveryPolicyMachineTests.sha, unpackedLength: nil,
            destination: .caches, bytesReceived: 0)
        download.priority = priority
        download.delivery = delivery
        return DownloadMachine(download: download)
    }

    @Test func onAMeteredConnectionOnlyLargePacksTheUserDidNotAskForWait() {
        var queue = QueueMachine(concurrency: 8, meteredLimit: 1000)
        _ = queue.networkChanged(metered: true)
        var actions: [QueueMachine.Action] = []
        actions += queue.own(Self.download("purchase", length: 5000, priority: .essential), position: 0)
        actions += queue.own(Self.download("asked", length: 5000, priority: .userInitiated, delivery: .onDemand), position: 0)
        actions += queue.own(Self.download("restore", length: 5000, priority: .restore), position: 0)
        actions += queue.own(Self.download("prefetch", length: 5000, priority: .prefetch, delivery: .prefetch), position: 0)
        actions += queue.own(Self.download("small", length: 1000, priority: .restore), position: 0)
        let started = DeliveryPolicyMachineTests.admitAll(&queue, actions)
        #expect(Set(started) == ["purchase", "asked", "small"], "\(started)")
        for id in ["restore", "prefetch"] {
            #expect(queue.download(id)?.state == .paused && queue.download(id)?.pauseReason == .waitingForUnmeteredNetwork, "\(id)")
        }
        // A resume is not the user's explicit yes: it waits again.
        let resumed = queue.handle("restore", .resume)
        #expect(DeliveryPolicyMachineTests.admitAll(&queue, resumed).isEmpty)
        #expect(queue.download("restore")?.pauseReason == .waitingForUnmeteredNetwork)
        // Allowed: it goes, on the metered connection.
        #expect(DeliveryPolicyMachineTests.admitAll(&queue, queue.handle("restore", .allowMetered)) == ["restore"])
        // The connection is not metered any more: the prefetch pack goes.
        #expect(DeliveryPolicyMachineTests.admitAll(&queue, queue.networkChanged(metered: false)) == ["prefetch"])
    }

    @Test func networkManagersMeteredValuesAreReadAsItDefinesThem() {
        // NM_METERED: 0 unknown, 1 yes, 2 no, 3 guessed yes, 4 guessed no.
        #expect([0, 1, 2, 3, 4].map { NetworkManagerPolicy.parse("u \($0)\n") } == [false, true, false, true, false])
        #expect(!NetworkManagerPolicy.parse("") && !NetworkManagerPolicy.parse("s \"yes\""))
    }

    @Test func aTransferPausesWhenTheConnectionBecomesMeteredKeepingItsBytesAndGoesOnWhenItIsNot() {
        var queue = QueueMachine(concurrency: 2, meteredLimit: 1000)
        let actions =
            queue.own(Self.download("prefetch", length: 5000, priority: .prefetch, delivery: .prefetch), position: 0)
            + queue.own(Self.download("purchase", length: 5000, priority: .essential), position: 0)
        #expect(Set(DeliveryPolicyMachineTests.admitAll(&queue, actions)) == ["prefetch", "purchase"])
        _ = queue.handle("prefetch", .transferProgress(token: 1, bytes: 1200, validator: "\"v\""))
        _ = queue.handle("purchase", .transferProgress(token: 1, bytes: 1200, validator: "\"v\""))
        let metered = queue.networkChanged(metered: true)
        #expect(metered.contains(.run(id: "prefetch", .stopTransfer(token: 1))), "the prefetch transfer stops")
        #expect(!metered.contains(.run(id: "purchase", .stopTransfer(token: 1))), "the purchase goes on")
        #expect(queue.download("prefetch")?.pauseReason == .waitingForUnmeteredNetwork)
        _ = queue.handle("prefetch", .transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 1200)))
        #expect(queue.download("prefetch")?.bytesReceived == 1200, "its bytes are kept")
        #expect(queue.networkChanged(metered: true).isEmpty, "no change, nothing to do")
        let unmetered = queue.networkChanged(metered: false)
        #expect(unmetered.contains { if case .measureSpace("prefetch", _) = $0 { return true } else { return false } })
    }
}
