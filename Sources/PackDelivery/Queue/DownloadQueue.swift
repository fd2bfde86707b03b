import Foundation
import GRDB
import Logging
import Synchronization

/// Receives every transaction and download change of a ``DownloadQueue``, in order, on one serial queue.
///
/// Register it as soon as the host launches: unfinished transactions from earlier runs are delivered
/// to it right away, like StoreKit's transaction observer.
public protocol DownloadQueueObserver: AnyObject, Sendable {
    /// Transactions were added, delivered again at launch, finished, or one of their downloads settled.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting; calling it from here is allowed.
    ///   - transactions: the transactions as they are now, with their downloads.
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction])

    /// Downloads changed state, phase or progress (progress at most about ten times a second).
    ///
    /// - Parameters:
    ///   - queue: the queue reporting; calling it from here is allowed.
    ///   - downloads: the downloads as they are now.
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download])
}

/// The download half of `SKPaymentQueue`: takes purchased or restored transactions with their
/// downloads, runs them, reports every change, and lets a transaction finish only once its content is in place.
///
/// State lives in SQLite under the ``Home``, so a new queue on the same home picks up where an
/// earlier process stopped. Safe to use from any thread or task.
public final class DownloadQueue: Sendable {
    /// How the queue runs.
    public struct Configuration: Sendable {
        /// Downloads transferring or unpacking at once; the rest wait in order.
        public var concurrency: Int
        /// Rate limit, timeouts, extra headers and TLS verification for every transfer.
        public var transfer: TransferOptions
        /// Whether downloads that were running when an earlier process died start again on their own when the queue opens.
        public var resumeInterruptedDownloads: Bool
        /// Whether downloads paused for lack of space resume on their own once enough is free (checked every few seconds).
        public var resumeWhenSpaceReturns: Bool
        /// Largest unpacked size, as a multiple of the pack's size, when the manifest gives no `unpackedLength`.
        public var maxExpansionRatio: Int64
        /// Largest number of entries in one pack.
        public var maxEntries: Int
        /// Failed attempts in a row (without any byte arriving) before a download fails.
        public var maxAttempts: Int
        /// Largest delay between retries, in seconds.
        public var maxRetryDelay: TimeInterval
        /// Writes every byte of downloads and unpacked content (replace it to inject disk-full faults in tests).
        public var writer: any FileWriting

        /// A configuration; every parameter has the default a long-running host wants.
        public init(concurrency: Int = 4, transfer: TransferOptions = TransferOptions(), resumeInterruptedDownloads: Bool = true,
                    resumeWhenSpaceReturns: Bool = true, maxExpansionRatio: Int64 = 100, maxEntries: Int = 100_000,
                    maxAttempts: Int = 6, maxRetryDelay: TimeInterval = 30, writer: any FileWriting = SystemFileWriter()) {
            self.concurrency = max(1, concurrency)
            self.transfer = transfer
            self.resumeInterruptedDownloads = resumeInterruptedDownloads
            self.resumeWhenSpaceReturns = resumeWhenSpaceReturns
            self.maxExpansionRatio = maxExpansionRatio
            self.maxEntries = maxEntries
            self.maxAttempts = maxAttempts
            self.maxRetryDelay = maxRetryDelay
            self.writer = writer
        }
    }

    /// Where this queue keeps its state and content.
    public let home: Home
    /// How this queue runs.
    public let configuration: Configuration
    let store: Store
    private let logger: Logger
    private let installer: Installer
    /// Every state change runs here, one at a time and in order; the Mutex only guards reads from other threads.
    private let driver = DispatchQueue(label: "PackDelivery.DownloadQueue")
    /// Observers are called here, in order, so a slow observer never holds up the downloads.
    private let delivery = DispatchQueue(label: "PackDelivery.DownloadQueue.delivery")
    private let state = Mutex(QueueState())
    private let engineBox = Mutex<TransferEngine?>(nil)
    private let timer: Mutex<DispatchSourceTimer?>

    private struct Owned {
        var machine: DownloadMachine
        var lock: Int32
        var cancelFlag: CancelFlag?
        var lastPersist = Date.distantPast
        var lastNotified: Download?
        var position: Int
    }

    private struct QueueState {
        var owned: [String: Owned] = [:]
        var order: [String] = []
        var observers: [ObjectIdentifier: WeakObserver] = [:]
        var continuations: [UUID: AsyncStream<DownloadQueueEvent>.Continuation] = [:]
        var closed = false
        var ticks = 0
    }

