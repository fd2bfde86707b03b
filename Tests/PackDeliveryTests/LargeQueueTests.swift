import Foundation
import Testing

@testable import PackDelivery

/// A machine's whole queue (issue 44: 100,000 downloads over 10 homes in the benchmark's case 19d), in one queue:
/// 20,000 downloads wait behind 4 slots, each holding a machine that never ran (``DownloadMachine``'s running state is
/// out of line and shared until it starts). A waiting one still answers for itself, is paused, resumed and cancelled,
/// and the queue starts them by priority, then first come, first served, as slots free.
@Suite(.timeLimit(.minutes(2))) struct LargeQueueTests {
    static let count = 20_000

    /// Finishes a running download (whatever its token), and returns the ids the queue started next.
    static func finish(_ queue: inout QueueMachine, _ id: String) throws -> [String] {
        let token = try #require(queue.machine(id)?.token, "\(id) is owned")
        let sha = DeliveryPolicyMachineTests.sha
        _ = queue.handle(id, .transferFinished(token: token, outcome: .completed(sha256: sha, length: 1000, resumedFrom: 0)))
        let actions = queue.handle(id, .installFinished(token: token, result: .success(URL(filePath: "/c/\(id)"))))
        #expect(queue.download(id)?.state == .finished, "\(id) finished")
        _ = queue.takeChanges(includingProgress: true)
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

    /// What a queue keeps inline for each download: an error out of line (one word in a download that has none), and a
    /// machine whose running state is out of line too.
    @Test func aWaitingDownloadKeepsItsErrorAndRunningStateOutOfLine() {
        #expect(MemoryLayout<PackDeliveryError?>.size == MemoryLayout<Int>.size, "\(MemoryLayout<PackDeliveryError?>.size)")
        #expect(
            MemoryLayout<DownloadMachine>.size <= MemoryLayout<Download>.size + 160,
            "a machine is \(MemoryLayout<DownloadMachine>.size) bytes, its download \(MemoryLayout<Download>.size)")
    }
}
