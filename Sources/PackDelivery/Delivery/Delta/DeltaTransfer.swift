import CLinux
import Foundation
import Synchronization

/// A delta update: builds the new version of an installed pack from the installed files that did not change and
/// the changed entries of the new pack, fetched with HTTP range requests through the transfer engine (so retries,
/// Retry-After, the stall watchdog and the checks of ``ResponseDecision`` apply to them as to any transfer).
///
/// It reports in the transfer engine's vocabulary (`TransferEvent`), so the download's machine treats it as one
/// more kind of transfer:
/// - `.deltaPlanned` first, with what it fetches and reuses;
/// - `.progress` with the bytes fetched so far (kept ones included);
/// - `.finished` with `.assembled` (the tree is in ``tree``), `.deltaRefused` (fetch the whole pack, and why),
///   `.stopped` or `.failed`.
///
/// Before anything else it reads the pack's central directory (its last bytes, with range requests) and
/// requires that the index describes the pack as the directory does, and that each installed file it reuses has
/// the CRC-32 the directory gives its entry: a delta installs the pack's bytes or nothing, so the same manifest
/// installs the same tree with or without it. Any disagreement is the publisher's, and the whole pack is fetched
/// instead (`indexUnusable`), which then installs or fails as it would have anyway.
///
/// Each range is fetched, one after another, into a file of its own in `downloads/<id>.delta/` (a range cut short
/// resumes where it stopped), then split into one small zip per entry by ``DeltaAssembly``, which checks each
/// entry with the unpacker's checks and against the index's SHA-256, and assembles the new version. An entry that
/// does not match is fetched once more, then the download fails naming it, and the installed version is untouched.
/// The ranges carry the validator of the first response: a pack that changed on the server is never mixed.
final class DeltaTransfer: Sendable {
    struct Request: Sendable {
        var id: TransferID
        var download: Download
        var index: Manifest.IndexReference
        /// The installed version; nil for a first install of a chunked tar or tar.zst pack, whose chunks are all
        /// fetched and written straight into the new version's files as they arrive (``ChunkSink``).
        var install: InstallRecord?
        var installedFiles: [InstalledFileRecord]
        /// `downloads/<id>.delta`.
        var folder: URL
        var options: TransferOptions
        var writer: any FileWriting
        var maxEntries: Int
        /// Where the ranges are fetched.
        var engine: TransferEngine
        /// The smallest window from which a first install's consecutive windows share one request (``joinedWindow``).
        var joinedWindow: Int64 = DeltaTransfer.joinedWindow
        /// Folders whose files may hold chunks of the pack (``DownloadQueue/Configuration/seeds``).
        var seeds: [URL] = []
        /// Told of a seed folder dropped because it could not be read (its chunks are fetched instead).
        var onSeedDropped: @Sendable (URL, PackDeliveryError) -> Void = { _, _ in }
    }

    /// The windows from which consecutive windows of a first install share one request: windows of 4 MiB or more
    /// (``ChunkPlan/window(packLength:)`` of a pack of 256 MiB or more). One request has no round trip, no empty pipe
    /// and no wait for the sink to drain between windows (measured, case 10's tar.zst of 515 MiB in windows of 8 MiB:
    /// 1.27 s joined against 1.44 s a request a window), but the server may send the next windows' bytes into the
    /// socket's buffers (a few MiB) ahead of the sink, and a pause or a kill loses them: past windows of 4 MiB that is
    /// about a window. Smaller windows keep a request each, so that a pause loses at most the windows in flight.
    static let joinedWindow: Int64 = 4 << 20

    let request: Request
    private let stopped = Atomic<Bool>(false)
    /// The range request in flight, if any, and the number of the last one made.
    private let ranges = Mutex<(current: TransferID?, made: Int)>((nil, 0))
    private let done = DispatchSemaphore(value: 0)
    /// The tree built, once `.assembled` was reported.
    let tree = Mutex<DeltaTree?>(nil)
    /// The queue's answer to `.deltaPlanned` (``answer(_:)``): nil until it comes, then go on (`.some(nil)`) or the refusal.
    private let answered = Mutex<Download.DeltaFallback??>(nil)
    private let answerArrived = DispatchSemaphore(value: 0)
    /// The download's share of the machine's rate cap, held from its first range request to the end of the run: its
    /// requests come one after another, and each taking a share anew left it to the others between them (a
    /// user-initiated download beside background work got 46 % of the cap, not at least half; case 18).
    private let ticket = Mutex<RateBoard.Ticket?>(nil)

    init(_ request: Request) { self.request = request }

    /// Starts the update on a worker; events arrive in order.
    func start(onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        WorkerPool.shared.run { [self] in
            let outcome = DeltaRun(self, onEvent: onEvent).run()
            if let ticket = self.ticket.withLock({ $0 }) { RateBoard.shared.leave(ticket) }
            if case .assembled = outcome.0 { self.tree.withLock { $0 = outcome.1 } }
            onEvent(.finished(id: self.request.id, outcome: outcome.0))
            self.done.signal()
        }
    }

    /// Asks the update to stop; it reports `.stopped` (or its outcome, when it was ending anyway).
    func stop() {
        let current = self.ranges.withLock { ranges in
            self.stopped.store(true, ordering: .relaxed)
            return ranges.current
        }
        self.answerArrived.signal()
        if let current { self.request.engine.stop(current) }
    }

    /// The queue's answer to the plan the update reported (``TransferEvent/deltaPlanned(id:delta:)``): go on (nil), or
    /// end refused, for this reason, so that the whole pack is fetched instead. The update decides neither.
    func answer(_ refusal: Download.DeltaFallback?) {
        self.answered.withLock { $0 = .some(refusal) }
        self.answerArrived.signal()
    }

