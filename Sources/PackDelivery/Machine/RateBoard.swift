import Foundation
import Synchronization

/// The machine's rate cap (`packs config max-rate`, and the quiet rate while quiet is held) in one process: every
/// running transfer of every queue in the process holds a ticket here, and the board gives each its share of the cap
/// (``MachinePolicy/shares(of:among:)``: user-initiated downloads first), again whenever a transfer starts or ends, the
/// cap changes, or the measured rates move (``remeasure(now:)``, from each queue's tick). A transfer paces its body to its
/// ticket's rate as it changes, mid-transfer. In the agent, that is every download of the machine.
final class RateBoard: Sendable {
    static let shared = RateBoard()

    /// One running transfer's share.
    final class Ticket: Sendable {
        let id: UInt64
        let priority: DownloadPriority
        /// Bytes per second it may take now; 0 without a cap.
        let rate = Atomic<Int64>(0)
        /// Bumped at each change of `rate`, so that the transfer paces from then on, not from its start.
        let generation = Atomic<UInt64>(0)
        /// Body bytes taken so far, for the rate measured.
        let received = Atomic<Int64>(0)

        init(id: UInt64, priority: DownloadPriority) {
            self.id = id
            self.priority = priority
        }
    }

    private struct State {
        var cap: Int64?
        var tickets: [UInt64: Ticket] = [:]
        var next: UInt64 = 0
        /// Each ticket's bytes at the last measure, and its rate measured then.
        var measured: [UInt64: (bytes: Int64, rate: Double?)] = [:]
        var measuredAt = ContinuousClock.now
    }

    private let state = Mutex(State())

    /// A ticket for a transfer that starts, with its share.
    func join(priority: DownloadPriority) -> Ticket {
        self.state.withLock { state in
            let ticket = Ticket(id: state.next, priority: priority)
            state.next += 1
            state.tickets[ticket.id] = ticket
            state.measured[ticket.id] = (0, nil)
            Self.share(&state)
            return ticket
        }
    }

    /// The transfer ended: its share goes to the others.
    func leave(_ ticket: Ticket) {
        self.state.withLock { state in
            guard state.tickets.removeValue(forKey: ticket.id) != nil else { return }
            state.measured[ticket.id] = nil
            Self.share(&state)
        }
    }

    /// The cap in force (nil: none); shares change only when it does.
    func setCap(_ cap: Int64?) {
        self.state.withLock { state in
            guard state.cap != cap else { return }
            state.cap = cap
            Self.share(&state)
        }
    }

    /// The cap in force.
    var cap: Int64? { self.state.withLock { $0.cap } }

    /// Measures each transfer's rate since the last measure (at most twice a second) and shares the cap again.
    func remeasure(now: ContinuousClock.Instant = .now) {
        self.state.withLock { state in
            let elapsed = Double((now - state.measuredAt) / .milliseconds(1)) / 1000
            guard elapsed >= 0.5 else { return }
            state.measuredAt = now
            for (id, ticket) in state.tickets {
                let bytes = ticket.received.load(ordering: .relaxed)
                let before = state.measured[id]?.bytes ?? 0
                state.measured[id] = (bytes, Double(bytes - before) / elapsed)
            }
            Self.share(&state)
        }
    }

    private static func share(_ state: inout State) {
        let tickets = state.tickets.values.sorted { $0.id < $1.id }
        guard let cap = state.cap, !tickets.isEmpty else {
            for ticket in tickets { Self.set(ticket, 0) }
            return
        }
        let candidates = tickets.map { ticket in
            MachinePolicy.Candidate(
                home: "", id: "\(ticket.id)", priority: ticket.priority, sequence: Int(ticket.id), contentLength: 0,
                bytesPerSecond: state.measured[ticket.id]?.rate, isRunning: true)
        }
        let rates = MachinePolicy.shares(of: max(cap, Int64(tickets.count)), among: candidates)
        for (ticket, rate) in zip(tickets, rates) { Self.set(ticket, rate) }
    }

    private static func set(_ ticket: Ticket, _ rate: Int64) {
        guard ticket.rate.load(ordering: .relaxed) != rate else { return }
        ticket.rate.store(rate, ordering: .relaxed)
        ticket.generation.add(1, ordering: .releasing)
    }
}
