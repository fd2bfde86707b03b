import Foundation
import HeapModule
import Synchronization

/// The queue's decisions, as a value type: which download runs next, whether it fits on the disk,
/// when a download paused for space may go on, which changes to save and report. No I/O but the driver's ``loader``.
///
/// It holds an ``Entry`` per unsettled download this queue owns (its ``DownloadMachine``, or, for one that waits or is
/// held and whose saved row holds all of it, a compact form), the waiting ones in a heap (the next to start in
/// O(log n), whatever the queue's length), and the set of those holding a slot, so no decision scans the whole queue.
/// The driver (``DownloadQueue``) feeds it events and runs the actions it returns, in order.
struct QueueMachine: Sendable {
    enum Action: Sendable, Hashable {
        /// Run a download's own action.
        case run(id: String, DownloadMachine.Action)
        /// Gather the facts of a download about to start (``DeliveryFacts``) and measure the free space where it goes,
        /// then call ``admit(_:facts:available:path:now:)``.
        case measureSpace(id: String, destination: Destination)
        /// Report the download as it is now.
        case notify(id: String)
        /// A download settled: report its transaction, which may now be finishable.
        case settled(transactionID: String)
        /// State changed: save the changed downloads soon (``takeChanges(includingProgress:)``).
        case save
        /// A download that waits (or is paused) was given another priority: report it (``DownloadQueueEvent/priorityChanged(_:)``).
        case priorityChanged(id: String)
    }

    /// What happens to one download.
    enum Event: Sendable {
        case transferProgress(token: Int, bytes: Int64, validator: String?)
        case transferDurable(token: Int, bytes: Int64)
        case transferFinished(token: Int, outcome: TransferOutcome)
        /// A delta update planned what it fetches and reuses.
        case deltaPlanned(token: Int, delta: Download.Delta)
        /// The running transfer is much slower than this source measured: move it there from the kept bytes.
        case moveSource(token: Int, URL, because: PackDeliveryError)
        case retryDue(token: Int)
        /// The manifest was read again: the pack's URL in it, or why not.
        case manifestReloaded(token: Int, result: Result<URL, PackDeliveryError>)
        /// The unpack that follows the transfer has written this many bytes.
        case streamProgress(token: Int, bytes: Int64)
        case installProgress(token: Int, phase: DownloadPhase, fraction: Double)
        /// The installer put the content in place: the machine orders the commit (``DownloadMachine/Action/commitInstall(token:pack:finished:)``).
        case installed(token: Int, pack: InstalledPack)
        /// The install failed, or its commit returned.
        case installFinished(token: Int, result: Result<URL, PackDeliveryError>)
        case pause(PauseReason, PackDeliveryError?)
        case resume
        /// Start sooner or later than others while it waits (``DownloadPriority``).
        case setPriority(DownloadPriority)
        /// May download on a metered connection (``DownloadQueue/allowMetered(_:)``): resumed if it waits for an
        /// unmetered one.
        case allowMetered
        case cancel
        /// End it as failed: the store could not record its state, or another failure from outside.
        case abort(PackDeliveryError)
    }

    enum Change: Int, Sendable, Comparable {
        case none, progress, state
        static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    }

    /// A waiting download's place: by priority, then first added, first started.
    private struct Waiting: Comparable, Sendable {
        var rank: Int
        var sequence: Int
        var id: String
        static func < (a: Self, b: Self) -> Bool { (a.rank, a.sequence) < (b.rank, b.sequence) }
    }