    private struct WeakObserver {
        weak var observer: (any DownloadQueueObserver)?
    }

    /// Opens (or creates) the queue's state under `home` and takes over downloads no live process runs.
    ///
    /// - Parameters:
    ///   - home: where state, partial downloads and installed content live.
    ///   - configuration: concurrency, transfer options, limits and resume behaviour.
    ///   - logger: where to log; without one the library logs nothing.
    /// - Throws: ``PackDeliveryError`` when the home folder or the state database cannot be used.
    public init(home: Home, configuration: Configuration = Configuration(), logger: Logger? = nil) throws(PackDeliveryError) {
        self.home = home
        self.configuration = configuration
        self.logger = logger ?? Logger(label: "PackDelivery", factory: { _ in SwiftLogNoOpLogHandler() })
        try home.prepare()
        self.store = try Store(url: home.databaseURL)
        self.installer = Installer(home: home, store: self.store,
                                   limits: .init(maxExpansionRatio: configuration.maxExpansionRatio, maxEntries: configuration.maxEntries),
                                   writer: configuration.writer)
        self.timer = Mutex(DispatchSource.makeTimerSource(queue: self.driver))
        let engine = TransferEngine(logger: self.logger) { [weak self] event in
            guard let self else { return }
            self.driver.async { self.handle(event) }
        }
        self.engineBox.withLock { $0 = engine }
        self.timer.withLock { timer in
            timer?.setEventHandler { [weak self] in self?.tick() }
            timer?.schedule(deadline: .now() + 0.5, repeating: 0.5)
            timer?.resume()
        }
        try self.onDriver { () throws(PackDeliveryError) in try self.takeOverOrphans() }
        self.cleanLeftoverStaging()
    }

    deinit {
        self.timer.withLock { $0?.cancel() }
        self.engineBox.withLock { $0 }?.shutdown()
        let continuations = self.state.withLock { state in
            for owned in state.owned.values { DownloadLock.unlock(owned.lock) }
            return state.continuations.values
        }
        for continuation in continuations { continuation.finish() }
    }

    // MARK: Observing

    /// Adds an observer (held weakly) and delivers the unfinished transactions to it at once.
    ///
    /// - Parameter observer: keep a strong reference to it for as long as it should be called.
    public func add(_ observer: any DownloadQueueObserver) {
        self.state.withLock { $0.observers[ObjectIdentifier(observer)] = WeakObserver(observer: observer) }
        let transactions = (try? self.transactions()) ?? []
        self.delivery.async { if !transactions.isEmpty { observer.downloadQueue(self, updatedTransactions: transactions) } }
    }

    /// Stops calling an observer.
    ///
    /// - Parameter observer: an observer added with ``add(_:)``.
    public func remove(_ observer: any DownloadQueueObserver) {
        self.state.withLock { _ = $0.observers.removeValue(forKey: ObjectIdentifier(observer)) }
    }

