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
        /// The pacing of the transfers that hold the ticket, one at a time (``pace(_:own:now:)``).
        private let pacing = Mutex(Pacing())

        /// Since when the body is paced at `rate`, and the bytes taken since.
        private struct Pacing {
            var start: Date?
            var rate: Int64 = 0
            var generation: UInt64 = 0
            var taken: Int64 = 0
        }

        init(id: UInt64, priority: DownloadPriority) {
            self.id = id
            self.priority = priority
        }

        /// How long to wait before taking `count` more body bytes, so that they arrive no faster than the ticket's
        /// share, or `own` (a transfer's own limit) when lower, but for a first burst of ``paceBurst(_:)``; nil to take
        /// them now (they are then counted).
        ///
        /// The pace holds across the transfers that share the ticket: a delta run's range requests, one after another,
        /// keep its share through the moments between them, and a request catches up on the gap before it. A change
        /// of the rate paces from then on.
        func pace(_ count: Int, own: Int64?, now: Date) -> TimeInterval? {
            let share = self.rate.load(ordering: .relaxed)
            guard let rate = share > 0 ? min(share, own ?? .max) : own else {
                self.received.add(Int64(count), ordering: .relaxed)
                return nil
            }
            let generation = self.generation.load(ordering: .acquiring)
            let wait = self.pacing.withLock { pacing -> TimeInterval? in
                if pacing.start == nil || pacing.generation != generation || pacing.rate != rate {
                    pacing = Pacing(start: now, rate: rate, generation: generation, taken: 0)
                }
                // Time left unused is credit of at most a quarter second's worth, or this read (a burst at least): a gap
                // between two requests is caught up on, a long one (an assembly, a retry's backoff) is not taken
                // unpaced after it, and a read larger than that credit (16 KiB at `--max-rate 4K`) still gets its turn.
                let credit = Double(max(Self.paceBurst(rate), rate / 4, Int64(count)))
                if let start = pacing.start {
                    pacing.start = max(start, now.addingTimeInterval(-(Double(pacing.taken) + credit) / Double(rate)))
                }
                let allowed = Double(rate) * now.timeIntervalSince(pacing.start ?? now) + Double(Self.paceBurst(rate))
                let wanted = Double(pacing.taken + Int64(count))
                // A millisecond's slack: the wait that was computed has passed when the bytes come again.
                if wanted > allowed + Double(rate) / 1000 { return (wanted - allowed) / Double(rate) }
                pacing.taken += Int64(count)
                return nil
            }
            if wait == nil { self.received.add(Int64(count), ordering: .relaxed) }
            return wait
        }

        /// The body bytes a rate-limited transfer takes at once before it is paced: an eighth of a second's worth, at
        /// most libcurl's buffer under a limit (16 KiB).
        static func paceBurst(_ rate: Int64) -> Int64 { min(16 << 10, max(1, rate / 8)) }
    }

    private struct State {
        var cap: Int64?
        var tickets: [UInt64: Ticket] = [:]
        var next: UInt64 = 0
        /// Each ticket's bytes at its last measure (or its start), when that was, and its rate measured then: nil
        /// while unknown, or while the transfer takes all its share (it could take more: its demand is unknown).
        var measured: [UInt64: (bytes: Int64, at: ContinuousClock.Instant, rate: Double?)] = [:]
        var measuredAt = ContinuousClock.now
    }

    private let state = Mutex(State())

    /// A ticket for a transfer that starts, with its share.
    func join(priority: DownloadPriority, now: ContinuousClock.Instant = .now) -> Ticket {
        self.state.withLock { state in
            let ticket = Ticket(id: state.next, priority: priority)
            state.next += 1
            state.tickets[ticket.id] = ticket
            state.measured[ticket.id] = (0, now, nil)
            Self.share(&state, now: now)
            return ticket
        }
    }

    /// The transfer ended: its share goes to the others.
    func leave(_ ticket: Ticket) {
        self.state.withLock { state in
            guard state.tickets.removeValue(forKey: ticket.id) != nil else { return }
            state.measured[ticket.id] = nil
            Self.share(&state, now: .now)
        }
    }

    /// The cap in force (nil: none); shares change only when it does.
    func setCap(_ cap: Int64?) {
        self.state.withLock { state in
            guard state.cap != cap else { return }
            state.cap = cap
            Self.share(&state, now: .now)
        }
    }

    /// The cap in force.
    var cap: Int64? { self.state.withLock { $0.cap } }

    /// The running transfers' tickets, oldest first.
    var tickets: [Ticket] { self.state.withLock { $0.tickets.values.sorted { $0.id < $1.id } } }

    /// Measures each transfer's rate since its last measure (at most twice a second) and shares the cap again.
    ///
    /// A transfer that took at least 90 % of its share is limited by the share, not by its server: what it could take
    /// is unknown, and it is shared as a newcomer is (a fair part, a user-initiated one at least half the cap). Only
    /// one that took less is given what it took and a quarter more, and the rest goes to the others. So a transfer
    /// started between two measures, or held low for a moment, is never kept low by its own measure.
    func remeasure(now: ContinuousClock.Instant = .now) {
        self.state.withLock { state in
            guard now - state.measuredAt >= .milliseconds(500) else { return }
            state.measuredAt = now
            for (id, ticket) in state.tickets {
                let bytes = ticket.received.load(ordering: .relaxed)
                let before = state.measured[id] ?? (0, now, nil)
                let seconds = Double((now - before.at) / .microseconds(1)) / 1e6
                guard seconds > 0.05 else { continue }
                let rate = Double(bytes - before.bytes) / seconds
                let share = ticket.rate.load(ordering: .relaxed)
                let limited = share > 0 && rate >= 0.9 * Double(share)
                state.measured[id] = (bytes, now, limited ? nil : rate)
            }
            Self.share(&state, now: now)
        }
    }

    /// Shares the cap again. A transfer whose share changes is measured from now on, against its new share.
    private static func share(_ state: inout State, now: ContinuousClock.Instant) {
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
        for (ticket, rate) in zip(tickets, rates) where ticket.rate.load(ordering: .relaxed) != rate {
            Self.set(ticket, rate)
            if let measured = state.measured[ticket.id] {
                state.measured[ticket.id] = (ticket.received.load(ordering: .relaxed), now, measured.rate)
            }
        }
    }

    private static func set(_ ticket: Ticket, _ rate: Int64) {
        guard ticket.rate.load(ordering: .relaxed) != rate else { return }
        ticket.rate.store(rate, ordering: .relaxed)
        ticket.generation.add(1, ordering: .releasing)
    }
}
