import Foundation

/// Receives every transaction and download change of a ``DownloadQueue``, in order, on one serial queue
/// of the queue's own (never the main thread).
///
/// Register it as soon as the host launches: unfinished transactions from earlier runs are delivered
/// to it right away, like StoreKit's transaction observer. Downloads that another process runs on the same
/// home reach it too, as that process records them (progress about once a second). For an observer that lives on the main
/// actor (a view model), use ``DownloadQueueMainActorObserver`` instead.
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

    /// Transactions were finished and leave the queue. Optional.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting.
    ///   - transactions: the finished transactions.
    func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction])

    /// A restore delivered everything it started. Optional.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting.
    ///   - transactions: the restore's transactions, finishable.
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction])

    /// A restore could not complete. Optional.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting.
    ///   - error: why (a download of the restore failed or paused).
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFailedWithError error: PackDeliveryError)

    /// A waiting or paused download was given another priority. Optional.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting.
    ///   - download: the download, with its new ``Download/priority``.
    func downloadQueue(_ queue: DownloadQueue, priorityChanged download: Download)

    /// A cached pack was evicted to make room (``DownloadQueue/evictCaches(downTo:dryRun:)``, the cache budget, or a
    /// disk too full for a download): its folder is gone until it is fetched again. Optional.
    ///
    /// - Parameters:
    ///   - queue: the queue reporting.
    ///   - content: the pack evicted, as ``DownloadQueue/evictedContent(forProductID:)`` lists it.
    func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent)
}

extension DownloadQueueObserver {
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, priorityChanged download: Download) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction]) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction]) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFailedWithError error: PackDeliveryError) {}
}

/// An observer that lives on the main actor: a view model, a `@MainActor` store. Its callbacks run on
/// the main actor, in order, as StoreKit delivers on the main thread; it needs no locks.
///
/// ```swift
/// @MainActor final class ShopModel: DownloadQueueMainActorObserver {
///     var progress: [String: Double] = [:]
///     func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
///         for download in downloads { self.progress[download.id] = download.progress }
///     }
///     func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {}
/// }
/// queue.add(model)   // from the main actor
/// ```
/// The main actor must be served: an app's run loop does it, and so does an `async` `main`.
@MainActor public protocol DownloadQueueMainActorObserver: AnyObject, Sendable {
    /// As ``DownloadQueueObserver/downloadQueue(_:updatedTransactions:)``, on the main actor.
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction])
    /// As ``DownloadQueueObserver/downloadQueue(_:updatedDownloads:)``, on the main actor.
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download])
    /// As ``DownloadQueueObserver/downloadQueue(_:removedTransactions:)``, on the main actor. Optional.
    func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction])
    /// As ``DownloadQueueObserver/downloadQueue(_:restoreCompletedTransactionsFinished:)``, on the main actor. Optional.
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction])
    /// As ``DownloadQueueObserver/downloadQueue(_:restoreCompletedTransactionsFailedWithError:)``, on the main actor. Optional.
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFailedWithError error: PackDeliveryError)
    /// As ``DownloadQueueObserver/downloadQueue(_:priorityChanged:)``, on the main actor. Optional.
    func downloadQueue(_ queue: DownloadQueue, priorityChanged download: Download)
    /// As ``DownloadQueueObserver/downloadQueue(_:evicted:)``, on the main actor. Optional.
    func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent)
}

extension DownloadQueueMainActorObserver {
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, priorityChanged download: Download) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction]) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction]) {}
    /// Does nothing.
    public func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFailedWithError error: PackDeliveryError) {}
}

/// Carries a main-actor observer's callbacks to the main actor, in order (the main queue is FIFO), holding it weakly.
private final class MainActorRelay: DownloadQueueObserver {
    // A main-actor class is Sendable, and so is a weak reference to one; loading it is safe from any thread.
    weak let target: (any DownloadQueueMainActorObserver)?

    init(_ target: any DownloadQueueMainActorObserver) { self.target = target }

