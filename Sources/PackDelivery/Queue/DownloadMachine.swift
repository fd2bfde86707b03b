import Foundation

/// The decisions for one download, as a value type: events in, actions out, no I/O.
///
/// The driver (``DownloadQueue``) runs the actions. Every piece of work it starts carries the
/// machine's current `token`; events from older work (a transfer stopped by a pause, a retry timer
/// of an earlier attempt) carry an older token and change nothing.
///
/// Its types (actions, stages, the retry policy) are in `DownloadMachine+Types.swift`. Its events and transitions stay
/// in this one file, past 600 lines: they set state whose setters are private (the stage, the bytes kept, each
/// source's failures), and Swift's `private` does not reach an extension in another file; making those setters
/// internal would let any code of the module change a download's stage without an event.
struct DownloadMachine: Sendable, Hashable {
    private(set) var stage: Stage
    /// The download without what the stage decides (identity, URL, bytes, progress, delta).
    private var base: Download
    var validator: String?
    var retriedFromZero: Bool
    private(set) var archive: Archive
    /// The host can renew credentials (a provider is configured): a refusal (401, 403) is tried once more with fresh ones.
    var credentialsRenewable = false
    var stagingInode: Int64?
    /// Failed attempts since bytes kept last reached a new high.
    private(set) var attempt = 0
    /// The token of the newest work; every stop, pause, retry and failure takes a new one.
    private(set) var token = 0
    /// The most bytes the partial file ever held: an attempt that ends below it made no progress, whatever it received.
    private(set) var mostBytesKept: Int64 = 0
    /// Bytes of the partial file known to be on disk (synced): what a checkpoint records.
    private(set) var durableBytes: Int64
    /// The token of a transfer stopped by a pause that has not yet said how many bytes it kept: its final byte count
    /// still counts, whatever the stage is by then, and a `paused` stage is not reported until it came (``reportable``).
    /// Held here only, not in the stage: a resume before the stopped transfer ends leaves the stage but not this.
    private(set) var stoppedTransfer: Int?
    /// An install (which owns the staging folder) was started and has not returned. This is work in flight, not a
    /// stage: a download may be paused, cancelled or waiting to retry while a stopped install winds down.
    private(set) var installOutstanding = false
    /// What only a download that runs (or ran) needs, out of line: until it first starts, every machine shares one
    /// (``Running/idle``), so that a queue of 100,000 waiting downloads does not hold ≈ 300 unused bytes for each.
    private var running: OutOfLine<Running>

    /// The state a download gathers once it runs: see ``DownloadMachine/running``.
    private struct Running: Sendable, Hashable {
        var remedies = Remedies()
        var lastMovement = Date.distantPast
        var rate = RateEstimator()
        var sourceFailures: [URL: PackDeliveryError] = [:]
        var badSources: Set<URL> = []
        var sourceRetries: [URL: Int] = [:]
        var facts = DeliveryFacts.none

        /// Shared by every machine that has not run.
        static let idle = OutOfLine(Running())
    }

    let retryPolicy: RetryPolicy
    private(set) var remedies: Remedies {
        get { self.running.value.remedies }
        _modify { yield &self.running.value.remedies }
    }
    /// When bytes or phase progress last moved (for the watchdog).
    private(set) var lastMovement: Date {
        get { self.running.value.lastMovement }
        _modify { yield &self.running.value.lastMovement }
    }
    private var rate: RateEstimator {
        get { self.running.value.rate }
        _modify { yield &self.running.value.rate }
    }
    /// The last error of each source that failed since the download last started on its first good source: once every
    /// source has one, the attempt counts as failed (and the error lists them all).
    private(set) var sourceFailures: [URL: PackDeliveryError] {
        get { self.running.value.sourceFailures }
        _modify { yield &self.running.value.sourceFailures }
    }
    /// Sources that served bytes other than the pack's: never asked again while this machine lives (this run).
    private(set) var badSources: Set<URL> {
        get { self.running.value.badSources }
        _modify { yield &self.running.value.badSources }
    }
    /// Retries after a 5xx each source had in this round (``RetryPolicy/sourceRetries`` at most).
    private(set) var sourceRetries: [URL: Int] {
        get { self.running.value.sourceRetries }
        _modify { yield &self.running.value.sourceRetries }
    }
    /// What the driver gathered when the queue last admitted the download: its transfers' plans are decided from them.
    private(set) var facts: DeliveryFacts {
        get { self.running.value.facts }
        _modify { yield &self.running.value.facts }
    }

    init(
        download: Download, validator: String? = nil, retriedFromZero: Bool = false, archive: Archive = .partial,
        stagingInode: Int64? = nil, retryPolicy: RetryPolicy = RetryPolicy()
    ) {
        self.base = download
        self.validator = validator
        self.retriedFromZero = retriedFromZero
        self.archive = archive
        self.stagingInode = stagingInode
        self.retryPolicy = retryPolicy
        self.running = Running.idle
        self.mostBytesKept = download.bytesReceived
        self.durableBytes = download.bytesReceived
        switch download.state {
        // A download that was running when its machine was made (taken over) waits for a slot again.
        case .waiting, .active: self.stage = .waiting
        case .paused: self.stage = .paused(download.pauseReason ?? .interrupted, error: download.error)
        case .failed:
            self.stage = .failed(download.error ?? PackDeliveryError(.stalled, message: "The download failed in an earlier process."))
        case .finished: self.stage = .finished(contentURL: download.contentURL)
        case .cancelled: self.stage = .cancelled
        }
    }

