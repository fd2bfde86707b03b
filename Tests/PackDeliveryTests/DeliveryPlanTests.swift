import Foundation
import Testing

@testable import PackDelivery

/// How a pack is delivered is decided by the machines from the facts the driver gathered (``DeliveryFacts``), once
/// per transfer order, and carried in the order: the driver runs a plan, it never picks one. No sockets, no store.
@Suite(.timeLimit(.minutes(1))) struct DeliveryPlanTests {
    static let installed = InstallRecord(
        destination: .caches, contentIdentifier: "p", productIdentifier: "p", contentVersion: "1", contentURL: "/c/p",
        installedAt: Date(timeIntervalSince1970: 0), downloadID: "d-0", fileCount: 1, byteCount: 5)

    /// An indexed tar pack of 16 MiB, the kind a first install writes chunk by chunk.
    static func indexedTar(url: URL = URL(string: "http://127.0.0.1/p.tar")!) -> Download {
        var download = DownloadMachineTests.download()
        download.url = url
        download.contentLength = 16 << 20
        download.index = Manifest.IndexReference(
            url: "http://127.0.0.1/p.tar.index", sha256: String(repeating: "cd", count: 32), length: 10)
        return download
    }

    static func orders(_ actions: [DownloadMachine.Action]) -> [TransferOrder] {
        actions.compactMap { action in
            if case .startTransfer(let order) = action { return order }
            return nil
        }
    }

    @Test func thePlanFollowsTheFacts() {
        let pack = Self.indexedTar()
        let on = DeliveryFacts(deltaUpdates: true)
        #expect(DeliveryPlan.decide(for: pack, facts: on, deltaRefused: false, fromZero: false) == .writeOnce)
        var update = on
        update.installed = Self.installed
        #expect(DeliveryPlan.decide(for: pack, facts: update, deltaRefused: false, fromZero: false) == .delta(from: Self.installed))
        // Whole-pack bytes on disk are resumed, never mixed with a delta or a chunked first install.
        var kept = update
        kept.archiveBytes = 4096
        #expect(DeliveryPlan.decide(for: pack, facts: kept, deltaRefused: false, fromZero: false) == .wholePack(fromZero: false))
        #expect(DeliveryPlan.decide(for: pack, facts: update, deltaRefused: true, fromZero: false) == .wholePack(fromZero: false))
        #expect(DeliveryPlan.decide(for: pack, facts: update, deltaRefused: false, fromZero: true) == .wholePack(fromZero: true))
        #expect(DeliveryPlan.decide(for: pack, facts: .none, deltaRefused: false, fromZero: false) == .wholePack(fromZero: false))
        // No index: nothing to update from; a small or zip pack installs whole.
        var plain = pack
        plain.index = nil
        #expect(DeliveryPlan.decide(for: plain, facts: update, deltaRefused: false, fromZero: false) == .wholePack(fromZero: false))
        let zip = Self.indexedTar(url: URL(string: "http://127.0.0.1/p.zip")!)
        #expect(DeliveryPlan.decide(for: zip, facts: on, deltaRefused: false, fromZero: false) == .wholePack(fromZero: false))
        #expect(DeliveryPlan.decide(for: zip, facts: update, deltaRefused: false, fromZero: false) == .delta(from: Self.installed))
    }

    /// The plan is decided from the facts of the admission, and the machine changes it by its own rules only: a refused
    /// delta fetches the whole pack, a resumed pack with the wrong checksum fetches it again from zero.
    @Test func theMachineCarriesThePlanInEachOrderAndChangesItByItsOwnRules() {
        var machine = DownloadMachine(download: Self.indexedTar())
        var facts = DeliveryFacts(deltaUpdates: true)
        facts.installed = Self.installed
        let first = Self.orders(machine.start(facts: facts))
        #expect(first.map(\.plan) == [.delta(from: Self.installed)] && first.map(\.token) == [1])
        let refused = Download.DeltaFallback(.rangesNotSupported, "the server sent the whole file")
        let second = Self.orders(machine.transferFinished(token: 1, outcome: .deltaRefused(refused)))
        #expect(second.map(\.plan) == [.wholePack(fromZero: false)] && second.map(\.token) == [2])
        _ = machine.progress(token: 2, bytesOnDisk: 600, validator: "\"e1\"")
        let wrong = String(repeating: "ef", count: 32)
        let third = Self.orders(
            machine.transferFinished(token: 2, outcome: .completed(sha256: wrong, length: 16 << 20, resumedFrom: 600)))
        #expect(third.map(\.plan) == [.wholePack(fromZero: true)])
        // A pause and a resume admit it again: the delta stays refused whatever the new facts say.
        _ = machine.pause(.user)
        _ = machine.transferFinished(token: 3, outcome: .stopped(bytesOnDisk: 0))
        _ = machine.resume()
        #expect(Self.orders(machine.start(facts: facts)).map(\.plan) == [.wholePack(fromZero: false)])
    }

    /// A rule that needs a fact learned mid-transfer: the delta reports what it would fetch (`.deltaPlanned`) and waits;
    /// the machine answers. Past 60% of the pack, the answer is a refusal, and the delta's end (`.deltaRefused`) starts
    /// the whole pack, in one order; at or under it, the update goes on and its progress counts the delta's bytes.
    @Test func aDeltaThatWouldFetchMoreThanSixtyPercentFetchesTheWholePack() {
        func delta(_ bytes: Int64) -> Download.Delta {
            Download.Delta(bytesToFetch: bytes, bytesReused: 0, entriesToFetch: 1, filesReused: 0, bytesKept: 0)
        }
        var facts = DeliveryFacts(deltaUpdates: true)
        facts.installed = Self.installed
        let pack = Self.indexedTar()
        let length = pack.contentLength
        #expect(DeliveryPlan.refusal(of: delta(length * 6 / 10), packLength: length) == nil, "60% exactly goes on")
        #expect(DeliveryPlan.refusal(of: delta(length * 6 / 10 + 1), packLength: length)?.reason == .tooMuchChanged)

        var going = DownloadMachine(download: pack)
        _ = going.start(facts: facts)
        #expect(going.deltaPlanned(token: 1, delta: delta(length / 2)) == [.answerDeltaPlan(token: 1, refusal: nil)])
        #expect(going.download.delta?.bytesToFetch == length / 2 && going.download.deltaFallback == nil)

        var machine = DownloadMachine(download: pack)
        #expect(Self.orders(machine.start(facts: facts)).map(\.plan) == [.delta(from: Self.installed)])
        let answer = machine.deltaPlanned(token: 1, delta: delta(length * 7 / 10))
        guard case .answerDeltaPlan(1, let refusal?) = answer.first, answer.count == 1 else {
            Issue.record("a refusal is answered to the delta: \(answer)")
            return
        }
        #expect(refusal.reason == .tooMuchChanged && refusal.message.contains("\(length * 7 / 10) of the pack's \(length) bytes"))
        #expect(machine.download.delta == nil, "a refused delta's numbers are not shown as the download's")
        let whole = Self.orders(machine.transferFinished(token: 1, outcome: .deltaRefused(refusal)))
        #expect(whole.map(\.plan) == [.wholePack(fromZero: false)] && whole.map(\.token) == [2])
        #expect(machine.download.deltaFallback?.reason == .tooMuchChanged)
        // A plan reported by a transfer already replaced changes nothing and gets no answer.
        #expect(machine.deltaPlanned(token: 1, delta: delta(1)).isEmpty)
    }

    /// The order carries what the transfer needs: the source, its validator, and whether fresh credentials are asked for.
    @Test func theOrderCarriesTheSourceAndItsValidator() {
        var machine = DownloadMachine(download: DownloadMachineTests.download())
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: "\"v1\"")
        let orders = Self.orders(
            machine.transferFinished(token: 1, outcome: .failed(DownloadMachineTests.networkFailure, bytesOnDisk: 400)))
        #expect(orders.isEmpty, "a retry waits first")
        let retried = Self.orders(machine.retryDue(token: 2))
        #expect(retried.count == 1)
        #expect(retried.first?.source == machine.download.url && retried.first?.validator == "\"v1\"")
        #expect(retried.first?.credentialsRefused == false)
    }

    /// A pack with several sources starts at the source the facts prefer (the ranking's pick), unless bytes are kept:
    /// those go on at the source they came from.
    @Test func aPreferredSourceIsTakenOnlyBeforeTheFirstBytes() {
        var fresh = SourceFailoverMachineTests.machine()
        var facts = DeliveryFacts.none
        facts.preferredSource = SourceFailoverMachineTests.b
        let orders = Self.orders(fresh.start(facts: facts))
        #expect(orders.map(\.source) == [SourceFailoverMachineTests.b] && orders.map(\.token) == [1])
        #expect(fresh.download.url == SourceFailoverMachineTests.b)

        var resumed = SourceFailoverMachineTests.machine()
        _ = resumed.start()
        _ = resumed.progress(token: 1, bytesOnDisk: 400, validator: nil)
        _ = resumed.pause(.user)
        _ = resumed.transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 400))
        _ = resumed.resume()
        #expect(Self.orders(resumed.start(facts: facts)).map(\.source) == [SourceFailoverMachineTests.a])

        // A source the pack does not list is never taken.
        var other = SourceFailoverMachineTests.machine()
        facts.preferredSource = URL(string: "http://elsewhere.example/p.tar")!
        #expect(Self.orders(other.start(facts: facts)).map(\.source) == [SourceFailoverMachineTests.a])
    }

    /// The queue asks for the space of the plan the facts give: a first install written chunk by chunk keeps no
    /// archive.
    @Test func theQueueAdmitsByThePlansSpace() {
        var queue = QueueMachine(concurrency: 1, spaceMargin: 0)
        var download = Self.indexedTar()
        download.unpackedLength = 1000
        _ = queue.own(DownloadMachine(download: download), position: 0)
        let paused = queue.admit(download.id, facts: .none, available: 1000, path: "/home")
        #expect(queue.download(download.id)?.state == .paused, "the whole pack needs its bytes too: \(paused)")
        _ = queue.handle(download.id, .resume)
        let started = queue.admit(download.id, facts: DeliveryFacts(deltaUpdates: true), available: 1000, path: "/home")
        #expect(queue.download(download.id)?.state == .active, "\(started)")
    }
}