    private(set) var entries: [String: Entry] = [:]
    /// Reads a download's machine back from the store: its row, made a machine with the queue's policies, or nil when it
    /// cannot be read. With a loader, a download that waits (or is held) far from the head and whose row holds all of it
    /// is kept compact (``Entry``); without one (the machine's own tests), every machine is kept.
    var loader: (@Sendable (String) -> DownloadMachine?)?
    /// Unsaved changes, by download: state changes are saved at once, progress at most once a second.
    private var changed: [String: Change] = [:]
    private var waiting = Heap<Waiting>()
    /// Downloads holding a slot: active, or being admitted.
    private(set) var running: Set<String> = []
    /// Running downloads that hold a slot lent by restore, prefetch or background work: user-initiated downloads
    /// admitted beside that work when every slot was taken (``lends``). Each takes a slot of its own as one frees.
    private var beside: Set<String> = []
    /// The slots the machine's admission order lends this queue (``AdmissionBoard``); nil when the queue decides
    /// alone, and its own restore, prefetch and background work lends.
    private(set) var lent: Int?
    private var pausedForSpace: Set<String> = []
    /// Downloads paused by the machine's policy (``PauseReason/isPolicyHold``: the network, the window, quiet).
    private var pausedByPolicy: Set<String> = []
    /// A download came into this queue paused by the policy (adopted from an earlier process): the next tick checks
    /// whether the policy still holds it. Otherwise holds are checked when the policy's verdicts change, not at each tick.
    private var holdsUnchecked = false
    /// Downloads allowed on a metered connection (``Event/allowMetered``).
    private var allowedOnMetered: Set<String> = []
    /// The machine's policy (``MachinePolicy``: the window for background work, quiet, the metered limit) and what it is
    /// decided from now (``conditionsChanged(_:policy:)``).
    private(set) var policy: MachinePolicy
    private(set) var conditions = MachinePolicy.Conditions(secondOfDay: 0)
    /// Whether the connection is metered now (``networkChanged(metered:)``).
    var metered: Bool { self.conditions.metered }
    let concurrency: Int
    /// Headroom kept free beyond what a pack needs.
    let spaceMargin: Int64
    private(set) var closed = false
    /// This queue hands its waiting downloads to the machine's agent instead of admitting them (``AgentUse``): set
    /// while the agent serves the home, cleared for good when it goes away.
    private(set) var handingOver = false
    /// How many may run at once now: ``concurrency``, or fewer when the queue shares the machine's slots with others
    /// (``AdmissionBoard``).
    private(set) var slots: Int
    /// The order of arrival of every download this process's queues took: first come, first served, across queues.
    private static let arrivals = Atomic<Int>(0)

    init(concurrency: Int, spaceMargin: Int64 = SpaceCheck.margin, meteredLimit: Int64 = QueueMachine.defaultMeteredLimit) {
        self.concurrency = max(1, concurrency)
        self.slots = max(1, concurrency)
        self.spaceMargin = spaceMargin
        self.policy = MachinePolicy(concurrency: concurrency, meteredLimit: meteredLimit)
    }

    /// 50 MiB.
    static let defaultMeteredLimit: Int64 = 50 << 20

    /// Makes room for `count` more downloads at once: a catalog of 10,000 grows the table once, instead of
    /// doubling it step by step with the old and the new table alive together at each step.
    mutating func reserve(_ count: Int) {
        self.entries.reserveCapacity(self.entries.count + count)
        self.changed.reserveCapacity(self.changed.count + count)
    }

    // MARK: Events

    /// Takes downloads this queue now owns (added, adopted at launch, taken over for a request).
    /// - Parameter saved: the download's row already holds this state (just added), so there is nothing to save.
    mutating func own(_ machine: DownloadMachine, position: Int, saved: Bool = false) -> [Action] {
        let id = machine.download.id
        guard self.entries[id] == nil, !machine.state.isSettled else { return [] }
        self.entries[id] = Entry(machine: machine, position: position, sequence: Self.arrivals.add(1, ordering: .relaxed).newValue)
        // Taking a download over is not a change to report: only what it does next is.
        var actions: [Action] = []
        if !saved {
            self.changed[id] = .state
            actions.append(.save)
        }
        self.track(id, before: machine.download, into: &actions, acted: false)
        self.schedule(into: &actions)
        // Its row holds it as it is (nothing to save): kept compact unless it is about to be admitted.
        if saved { self.compact([id]) }
        return actions
    }