    /// Waits for ``answer(_:)``.
    /// - Throws: `DeltaRun.Stop` when the update is stopped first; `DeltaRefusal` when the answer is a refusal.
    func awaitAnswer() throws {
        while true {
            if let answer = self.answered.withLock({ $0 }) {
                if let refusal = answer { throw DeltaRefusal(refusal) }
                return
            }
            if self.isStopped { throw DeltaRun.Stop() }
            _ = self.answerArrived.wait(timeout: .now() + .milliseconds(100))
        }
    }

    /// Stops and waits for the update to end (at close).
    func stopAndWait() {
        self.stop()
        self.done.wait()
        self.done.signal()
    }

    var isStopped: Bool { self.stopped.load(ordering: .relaxed) }

    /// Fetches `bytes` of the pack into `file` (resuming from what it holds) through the engine, and waits.
    /// - Parameter progress: the bytes the file holds, as they arrive, and the response's validator.
    /// - Throws: `TransferFailure` as the engine reports it, or `DeltaRun.Stop`.
    /// - Parameter sink: takes the bytes instead of `file`, which is then not made.
    func fetch(
        _ bytes: Range<Int64>, into file: URL, sink: (any TransferSink)? = nil, validator: String?,
        progress: @escaping @Sendable (Int64, String?) -> Void
    ) throws {
        let download = self.request.download
        try self.fetch(
            download.url, length: bytes.upperBound - bytes.lowerBound,
            range: ByteRange(bytes: bytes, fileLength: download.contentLength), into: file, sink: sink, validator: validator,
            progress: progress)
    }

    /// Fetches the pack's index (`length` bytes, the manifest says) into `file`, from its first byte, through the
    /// engine, and waits: the same transfer path as the pack and its ranges.
    /// - Throws: `TransferFailure` as the engine reports it, or `DeltaRun.Stop`.
    func fetchIndex(_ url: URL, length: Int64, into file: URL) throws {
        unlink(file.path)
        try self.fetch(url, length: length, range: nil, into: file, validator: nil) { _, _ in }
    }

    /// The run's share of the rate cap for its range requests, taken at the first.
    private func rangeTicket() -> RateBoard.Ticket {
        self.ticket.withLock { held in
            if let held { return held }
            let ticket = RateBoard.shared.join(priority: self.request.options.ratePriority)
            held = ticket
            return ticket
        }
    }

    /// One transfer through the engine (a range of the pack, or the whole index), as the delta's next part; waits.
    private func fetch(
        _ url: URL, length: Int64, range: ByteRange?, into file: URL, sink: (any TransferSink)? = nil, validator: String?,
        progress: @escaping @Sendable (Int64, String?) -> Void
    ) throws {
        let finished = Mutex<TransferOutcome?>(nil)
        let ended = DispatchSemaphore(value: 0)
        let id = self.ranges.withLock { ranges -> TransferID? in
            guard !self.isStopped else { return nil }
            ranges.made += 1
            ranges.current = TransferID(download: self.request.id.download, token: self.request.id.token, part: ranges.made)
            return ranges.current
        }
        self.answerArrived.signal()
        guard let id else { throw DeltaRun.Stop() }
        let ticket = range == nil ? nil : self.rangeTicket()
        self.request.engine.start(
            TransferRequest(
                id: id, url: url, file: file, expectedLength: length, validator: validator,
                fromZero: false, options: self.request.options, writer: self.request.writer, range: range,
                report: { event in
                    switch event {
                    case .progress(_, let bytes, let validator): progress(bytes, validator)
                    case .finished(_, let outcome):
                        finished.withLock { $0 = outcome }
                        ended.signal()
                    case .durable, .deltaPlanned: break
                    }
                }, sink: sink, ticket: ticket))
        ended.wait()
        self.ranges.withLock { $0.current = nil }
        switch finished.withLock({ $0 }) {
        case .completed?, .assembled?: return
        case .failed(let failure, _)?: throw failure
        case .stopped?, .deltaRefused?, nil: throw DeltaRun.Stop()
        }
    }
}

/// Hands a first install's range to its ``ChunkSink`` and counts the bytes the sink took.
///
/// It does not hold the transfer back further than the sink does (``ChunkSink/checksInFlight`` checks): measured with
/// case 16b (RESULTS.md), waiting for each write's check before taking the next changed neither the client's nor the
/// server's count past a bad chunk (the server had written the rest of the 1 MiB range to the socket by then).
final class SinkFeed: TransferSink {
    let sink: ChunkSink
    private let taken = Atomic<Int64>(0)

    init(_ sink: ChunkSink) { self.sink = sink }

    /// The bytes the sink took so far.
    var accepted: Int64 { self.taken.load(ordering: .acquiring) }

    func consume(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard self.sink.consume(bytes) else { return false }
        self.taken.add(Int64(bytes.count), ordering: .releasing)
        return true
    }
}

/// Reports a delta's progress, about ten times a second, from the worker and the transfer thread.
final class Reporter: Sendable {
    let id: TransferID
    let onEvent: @Sendable (TransferEvent) -> Void
    let total = Mutex<Int64>(0)
    private let last = Mutex<Date>(.distantPast)

    init(id: TransferID, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        self.id = id
        self.onEvent = onEvent
    }

    func report(_ bytes: Int64, force: Bool) {
        let send = self.last.withLock { last -> Bool in
            let now = Date()
            guard force || now.timeIntervalSince(last) >= 0.1 else { return false }
            last = now
            return true
        }
        if send { self.onEvent(.progress(id: self.id, bytesOnDisk: min(bytes, self.total.withLock { $0 }), validator: nil)) }
    }
}
