import Foundation
import Testing

@testable import PackDelivery

/// The download machine with several sources: a failing source hands over at once from the kept bytes, a round where
/// every source failed counts as one attempt, a source that served wrong bytes is not asked again.
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
        #expect(actions == [.startTransfer(token: 2, fromZero: false)], "no backoff, no restart from zero")
        #expect(machine.download.url == Self.b && machine.download.source == "b.example/p.tar" && machine.validator == nil)
        #expect(machine.download.bytesReceived == 400)
    }

    @Test func whenEverySourceFailedTheAttemptCountsAndTheErrorNamesEach() {
        var machine = Self.machine()
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .failed(DownloadMachineTests.networkFailure, bytesOnDisk: 0))
        let down = TransferFailure(error: PackDeliveryError(.httpStatus, message: "HTTP 503", httpStatus: 503), retryable: true)
        let actions = machine.transferFinished(token: 2, outcome: .failed(down, bytesOnDisk: 0), jitter: 0)
        guard case .scheduleRetry(let token, _)? = actions.first else {
            Issue.record("expected a retry after the round, got \(actions)")
            return
        }
        let message = machine.download.error?.message ?? ""
        #expect(message.contains("a.example/p.tar: reset") && message.contains("b.example/p.tar: HTTP 503"), "\(message)")
        #expect(machine.download.error?.code == .httpStatus && machine.download.error?.httpStatus == 503)
        // The retry starts a new round at the first source.
        #expect(machine.retryDue(token: token) == [.startTransfer(token: token, fromZero: false)])
        #expect(machine.download.url == Self.a)
    }

    @Test func aSourceWhosePackDoesNotMatchIsNotAskedAgainAndTheNextFetchesFromZero() {
        var machine = Self.machine()
        _ = machine.start()
        let actions = machine.transferFinished(
            token: 1, outcome: .completed(sha256: String(repeating: "cd", count: 32), length: 1000, resumedFrom: 0))
        #expect(actions == [.deleteFiles(staging: true), .startTransfer(token: 2, fromZero: true)])
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
}
