import Foundation
import Testing

@testable import PackDelivery

/// The download state machine, driven with event sequences: no sockets, no sleeps.
@Suite(.timeLimit(.minutes(5))) struct DownloadMachineTests {
    static let sha = String(repeating: "ab", count: 32)

    static func download(length: Int64 = 1000) -> Download {
        Download(
            id: "d-1", transactionID: "t-1", productIdentifier: "p", contentIdentifier: "p", contentVersion: "1",
            contentLength: length, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
            contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/p.zip")!, sha256: Self.sha,
            unpackedLength: nil, destination: .caches, bytesReceived: 0)
    }

    static let networkFailure = TransferFailure(error: PackDeliveryError(.networkFailure, message: "reset"), retryable: true)

    @Test func startRunsATransferAndCompletionInstalls() {
        var machine = DownloadMachine(download: Self.download())
        #expect(machine.start().brief == [.startTransfer(token: 1, fromZero: false)])
        #expect(machine.state == .active && machine.download.phase == .downloading)
        let moved = machine.progress(token: 1, bytesOnDisk: 500, validator: "\"e1\"")
        #expect(moved)
        #expect(machine.download.progress == 0.5 && machine.validator == "\"e1\"")
        #expect(
            machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)) == [.install(token: 1)])
        #expect(machine.download.phase == .verifying && machine.verified)
        #expect(machine.installFinished(token: 1, result: .success(URL(filePath: "/c/p"))) == [])
        #expect(machine.state == .finished && machine.download.progress == 1 && machine.download.contentURL?.path == "/c/p")
    }

    @Test func aRefusedURLIsLookedUpInTheManifestOnceThenTheDownloadPausesForCredentials() {
        let refused = TransferFailure(error: PackDeliveryError(.unauthorized, message: "403", httpStatus: 403), retryable: false)
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: nil)
        // No credential provider: the manifest is read again, and nothing runs meanwhile (a pause stops nothing).
        #expect(machine.transferFinished(token: 1, outcome: .failed(refused, bytesOnDisk: 400)) == [.reloadManifest(token: 2)])
        #expect(machine.state == .active && machine.download.bytesReceived == 400)
        let renewed = URL(string: "http://127.0.0.1/p.zip?token=2")!
        #expect(machine.manifestReloaded(token: 2, result: .success(renewed)).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.download.url == renewed)
        // Bytes moved: a later refusal may read the manifest again.
        _ = machine.progress(token: 2, bytesOnDisk: 700, validator: nil)
        #expect(machine.transferFinished(token: 2, outcome: .failed(refused, bytesOnDisk: 700)) == [.reloadManifest(token: 3)])
        #expect(machine.manifestReloaded(token: 3, result: .success(renewed)).brief == [.startTransfer(token: 3, fromZero: false)])
        // No bytes since the last reading: pause for credentials, bytes kept, saying what to renew.
        #expect(machine.transferFinished(token: 3, outcome: .failed(refused, bytesOnDisk: 700)) == [])
        #expect(machine.state == .paused && machine.download.pauseReason == .unauthorized && machine.download.bytesReceived == 700)
        // A resume may read it again; a reading that fails pauses with its reason in the hint.
        _ = machine.resume()
        _ = machine.start()
        let token = machine.token
        #expect(machine.transferFinished(token: token, outcome: .failed(refused, bytesOnDisk: 700)) == [.reloadManifest(token: token + 1)])
        let gone = PackDeliveryError(.invalidManifest, message: "The manifest no longer lists p.")
        #expect(machine.manifestReloaded(token: token + 1, result: .failure(gone)) == [])
        #expect(machine.state == .paused && machine.download.pauseReason == .unauthorized)
        #expect(
            machine.download.error?.hint?.contains("Renew the receipt") == true
                && machine.download.error?.hint?.contains("no longer lists p") == true)
    }

    /// With a credential provider, fresh credentials are asked for once between a refusal and the pause: not again for
    /// the request after the manifest is read again (they were asked for 3 times). A resume allows one more.
    @Test func freshCredentialsAreAskedForOnceBeforeThePauseForCredentials() {
        let refused = TransferFailure(error: PackDeliveryError(.unauthorized, message: "401", httpStatus: 401), retryable: false)
        var machine = DownloadMachine(download: Self.download())
        machine.credentialsRenewable = true
        _ = machine.start()
        #expect(!machine.credentialsRefused)
        _ = machine.transferFinished(token: 1, outcome: .failed(refused, bytesOnDisk: 0), jitter: 0)
        #expect(machine.retryDue(token: 2).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.credentialsRefused, "the retry asks for fresh credentials")
        #expect(machine.transferFinished(token: 2, outcome: .failed(refused, bytesOnDisk: 0)) == [.reloadManifest(token: 3)])
        let url = URL(string: "http://127.0.0.1/p.zip?token=2")!
        #expect(machine.manifestReloaded(token: 3, result: .success(url)).brief == [.startTransfer(token: 3, fromZero: false)])
        #expect(!machine.credentialsRefused, "fresh credentials were asked for already")
        #expect(machine.transferFinished(token: 3, outcome: .failed(refused, bytesOnDisk: 0)) == [], "refused again: pause")
        #expect(machine.state == .paused && machine.download.pauseReason == .unauthorized)

        // Resumed (the host renewed them): a refusal asks once more.
        _ = machine.resume()
        _ = machine.start()
        let token = machine.token
        #expect(!machine.credentialsRefused)
        _ = machine.transferFinished(token: token, outcome: .failed(refused, bytesOnDisk: 0), jitter: 0)
        _ = machine.retryDue(token: token + 1)
        #expect(machine.credentialsRefused)
        // A network failure of that request: its retry does not ask again.
        _ = machine.transferFinished(token: token + 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 0), jitter: 0)
        _ = machine.retryDue(token: token + 2)
        #expect(machine.state == .active && !machine.credentialsRefused)
    }

    @Test func aReloadThatArrivesAfterAPauseChangesNothing() {
        let gone = TransferFailure(error: PackDeliveryError(.httpStatus, message: "404", httpStatus: 404), retryable: false)
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(machine.transferFinished(token: 1, outcome: .failed(gone, bytesOnDisk: 0)) == [.reloadManifest(token: 2)])
        #expect(machine.pause(.user) == [])
        #expect(machine.manifestReloaded(token: 2, result: .success(URL(string: "http://elsewhere/p.zip")!)) == [])
        #expect(machine.state == .paused && machine.download.url.host() == "127.0.0.1")
    }

    @Test func staleEventsFromAnEarlierTransferChangeNothing() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.pause(.user)
        _ = machine.resume()
        _ = machine.start()
        let stale = machine.progress(token: 1, bytesOnDisk: 900, validator: nil)
        #expect(stale == false)
        #expect(machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)) == [])
        #expect(machine.state == .active && machine.download.bytesReceived == 0)
    }

    @Test func retryableFailuresBackOffAndTheBudgetRestartsWhenMoreBytesAreKept() {
        var machine = DownloadMachine(download: Self.download(), retryPolicy: .init(maxAttempts: 3, baseDelay: 1, maxDelay: 8))
        _ = machine.start()
        var actions = machine.transferFinished(token: 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 100), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 2, after: 1)])
        #expect(machine.download.retryDate != nil, "the wait is visible")
        #expect(machine.retryDue(token: 2).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.download.retryDate == nil)
        actions = machine.transferFinished(token: 2, outcome: .failed(Self.networkFailure, bytesOnDisk: 100), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 3, after: 2)])
        _ = machine.retryDue(token: 3)
        // Bytes received do not reset the count by themselves…
        let arrived = machine.progress(token: 3, bytesOnDisk: 200, validator: nil)
        #expect(arrived)
        #expect(machine.attempt == 2)
        // …an attempt that ends with more bytes kept than ever does.
        actions = machine.transferFinished(token: 3, outcome: .failed(Self.networkFailure, bytesOnDisk: 200), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 4, after: 1)])
        #expect(machine.download.bytesReceived == 200)
    }

    @Test func aServerThatSendsTheSameBytesAgainAndThrowsThemAwayRunsOutOfAttempts() {
        // A 200 of the whole (short) file, then a 416 that empties it, again and again.
        var machine = DownloadMachine(download: Self.download(), retryPolicy: .init(maxAttempts: 4, baseDelay: 1, maxDelay: 8))
        _ = machine.start()
        var token = 1
        var attempts = 0
        while machine.state == .active, attempts < 20 {
            attempts += 1
            _ = machine.progress(token: token, bytesOnDisk: 999, validator: nil)
            let kept: Int64 = attempts % 2 == 1 ? 999 : 0  // the 416 attempt truncates the file
            let failure = TransferFailure(error: PackDeliveryError(.lengthMismatch, message: "1 byte shorter"), retryable: true)
            if machine.transferFinished(token: token, outcome: .failed(failure, bytesOnDisk: kept), jitter: 0).isEmpty { break }
            token += 1
            _ = machine.retryDue(token: token)
        }
        #expect(machine.state == .failed && machine.download.error?.code == .lengthMismatch)
        #expect(attempts <= 5, "ended after the retry limit, not after \(attempts) attempts")
    }

    @Test func failuresThatAlwaysCountEndEvenWhileBytesTrickleIn() {
        // A server slower than the low-speed limit keeps adding a few bytes per attempt.
        var machine = DownloadMachine(download: Self.download(), retryPolicy: .init(maxAttempts: 3, baseDelay: 1, maxDelay: 8))
        _ = machine.start()
        let slow = TransferFailure(error: PackDeliveryError(.timedOut, message: "too slow"), retryable: true, countsAlways: true)
        #expect(
            machine.transferFinished(token: 1, outcome: .failed(slow, bytesOnDisk: 10), jitter: 0) == [.scheduleRetry(token: 2, after: 0.5)]
        )
        _ = machine.retryDue(token: 2)
        #expect(
            machine.transferFinished(token: 2, outcome: .failed(slow, bytesOnDisk: 20), jitter: 0) == [.scheduleRetry(token: 3, after: 1)])
        _ = machine.retryDue(token: 3)
        #expect(machine.transferFinished(token: 3, outcome: .failed(slow, bytesOnDisk: 30), jitter: 0) == [])
        #expect(machine.state == .failed && machine.download.error?.code == .timedOut && machine.download.bytesReceived == 30)
    }

    @Test func theWatchdogRetriesAStuckDownloadThenFailsNamingThePhase() {
        var machine = DownloadMachine(
            download: Self.download(), retryPolicy: .init(maxAttempts: 2, baseDelay: 1, maxDelay: 8, watchdog: 10))
        let t0 = Date(timeIntervalSince1970: 1000)
        _ = machine.start(now: t0)
        _ = machine.progress(token: 1, bytesOnDisk: 100, validator: nil, now: t0.addingTimeInterval(1))
        #expect(machine.tick(now: t0.addingTimeInterval(10)) == [], "moved 9 s ago")
        #expect(machine.tick(now: t0.addingTimeInterval(12)) == [.stopTransfer(token: 1), .scheduleRetry(token: 2, after: 0.75)])
        #expect(machine.download.error?.code == .stalled && machine.state == .active)
        #expect(machine.retryDue(token: 2, now: t0.addingTimeInterval(13)).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.tick(now: t0.addingTimeInterval(24)) == [.stopTransfer(token: 2)])
        #expect(machine.state == .failed && machine.download.error?.code == .stalled)
        #expect(machine.download.error?.message.contains("downloading") == true)
    }

    @Test func theWatchdogRestartsAStuckUnpackOnlyOnceTheStoppedOneHasReturned() {
        var machine = DownloadMachine(
            download: Self.download(), retryPolicy: .init(maxAttempts: 3, baseDelay: 1, maxDelay: 8, watchdog: 10))
        let t0 = Date(timeIntervalSince1970: 1000)
        _ = machine.start(now: t0)
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0), now: t0)
        _ = machine.installProgress(token: 1, phase: .unpacking, fraction: 0.1, now: t0.addingTimeInterval(1))
        #expect(machine.tick(now: t0.addingTimeInterval(12)) == [.stopInstall, .scheduleRetry(token: 2, after: 0.75)])
        #expect(machine.retryDue(token: 2, now: t0.addingTimeInterval(13)) == [], "the stuck unpack still owns the staging folder")
        #expect(
            machine.installFinished(token: 1, result: .failure(.stopped("stopped")), now: t0.addingTimeInterval(14)) == [.install(token: 2)]
        )
        #expect(machine.installFinished(token: 2, result: .success(URL(filePath: "/c/p"))) == [])
        #expect(machine.state == .finished)
    }

    /// The content in place is not yet a finished download: the machine orders the commit with the row to record (the
    /// download as it is once finished), and finishes only when the commit returns; a commit that fails is the install's
    /// failure. An install stopped by a pause that completed anyway is committed finished, as it is.
    @Test func anInstallIsCommittedWithTheRowTheMachineGivesAndFinishesOnlyOnceRecorded() throws {
        let pack = InstalledPack(
            install: DeliveryPlanTests.installed, files: [], leftovers: [URL(filePath: "/c/.packdelivery/staging/d-1")])
        var machine = DownloadMachine(download: Self.download(), validator: "\"v1\"")
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        let order = machine.installed(token: 1, pack: pack)
        guard case .commitInstall(1, let committed, let finished) = order.first, order.count == 1 else {
            Issue.record("one commit order: \(order)")
            return
        }
        #expect(committed == pack)
        #expect(finished.state == .finished && finished.download.contentURL == pack.contentURL && finished.download.progress == 1)
        #expect(finished.validator == "\"v1\"" && finished.download.bytesReceived == 1000)
        #expect(machine.state == .active, "not finished before the commit returns")
        var failing = machine
        _ = failing.installFinished(token: 1, result: .failure(PackDeliveryError(.databaseBusy, message: "busy")))
        #expect(failing.state == .active && failing.stage.kind == .waitingToRetry, "a commit that fails is retried as the install")
        #expect(machine.installFinished(token: 1, result: .success(pack.contentURL)) == [] && machine.state == .finished)

        var paused = DownloadMachine(download: Self.download())
        _ = paused.start()
        _ = paused.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        _ = paused.installProgress(token: 1, phase: .unpacking, fraction: 0.5)
        #expect(paused.pause(.user) == [.stopInstall])
        guard case .commitInstall(1, _, let late)? = paused.installed(token: 1, pack: pack).first else {
            Issue.record("a stopped install that completed is committed")
            return
        }
        #expect(late.state == .finished, "it completed before the stop reached it")
    }

    @Test func aDeltaInstallWaitingForAStoppedOneStartsWhenItReturns() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(machine.transferFinished(token: 1, outcome: .assembled(fetched: 100)) == [.install(token: 1)])
        #expect(machine.pause(.user) == [.stopInstall])
        _ = machine.resume()
        let token = machine.start().count == 1 ? machine.token : -1
        #expect(
            machine.transferFinished(token: token, outcome: .assembled(fetched: 100)) == [], "the stopped install owns the staging folder")
        #expect(machine.installFinished(token: 1, result: .failure(.stopped("stopped"))) == [.install(token: token)])
        #expect(machine.installFinished(token: token, result: .success(URL(filePath: "/c/p"))) == [] && machine.state == .finished)
    }

    @Test func aCancelForgetsTheBytesOfATransferAPauseStopped() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.pause(.user)
        _ = machine.cancel()
        _ = machine.transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 420))
        #expect(machine.state == .cancelled && machine.download.bytesReceived == 0 && machine.download.progress == 0)
    }

    @Test func anInstallThatCompletedBeforeTheStopReachedItCountsAsFinished() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        _ = machine.pause(.user)
        #expect(machine.installFinished(token: 1, result: .success(URL(filePath: "/c/p"))) == [])
        #expect(machine.state == .finished && machine.download.contentURL?.path == "/c/p" && machine.download.pauseReason == nil)
    }

    @Test func retriesRunOutIntoFailedWhichResumesKeepingBytes() {
        var machine = DownloadMachine(download: Self.download(), retryPolicy: .init(maxAttempts: 2, baseDelay: 1, maxDelay: 8))
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 300), jitter: 0)
        _ = machine.retryDue(token: 2)
        #expect(machine.transferFinished(token: 2, outcome: .failed(Self.networkFailure, bytesOnDisk: 300), jitter: 0) == [])
        #expect(machine.state == .failed && machine.download.error?.kind == .network)
        #expect(machine.resume() == [])
        #expect(machine.state == .waiting && machine.download.bytesReceived == 300 && machine.download.error == nil)
        #expect(machine.start().brief == [.startTransfer(token: 4, fromZero: false)])
    }

    @Test func retryAfterIsHonoured() {
        let policy = DownloadMachine.RetryPolicy(maxAttempts: 5, baseDelay: 0.5, maxDelay: 30)
        #expect(policy.delay(attempt: 1, retryAfter: 7, jitter: 0) == 7)
        #expect(policy.delay(attempt: 10, retryAfter: nil, jitter: 1) == 30)
        #expect(policy.delay(attempt: 2, retryAfter: nil, jitter: 0) == 0.5)
    }

    @Test func pauseDuringRetryBackoffCancelsTheRetry() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 100), jitter: 0)
        #expect(machine.pause(.user) == [])  // nothing is transferring
        #expect(machine.state == .paused && machine.download.pauseReason == .user)
        #expect(machine.retryDue(token: 2) == [])
        #expect(machine.state == .paused)
    }

    @Test func pauseWhileDownloadingStopsTheTransferAndKeepsBytes() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: nil)
        #expect(machine.pause(.user) == [.stopTransfer(token: 1)])
        #expect(machine.transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 420)) == [])
        // The paused download reports every byte it keeps, not the last progress step.
        #expect(machine.state == .paused && machine.download.bytesReceived == 420 && machine.download.progress == 0.42)
    }

    /// A pause is reported once the transfer it stopped says how many bytes it kept, so the first `paused` update
    /// never under-reports them (it showed the last progress step, then the bytes kept).
    @Test func aPauseIsReportedOnlyWithTheBytesItsStoppedTransferKept() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: nil)
        #expect(machine.pause(.user) == [.stopTransfer(token: 1)])
        #expect(machine.state == .paused && !machine.reportable, "not reported before the transfer said what it kept")
        #expect(machine.transferFinished(token: 1, outcome: .stopped(bytesOnDisk: 650)) == [])
        #expect(machine.reportable && machine.state == .paused && machine.download.bytesReceived == 650)

        // The transfer had ended on its own before the stop reached it: its ending says what it kept; still paused.
        var ended = DownloadMachine(download: Self.download())
        _ = ended.start()
        _ = ended.progress(token: 1, bytesOnDisk: 400, validator: nil)
        _ = ended.pause(.user)
        #expect(ended.transferFinished(token: 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 500)) == [])
        #expect(ended.reportable && ended.state == .paused && ended.download.pauseReason == .user)
        #expect(ended.download.bytesReceived == 500 && ended.download.error == nil)

        // Resumed before the stop was heard: nothing is held back.
        var resumed = DownloadMachine(download: Self.download())
        _ = resumed.start()
        _ = resumed.pause(.user)
        _ = resumed.resume()
        #expect(resumed.reportable && resumed.state == .waiting)
        // Paused where nothing was transferring: reported at once.
        var idle = DownloadMachine(download: Self.download())
        _ = idle.pause(.user)
        #expect(idle.reportable && idle.state == .paused)
    }

    /// The previous attempt's error (an `unauthorized` before renewed credentials, a reset) is cleared as soon as the
    /// download moves again, also when the bytes start over from zero below what the failed attempt had.
    @Test func theErrorOfAFailedAttemptClearsWhenTheDownloadMovesAgain() {
        let refused = TransferFailure(error: PackDeliveryError(.unauthorized, message: "401", httpStatus: 401), retryable: false)
        var machine = DownloadMachine(download: Self.download())
        machine.credentialsRenewable = true
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: nil)
        _ = machine.transferFinished(token: 1, outcome: .failed(refused, bytesOnDisk: 400), jitter: 0)
        #expect(machine.retryDue(token: 2).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.credentialsRefused, "the retry asks for fresh credentials")
        #expect(machine.download.error?.code == .unauthorized, "shown until the download moves")
        _ = machine.progress(token: 2, bytesOnDisk: 400, validator: nil)
        #expect(machine.download.error?.code == .unauthorized, "no byte moved yet")
        _ = machine.progress(token: 2, bytesOnDisk: 700, validator: nil)
        #expect(machine.download.error == nil && machine.state == .active, "moving again: the refusal is past")

        // A reset, then a server that ignores the range: the retry starts over from zero, below the 700 kept before.
        _ = machine.transferFinished(token: 2, outcome: .failed(Self.networkFailure, bytesOnDisk: 700), jitter: 0)
        _ = machine.retryDue(token: 3)
        #expect(machine.download.error?.code == .networkFailure)
        _ = machine.progress(token: 3, bytesOnDisk: 64, validator: nil)
        #expect(machine.download.error == nil && machine.download.bytesReceived == 64, "it moves again, from zero")
    }

    @Test func cancellingADownloadPausedForSpaceDropsTheSpaceError() {
        // The cancelled event still carried the insufficientStorage error.
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        let full = TransferFailure(error: .insufficientStorage(path: "/x", needed: 600, available: 10), retryable: false)
        _ = machine.transferFinished(token: 1, outcome: .failed(full, bytesOnDisk: 400))
        #expect(machine.download.error?.code == .insufficientStorage)
        _ = machine.cancel()
        #expect(machine.state == .cancelled && machine.download.error == nil && machine.download.pauseReason == nil)
    }

    @Test func spaceReturningResumesOnlyADownloadPausedForSpace() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        let full = TransferFailure(error: .insufficientStorage(path: "/x", needed: 600, available: 10), retryable: false)
        _ = machine.transferFinished(token: 1, outcome: .failed(full, bytesOnDisk: 400))
        _ = machine.pause(.user)
        #expect(machine.download.pauseReason == .user && machine.download.error == nil)
        #expect(machine.spaceReturned() == [] && machine.state == .paused, "the user paused it: only the user resumes it")
        _ = machine.resume()
        _ = machine.start()
        _ = machine.transferFinished(token: machine.token, outcome: .failed(full, bytesOnDisk: 400))
        _ = machine.spaceReturned()
        #expect(machine.state == .waiting && machine.download.bytesReceived == 400)
    }

    @Test func pauseWhileUnpackingStopsTheInstallAndResumeOnlyUnpacks() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        #expect(machine.pause(.user) == [.stopInstall])
        #expect(machine.installFinished(token: 1, result: .failure(PackDeliveryError(.cancelled, message: "stopped"))) == [])
        #expect(machine.state == .paused)
        _ = machine.resume()
        #expect(machine.start() == [.install(token: 3)])
    }

    @Test func cancelWhileWaitingDeletesFiles() {
        var machine = DownloadMachine(download: Self.download())
        #expect(machine.cancel() == [.deleteFiles(staging: true)])
        #expect(machine.state == .cancelled)
        #expect(machine.start() == [])
        #expect(machine.resume() == [])
    }

    @Test func cancelWhileDownloadingStopsAndDeletes() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(machine.cancel() == [.stopTransfer(token: 1), .deleteFiles(staging: true)])
        #expect(machine.state == .cancelled && machine.download.bytesReceived == 0)
    }

    @Test func finishedDownloadsIgnorePauseAndCancel() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        _ = machine.installFinished(token: 1, result: .success(URL(filePath: "/x")))
        #expect(machine.pause(.user) == [] && machine.cancel() == [])
        #expect(machine.state == .finished)
    }

    @Test func aResumedFileWithTheWrongChecksumIsFetchedOnceMoreFromZero() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        let wrong = String(repeating: "cd", count: 32)
        #expect(
            machine.transferFinished(token: 1, outcome: .completed(sha256: wrong, length: 1000, resumedFrom: 600)).brief == [
                .startTransfer(token: 2, fromZero: true)
            ])
        #expect(machine.retriedFromZero)
        #expect(
            machine.transferFinished(token: 2, outcome: .completed(sha256: wrong, length: 1000, resumedFrom: 0)) == [
                .deleteFiles(staging: true)
            ])
        #expect(machine.state == .failed && machine.download.error?.kind == .badData)
        #expect(machine.download.error?.message.contains(wrong) == true)
    }

    @Test func aFreshFileWithTheWrongChecksumFailsAtOnce() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(
            machine.transferFinished(token: 1, outcome: .completed(sha256: String(repeating: "0", count: 64), length: 1000, resumedFrom: 0))
                == [.deleteFiles(staging: true)])
        #expect(machine.state == .failed)
    }

    @Test func diskFullPausesWithTheReasonAndKeepsBytes() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        let full = TransferFailure(error: .insufficientStorage(path: "/x", needed: 600, available: 10), retryable: false)
        #expect(machine.transferFinished(token: 1, outcome: .failed(full, bytesOnDisk: 400)) == [])
        #expect(machine.state == .paused && machine.download.pauseReason == .insufficientStorage)
        #expect(machine.download.bytesReceived == 400 && machine.download.error?.neededBytes == 600)
        // Disk full while unpacking keeps the verified archive.
        var other = DownloadMachine(download: Self.download())
        _ = other.start()
        _ = other.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        #expect(other.installFinished(token: 1, result: .failure(.insufficientStorage(path: "/x", needed: nil, available: nil))) == [])
        #expect(other.state == .paused && other.verified)
    }

    @Test func anUnsafePackFailsAndDeletesTheArchive() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        #expect(machine.installFinished(token: 1, result: .failure(.unsafeEntry("../x", "escapes"))) == [.deleteFiles(staging: true)])
        #expect(machine.state == .failed && !machine.verified && machine.download.error?.subject == "../x")
    }

    @Test func rateEstimateGivesTimeRemainingOnlyOnceKnown() {
        var rate = RateEstimator()
        let start = Date(timeIntervalSince1970: 0)
        #expect(rate.timeRemaining(remaining: 1000) == -1)
        rate.add(bytes: 0, at: start)
        rate.add(bytes: 1000, at: start.addingTimeInterval(1))
        #expect(rate.timeRemaining(remaining: 5000) == 5)
    }
}

