import Foundation
import Logging

/// Runs blocking work (SQLite, libcurl, the file system) on the ``WorkerPool``'s threads, never on Swift
/// concurrency's cooperative threads, and resumes the awaiting task with the result.
enum Blocking {
    static func run<T: Sendable>(_ body: @escaping @Sendable () throws(PackDeliveryError) -> T) async throws(PackDeliveryError) -> T {
        let result: Result<T, PackDeliveryError> = await withCheckedContinuation { continuation in
            WorkerPool.shared.run {
                do throws(PackDeliveryError) { continuation.resume(returning: .success(try body())) } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }
}

// async/await: waiting for one thing, and the calls that do I/O without blocking an async caller's thread.
extension DownloadQueue {
    /// Opens a queue without blocking the caller's thread (see ``init(home:configuration:logger:)``).
    ///
    /// - Parameters:
    ///   - home: where state, partial downloads and installed content live.
    ///   - configuration: concurrency, transfer options, limits and resume behaviour.
    ///   - logger: where to log; without one the library logs nothing.
    /// - Returns: the open queue.
    /// - Throws: ``PackDeliveryError`` when the home folder or the state database cannot be used.
    public static func open(home: Home, configuration: Configuration = Configuration(), logger: Logger? = nil)
        async throws(PackDeliveryError) -> DownloadQueue
    {
        try await Blocking.run { () throws(PackDeliveryError) in try DownloadQueue(home: home, configuration: configuration, logger: logger)
        }
    }

    /// Waits until every download of a transaction has stopped running: finished, cancelled, failed or paused.
    ///
    /// Downloads another process runs (several processes may share a home) are followed too: their state is
    /// read from the database about once a second. Cancelling the awaiting task stops the wait (throwing
    /// `cancelled`); the downloads go on.
    /// - Parameter transactionID: the transaction.
    /// - Returns: the transaction as it is then (``Transaction/isFinishable`` says whether all went well).
    /// - Throws: `unknownTransaction`; `cancelled` when the task is cancelled; `queueClosed` when the queue closes first.
    public func settled(transactionID: String) async throws(PackDeliveryError) -> Transaction {
        try await self.wait(transactionID: transactionID, for: .settled)
    }

    /// Waits until a purchase is delivered: every download of the transaction finished, its content in place.
    ///
    /// One await for a purchase: a download that pauses (the user, a full disk, refused credentials) is waited
    /// for through its pause and resume, unless `returningOnPause`; a download that fails for good or is
    /// cancelled ends the wait with an error. It follows the same events as ``settled(transactionID:)``
    /// (downloads another process runs too, from the database, about once a second). Cancelling the awaiting
    /// task stops the wait (throwing `cancelled`); the downloads go on.
    ///
    /// ```swift
    /// let transaction = try await queue.add(product: productID, from: manifest)
    /// let delivered = try await queue.delivered(transactionID: transaction.id)
    /// try await queue.finish(delivered.id)
    /// ```
    /// - Parameters:
    ///   - transactionID: the transaction.
    ///   - returningOnPause: return as soon as no download runs and one is paused, instead of waiting for its resume.
    /// - Returns: the transaction, finishable, every download finished (with `returningOnPause`, maybe with
    ///   paused downloads: see ``Transaction/isFinishable``).
    /// - Throws: the download's error when one fails (its code, such as `checksumMismatch` or `networkUnreachable`);
    ///   `cancelled` naming the transaction as ``PackDeliveryError/subject`` once every download settled with one
    ///   cancelled (the transaction is finishable then, and should be finished); `unknownTransaction`;
    ///   `cancelled` (with no subject) when the awaiting task is cancelled; `queueClosed` when the queue closes first.
    public func delivered(transactionID: String, returningOnPause: Bool = false) async throws(PackDeliveryError) -> Transaction {
        try await self.wait(transactionID: transactionID, for: .delivered(returningOnPause: returningOnPause))
    }

    /// Follows a transaction through its events (and a poll of the database, for work another process runs)
    /// until ``TransactionWait`` says the wait is over.
    private func wait(transactionID: String, for goal: TransactionWait.Goal) async throws(PackDeliveryError) -> Transaction {
        try self.requireOpen()
        let read = { @Sendable () throws(PackDeliveryError) -> Transaction? in try self.liveTransactions(ids: [transactionID]).first }
        let steps = try await Blocking.run { () throws(PackDeliveryError) in self.waitSteps(self.events(transactionID: transactionID)) }
        guard var transaction = try await Blocking.run(read) else {
            throw PackDeliveryError(
                .unknownTransaction, message: "There is no transaction '\(PackDeliveryError.printable(transactionID))'.",
                subject: transactionID)
        }
        func ended(_ transaction: Transaction) throws(PackDeliveryError) -> Bool {
            switch TransactionWait.verdict(transaction, goal: goal) {
            case .wait: return false
            case .done: return true
            case .failed(let error): throw error
            }
        }
        if try ended(transaction) { return transaction }
        for await step in steps {
            switch step {
            case .event(.transactionUpdated(let updated)): transaction = updated
            case .event(.downloadUpdated(let download)):
                if let index = transaction.downloads.firstIndex(where: { $0.id == download.id }) { transaction.downloads[index] = download }
            case .event: break
            case .poll: if let fresh = try? await Blocking.run(read) { transaction = fresh }
            }
            if try ended(transaction) { return transaction }
        }
        throw Self.waitEnded(Task.isCancelled)
    }

    /// Waits until a download has stopped running: finished, cancelled, failed or paused.
    ///
    /// A download another process runs is followed too, from the database, about once a second. Cancelling
    /// the awaiting task stops the wait (throwing `cancelled`); the download goes on.
    /// - Parameter downloadID: the download.
    /// - Returns: the download as it is then.
    /// - Throws: `unknownDownload`; `cancelled` when the task is cancelled; `queueClosed` when the queue closes first.
    public func settled(downloadID: String) async throws(PackDeliveryError) -> Download {
        try self.requireOpen()
        let read = { @Sendable () throws(PackDeliveryError) -> Download? in
            if let live = self.driven({ $0.machine.download(downloadID) }) { return live }
            return try self.store.downloadRecord(downloadID)?.download
        }
        let steps = try await Blocking.run { () throws(PackDeliveryError) in self.waitSteps(self.events(downloadID: downloadID)) }
        guard var download = try await Blocking.run(read) else {
            throw PackDeliveryError(
                .unknownDownload, message: "There is no download '\(PackDeliveryError.printable(downloadID))'.", subject: downloadID)
        }
        if !download.state.isRunning { return download }
        for await step in steps {
            switch step {
            case .event(.downloadUpdated(let updated)): download = updated
            case .event(.transactionUpdated(let transaction)): download = transaction.downloads.first { $0.id == downloadID } ?? download
            case .event: break
            case .poll: if let fresh = try? await Blocking.run(read) { download = fresh }
            }
            if !download.state.isRunning { return download }
        }
        throw Self.waitEnded(Task.isCancelled)
    }

    /// What a wait reacts to: the queue's events, and a poll of the database about once a second (for work
    /// another process runs, whose events this process never sees).
    enum WaitStep: Sendable {
        case event(DownloadQueueEvent)
        case poll
    }

    /// The events of `events`, with a poll step every second; ends when `events` ends (the queue closed) or the
    /// consuming task is cancelled.
    func waitSteps(_ events: AsyncStream<DownloadQueueEvent>) -> AsyncStream<WaitStep> {
        let (steps, continuation) = AsyncStream.makeStream(of: WaitStep.self)
        let forward = Task {
            for await event in events { continuation.yield(.event(event)) }
            continuation.finish()
        }
        let poll = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                continuation.yield(.poll)
            }
        }
        continuation.onTermination = { _ in
            forward.cancel()
            poll.cancel()
        }
        return steps
    }

