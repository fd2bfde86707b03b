import Foundation

// Fetching evicted packs again on their own, and joining a delivery that is already under way (issue 43).
extension DownloadQueue {
    /// On the driver: fetches evicted packs again on their own, as On-Demand Resources does for purged tags, from what
    /// their eviction kept: the download that installed each (its URLs, SHA-256, length and index) and its
    /// transaction's manifest URL and receipt (stored already; nothing new is stored). One restore transaction per
    /// product; one that this or another live queue is already recording for the same packs is joined.
    /// - Parameter contentIDs: packs with no open download.
    /// - Returns: the download delivering each pack that was evicted, by content identifier.
    func refetchEvicted(_ contentIDs: [String]) throws(PackDeliveryError) -> [String: DownloadRecord] {
        guard !contentIDs.isEmpty else { return [:] }
        var seen = Set<String>()
        let evicted = try self.store.evictedDownloads(contentIdentifiers: contentIDs.filter { seen.insert($0).inserted })
        var found: [String: DownloadRecord] = [:]
        for (product, records) in Dictionary(grouping: evicted, by: \.productIdentifier).sorted(by: { $0.key < $1.key }) {
            let transactionID = Self.newID("t")
            let downloads = records.map { record in
                Redelivery.download(record.download, id: Self.newID("d"), transactionID: transactionID, intact: false, contentURL: nil)
            }
            let transaction = Transaction(
                id: transactionID, productIdentifier: product, kind: .restored, createdAt: Date(), finishedAt: nil, autoFinish: true,
                downloads: downloads)
            let access = records.lazy.compactMap { self.recordedAccess($0.transactionID) }.first
            let joined = try self.record(
                [transaction], manifestURL: access?.manifestURL.flatMap { URL(string: $0) }, receipt: access?.receipt, joining: true)
            self.logger.info(
                "fetching evicted packs again",
                metadata: ["product": "\(product)", "packs": "\(records.count)", "joined": "\(!joined.isEmpty)"])
            for download in try self.withJoined([transaction], joined)[0].downloads {
                if let record = try self.store.downloadRecord(download.id) { found[download.contentIdentifier] = record }
            }
        }
        return found
    }

    /// The transactions as given, each one ``record(_:manifestURL:receipt:joining:adoptingRestores:)`` left out
    /// replaced by the open transaction it joined, as it is now. One that another queue runs is followed, and taken over
    /// if that queue's process dies (``takeOverJoinedDeliveries()``); a restore nobody runs is taken over and resumed.
    func withJoined(_ transactions: [Transaction], _ joined: [String: String]) throws(PackDeliveryError) -> [Transaction] {
        guard !joined.isEmpty else { return transactions }
        let ids = Set(joined.values).sorted()
        // On the driver (add calls this off it), as every take over is.
        try self.onDriver { () throws(PackDeliveryError) in
            let idle = try self.store.downloadRecords(transactionIDs: ids).filter { record in
                !record.state.isSettled && !(record.owner?.isAlive ?? false)
                    && (record.state.isRunning || record.pauseReason == .interrupted || record.pauseReason == .awaitingRelease)
            }
            // One that waits for its preload key stays paused: taking it asks for the key from the release date on.
            let taken = try self.take(idle.map(\.id))
            for id in taken
            where self.driven({ $0.machine.download(id).map { $0.state == .paused && $0.pauseReason != .awaitingRelease } ?? false }) {
                self.change { $0.handle(id, .resume) }
            }
            // Saved at once: another process that joins it reads it resumed, not paused as it was left.
            if !taken.isEmpty { self.save(includingProgress: false) }
        }
        var open: [String: Transaction] = [:]
        for transaction in try self.liveTransactions(ids: ids) { open[transaction.id] = try self.asFollowed(transaction) }
        self.driven { state in
            for transaction in open.values
            where transaction.downloads.contains(where: { !$0.state.isSettled && state.machine.entries[$0.id] == nil }) {
                state.joinedElsewhere.insert(transaction.id)
            }
        }
        return transactions.map { transaction in joined[transaction.id].flatMap { open[$0] } ?? transaction }
    }

    /// A joined transaction as its follower should see it: a download of it that this queue does not run and that is
    /// recorded `paused (interrupted)` is being taken over (by another live queue, which saves it resumed at once, or,
    /// when nobody runs it, by this one within a second: ``takeOverJoinedDeliveries()``); it is shown waiting, so a run
    /// that follows it does not end on that moment.
    func asFollowed(_ transaction: Transaction) throws(PackDeliveryError) -> Transaction {
        let taken = Set(
            transaction.downloads.filter { download in
                download.state == .paused && download.pauseReason == .interrupted
                    && self.driven { $0.machine.entries[download.id] == nil }
            }.map(\.id))
        guard !taken.isEmpty else { return transaction }
        var shown = transaction
        for index in shown.downloads.indices where taken.contains(shown.downloads[index].id) {
            shown.downloads[index].state = .waiting
            shown.downloads[index].pauseReason = nil
        }
        return shown
    }
}
