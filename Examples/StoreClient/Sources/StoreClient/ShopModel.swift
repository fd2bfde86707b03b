import Foundation
import PackDelivery

/// What a store's UI shows, kept by a `@MainActor` view model: it observes the queue with no locks,
/// because its callbacks arrive on the main actor, in order.
@MainActor final class ShopModel: DownloadQueueMainActorObserver {
    /// Progress of each download, 0…100, as a progress bar would show it.
    private(set) var percent: [String: Int] = [:]
    /// Open purchases by id, as a store screen lists them.
    private(set) var open: [String: Transaction] = [:]
    private var saidMainActor = false

    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
        self.sayMainActor()
        for transaction in transactions { self.open[transaction.id] = transaction.isFinished ? nil : transaction }
    }

    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        self.sayMainActor()
        for download in downloads {
            let percent = Int((download.progress * 100).rounded(.down))
            // A real view redraws; this one prints each step of 25 %.
            if percent / 25 != (self.percent[download.id] ?? -1) / 25 {
                let rate = download.bytesPerSecond.map { ", \(Int($0)) B/s" } ?? ""
                print("progress \(download.contentIdentifier) \(percent)%\(rate)")
            }
            self.percent[download.id] = percent
        }
    }

    func downloadQueue(_ queue: DownloadQueue, removedTransactions transactions: [Transaction]) {
        for transaction in transactions { print("removed \(transaction.id) \(transaction.productIdentifier)") }
    }

    private func sayMainActor() {
        guard !self.saidMainActor else { return }
        self.saidMainActor = true
        // The callbacks run on the main actor (served by the main queue): this would trap otherwise.
        MainActor.assertIsolated()
        print("observer on the main actor: yes")
    }
}
