import Foundation
import Testing

@testable import PackDelivery

/// The download machine with several sources: a failing source hands over at once from the kept bytes (after its own
/// retries, for a 5xx), a round where every source failed counts as one attempt, a source that served wrong bytes is
/// not asked again.
@Suite(.timeLimit(.minutes(1))) struct SourceFailoverMachineTests {
    static let a = URL(string: "http://a.example/p.tar")!
    static let b = URL(string: "http://b.example/p.tar")!

    static func machine() -> DownloadMachine {
        var download = DownloadMachineTests.download()
        download.url = Self.a
        download.sources = [Self.a, Self.b]
        return DownloadMachine(download: download)
    }

    @Test func aFailingSourceHandsOverAtOnceFromTheKeptBytesWithoutItsValidator() {
        var machine = Self.machine()
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: "\"a1\"")
        let actions = machine.transferFinished(token: 1, outcome: .failed(DownloadMachineTests.networkFailure, bytesOnDisk: 400))
        #expect(actions.brief == [.startTransfer(token: 2, fromZero: false)], "no backoff, no restart from zero")
        #expect(machine.download.url == Self.b && machine.download.source == "b.example/p.tar" && machine.validator == nil)
        #expect(machine.download.bytesReceived == 400)
    }

    @Test func whenEverySourceFailedTheAttemptCountsAndTheErrorNamesEach() {
        var machine = Self.machine()
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .failed(DownloadMachineTests.networkFailure, bytesOnDisk: 0))
        let down = TransferFailure(error: PackDeliveryError(.httpStatus, message: "HTTP 503", httpStatus: 503), retryable: true)
        // A 5xx: b is asked again, its retries first (the round is not over while b has them).
        var token = 2
        for _ in 0..<machine.retryPolicy.sourceRetries {
            guard case .scheduleRetry(let retry, _)? = machine.transferFinished(token: token, outcome: .failed(down, bytesOnDisk: 0)).first
            else {
                Issue.record("expected a retry of b")
                return
            }
            #expect(
                machine.retryDue(token: retry).brief == [.startTransfer(token: retry, fromZero: false)] && machine.download.url == Self.b)
            token = retry
        }
        let actions = machine.transferFinished(token: token, outcome: .failed(down, bytesOnDisk: 0), jitter: 0)
        guard case .scheduleRetry(let token, _)? = actions.first else {
            Issue.record("expected a retry after the round, got \(actions)")
            return
        }
        let message = machine.download.error?.message ?? ""
        #expect(message.contains("a.example/p.tar: reset") && message.contains("b.example/p.tar: HTTP 503"), "\(message)")
        #expect(machine.download.error?.code == .httpStatus && machine.download.error?.httpStatus == 503)
        // The retry starts a new round at the first source.
        #expect(machine.retryDue(token: token).brief == [.startTransfer(token: token, fromZero: false)])
        #expect(machine.download.url == Self.a)
    }

    /// A 5xx is a source's passing trouble: the same source is asked again after the policy's backoff, its
    /// ``DownloadMachine/RetryPolicy/sourceRetries`` times, from the kept bytes and without counting as a failed attempt
    /// of the download; then the next source takes over at once.
    @Test func a5xxRetriesItsSourceWithBackoffThenTheNextTakesOverFromTheKeptBytes() {
        var machine = Self.machine()
        _ = machine.start()
        _ = machine.progress(token: 1, bytesOnDisk: 400, validator: "\"a1\"")
        let down = TransferFailure(error: PackDeliveryError(.httpStatus, message: "HTTP 503", httpStatus: 503), retryable: true)
        var token = 1
        for retry in 1...machine.retryPolicy.sourceRetries {
            let actions = machine.transferFinished(token: token, outcome: .failed(down, bytesOnDisk: 400), jitter: 0)
            let delay = machine.retryPolicy.delay(attempt: retry, retryAfter: nil, jitter: 0)
            #expect(actions == [.scheduleRetry(token: token + 1, after: delay)], "retry \(retry) of a, with backoff")
            #expect(machine.download.url == Self.a && machine.download.retryDate != nil && machine.download.error?.httpStatus == 503)
            token += 1
            #expect(machine.retryDue(token: token).brief == [.startTransfer(token: token, fromZero: false)])
            #expect(machine.download.url == Self.a && machine.validator == "\"a1\"", "the same source, its validator kept")
        }
        #expect(machine.attempt == 0, "a source's retries are not the download's failed attempts")
        let actions = machine.transferFinished(token: token, outcome: .failed(down, bytesOnDisk: 400), jitter: 0)
        #expect(actions.brief == [.startTransfer(token: token + 1, fromZero: false)], "then b, at once")
        #expect(machine.download.url == Self.b && machine.download.bytesReceived == 400)
    }

    /// A 5xx whose Retry-After is longer than the policy's longest delay: the next source at once, not a wait.
    @Test func a5xxAskingToWaitLongerThanTheLongestDelayHandsOverAtOnce() {
        var machine = Self.machine()
        _ = machine.start()
        let down = TransferFailure(
            error: PackDeliveryError(.httpStatus, message: "HTTP 503", httpStatus: 503), retryable: true,
            retryAfter: machine.retryPolicy.maxDelay + 1)
        #expect(
            machine.transferFinished(token: 1, outcome: .failed(down, bytesOnDisk: 0)).brief == [.startTransfer(token: 2, fromZero: false)])
        #expect(machine.download.url == Self.b)
    }

    @Test func aSourceWhosePackDoesNotMatchIsNotAskedAgainAndTheNextFetchesFromZero() {
        var machine = Self.machine()
        _ = machine.start()
        let actions = machine.transferFinished(
            token: 1, outcome: .completed(sha256: String(repeating: "cd", count: 32), length: 1000, resumedFrom: 0))
        #expect(actions.brief == [.deleteFiles(staging: true), .startTransfer(token: 2, fromZero: true)])
        #expect(machine.download.url == Self.b && machine.badSources == [Self.a])
        // The good source fails later: the bad one is not tried again, so every source is done.
        let after = machine.transferFinished(token: 2, outcome: .failed(DownloadMachineTests.networkFailure, bytesOnDisk: 0))
        #expect(after.contains { if case .scheduleRetry = $0 { true } else { false } }, "\(after)")
        if case .scheduleRetry(let token, _)? = after.first {
            _ = machine.retryDue(token: token)
            #expect(machine.download.url == Self.b, "the retry skips the source that served wrong bytes")
        }
    }

    @Test func theRankingTriesUnmeasuredSourcesFirstThenTheFastestAndFailuresFade() {
        let now = Date(timeIntervalSince1970: 1_000_000)
        let c = URL(string: "https://c.example/p.tar")!
        var ranking = SourceRanking()
        #expect(ranking.order([Self.a, Self.b, c], now: now) == [Self.a, Self.b, c], "nothing measured: the manifest's order")
        ranking.record(origin: Download.origin(Self.a), bytes: 1_000_000, seconds: 4, failed: false, now: now)
        ranking.record(origin: Download.origin(Self.b), bytes: 1_000_000, seconds: 1, failed: false, now: now)
        #expect(ranking.order([Self.a, Self.b, c], now: now) == [c, Self.b, Self.a], "never measured first, then the fastest")
        ranking.record(origin: Download.origin(c), bytes: 3_000_000, seconds: 1, failed: true, now: now)
        ranking.record(origin: Download.origin(c), bytes: 0, seconds: 1, failed: true, now: now)
        ranking.record(origin: Download.origin(c), bytes: 0, seconds: 1, failed: true, now: now)
        #expect(ranking.order([Self.a, Self.b, c], now: now) == [Self.b, c, Self.a], "three failures: 3 MB/s counts as 0.75")
        #expect(
            ranking.order([Self.a, Self.b, c], now: now.addingTimeInterval(4 * 3_600)) == [c, Self.b, Self.a], "failures fade by the hour")
        #expect(ranking.ranked(now: now).map(\.origin) == ["http://b.example:80", "https://c.example:443", "http://a.example:80"])
    }

    /// Four downloads starting together on a fresh home over [slow a, fast b]: one probes a, one probes b, the other two
    /// spread (fewest in flight), so no more than half wait on the unknown first source; once measured, every new
    /// transfer starts on the fast one, even while a's transfers still run.
    @Test func transfersStartingTogetherProbeEachUnmeasuredSourceOnceThenGoToTheFastest() {
        let now = Date(timeIntervalSince1970: 1_000_000)
        var ranking = SourceRanking()
        var inFlight: [String: Int] = [:]
        var picked: [URL] = []
        for _ in 0..<4 {
            let url = ranking.pick([Self.a, Self.b], inFlight: inFlight, now: now)
            picked.append(url ?? Self.a)
            inFlight[Download.origin(url ?? Self.a), default: 0] += 1
        }
        #expect(picked == [Self.a, Self.b, Self.a, Self.b], "a probe each, then the fewest in flight")
        ranking.record(origin: Download.origin(Self.b), bytes: 60_000, seconds: 0.005, failed: false, now: now)
        inFlight[Download.origin(Self.b), default: 0] -= 1
        #expect(
            ranking.pick([Self.a, Self.b], inFlight: inFlight, now: now) == Self.b, "a is being probed: the measured b, not a second probe")
        ranking.record(origin: Download.origin(Self.a), bytes: 60_000, seconds: 0.06, failed: false, now: now)
        inFlight[Download.origin(Self.a), default: 0] -= 1
        #expect(ranking.pick([Self.a, Self.b], inFlight: inFlight, now: now) == Self.b, "both measured: the fastest")
        #expect(ranking.pick([Self.a, Self.b], inFlight: [:], now: now) == Self.b)
    }

    /// One download at a time (nothing else in flight): each unmeasured source is tried once, in the manifest's order,
    /// then the fastest; a source measured with no bytes (it failed) is left while another has a throughput, and picked
    /// only when every source is unmeasured-and-busy or without bytes, fewest transfers in flight first.
    @Test func oneAtATimeEachSourceIsTriedOnceThenTheFastestAndTheFewestInFlightBreakAStall() {
        let now = Date(timeIntervalSince1970: 1_000_000)
        let c = URL(string: "https://c.example/p.tar")!
        var ranking = SourceRanking()
        #expect(ranking.pick([Self.a, Self.b], inFlight: [:], now: now) == Self.a)
        ranking.record(origin: Download.origin(Self.a), bytes: 1_000_000, seconds: 1, failed: false, now: now)
        #expect(ranking.pick([Self.a, Self.b], inFlight: [:], now: now) == Self.b, "b never measured: probed")
        ranking.record(origin: Download.origin(Self.b), bytes: 0, seconds: 1, failed: true, now: now)
        #expect(ranking.pick([Self.a, Self.b], inFlight: [:], now: now) == Self.a, "b failed with no bytes: a")
        var failing = SourceRanking()
        failing.record(origin: Download.origin(Self.a), bytes: 0, seconds: 1, failed: true, now: now)
        failing.record(origin: Download.origin(Self.b), bytes: 0, seconds: 1, failed: true, now: now)
        let busy = [Download.origin(Self.a): 2, Download.origin(Self.b): 1, Download.origin(c): 1]
        #expect(
            failing.pick([Self.a, Self.b, c], inFlight: busy, now: now) == c,
            "c never measured but probed, b failed: ties go to the order, unmeasured first")
        #expect(failing.pick([Self.a, Self.b], inFlight: busy, now: now) == Self.b, "no bytes anywhere: the fewest in flight")
        #expect(SourceRanking().pick([], inFlight: [:], now: now) == nil)
    }
}
