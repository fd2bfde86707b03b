import Foundation
import GRDB
import Logging
import Synchronization

// Installed content: where it is, its use, and removing it.
extension DownloadQueue {
    // MARK: Installed content

    /// Installed content, by product.
    ///
    /// - Parameter productIdentifier: a product, or nil for everything installed.
    /// - Returns: one entry per installed pack, oldest first; empty when nothing is installed.
    /// - Throws: a database error when the store cannot be read; `queueClosed` after ``close()-9kmx4``.
    public func installedContent(forProductID productIdentifier: String? = nil) throws(PackDeliveryError) -> [InstalledContent] {
        try self.requireOpen()
        return try self.store.installs(productIdentifier: productIdentifier).map(\.content)
    }

    /// The folder holding a product's installed content, or nil. Unlike StoreKit's, it outlives the transaction.
    ///
    /// - Parameter productIdentifier: the product.
    /// - Returns: the folder of its most recently installed pack (see ``installedContent(forProductID:)`` for all
    ///   the packs of a product with several). Nil after ``close()-9kmx4``: open a new queue to ask.
    public func contentURL(forProductID productIdentifier: String) -> URL? {
        guard let content = (try? self.installedContent(forProductID: productIdentifier))?.max(by: { $0.installedAt < $1.installedAt })
        else { return nil }
        self.noteUse(contentIDs: [content.contentIdentifier])
        return content.contentURL
    }

    /// Records that packs were handed out (``contentURL(forProductID:)``, ``ensureAvailable(contentIDs:from:priority:)``):
    /// a use, which orders evictions (least recently used first). Once a minute at most per pack; a failure to record
    /// it is not the caller's (the pack is there).
    func noteUse(contentIDs: [String]) {
        let now = ContinuousClock.now
        let due = self.recordedUses.withLock { recorded in
            contentIDs.filter { identifier in
                if let last = recorded[identifier], now - last < Self.useRecordInterval { return false }
                recorded[identifier] = now
                return true
            }
        }
        if !due.isEmpty { try? self.store.recordUse(contentIdentifiers: due) }
    }

    /// Deletes a product's installed content and its record.
    ///
    /// - Parameter productIdentifier: the product.
    /// - Returns: how many packs were removed.
    /// - Throws: a database error when the store cannot be written.
    @discardableResult
    public func deleteContent(forProductID productIdentifier: String) throws(PackDeliveryError) -> Int {
        try self.requireOpen()
        let records = try self.store.installs(productIdentifier: productIdentifier)
        for record in records {
            // Move aside first so the folder disappears in one step, then delete.
            let aside = self.home.workFolder(for: record.destination).appending(path: "staging/removed-\(UUID().uuidString)")
            if rename(record.contentURL, aside.path) == 0 {
                self.janitor.async { try? Installer.removeTree(aside) }
            } else {
                try? Installer.removeTree(URL(filePath: record.contentURL))
            }
            try self.store.deleteInstall(record)
        }
        return records.count
    }
}