    /// Applies an event to one owned download; events for other downloads change nothing.
    mutating func handle(_ id: String, _ event: Event, now: Date = Date(), jitter: Double = Double.random(in: 0...1)) -> [Action] {
        if case .allowMetered = event, self.entries[id] != nil { self.allowedOnMetered.insert(id) }
        return self.update(id) { machine in
            switch event {
            case .transferProgress(let token, let bytes, let validator):
                _ = machine.progress(token: token, bytesOnDisk: bytes, validator: validator, now: now)
                return []
            case .transferDurable(let token, let bytes):
                machine.durable(token: token, bytes: bytes)
                return []
            case .transferFinished(let token, let outcome):
                return machine.transferFinished(token: token, outcome: outcome, jitter: jitter, now: now)
            case .deltaPlanned(let token, let delta):
                return machine.deltaPlanned(token: token, delta: delta, now: now)
            case .moveSource(let token, let source, let error):
                return machine.moveSource(token: token, to: source, because: error)
            case .retryDue(let token):
                return machine.retryDue(token: token, now: now)
            case .manifestReloaded(let token, let result):
                return machine.manifestReloaded(token: token, result: result, jitter: jitter, now: now)
            case .streamProgress(let token, let bytes):
                machine.streamProgress(token: token, bytes: bytes, now: now)
                return []
            case .installProgress(let token, let phase, let fraction):
                _ = machine.installProgress(token: token, phase: phase, fraction: fraction, now: now)
                return []
            case .installed(let token, let pack):
                return machine.installed(token: token, pack: pack, now: now)
            case .installFinished(let token, let result):
                return machine.installFinished(token: token, result: result, now: now)
            case .pause(let reason, let error):
                return machine.pause(reason, error: error)
            case .resume:
                return machine.resume()
            case .setPriority(let priority):
                return machine.setPriority(priority)
            case .allowMetered:
                return machine.networkReturned()
            case .cancel:
                return machine.cancel()
            case .abort(let error):
                return machine.abort(error)
            }
        }
    }

    /// The facts gathered and the free space measured for a download about to start: it starts when the rest of its
    /// pack and its unpacked content fit with the margin (a first install that writes each byte once keeps no archive:
    /// its unpacked content and the margin), and otherwise pauses for space saying how much is needed.
    mutating func admit(_ id: String, facts: DeliveryFacts = .none, available: Int64?, path: String, now: Date = Date()) -> [Action] {
        guard self.running.contains(id), let download = self.download(id), download.state == .waiting else {
            // A download already started (an admission asked twice) keeps the slot it holds.
            if self.entries[id]?.state != .active { self.release(id) }
            var actions: [Action] = []
            self.schedule(into: &actions)
            return actions
        }
        if let reason = self.heldBy(download) {
            return self.update(id) { $0.pause(reason) }
        }
        let needed = self.spaceNeeded(id, facts: facts) ?? 0
        if let available, needed > available {
            return self.update(id) {
                $0.pause(.insufficientStorage, error: .insufficientStorage(path: path, needed: needed, available: available))
            }
        }
        return self.update(id) { $0.start(facts: facts, now: now) }
    }

    /// Twice a second: the watchdog over active downloads; with `available` (every few seconds, when
    /// the queue resumes on its own), downloads paused for space that now fit wait for a slot again.
    mutating func tick(now: Date, available: [Destination: Int64?]? = nil) -> [Action] {
        var actions: [Action] = []
        for id in self.running where self.entries[id]?.state == .active {
            actions += self.update(id) { $0.tick(now: now) }
        }
        // Adopted from an earlier process while held by the policy, which may hold it no more.
        if self.holdsUnchecked {
            self.holdsUnchecked = false
            actions += self.releaseHolds()
        }
        if let available {
            for id in self.pausedForSpace {
                guard let machine = self.machine(id), let free = available[machine.download.destination] else { continue }
                let needed = self.spaceNeeded(id, facts: machine.facts) ?? 0
                if free.map({ needed <= $0 }) ?? true {
                    actions += self.update(id) { $0.spaceReturned() }
                }
            }
        }
        return actions
    }

    /// The connection became metered, or not (``NetworkPolicy``): one of the policy's conditions
    /// (``conditionsChanged(_:policy:)``).
    mutating func networkChanged(metered: Bool) -> [Action] {
        var conditions = self.conditions
        conditions.metered = metered
        return self.conditionsChanged(conditions)
    }

