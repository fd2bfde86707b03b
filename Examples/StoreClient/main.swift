// The delivery half of a store client, as a small command-line program:
//
//     StoreClientExample --home DIR MANIFEST PRODUCT_ID...
//
// It registers its observer at launch, adds a purchased transaction for each product, waits until
// every transaction is finished (or stopped with a download paused or failed), prints where each
// product's content is, and exits 0 when all of them are installed, 1 otherwise.
// The article "Embedding PackDelivery in a Store Client" walks through the same steps.

import Foundation
import PackDelivery

/// The store's observer: prints every change on one line, and finishes each transaction once its
/// content is in place — never earlier.
final class StoreObserver: DownloadQueueObserver {
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
        for transaction in transactions {
            let state = transaction.isFinished ? "finished" : "open"
            print("transaction \(transaction.id) \(transaction.productIdentifier) \(transaction.kind.rawValue) \(state), \(transaction.downloads.count) download(s)")
            // On launch this also receives the transactions an earlier run left unfinished.
            self.finishIfFinishable(transaction, in: queue)
        }
    }

    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        for download in downloads {
            print("download \(download.id) \(download.contentIdentifier) \(Self.describe(download))")
            // A finished or cancelled download may be the last one its transaction waited for.
            if download.state.isSettled, let transaction = try? queue.transactions().first(where: { $0.id == download.transactionID }) {
                self.finishIfFinishable(transaction, in: queue)
            }
        }
    }

    private func finishIfFinishable(_ transaction: Transaction, in queue: DownloadQueue) {
        guard transaction.isFinishable, !transaction.isFinished else { return }
        do {
            try queue.finish(transaction.id)
        } catch {
            print("transaction \(transaction.id) cannot finish yet: \(error)")
        }
    }

    private static func describe(_ download: Download) -> String {
        switch download.state {
        case .waiting:
            return "waiting"
        case .active:
            // progress counts the pack's bytes; phaseProgress moves while it is verified, unpacked and installed.
            let phase = download.phase ?? .downloading
            let detail = phase == .downloading
                ? (download.timeRemaining >= 0 ? ", \(Int(download.timeRemaining.rounded(.up)))s left" : "")
                : " (phase \(Int(download.phaseProgress * 100))%)"
            return "active \(phase.rawValue) \(Int(download.progress * 100))%\(detail)"
        case .paused:
            // insufficientStorage: a real client offers "resume" (once space is free) or "cancel".
            return "paused (\(download.pauseReason?.rawValue ?? "user"))" + (download.error.map { ": \($0)" } ?? "")
        case .failed:
            // A real client offers "try again": queue.resume([download.id]) keeps the good bytes.
            return "failed: \(download.error?.description ?? "unknown error")"
        case .cancelled:
            return "cancelled"
        case .finished:
            return "finished at \(download.contentURL?.path ?? "?")"
        }
    }
}

func exitWithUsage() -> Never {
    FileHandle.standardError.write(Data("usage: StoreClientExample --home DIR MANIFEST PRODUCT_ID...\n".utf8))
    exit(64)
}

func exitWithError(_ error: PackDeliveryError) -> Never {
    FileHandle.standardError.write(Data("StoreClientExample: \(error)\n".utf8))
    exit(1)
}

/// Adds a purchased transaction for each product, then waits until each one is finished (by the
/// observer) or stopped: nothing runs any more but a download is paused or failed.
func deliver(_ productIDs: [String], from manifest: LoadedManifest, with queue: DownloadQueue) async throws(PackDeliveryError) {
    let events = queue.events()    // subscribe before adding, so no change is missed
    var open: [String: Transaction] = [:]
    for productID in productIDs {
        let transaction = try queue.add(product: productID, from: manifest, kind: .purchased)
        open[transaction.id] = transaction
    }
    for await event in events {
        switch event {
        case .transactionUpdated(let transaction) where open[transaction.id] != nil:
            open[transaction.id] = transaction.isFinished ? nil : transaction
        case .downloadUpdated(let download):
            guard var transaction = open[download.transactionID],
                  let index = transaction.downloads.firstIndex(where: { $0.id == download.id }) else { break }
            transaction.downloads[index] = download
            let stopped = !transaction.isFinishable && transaction.downloads.allSatisfy { !$0.state.isRunning }
            open[transaction.id] = stopped ? nil : transaction
        default:
            break
        }
        if open.isEmpty { break }
    }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 4, arguments[0] == "--home" else { exitWithUsage() }
let home = Home(folder: URL(filePath: arguments[1]))
let manifestLocation = arguments[2]
let productIDs = Array(arguments[3...])

// At launch: open the queue and register the observer before anything else. The queue holds its
// observers weakly; this one is a global, so it lives as long as the program.
let queue: DownloadQueue
do { queue = try DownloadQueue(home: home) } catch { exitWithError(error) }
let observer = StoreObserver()
queue.add(observer)

// The store reported a purchase of each product: deliver its content.
do {
    let manifest = try LoadedManifest.load(manifestLocation)
    try await deliver(productIDs, from: manifest, with: queue)
} catch {
    exitWithError(error)
}

// Installed content stays findable by product, after its transaction finished and on later launches.
var allInstalled = true
for productID in productIDs {
    if let url = queue.contentURL(forProductID: productID) {
        print("content \(productID) \(url.path)")
    } else {
        print("content \(productID) not installed")
        allInstalled = false
    }
}

// Pauses anything still running (it resumes on the next launch) and delivers the last changes.
queue.close()
exit(allInstalled ? 0 : 1)
