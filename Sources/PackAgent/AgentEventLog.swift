import Foundation
import PackDelivery
import Synchronization

/// The agent's events, numbered, for `GET /v1/events`: the last `capacity` kept in a ring so that a client that
/// reconnects with `Last-Event-ID` gets what it missed, and one bounded stream per connected client.
final class AgentEventLog: Sendable {
    /// One server-sent event: its id, its kind (`event:`) and its JSON (`data:`).
    struct Entry: Sendable, Equatable {
        let id: UInt64
        let kind: String
        let data: String

        /// The event as server-sent events write it.
        var text: String { "id: \(self.id)\nevent: \(self.kind)\ndata: \(self.data)\n\n" }
    }

    /// What a subscriber gets first: the events after its cursor, or `reset` when the ring no longer holds them.
    enum Replay: Sendable, Equatable {
        case events([Entry])
        case reset(latest: UInt64)
    }

    private struct State {
        var ring: [Entry] = []
        /// Where the oldest entry is once the ring is full.
        var start = 0
        var nextID: UInt64 = 1
        var subscribers: [UInt64: AsyncStream<Entry>.Continuation] = [:]
        var nextSubscriber: UInt64 = 0
    }

    let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int = 4096) {
        self.capacity = max(1, capacity)
    }

    /// How many clients follow the stream now.
    var subscriberCount: Int { self.state.withLock { $0.subscribers.count } }

    /// The id the next event will have: it moves whenever anything happens in a served home.
    var nextID: UInt64 { self.state.withLock { $0.nextID } }

    /// Numbers an event, keeps it in the ring and hands it to every subscriber.
    func append(kind: String, data: String) {
        self.state.withLock { state in
            let entry = Entry(id: state.nextID, kind: kind, data: data)
            state.nextID += 1
            if state.ring.count < self.capacity {
                state.ring.append(entry)
            } else {
                state.ring[state.start] = entry
                state.start = (state.start + 1) % self.capacity
            }
            for continuation in state.subscribers.values { continuation.yield(entry) }
        }
    }

    /// Subscribes: the events after `lastID` (all kept ones when nil) and a stream of those to come, with nothing
    /// lost or repeated between them. Ending the stream's iteration unsubscribes.
    func subscribe(after lastID: UInt64?) -> (replay: Replay, stream: AsyncStream<Entry>) {
        let (stream, continuation) = AsyncStream<Entry>.makeStream(bufferingPolicy: .bufferingNewest(self.capacity))
        let replay = self.state.withLock { state -> Replay in
            let key = state.nextSubscriber
            state.nextSubscriber += 1
            state.subscribers[key] = continuation
            continuation.onTermination = { [weak self] _ in
                _ = self?.state.withLock { $0.subscribers.removeValue(forKey: key) }
            }
            let ordered = Array(state.ring[state.start...] + state.ring[..<state.start])
            guard let lastID else { return .events([]) }
            let oldest = ordered.first?.id ?? state.nextID
            if lastID + 1 < oldest || lastID >= state.nextID { return .reset(latest: state.nextID - 1) }
            return .events(ordered.filter { $0.id > lastID })
        }
        return (replay, stream)
    }
}
