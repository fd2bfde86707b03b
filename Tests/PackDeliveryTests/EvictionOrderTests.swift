import Foundation
import GRDB
import PackTestSupport
import Testing

@testable import PackDelivery

/// The store's eviction order and lease liveness, without sockets or folders: lowest preservation priority, then least
/// recently used; documents, leased packs (by a live process) and packs of unfinished transactions left out.
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
}