    /// The download as the store and observers see it.
    var download: Download {
        var download = self.base
        download.state = self.stage.state
        download.phase = self.stage.phase
        download.error = self.stage.error
        download.pauseReason = nil
        download.retryDate = nil
        switch self.stage {
        case .transferring: break  // the estimate of the running transfer
        case .finished(let url):
            download.contentURL = url
            download.timeRemaining = 0
            download.bytesPerSecond = nil
        case .paused(let reason, _):
            download.pauseReason = reason
            download.timeRemaining = -1
            download.bytesPerSecond = nil
        case .waitingToRetry(_, let until, _, _, _):
            download.retryDate = until
            download.timeRemaining = -1
            download.bytesPerSecond = nil
        case .waiting, .reloadingManifest, .installing, .failed, .cancelled:
            download.timeRemaining = -1
            download.bytesPerSecond = nil
        }
        return download
    }

    var state: DownloadState { self.stage.state }
    /// Whether the download, as it is now, may be reported: not while a pause waits to hear how many bytes the
    /// transfer it stopped kept (its first `paused` update must not under-report them).
    var reportable: Bool {
        if case .paused = self.stage, self.stoppedTransfer != nil { return false }
        return true
    }
    /// The archive is complete and matched its SHA-256.
    var verified: Bool { self.archive != .partial }
    /// The verification was recorded by an earlier process: the installer hashes the archive again.
    var recheckArchive: Bool { self.archive == .verifiedEarlier }
    /// The next request asks the provider for fresh credentials (``CredentialRequest/refused``).
    var credentialsRefused: Bool { self.remedies.renewal == .asking }
    /// A delta update was refused for this download: the whole pack is fetched (the reason is in `download.deltaFallback`).
    var deltaRefused: Bool { self.base.deltaFallback != nil }

    // MARK: Events

    /// The scheduler gives the download a slot: waiting → active. Its transfers are planned from `facts`; a pack with
    /// several sources whose first bytes are still to come starts at the source they prefer (the fastest measured,
    /// or one never measured, as a probe).
    mutating func start(facts: DeliveryFacts = .none, now: Date = Date()) -> [Action] {
        guard case .waiting = self.stage else { return [] }
        self.facts = facts
        self.token += 1
        self.rate = RateEstimator()
        self.attempt = 0
        self.lastMovement = now
        self.sourceFailures = [:]
        if self.verified { return self.beginInstall(phase: .unpacking, error: nil) }
        if let preferred = facts.preferredSource, self.base.bytesReceived == 0, self.sourceRetries.isEmpty,
            !self.badSources.contains(preferred), self.base.sources?.contains(preferred) == true
        {
            self.use(preferred)
        }
        return self.beginTransfer(error: nil, fromZero: false)
    }

    /// How a transfer that starts now with `facts` delivers the pack.
    func plan(with facts: DeliveryFacts, fromZero: Bool = false) -> DeliveryPlan {
        var download = self.base
        download.index = download.indexAtSource
        return DeliveryPlan.decide(for: download, facts: facts, deltaRefused: self.deltaRefused, fromZero: fromZero)
    }

    /// Bytes known good on disk, from the running transfer.
    mutating func progress(token: Int, bytesOnDisk: Int64, validator: String?, now: Date = Date()) -> Bool {
        guard case .transferring(token, let error) = self.stage else { return false }
        if bytesOnDisk != self.base.bytesReceived {
            // The download moves again: the previous attempt's error is past, even when the bytes started over from
            // zero (a server that ignored the range) and are still below what the failed attempt had.
            self.lastMovement = now
            if error != nil { self.stage = .transferring(token: token, error: nil) }
        }
        // New bytes kept: refusals may be answered afresh.
        if bytesOnDisk > self.base.bytesReceived { self.remedies = Remedies() }
        self.rate.add(bytes: bytesOnDisk, at: now)
        self.base.bytesReceived = bytesOnDisk
        // During a delta update, the bytes fetched so far with its range requests.
        self.base.delta?.bytesFetched = bytesOnDisk
        self.validator = validator ?? self.validator
        self.base.progress = self.fraction(bytesOnDisk)
        self.base.timeRemaining = self.rate.timeRemaining(remaining: self.bytesToFetch - bytesOnDisk)
        self.base.bytesPerSecond = self.rate.bytesPerSecond
        return true
    }

    /// The unpack that follows the transfer wrote `bytes`: while downloading, `phaseProgress` is the unpack's.
    mutating func streamProgress(token: Int, bytes: Int64, now: Date = Date()) {
        guard case .transferring(token, _) = self.stage else { return }
        let expected = max(1, self.base.unpackedLength ?? self.base.contentLength)
        self.base.phaseProgress = min(0.99, Double(bytes) / Double(expected))
    }

