// swift-format-ignore-file
//
// The Swift snippets of the README's "The library" section and of the DocC catalog, verbatim (each between a
// `// snippet FILE INDEX` and an `// end snippet` line), so that the suite compiles them. Declarations stand at
// file scope; statements stand in a function, in a sync context, in an async one on the main actor, or in both
// when they compile in both (a snippet with `await` compiles only in an async one; one that calls a blocking call
// whose async twin an async caller must use, such as `LoadedManifest.load` or `queue.verify()`, only in a sync
// one). Observer methods stand in a class. After a block, `_ = name` reads what the snippet declares, so that a
// value a snippet leaves for the reader does not warn. DocSnippetTests checks that the blocks are the docs'
// snippets; `scripts/doc-snippets` writes this file again from the docs. Formatting is off here: the text must
// stay the docs'. Nothing here runs.
//
// Why every `do` with `catch … where` clauses in the docs ends with a plain `catch`: without it, swiftc 6.3.1
// (swift-6.3.1-RELEASE, x86_64 Linux) crashes with signal 6 ("Found ownership error?!", in the SILGenCleanup
// pass) on the README's purchase flow. The reproduction, pure Swift, `swiftc -c repro.swift`:
//
//     struct E: Error { var text: String }        // a typed error that is not trivial (it holds a String)
//     func f() throws(E) {}
//     func g() throws {                            // untyped throws: the rethrow converts E to any Error
//         do { try f() } catch where error.text.isEmpty {}
//         [1].forEach { _ in }                     // any closure after the do
//     }
//
// It compiles with a final `catch { throw error }`, with `g() throws(E)`, or without the closure. It looks like
// swiftlang/swift#89787 (a catch pattern on a non-trivial typed error; fixed for 6.4 by swiftlang/swift#90330,
// which ends the error's borrow before the rethrow), reached here through a `where` clause: to be reported
// upstream with this reproduction if a 6.3 release still crashes.

import Foundation
import Logging
import PackDelivery

// What the snippets call that an app defines.
private final class Tokens: Sendable {
    var current: String { "token" }
    func current(renew: Bool) -> String { "token" }
    func invalidate() {}
}
private let tokens = Tokens()
private func renewTokenThenResume(_ download: Download) {}
private func showNotForSale(_ productID: String) {}
private func showOffline(_ message: String) {}
private func report(_ error: any Error) {}
private func unlock(_ productID: String, at folder: URL?) {}
private func show(_ message: String) {}
private func openMap(_ url: URL) {}

/// What the snippets' observer methods call on `self`: an app's UI.
private protocol MemberHelpers {}
extension MemberHelpers {
    func removeFromUI(_ transaction: Transaction) {}
    func removeFromUI(_ download: Download) {}
    func showInUI(_ transaction: Transaction) {}
    func finishIfFinishable(_ transaction: Transaction, in queue: DownloadQueue) {}
    func showQueued(_ download: Download) {}
    func showProgress(_ download: Download) {}
    func offerResumeOrCancel(_ download: Download, message: String) {}
    func renewCredentialsThenResume(_ download: Download) {}
    func offerResume(_ download: Download) {}
    func offerRetry(_ download: Download, message: String) {}
    func unlock(_ productID: String, at folder: URL?) {}
    func report(_ error: any Error) {}
}

// README.md 0: a Package.swift fragment, not compiled here.

// snippet README.md 1
import PackDelivery

// A view model on the main actor: its callbacks arrive there, in order, with no locks needed.
// (DownloadQueueObserver is the same protocol for an observer on the queue's own serial queue.)
@MainActor final class Shop: DownloadQueueMainActorObserver {
    // Added, delivered again at launch, finished, or one of its downloads settled.
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
        for transaction in transactions where transaction.isFinishable && !transaction.isFinished {
            try? queue.finish(transaction.id)        // only once the content is in place
        }
    }
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        for download in downloads {
            switch download.state {
            case .active: print(download.contentIdentifier, download.progress, download.bytesPerSecond ?? 0, download.timeRemaining)
            case .finished: print("installed at", download.contentURL!.path)
            case .paused where download.pauseReason == .insufficientStorage: print(download.error!.description)
            case .paused where download.pauseReason == .unauthorized: renewTokenThenResume(download)
            case .failed: print(download.error!.description)
            default: break
            }
        }
    }
}
// end snippet

