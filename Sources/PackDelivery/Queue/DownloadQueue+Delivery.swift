import Foundation

// Delivery: observers and event streams, in order, off the driver.
extension DownloadQueue {
    /// Adds an observer (held weakly) and delivers the unfinished transactions to it at once.
    ///
    /// - Parameter observer: keep a strong reference to it for as long as it should be called.
    public func add(_ observer: any DownloadQueueObserver) {
        self.onDriver {
            self.state.withLock { $0.observers[ObjectIdentifier(observer)] = WeakObserver(observer: observer) }
            let transactions = (try? self.liveTransactions()) ?? []
            self.delivery.async { if !transactions.isEmpty { observer.downloadQueue(self, updatedTransactions: transactions) } }
        }
    }

    /// Stops calling an observer.
    ///
    /// - Parameter observer: an observer added with ``add(_:)``.
    public func remove(_ observer: any DownloadQueueObserver) {
        self.state.withLock { _ = $0.observers.removeValue(forKey: ObjectIdentifier(observer)) }
    }

    /// Every change from now on, in order, starting with the unfinished transactions as they are now.
    ///
    /// Subscribe before adding a transaction to see all of its changes. The stream ends when the queue
    /// closes; a stream asked for after ``close()`` ends at once.
    /// - Returns: a stream of events; each call returns a stream of its own.
    public func events() -> AsyncStream<DownloadQueueEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: DownloadQueueEvent.self, bufferingPolicy: .unbounded)
        let id = UUID()
        self.onDriver {
            guard !self.state.withLock({ $0.closed }) else {
                continuation.finish()
                return
            }
            for transaction in (try? self.liveTransactions()) ?? [] { continuation.yield(.transactionUpdated(transaction)) }
            self.state.withLock { $0.continuations[id] = continuation }
        }
        continuation.onTermination = { [weak self] _ in self?.state.withLock { _ = $0.continuations.removeValue(forKey: id) } }
        return stream
    }

    /// Reports a transaction as it is now (store and live downloads).
    func emitTransaction(_ id: String) {
        guard let transaction = try? self.liveTransactions(ids: [id]).first else { return }
        self.emit(.transactionUpdated(transaction))
    }

    /// Delivers one event to every stream and observer, in order.
    func emit(_ event: DownloadQueueEvent) {
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
}