    /// The machine's policy or its conditions changed (the time of day, quiet, the network, the settings): downloads
    /// transferring a pack that the policy holds now pause (``PauseReason/waitingForUnmeteredNetwork``,
    /// ``PauseReason/outsideWindow``, ``PauseReason/quiet``; bytes kept), and waiting ones are held at admission; those
    /// it held and holds no more wait for a slot again.
    mutating func conditionsChanged(_ conditions: MachinePolicy.Conditions, policy: MachinePolicy? = nil) -> [Action] {
        let before = (self.policy.verdicts(self.conditions), self.policy)
        self.conditions = conditions
        if let policy { self.policy = policy }
        // The time of day moves each second; what it decides, seldom: 100,000 held downloads are looked at again only
        // then, not at each tick.
        guard before != (self.policy.verdicts(self.conditions), self.policy) else { return [] }
        var actions: [Action] = []
        let held = self.running.compactMap { id -> (String, PauseReason)? in
            guard let download = self.download(id), download.state == .active, download.phase == .downloading,
                let reason = self.heldBy(download)
            else { return nil }
            return (id, reason)
        }
        for (id, reason) in held.sorted(by: { $0.0 < $1.0 }) { actions += self.update(id) { $0.pause(reason) } }
        return actions + self.releaseHolds()
    }

    /// Downloads the policy held and holds no more (or holds for another reason) wait for a slot again: admission checks
    /// the policy once more.
    private mutating func releaseHolds() -> [Action] {
        var actions: [Action] = []
        for id in self.pausedByPolicy.sorted() {
            guard let entry = self.entries[id], let reason = entry.pauseReason, self.heldBy(id, entry) != reason else { continue }
            actions += self.update(id) { $0.released(from: reason) }
        }
        return actions
    }

    /// Why the machine's policy holds a download now (``MachinePolicy``, decided with this queue's conditions), or nil.
    /// Quiet holds prefetch and background work; the window holds restore, prefetch and background work; on a metered
    /// connection a pack larger than the limit waits unless it is the user's explicit action: a download the user asked
    /// for now (``DownloadPriority/userInitiated``), the essential packs of a purchase (priority and delivery essential,
    /// as ``DownloadQueue/add(products:from:kind:destination:autoFinish:force:start:receipt:)`` records them), or one
    /// allowed (``Event/allowMetered``).
    func heldBy(_ download: Download) -> PauseReason? {
        self.heldBy(download.id, priority: download.priority, delivery: download.delivery, contentLength: download.contentLength)
    }

    /// ``heldBy(_:)`` for an entry, compact or not.
    private func heldBy(_ id: String, _ entry: Entry) -> PauseReason? {
        if let compact = entry.compact {
            return self.heldBy(id, priority: compact.priority, delivery: compact.delivery, contentLength: compact.contentLength)
        }
        return entry.loaded.flatMap { self.heldBy($0.download) }
    }

    private func heldBy(_ id: String, priority: DownloadPriority, delivery: DeliveryPolicy, contentLength: Int64) -> PauseReason? {
        let candidate = MachinePolicy.Candidate(
            home: "", id: id, priority: priority, delivery: delivery, sequence: 0, contentLength: contentLength,
            allowedOnMetered: self.allowedOnMetered.contains(id))
        switch self.policy.blocked(candidate, self.conditions) {
        case .metered?: return .waitingForUnmeteredNetwork
        case .outsideWindow?: return .outsideWindow
        case .quiet?: return .quiet
        case .queued?, nil: return nil
        }
    }

    /// Pauses every running download (a shutdown, Ctrl-C) and, with `closing`, starts nothing more.
    mutating func pauseAll(_ reason: PauseReason, closing: Bool) -> [Action] {
        if closing { self.closed = true }
        var actions: [Action] = []
        let ids = self.entries.filter { $0.value.state.isRunning }.sorted { $0.value.sequence < $1.value.sequence }.map(\.key)
        for id in ids { actions += self.update(id) { $0.pause(reason) } }
        return actions
    }

    /// The changes to save; settled downloads leave the machine once taken.
    /// - Parameter includingProgress: also progress-only changes (at most once a second).
    mutating func takeChanges(includingProgress: Bool) -> [(machine: DownloadMachine, position: Int)] {
        let threshold: Change = includingProgress ? .progress : .state
        var taken: [(machine: DownloadMachine, position: Int)] = []
        for (id, change) in self.changed where change >= threshold {
            self.changed[id] = nil
            // A change is made to a loaded machine (``update(_:scheduling:_:)``), and kept loaded until saved.
            guard let entry = self.entries[id], let machine = entry.loaded else { continue }
            taken.append((machine, entry.position))
            if machine.state.isSettled && !machine.installOutstanding { self.forget(id) }
        }
        return taken
    }

