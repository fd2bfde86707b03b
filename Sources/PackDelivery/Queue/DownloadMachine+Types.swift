import Foundation

// What a download machine says and holds: its actions, its stages, its retry policy.
extension DownloadMachine {
    enum Action: Sendable, Hashable {
        /// Start a transfer: the order says how the pack is delivered (``DeliveryPlan``), from which source, and with
        /// which validator.
        case startTransfer(TransferOrder)
        case stopTransfer(token: Int)
        /// Tell a delta update that reported its plan whether it goes on (`refusal` nil) or ends refused, so that the
        /// whole pack is fetched instead (``DeliveryPlan/refusal(of:packLength:)``).
        case answerDeltaPlan(token: Int, refusal: Download.DeltaFallback?)
        case scheduleRetry(token: Int, after: TimeInterval)
        /// Unpack the verified archive and move it into place.
        case install(token: Int)
        case stopInstall
        /// Record what the install put in place (`pack`), with `finished`: the download as it is once the install's
        /// success is taken. The commit's result comes back as ``QueueMachine/Event/installFinished(token:result:)``.
        case commitInstall(token: Int, pack: InstalledPack, finished: DownloadMachine)
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
        /// Retries of one source after a 5xx (a pack with several sources), with this policy's backoff, before the next
        /// source is tried; they do not count as failed attempts of the download.
        var sourceRetries = 2
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

    /// Where the download stands. Each case carries what that stage needs, so a combination that cannot happen
    /// cannot be built; the public ``Download``'s state, phase, pause reason, error and retry date are read from it.
    ///
    /// The tokens are those of the work the stage waits for: an event whose token is not the stage's comes from
    /// work that was stopped or replaced, and changes nothing. ``Kind/successors`` lists the legal transitions.
    ///
    /// Indirect: its errors are large and most downloads of a large queue wait with none, so a waiting machine keeps
    /// one word for its stage (the benchmark's case 19 holds 100,000 of them).
    indirect enum Stage: Sendable, Hashable {
        /// Waiting for a slot (`waiting`).
        case waiting
        /// A transfer runs (`active`, `downloading`); `error` is the previous attempt's, shown until bytes move.
        case transferring(token: Int, error: PackDeliveryError?)
        /// Between attempts: the next starts at `until` (`active`, in the phase the failed attempt left). With `source`, a
        /// retry of that source alone (a pack with several sources, after a 5xx from it); without, a new round over the sources.
        case waitingToRetry(token: Int, until: Date, error: PackDeliveryError, phase: DownloadPhase, source: URL? = nil)
        /// The server refused or lost the pack's URL: the manifest is read again (`active`, `downloading`).
        case reloadingManifest(token: Int, after: PackDeliveryError)
        /// The installer runs (`active`; verifying, unpacking or installing). With `afterPrevious`, it starts once an
        /// earlier install, stopped by the watchdog and still owning the staging folder, has returned.
        case installing(token: Int, phase: DownloadPhase, afterPrevious: Bool, error: PackDeliveryError?)
        /// Stopped, its bytes kept. While the transfer the pause stopped has not said how many bytes it kept
        /// (``DownloadMachine/stoppedTransfer``), the pause is not reported, so that the first `paused` update carries them.
        case paused(PauseReason, error: PackDeliveryError?)
        case failed(PackDeliveryError)
        case finished(contentURL: URL?)
        case cancelled

        /// The stage without its data, for the table of legal transitions.
        enum Kind: CaseIterable, Sendable, Hashable {
            case waiting, transferring, waitingToRetry, reloadingManifest, installing, paused, failed, finished, cancelled

            /// The stages an event may lead to from this one (itself included when an event may keep it).
            /// Every stage may become `finished`: an install that was stopped may have completed before the stop
            /// reached it, and its content is then in place and recorded.
            var successors: Set<Kind> {
                switch self {
                // start (or an unpack of a verified archive), a pause (user, or no space at admission), abort, cancel
                case .waiting: [.waiting, .transferring, .installing, .paused, .failed, .cancelled, .finished]
                // progress; the whole pack after a refused delta or a mixed resume; a retry; a refusal; the bytes
                // checked; pause; a hostile pack or an exhausted budget; cancel
                case .transferring:
                    [.transferring, .waitingToRetry, .reloadingManifest, .installing, .paused, .failed, .cancelled, .finished]
                case .waitingToRetry: [.waitingToRetry, .transferring, .installing, .paused, .failed, .cancelled, .finished]
                case .reloadingManifest: [.reloadingManifest, .transferring, .paused, .failed, .cancelled, .finished]
                case .installing: [.installing, .waitingToRetry, .paused, .failed, .finished, .cancelled]
                // resume, space returned, a user's pause over a pause for space
                case .paused: [.paused, .waiting, .cancelled, .finished]
                case .failed: [.failed, .waiting, .cancelled, .finished]
                case .finished: [.finished]
                case .cancelled: [.cancelled, .finished]
                }
            }
        }

        var kind: Kind {
            switch self {
            case .waiting: .waiting
            case .transferring: .transferring
            case .waitingToRetry: .waitingToRetry
            case .reloadingManifest: .reloadingManifest
            case .installing: .installing
            case .paused: .paused
            case .failed: .failed
            case .finished: .finished
            case .cancelled: .cancelled
            }
        }

        var state: DownloadState {
            switch self {
            case .waiting: .waiting
            case .transferring, .waitingToRetry, .reloadingManifest, .installing: .active
            case .paused: .paused
            case .failed: .failed
            case .finished: .finished
            case .cancelled: .cancelled
            }
        }

        var phase: DownloadPhase? {
            switch self {
            case .transferring, .reloadingManifest: .downloading
            case .waitingToRetry(_, _, _, let phase, _), .installing(_, let phase, _, _): phase
            case .waiting, .paused, .failed, .finished, .cancelled: nil
            }
        }

        var error: PackDeliveryError? {
            switch self {
            case .transferring(_, let error), .installing(_, _, _, let error), .paused(_, let error): error
            case .waitingToRetry(_, _, let error, _, _), .reloadingManifest(_, let error), .failed(let error): error
            case .waiting, .finished, .cancelled: nil
            }
        }
    }

    /// What is known of the pack's archive on disk.
    enum Archive: Sendable, Hashable {
        /// Partial (or absent): the transfer continues from its bytes.
        case partial
        /// Complete, and it matched the manifest's SHA-256 as it arrived: resuming only unpacks.
        case verified
        /// Recorded as verified by an earlier process: hashed again before it is unpacked (a power cut may have
        /// damaged what the record calls verified).
        case verifiedEarlier
    }

    /// What was tried, since bytes last moved, to get past a refusal (401, 403) or a lost URL (404, 410).
    struct Remedies: Sendable, Hashable {
        /// Fresh credentials from the provider (asked with `refused` set): once between a refusal and the pause.
        enum Renewal: Sendable, Hashable {
            /// Not asked since bytes last moved (or since the last pause).
            case notAsked
            /// The next request asks for fresh credentials: the server refused the last ones.
            case asking
            /// Asked, and the request that used them ended: a later refusal reads the manifest again, then pauses.
            case asked
        }
        var renewal = Renewal.notAsked
        /// The manifest was read again: another refusal or 404 does not read it again.
        var manifestReread = false
    }
}
