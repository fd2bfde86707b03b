import Foundation
import Synchronization

/// One admission order for the queues of a process that share it (the agent's, one per home it serves): by priority,
/// then first come, first served, across all of them, within one number of slots for the machine.
///
/// Each member queue reports its demand (``QueueMachine/demand(limit:)``: what runs, and its best waiting downloads) as
/// it changes; the board decides how many slots each may hold (what runs now, plus the free slots its waiting
/// downloads won against everyone's) and tells those whose number changed (``QueueMachine/setSlots(_:)``). Nothing
/// running is ever stopped for another. A queue alone on the board holds every slot, as without it.
final class AdmissionBoard: Sendable {
    static let shared = AdmissionBoard()

    /// A waiting download's place in the machine's order (lower first).
    struct Head: Sendable, Hashable, Comparable {
        var rank: Int
        var sequence: Int
        static func < (a: Self, b: Self) -> Bool { (a.rank, a.sequence) < (b.rank, b.sequence) }
    }

    /// What a queue runs and waits to run.
    struct Demand: Sendable, Hashable {
        var running: Int
        /// Its best waiting downloads, best first (no more than the board's slots).
        var heads: [Head]
    }

    private struct Member {
        var total: Int
        var demand = Demand(running: 0, heads: [])
        var slots: Int
        var notify: @Sendable (Int) -> Void
    }

    private struct State {
        var members: [UInt64: Member] = [:]
        var next: UInt64 = 0
    }

    private let state = Mutex(State())

    /// Joins with `total` slots for the machine (the largest of the members' counts is the machine's).
    /// - Parameter notify: called, off the board's lock, with the queue's new number of slots.
    /// - Returns: the member's key, and its slots now.
    func join(total: Int, notify: @escaping @Sendable (Int) -> Void) -> (key: UInt64, slots: Int) {
        let (key, calls) = self.state.withLock { state -> (UInt64, [(@Sendable (Int) -> Void, Int)]) in
            let key = state.next
            state.next += 1
            state.members[key] = Member(total: total, slots: total, notify: notify)
            return (key, Self.allot(&state))
        }
        for (notify, slots) in calls { notify(slots) }
        return (key, self.state.withLock { $0.members[key]?.slots ?? total })
    }

    func leave(_ key: UInt64) {
        let calls = self.state.withLock { state -> [(@Sendable (Int) -> Void, Int)] in
            guard state.members.removeValue(forKey: key) != nil else { return [] }
            return Self.allot(&state)
        }
        for (notify, slots) in calls { notify(slots) }
    }

    /// A member's demand changed.
    func report(_ key: UInt64, _ demand: Demand) {
        let calls = self.state.withLock { state -> [(@Sendable (Int) -> Void, Int)] in
            guard state.members[key] != nil, state.members[key]?.demand != demand else { return [] }
            state.members[key]?.demand = demand
            return Self.allot(&state)
        }
        for (notify, slots) in calls { notify(slots) }
    }

    /// The machine's slots now.
    var total: Int { self.state.withLock { $0.members.values.map(\.total).max() ?? 0 } }

    /// Gives the free slots to the best waiting downloads of all members; returns the members to tell.
    private static func allot(_ state: inout State) -> [(@Sendable (Int) -> Void, Int)] {
        let total = state.members.values.map(\.total).max() ?? 0
        var slots = state.members.mapValues(\.demand.running)
        var free = total - slots.values.reduce(0, +)
        if state.members.count == 1, let key = state.members.keys.first {
            slots[key] = total
            free = 0
        }
        let heads = state.members.flatMap { key, member in member.demand.heads.map { (head: $0, key: key) } }
            .sorted { ($0.head, $0.key) < ($1.head, $1.key) }
        for item in heads where free > 0 {
            slots[item.key, default: 0] += 1
            free -= 1
        }
        var calls: [(@Sendable (Int) -> Void, Int)] = []
        for (key, count) in slots where state.members[key]?.slots != count {
            state.members[key]?.slots = count
            if let notify = state.members[key]?.notify { calls.append((notify, count)) }
        }
        return calls
    }
}