@MainActor func asyncREADME2(home: Home, transactionID: String) async throws {
// snippet README.md 2
var configuration = DownloadQueue.Configuration()
configuration.credentials = { request in ["Authorization: Bearer \(tokens.current(renew: request.refused))"] }
let queue = try await DownloadQueue.open(home: Home(folder: URL(filePath: "/var/lib/mygame")), configuration: configuration)
let shop = Shop()
queue.add(shop)                                     // at launch: unfinished transactions arrive again
let manifest = try await LoadedManifest.load("https://cdn.example.com/manifest.json")

// One await per purchase: through pauses, until every pack is installed, or the error of a failure or a cancel.
// (`start: false` records it paused, notStarted, until queue.start(ids).)
let transaction = try await queue.add(product: "com.example.forest", from: manifest, destination: .documents)
let delivered = try await queue.delivered(transactionID: transaction.id)
try await queue.finish(delivered.id)
let folder = queue.contentURL(forProductID: "com.example.forest")   // still there after finish
// A pack the manifest marks "delivery": "onDemand" is fetched when asked, ahead of everything (installed: no request).
let music = try await queue.ensureAvailable(contentIDs: ["com.example.forest.music"])

do { try await queue.finish(transactionID) } catch where error.code == .finishRefused {
    print("still running:", error.pendingDownloadIDs)   // errors are matched by code, never by message
} catch {
    print(error.description)                            // end with a plain catch (see below)
}
try await queue.restoreCompletedTransactions()          // everything this home delivered, intact or again
let damaged = try await queue.verify().filter { !$0.isIntact }  // and queue.repair() delivers them again
await queue.close()
// end snippet
_ = configuration
_ = damaged
_ = delivered
_ = folder
_ = manifest
_ = music
_ = queue
_ = shop
_ = transaction
}

// Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 0: a Package.swift fragment, not compiled here.

// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 1
import Foundation
import PackDelivery

final class ContentStore: DownloadQueueObserver {
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) { /* below */ }
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) { /* below */ }
}
// end snippet

func syncEmbeddingInAStoreClient2(home: Home) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 2
// At launch (`DownloadQueue.open(home:)` does the same without blocking an async caller):
let queue = try DownloadQueue(home: Home(folder: URL(filePath: "/var/lib/mygame/content")))
let contentStore = ContentStore()    // keep it: the queue holds its observers weakly
queue.add(contentStore)
// end snippet
_ = contentStore
_ = queue
}

@MainActor func asyncEmbeddingInAStoreClient2(home: Home) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 2
// At launch (`DownloadQueue.open(home:)` does the same without blocking an async caller):
let queue = try DownloadQueue(home: Home(folder: URL(filePath: "/var/lib/mygame/content")))
let contentStore = ContentStore()    // keep it: the queue holds its observers weakly
queue.add(contentStore)
// end snippet
_ = contentStore
_ = queue
}

// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 3
@MainActor final class ShopModel: DownloadQueueMainActorObserver {
    var progress: [String: Double] = [:]
    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        for download in downloads { self.progress[download.id] = download.progress }
    }
    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) { /* … */ }
}
// end snippet

func syncEmbeddingInAStoreClient4(queue: DownloadQueue) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 4
let manifest = try LoadedManifest.load("https://cdn.example.com/manifest.json")
let transaction = try queue.add(product: "com.example.forest", from: manifest,
                                kind: .purchased, destination: .documents)
// end snippet
_ = manifest
_ = transaction
}

@MainActor func asyncEmbeddingInAStoreClient5(queue: DownloadQueue, manifest: LoadedManifest, productID: String) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 5
do {
    try await queue.add(product: productID, from: manifest)
} catch where error.code == .unknownProduct {
    showNotForSale(productID)
} catch where error.kind == .network {
    showOffline(error.description)     // one line: what happened and what to do
} catch {
    report(error)                      // a do with catch-where clauses ends with a plain catch
}
// end snippet
}

func syncEmbeddingInAStoreClient6(queue: DownloadQueue) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 6
var configuration = DownloadQueue.Configuration()
configuration.credentials = { request in
    if request.refused { tokens.invalidate() }   // renew elsewhere; this runs on the queue's thread
    return ["Authorization: Bearer \(tokens.current)"]
}
// end snippet
_ = configuration
}

@MainActor func asyncEmbeddingInAStoreClient6(queue: DownloadQueue) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 6
var configuration = DownloadQueue.Configuration()
configuration.credentials = { request in
    if request.refused { tokens.invalidate() }   // renew elsewhere; this runs on the queue's thread
    return ["Authorization: Bearer \(tokens.current)"]
}
// end snippet
_ = configuration
}

private final class MemberEmbeddingInAStoreClient7: MemberHelpers {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 7
func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) {
    for transaction in transactions {
        if transaction.isFinished {
            self.removeFromUI(transaction)
        } else {
            self.showInUI(transaction)
            // Delivered again at launch, installed already, or one of its downloads just settled.
            self.finishIfFinishable(transaction, in: queue)
        }
    }
}
// end snippet
}

