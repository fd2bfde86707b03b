import Foundation
import HeapModule

/// One policy for the whole machine, as a value type: which downloads of every home run now, which wait and why,
/// and the rate each running transfer may take. No I/O and no clock: the time of day, the quiet holds and the network
/// are inputs (``Conditions``), and the answer is data (``Plan``), decided again whenever an input changes and at
/// ``nextChange(after:)``.
///
/// - **Kinds.** A download's ``DownloadPriority`` is its kind: ``DownloadPriority/userInitiated`` and
///   ``DownloadPriority/essential`` run at any time; ``DownloadPriority/restore``, ``DownloadPriority/prefetch`` and
///   ``DownloadPriority/background`` wait for the ``window``. While quiet is held, prefetch and background wait and
///   the others share ``quietRate``.
/// - **Metered.** On a metered connection, packs larger than ``meteredLimit`` wait unless they are the user's explicit
///   action (user-initiated, or a purchase's essential pack) or were allowed: the rule of the in-process queue, checked
///   once for every home.
/// - **Admission.** One order across all homes: running downloads keep their slots (a running download is never
///   stopped for another), then by priority, then first come, first served (``Candidate/sequence``), up to
///   ``concurrency``. The first `concurrency` are found with a bounded heap that a download behind all of them does
///   not touch: O(n log concurrency) for n downloads at worst. The queues apply one rule beyond this order, which
///   ``decide(_:_:)`` does not model: when restore, prefetch or background work holds every slot, each such running
///   download lends its slot to one waiting user-initiated download (see ``DownloadPriority``).
/// - **Rates.** The cap (``maxRate``, or the lower ``quietRate`` while quiet) is shared so the rates sum to it:
///   user-initiated downloads together get at least half of it (all of it when nothing else runs), the others
///   split the rest. A download measured below its share (``Candidate/bytesPerSecond``; the rate board counts one
///   that took 90 % of its share as unknown) is given what it uses plus a quarter, and what it leaves goes to the
///   others; what is left after every demand is spread evenly.
public struct MachinePolicy: Sendable, Hashable {
    /// The machine's rate cap in bytes per second; nil for none.
    public var maxRate: Int64?
    /// When background work (restore, prefetch, background) may run; nil for at any time.
    public var window: BackgroundWindow?
    /// The rate cap while quiet is held, in bytes per second; nil to keep ``maxRate`` only.
    public var quietRate: Int64?
    /// How many downloads run at once, across every home.
    public var concurrency: Int
    /// On a metered connection, packs larger than this wait for an unmetered one (unless exempt).
    public var meteredLimit: Int64

    /// A policy from its parts.
    ///
    /// - Parameters:
    ///   - maxRate: the rate cap in bytes per second, nil for none (values below 1 count as 1).
    ///   - window: when background work may run, nil for at any time.
    ///   - quietRate: the cap while quiet is held, nil for none beyond `maxRate`.
    ///   - concurrency: downloads running at once across every home (at least 1).
    ///   - meteredLimit: the size above which packs wait for an unmetered connection (50 MiB by default).
    public init(
        maxRate: Int64? = nil, window: BackgroundWindow? = nil, quietRate: Int64? = nil, concurrency: Int = 4,
        meteredLimit: Int64 = 50 << 20
    ) {
        self.maxRate = maxRate.map { max(1, $0) }
        self.window = window
        self.quietRate = quietRate.map { max(1, $0) }
        self.concurrency = max(1, concurrency)
        self.meteredLimit = max(0, meteredLimit)
    }

    /// The policy of the machine's settings.
    ///
    /// - Parameters:
    ///   - settings: the rate cap, the window and the quiet rate (``MachineSettings``).
    ///   - concurrency: downloads running at once across every home.
    /// - Returns: the policy.
    public init(settings: MachineSettings, concurrency: Int = 4) {
        self.init(maxRate: settings.maxRate, window: settings.schedule, quietRate: settings.quietRate, concurrency: concurrency)
    }