    private static func waitEnded(_ cancelled: Bool) -> PackDeliveryError {
        cancelled
            ? PackDeliveryError(.cancelled, message: "The wait was cancelled; the downloads go on.")
            : PackDeliveryError(
                .queueClosed, message: "The download queue was closed while waiting.", hint: "Open a new DownloadQueue on the same home.")
    }

    // MARK: The blocking calls, for async callers

    /// ``add(products:from:kind:destination:autoFinish:force:start:receipt:)`` without blocking the caller's thread.
    @discardableResult
    public func add(
        products productIdentifiers: [String], from manifest: LoadedManifest, kind: TransactionKind = .purchased,
        destination: Destination = .caches, autoFinish: Bool = false, force: Bool = false,
        start: Bool = true, receipt: String? = nil
    ) async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in
            try self.add(
                products: productIdentifiers, from: manifest, kind: kind, destination: destination, autoFinish: autoFinish, force: force,
                start: start, receipt: receipt)
        }
    }

    /// ``add(product:from:kind:destination:autoFinish:force:start:receipt:)`` without blocking the caller's thread.
    @discardableResult
    public func add(
        product productIdentifier: String, from manifest: LoadedManifest, kind: TransactionKind = .purchased,
        destination: Destination = .caches, autoFinish: Bool = false, force: Bool = false,
        start: Bool = true, receipt: String? = nil
    ) async throws(PackDeliveryError) -> Transaction {
        try await self.add(
            products: [productIdentifier], from: manifest, kind: kind, destination: destination, autoFinish: autoFinish,
            force: force, start: start, receipt: receipt)[0]
    }

    /// ``setReceipt(_:forTransactions:)`` without blocking the caller's thread.
    @discardableResult
    public func setReceipt(_ receipt: String, forTransactions transactionIDs: [String]) async throws(PackDeliveryError) -> [String] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.setReceipt(receipt, forTransactions: transactionIDs) }
    }

    /// ``transactions()`` without blocking the caller's thread.
    public func transactions() async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.transactions() }
    }

    /// ``finish(_:)-(String)`` without blocking the caller's thread.
    public func finish(_ transactionID: String) async throws(PackDeliveryError) {
        _ = try await Blocking.run { () throws(PackDeliveryError) in try self.finish([transactionID]) }
    }

    /// ``finish(_:)-([String])`` without blocking the caller's thread.
    @discardableResult
    public func finish(_ transactionIDs: [String]) async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.finish(transactionIDs) }
    }

    /// ``verify(productIDs:)`` without blocking the caller's thread (it hashes every installed file).
    public func verify(productIDs: [String]? = nil) async throws(PackDeliveryError) -> [VerifyResult] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.verify(productIDs: productIDs) }
    }

    /// ``repair(productIDs:)`` without blocking the caller's thread.
    @discardableResult
    public func repair(productIDs: [String]? = nil) async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.repair(productIDs: productIDs) }
    }

    /// ``start(_:)`` without blocking the caller's thread.
    @discardableResult
    public func start(_ ids: [String]) async throws(PackDeliveryError) -> [String] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.start(ids) }
    }

    /// ``restoreCompletedTransactions(productIDs:)`` without blocking the caller's thread.
    @discardableResult
    public func restoreCompletedTransactions(productIDs: [String]? = nil) async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in try self.restoreCompletedTransactions(productIDs: productIDs) }
    }

    /// ``close()`` without blocking the caller's thread.
    public func close() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            WorkerPool.shared.run {
                self.close()
                continuation.resume()
            }
        }
    }

    // MARK: Restore

    /// Delivers again every product this home has recorded (or those given): one restore transaction per product,
    /// from the URLs of the downloads that delivered it; packs still installed and intact finish at once.
    ///
    /// When every download of the restore has settled, observers get
    /// ``DownloadQueueObserver/downloadQueue(_:restoreCompletedTransactionsFinished:)`` (and streams
    /// ``DownloadQueueEvent/restoreCompleted(_:)``); when one fails or pauses,
    /// ``DownloadQueueObserver/downloadQueue(_:restoreCompletedTransactionsFailedWithError:)``.
    ///
    /// One restore at a time, as StoreKit's payment queue has it: a call made while a restore of the same product's
    /// packs runs (on this queue, or on another queue or process on the home) joins it. It returns the same
    /// transactions, nothing is fetched twice, and a restore this queue runs ends with one completion, the one both
    /// calls wait for.
    /// - Parameter productIDs: products to restore, or nil for every product with a finished download.
    /// - Returns: the restore transactions (finishable at once when everything was intact), or those joined.
    /// - Throws: a database error; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func restoreCompletedTransactions(productIDs: [String]? = nil) throws(PackDeliveryError) -> [Transaction] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) -> [Transaction] in
            let records = try self.store.lastFinishedDownloads(productIdentifiers: productIDs)
            let installs = Dictionary(grouping: try self.store.installs(), by: \.contentIdentifier)
            let recent = Dictionary(
                uniqueKeysWithValues: try self.store.recentInstalls(window: nil).map {
                    ("\($0.install.destination.rawValue)/\($0.install.contentIdentifier)", $0)
                })
            var transactions: [Transaction] = []
            for (product, packs) in Dictionary(grouping: records, by: \.productIdentifier).sorted(by: { $0.key < $1.key }) {
                let transactionID = Self.newID("t")
                let downloads = packs.sorted { $0.position < $1.position }.map { record -> Download in
                    let recorded = record.download
                    let key = "\(recorded.destination.rawValue)/\(recorded.contentIdentifier)"
                    let intact =
                        installs[recorded.contentIdentifier]?.contains {
                            $0.destination == recorded.destination && $0.productIdentifier == product
                                && $0.contentVersion == recorded.contentVersion
                        } == true
                        && recent[key].map { Self.looksIntact($0.install, files: $0.files) } == true
                    return Redelivery.download(
                        recorded, id: Self.newID("d"), transactionID: transactionID, intact: intact, contentURL: recorded.contentURL)
                }
                transactions.append(
                    Transaction(
                        id: transactionID, productIdentifier: product, kind: .restored, createdAt: Date(),
                        finishedAt: nil, autoFinish: true, downloads: downloads))
            }
            // A restore under way (this call's twin, on this queue or another process) is joined: its transactions
            // are returned, and a restore this queue runs already ends with the one completion it reports.
            if !transactions.isEmpty {
                transactions = try self.withJoined(transactions, try self.record(transactions, joining: true, adoptingRestores: true))
            }
            let ids = Set(transactions.map(\.id))
            if !ids.isEmpty, self.driven({ $0.restores.values.contains { ids.isSubset(of: $0.transactionIDs) } }) { return transactions }
            // Registered after the record succeeded (a failed record leaves no batch behind); on the driver, so no
            // download of the restore can settle in between.
            let pending = Set(transactions.flatMap(\.downloads).filter { $0.state.isRunning }.map(\.id))
            if pending.isEmpty {
                self.emit(.restoreCompleted(transactions))
            } else {
                self.driven { $0.restores[UUID()] = RestoreBatch(transactionIDs: transactions.map(\.id), pending: pending) }
            }
            return transactions
        }
    }
}

