import Foundation
import PackDelivery
import Synchronization

/// Runs downloads to the end for `fetch`, `resume`, `verify --repair` and `demo`: shows progress, handles
/// Ctrl-C, SIGTERM, SIGHUP and a closed output pipe, finishes the transactions that asked for it, and
/// decides the exit code.
///
/// It keeps, whatever the number of downloads, only what it needs: the ids still running, a count of
/// unsettled downloads per transaction, and the downloads that ended other than finished.
struct RunSession {
    let queue: DownloadQueue
    let global: GlobalOptions

    /// What a run follows: its downloads, and which transactions to finish once their downloads settle.
    struct Follow {
        /// The downloads, by transaction: those of a catalog's 10,000 transactions are followed where they are,
        /// not copied into one array (≈ 5 MB, and twice that while the array grew).
        var downloads: [[Download]]
        /// Transactions to finish when all their followed downloads are finished or cancelled.
        var finishing: Set<String> = []
        /// Also finish every other open transaction that asked for it (`resume`: a fetch killed after its
        /// last download finished still gets finished).
        var finishingAllFinishable = false
        /// Finish these transactions at the end if they asked for it and are finishable then (`resume ID`: the
        /// transactions of the downloads named, as the command that recorded them chose).
        var finishingIfAsked: Set<String> = []

        /// Follow only essential packs (``DeliveryPolicy``): a purchase's run ends once they are installed; its prefetch
        /// packs not yet landed are paused (`interrupted`) with their bytes kept, for `packs resume`, and its on-demand
        /// packs wait for `packs use`.
        var essentialsOnly = false

        /// Follows the essential downloads of `transactions`, and finishes the transactions once they settle if `finishing`.
        init(transactions: [Transaction], finishing: Bool = true) {
            self.downloads = transactions.map(\.downloads)
            self.finishing = finishing ? Set(transactions.map(\.id)) : []
            self.essentialsOnly = true
        }

        /// Follows `downloads`.
        init(downloads: [Download], finishingAllFinishable: Bool, finishingIfAsked: Set<String> = []) {
            self.downloads = [downloads]
            self.finishingAllFinishable = finishingAllFinishable
            self.finishingIfAsked = finishingIfAsked
        }
    }

    /// Signals that stop a run: each pauses the downloads, saves them and exits 130 with one line.
    static let stopSignals = [SIGINT, SIGTERM, SIGHUP, SIGPIPE]

    /// - Parameter start: starts the downloads and says what to follow.
    /// - Returns: the exit code (0, 65, 69, 74, 75, 77 or 130); a stderr line has been printed for non-zero.
    func run(_ start: () throws(PackDeliveryError) -> Follow) async throws(PackDeliveryError) -> Int32 {
        var events: AsyncStream<DownloadQueueEvent>? = self.queue.events()
        let interrupted = Atomic<Bool>(false)
        let queue = self.queue
        let signals = SignalWatch(Self.stopSignals) {
            interrupted.store(true, ordering: .relaxed)
            queue.pauseAll(reason: .user)
        }
        defer { signals.cancel() }

        let display = ProgressDisplay(mode: .init(global: self.global))
        let follow = try start()
        var transactionOf: [String: String] = [:]
        var running = Set<String>()
        var unsettled = Set<String>()
        /// Downloads that ended failed, paused or cancelled, by id (running and finished ones are not kept).
        var notFinished: [String: Download] = [:]
        var summary = RunSummary()
        let clock = TestHooks.clock()
        transactionOf.reserveCapacity(follow.downloads.reduce(0) { $0 + $1.count })
        func record(_ download: Download) {
            if Self.goesOn(download, now: clock()) { running.insert(download.id) } else { running.remove(download.id) }
            if download.state.isSettled { unsettled.remove(download.id) } else { unsettled.insert(download.id) }
            if download.state == .finished || download.state.isRunning {
                notFinished[download.id] = nil
            } else {
                notFinished[download.id] = download
            }
        }
        for download in follow.downloads.joined() where !follow.essentialsOnly || download.delivery == .essential {
            transactionOf[download.id] = download.transactionID
            record(download)
            summary.begin(download)
        }
        if !running.isEmpty, let events {
            for await event in events {
                display.show(event)
                if case .downloadUpdated(let download) = event, transactionOf[download.id] != nil {
                    record(download)
                    summary.update(download)
                    if running.isEmpty { break }
                }
                if Output.broken.load(ordering: .relaxed), !interrupted.exchange(true, ordering: .relaxed) {
                    // The reader of our output went away (SIGPIPE): stop like SIGTERM.
                    queue.pauseAll(reason: .user)
                }
            }
        }
        display.end()
        // Unsubscribe: finishing below reports every transaction again, into a buffer nobody would read
        // (10,000 transactions: ≈ 10 MB).
        events = nil

        // Finish what asked to be finished once its content is installed, in one durable write.
        let blocked = Set(unsettled.compactMap { transactionOf[$0] })
        var finishable = follow.finishing.subtracting(blocked)
        if follow.finishingAllFinishable || !follow.finishingIfAsked.isEmpty {
            for transaction in try await self.queue.transactions() where transaction.autoFinish && transaction.isFinishable {
                if follow.finishingAllFinishable || follow.finishingIfAsked.contains(transaction.id) { finishable.insert(transaction.id) }
            }
        }
        // In batches of 1,000 (each one durable write): finishing reads each transaction back, and 10,000 at once
        // held them all in memory together.
        let ordered = finishable.sorted()
        for start in stride(from: 0, to: ordered.count, by: 1_000) {
            let end = min(start + 1_000, ordered.count)
            display.finished(try await self.queue.finish(Array(ordered[start..<end])), last: end == ordered.count, total: ordered.count)
        }

        display.runEnded(summary.end())
        return Self.exitStatus(left: notFinished.values.sorted { $0.id < $1.id }, interrupted: interrupted.load(ordering: .relaxed))
    }

