import CLinux
import Foundation
import Synchronization

// The driver's writes: state saved in one write per turn, and the transactions it records, finishes and controls.
// Everything here runs on `driver`, as in DownloadQueue+Driver.swift.
extension DownloadQueue {
    // MARK: Saving

    /// Saves state changes soon: changes that arrive before then are saved in the same write.
    func scheduleSave() {
        let schedule = self.driven { state -> Bool in
            defer { state.saveScheduled = true }
            return !state.saveScheduled
        }
        if schedule { self.driver.async { self.save(includingProgress: false) } }
    }

    /// Writes changed downloads in one transaction. A store that cannot be written ends those downloads
    /// as failed, naming why: nothing runs on without its state being kept.
    func save(includingProgress: Bool) {
        let changes = self.driven { state in
            state.saveScheduled = false
            return state.machine.takeChanges(includingProgress: includingProgress)
        }
        // A finished download's row was committed with its install.
        let records = changes.filter { $0.machine.state != .finished }.map { self.record($0.machine, position: $0.position) }
        let settled = changes.filter { $0.machine.state.isSettled }.map(\.machine.download.id)
        guard !records.isEmpty || !settled.isEmpty else { return }
        do {
            try self.store.save(records)
            try self.store.release(settled, owner: self.owner)
            // Saved as they are: those waiting far from the head keep their rows only (``QueueMachine/Entry``). The
            // machines of a catalog just recorded go back to the system, not kept in glibc's heaps (case 19d).
            if self.driven({ $0.machine.compact(records.map(\.id)) }) >= 1000 { _ = clinux_malloc_trim(0) }
        } catch {
            self.logger.error("could not save download state", metadata: ["error": "\(error)"])
            for record in records where !record.state.isSettled {
                self.change { $0.handle(record.id, .abort(error)) }
            }
        }
    }

    func record(_ machine: DownloadMachine, position: Int) -> DownloadRecord {
        var download = machine.download
        // A checkpoint records no more of the partial file than has been synced to disk.
        if !machine.verified, download.state != .finished { download.bytesReceived = min(download.bytesReceived, machine.durableBytes) }
        return DownloadRecord(
            download, position: position, validator: machine.validator,
            partialPath: download.state == .finished ? nil : self.home.archiveURL(for: download).path, stagingInode: machine.stagingInode,
            retriedFromZero: machine.retriedFromZero, verified: machine.verified)
    }

    // MARK: Transactions on the driver

    /// Records new transactions (one durable write) and takes their waiting downloads.
    /// - Parameters:
    ///   - joining: leave out a transaction an open one already delivers (see
    ///     ``Store/insert(_:owner:manifestURL:receipt:joining:adoptingRestores:partialPath:)``).
    ///   - adoptingRestores: join a restore nobody runs too (``withJoined(_:_:)`` takes it over).
    /// - Returns: the transactions left out, by id, with the id of the open one each joins.
    @discardableResult
    func record(
        _ transactions: [Transaction], manifestURL: URL? = nil, receipt: String? = nil, joining: Bool = false,
        adoptingRestores: Bool = false
    ) throws(PackDeliveryError) -> [String: String] {
        try self.onDriver { () throws(PackDeliveryError) in
            try self.requireOpen()
            let joined = try self.store.insert(
                transactions, owner: self.owner, manifestURL: manifestURL, receipt: receipt, joining: joining,
                adoptingRestores: adoptingRestores
            ) { self.home.archiveURL(for: $0).path }
            let transactions = transactions.filter { joined[$0.id] == nil }
            for transaction in transactions { self.emit(.transactionUpdated(transaction)) }
            self.change { machine in
                var actions: [QueueMachine.Action] = []
                machine.reserve(transactions.reduce(0) { $0 + $1.downloads.count })
                for transaction in transactions {
                    for (position, download) in transaction.downloads.enumerated() where download.state == .waiting {
                        actions += machine.own(self.machine(download), position: position, saved: true)
                    }
                }
                return actions
            }
            self.handOverToAgent()
            return joined
        }
    }

    /// Unfinished transactions from the store, with the downloads this queue runs as they are now.
    func liveTransactions(ids: [String]? = nil) throws(PackDeliveryError) -> [Transaction] {
        let transactions = try self.store.transactions(unfinishedOnly: ids == nil, ids: ids)
        return self.driven { state in
            transactions.map { transaction in
                var transaction = transaction
                transaction.downloads = transaction.downloads.map { state.machine.liveDownload($0.id) ?? $0 }
                return transaction
            }
        }
    }

