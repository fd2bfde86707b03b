import Foundation
import PackDelivery
import Synchronization

/// Runs downloads to the end for `fetch`, `resume`, `verify --repair` and `demo`: shows progress, handles
/// Ctrl-C, SIGTERM, SIGHUP and a closed output pipe, finishes the transactions that asked for it, and
/// decides the exit code.
struct RunSession {
    let queue: DownloadQueue
    let global: GlobalOptions

    /// Signals that stop a run: each pauses the downloads, saves them and exits 130 with one line.
    static let stopSignals = [SIGINT, SIGTERM, SIGHUP, SIGPIPE]

    /// - Parameters:
    ///   - finishingAll: finish every auto-finishing transaction that is finishable, not only those of the followed downloads
    ///     (`resume`: a fetch killed after its last download finished still gets finished).
    ///   - start: starts the downloads and returns the ids to follow.
    /// - Returns: the exit code (0, 65, 69, 74, 75, 77 or 130); a stderr line has been printed for non-zero.
    func run(finishingAll: Bool = false, _ start: () throws(PackDeliveryError) -> [String]) async throws(PackDeliveryError) -> Int32 {
        let events = self.queue.events()
        let interrupted = Atomic<Bool>(false)
        let queue = self.queue
        let signals = Self.stopSignals.map { number in
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
        latest.reserveCapacity(watched.count)
        for transaction in try self.queue.transactions() {
            for download in transaction.downloads where watched.contains(download.id) { latest[download.id] = download }
        }
        // Downloads still running: counted as they settle, so the wait costs nothing per event whatever their number.
        var running = Set(watched.filter { latest[$0]?.state.isRunning ?? false })
        if !running.isEmpty {
            for await event in events {
                display.show(event)
                if case .downloadUpdated(let download) = event, watched.contains(download.id) {
                    latest[download.id] = download
                    if download.state.isRunning { running.insert(download.id) } else { running.remove(download.id) }
                    if running.isEmpty { break }
                }
                if Output.broken.load(ordering: .relaxed), !interrupted.exchange(true, ordering: .relaxed) {
                    // The reader of our output went away (SIGPIPE): stop like SIGTERM.
                    queue.pauseAll(reason: .user)
                }
            }
        }
        display.end()

        // Finish what asked to be finished once its content is installed, in one durable write.
        let finishable = try self.queue.transactions().filter { transaction in
            transaction.autoFinish && transaction.isFinishable
                && (finishingAll || transaction.downloads.contains(where: { watched.contains($0.id) }))
        }
        if !finishable.isEmpty {
            try self.queue.finish(finishable.map(\.id))
            for var transaction in finishable {
                transaction.finishedAt = Date()
                display.finished(transaction)
            }
        }

        let downloads = watched.compactMap { latest[$0] }.sorted { $0.id < $1.id }
        if interrupted.load(ordering: .relaxed) {
            let paused = downloads.filter { $0.state == .paused }.map(\.id)
            let shown = paused.prefix(20).joined(separator: " ") + (paused.count > 20 ? " …" : "")
            printError("packs: Interrupted; the downloads are paused with their data kept. Run packs resume\(paused.isEmpty ? "" : " " + shown) to continue.")
            return ExitStatus.interrupted
        }
        let failed = downloads.filter { $0.state == .failed }
        if let first = failed.first {
            let error = first.error ?? PackDeliveryError(.internalError, message: "The download \(first.id) failed for no recorded reason.")
            let more = failed.count > 1 ? " (and \(failed.count - 1) more failed downloads; see packs status)" : ""
            printError(ExitStatus.line(for: error, download: first) + more)
            return ExitStatus.code(for: error)
        }
        if let paused = downloads.first(where: { $0.state == .paused }) {
            if let error = paused.error {
                printError(ExitStatus.line(for: error, download: paused))
                return ExitStatus.code(for: error) == ExitStatus.noPermission ? ExitStatus.noPermission : ExitStatus.resumable
            }
            printError("packs: \(paused.id) (\(paused.contentIdentifier)) is paused (\(paused.pauseReason?.rawValue ?? "user")). Run packs resume \(paused.id) to continue, or packs cancel \(paused.id) to discard it.")
            return ExitStatus.resumable
        }
        return 0
    }
}