    /// Whether a run waits for `download`: it waits or runs, or it is a preload whose release date has come that waits
    /// for its key (the queue asks for it, then installs), unless the key was refused.
    static func goesOn(_ download: Download, now: Date) -> Bool {
        if download.state.isRunning { return true }
        guard download.state == .paused, download.pauseReason == .awaitingRelease, download.error == nil else { return false }
        return (download.releaseDate ?? .distantPast) <= now
    }

    /// Says that a signal stopped the run and the downloads `paused` were paused; returns the exit code (130).
    static func interrupted(paused: [String]) -> Int32 {
        let shown = paused.prefix(20).joined(separator: " ") + (paused.count > 20 ? " …" : "")
        printError(
            "packs: Interrupted; the downloads are paused with their data kept. Run packs resume\(paused.isEmpty ? "" : " " + shown) to continue."
        )
        return ExitStatus.interrupted
    }

    /// The run's exit status from the downloads it followed that did not finish, with their one line on stderr:
    /// interrupted (130), the first failure's code, a pause's (resumable, or no permission), else 0.
    private static func exitStatus(left: [Download], interrupted: Bool) -> Int32 {
        if interrupted { return Self.interrupted(paused: left.filter { $0.state == .paused }.map(\.id)) }
        let failed = left.filter { $0.state == .failed }
        if let first = failed.first {
            let error = first.error ?? PackDeliveryError(.internalError, message: "The download \(first.id) failed for no recorded reason.")
            let more = failed.count > 1 ? " (and \(failed.count - 1) more failed downloads; see packs status)" : ""
            printError(ExitStatus.line(for: error, download: first) + more)
            return ExitStatus.code(for: error)
        }
        if let paused = left.first(where: { $0.state == .paused }) {
            if let error = paused.error {
                printError(ExitStatus.line(for: error, download: paused))
                return ExitStatus.code(for: error) == ExitStatus.noPermission ? ExitStatus.noPermission : ExitStatus.resumable
            }
            if paused.pauseReason == .waitingForUnmeteredNetwork {
                printError(
                    "packs: \(paused.id) (\(PackDeliveryError.printable(paused.contentIdentifier)), \(paused.contentLength) bytes) waits for an unmetered connection, its bytes kept. Run packs resume --allow-metered \(paused.id) to fetch it now, or packs resume \(paused.id) once the connection is not metered."
                )
                return ExitStatus.resumable
            }
            if paused.pauseReason == .awaitingRelease {
                let date = paused.releaseDate.map { $0.formatted(.iso8601) } ?? "its release date"
                printError(
                    "packs: \(paused.id) (\(PackDeliveryError.printable(paused.contentIdentifier))) is a preload: its bytes are downloaded and kept encrypted until its release on \(date). Run the same packs fetch again after \(date) to install it, or leave it to packs agent, which installs it then."
                )
                return ExitStatus.resumable
            }
            if paused.pauseReason == .outsideWindow || paused.pauseReason == .quiet {
                let why =
                    paused.pauseReason == .quiet
                    ? "waits while quiet is held (packs quiet lists the holds)"
                    : "is background work and waits for the window packs config schedule sets"
                printError(
                    "packs: \(paused.id) (\(PackDeliveryError.printable(paused.contentIdentifier))) \(why), its bytes kept. Run packs resume \(paused.id) once it may run, or packs config schedule none to lift the window."
                )
                return ExitStatus.resumable
            }
            printError(
                "packs: \(paused.id) (\(PackDeliveryError.printable(paused.contentIdentifier))) is paused (\(paused.pauseReason?.rawValue ?? "user")). Run packs resume \(paused.id) to continue, or packs cancel \(paused.id) to discard it."
            )
            return ExitStatus.resumable
        }
        return 0
    }
}

/// Signals taken from their default action while a command runs: each runs `handler` (on a global queue) instead.
/// Cancelled, they act as before again (SIGPIPE stays ignored, as the process sets it at start).
struct SignalWatch {
    private let numbers: [Int32]
    private let sources: [any DispatchSourceSignal]

    init(_ numbers: [Int32], handler: @escaping @Sendable () -> Void) {
        self.numbers = numbers
        self.sources = numbers.map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler(handler: handler)
            source.resume()
            return source
        }
    }

    func cancel() {
        for source in self.sources { source.cancel() }
        for number in self.numbers where number != SIGPIPE { signal(number, SIG_DFL) }
    }
}