    /// What changes over time and is not a download: the time of day, quiet, the network.
    public struct Conditions: Sendable, Hashable {
        /// Seconds since local midnight (``MachineClock/secondOfDay(_:timeZone:)``).
        public var secondOfDay: Int
        /// Whether anyone holds quiet (``QuietHolds/current(in:)`` is not empty).
        public var quietHeld: Bool
        /// Whether the connection is metered (``NetworkPolicy``).
        public var metered: Bool

        public init(secondOfDay: Int, quietHeld: Bool = false, metered: Bool = false) {
            self.secondOfDay = secondOfDay
            self.quietHeld = quietHeld
            self.metered = metered
        }

        /// The conditions with the quiet holds held now (``QuietHolds/current(in:)``): quiet while any is held.
        public init(secondOfDay: Int, holds: [QuietHolds.Hold], metered: Bool = false) {
            self.init(secondOfDay: secondOfDay, quietHeld: !holds.isEmpty, metered: metered)
        }
    }

    /// A download of some home that wants to run: waiting for a slot, or running now.
    public struct Candidate: Sendable, Hashable {
        /// The home it belongs to (its state folder, or any name the caller gives homes).
        public var home: String
        /// The download's id in its home.
        public var id: String
        /// Its kind and admission rank.
        public var priority: DownloadPriority
        /// The manifest's delivery policy (a purchase's essential pack is exempt from the metered rule).
        public var delivery: DeliveryPolicy
        /// Machine-wide order of arrival: lower came first.
        public var sequence: Int
        /// The pack's size in bytes.
        public var contentLength: Int64
        /// The rate measured now while it runs, in bytes per second; nil when unknown.
        public var bytesPerSecond: Double?
        /// Whether it runs now (it keeps its slot if it still may run).
        public var isRunning: Bool
        /// Allowed on a metered connection (``DownloadQueue/allowMetered(_:)``).
        public var allowedOnMetered: Bool

        public init(
            home: String, id: String, priority: DownloadPriority, delivery: DeliveryPolicy = .essential, sequence: Int,
            contentLength: Int64, bytesPerSecond: Double? = nil, isRunning: Bool = false, allowedOnMetered: Bool = false
        ) {
            self.home = home
            self.id = id
            self.priority = priority
            self.delivery = delivery
            self.sequence = sequence
            self.contentLength = contentLength
            self.bytesPerSecond = bytesPerSecond
            self.isRunning = isRunning
            self.allowedOnMetered = allowedOnMetered
        }
    }

    /// Why a download waits. The first that applies is given: quiet, then the window, then the network, then slots.
    ///
    /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
    public enum WaitReason: String, Sendable, Hashable, Codable, CaseIterable {
        /// `quiet`: quiet is held and it is prefetch or background work; `outsideWindow`: it is background work and the
        /// window is closed; `metered`: the connection is metered and the pack is above the limit; `queued`: it may run,
        /// and waits for a slot.
        case quiet, outsideWindow, metered, queued
    }

    /// What one download does now.
    public enum Decision: Sendable, Hashable {
        /// Runs, at most at this rate in bytes per second (nil: no cap; never 0).
        case run(bytesPerSecond: Int64?)
        /// Waits (a running one pauses, keeping its bytes).
        case wait(WaitReason)

        /// Whether it runs.
        public var runs: Bool {
            if case .run = self { return true }
            return false
        }
    }

    /// The decisions for a set of downloads, in the order they were given.
    public struct Plan: Sendable, Hashable {
        /// One decision per candidate, at the candidate's index.
        public var decisions: [Decision]
        /// The cap the rates share now (``MachinePolicy/quietRate`` while quiet), nil for none.
        public var cap: Int64?
        /// How many run.
        public var runningCount: Int
        /// The sum of the running downloads' rates; nil without a cap.
        public var totalRate: Int64? {
            guard self.cap != nil else { return nil }
            return self.decisions.reduce(0) { sum, decision in
                if case .run(let rate?) = decision { return sum + rate }
                return sum
            }
        }
    }