extension LoadedManifest {
    /// ``load(_:options:)`` without blocking the caller's thread.
    ///
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching an http(s) manifest.
    /// - Returns: the checked manifest with the URL it was read from.
    /// - Throws: as ``load(_:options:)``.
    public static func load(_ location: String, options: TransferOptions = TransferOptions()) async throws(PackDeliveryError)
        -> LoadedManifest
    {
        try await Blocking.run { () throws(PackDeliveryError) in try Self.load(location, options: options) }
    }

    /// ``load(_:options:trusting:now:)`` without blocking the caller's thread.
    public static func load(
        _ location: String, options: TransferOptions = TransferOptions(), trusting publishers: [PublisherKey],
        now: Date = Date()
    ) async throws(PackDeliveryError) -> LoadedManifest {
        try await Blocking.run { () throws(PackDeliveryError) in try Self.load(location, options: options, trusting: publishers, now: now) }
    }

    /// `load(_:options:trusting:repositories:now:)` without blocking the caller's thread.
    public static func load(
        _ location: String, options: TransferOptions = TransferOptions(), trusting publishers: [PublisherKey],
        repositories: [TrustedRepository], now: Date = Date()
    ) async throws(PackDeliveryError) -> LoadedManifest {
        try await Blocking.run { () throws(PackDeliveryError) in
            try Self.load(location, options: options, trusting: publishers, repositories: repositories, now: now)
        }
    }
}
