import Foundation
import GRDB
import PackTestSupport
import Testing

@testable import PackDelivery

/// The store's eviction order and lease liveness, without sockets or folders: lowest preservation priority, then least
/// recently used; documents, leased packs (by a live process) and essential packs of unfinished transactions left out.
@Suite(.timeLimit(.minutes(1))) struct EvictionOrderTests {
    static func install(_ store: Store, _ name: String, _ destination: Destination = .caches, at seconds: TimeInterval) throws {
        try store.commitInstall(
            InstallRecord(
                destination: destination, contentIdentifier: name, productIdentifier: "com.example.\(name)", contentVersion: "1",
                contentURL: "/nowhere/\(name)", installedAt: Date(timeIntervalSince1970: seconds), downloadID: "d-\(name)",
                fileCount: 1, byteCount: 100),
            files: [], download: nil)
    }

    @Test func candidatesGoByPriorityThenLastUseAndLeasesOfDeadProcessesAreDropped() throws {
        let store = try Store(url: try Fixtures.temporaryDirectory("eviction-order").appending(path: "state.sqlite"))
        defer { store.close() }
        for (index, name) in ["a", "b", "c", "d"].enumerated() { try Self.install(store, name, at: 1_000 + Double(index)) }
        try Self.install(store, "doc", .documents, at: 900)
        try store.setPreservationPriorities(["a": 3])
        // b is used after d was installed.
        try store.recordUse(productIdentifier: "com.example.b", at: Date(timeIntervalSince1970: 2_000))
        #expect(try store.evictionCandidates(protecting: []).map(\.install.contentIdentifier) == ["c", "d", "b", "a"])
        #expect(try store.evictionCandidates(protecting: ["c"]).map(\.install.contentIdentifier) == ["d", "b", "a"])

        // A lease of this process protects; one of a process that is gone (a start time that is not its) does not,
        // and its row goes.
        try store.addLease([
            LeaseRecord(
                token: "l-live", productIdentifier: "com.example.d", contentIdentifier: nil, ownerPID: getpid(),
                ownerStart: QueueOwner.currentStart, createdAt: Date(timeIntervalSince1970: 1_500)),
            LeaseRecord(
                token: "l-dead", productIdentifier: "", contentIdentifier: "c", ownerPID: getpid(),
                ownerStart: QueueOwner.currentStart + 1, createdAt: Date(timeIntervalSince1970: 1_500)),
        ])
        #expect(try store.evictionCandidates(protecting: []).map(\.install.contentIdentifier) == ["c", "b", "a"])
        #expect(try store.liveLeases().map(\.token) == ["l-live"])
        #expect(try store.endLease("l-live"))
        #expect(try store.evictionCandidates(protecting: []).map(\.install.contentIdentifier).last == "a")
    }

    @Test func anUnfinishedTransactionKeepsItsEssentialPacksAndNotItsPrefetchOrOnDemandOnes() throws {
        let store = try Store(url: try Fixtures.temporaryDirectory("eviction-policies").appending(path: "state.sqlite"))
        defer { store.close() }
        for (index, name) in ["essential", "prefetch", "onDemand"].enumerated() { try Self.install(store, name, at: 1_000 + Double(index)) }
        let downloads = [DeliveryPolicy.essential, .prefetch, .onDemand].map { policy in
            var download = Download(
                id: "d-\(policy.rawValue)", transactionID: "t-1", productIdentifier: "com.example.t", contentIdentifier: policy.rawValue,
                contentVersion: "1", contentLength: 100, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
                contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/\(policy.rawValue).tar")!,
                sha256: String(repeating: "ab", count: 32), unpackedLength: nil, destination: .caches, bytesReceived: 0)
            download.delivery = policy
            return download
        }
        let transaction = Transaction(
            id: "t-1", productIdentifier: "com.example.t", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false,
            downloads: downloads)
        try store.insert([transaction], owner: QueueOwner.new()) { "\($0.id).pack" }
        #expect(try store.evictionCandidates(protecting: []).map(\.install.contentIdentifier) == ["prefetch", "onDemand"])
    }
}
