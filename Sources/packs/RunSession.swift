import Foundation
import PackDelivery
import Synchronization

/// Runs downloads to the end for `fetch` and `resume`: shows progress, handles Ctrl-C and SIGTERM,
/// finishes the transactions that asked for it, and decides the exit code.
struct RunSession {
    let queue: DownloadQueue
    let global: GlobalOptions

    /// - Parameters:
    ///   - finishingAll: finish every auto-finishing transaction that is finishable, not only those of the followed downloads
    ///     (`resume`: a fetch killed after its last download finished still gets finished).
    ///   - start: starts the downloads and returns the ids to follow.
    /// - Returns: the exit code (0, 65, 69, 74, 75 or 130); a stderr line has been printed for non-zero.
    func run(finishingAll: Bool = false, _ start: () throws(PackDeliveryError) -> [String]) async throws(PackDeliveryError) -> Int32 {
        let events = self.queue.events()
        let interrupted = Atomic<Bool>(false)
        let queue = self.queue
        let signals = [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                interrupted.store(true, ordering: .relaxed)
                queue.pauseAll(reason: .user)
            }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }

        let display = ProgressDisplay(mode: .init(global: self.global))
        let watched = Set(try start())
        var latest: [String: Download] = [:]
        for download in try self.queue.transactions().flatMap(\.downloads) where watched.contains(download.id) {
            latest[download.id] = download
        }
        func settled() -> Bool { watched.allSatisfy { latest[$0].map { !$0.state.isRunning } ?? true } }
        if !settled() {
            for await event in events {
                display.show(event)
                if case .downloadUpdated(let download) = event, watched.contains(download.id) {
                    latest[download.id] = download
                    if settled() { break }
                }
            }
        }
        display.end()

        // Finish what asked to be finished once its content is installed.
        for transaction in try self.queue.transactions() where transaction.autoFinish && transaction.isFinishable
            && (finishingAll || transaction.downloads.contains(where: { watched.contains($0.id) })) {
            try self.queue.finish(transaction.id)
            var finished = transaction
            finished.finishedAt = Date()
            display.finished(finished)
        }

        let downloads = watched.compactMap { latest[$0] }.sorted { $0.id < $1.id }
        if interrupted.load(ordering: .relaxed) {
            let paused = downloads.filter { $0.state == .paused }.map(\.id).joined(separator: " ")
            FileHandle.standardError.write(Data("packs: Interrupted; the downloads are paused with their data kept. Run packs resume \(paused) to continue.\n".utf8))
            return ExitStatus.interrupted
        }
        if let failed = downloads.first(where: { $0.state == .failed }) {
            let error = failed.error ?? PackDeliveryError(.internalError, message: "The download \(failed.id) failed for no recorded reason.")
            FileHandle.standardError.write(Data((ExitStatus.line(for: error, download: failed) + "\n").utf8))
            return ExitStatus.code(for: error)
        }
        if let paused = downloads.first(where: { $0.state == .paused }) {
            let why = paused.error.map { " \($0.message)" } ?? ""
            FileHandle.standardError.write(Data("packs: \(paused.id) (\(paused.contentIdentifier)) is paused (\(paused.pauseReason?.rawValue ?? "user")).\(why) Run packs resume \(paused.id) to continue, or packs cancel \(paused.id) to discard it.\n".utf8))
            return ExitStatus.resumable
        }
        return 0
    }
}