    /// A delta update knows what it fetches, and waits for the answer: it goes on, and progress counts those bytes from
    /// now on; or it is refused (``DeliveryPlan/refusal(of:packLength:)``) and ends with `.deltaRefused`, after which the
    /// whole pack is fetched.
    mutating func deltaPlanned(token: Int, delta: Download.Delta, now: Date = Date()) -> [Action] {
        guard case .transferring(token, _) = self.stage else { return [] }
        if let refusal = DeliveryPlan.refusal(of: delta, packLength: self.base.contentLength) {
            return [.answerDeltaPlan(token: token, refusal: refusal)]
        }
        self.lastMovement = now
        self.base.delta = delta
        self.base.deltaFallback = nil
        self.rate = RateEstimator()
        self.mostBytesKept = delta.bytesKept
        self.durableBytes = delta.bytesKept
        self.base.bytesReceived = delta.bytesKept
        self.base.progress = self.fraction(delta.bytesKept)
        return [.answerDeltaPlan(token: token, refusal: nil)]
    }

    /// The hash thread synced the partial file up to `bytes`.
    mutating func durable(token: Int, bytes: Int64) {
        guard case .transferring(token, _) = self.stage else { return }
        self.durableBytes = min(bytes, self.base.bytesReceived)
    }

    /// A transfer attempt ended.
    mutating func transferFinished(
        token: Int, outcome: TransferOutcome, jitter: Double = Double.random(in: 0...1), now: Date = Date()
    ) -> [Action] {
        if case .stopped(let bytes) = outcome, token == self.stoppedTransfer {
            // The transfer a pause stopped: its last bytes are kept, so say so.
            self.stoppedTransfer = nil
            self.keep(bytes)
            return []
        }
        if token == self.stoppedTransfer, case .paused = self.stage {
            // The transfer the pause stopped had ended on its own just before (the stop found nothing running): what it
            // kept is what its ending says, and the pause is reported now. The download stays paused.
            self.stoppedTransfer = nil
            switch outcome {
            case .failed(_, let bytes): self.keep(bytes, durable: false)
            case .completed(_, let length, _): self.keep(length)
            case .stopped, .assembled, .deltaRefused: break
            }
            return []
        }
        // The stopped transfer ended on its own after a resume: it says nothing more (its bytes are the next attempt's).
        if token == self.stoppedTransfer { self.stoppedTransfer = nil }
        guard case .transferring(token, let previous) = self.stage else { return [] }
        self.lastMovement = now
        // The fresh credentials this transfer asked for (if it did) have been used: later requests do not ask again.
        if self.remedies.renewal == .asking { self.remedies.renewal = .asked }
        switch outcome {
        case .stopped(let bytes):
            self.base.bytesReceived = bytes
            self.durableBytes = bytes
            return []
        case .assembled(let fetched):
            // Each entry was checked against the index's SHA-256: the new version waits in the delta's folder.
            self.base.bytesReceived = fetched
            self.base.delta?.bytesFetched = fetched
            return self.checked()
        case .deltaRefused(let fallback):
            // Fetch the whole pack instead, saying why.
            self.base.delta = nil
            self.base.deltaFallback = fallback
            self.forgetBytes()
            self.durableBytes = 0
            self.rate = RateEstimator()
            self.token += 1
            return self.beginTransfer(error: previous, fromZero: false)
        case .completed(let sha256, let length, let resumedFrom):
            self.base.bytesReceived = length
            if length == self.base.contentLength, sha256.lowercased() == self.base.sha256.lowercased() {
                self.archive = .verified
                // Hashed while the bytes arrived: verifying is the comparison just made; the installer moves on to unpacking.
                return self.checked()
            }
            self.forgetBytes()
            if resumedFrom > 0, !self.retriedFromZero {
                // A resumed file may have mixed two versions of the pack: fetch once more from zero.
                self.retriedFromZero = true
                self.token += 1
                return self.beginTransfer(error: previous, fromZero: true)
            }
            let error = PackDeliveryError(
                .checksumMismatch,
                message:
                    "The pack \(self.base.contentIdentifier) from \(self.base.url.redacted) has SHA-256 \(sha256), but the manifest says \(self.base.sha256).",
                hint: "Nothing was installed; the manifest or the pack on the server is wrong.", subject: self.base.url.redacted)
            // Fetched whole from this one source and still wrong: this source serves other bytes. Another may not.
            self.badSources.insert(self.base.url)
            if let next = self.nextSource(after: error) {
                self.use(next)
                self.token += 1
                return [.deleteFiles(staging: true)] + self.beginTransfer(error: error, fromZero: true)
            }
            return self.fail(self.allSourcesFailed(error)) + [.deleteFiles(staging: true)]
        case .failed(let failure, let bytes):
            self.keep(bytes, durable: false)
            return self.transferFailed(failure, bytes: bytes, jitter: jitter, now: now)
        }
    }

    /// The backoff delay of a retry has passed.
    mutating func retryDue(token: Int, now: Date = Date()) -> [Action] {
        guard case .waitingToRetry(token, _, let error, _, let source) = self.stage else { return [] }
        self.lastMovement = now
        if self.verified { return self.beginInstall(phase: .unpacking, error: error) }
        // A retry of one source goes on at it; otherwise a new round over the sources, from the first that did not
        // serve wrong bytes.
        if source == nil {
            self.sourceFailures = [:]
            self.sourceRetries = [:]
            if let first = self.base.sources?.first(where: { !self.badSources.contains($0) }) { self.use(first) }
        }
        return self.beginTransfer(error: error, fromZero: false)
    }