private final class MemberEmbeddingInAStoreClient8: MemberHelpers {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 8
func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
    for download in downloads {
        switch download.state {
        case .waiting:
            self.showQueued(download)
        case .active:
            self.showProgress(download)    // phase, progress, timeRemaining
        case .paused where download.pauseReason == .insufficientStorage:
            self.offerResumeOrCancel(download, message: download.error?.description ?? "The disk is full.")
        case .paused where download.pauseReason == .unauthorized:
            self.renewCredentialsThenResume(download)
        case .paused:
            self.offerResume(download)
        case .failed:
            self.offerRetry(download, message: download.error?.description ?? "The download failed.")
        case .cancelled:
            self.removeFromUI(download)
        case .finished:
            self.unlock(download.productIdentifier, at: download.contentURL)
        @unknown default:
            break    // a state a later version adds (see below): shown once the app knows it
        }
    }
}
// end snippet
}

func syncEmbeddingInAStoreClient9(queue: DownloadQueue, download: Download) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 9
try queue.pause([download.id])     // paused (user), bytes kept
try queue.resume([download.id])    // paused or failed → waiting, continuing from the bytes on disk
try queue.cancel([download.id])    // cancelled, partial data deleted
// end snippet
}

@MainActor func asyncEmbeddingInAStoreClient9(queue: DownloadQueue, download: Download) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 9
try queue.pause([download.id])     // paused (user), bytes kept
try queue.resume([download.id])    // paused or failed → waiting, continuing from the bytes on disk
try queue.cancel([download.id])    // cancelled, partial data deleted
// end snippet
}

private final class MemberEmbeddingInAStoreClient10: MemberHelpers {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 10
private func finishIfFinishable(_ transaction: Transaction, in queue: DownloadQueue) {
    guard transaction.isFinishable, !transaction.isFinished else { return }
    do {
        try queue.finish(transaction.id)
    } catch where error.code == .finishRefused {
        // A download is pending again (another process resumed it); its next update comes back here.
    } catch {
        self.report(error)
    }
}
// end snippet
}

@MainActor func asyncEmbeddingInAStoreClient11(queue: DownloadQueue, manifest: LoadedManifest, productID: String, transactionID: String) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 11
let transaction = try await queue.add(product: productID, from: manifest, destination: .documents)
do {
    let delivered = try await queue.delivered(transactionID: transaction.id)
    try await queue.finish(delivered.id)
    unlock(productID, at: queue.contentURL(forProductID: productID))
} catch where error.code == .cancelled && error.subject == transaction.id {
    try await queue.finish(transaction.id)    // the user cancelled it: nothing more to deliver
} catch {
    show(error.description)                   // failed: queue.resume([id]) tries again from the bytes kept
}
// end snippet
_ = transaction
}

@MainActor func asyncEmbeddingInAStoreClient12(queue: DownloadQueue, manifest: LoadedManifest, download: Download, productID: String, productIDs: [String], transactionID: String) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 12
let events = queue.events()
var open: [String: Transaction] = [:]
for productID in productIDs {
    let transaction = try await queue.add(product: productID, from: manifest, kind: .purchased)
    open[transaction.id] = transaction
}
// Wait until each transaction is finishable (then finish it), or stopped with a download paused or failed.
for await event in events {
    switch event {
    case .transactionUpdated(let transaction) where open[transaction.id] != nil:
        open[transaction.id] = transaction.isFinished ? nil : transaction
    case .downloadUpdated(let download):
        guard var transaction = open[download.transactionID],
              let index = transaction.downloads.firstIndex(where: { $0.id == download.id }) else { break }
        transaction.downloads[index] = download
        if transaction.isFinishable { try await queue.finish(transaction.id) }
        let stopped = transaction.downloads.allSatisfy { !$0.state.isRunning }
        open[transaction.id] = stopped ? nil : transaction
    default:
        break
    }
    if open.isEmpty { break }
}
// end snippet
_ = events
_ = open
}

func syncEmbeddingInAStoreClient13(queue: DownloadQueue) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 13
if let forest = queue.contentURL(forProductID: "com.example.forest") {
    let map = forest.appending(path: "Contents/forest.map")
    openMap(map)
}
for content in try queue.installedContent() {
    print(content.productIdentifier, content.contentVersion, content.contentURL.path)
}
try queue.deleteContent(forProductID: "com.example.forest")    // when the user removes it
// end snippet
}