    private func hop(_ body: @escaping @MainActor @Sendable (any DownloadQueueMainActorObserver) -> Void) {
        DispatchQueue.main.async { [weak target] in
            // Work submitted to the main queue runs on the main thread, which is the main actor's executor.
            MainActor.assumeIsolated { if let target { body(target) } }
        }
    }

    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
        self.hop { $0.downloadQueue(queue, updatedTransactions: transactions) }
    }
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        self.hop { $0.downloadQueue(queue, updatedDownloads: downloads) }
    }
    func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction]) {
        self.hop { $0.downloadQueue(queue, removedTransactions: transactions) }
    }
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFinished transactions: [Transaction]) {
        self.hop { $0.downloadQueue(queue, restoreCompletedTransactionsFinished: transactions) }
    }
    func downloadQueue(_ queue: DownloadQueue, restoreCompletedTransactionsFailedWithError error: PackDeliveryError) {
        self.hop { $0.downloadQueue(queue, restoreCompletedTransactionsFailedWithError: error) }
    }
    func downloadQueue(_ queue: DownloadQueue, priorityChanged download: Download) {
        self.hop { $0.downloadQueue(queue, priorityChanged: download) }
    }
    func downloadQueue(_ queue: DownloadQueue, evicted content: EvictedContent) {
        self.hop { $0.downloadQueue(queue, evicted: content) }
    }
}

/// An event stream and what it wants.
struct EventStream: Sendable {
    var continuation: AsyncStream<DownloadQueueEvent>.Continuation
    var filter: @Sendable (DownloadQueueEvent) -> Bool
}

/// A restore whose end is reported as one event.
struct RestoreBatch: Sendable {
    var transactionIDs: [String]
    var pending: Set<String>
}

// Delivery: observers and event streams, in order, off the driver.
extension DownloadQueue {
    /// Adds an observer (held weakly) and delivers the unfinished transactions to it at once.
    ///
    /// - Parameter observer: keep a strong reference to it for as long as it should be called.
    public func add(_ observer: any DownloadQueueObserver) {
        self.runOnDriver {
            self.registry.withLock { $0.observers[ObjectIdentifier(observer)] = WeakObserver(observer: observer) }
            let transactions = (try? self.liveTransactions()) ?? []
            self.delivery.async { if !transactions.isEmpty { observer.downloadQueue(self, updatedTransactions: transactions) } }
        }
    }

    /// Adds an observer that lives on the main actor: its callbacks run there, in order (held weakly).
    ///
    /// - Parameter observer: keep a strong reference to it for as long as it should be called.
    @MainActor public func add(_ observer: any DownloadQueueMainActorObserver) {
        let relay = MainActorRelay(observer)
        self.registry.withLock { $0.relays[ObjectIdentifier(observer)] = relay }
        self.add(relay)
    }

    /// Stops calling an observer.
    ///
    /// - Parameter observer: an observer added with ``add(_:)-(DownloadQueueObserver)``.
    public func remove(_ observer: any DownloadQueueObserver) {
        self.registry.withLock { _ = $0.observers.removeValue(forKey: ObjectIdentifier(observer)) }
    }

    /// Stops calling a main-actor observer.
    ///
    /// - Parameter observer: an observer added with ``add(_:)-(DownloadQueueMainActorObserver)``.
    @MainActor public func remove(_ observer: any DownloadQueueMainActorObserver) {
        guard let relay = self.registry.withLock({ $0.relays.removeValue(forKey: ObjectIdentifier(observer)) }) else { return }
        self.remove(relay)
    }

    /// Every change from now on, in order, starting with the unfinished transactions as they are now.
    ///
    /// Downloads another process runs on the same home are included, as that process records them (their
    /// progress about once a second, read about once a second while anyone listens).
    ///
    /// Subscribe before adding a transaction to see all of its changes. The stream ends when the queue
    /// closes; a stream asked for after ``close()-9kmx4`` ends at once.
    /// - Returns: a stream of events; each call returns a stream of its own.
    public func events() -> AsyncStream<DownloadQueueEvent> {
        self.events { _ in true }
    }

    /// The changes of one transaction (and of its downloads), in order, starting with it as it is now.
    ///
    /// - Parameter transactionID: the transaction.
    /// - Returns: a stream of its `transactionUpdated`, `downloadUpdated`, `priorityChanged` and `transactionsRemoved` events.
    public func events(transactionID: String) -> AsyncStream<DownloadQueueEvent> {
        self.events { event in
            switch event {
            case .transactionUpdated(let transaction): transaction.id == transactionID
            case .downloadUpdated(let download), .priorityChanged(let download): download.transactionID == transactionID
            case .transactionsRemoved(let transactions), .restoreCompleted(let transactions):
                transactions.contains { $0.id == transactionID }
            case .restoreFailed, .evicted: false
            }
        }
    }