    /// The manifest was read again: the pack's URL in it (its SHA-256 and length unchanged), or why not.
    mutating func manifestReloaded(
        token: Int, result: Result<URL, PackDeliveryError>, jitter: Double = Double.random(in: 0...1), now: Date = Date()
    ) -> [Action] {
        guard case .reloadingManifest(token, let original) = self.stage else { return [] }
        self.lastMovement = now
        switch result {
        case .success(let url):
            // Continue from the kept bytes at the (maybe new) URL, with the credentials as they are: fresh ones were asked
            // for already if the server refused (another refusal pauses).
            self.base.url = url
            return self.beginTransfer(error: original, fromZero: false)
        case .failure(let why):
            let bytes = self.base.bytesReceived
            let kept = bytes > 0 ? " The \(bytes) bytes downloaded are kept." : ""
            if original.code == .unauthorized {
                self.remedies.renewal = .notAsked
                return self.enterPaused(
                    .unauthorized,
                    error: original.withHint(
                        "Renew the receipt or credentials, then resume; reading the manifest again did not help: \(why.message)\(kept)"))
            }
            let error = original.withHint("\(original.hint.map { $0 + " " } ?? "")Reading the manifest again did not help: \(why.message)")
            return self.fail(error)
        }
    }

    /// The installer moved on to a phase, or along it.
    mutating func installProgress(token: Int, phase: DownloadPhase, fraction: Double, now: Date = Date()) -> Bool {
        guard case .installing(token, let before, let afterPrevious, let error) = self.stage else { return false }
        self.lastMovement = now
        // The previous attempt's error (or the watchdog's warning) stays until the install moves on.
        let moved = phase != before || max(0, min(1, fraction)) != self.base.phaseProgress
        self.stage = .installing(token: token, phase: phase, afterPrevious: afterPrevious, error: moved ? nil : error)
        self.base.phaseProgress = max(0, min(1, fraction))
        return true
    }

    /// The installer put the content in place; nothing is recorded yet. The order to commit carries what it installed and
    /// the row to record with it: this download as it is once the success is taken (whatever the stage: an install that
    /// completed before a stop reached it is finished too). The stage moves when the commit returns
    /// (``installFinished(token:result:now:)``), so what observers see finished is recorded.
    func installed(token: Int, pack: InstalledPack, now: Date = Date()) -> [Action] {
        var finished = self
        _ = finished.installFinished(token: token, result: .success(pack.contentURL), now: now)
        return [.commitInstall(token: token, pack: pack, finished: finished)]
    }

