import Foundation

/// The decisions for one download, as a value type: events in, actions out, no I/O.
///
/// The driver (``DownloadQueue``) runs the actions. Every piece of work it starts carries the
/// machine's current `token`; events from older work (a transfer stopped by a pause, a retry timer
/// of an earlier attempt) carry an older token and change nothing.
struct DownloadMachine: Sendable, Hashable {
    enum Action: Sendable, Hashable {
        /// Start a transfer into the partial file (from byte 0 when `fromZero`).
        case startTransfer(token: Int, fromZero: Bool)
        case stopTransfer(token: Int)
        case scheduleRetry(token: Int, after: TimeInterval)
        /// Unpack the verified archive and move it into place.
        case install(token: Int)
        case stopInstall
        /// Delete the partial archive, and the staging folder unless an install that owns it is still running.
        case deleteFiles(staging: Bool)
        /// Read the manifest again from where the transaction's came from, and find this pack's URL in it
        /// (the server refused or lost the old URL: an expired presigned URL, a pack moved).
        case reloadManifest(token: Int)
    }

    /// How retries back off, and when an attempt counts as stalled.
    struct RetryPolicy: Sendable, Hashable {
        /// Failed attempts in a row (without new bytes kept) before the download fails.
        var maxAttempts = 6
        var baseDelay: TimeInterval = 0.5
        var maxDelay: TimeInterval = 30
        /// An active download whose bytes and phase progress do not move for this long is stopped and retried
        /// (the watchdog). Longer than the transfer's own stall timeout, so that a network stall is caught there first.
        var watchdog: TimeInterval = 45

        /// Capped exponential backoff with full jitter in its upper half.
        func delay(attempt: Int, retryAfter: TimeInterval?, jitter: Double) -> TimeInterval {
            let exponential = min(self.maxDelay, self.baseDelay * pow(2, Double(max(0, attempt - 1))))
            let jittered = exponential * (0.5 + 0.5 * jitter)
            return max(jittered, min(retryAfter ?? 0, 300))
        }
    }

    private(set) var download: Download
    var validator: String?
    var retriedFromZero: Bool
    /// The archive is complete and matched its SHA-256; resuming only unpacks.
    var verified: Bool
    /// The verification was recorded by an earlier process: hash the archive again before unpacking it
    /// (a power cut may have damaged what the record calls verified).
    var recheckArchive = false
    /// The host can renew credentials (a provider is configured): a refusal (401, 403) is tried once more with fresh ones.
    var credentialsRenewable = false
    /// The next transfer asks the credential provider for fresh credentials: the server refused the last ones.
    private(set) var credentialsRefused = false
    /// The manifest was read again since bytes last moved: another refusal or 404 does not read it again.
    private(set) var manifestReloaded = false
    /// The error that sent the download to read the manifest again, while it does.
    private var reloading: PackDeliveryError?
    var stagingInode: Int64?
    /// Failed attempts since bytes kept last reached a new high.
    private(set) var attempt = 0
    private(set) var token = 0
    private(set) var waitingForRetry = false
    /// The most bytes the partial file ever held: an attempt that ends below it made no progress, whatever it received.
    private(set) var mostBytesKept: Int64 = 0
    /// Bytes of the partial file known to be on disk (synced): what a checkpoint records.
    private(set) var durableBytes: Int64
    /// When bytes or phase progress last moved (for the watchdog).
    private(set) var lastMovement = Date.distantPast
    /// The token of a transfer stopped by a pause: its final byte count still counts.
    private var stoppedTransfer: Int?
    /// An install stopped by the watchdog: start it again once it has returned.
    private var restartInstall = false
    /// Whether an install (which owns the staging folder) may still be running.
    private(set) var installRunning = false
    /// A delta update was refused for this download: the whole pack is fetched (the reason is in `download.deltaFallback`).
    private(set) var deltaRefused = false
    private var rate = RateEstimator()
    let retryPolicy: RetryPolicy