    /// The changes of one download, in order, starting with it as it is now (from its transaction).
    ///
    /// - Parameter downloadID: the download.
    /// - Returns: a stream of the `downloadUpdated` events of it, and of `transactionUpdated` events of its transaction.
    public func events(downloadID: String) -> AsyncStream<DownloadQueueEvent> {
        self.events { event in
            switch event {
            case .transactionUpdated(let transaction): transaction.downloads.contains { $0.id == downloadID }
            case .downloadUpdated(let download), .priorityChanged(let download): download.id == downloadID
            default: false
            }
        }
    }

    func events(_ filter: @escaping @Sendable (DownloadQueueEvent) -> Bool) -> AsyncStream<DownloadQueueEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: DownloadQueueEvent.self, bufferingPolicy: .unbounded)
        let id = UUID()
        self.runOnDriver {
            guard !self.registry.withLock({ $0.closed }) else {
                continuation.finish()
                return
            }
            for transaction in (try? self.liveTransactions()) ?? [] where filter(.transactionUpdated(transaction)) {
                continuation.yield(.transactionUpdated(transaction))
            }
            self.registry.withLock { $0.continuations[id] = EventStream(continuation: continuation, filter: filter) }
        }
        continuation.onTermination = { [weak self] _ in self?.registry.withLock { _ = $0.continuations.removeValue(forKey: id) } }
        return stream
    }

    /// Reports a transaction as it is now (store and live downloads).
    func emitTransaction(_ id: String) {
        guard let transaction = try? self.liveTransactions(ids: [id]).first else { return }
        self.emit(.transactionUpdated(transaction))
    }

    /// Delivers one event to every stream and observer, in order; keeps track of restores.
    func emit(_ event: DownloadQueueEvent) {
        let (streams, observers) = self.registry.withLock { state in
            // A main-actor observer that went away without remove(_:): its relay goes too.
            for (key, relay) in state.relays where (relay as? MainActorRelay)?.target == nil {
                state.relays[key] = nil
                state.observers[ObjectIdentifier(relay)] = nil
            }
            return (Array(state.continuations.values), state.observers.values.compactMap(\.observer))
        }
        for stream in streams where stream.filter(event) { stream.continuation.yield(event) }
        if !observers.isEmpty {
            self.delivery.async {
                for observer in observers {
                    switch event {
                    case .transactionUpdated(let transaction): observer.downloadQueue(self, updatedTransactions: [transaction])
                    case .downloadUpdated(let download): observer.downloadQueue(self, updatedDownloads: [download])
                    case .transactionsRemoved(let transactions): observer.downloadQueue(self, removedTransactions: transactions)
                    case .restoreCompleted(let transactions):
                        observer.downloadQueue(self, restoreCompletedTransactionsFinished: transactions)
                    case .restoreFailed(let error): observer.downloadQueue(self, restoreCompletedTransactionsFailedWithError: error)
                    case .evicted(let content): observer.downloadQueue(self, evicted: content)
                    case .priorityChanged(let download): observer.downloadQueue(self, priorityChanged: download)
                    }
                }
            }
        }
        if case .downloadUpdated(let download) = event { self.trackRestores(download) }
    }

    /// A restore ends when each of its downloads settled (completed), or when one fails or pauses (failed).
    private func trackRestores(_ download: Download) {
        guard !download.state.isRunning else { return }
        let ended = self.driven { state -> [(RestoreBatch, PackDeliveryError?)] in
            var ended: [(RestoreBatch, PackDeliveryError?)] = []
            for (id, var batch) in state.restores where batch.pending.contains(download.id) {
                if download.state.isSettled {
                    batch.pending.remove(download.id)
                    if batch.pending.isEmpty {
                        state.restores[id] = nil
                        ended.append((batch, nil))
                    } else {
                        state.restores[id] = batch
                    }
                } else {
                    state.restores[id] = nil
                    ended.append(
                        (
                            batch,
                            download.error
                                ?? PackDeliveryError(.cancelled, message: "The download \(download.id) of the restore was paused.")
                        ))
                }
            }
            return ended
        }
        for (batch, error) in ended {
            if let error {
                self.emit(.restoreFailed(error))
            } else {
                do throws(PackDeliveryError) {
                    self.emit(.restoreCompleted(try self.liveTransactions(ids: batch.transactionIDs)))
                } catch {
                    self.emit(.restoreFailed(error))  // the restore always ends with one of the two
                }
            }
        }
    }
}