    /// The installer is done and its result recorded (the content in place), or an error.
    mutating func installFinished(token: Int, result: Result<URL, PackDeliveryError>, now: Date = Date()) -> [Action] {
        let outstanding = self.installOutstanding
        self.installOutstanding = false
        guard case .installing(token, _, _, _) = self.stage else {
            return self.stoppedInstallReturned(result, outstanding: outstanding, now: now)
        }
        switch result {
        case .success(let url):
            self.finish(at: url)
            return []
        case .failure(let error) where error.code == .insufficientStorage:
            return self.enterPaused(.insufficientStorage, error: error)
        case .failure(let error) where error.code == .cancelled:
            return []
        case .failure(let error) where error.code == Installer.awaitingRelease:
            return self.enterPaused(.awaitingRelease, error: nil)
        case .failure(let error) where error.code == .fileSystem && error.underlying == .init(.errno, Int(ENOENT)) && self.verified:
            // The archive went missing under the queue's feet: fetch it again rather than fail for good.
            self.archive = .partial
            self.forgetBytes()
            return self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error) where error.code == .checksumMismatch:
            // The archive on disk is not what was verified (damaged by a crash or by something else): fetch it again.
            self.archive = .partial
            self.forgetBytes()
            return [.deleteFiles(staging: false)] + self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error) where error.kind == .io:
            // A local failure (descriptors, database busy): the archive stays verified; retry, then fail with the cause.
            return self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error):
            self.archive = .partial
            self.forgetBytes()
            return self.fail(error) + [.deleteFiles(staging: true)]
        }
    }

    /// Twice a second: an active download whose bytes and phase progress have not moved for the
    /// watchdog's time is stopped and retried, and fails once the attempts run out.
    mutating func tick(now: Date) -> [Action] {
        guard now.timeIntervalSince(self.lastMovement) > self.retryPolicy.watchdog else { return [] }
        let stop: Action
        let phase: DownloadPhase
        switch self.stage {
        case .transferring(let token, _):
            stop = .stopTransfer(token: token)
            phase = .downloading
        case .installing(let token, .installing, let afterPrevious, _):
            // The move and the record are short and not interruptible; keep waiting, but say so.
            self.lastMovement = now
            self.stage = .installing(token: token, phase: .installing, afterPrevious: afterPrevious, error: self.stalled(.installing))
            return []
        case .installing(_, let installPhase, _, _):
            stop = .stopInstall
            phase = installPhase
        case .waiting, .waitingToRetry, .reloadingManifest, .paused, .failed, .finished, .cancelled:
            return []
        }
        return [stop] + self.retryOrFail(self.stalled(phase), retryable: true, retryAfter: nil, jitter: 0.5, now: now)
    }

    /// Pause, by the user, a shutdown or because the disk is full. Moving into place is too short to interrupt.
    ///
    /// A user's pause of a download paused for space makes it the user's: space that returns does not resume it.
    mutating func pause(_ reason: PauseReason, error: PackDeliveryError? = nil) -> [Action] {
        let stop: [Action]
        switch self.stage {
        case .waiting, .reloadingManifest: stop = []
        case .transferring(let token, _):
            self.stoppedTransfer = token
            return [.stopTransfer(token: token)] + self.enterPaused(reason, error: error)
        case .installing(_, .installing, _, _): return []
        case .installing, .waitingToRetry: stop = self.stopOutstandingInstall
        case .paused(.insufficientStorage, _) where reason == .insufficientStorage || reason == .user:
            return self.enterPaused(reason, error: error)
        case .paused, .failed, .finished, .cancelled: return []
        }
        return stop + self.enterPaused(reason, error: error)
    }

    /// Resume a paused or failed download: it waits for a slot and keeps the bytes it has.
    mutating func resume() -> [Action] {
        switch self.stage {
        case .paused: break
        case .failed: self.retriedFromZero = false
        case .waiting, .transferring, .waitingToRetry, .reloadingManifest, .installing, .finished, .cancelled: return []
        }
        // Renewed credentials or a fixed server: a refusal may ask for fresh credentials and read the manifest again.
        // (Written only when changed: a machine that never ran keeps sharing the idle state, ``Running/idle``.)
        if self.remedies != Remedies() { self.remedies = Remedies() }
        self.stage = .waiting
        return []
    }

    /// The connection is not metered any more, or metered use was allowed: a download paused for it waits for a slot;
    /// any other stays as it is.
    mutating func networkReturned() -> [Action] { self.released(from: .waitingForUnmeteredNetwork) }

    /// What the machine's policy held a download paused for (the network, the window, quiet) holds it no more: it waits
    /// for a slot, and admission checks the policy again. Any other pause stays as it is.
    mutating func released(from reason: PauseReason) -> [Action] {
        guard reason.isPolicyHold, case .paused(reason, _) = self.stage else { return [] }
        return self.resume()
    }

    /// Enough space is free again: a download paused for space waits for a slot; any other stays as it is.
    mutating func spaceReturned() -> [Action] {
        guard case .paused(.insufficientStorage, _) = self.stage else { return [] }
        return self.resume()
    }

    /// Cancel: stop whatever runs and delete the partial data. Finished downloads and a move in progress stay.
    mutating func cancel() -> [Action] {
        var actions: [Action]
        switch self.stage {
        case .finished, .cancelled, .installing(_, .installing, _, _): return []
        case .transferring(let token, _): actions = [.stopTransfer(token: token)]
        case .installing, .waitingToRetry: actions = self.stopOutstandingInstall
        case .waiting, .reloadingManifest, .paused, .failed: actions = []
        }
        // A running install owns the staging folder until it returns; it is removed then. The bytes of a transfer
        // stopped by an earlier pause no longer count.
        self.stoppedTransfer = nil
        actions.append(.deleteFiles(staging: !self.installOutstanding))
        self.token += 1
        self.archive = .partial
        self.forgetBytes()
        self.stage = .cancelled
        return actions
    }

    /// A new priority: it decides where the download waits for a slot (``QueueMachine``), nothing else.
    mutating func setPriority(_ priority: DownloadPriority) -> [Action] {
        self.base.priority = priority
        return []
    }

    /// Ends the download as failed with an error from outside the machine (the store could not record it);
    /// a paused download stays paused, with the error.
    mutating func abort(_ error: PackDeliveryError) -> [Action] {
        let stop: [Action]
        switch self.stage {
        case .paused(let reason, nil):
            self.stage = .paused(reason, error: error)
            return []
        case .paused, .failed, .finished, .cancelled: return []
        case .waiting, .reloadingManifest, .installing(_, .installing, _, _): stop = []
        case .transferring(let token, _): stop = [.stopTransfer(token: token)]
        case .installing, .waitingToRetry: stop = self.stopOutstandingInstall
        }
        return stop + self.fail(error)
    }

    // MARK: Transitions

    /// Stops the install still running for this download, if any (it owns the staging folder until it returns).
    private var stopOutstandingInstall: [Action] { self.installOutstanding ? [.stopInstall] : [] }

    private mutating func transferFailed(_ failure: TransferFailure, bytes: Int64, jitter: Double, now: Date) -> [Action] {
        var failure = failure
        if failure.error.code == .insufficientStorage { return self.enterPaused(.insufficientStorage, error: failure.error) }
        if Self.isSourceFailure(failure.error), self.base.sources != nil {
            if failure.error.code == .checksumMismatch || failure.error.code == .lengthMismatch { self.badSources.insert(self.base.url) }
            if let retry = self.retrySource(failure, bytes: bytes, jitter: jitter, now: now) { return retry }
            if let next = self.nextSource(after: failure.error) {
                // Continue from the kept bytes at the next source, at once: it is another server, so no backoff.
                if bytes > self.mostBytesKept { self.attempt = 0 }
                self.mostBytesKept = max(self.mostBytesKept, bytes)
                self.use(next)
                self.token += 1
                return self.beginTransfer(error: failure.error, fromZero: false)
            }
            // Every source failed in this round: one failed attempt, whose error lists them all.
            failure.error = self.allSourcesFailed(failure.error)
            if self.base.sources?.allSatisfy(self.badSources.contains) == true { failure.retryable = false }
        }
        if failure.error.code == .unauthorized {
            if self.credentialsRenewable, self.remedies.renewal == .notAsked {
                // Ask for fresh credentials (a token that expired), and try again at once.
                self.remedies.renewal = .asking
                return self.retryOrFail(failure.error, retryable: true, retryAfter: 0, jitter: 0, now: now)
            }
            if !self.remedies.manifestReread { return self.reloadManifest(after: failure.error) }
            // Nothing helps until the host renews the credentials: keep the bytes and wait for a resume.
            self.remedies.renewal = .notAsked
            return self.enterPaused(.unauthorized, error: failure.error)
        }
        if StreamedUnpack.isHostile(failure.error) {
            // Unpacked while downloading, the pack showed an entry that is never installed: nothing is kept.
            self.archive = .partial
            self.forgetBytes()
            return self.fail(failure.error) + [.deleteFiles(staging: true)]
        }
        if failure.error.httpStatus == 404 || failure.error.httpStatus == 410, !self.remedies.manifestReread {
            // The pack is not at its URL any more: the manifest may name its new place.
            return self.reloadManifest(after: failure.error)
        }
        // Only new bytes kept reset the count: a server that sends the same bytes again and again
        // (then throws them away) or trickles them too slowly still runs out of attempts.
        if bytes > self.mostBytesKept, !failure.countsAlways { self.attempt = 0 }
        self.mostBytesKept = max(self.mostBytesKept, bytes)
        return self.retryOrFail(failure.error, retryable: failure.retryable, retryAfter: failure.retryAfter, jitter: jitter, now: now)
    }

    /// An install that was stopped (or replaced) has returned: the staging folder is free again.
    private mutating func stoppedInstallReturned(_ result: Result<URL, PackDeliveryError>, outstanding: Bool, now: Date) -> [Action] {
        if case .success(let url) = result, outstanding {
            if case .finished = self.stage { return [] }
            // It completed before the stop reached it: the content is in place and recorded, so it is finished.
            self.token += 1
            self.finish(at: url)
            return []
        }
        switch self.stage {
        // The installing stage is entered only once the bytes are checked (a verified archive, or a delta's tree).
        case .installing(let token, let phase, afterPrevious: true, let error) where outstanding:
            self.stage = .installing(token: token, phase: phase, afterPrevious: false, error: error)
            self.installOutstanding = true
            self.lastMovement = now
            return [.install(token: token)]
        case .cancelled where outstanding:
            return [.deleteFiles(staging: true)]
        default:
            return []
        }
    }

    /// The running transfer is much slower than another source measured: it stops, and goes on from the kept bytes at
    /// `source` (aria2's feedback: a slow source counts as failed for this round). Nothing happens for stale tokens, a
    /// source that served wrong bytes, or one the pack does not list.
    mutating func moveSource(token: Int, to source: URL, because error: PackDeliveryError) -> [Action] {
        guard case .transferring(token, _) = self.stage, source != self.base.url, !self.badSources.contains(source),
            self.base.sources?.contains(source) == true
        else { return [] }
        self.sourceFailures[self.base.url] = error
        self.use(source)
        self.token += 1
        self.rate = RateEstimator()
        return [.stopTransfer(token: token)] + self.beginTransfer(error: nil, fromZero: false)
    }

    /// Whether an error says something about the source rather than the pack or this machine: a network failure, an
    /// HTTP error or refusal, a stall or a trickle, another length, wrong bytes. Another source may do better.
    static func isSourceFailure(_ error: PackDeliveryError) -> Bool {
        switch error.kind {
        case .network, .unauthorized: true
        case .badData: error.code == .lengthMismatch || error.code == .checksumMismatch
        case .usage, .io, .insufficientStorage, .cancelled: false
        }
    }

    /// A 5xx is the source's passing trouble (overloaded, restarting): it is asked again, after the policy's backoff, up to
    /// ``RetryPolicy/sourceRetries`` times in a round, before the next source is tried; the bytes kept stay. Nil when the
    /// failure is not a 5xx, the source's retries are used up, or the server asks to wait longer than the policy's delay
    /// cap (another source is better than waiting). Other failures (no connection, 404/410, a stall, a trickle, wrong
    /// bytes) move on at once.
    private mutating func retrySource(_ failure: TransferFailure, bytes: Int64, jitter: Double, now: Date) -> [Action]? {
        let source = self.base.url
        let used = self.sourceRetries[source, default: 0]
        guard failure.retryable, let status = failure.error.httpStatus, (500...599).contains(status),
            used < self.retryPolicy.sourceRetries, (failure.retryAfter ?? 0) <= self.retryPolicy.maxDelay
        else { return nil }
        self.sourceRetries[source] = used + 1
        if bytes > self.mostBytesKept { self.attempt = 0 }
        self.mostBytesKept = max(self.mostBytesKept, bytes)
        self.token += 1
        let delay = self.retryPolicy.delay(attempt: used + 1, retryAfter: failure.retryAfter, jitter: jitter)
        let phase = self.stage.phase ?? .downloading
        self.stage = .waitingToRetry(
            token: self.token, until: now.addingTimeInterval(delay), error: failure.error, phase: phase, source: source)
        return [.scheduleRetry(token: self.token, after: delay)]
    }

    /// Records `error` as the current source's last, and returns the next source to try in this round: the first one
    /// after the current (in order, wrapping) that neither failed in this round nor served wrong bytes; nil when none is left.
    private mutating func nextSource(after error: PackDeliveryError) -> URL? {
        guard let sources = self.base.sources else { return nil }
        self.sourceFailures[self.base.url] = error
        // A server that did not answer (no connection, silence, a trickle) would not answer at its other URLs either:
        // they fail with it in this round, so that a silent origin costs one stall timeout, whatever number of URLs
        // lead to it (issue 43: 272 URLs of one silent server took 329 s with a stall timeout of 1 s).
        if Self.isOriginFailure(error) {
            let origin = Download.origin(self.base.url)
            for source in sources where self.sourceFailures[source] == nil && Download.origin(source) == origin {
                self.sourceFailures[source] = error
            }
        }
        let start = (sources.firstIndex(of: self.base.url) ?? -1) + 1
        for offset in 0..<sources.count {
            let candidate = sources[(start + offset) % sources.count]
            if self.sourceFailures[candidate] == nil, !self.badSources.contains(candidate) { return candidate }
        }
        return nil
    }

    /// Whether an error says the source's server did not answer, rather than that it refused this one URL: no
    /// connection, a timeout or stall, a trickle, a broken connection; never an HTTP status.
    static func isOriginFailure(_ error: PackDeliveryError) -> Bool {
        guard error.httpStatus == nil else { return false }
        switch error.code {
        case .networkUnreachable, .timedOut, .tooSlow, .networkFailure, .stalled: return true
        default: return false
        }
    }

    /// Moves the download to another source. A validator belongs to the source it came from (mirrors give their own
    /// ETags), so it is dropped: the next source is asked for the rest without If-Range, and the pack's length and
    /// SHA-256 decide whether the bytes from both make the pack.
    private mutating func use(_ source: URL) {
        guard source != self.base.url else { return }
        self.base.url = source
        self.validator = nil
    }

    /// The error after every source failed: the last one's code, status and hint, with each distinct failure, briefly:
    /// the sources of one origin that failed alike (the same code and status) once, with their number, and at most
    /// ``listedFailures`` of them, so that the line stays short whatever number of sources a pack lists.
    private func allSourcesFailed(_ last: PackDeliveryError) -> PackDeliveryError {
        guard let sources = self.base.sources else { return last }
        var failures = self.sourceFailures
        failures[self.base.url] = last
        var groups: [(key: String, source: URL, error: PackDeliveryError, count: Int)] = []
        for source in sources {
            guard let error = failures[source] else { continue }
            let key = "\(Download.origin(source)) \(error.code) \(error.httpStatus ?? 0)"
            if let at = groups.firstIndex(where: { $0.key == key }) {
                groups[at].count += 1
            } else {
                groups.append((key, source, error, 1))
            }
        }
        let count = groups.reduce(0) { $0 + $1.count }
        var each = groups.prefix(Self.listedFailures).map { group -> String in
            let message = group.error.message.count > 160 ? String(group.error.message.prefix(157)) + "…" : group.error.message
            return "\(Download.sourceName(group.source)): \(message)" + (group.count > 1 ? " (×\(group.count))" : "")
        }
        if groups.count > Self.listedFailures {
            let more = groups.dropFirst(Self.listedFailures).reduce(0) { $0 + $1.count }
            each.append("and \(more) more sources, \(groups.count - Self.listedFailures) other failures")
        }
        let bytes = self.base.bytesReceived
        let kept = bytes > 0 ? " The \(bytes) bytes downloaded are kept." : ""
        let counted = count == 1 ? "" : "\(count) sources: "
        return PackDeliveryError(
            last.code,
            message: "Every source of \(self.base.contentIdentifier) failed (\(counted)\(each.joined(separator: "; "))).\(kept)",
            hint: last.hint, subject: last.subject, underlying: last.underlying, httpStatus: last.httpStatus)
    }

    /// The distinct failures an error after every source failed names, at most.
    static let listedFailures = 4

    private mutating func beginTransfer(error: PackDeliveryError?, fromZero: Bool) -> [Action] {
        self.base.timeRemaining = -1
        self.base.bytesPerSecond = nil
        self.stage = .transferring(token: self.token, error: error)
        let order = TransferOrder(
            token: self.token, plan: self.plan(with: self.facts, fromZero: fromZero), source: self.base.url,
            validator: self.validator, credentialsRefused: self.credentialsRefused)
        return [.startTransfer(order)]
    }

    /// Unpacks the verified archive, unless a stopped install still owns the staging folder: then once it returns.
    private mutating func beginInstall(phase: DownloadPhase, error: PackDeliveryError?) -> [Action] {
        self.base.phaseProgress = 0
        let afterPrevious = self.installOutstanding
        self.stage = .installing(token: self.token, phase: phase, afterPrevious: afterPrevious, error: error)
        if afterPrevious { return [] }
        self.installOutstanding = true
        return [.install(token: self.token)]
    }

    /// The transfer's bytes are all in and checked: the install takes over, in the verifying phase.
    private mutating func checked() -> [Action] {
        self.base.progress = 1
        return self.beginInstall(phase: .verifying, error: nil)
    }

    /// Waits (as for a retry: a pause or cancel needs nothing stopped) while the manifest is read again.
    private mutating func reloadManifest(after error: PackDeliveryError) -> [Action] {
        self.remedies.manifestReread = true
        self.token += 1
        self.stage = .reloadingManifest(token: self.token, after: error)
        return [.reloadManifest(token: self.token)]
    }

    private mutating func enterPaused(_ reason: PauseReason, error: PackDeliveryError?) -> [Action] {
        self.token += 1
        self.stage = .paused(reason, error: error)
        return []
    }

    private mutating func retryOrFail(
        _ error: PackDeliveryError, retryable: Bool, retryAfter: TimeInterval?, jitter: Double, now: Date
    ) -> [Action] {
        guard retryable, self.attempt + 1 < self.retryPolicy.maxAttempts else { return self.fail(error) }
        self.attempt += 1
        self.token += 1
        let delay = self.retryPolicy.delay(attempt: self.attempt, retryAfter: retryAfter, jitter: jitter)
        let phase = self.stage.phase ?? .downloading
        self.stage = .waitingToRetry(token: self.token, until: now.addingTimeInterval(delay), error: error, phase: phase)
        return [.scheduleRetry(token: self.token, after: delay)]
    }

    private mutating func fail(_ error: PackDeliveryError) -> [Action] {
        self.token += 1
        self.stage = .failed(error)
        return []
    }

    private mutating func finish(at url: URL) {
        self.stage = .finished(contentURL: url)
        self.base.progress = 1
        self.base.bytesReceived = self.bytesToFetch
        self.base.contentURL = url
        self.base.phaseProgress = 1
        self.stagingInode = nil
        self.archive = .partial
    }

    /// The bytes a stopped or failed attempt left on disk.
    private mutating func keep(_ bytes: Int64, durable: Bool = true) {
        self.base.bytesReceived = bytes
        if durable { self.durableBytes = bytes }
        self.base.progress = self.fraction(bytes)
    }

    /// The partial bytes are gone or worthless: progress starts again from zero.
    private mutating func forgetBytes() {
        self.base.bytesReceived = 0
        self.base.progress = 0
        self.mostBytesKept = 0
    }

    private func stalled(_ phase: DownloadPhase) -> PackDeliveryError {
        PackDeliveryError(
            .stalled,
            message:
                "The download of \(self.base.contentIdentifier) made no progress for \(Int(self.retryPolicy.watchdog)) seconds while \(phase.rawValue).",
            hint: "It was stopped and tried again; if this goes on, check the disk and the network.")
    }

    /// What the transfer fetches: the whole pack, or during a delta update the bytes of its ranges.
    var bytesToFetch: Int64 { self.base.delta?.bytesToFetch ?? self.base.contentLength }

    private func fraction(_ bytes: Int64) -> Double {
        guard self.bytesToFetch > 0 else { return self.base.delta == nil ? 0 : 1 }
        return min(1, max(0, Double(bytes) / Double(self.bytesToFetch)))
    }
}