    func finishOnDriver(_ transactionIDs: [String]) throws(PackDeliveryError) -> [Transaction] {
        guard !transactionIDs.isEmpty else { return [] }
        let transactions = try self.liveTransactions(ids: transactionIDs)
        let known = Set(transactions.map(\.id))
        if let missing = transactionIDs.first(where: { !known.contains($0) }) {
            throw PackDeliveryError(
                .unknownTransaction, message: "There is no transaction '\(PackDeliveryError.printable(missing))'.", subject: missing)
        }
        let open = transactions.filter { !$0.isFinished }
        for transaction in open {
            // Only essential packs hold a transaction open: prefetch and on-demand ones go on after it (``DeliveryPolicy``).
            let pending = transaction.downloads.filter { $0.delivery == .essential && !$0.state.isSettled }
            guard pending.isEmpty else {
                let list = pending.map { "\($0.id) (\($0.state.rawValue))" }.joined(separator: ", ")
                throw PackDeliveryError(
                    .finishRefused, message: "Transaction \(transaction.id) cannot finish: \(list) not finished or cancelled.",
                    hint: "Resume or cancel \(pending.count == 1 ? "it" : "them") first.", subject: transaction.id,
                    pendingDownloadIDs: pending.map(\.id))
            }
        }
        guard !open.isEmpty else { return [] }
        // Anything not yet saved goes first, so the finished record never points at stale downloads.
        self.save(includingProgress: true)
        let now = Date()
        try self.store.finish(open.map(\.id), at: now)
        self.driven { state in
            for transaction in open {
                // A prefetch pack still on its way keeps running (and is taken over at the next launch, see Store.claim).
                for download in transaction.downloads where download.delivery == .essential || download.state.isSettled {
                    state.machine.forget(download.id)
                }
            }
        }
        var finished: [Transaction] = []
        for var transaction in open {
            transaction.finishedAt = now
            self.emit(.transactionUpdated(transaction))
            finished.append(transaction)
        }
        self.emit(.transactionsRemoved(finished))
        return finished
    }

    /// Pause or cancel (`request`) downloads: those this queue runs at once; others are taken over when no
    /// live process runs them, or asked of the process that does (through the store).
    func control(_ ids: [String], request: ControlRequest) throws(PackDeliveryError) {
        try self.requireOpen()
        try self.onDriver { () throws(PackDeliveryError) in
            for id in ids {
                if self.driven({ $0.machine.machine(id) != nil }) {
                    self.change { $0.handle(id, request.event) }
                    continue
                }
                guard let record = try self.store.downloadRecord(id) else {
                    throw PackDeliveryError(
                        .unknownDownload, message: "There is no download '\(PackDeliveryError.printable(id))'.", subject: id)
                }
                if record.download.state.isSettled { continue }
                if try self.take([id]).isEmpty {
                    // Another process runs it: it acts on the request within a second.
                    try self.store.setRequest(request, for: id)
                    continue
                }
                self.change { $0.handle(id, request.event) }
            }
            self.save(includingProgress: false)
            if self.registry.withLock({ $0.closed }) {
                let ids = self.driven { Array($0.machine.entries.keys) }
                try self.store.release(ids, owner: self.owner)
            }
        }
    }

    func resumeOnDriver(_ ids: [String]?) throws(PackDeliveryError) -> [String] {
        if let ids {
            for id in ids where self.driven({ $0.machine.machine(id) == nil }) {
                guard let record = try self.store.downloadRecord(id) else {
                    throw PackDeliveryError(
                        .unknownDownload, message: "There is no download '\(PackDeliveryError.printable(id))'.", subject: id)
                }
                if !record.download.state.isSettled, try self.take([id]).isEmpty {
                    // Another process runs it: it resumes it within a second, as it pauses or cancels it.
                    try self.store.setRequest(.resume, for: id)
                }
            }
        } else {
            // Resuming everything never starts what was added with start: false: that waits for the user's yes.
            // Nor an on-demand pack: that waits for someone to ask for it.
            _ = try self.take(nil) { !Self.waitsToBeAsked($0.download) }
        }
        let targets =
            ids
            ?? self.driven { state in
                state.machine.entries.filter { !Self.waitsToBeAsked($0.value.state, $0.value.pauseReason) }.map(\.key)
            }
        var resumed: [String] = []
        for id in targets {
            self.change { $0.handle(id, .resume) }
            if let state = self.driven({ $0.machine.download(id)?.state }), state.isRunning { resumed.append(id) }
        }
        self.handOverToAgent()
        return resumed
    }

    /// Whether a resume of everything leaves this download alone: added with `start: false`, or an on-demand pack
    /// not asked for.
    static func waitsToBeAsked(_ download: Download) -> Bool { Self.waitsToBeAsked(download.state, download.pauseReason) }

    static func waitsToBeAsked(_ state: DownloadState, _ pauseReason: PauseReason?) -> Bool {
        state == .paused && (pauseReason == .notStarted || pauseReason == .onDemand)
    }

    /// A machine for a new download, with this queue's policies.
    func machine(_ download: Download) -> DownloadMachine { Self.machine(download, configuration: self.configuration) }

    static func machine(_ download: Download, configuration: Configuration) -> DownloadMachine {
        var machine = DownloadMachine(download: download, retryPolicy: configuration.retryPolicy)
        machine.credentialsRenewable = configuration.credentials != nil
        return machine
    }
}