@Suite(.timeLimit(.minutes(5))) struct ResponseDecisionTests {
    let url = "http://h/p"

    func decide(_ status: Int, range: String? = nil, length: String? = nil, retryAfter: String? = nil, offset: Int64, expected: Int64)
        -> ResponseDecision
    {
        ResponseDecision.decide(
            status: status, headers: .init(contentRange: range, contentLength: length, retryAfter: retryAfter),
            offset: offset, expectedLength: expected, url: self.url)
    }

    /// A delta's range request (bytes 100..<200 of a 1000-byte pack, 20 of them kept): the same statuses, plus what
    /// only a range can say — another range, another total, another validator.
    @Test func aRangeRequestIsDecidedByTheSameRulesAndSaysWhatTheServerDid() {
        func decide(_ status: Int, _ contentRange: String? = nil, validator: String? = "\"b\"", retryAfter: String? = nil)
            -> ResponseDecision
        {
            ResponseDecision.decide(
                status: status, headers: .init(contentRange: contentRange, retryAfter: retryAfter),
                range: ByteRange(bytes: 100..<200, fileLength: 1000), offset: 20, validator: validator, expectedValidator: "\"b\"",
                url: self.url)
        }
        func problem(_ decision: ResponseDecision) -> (TransferFailure.RangeProblem?, discard: Bool, failure: TransferFailure?) {
            guard case .reject(let failure, let discard) = decision else { return (nil, false, nil) }
            return (failure.rangeProblem, discard, failure)
        }
        #expect(decide(206, "bytes 120-199/1000") == .append)
        #expect(decide(206, "bytes 120-199/1000", validator: nil) == .append, "no validator: nothing to compare")
        #expect(problem(decide(206, "bytes 121-199/1000")).0 == .ignored, "another start")
        #expect(problem(decide(206, "bytes 120-250/1000")).0 == .ignored, "more than was asked for")
        #expect(problem(decide(206, "bytes 120-199/*")).0 == .ignored, "no total")
        #expect(problem(decide(206, "bytes 120-199/1001")).0 == .fileChanged, "another length")
        #expect(problem(decide(206, "bytes 120-199/1000", validator: "\"c\"")).0 == .fileChanged, "another ETag")
        #expect(problem(decide(206, "bytes 120-199/1000", validator: "\"c\"")).discard, "the kept bytes are of another version")
        #expect(problem(decide(200)).0 == .ignored && problem(decide(416, "bytes */1000")).0 == .ignored)
        let busy = problem(decide(503, retryAfter: "7"))
        #expect(busy.0 == nil && busy.failure?.retryable == true && busy.failure?.retryAfter == 7 && !busy.discard, "Retry-After")
        #expect(problem(decide(401)).failure?.error.code == .unauthorized)
    }

    @Test func a206MustStartWhereWeAsked() {
        #expect(self.decide(206, range: "bytes 100-999/1000", offset: 100, expected: 1000) == .append)
        guard case .reject(let failure, let discard) = self.decide(206, range: "bytes 0-999/1000", offset: 100, expected: 1000) else {
            Issue.record("a mismatched Content-Range must be rejected")
            return
        }
        #expect(failure.retryable && failure.countsAlways && discard)
    }

    @Test func aTotalThatDiffersFromTheManifestMeansTheFileChanged() {
        // The partial is from another version; start over, and say how the lengths differ.
        guard case .reject(let failure, let discard) = self.decide(206, range: "bytes 100-999/2000", offset: 100, expected: 1000) else {
            Issue.record("a different total must be rejected")
            return
        }
        #expect(discard && failure.error.code == .lengthMismatch && failure.countsAlways)
        #expect(failure.error.message.contains("1000 bytes longer"))
    }

    @Test func a200RestartsFromZeroUnlessItsLengthDisagreesWithTheManifest() {
        #expect(self.decide(200, offset: 500, expected: 1000) == .restartFromZero)
        #expect(self.decide(200, length: "1000", offset: 500, expected: 1000) == .restartFromZero)
        // A stale manifest one byte longer than the file is said at once, without downloading the body.
        guard case .reject(let failure, let discard) = self.decide(200, length: "999", offset: 0, expected: 1000) else {
            Issue.record("a 200 of another length must be rejected")
            return
        }
        #expect(!discard && failure.retryable && failure.countsAlways && failure.error.code == .lengthMismatch)
        #expect(failure.error.message.contains("1 byte shorter than the manifest says"))
    }

    @Test func a416IsCompleteOnlyForAWholeFileOfTheRightLength() {
        #expect(self.decide(416, range: "bytes */1000", offset: 1000, expected: 1000) == .complete)
        #expect(self.decide(416, offset: 1000, expected: 1000) == .complete)
        guard case .reject(let short, _) = self.decide(416, range: "bytes */999", offset: 999, expected: 1000) else {
            Issue.record("a 416 that says the file is shorter must be rejected")
            return
        }
        #expect(short.error.code == .lengthMismatch && short.countsAlways)
        guard case .reject(let odd, let discard) = self.decide(416, range: "bytes */1000", offset: 500, expected: 1000) else {
            Issue.record("a 416 in the middle must be rejected")
            return
        }
        #expect(discard && odd.retryable && odd.countsAlways)
    }

    @Test func serverErrorsAreRetriedAndOther4xxAreNot() {
        for status in [408, 429, 500, 502, 503] {
            guard case .reject(let failure, _) = self.decide(status, retryAfter: "3", offset: 0, expected: 1) else {
                Issue.record("\(status) must be rejected")
                continue
            }
            #expect(failure.retryable && failure.retryAfter == 3 && !failure.countsAlways)
        }
        guard case .reject(let wait, _) = self.decide(503, retryAfter: "300", offset: 0, expected: 1) else { return }
        #expect(wait.error.message.contains("503") && wait.error.message.contains("5 min"), "the wait is said")
        guard case .reject(let failure, _) = self.decide(404, offset: 0, expected: 1) else {
            Issue.record("404 must be rejected")
            return
        }
        #expect(
            !failure.retryable && failure.error.code == .httpStatus && failure.error.httpStatus == 404
                && failure.error.message.contains("404"))
        guard case .reject(let refused, _) = self.decide(403, offset: 0, expected: 1) else { return }
        #expect(refused.error.code == .unauthorized && refused.error.kind == .unauthorized)
    }

    @Test func retryAfterAsAnHTTPDate() {
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        let seconds = ResponseDecision.retryAfterSeconds("Tue, 14 Nov 2023 22:13:30 GMT", now: now)
        #expect(seconds == 10)
        #expect(ResponseDecision.retryAfterSeconds("inf", now: now) == nil)
        #expect(ContentRange("bytes 5-9/*")?.total == nil)
        #expect(ContentRange("bytes 9-5/10") == nil)
        #expect(ContentRange.unsatisfiedTotal("bytes */1234") == 1234)
    }

    @Test func whatTheServerSaidIsShortAndPrintable() {
        let s3 = Data("<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>".utf8)
        #expect(CurlTransfer.excerpt(s3) == "Request has expired")
        #expect(CurlTransfer.excerpt(Data("\n\nforbidden\u{1B}]0;pwned\u{07}\nmore".utf8)) == "forbidden\\x1B]0;pwned\\x07")
        #expect(CurlTransfer.excerpt(Data()) == nil)
    }
}

