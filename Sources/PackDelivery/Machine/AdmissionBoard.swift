import Foundation
import Synchronization

/// One admission order for the queues of a process that share it (the agent's, one per home it serves): by priority,
/// then first come, first served, across all of them, within one number of slots for the machine.
///
/// Each member queue reports its demand (``QueueMachine/demand(limit:)``: what runs, and its best waiting downloads) as
/// it changes; the board decides how many slots each may hold (what runs now, plus the free slots its waiting
/// downloads won against everyone's) and tells those whose number changed (``QueueMachine/setSlots(_:lent:)``). Nothing
/// running is ever stopped for another. A queue alone on the board holds every slot, as without it.
///
/// When no slot is free, restore, prefetch and background work lends its slots to user-initiated downloads, machine-wide:
/// a user-initiated download of one home runs beside another home's background work, as it would in one queue
/// (``QueueMachine``'s rule, the same here).
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
        /// Downloads holding a slot of their own.
        var running: Int
        /// Downloads holding a lent slot.
        var beside: Int
        /// Running restore, prefetch and background downloads, which lend their slots.
        var lending: Int
        /// Its best waiting downloads, best first (no more than the board's slots).
        var heads: [Head]
    }

    private struct Member {
        var total: Int
        var demand = Demand(running: 0, beside: 0, lending: 0, heads: [])
        var grant: Grant
        var notify: @Sendable (Grant) -> Void
    }

    /// What a queue may hold: slots of its own, and slots lent.
    struct Grant: Sendable, Hashable {
        var slots: Int
        var lent: Int
    }

    private typealias Call = (@Sendable (Grant) -> Void, Grant)

    private struct State {
        var members: [UInt64: Member] = [:]
        var next: UInt64 = 0
    }

    private let state = Mutex(State())

    /// Joins with `total` slots for the machine (the largest of the members' counts is the machine's).
    /// - Parameter notify: called, off the board's lock, with the queue's new number of slots.
    /// - Returns: the member's key, and its slots now.
    func join(total: Int, notify: @escaping @Sendable (Grant) -> Void) -> (key: UInt64, grant: Grant) {
        let (key, calls) = self.state.withLock { state -> (UInt64, [Call]) in
            let key = state.next
            state.next += 1
            state.members[key] = Member(total: total, grant: Grant(slots: total, lent: 0), notify: notify)
            return (key, Self.allot(&state))
        }
        for (notify, grant) in calls { notify(grant) }
        return (key, self.state.withLock { $0.members[key]?.grant ?? Grant(slots: total, lent: 0) })
    }

    func leave(_ key: UInt64) {
        let calls = self.state.withLock { state -> [Call] in
            guard state.members.removeValue(forKey: key) != nil else { return [] }
            return Self.allot(&state)
        }
        for (notify, grant) in calls { notify(grant) }
    }

    /// A member's demand changed.
    func report(_ key: UInt64, _ demand: Demand) {
        let calls = self.state.withLock { state -> [Call] in
            guard state.members[key] != nil, state.members[key]?.demand != demand else { return [] }
            state.members[key]?.demand = demand
            return Self.allot(&state)
        }
        for (notify, grant) in calls { notify(grant) }
    }

    /// The machine's slots now.
    var total: Int { self.state.withLock { $0.members.values.map(\.total).max() ?? 0 } }

    /// Gives the free slots first to the downloads running on lent slots (each takes a slot of its own as one frees,
    /// as in one queue), then to the best waiting downloads of all members, then the slots that running restore,
    /// prefetch and background work lends to the user-initiated ones left waiting; returns the members to tell.
    private static func allot(_ state: inout State) -> [Call] {
        let total = state.members.values.map(\.total).max() ?? 0
        var slots = state.members.mapValues(\.demand.running)
        var lent = state.members.mapValues(\.demand.beside)
        var free = total - slots.values.reduce(0, +)
        if state.members.count == 1, let key = state.members.keys.first {
            slots[key] = total
            free = 0
        }
        for key in lent.keys.sorted() where free > 0 {
            let moved = min(free, lent[key] ?? 0)
            slots[key, default: 0] += moved
            lent[key, default: 0] -= moved
            free -= moved
        }
        var lendable = state.members.values.reduce(0) { $0 + $1.demand.lending } - lent.values.reduce(0, +)
        let heads = state.members.flatMap { key, member in member.demand.heads.map { (head: $0, key: key) } }
            .sorted { ($0.head, $0.key) < ($1.head, $1.key) }
        for item in heads {
            if free > 0 {
                slots[item.key, default: 0] += 1
                free -= 1
            } else if item.head.rank == DownloadPriority.userInitiated.rank, lendable > 0 {
                lent[item.key, default: 0] += 1
                lendable -= 1
            }
        }
        var calls: [Call] = []
        for (key, count) in slots {
            let grant = Grant(slots: count, lent: lent[key] ?? 0)
            guard let member = state.members[key], member.grant != grant else { continue }
            state.members[key]?.grant = grant
            calls.append((member.notify, grant))
        }
        return calls
    }
}