    /// Keeps compact those of `ids` whose rows are saved as they are now (``Entry/compactIfPlain()``), unless they hold a
    /// slot: the driver calls it once their rows are written. Returns how many became compact.
    @discardableResult
    mutating func compact(_ ids: [String]) -> Int {
        guard self.loader != nil else { return 0 }
        let loaded = ids.filter { self.changed[$0] == nil && !self.running.contains($0) && self.entries[$0]?.loaded != nil }
        return loaded.count { self.entries[$0]?.compactIfPlain() == true }
    }

    /// Stops tracking downloads (their transaction finished, or another queue took them).
    mutating func forget(_ id: String) {
        self.entries[id] = nil
        self.changed[id] = nil
        self.release(id)
        self.pausedForSpace.remove(id)
        self.pausedByPolicy.remove(id)
        self.allowedOnMetered.remove(id)
        if self.entries.isEmpty {
            // A dictionary keeps its capacity when emptied: after a catalog of 10,000, that is ≈ 10 MB held for nothing.
            self.entries = [:]
            self.changed = [:]
        }
    }

    /// The slots the machine's admission order gives this queue now, and lends it (``AdmissionBoard``); what runs
    /// beyond them goes on.
    mutating func setSlots(_ slots: Int, lent: Int) -> [Action] {
        self.slots = max(0, slots)
        self.lent = max(0, lent)
        var actions: [Action] = []
        self.schedule(into: &actions)
        return actions
    }

    /// What this queue runs and its best `limit` waiting downloads, best first, for the machine's admission order.
    ///
    /// The heads are taken from the top of the waiting order and put back (dropping the places that went stale, as
    /// admission does): O(limit · log n), not a scan of every download. It runs at each change of a queue on the
    /// board, so a scan made a catalog of 10,000 downloads through the agent quadratic (3.6 × the in-process time).
    mutating func demand(limit: Int) -> AdmissionBoard.Demand {
        let (running, beside, lending) = (self.running.count - self.beside.count, self.beside.count, self.lending)
        var taken: [Waiting] = []
        while taken.count < limit, self.peekWaiting() != nil, let next = self.waiting.popMin() { taken.append(next) }
        for item in taken { self.waiting.insert(item) }
        let heads = taken.map { AdmissionBoard.Head(rank: $0.rank, sequence: $0.sequence) }
        return AdmissionBoard.Demand(running: running, beside: beside, lending: lending, heads: heads)
    }

    /// Changes whenever ``demand(limit:)`` may have: what runs, and the places taken in the waiting order.
    var demandFingerprint: [Int] { [self.running.count, self.beside.count, self.lending, self.waiting.count, self.entries.count] }

    /// How many running downloads lend their slot to a user-initiated one: those at restore, prefetch or background
    /// priority that hold a slot of their own.
    var lending: Int {
        self.running.count { id in
            !self.beside.contains(id) && (self.entries[id]?.priority ?? .userInitiated) > .essential
        }
    }

    /// From now on, waiting downloads stay waiting here for ``handOver()``, none admitted.
    mutating func startHandingOver() { self.handingOver = true }

    /// The agent went away: waiting downloads are admitted here again.
    mutating func stopHandingOver() -> [Action] {
        self.handingOver = false
        var actions: [Action] = []
        self.schedule(into: &actions)
        return actions
    }

    /// While handing over: the downloads waiting here (never admitted), forgotten, for the agent to take.
    /// - Returns: each one's id and transaction id.
    mutating func handOver() -> [(id: String, transactionID: String)] {
        guard self.handingOver else { return [] }
        let handed = self.entries.filter { $0.value.state == .waiting && !self.running.contains($0.key) }
            .compactMap { item in self.download(item.key).map { (id: item.key, transactionID: $0.transactionID) } }
        for item in handed { self.forget(item.id) }
        return handed
    }