    /// Every change from now on, in order, starting with the unfinished transactions as they are now.
    ///
    /// Subscribe before adding a transaction to see all of its changes. The stream ends when the queue closes.
    /// - Returns: a stream of events; each call returns a stream of its own.
    public func events() -> AsyncStream<DownloadQueueEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: DownloadQueueEvent.self, bufferingPolicy: .unbounded)
        let id = UUID()
        self.driver.sync {
            for transaction in (try? self.transactions()) ?? [] { continuation.yield(.transactionUpdated(transaction)) }
            self.state.withLock { $0.continuations[id] = continuation }
        }
        continuation.onTermination = { [weak self] _ in self?.state.withLock { _ = $0.continuations.removeValue(forKey: id) } }
        return stream
    }

    // MARK: Transactions

    /// Records a transaction for a product of the manifest, with one download per pack, and starts them.
    ///
    /// Packs whose `contentVersion` is already installed are finished at once without downloading, unless `force`.
    ///
    /// - Parameters:
    ///   - productIdentifier: a product the manifest lists.
    ///   - manifest: the loaded manifest, for the packs and their URLs.
    ///   - kind: a purchase or a restore.
    ///   - destination: install into caches (may be purged) or documents (kept).
    ///   - autoFinish: recorded for hosts (such as the `packs` CLI) that finish transactions themselves.
    ///   - force: download again even when the same version is installed.
    /// - Returns: the recorded transaction with its downloads.
    /// - Throws: `badData` for a product the manifest does not list; `io` when the store cannot be written.
    @discardableResult
    public func add(product productIdentifier: String, from manifest: LoadedManifest, kind: TransactionKind = .purchased,
                    destination: Destination = .caches, autoFinish: Bool = false, force: Bool = false) throws(PackDeliveryError) -> Transaction {
        guard let product = manifest.manifest.product(productIdentifier) else {
            let known = manifest.manifest.products.map(\.productIdentifier).joined(separator: ", ")
            throw PackDeliveryError(.unknownProduct, message: "The manifest at \(manifest.baseURL.redacted) has no product '\(PackDeliveryError.printable(productIdentifier))'.",
                                    hint: known.isEmpty ? "The manifest lists no products." : "It lists: \(PackDeliveryError.printable(known)).", subject: productIdentifier)
        }
        let transactionID = Self.newID("t")
        let installed = Dictionary((try self.store.installed(productIdentifier: productIdentifier)).map { ($0.contentIdentifier, $0) }, uniquingKeysWith: { a, _ in a })
        var downloads: [Download] = []
        for content in product.contents {
            let url = try manifest.packURL(for: content)
            var download = Download(id: Self.newID("d"), transactionID: transactionID, productIdentifier: productIdentifier,
                                    contentIdentifier: content.contentIdentifier, contentVersion: content.contentVersion,
                                    contentLength: content.contentLength, state: .waiting, phase: nil, progress: 0, timeRemaining: -1,
                                    pauseReason: nil, contentURL: nil, error: nil, url: url, sha256: content.sha256.lowercased(),
                                    unpackedLength: content.unpackedLength, destination: destination, bytesReceived: 0)
            if !force, let existing = installed[content.contentIdentifier], existing.contentVersion == content.contentVersion,
               FileManager.default.fileExists(atPath: existing.contentURL) {
                download.state = .finished
                download.progress = 1
                download.timeRemaining = 0
                download.bytesReceived = content.contentLength
                download.contentURL = URL(filePath: existing.contentURL)
                download.destination = existing.destination
            }
            downloads.append(download)
        }
        let transaction = Transaction(id: transactionID, productIdentifier: productIdentifier, kind: kind, createdAt: Date(),
                                      finishedAt: nil, autoFinish: autoFinish, downloads: downloads)
        try self.onDriver { () throws(PackDeliveryError) in
            // Take the locks before the rows exist, so no other process ever sees them unowned.
            var locks: [String: Int32] = [:]
            for download in downloads where download.state == .waiting {
                guard let fd = try DownloadLock.tryLock(self.lockURL(download.id)) else { continue }
                locks[download.id] = fd
            }
            do throws(PackDeliveryError) {
                try self.store.write { db in
                    try TransactionRecord(id: transaction.id, productIdentifier: productIdentifier, kind: kind,
                                          createdAt: transaction.createdAt, finishedAt: nil, autoFinish: autoFinish).insert(db)
                    for (position, download) in downloads.enumerated() {
                        try DownloadRecord(download, position: position, validator: nil,
                                           partialPath: self.home.archiveURL(for: download).path, stagingInode: nil,
                                           retriedFromZero: false, verified: false).insert(db)
                    }
                }
            } catch {
                locks.values.forEach(DownloadLock.unlock)
                throw error
            }
            self.emit(.transactionUpdated(transaction))
            self.state.withLock { state in
                for (position, download) in downloads.enumerated() {
                    guard let fd = locks[download.id] else { continue }
                    state.owned[download.id] = Owned(machine: self.machine(for: download), lock: fd, position: position)
                    state.order.append(download.id)
                }
            }
            self.schedule()
        }
        return transaction
    }

    /// The unfinished transactions, with their downloads as they are now.
    ///
    /// - Returns: unfinished transactions, oldest first.
    /// - Throws: `io` when the store cannot be read.
    public func transactions() throws(PackDeliveryError) -> [Transaction] {
        let live = self.state.withLock { $0.owned.mapValues(\.machine.download) }
        return try self.store.transactions().map { transaction in
            var transaction = transaction
            transaction.downloads = transaction.downloads.map { live[$0.id] ?? $0 }
            return transaction
        }
    }

    /// Finishes a transaction whose downloads are all finished or cancelled.
    ///
    /// Its installed content stays, findable with ``contentURL(forProductID:)``.
    /// - Parameter transactionID: the transaction to finish; finishing a finished one does nothing.
    /// - Throws: `usage` naming the downloads still pending (id and state), or for an unknown id; nothing changes then.
    public func finish(_ transactionID: String) throws(PackDeliveryError) {
        try self.onDriver { () throws(PackDeliveryError) in
            let transactions = try self.store.transactions(unfinishedOnly: false, ids: [transactionID])
            guard var transaction = transactions.first else {
                throw PackDeliveryError(.unknownTransaction, message: "There is no transaction '\(PackDeliveryError.printable(transactionID))'.", subject: transactionID)
            }
            if transaction.isFinished { return }
            let live = self.state.withLock { $0.owned.mapValues(\.machine.download) }
            transaction.downloads = transaction.downloads.map { live[$0.id] ?? $0 }
            let pending = transaction.downloads.filter { !$0.state.isSettled }
            guard pending.isEmpty else {
                let list = pending.map { "\($0.id) (\($0.state.rawValue))" }.joined(separator: ", ")
                throw PackDeliveryError(.finishRefused, message: "Transaction \(transactionID) cannot finish: \(list) not finished or cancelled.",
                                        hint: "Resume or cancel \(pending.count == 1 ? "it" : "them") first.", subject: transactionID,
                                        pendingDownloadIDs: pending.map(\.id))
            }
            let now = Date()
            try self.store.write { db in
                try db.execute(sql: "UPDATE transactions SET finishedAt = ? WHERE id = ? AND finishedAt IS NULL", arguments: [now, transactionID])
            }
            transaction.finishedAt = now
            self.state.withLock { state in
                for download in transaction.downloads {
                    if let owned = state.owned.removeValue(forKey: download.id) { DownloadLock.unlock(owned.lock) }
                    state.order.removeAll { $0 == download.id }
                }
            }
            for download in transaction.downloads { try? FileManager.default.removeItem(at: self.lockURL(download.id)) }
            self.emit(.transactionUpdated(transaction))
        }
    }

    // MARK: Controlling downloads

    /// Pauses downloads, keeping their partial data. Works on downloads another process runs (through the store).
    ///
    /// - Parameter ids: download ids; finished or cancelled ones are left alone.
    /// - Throws: `usage` for an unknown id.
    public func pause(_ ids: [String]) throws(PackDeliveryError) {
        try self.control(ids, request: "pause") { machine in machine.pause(.user) }
    }

    /// Cancels downloads: stops them and deletes their partial data and staging.
    ///
    /// - Parameter ids: download ids; finished ones and a move into place in progress are left alone.
    /// - Throws: `usage` for an unknown id.
    public func cancel(_ ids: [String]) throws(PackDeliveryError) {
        try self.control(ids, request: "cancel") { machine in machine.cancel() }
    }

    /// Resumes paused or failed downloads (all of them when `ids` is nil); they continue from the bytes on disk.
    ///
    /// - Parameter ids: download ids, or nil for every paused, failed or orphaned download of an open transaction.
    /// - Returns: the ids of the downloads this queue now runs (not those another process runs).
    /// - Throws: `usage` for an unknown id.
    @discardableResult
    public func resume(_ ids: [String]? = nil) throws(PackDeliveryError) -> [String] {
        let targets: [String]
        if let ids {
            targets = ids
        } else {
            targets = try self.transactions().flatMap(\.downloads).filter { $0.state == .paused || $0.state == .failed || $0.state.isRunning }.map(\.id)
        }
        var resumed: [String] = []
        try self.control(targets, request: nil) { machine in
            _ = machine.resume()
            return []
        } after: { id, machine in
            if machine.state.isRunning { resumed.append(id) }
        }
        return resumed
    }

    /// Pauses every running download of this queue (Ctrl-C, shutdown).
    ///
    /// - Parameter reason: `user` for a person's request, `interrupted` for a shutdown (resumed on the next launch).
    public func pauseAll(reason: PauseReason = .user) {
        self.driver.sync {
            let ids = self.state.withLock { state in state.order.filter { state.owned[$0]?.machine.state.isRunning == true } }
            for id in ids { self.apply(id) { $0.pause(reason) } }
        }
    }

    /// Installed content, by product.
    ///
    /// - Parameter productIdentifier: a product, or nil for everything installed.
    /// - Returns: one entry per installed pack; empty when nothing is installed.
    /// - Throws: `io` when the store cannot be read.
    public func installedContent(forProductID productIdentifier: String? = nil) throws(PackDeliveryError) -> [InstalledContent] {
        try self.store.installed(productIdentifier: productIdentifier).map(\.content)
    }

    /// The folder holding a product's installed content, or nil. Unlike StoreKit's, it outlives the transaction.
    ///
    /// - Parameter productIdentifier: the product.
    /// - Returns: the folder of its first pack (see ``installedContent(forProductID:)`` for products with several).
    public func contentURL(forProductID productIdentifier: String) -> URL? {
        (try? self.installedContent(forProductID: productIdentifier))?.first?.contentURL
    }

    /// Deletes a product's installed content and its record.
    ///
    /// - Parameter productIdentifier: the product.
    /// - Returns: how many packs were removed.
    /// - Throws: `io` when the store cannot be written.
    @discardableResult
    public func deleteContent(forProductID productIdentifier: String) throws(PackDeliveryError) -> Int {
        let records = try self.store.installed(productIdentifier: productIdentifier)
        for record in records {
            // Move aside first so the folder disappears in one step, then delete.
            let aside = self.home.root(for: record.destination).appending(path: ".packdelivery/staging/removed-\(UUID().uuidString)")
            if rename(record.contentURL, aside.path) == 0 { try? Installer.removeTree(aside) } else { try? Installer.removeTree(URL(filePath: record.contentURL)) }
            try self.store.write { db in _ = try InstalledContentRecord.deleteOne(db, key: record.contentIdentifier) }
        }
        return records.count
    }

    /// Pauses running downloads (reason `interrupted`), saves their state and stops the transfer thread.
    public func close() {
        let first = self.state.withLock { state in defer { state.closed = true }; return !state.closed }
        guard first else { return }
        self.pauseAll(reason: .interrupted)
        self.timer.withLock { $0?.cancel() }
        self.engineBox.withLock { $0 }?.shutdown()
        self.driver.sync {}
        self.delivery.sync {}
        // Finished outside the lock: a stream's onTermination takes it too.
        let continuations = self.state.withLock { $0.continuations.values }
        for continuation in continuations { continuation.finish() }
    }

    // MARK: Driver (runs on `driver`)

    private func control(_ ids: [String], request: String?, _ change: @escaping (inout DownloadMachine) -> [DownloadMachine.Action],
                         after: ((String, DownloadMachine) -> Void)? = nil) throws(PackDeliveryError) {
        try self.onDriver { () throws(PackDeliveryError) in
            for id in ids {
                if self.state.withLock({ $0.owned[id] != nil }) {
                    self.apply(id, change)
                } else {
                    guard let record = try self.store.downloadRecord(id) else {
                        throw PackDeliveryError(.unknownDownload, message: "There is no download '\(PackDeliveryError.printable(id))'.", subject: id)
                    }
                    if record.download.state.isSettled { continue }
                    guard let fd = try DownloadLock.tryLock(self.lockURL(id)) else {
                        // Another process runs it: leave the request in the store; it acts within a second.
                        if let request { try self.store.setRequest(request, for: id) }
                        continue
                    }
                    // No event for the intermediate state: the change below reports the result.
                    try self.adopt(record, lock: fd, notify: false)
                    self.apply(id, change)
                }
                if let after, let machine = self.state.withLock({ $0.owned[id]?.machine }) { after(id, machine) }
            }
            self.schedule()
        }
    }

    private func adopt(_ record: DownloadRecord, lock: Int32, notify: Bool = true) throws(PackDeliveryError) {
        // Re-read under the lock: the process that held it may have just finished the download.
        guard let fresh = try self.store.downloadRecord(record.id) else { DownloadLock.unlock(lock); return }
        var download = fresh.download
        if download.state.isRunning {
            if fresh.phase == .installing || fresh.stagingInode != nil {
                if let url = try self.installer.recover(download, stagingInode: fresh.stagingInode) {
                    download.state = .finished
                    download.contentURL = url
                    download.progress = 1
                }
            } else {
                try? Installer.removeTree(self.home.stagingURL(for: download))
            }
            if download.state != .finished {
                download.state = .paused
                download.pauseReason = .interrupted
            }
            download.phase = nil
        }
        download.bytesReceived = Self.fileSize(self.home.archiveURL(for: download)) ?? (fresh.verified ? download.bytesReceived : 0)
        if download.state != .finished { download.progress = download.contentLength > 0 ? min(1, Double(download.bytesReceived) / Double(download.contentLength)) : 0 }
        let machine = DownloadMachine(download: download, validator: fresh.validator, retriedFromZero: fresh.retriedFromZero,
                                      verified: fresh.verified, stagingInode: fresh.stagingInode,
                                      retryPolicy: .init(maxAttempts: self.configuration.maxAttempts, maxDelay: self.configuration.maxRetryDelay))
        self.state.withLock { state in
            state.owned[record.id] = Owned(machine: machine, lock: lock, position: fresh.position)
            if !state.order.contains(record.id) { state.order.append(record.id) }
        }
        self.persist(record.id, force: true)
        if notify { self.notifyIfChanged(record.id) } else { self.state.withLock { $0.owned[record.id]?.lastNotified = machine.download } }
    }

    /// On open: downloads left running by a dead process, or paused by a shutdown (`interrupted`), are taken over
    /// and resumed when configured; otherwise they are marked `paused (interrupted)`.
    private func takeOverOrphans() throws(PackDeliveryError) {
        let resumeInterrupted = self.configuration.resumeInterruptedDownloads
        for transaction in try self.store.transactions() {
            for download in transaction.downloads
            where download.state.isRunning || download.phase != nil || (resumeInterrupted && download.pauseReason == .interrupted) {
                guard let fd = try DownloadLock.tryLock(self.lockURL(download.id)) else { continue }
                guard let record = try self.store.downloadRecord(download.id) else { DownloadLock.unlock(fd); continue }
                try self.adopt(record, lock: fd)
                let resume = self.configuration.resumeInterruptedDownloads
                self.state.withLock { state in
                    if resume, state.owned[download.id]?.machine.download.pauseReason == .interrupted {
                        _ = state.owned[download.id]?.machine.resume()
                    }
                }
                if !resume, let owned = self.state.withLock({ $0.owned.removeValue(forKey: download.id) }) {
                    self.persist(owned.machine, position: owned.position)
                    DownloadLock.unlock(owned.lock)
                    self.state.withLock { $0.order.removeAll { $0 == download.id } }
                }
            }
        }
        self.schedule()
    }

    /// Removes staging folders that no running download of any process owns.
    private func cleanLeftoverStaging() {
        for destination in Destination.allCases {
            let folder = self.home.workFolder(for: destination).appending(path: "staging")
            for name in (try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? [] {
                let id = name.hasPrefix("removed-") ? nil : name
                if let id {
                    if self.state.withLock({ $0.owned[id] != nil }) || DownloadLock.isHeldElsewhere(self.lockURL(id)) { continue }
                    if let record = try? self.store.downloadRecord(id), record.stagingInode != nil { continue }
                }
                try? Installer.removeTree(folder.appending(path: name))
            }
        }
    }

    /// Applies an event to an owned download's machine and runs the actions.
    private func apply(_ id: String, _ change: (inout DownloadMachine) -> [DownloadMachine.Action]) {
        guard let (actions, before) = self.state.withLock({ state -> ([DownloadMachine.Action], DownloadState)? in
            guard var owned = state.owned[id] else { return nil }
            let before = owned.machine.state
            let actions = change(&owned.machine)
            state.owned[id] = owned
            return (actions, before)
        }) else { return }
        self.run(actions, for: id)
        let (after, transactionID) = self.state.withLock { ($0.owned[id]?.machine.state, $0.owned[id]?.machine.download.transactionID) }
        self.persist(id, force: after != before || !actions.isEmpty)
        self.notifyIfChanged(id)
        if before != after {
            // A download that settles may make its transaction finishable: say so where finishing is decided.
            if let after, after.isSettled, let transactionID { self.emitTransaction(transactionID) }
            self.schedule()
        }
    }

    /// Reports a transaction as it is now (store and live downloads).
    private func emitTransaction(_ id: String) {
        guard var transaction = try? self.store.transactions(unfinishedOnly: false, ids: [id]).first else { return }
        let live = self.state.withLock { $0.owned.mapValues(\.machine.download) }
        transaction.downloads = transaction.downloads.map { live[$0.id] ?? $0 }
        self.emit(.transactionUpdated(transaction))
    }

    private func run(_ actions: [DownloadMachine.Action], for id: String) {
        guard let owned = self.state.withLock({ $0.owned[id] }) else { return }
        let download = owned.machine.download
        for action in actions {
            switch action {
            case .startTransfer(let token, let fromZero):
                if fromZero { try? FileManager.default.removeItem(at: self.home.archiveURL(for: download)) }
                let request = TransferRequest(id: "\(id)#\(token)", url: download.url, file: self.home.archiveURL(for: download),
                                              expectedLength: download.contentLength, validator: owned.machine.validator,
                                              fromZero: fromZero, options: self.configuration.transfer, writer: self.configuration.writer)
                self.engineBox.withLock { $0 }?.start(request)
            case .stopTransfer(let token):
                self.engineBox.withLock { $0 }?.stop("\(id)#\(token)")
            case .scheduleRetry(let token, let delay):
                self.logger.info("retrying", metadata: ["download": "\(id)", "after": "\(delay)", "error": "\(download.error?.message ?? "")"])
                self.driver.asyncAfter(deadline: .now() + delay) { [weak self] in
                    self?.apply(id) { $0.retryDue(token: token) }
                }
            case .install(let token):
                let flag = CancelFlag()
                self.state.withLock { $0.owned[id]?.cancelFlag = flag }
                let installer = self.installer
                DispatchQueue.global().async { [weak self] in
                    let progress: (DownloadPhase, Double) -> Void = { phase, fraction in
                        guard let self else { return }
                        self.driver.async { self.installProgressed(id, token: token, phase: phase, fraction: fraction) }
                    }
                    let result: Result<URL, PackDeliveryError>
                    do throws(PackDeliveryError) {
                        result = .success(try installer.install(download, progress: progress, cancel: flag))
                    } catch { result = .failure(error) }
                    guard let self else { return }
                    self.driver.async { self.apply(id) { $0.installFinished(token: token, result: result) } }
                }
            case .stopInstall:
                owned.cancelFlag?.cancel()
            case .deleteFiles:
                try? FileManager.default.removeItem(at: self.home.archiveURL(for: download))
                if !(owned.machine.download.phase == .unpacking || owned.cancelFlag != nil) {
                    try? Installer.removeTree(self.home.stagingURL(for: download))
                }
            }
        }
    }

    private func installProgressed(_ id: String, token: Int, phase: DownloadPhase, fraction: Double) {
        let changed = self.state.withLock { state in
            state.owned[id]?.machine.installProgress(token: token, phase: phase, fraction: fraction) ?? false
        }
        if changed { self.notifyIfChanged(id) }
    }

    private func handle(_ event: TransferEvent) {
        switch event {
        case .progress(let transferID, let bytes, let validator):
            let (id, token) = Self.split(transferID)
            let changed = self.state.withLock { state in
                state.owned[id]?.machine.progress(token: token, bytesOnDisk: bytes, validator: validator) ?? false
            }
            if changed {
                self.persist(id, force: false)
                self.notifyIfChanged(id)
            }
        case .finished(let transferID, let outcome):
            let (id, token) = Self.split(transferID)
            self.apply(id) { $0.transferFinished(token: token, outcome: outcome) }
        }
    }

    /// Starts waiting downloads, in order, while fewer than `concurrency` are active.
    private func schedule() {
        var started: [String] = []
        while true {
            let next: (String, Download)? = self.state.withLock { state in
                guard !state.closed else { return nil }
                let active = state.owned.values.filter { $0.machine.state == .active }.count
                guard active < self.configuration.concurrency,
                      let id = state.order.first(where: { state.owned[$0]?.machine.state == .waiting && !started.contains($0) }),
                      let download = state.owned[id]?.machine.download else { return nil }
                return (id, download)
            }
            guard let (id, download) = next else { break }
            started.append(id)
            let remaining = max(0, download.contentLength - (Self.fileSize(self.home.archiveURL(for: download)) ?? 0))
            do {
                try SpaceCheck.require(download: remaining, unpacked: download.unpackedLength ?? download.contentLength,
                                       at: self.home.workFolder(for: download.destination))
                self.apply(id) { $0.start() }
            } catch {
                self.apply(id) { $0.pause(.insufficientStorage, error: error) }
            }
        }
    }

    /// Twice a second: pause/cancel requests from other processes; every few seconds, space for paused downloads.
    private func tick() {
        let (ids, checkSpace) = self.state.withLock { state -> ([String], Bool) in
            state.ticks += 1
            return (Array(state.owned.keys), state.ticks % 10 == 0)
        }
        guard !ids.isEmpty else { return }
        if let requests = try? self.store.requests(for: ids) {
            for (id, request) in requests {
                try? self.store.setRequest(nil, for: id)
                switch request {
                case "pause": self.apply(id) { $0.pause(.user) }
                case "cancel": self.apply(id) { $0.cancel() }
                default: break
                }
            }
        }
        if checkSpace, self.configuration.resumeWhenSpaceReturns {
            for id in ids {
                guard let download = self.state.withLock({ $0.owned[id]?.machine.download }),
                      download.state == .paused, download.pauseReason == .insufficientStorage else { continue }
                let remaining = max(0, download.contentLength - (Self.fileSize(self.home.archiveURL(for: download)) ?? 0))
                if (try? SpaceCheck.require(download: remaining, unpacked: download.unpackedLength ?? download.contentLength,
                                            at: self.home.workFolder(for: download.destination))) != nil {
                    self.apply(id) { _ = $0.resume(); return [] }
                }
            }
            self.schedule()
        }
    }

    // MARK: Persistence and delivery

    private func persist(_ id: String, force: Bool) {
        guard let owned = self.state.withLock({ $0.owned[id] }) else { return }
        let now = Date()
        guard force || now.timeIntervalSince(owned.lastPersist) >= 1 else { return }
        self.state.withLock { $0.owned[id]?.lastPersist = now }
        self.persist(owned.machine, position: owned.position)
    }

    private func persist(_ machine: DownloadMachine, position: Int) {
        let download = machine.download
        let record = DownloadRecord(download, position: position, validator: machine.validator,
                                    partialPath: self.home.archiveURL(for: download).path, stagingInode: machine.stagingInode,
                                    retriedFromZero: machine.retriedFromZero, verified: machine.verified)
        do {
            try self.store.write { db in
                // The installer records a finished download itself, in the same write as the installed content.
                if download.state == .finished { return }
                try record.update(db, columns: DownloadRecord.ownColumns)
            }
        } catch {
            self.logger.error("could not save download state", metadata: ["download": "\(download.id)", "error": "\(error)"])
        }
    }

    private func notifyIfChanged(_ id: String) {
        guard let download = self.state.withLock({ state -> Download? in
            guard let owned = state.owned[id] else { return nil }
            if owned.lastNotified == owned.machine.download { return nil }
            state.owned[id]?.lastNotified = owned.machine.download
            return owned.machine.download
        }) else { return }
        self.emit(.downloadUpdated(download))
    }

    /// Delivers one event to every stream and observer, in order.
    private func emit(_ event: DownloadQueueEvent) {
        let (continuations, observers) = self.state.withLock { state in
            (Array(state.continuations.values), state.observers.values.compactMap(\.observer))
        }
        for continuation in continuations { continuation.yield(event) }
        guard !observers.isEmpty else { return }
        self.delivery.async {
            for observer in observers {
                switch event {
                case .transactionUpdated(let transaction): observer.downloadQueue(self, updatedTransactions: [transaction])
                case .downloadUpdated(let download): observer.downloadQueue(self, updatedDownloads: [download])
                }
            }
        }
    }

    // MARK: Helpers

    /// Runs `body` on the driver queue and waits, keeping the typed error.
    private func onDriver<T>(_ body: () throws(PackDeliveryError) -> T) throws(PackDeliveryError) -> T {
        let result: Result<T, PackDeliveryError> = self.driver.sync {
            do throws(PackDeliveryError) { return .success(try body()) } catch { return .failure(error) }
        }
        return try result.get()
    }

    private func machine(for download: Download) -> DownloadMachine {
        DownloadMachine(download: download, retryPolicy: .init(maxAttempts: self.configuration.maxAttempts, maxDelay: self.configuration.maxRetryDelay))
    }

    func lockURL(_ id: String) -> URL { self.home.locksFolder.appending(path: "\(id).lock") }

    private static func split(_ transferID: String) -> (String, Int) {
        let parts = transferID.split(separator: "#")
        return (String(parts[0]), parts.count > 1 ? Int(parts[1]) ?? -1 : -1)
    }

    static func fileSize(_ url: URL) -> Int64? {
        var info = stat()
        guard stat(url.path, &info) == 0 else { return nil }
        return Int64(info.st_size)
    }

    static func newID(_ prefix: String) -> String {
        let alphabet = Array("0123456789abcdefghjkmnpqrstvwxyz")
        return prefix + "-" + String((0..<8).map { _ in alphabet.randomElement()! })
    }
}
