import Foundation
import Testing

@testable import PackDelivery

/// The decisions behind ``AgentUse`` with no agent: the queue machine while it hands over, and the parsing of the
/// agent's event stream. No sockets, no sleeps.
@Suite(.timeLimit(.minutes(1))) struct AgentHandOverTests {
    @Test func whileHandingOverNothingIsAdmittedAndTheWaitingDownloadsAreHandedOnce() {
        var queue = QueueMachine(concurrency: 2)
        #expect(QueueMachineTests.admitAll(&queue, queue.own(QueueMachineTests.machine(0), position: 0)) == ["d-0"])
        queue.startHandingOver()
        let owned = queue.own(QueueMachineTests.machine(1), position: 0) + queue.own(QueueMachineTests.machine(2), position: 0)
        #expect(QueueMachineTests.admitted(owned).isEmpty, "a free slot, and nothing admitted: \(owned)")
        _ = queue.handle("d-2", .pause(.user, nil))
        let handed = queue.handOver()
        #expect(handed.map(\.id) == ["d-1"], "only what waits, never the running one nor the paused one: \(handed)")
        #expect(handed.first?.transactionID == "t-1")
        #expect(queue.download("d-1") == nil, "forgotten: the agent runs it now")
        #expect(queue.download("d-0")?.state == .active, "what runs here goes on here")
        #expect(queue.handOver().isEmpty, "handed once")
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")
    }

    @Test func whenTheAgentGoesAwayTheWaitingDownloadsAreAdmittedHere() {
        var queue = QueueMachine(concurrency: 1)
        queue.startHandingOver()
        #expect(QueueMachineTests.admitted(queue.own(QueueMachineTests.machine(3), position: 0)).isEmpty)
        #expect(QueueMachineTests.admitted(queue.stopHandingOver()) == ["d-3"])
        #expect(queue.handOver().isEmpty, "no longer handing over")
    }

    @Test func theEventStreamIsSplitIntoEventsWhateverTheChunks() {
        let text =
            ": stream\n\nid: 7\nevent: download\ndata: {\"a\":1}\n\n: keep-alive\n\nid: 8\r\nevent: reset\r\ndata: x\r\ndata: y\r\n\r\n"
        let bytes = Array(text.utf8)
        for cut in [1, 3, 17, bytes.count] {
            var parser = SSEParser()
            var events: [AgentEventFollower.Event] = []
            var start = 0
            while start < bytes.count {
                let end = min(start + cut, bytes.count)
                events += bytes[start..<end].withUnsafeBytes { parser.feed($0) }
                start = end
            }
            #expect(
                events == [
                    AgentEventFollower.Event(id: 7, kind: "download", data: "{\"a\":1}"),
                    AgentEventFollower.Event(id: 8, kind: "reset", data: "x\ny"),
                ], "cut every \(cut) bytes: \(events)")
        }
    }
}