    /// What the derived sets say that the stages do not: ``running``, the downloads paused for space and those
    /// paused for the network are kept beside the machines (so no decision scans the queue), and must always be
    /// what the machines' stages make them. Empty when they agree; `QueueMachineTests` checks it after every event
    /// of seeded random sequences.
    func disagreements() -> [String] {
        var found: [String] = []
        func paused(_ reason: PauseReason) -> Set<String> {
            Set(self.entries.filter { $0.value.state == .paused && $0.value.pauseReason == reason }.keys)
        }
        if self.pausedForSpace != paused(.insufficientStorage) { found.append("pausedForSpace \(self.pausedForSpace.sorted())") }
        let held = paused(.waitingForUnmeteredNetwork).union(paused(.outsideWindow)).union(paused(.quiet))
        if self.pausedByPolicy != held { found.append("pausedByPolicy \(self.pausedByPolicy.sorted())") }
        let active = Set(self.entries.filter { $0.value.state == .active }.keys)
        if !active.isSubset(of: self.running) { found.append("active but holding no slot: \(active.subtracting(self.running).sorted())") }
        let holding = self.running.filter { self.entries[$0].map { $0.state == .active || $0.state == .waiting } != true }
        if !holding.isEmpty { found.append("holding a slot, neither active nor waiting: \(holding.sorted())") }
        if !self.beside.isSubset(of: self.running) { found.append("beside but not running: \(self.beside.subtracting(self.running))") }
        if self.running.count - self.beside.count > self.concurrency {
            found.append("\(self.running.count - self.beside.count) slots of \(self.concurrency)")
        }
        if self.beside.count > self.concurrency { found.append("\(self.beside.count) lent slots of \(self.concurrency)") }
        let placed = self.running.filter { self.entries[$0]?.inHeap == true }
        if !placed.isEmpty { found.append("holding a slot and placed in the waiting order: \(placed.sorted())") }
        let compactRunning = self.running.filter { self.entries[$0]?.compact != nil }
        if !compactRunning.isEmpty { found.append("holding a slot and compact: \(compactRunning.sorted())") }
        return found
    }

    /// The download as it is now; a compact one's is read from the store (and not kept).
    func download(_ id: String) -> Download? { self.machine(id)?.download }

    /// The download as it is now when its row in the store may say otherwise; nil for a compact one (its row holds all
    /// of it) and for one this queue does not own.
    func liveDownload(_ id: String) -> Download? { self.entries[id]?.loaded?.download }

    /// The download's machine; a compact one's is read from the store (and not kept).
    func machine(_ id: String) -> DownloadMachine? {
        guard let entry = self.entries[id] else { return nil }
        if let machine = entry.loaded { return machine }
        return self.restore(id, entry)
    }

    private func restore(_ id: String, _ entry: Entry) -> DownloadMachine? {
        guard let compact = entry.compact, let machine = self.loader?(id) else { return nil }
        return machine.restored(token: compact.token)
    }

    /// Keeps an entry's machine loaded, read back from the store if it was compact; one whose row cannot be read is
    /// forgotten (its store is gone: nothing can run it).
    /// - Returns: whether the entry is there, loaded.
    private mutating func load(_ id: String) -> Bool {
        guard let entry = self.entries[id] else { return false }
        if entry.loaded != nil { return true }
        guard let machine = self.restore(id, entry) else {
            self.forget(id)
            return false
        }
        self.entries[id]?.load(machine)
        return true
    }

    // MARK: Bookkeeping

    /// - Parameter scheduling: give free slots to waiting downloads afterwards (not when ``schedule(into:)`` itself
    ///   changes a download it passes over).
    private mutating func update(
        _ id: String, scheduling: Bool = true, _ change: (inout DownloadMachine) -> [DownloadMachine.Action]
    ) -> [Action] {
        guard self.load(id), let (before, held) = self.entries[id]?.loaded.map({ ($0.download, !$0.reportable) }) else { return [] }
        // Changed in its place in the table: a copy of the entry would copy its machine's box (``Entry``).
        let downloadActions = self.entries[id]?.withMachine(change) ?? []
        var actions = downloadActions.map { Action.run(id: id, $0) }
        self.track(id, before: before, held: held, into: &actions, acted: !downloadActions.isEmpty)
        if scheduling { self.schedule(into: &actions) }
        return actions
    }