    /// Decides which downloads run and at what rate.
    ///
    /// - Parameters:
    ///   - candidates: the downloads of every home that are waiting for a slot or running (not paused, not settled).
    ///   - conditions: the time of day, quiet and the network now.
    /// - Returns: one decision per candidate, in their order.
    public func decide(_ candidates: [Candidate], _ conditions: Conditions) -> Plan {
        let cap = self.cap(conditions)
        // With a cap, each running download needs at least 1 byte per second.
        let slots = cap.map { Int(clamping: min(Int64(self.concurrency), $0)) } ?? self.concurrency
        var decisions = [Decision](repeating: .wait(.queued), count: candidates.count)
        var best = Heap<Admission>()
        for index in candidates.indices {
            let candidate = candidates[index]
            if let reason = self.blocked(candidate, conditions) {
                decisions[index] = .wait(reason)
                continue
            }
            let admission = Admission(candidate, index: index)
            // Behind every one of a full set: it waits, and the heap is not touched (the common case).
            if best.count == slots, let last = best.max, !(admission < last) { continue }
            best.insert(admission)
            if best.count > slots { _ = best.removeMax() }
        }
        let admitted = best.unordered.map(\.index)
        let rates = cap.map { Self.shares(of: $0, among: admitted.map { candidates[$0] }) }
        for (position, index) in admitted.enumerated() { decisions[index] = .run(bytesPerSecond: rates?[position]) }
        return Plan(decisions: decisions, cap: cap, runningCount: admitted.count)
    }

    /// When to decide again because of the clock: the next time the window opens or closes.
    ///
    /// - Parameter secondOfDay: seconds since local midnight now.
    /// - Returns: seconds until then (1…86,400), or nil without a window (only other inputs change the plan).
    public func nextChange(after secondOfDay: Int) -> Int? {
        self.window?.secondsToNextEdge(after: secondOfDay)
    }

    /// The cap the running downloads share now.
    func cap(_ conditions: Conditions) -> Int64? {
        guard conditions.quietHeld, let quietRate = self.quietRate else { return self.maxRate }
        return min(quietRate, self.maxRate ?? .max)
    }

    /// What ``blocked(_:_:)`` reads of the conditions: under conditions with the same verdicts, it holds the same
    /// downloads (the time of day changes each second; whether it is inside the window, seldom).
    struct Verdicts: Hashable {
        var quiet: Bool
        var outsideWindow: Bool
        var metered: Bool
    }

    func verdicts(_ conditions: Conditions) -> Verdicts {
        Verdicts(
            quiet: conditions.quietHeld,
            outsideWindow: self.window.map { !$0.contains(second: conditions.secondOfDay) } ?? false,
            metered: conditions.metered)
    }

    /// Why a download may not run now, or nil when it may.
    func blocked(_ candidate: Candidate, _ conditions: Conditions) -> WaitReason? {
        let background = candidate.priority >= .restore
        if conditions.quietHeld, candidate.priority >= .prefetch { return .quiet }
        if background, let window = self.window, !window.contains(second: conditions.secondOfDay) { return .outsideWindow }
        if conditions.metered, candidate.contentLength > self.meteredLimit, !candidate.allowedOnMetered {
            let explicit =
                candidate.priority == .userInitiated || (candidate.priority == .essential && candidate.delivery == .essential)
            if !explicit { return .metered }
        }
        return nil
    }

    /// A candidate's place in the admission order: running ones first, then by priority, then first come.
    private struct Admission: Comparable {
        var running: Int
        var rank: Int
        var sequence: Int
        var index: Int

        init(_ candidate: Candidate, index: Int) {
            self.running = candidate.isRunning ? 0 : 1
            self.rank = candidate.priority.rank
            self.sequence = candidate.sequence
            self.index = index
        }

        static func < (a: Self, b: Self) -> Bool {
            (a.running, a.rank, a.sequence, a.index) < (b.running, b.rank, b.sequence, b.index)
        }
    }
}