@MainActor func asyncEmbeddingInAStoreClient13(queue: DownloadQueue) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 13
if let forest = queue.contentURL(forProductID: "com.example.forest") {
    let map = forest.appending(path: "Contents/forest.map")
    openMap(map)
}
for content in try queue.installedContent() {
    print(content.productIdentifier, content.contentVersion, content.contentURL.path)
}
try queue.deleteContent(forProductID: "com.example.forest")    // when the user removes it
// end snippet
}

func syncEmbeddingInAStoreClient14(queue: DownloadQueue, productIDs: [String]) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 14
let lease = try queue.beginAccessing(productIDs: ["com.example.forest"])
if let forest = queue.contentURL(forProductID: "com.example.forest") {
    openMap(forest.appending(path: "Contents/forest.map"))
}
try queue.endAccessing(lease)    // when the scene closes
for evicted in try queue.evictedContent() {
    print(evicted.productIdentifier, "was evicted; fetch it again to use it")
}
// end snippet
_ = lease
}

@MainActor func asyncEmbeddingInAStoreClient14(queue: DownloadQueue, productIDs: [String]) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 14
let lease = try queue.beginAccessing(productIDs: ["com.example.forest"])
if let forest = queue.contentURL(forProductID: "com.example.forest") {
    openMap(forest.appending(path: "Contents/forest.map"))
}
try queue.endAccessing(lease)    // when the scene closes
for evicted in try queue.evictedContent() {
    print(evicted.productIdentifier, "was evicted; fetch it again to use it")
}
// end snippet
_ = lease
}

@MainActor func asyncEmbeddingInAStoreClient15(queue: DownloadQueue) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 15
let folders = try await queue.ensureAvailable(contentIDs: ["com.example.forest.music"])
// end snippet
_ = folders
}

@MainActor func asyncEmbeddingInAStoreClient16(queue: DownloadQueue, manifest: LoadedManifest, ownedProductIDs: [String]) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 16
try await queue.add(products: ownedProductIDs, from: manifest, kind: .restored)
// end snippet
}

func syncEmbeddingInAStoreClient17(queue: DownloadQueue) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 17
let damaged = try queue.verify().filter { !$0.isIntact }    // what the user would see
let repairs = try queue.repair()                            // empty when everything is intact
// … follow the repairs like any other transaction
// end snippet
_ = damaged
_ = repairs
}

func syncEmbeddingInAStoreClient18(home: Home) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 18
LoggingSystem.bootstrap(StreamLogHandler.standardError)
var logger = Logger(label: "com.example.mygame.delivery")
logger.logLevel = .debug
let queue = try DownloadQueue(home: .xdg(), logger: logger)
// end snippet
_ = logger
_ = queue
}

@MainActor func asyncEmbeddingInAStoreClient18(home: Home) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 18
LoggingSystem.bootstrap(StreamLogHandler.standardError)
var logger = Logger(label: "com.example.mygame.delivery")
logger.logLevel = .debug
let queue = try DownloadQueue(home: .xdg(), logger: logger)
// end snippet
_ = logger
_ = queue
}

func syncEmbeddingInAStoreClient19(home: Home) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 19
/// Writes like a filesystem with no room left after `limit` bytes of any one file.
struct FullDisk: FileWriting {
    let limit: Int64
    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        guard offset + Int64(count) <= self.limit else { errno = ENOSPC; return -1 }
        return SystemFileWriter().pwrite(fd, buffer, count, offset)
    }
}
let queue = try DownloadQueue(home: home, configuration: .init(writer: FullDisk(limit: 1 << 20)))
// end snippet
_ = queue
}

@MainActor func asyncEmbeddingInAStoreClient19(home: Home) async throws {
// snippet Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md 19
/// Writes like a filesystem with no room left after `limit` bytes of any one file.
struct FullDisk: FileWriting {
    let limit: Int64
    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        guard offset + Int64(count) <= self.limit else { errno = ENOSPC; return -1 }
        return SystemFileWriter().pwrite(fd, buffer, count, offset)
    }
}
let queue = try DownloadQueue(home: home, configuration: .init(writer: FullDisk(limit: 1 << 20)))
// end snippet
_ = queue
}

func syncPackDelivery0(home: Home, observer: any DownloadQueueObserver) throws {
// snippet Sources/PackDelivery/PackDelivery.docc/PackDelivery.md 0
let queue = try DownloadQueue(home: Home(folder: URL(filePath: "/var/lib/mygame")))
queue.add(observer)    // at launch: unfinished transactions arrive again
let manifest = try LoadedManifest.load("https://cdn.example.com/manifest.json")
try queue.add(product: "com.example.forest", from: manifest, kind: .purchased)
// end snippet
_ = manifest
_ = queue
}