    /// Derived sets, change flags and reports after a download changed.
    ///
    /// A change is reported once the download is ``DownloadMachine/reportable``: a pause waits for the bytes its
    /// stopped transfer kept, and is reported (and saved at once) when they arrive, changed or not.
    /// - Parameter held: the download was not reportable before the change.
    private mutating func track(_ id: String, before: Download?, held: Bool = false, into actions: inout [Action], acted: Bool = true) {
        guard var entry = self.entries[id], let machine = entry.loaded else { return }
        let after = machine.download
        let released = held && machine.reportable
        let stateChanged =
            before == nil || before?.state != after.state || before?.phase != after.phase
            || before?.pauseReason != after.pauseReason || before?.error != after.error || before?.retryDate != after.retryDate
            || before?.priority != after.priority
        if stateChanged || acted || released {
            self.changed[id] = .state
            actions.append(.save)
        } else if before != after {
            self.changed[id] = max(self.changed[id] ?? .none, .progress)
        }
        if (before != after || released) && machine.reportable { actions.append(.notify(id: id)) }
        if let before, before.priority != after.priority, after.state == .waiting || after.state == .paused {
            actions.append(.priorityChanged(id: id))
        }
        // A slot is held while active, and while waiting to be admitted.
        if after.state != .active, after.state != .waiting { self.release(id) }
        if after.state == .waiting, !self.running.contains(id), !entry.inHeap || entry.heapRank != after.priority.rank {
            // Placed by its priority; a new priority gives it a new place, and the old one is passed over. One being
            // admitted holds its slot already, and has no place.
            entry.inHeap = true
            entry.heapRank = after.priority.rank
            self.waiting.insert(Waiting(rank: entry.heapRank, sequence: entry.sequence, id: id))
        }
        if after.state == .paused, after.pauseReason == .insufficientStorage {
            self.pausedForSpace.insert(id)
        } else {
            self.pausedForSpace.remove(id)
        }
        if after.state == .paused, after.pauseReason?.isPolicyHold == true {
            if self.pausedByPolicy.insert(id).inserted, before == nil { self.holdsUnchecked = true }
        } else {
            self.pausedByPolicy.remove(id)
        }
        if after.state.isSettled, before?.state.isSettled != true { actions.append(.settled(transactionID: after.transactionID)) }
        self.entries[id] = entry
    }

    /// Gives free slots to the next waiting downloads, in order: each is admitted once its space is measured.
    ///
    /// When every slot is taken, a user-initiated download is admitted beside the restore, prefetch or background work
    /// that runs: each such download lends its slot to one (``lent``, or ``lending`` when the queue decides alone), so
    /// that what the user waits for now never waits for work that nobody waits for. Nothing running is stopped, and
    /// the download that runs beside takes a slot of its own as one frees.
    private mutating func schedule(into actions: inout [Action]) {
        let limit = min(self.concurrency, self.slots)
        while self.running.count - self.beside.count < limit, let id = self.beside.first { self.beside.remove(id) }
        while !self.closed, !self.handingOver, let next = self.peekWaiting(), let entry = self.entries[next.id] {
            if let reason = self.heldBy(next.id, entry) {
                // Held by the policy (outside the window, quiet, a metered network): paused here as it reaches the head,
                // slot or not, with no space measured, and the next one is looked at. A machine's whole background queue
                // outside its window costs no round trip to the driver for each download, and is paused as it is added
                // (its machine still loaded), not read back from the store to be paused once a slot frees.
                _ = self.waiting.popMin()
                self.entries[next.id]?.inHeap = false
                actions += self.update(next.id, scheduling: false) { $0.pause(reason) }
                continue
            }
            let besides: Bool
            if self.running.count - self.beside.count < limit {
                besides = false
            } else if next.rank == DownloadPriority.userInitiated.rank, self.beside.count < self.lent ?? self.lending {
                besides = true
            } else {
                break
            }
            _ = self.waiting.popMin()
            self.entries[next.id]?.inHeap = false
            // Near the head now: its machine is read back, to be admitted.
            guard self.load(next.id), let destination = self.entries[next.id]?.loaded?.download.destination else { continue }
            self.running.insert(next.id)
            if besides { self.beside.insert(next.id) }
            actions.append(.measureSpace(id: next.id, destination: destination))
        }
    }

    /// A download gives up its slot.
    private mutating func release(_ id: String) {
        self.running.remove(id)
        self.beside.remove(id)
    }

    /// The next waiting download in order, left in place; stale places on top are dropped, and so is the place of a
    /// download that holds a slot already (being admitted when a new priority placed it again).
    private mutating func peekWaiting() -> Waiting? {
        while let next = self.waiting.min {
            if let entry = self.entries[next.id], entry.inHeap, entry.sequence == next.sequence, entry.heapRank == next.rank {
                if entry.state == .waiting, !self.running.contains(next.id) { return next }
                self.entries[next.id]?.inHeap = false
            }
            _ = self.waiting.popMin()
        }
        return nil
    }
}