    init(
        download: Download, validator: String? = nil, retriedFromZero: Bool = false, verified: Bool = false,
        stagingInode: Int64? = nil, retryPolicy: RetryPolicy = RetryPolicy()
    ) {
        self.download = download
        self.validator = validator
        self.retriedFromZero = retriedFromZero
        self.verified = verified
        self.stagingInode = stagingInode
        self.retryPolicy = retryPolicy
        self.mostBytesKept = download.bytesReceived
        self.durableBytes = download.bytesReceived
    }

    var state: DownloadState { self.download.state }

    // MARK: Events

    /// The scheduler gives the download a slot: waiting → active.
    mutating func start(now: Date = Date()) -> [Action] {
        guard self.download.state == .waiting else { return [] }
        self.token += 1
        self.download.state = .active
        self.download.error = nil
        self.download.retryDate = nil
        self.download.pauseReason = nil
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
        self.rate = RateEstimator()
        self.attempt = 0
        self.waitingForRetry = false
        self.lastMovement = now
        if self.verified {
            self.download.phase = .unpacking
            self.download.phaseProgress = 0
            self.installRunning = true
            return [.install(token: self.token)]
        }
        self.download.phase = .downloading
        return [.startTransfer(token: self.token, fromZero: false)]
    }

    /// Bytes known good on disk, from the running transfer.
    mutating func progress(token: Int, bytesOnDisk: Int64, validator: String?, now: Date = Date()) -> Bool {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return false }
        if bytesOnDisk != self.download.bytesReceived { self.lastMovement = now }
        if bytesOnDisk > self.download.bytesReceived {
            self.credentialsRefused = false
            self.manifestReloaded = false
        }
        self.rate.add(bytes: bytesOnDisk, at: now)
        self.download.bytesReceived = bytesOnDisk
        self.validator = validator ?? self.validator
        self.download.progress = self.fraction(bytesOnDisk)
        self.download.timeRemaining = self.rate.timeRemaining(remaining: self.bytesToFetch - bytesOnDisk)
        self.download.bytesPerSecond = self.rate.bytesPerSecond
        return true
    }

    /// The unpack that follows the transfer wrote `bytes`: while downloading, `phaseProgress` is the unpack's.
    mutating func streamProgress(token: Int, bytes: Int64, now: Date = Date()) {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return }
        let expected = max(1, self.download.unpackedLength ?? self.download.contentLength)
        self.download.phaseProgress = min(0.99, Double(bytes) / Double(expected))
    }

    /// A delta update knows what it fetches: progress counts those bytes from now on.
    mutating func deltaPlanned(token: Int, delta: Download.Delta, now: Date = Date()) {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return }
        self.lastMovement = now
        self.download.delta = delta
        self.download.deltaFallback = nil
        self.rate = RateEstimator()
        self.mostBytesKept = delta.bytesKept
        self.durableBytes = delta.bytesKept
        self.download.bytesReceived = delta.bytesKept
        self.download.progress = self.fraction(delta.bytesKept)
    }

    /// The hash thread synced the partial file up to `bytes`.
    mutating func durable(token: Int, bytes: Int64) {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return }
        self.durableBytes = min(bytes, self.download.bytesReceived)
    }

    /// A transfer attempt ended.
    mutating func transferFinished(token: Int, outcome: TransferOutcome, jitter: Double = Double.random(in: 0...1), now: Date = Date())
        -> [Action]
    {
        if case .stopped(let bytes) = outcome, token == self.stoppedTransfer {
            // The transfer a pause stopped: its last bytes are kept, so say so.
            self.stoppedTransfer = nil
            self.download.bytesReceived = bytes
            self.durableBytes = bytes
            self.download.progress = self.fraction(bytes)
            return []
        }
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return [] }
        self.lastMovement = now
        switch outcome {
        case .stopped(let bytes):
            self.download.bytesReceived = bytes
            self.durableBytes = bytes
            return []
        case .assembled(let fetched):
            // Each entry was checked against the index's SHA-256: the new version waits in the delta's folder.
            self.download.bytesReceived = fetched
            return self.startInstall()
        case .deltaRefused(let fallback):
            // Fetch the whole pack instead, saying why.
            self.deltaRefused = true
            self.download.delta = nil
            self.download.deltaFallback = fallback
            self.download.bytesReceived = 0
            self.download.progress = 0
            self.mostBytesKept = 0
            self.durableBytes = 0
            self.rate = RateEstimator()
            self.token += 1
            return [.startTransfer(token: self.token, fromZero: false)]
        case .completed(let sha256, let length, let resumedFrom):
            self.download.bytesReceived = length
            if length == self.download.contentLength, sha256.lowercased() == self.download.sha256.lowercased() {
                self.verified = true
                self.recheckArchive = false
                // Hashed while the bytes arrived: verifying is the comparison just made; the installer moves on to unpacking.
                return self.startInstall()
            }
            if resumedFrom > 0, !self.retriedFromZero {
                // A resumed file may have mixed two versions of the pack: fetch once more from zero.
                self.retriedFromZero = true
                self.token += 1
                self.download.bytesReceived = 0
                self.download.progress = 0
                self.mostBytesKept = 0
                return [.startTransfer(token: self.token, fromZero: true)]
            }
            self.download.bytesReceived = 0
            self.download.progress = 0
            self.mostBytesKept = 0
            return self.fail(
                PackDeliveryError(
                    .checksumMismatch,
                    message:
                        "The pack \(self.download.contentIdentifier) from \(self.download.url.redacted) has SHA-256 \(sha256), but the manifest says \(self.download.sha256).",
                    hint: "Nothing was installed; the manifest or the pack on the server is wrong.", subject: self.download.url.redacted))
                + [.deleteFiles(staging: true)]
        case .failed(let failure, let bytes):
            self.download.bytesReceived = bytes
            self.download.progress = self.fraction(bytes)
            if failure.error.code == .insufficientStorage {
                self.enterPaused(.insufficientStorage, error: failure.error)
                return []
            }
            if failure.error.code == .unauthorized {
                if self.credentialsRenewable, !self.credentialsRefused {
                    // Ask for fresh credentials (a token that expired), and try again at once.
                    self.credentialsRefused = true
                    return self.retryOrFail(failure.error, retryable: true, retryAfter: 0, jitter: 0, now: now)
                }
                if !self.manifestReloaded { return self.reloadManifest(after: failure.error) }
                // Nothing helps until the host renews the credentials: keep the bytes and wait for a resume.
                self.credentialsRefused = false
                self.enterPaused(.unauthorized, error: failure.error)
                return []
            }
            if StreamedUnpack.isHostile(failure.error) {
                // Unpacked while downloading, the pack showed an entry that is never installed: nothing is kept.
                self.verified = false
                self.download.bytesReceived = 0
                self.download.progress = 0
                self.mostBytesKept = 0
                return self.fail(failure.error) + [.deleteFiles(staging: true)]
            }
            if failure.error.httpStatus == 404 || failure.error.httpStatus == 410, !self.manifestReloaded {
                // The pack is not at its URL any more: the manifest may name its new place.
                return self.reloadManifest(after: failure.error)
            }
            // Only new bytes kept reset the count: a server that sends the same bytes again and again
            // (then throws them away) or trickles them too slowly still runs out of attempts.
            if bytes > self.mostBytesKept, !failure.countsAlways { self.attempt = 0 }
            self.mostBytesKept = max(self.mostBytesKept, bytes)
            return self.retryOrFail(failure.error, retryable: failure.retryable, retryAfter: failure.retryAfter, jitter: jitter, now: now)
        }
    }

    /// The backoff delay of a retry has passed.
    mutating func retryDue(token: Int, now: Date = Date()) -> [Action] {
        guard token == self.token, self.waitingForRetry, self.download.state == .active else { return [] }
        self.waitingForRetry = false
        self.download.retryDate = nil
        self.lastMovement = now
        if self.verified {
            self.download.phase = .unpacking
            self.download.phaseProgress = 0
            if self.installRunning {
                // The stopped install has not returned yet: start again when it does.
                self.restartInstall = true
                return []
            }
            self.installRunning = true
            return [.install(token: self.token)]
        }
        self.download.phase = .downloading
        return [.startTransfer(token: self.token, fromZero: false)]
    }

    /// The manifest was read again: the pack's URL in it (its SHA-256 and length unchanged), or why not.
    mutating func manifestReloaded(
        token: Int, result: Result<URL, PackDeliveryError>, jitter: Double = Double.random(in: 0...1),
        now: Date = Date()
    ) -> [Action] {
        guard token == self.token, self.download.state == .active, let original = self.reloading else { return [] }
        self.reloading = nil
        self.waitingForRetry = false
        self.lastMovement = now
        switch result {
        case .success(let url):
            // Continue from the kept bytes at the (maybe new) URL, asking for credentials as usual.
            self.download.url = url
            self.credentialsRefused = false
            return [.startTransfer(token: self.token, fromZero: false)]
        case .failure(let why):
            let kept = self.download.bytesReceived > 0 ? " The \(self.download.bytesReceived) bytes downloaded are kept." : ""
            if original.code == .unauthorized {
                self.credentialsRefused = false
                self.enterPaused(
                    .unauthorized,
                    error: original.withHint(
                        "Renew the receipt or credentials, then resume; reading the manifest again did not help: \(why.message)\(kept)"))
                return []
            }
            let error = original.withHint("\(original.hint.map { $0 + " " } ?? "")Reading the manifest again did not help: \(why.message)")
            return self.retryOrFail(error, retryable: false, retryAfter: nil, jitter: jitter, now: now)
        }
    }

    /// The installer moved on to a phase, or along it.
    mutating func installProgress(token: Int, phase: DownloadPhase, fraction: Double, now: Date = Date()) -> Bool {
        guard token == self.token, self.download.state == .active, !self.waitingForRetry else { return false }
        self.lastMovement = now
        self.download.phase = phase
        self.download.phaseProgress = max(0, min(1, fraction))
        return true
    }

    /// The installer is done: content in place (and recorded), or an error.
    mutating func installFinished(token: Int, result: Result<URL, PackDeliveryError>, now: Date = Date()) -> [Action] {
        if token != self.token || self.download.state != .active {
            // An install that was stopped has returned: the staging folder is free again.
            self.installRunning = false
            if case .success(let url) = result, self.download.state != .finished {
                // It completed before the stop reached it: the content is in place and recorded, so it is finished.
                self.token += 1
                self.waitingForRetry = false
                self.restartInstall = false
                self.finish(at: url)
                return []
            }
            if self.restartInstall, self.download.state == .active, self.verified, !self.waitingForRetry {
                self.restartInstall = false
                self.installRunning = true
                self.lastMovement = now
                return [.install(token: self.token)]
            }
            if self.download.state == .cancelled { return [.deleteFiles(staging: true)] }
            return []
        }
        self.installRunning = false
        switch result {
        case .success(let url):
            self.finish(at: url)
            return []
        case .failure(let error) where error.code == .insufficientStorage:
            self.enterPaused(.insufficientStorage, error: error)
            return []
        case .failure(let error) where error.code == .cancelled:
            return []
        case .failure(let error) where error.code == .fileSystem && error.underlying == .init(.errno, Int(ENOENT)) && self.verified:
            // The archive went missing under the queue's feet: fetch it again rather than fail for good.
            self.verified = false
            self.download.bytesReceived = 0
            self.download.progress = 0
            self.mostBytesKept = 0
            return self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error) where error.code == .checksumMismatch:
            // The archive on disk is not what was verified (damaged by a crash or by something else): fetch it again.
            self.verified = false
            self.recheckArchive = false
            self.download.bytesReceived = 0
            self.download.progress = 0
            self.mostBytesKept = 0
            return [.deleteFiles(staging: false)] + self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error) where error.kind == .io:
            // A local failure (descriptors, database busy): the archive stays verified; retry, then fail with the cause.
            return self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
        case .failure(let error):
            self.verified = false
            self.download.bytesReceived = 0
            self.download.progress = 0
            self.mostBytesKept = 0
            return self.fail(error) + [.deleteFiles(staging: true)]
        }
    }

    /// Twice a second: an active download whose bytes and phase progress have not moved for the
    /// watchdog's time is stopped and retried, and fails once the attempts run out.
    mutating func tick(now: Date) -> [Action] {
        guard self.download.state == .active, !self.waitingForRetry,
            now.timeIntervalSince(self.lastMovement) > self.retryPolicy.watchdog
        else { return [] }
        let phase = self.download.phase ?? .downloading
        let error = PackDeliveryError(
            .stalled,
            message:
                "The download of \(self.download.contentIdentifier) made no progress for \(Int(self.retryPolicy.watchdog)) seconds while \(phase.rawValue).",
            hint: "It was stopped and tried again; if this goes on, check the disk and the network.")
        let stop: [Action]
        switch phase {
        case .downloading: stop = [.stopTransfer(token: self.token)]
        case .verifying, .unpacking: stop = [.stopInstall]
        case .installing:
            // The move and the record are short and not interruptible; keep waiting, but say so.
            self.lastMovement = now
            self.download.error = error
            return []
        }
        return stop + self.retryOrFail(error, retryable: true, retryAfter: nil, jitter: 0.5, now: now)
    }

    /// Pause, by the user, a shutdown or because the disk is full. Moving into place is too short to interrupt.
    mutating func pause(_ reason: PauseReason, error: PackDeliveryError? = nil) -> [Action] {
        let stop: [Action]
        switch (self.download.state, self.download.phase) {
        case (.waiting, _): stop = []
        case (.active, .downloading?):
            if self.waitingForRetry {
                stop = []
            } else {
                self.stoppedTransfer = self.token
                stop = [.stopTransfer(token: self.token)]
            }
        case (.active, .verifying?), (.active, .unpacking?): stop = self.installRunning ? [.stopInstall] : []
        case (.active, _): return []
        case (.paused, _) where reason == .insufficientStorage: stop = []
        case (.paused, _), (.failed, _), (.finished, _), (.cancelled, _): return []
        }
        self.enterPaused(reason, error: error)
        return stop
    }

    private mutating func enterPaused(_ reason: PauseReason, error: PackDeliveryError?) {
        self.token += 1
        self.waitingForRetry = false
        self.restartInstall = false
        self.download.state = .paused
        self.download.phase = nil
        self.download.pauseReason = reason
        self.download.error = error
        self.download.retryDate = nil
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
    }

    /// Resume a paused or failed download: it waits for a slot and keeps the bytes it has.
    mutating func resume() -> [Action] {
        guard self.download.state == .paused || self.download.state == .failed else { return [] }
        if self.download.state == .failed { self.retriedFromZero = false }
        // Renewed credentials or a fixed server: a refusal may read the manifest again.
        self.manifestReloaded = false
        self.reloading = nil
        self.download.state = .waiting
        self.download.pauseReason = nil
        self.download.error = nil
        return []
    }

    /// Cancel: stop whatever runs and delete the partial data. Finished downloads and a move in progress stay.
    mutating func cancel() -> [Action] {
        var actions: [Action]
        switch (self.download.state, self.download.phase) {
        case (.finished, _), (.cancelled, _), (.active, .installing?): return []
        case (.active, .downloading?): actions = self.waitingForRetry ? [] : [.stopTransfer(token: self.token)]
        case (.active, _): actions = self.installRunning ? [.stopInstall] : []
        case (.waiting, _), (.paused, _), (.failed, _): actions = []
        }
        // A running install owns the staging folder until it returns; it is removed then.
        actions.append(.deleteFiles(staging: !self.installRunning))
        self.token += 1
        self.waitingForRetry = false
        self.restartInstall = false
        self.verified = false
        self.mostBytesKept = 0
        self.download.state = .cancelled
        self.download.phase = nil
        self.download.pauseReason = nil
        self.download.error = nil
        self.download.retryDate = nil
        self.download.bytesReceived = 0
        self.download.progress = 0
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
        return actions
    }

    /// Ends the download as failed with an error from outside the machine (the store could not record it);
    /// a paused download stays paused, with the error.
    mutating func abort(_ error: PackDeliveryError) -> [Action] {
        if self.download.state == .paused {
            if self.download.error == nil { self.download.error = error }
            return []
        }
        let stop: [Action] =
            switch (self.download.state, self.download.phase) {
            case (.active, .downloading?): self.waitingForRetry ? [] : [.stopTransfer(token: self.token)]
            case (.active, .verifying?), (.active, .unpacking?): self.installRunning ? [.stopInstall] : []
            default: []
            }
        guard self.download.state == .active || self.download.state == .waiting else { return [] }
        return stop + self.fail(error)
    }

    // MARK: Helpers

    /// Waits (as for a retry: a pause or cancel needs nothing stopped) while the manifest is read again.
    private mutating func reloadManifest(after error: PackDeliveryError) -> [Action] {
        self.manifestReloaded = true
        self.reloading = error
        self.waitingForRetry = true
        self.download.error = error
        self.token += 1
        return [.reloadManifest(token: self.token)]
    }

    private mutating func finish(at url: URL) {
        self.download.state = .finished
        self.download.phase = nil
        self.download.pauseReason = nil
        self.download.progress = 1
        self.download.bytesReceived = self.bytesToFetch
        self.download.timeRemaining = 0
        self.download.bytesPerSecond = nil
        self.download.contentURL = url
        self.download.error = nil
        self.download.retryDate = nil
        self.download.phaseProgress = 1
        self.stagingInode = nil
        self.verified = false
    }

    private mutating func retryOrFail(_ error: PackDeliveryError, retryable: Bool, retryAfter: TimeInterval?, jitter: Double, now: Date)
        -> [Action]
    {
        guard retryable, self.attempt + 1 < self.retryPolicy.maxAttempts else { return self.fail(error) }
        self.attempt += 1
        self.waitingForRetry = true
        self.download.error = error
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
        self.token += 1
        let delay = self.retryPolicy.delay(attempt: self.attempt, retryAfter: retryAfter, jitter: jitter)
        self.download.retryDate = now.addingTimeInterval(delay)
        return [.scheduleRetry(token: self.token, after: delay)]
    }

    private mutating func fail(_ error: PackDeliveryError) -> [Action] {
        self.token += 1
        self.waitingForRetry = false
        self.restartInstall = false
        self.download.state = .failed
        self.download.phase = nil
        self.download.error = error
        self.download.retryDate = nil
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
        return []
    }

    /// The transfer's bytes are all in and checked: the install takes over, in the verifying phase.
    private mutating func startInstall() -> [Action] {
        self.download.progress = 1
        self.download.phase = .verifying
        self.download.timeRemaining = -1
        self.download.bytesPerSecond = nil
        self.download.phaseProgress = 0
        self.installRunning = true
        return [.install(token: self.token)]
    }

    /// What the transfer fetches: the whole pack, or during a delta update the bytes of its ranges.
    var bytesToFetch: Int64 { self.download.delta?.bytesToFetch ?? self.download.contentLength }

    private func fraction(_ bytes: Int64) -> Double {
        guard self.bytesToFetch > 0 else { return self.download.delta == nil ? 0 : 1 }
        return min(1, max(0, Double(bytes) / Double(self.bytesToFetch)))
    }
}

/// A smoothed transfer rate (an exponentially weighted moving average over ≈5 s) and the time left.
struct RateEstimator: Sendable, Hashable {
    private var lastBytes: Int64?
    private var lastTime: Date?
    private(set) var bytesPerSecond: Double?
    var halfLife: TimeInterval = 2.5

    mutating func add(bytes: Int64, at time: Date) {
        defer {
            self.lastBytes = bytes
            self.lastTime = time
        }
        guard let lastBytes, let lastTime, bytes >= lastBytes else { return }
        let elapsed = time.timeIntervalSince(lastTime)
        guard elapsed > 0.02 else { return }
        let sample = Double(bytes - lastBytes) / elapsed
        let weight = 1 - pow(0.5, elapsed / self.halfLife)
        self.bytesPerSecond = self.bytesPerSecond.map { $0 + weight * (sample - $0) } ?? sample
    }

    /// Seconds left for `remaining` bytes, or -1 while the rate is unknown or zero.
    func timeRemaining(remaining: Int64) -> Double {
        guard let rate = self.bytesPerSecond, rate > 1 else { return -1 }
        return Double(max(0, remaining)) / rate
    }
}