@Suite(.timeLimit(.minutes(5))) struct ManifestTests {
    let base = URL(string: "http://127.0.0.1:8080/site/manifest.json")!

    @Test func relativeAndAbsoluteURLsResolveAgainstTheManifest() throws {
        let json = """
            {"products":[{"productIdentifier":"com.example.forest","contents":[
              {"contentIdentifier":"com.example.forest","contentVersion":"1.0","url":"packs/forest-1.0.zip","contentLength":1234,
               "sha256":"\(String(repeating: "a", count: 64))","unpackedLength":5678, "extra": true},
              {"contentIdentifier":"com.example.forest.music","contentVersion":"1.0","url":"https://cdn.example.com/m.tar.zst","contentLength":1,
               "sha256":"\(String(repeating: "b", count: 64))"}]}]}
            """
        let loaded = try LoadedManifest.decode(Data(json.utf8), from: self.base)
        let product = try #require(loaded.manifest.product("com.example.forest"))
        #expect(try loaded.packURL(for: product.contents[0]).absoluteString == "http://127.0.0.1:8080/site/packs/forest-1.0.zip")
        #expect(try loaded.packURL(for: product.contents[1]).absoluteString == "https://cdn.example.com/m.tar.zst")
        #expect(product.contents[0].unpackedLength == 5678 && product.contents[1].unpackedLength == nil)
    }

    @Test func errorsNameTheProblem() {
        func message(_ json: String) -> String? {
            do {
                _ = try LoadedManifest.decode(Data(json.utf8), from: self.base)
                return nil
            } catch { return error.kind == .badData ? error.message : "wrong kind" }
        }
        #expect(message("not json")?.contains("not JSON") == true)
        #expect(
            message(#"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p"}]}]}"#)?.contains("contentVersion") == true
        )
        #expect(
            message(
                #"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p","contentVersion":"1","url":"a","contentLength":1,"sha256":"xyz"}]}]}"#
            )?.contains("sha256") == true)
        #expect(message(#"{"products":[{"productIdentifier":"../p","contents":[]}]}"#)?.contains("productIdentifier") == true)
    }

    @Test func aMissingLocalManifestIsBadData() {
        #expect(throws: PackDeliveryError.self) { try LoadedManifest.load("/nonexistent/manifest.json") }
        do { _ = try LoadedManifest.load("/nonexistent/manifest.json") } catch {
            #expect(error.kind == .badData && error.message.contains("no such file"))
        }
    }
}