// MARK: The compact form (a queue keeps a download far from its head as its row in the store)

extension DownloadMachine {
    /// The priority it waits with (``Download/priority``), without building the ``download``.
    var priority: DownloadPriority { self.base.priority }
    /// Why it is paused, or nil when it is not.
    var pauseReason: PauseReason? {
        guard case .paused(let reason, _) = self.stage else { return nil }
        return reason
    }

    /// The token of a machine that holds nothing beyond its saved ``download`` and that token, so that
    /// ``restored(token:)`` of the machine made again from its row (``DownloadQueue/machine(_:)``) is this machine:
    /// it never ran (its running state is still the shared idle one), keeps no bytes, validator or verified archive, and
    /// waits for a slot or is paused with no error (but not for space, which the queue measures again). Nil otherwise.
    ///
    /// The store keeps everything else of such a download (``DownloadRecord``), except what is checked here: a delta
    /// plan and its fallback, a content URL and a release date (a date loses its sub-millisecond part there).
    var compactToken: Int? {
        switch self.stage {
        case .waiting: break
        case .paused(let reason, nil) where reason != .insufficientStorage: break
        default: return nil
        }
        guard self.running == Running.idle, self.validator == nil, !self.retriedFromZero, self.archive == .partial,
            self.stagingInode == nil, self.attempt == 0, self.stoppedTransfer == nil, !self.installOutstanding,
            self.base.bytesReceived == 0, self.mostBytesKept == 0, self.durableBytes == 0, self.base.delta == nil,
            self.base.deltaFallback == nil, self.base.contentURL == nil, self.base.releaseDate == nil,
            self.base.phaseProgress == 0, self.base.sources != nil || !self.base.credentialsToAllSources
        else { return nil }
        return self.token
    }

    /// This machine, made again from its saved row, with the token it had when it was kept compact: work started under
    /// an older token still changes nothing.
    func restored(token: Int) -> DownloadMachine {
        var machine = self
        machine.token = token
        return machine
    }
}
