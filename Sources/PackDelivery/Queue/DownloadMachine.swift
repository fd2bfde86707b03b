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
        /// Delete the partial archive and any staging folder.
        case deleteFiles
    }

    /// How retries back off.
    struct RetryPolicy: Sendable, Hashable {
        /// Failed attempts in a row (without any byte arriving) before the download fails.
        var maxAttempts = 6
        var baseDelay: TimeInterval = 0.5
        var maxDelay: TimeInterval = 30

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
    var stagingInode: Int64?
    /// Failed attempts since bytes last arrived.
    private(set) var attempt = 0
    private(set) var token = 0
    private(set) var waitingForRetry = false
    private var rate = RateEstimator()
    let retryPolicy: RetryPolicy

    init(download: Download, validator: String? = nil, retriedFromZero: Bool = false, verified: Bool = false,
         stagingInode: Int64? = nil, retryPolicy: RetryPolicy = RetryPolicy()) {
        self.download = download
        self.validator = validator
        self.retriedFromZero = retriedFromZero
        self.verified = verified
        self.stagingInode = stagingInode
        self.retryPolicy = retryPolicy
    }

    var state: DownloadState { self.download.state }

    // MARK: Events

    /// The scheduler gives the download a slot: waiting → active.
    mutating func start(now: Date = Date()) -> [Action] {
        guard self.download.state == .waiting else { return [] }
        self.token += 1
        self.download.state = .active
        self.download.error = nil
        self.download.pauseReason = nil
        self.download.timeRemaining = -1
        self.rate = RateEstimator()
        if self.verified {
            self.download.phase = .unpacking
            self.download.phaseProgress = 0
            return [.install(token: self.token)]
        }
        self.download.phase = .downloading
        self.attempt = 0
        self.waitingForRetry = false
        return [.startTransfer(token: self.token, fromZero: false)]
    }

    /// Bytes known good on disk, from the running transfer.
    mutating func progress(token: Int, bytesOnDisk: Int64, validator: String?, now: Date = Date()) -> Bool {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return false }
        if bytesOnDisk > self.download.bytesReceived { self.attempt = 0 }
        self.rate.add(bytes: bytesOnDisk, at: now)
        self.download.bytesReceived = bytesOnDisk
        self.validator = validator ?? self.validator
        self.download.progress = self.fraction(bytesOnDisk)
        self.download.timeRemaining = self.rate.timeRemaining(remaining: self.download.contentLength - bytesOnDisk)
        return true
    }

    /// A transfer attempt ended.
    mutating func transferFinished(token: Int, outcome: TransferOutcome, jitter: Double = Double.random(in: 0...1)) -> [Action] {
        guard token == self.token, self.download.state == .active, self.download.phase == .downloading else { return [] }
        switch outcome {
        case .stopped(let bytes):
            self.download.bytesReceived = bytes
            return []
        case .completed(let sha256, let length, let resumedFrom):
            self.download.bytesReceived = length
            if length == self.download.contentLength, sha256.lowercased() == self.download.sha256.lowercased() {
                self.verified = true
                self.download.progress = 1
                // Hashed while the bytes arrived: verifying is the comparison just made; the installer moves on to unpacking.
                self.download.phase = .verifying
                self.download.timeRemaining = -1
                self.download.phaseProgress = 0
                return [.install(token: self.token)]
            }
            if resumedFrom > 0, !self.retriedFromZero {
                // A resumed file may have mixed two versions of the pack: fetch once more from zero.
                self.retriedFromZero = true
                self.token += 1
                self.download.bytesReceived = 0
                self.download.progress = 0
                return [.startTransfer(token: self.token, fromZero: true)]
            }
            self.download.bytesReceived = 0
            self.download.progress = 0
            return self.fail(PackDeliveryError(
                .checksumMismatch,
                message: "The pack \(self.download.contentIdentifier) from \(self.download.url.redacted) has SHA-256 \(sha256), but the manifest says \(self.download.sha256).",
                hint: "Nothing was installed; the manifest or the pack on the server is wrong.", subject: self.download.url.redacted)) + [.deleteFiles]
        case .failed(let failure, let bytes):
            self.download.bytesReceived = bytes
            self.download.progress = self.fraction(bytes)
            if failure.error.kind == .insufficientStorage {
                self.enterPaused(.insufficientStorage, error: failure.error)
                return []
            }
            if failure.retryable, self.attempt + 1 < self.retryPolicy.maxAttempts {
                self.attempt += 1
                self.waitingForRetry = true
                self.download.error = failure.error
                self.download.timeRemaining = -1
                self.token += 1
                return [.scheduleRetry(token: self.token, after: self.retryPolicy.delay(attempt: self.attempt, retryAfter: failure.retryAfter, jitter: jitter))]
            }
            return self.fail(failure.error)
        }
    }

    /// The backoff delay of a retry has passed.
    mutating func retryDue(token: Int) -> [Action] {
        guard token == self.token, self.waitingForRetry, self.download.state == .active else { return [] }
        self.waitingForRetry = false
        return [.startTransfer(token: self.token, fromZero: false)]
    }

    /// The installer moved on to a phase, or along it.
    mutating func installProgress(token: Int, phase: DownloadPhase, fraction: Double) -> Bool {
        guard token == self.token, self.download.state == .active else { return false }
        self.download.phase = phase
        self.download.phaseProgress = max(0, min(1, fraction))
        return true
    }

    /// The installer is done: content in place (and recorded), or an error.
    mutating func installFinished(token: Int, result: Result<URL, PackDeliveryError>) -> [Action] {
        guard token == self.token, self.download.state == .active else { return [] }
        switch result {
        case .success(let url):
            self.download.state = .finished
            self.download.phase = nil
            self.download.progress = 1
            self.download.timeRemaining = 0
            self.download.contentURL = url
            self.download.error = nil
            self.download.phaseProgress = 1
            self.stagingInode = nil
            return []
        case .failure(let error) where error.kind == .insufficientStorage:
            self.enterPaused(.insufficientStorage, error: error)
            return []
        case .failure(let error) where error.kind == .cancelled:
            return []
        case .failure(let error):
            self.verified = false
            self.download.bytesReceived = 0
            self.download.progress = 0
            return self.fail(error) + [.deleteFiles]
        }
    }

    /// Pause, by the user or because the disk is full. Moving into place is too short to interrupt.
    mutating func pause(_ reason: PauseReason, error: PackDeliveryError? = nil) -> [Action] {
        let stop: [Action]
        switch (self.download.state, self.download.phase) {
        case (.waiting, _): stop = []
        case (.active, .downloading?): stop = self.waitingForRetry ? [] : [.stopTransfer(token: self.token)]
        case (.active, .verifying?), (.active, .unpacking?): stop = [.stopInstall]
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
        self.download.state = .paused
        self.download.phase = nil
        self.download.pauseReason = reason
        self.download.error = error
        self.download.timeRemaining = -1
    }

    /// Resume a paused or failed download: it waits for a slot and keeps the bytes it has.
    mutating func resume() -> [Action] {
        guard self.download.state == .paused || self.download.state == .failed else { return [] }
        if self.download.state == .failed { self.retriedFromZero = false }
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
        case (.active, _): actions = [.stopInstall]
        case (.waiting, _), (.paused, _), (.failed, _): actions = []
        }
        actions.append(.deleteFiles)
        self.token += 1
        self.waitingForRetry = false
        self.verified = false
        self.download.state = .cancelled
        self.download.phase = nil
        self.download.pauseReason = nil
        self.download.bytesReceived = 0
        self.download.progress = 0
        self.download.timeRemaining = -1
        return actions
    }

    // MARK: Helpers

    private mutating func fail(_ error: PackDeliveryError) -> [Action] {
        self.token += 1
        self.waitingForRetry = false
        self.download.state = .failed
        self.download.phase = nil
        self.download.error = error
        self.download.timeRemaining = -1
        return []
    }

    private func fraction(_ bytes: Int64) -> Double {
        guard self.download.contentLength > 0 else { return 0 }
        return min(1, max(0, Double(bytes) / Double(self.download.contentLength)))
    }
}

/// A smoothed transfer rate (an exponentially weighted moving average over ≈5 s) and the time left.
struct RateEstimator: Sendable, Hashable {
    private var lastBytes: Int64?
    private var lastTime: Date?
    private(set) var bytesPerSecond: Double?
    var halfLife: TimeInterval = 2.5

    mutating func add(bytes: Int64, at time: Date) {
        defer { self.lastBytes = bytes; self.lastTime = time }
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
