import Foundation
import Testing

@testable import PackDelivery

/// Every event fed to every stage of the download machine: no event leads to a stage its table does not list,
/// events of stopped work change nothing, and work the machine starts carries its newest token. No sockets, no sleeps.
@Suite(.timeLimit(.minutes(1))) struct DownloadStageTests {
    typealias Machine = DownloadMachine
    static let t0 = Date(timeIntervalSince1970: 1_000_000)
    static let sha = DownloadMachineTests.sha
    static let failure = TransferFailure(error: PackDeliveryError(.networkFailure, message: "reset"), retryable: true)
    static func refused(_ status: Int) -> TransferFailure {
        TransferFailure(
            error: PackDeliveryError(status == 404 ? .httpStatus : .unauthorized, message: "\(status)", httpStatus: status),
            retryable: false)
    }
    static let full = TransferFailure(error: .insufficientStorage(path: "/h", needed: 10, available: 1), retryable: false)

    /// A machine in each stage (and the variants whose data changes what events do), reached by events only.
    static func samples() -> [(name: String, machine: Machine)] {
        func made(_ steps: (inout Machine) -> Void) -> Machine {
            var machine = Machine(download: DownloadMachineTests.download(), retryPolicy: .init(maxAttempts: 3, watchdog: 10))
            steps(&machine)
            return machine
        }
        let completed = TransferOutcome.completed(sha256: Self.sha, length: 1000, resumedFrom: 0)
        return [
            ("waiting", made { _ in }),
            ("transferring", made { _ = $0.start(now: Self.t0) }),
            (
                "transferring after a retry",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.failure, bytesOnDisk: 10), jitter: 0, now: Self.t0)
                    _ = $0.retryDue(token: 2, now: Self.t0)
                }
            ),
            (
                "waitingToRetry",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.failure, bytesOnDisk: 10), jitter: 0, now: Self.t0)
                }
            ),
            (
                "reloadingManifest",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.refused(404), bytesOnDisk: 10), now: Self.t0)
                }
            ),
            (
                "installing",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                }
            ),
            (
                "installing, moving into place",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                    _ = $0.installProgress(token: 1, phase: .installing, fraction: 0.5, now: Self.t0)
                }
            ),
            (
                "installing after a stopped install",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                    _ = $0.tick(now: Self.t0.addingTimeInterval(11))
                    _ = $0.retryDue(token: 2, now: Self.t0.addingTimeInterval(12))
                }
            ),
            (
                "waitingToRetry an unpack",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                    _ = $0.installProgress(token: 1, phase: .unpacking, fraction: 0.2, now: Self.t0)
                    _ = $0.installFinished(token: 1, result: .failure(PackDeliveryError(.databaseBusy, message: "x")), now: Self.t0)
                }
            ),
            (
                "waitingToRetry a move into place",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                    _ = $0.installProgress(token: 1, phase: .installing, fraction: 0.2, now: Self.t0)
                    _ = $0.installFinished(token: 1, result: .failure(PackDeliveryError(.databaseBusy, message: "x")), now: Self.t0)
                }
            ),
            (
                "transferring while a stopped delta install winds down",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .assembled(fetched: 100), now: Self.t0)
                    _ = $0.pause(.user)
                    _ = $0.resume()
                    _ = $0.start(now: Self.t0)
                }
            ),
            (
                "reloadingManifest after a refusal",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.refused(401), bytesOnDisk: 10), now: Self.t0)
                }
            ),
            (
                "paused for credentials",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.refused(401), bytesOnDisk: 10), now: Self.t0)
                    _ = $0.manifestReloaded(token: 2, result: .failure(PackDeliveryError(.invalidManifest, message: "gone")), now: Self.t0)
                }
            ),
            (
                "paused",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.pause(.user)
                }
            ),
            (
                "paused for space",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .failed(Self.full, bytesOnDisk: 10), now: Self.t0)
                }
            ),
            (
                "failed",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: .completed(sha256: "00", length: 1000, resumedFrom: 0), now: Self.t0)
                }
            ),
            (
                "finished",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.transferFinished(token: 1, outcome: completed, now: Self.t0)
                    _ = $0.installFinished(token: 1, result: .success(URL(filePath: "/c/p")), now: Self.t0)
                }
            ),
            (
                "cancelled",
                made {
                    _ = $0.start(now: Self.t0)
                    _ = $0.cancel()
                }
            ),
        ]
    }

    /// Every event, for work with token `token` (a token-less event ignores it).
    static func events(token: Int) -> [(name: String, apply: (inout Machine) -> [Machine.Action])] {
        let now = Self.t0.addingTimeInterval(1)
        let good = TransferOutcome.completed(sha256: Self.sha, length: 1000, resumedFrom: 0)
        let delta = Download.Delta(bytesToFetch: 100, bytesReused: 900, entriesToFetch: 1, filesReused: 1, bytesKept: 0)
        return [
            ("start", { $0.start(now: now) }),
            (
                "progress",
                {
                    _ = $0.progress(token: token, bytesOnDisk: 500, validator: "\"e\"", now: now)
                    return []
                }
            ),
            (
                "streamProgress",
                {
                    $0.streamProgress(token: token, bytes: 10, now: now)
                    return []
                }
            ),
            (
                "deltaPlanned",
                { $0.deltaPlanned(token: token, delta: delta, now: now) }
            ),
            (
                "durable",
                {
                    $0.durable(token: token, bytes: 5)
                    return []
                }
            ),
            ("completed", { $0.transferFinished(token: token, outcome: good, jitter: 0, now: now) }),
            (
                "completed, wrong hash",
                { $0.transferFinished(token: token, outcome: .completed(sha256: "00", length: 1000, resumedFrom: 9), now: now) }
            ),
            ("assembled", { $0.transferFinished(token: token, outcome: .assembled(fetched: 100), now: now) }),
            ("stopped", { $0.transferFinished(token: token, outcome: .stopped(bytesOnDisk: 20), now: now) }),
            (
                "deltaRefused",
                { $0.transferFinished(token: token, outcome: .deltaRefused(.init(.indexUnusable, "none")), now: now) }
            ),
            (
                "network failure",
                { $0.transferFinished(token: token, outcome: .failed(Self.failure, bytesOnDisk: 30), jitter: 0, now: now) }
            ),
            ("401", { $0.transferFinished(token: token, outcome: .failed(Self.refused(401), bytesOnDisk: 30), now: now) }),
            ("404", { $0.transferFinished(token: token, outcome: .failed(Self.refused(404), bytesOnDisk: 30), now: now) }),
            ("disk full", { $0.transferFinished(token: token, outcome: .failed(Self.full, bytesOnDisk: 30), now: now) }),
            ("retryDue", { $0.retryDue(token: token, now: now) }),
            ("manifest reread", { $0.manifestReloaded(token: token, result: .success(URL(string: "http://h/p.zip")!), now: now) }),
            (
                "manifest reread failed",
                { $0.manifestReloaded(token: token, result: .failure(PackDeliveryError(.invalidManifest, message: "gone")), now: now) }
            ),
            (
                "installProgress",
                {
                    _ = $0.installProgress(token: token, phase: .unpacking, fraction: 0.3, now: now)
                    return []
                }
            ),
            ("install done", { $0.installFinished(token: token, result: .success(URL(filePath: "/c/p")), now: now) }),
            ("install: no space", { $0.installFinished(token: token, result: .failure(Self.full.error), now: now) }),
            (
                "install: damaged archive",
                { $0.installFinished(token: token, result: .failure(PackDeliveryError(.checksumMismatch, message: "x")), now: now) }
            ),
            (
                "install: busy",
                { $0.installFinished(token: token, result: .failure(PackDeliveryError(.databaseBusy, message: "x")), now: now) }
            ),
            (
                "install: unsafe pack",
                { $0.installFinished(token: token, result: .failure(PackDeliveryError(.unsafeEntry, message: "x")), now: now) }
            ),
            ("watchdog", { $0.tick(now: now.addingTimeInterval(3600)) }),
            ("pause", { $0.pause(.user) }),
            ("pause for space", { $0.pause(.insufficientStorage, error: Self.full.error) }),
            ("resume", { $0.resume() }),
            ("space returned", { $0.spaceReturned() }),
            ("cancel", { $0.cancel() }),
            ("abort", { $0.abort(PackDeliveryError(.database, message: "disk I/O error")) }),
        ]
    }

    /// The ways a transfer ends.
    static let transferEndings: Set<String> = [
        "completed", "completed, wrong hash", "assembled", "stopped", "deltaRefused", "network failure", "401", "404", "disk full",
    ]

    /// Events that come from work the machine started, named by their token: stale when the token is another.
    static let tokened: Set<String> = [
        "progress", "streamProgress", "deltaPlanned", "durable", "completed", "completed, wrong hash", "assembled", "stopped",
        "deltaRefused", "network failure", "401", "404", "disk full", "retryDue", "manifest reread", "manifest reread failed",
        "installProgress", "install done", "install: no space", "install: damaged archive", "install: busy", "install: unsafe pack",
    ]

    @Test func everyEventInEveryStageLeadsToAListedStage() {
        for sample in Self.samples() {
            for event in Self.events(token: sample.machine.token) {
                var machine = sample.machine
                let actions = event.apply(&machine)
                let from = sample.machine.stage.kind
                let to = machine.stage.kind
                #expect(from.successors.contains(to), "\(event.name) took \(sample.name) to \(to), which its table does not list")
                for action in actions {
                    switch action {
                    case .startTransfer(let order):
                        #expect(order.token == machine.token, "\(event.name) in \(sample.name) started \(action) with an old token")
                    case .scheduleRetry(let token, _), .install(let token), .reloadManifest(let token), .answerDeltaPlan(let token, _):
                        #expect(token == machine.token, "\(event.name) in \(sample.name) started \(action) with an old token")
                    case .stopTransfer, .stopInstall, .deleteFiles, .commitInstall: break
                    }
                }
                // The public download agrees with the stage it is read from.
                let download = machine.download
                #expect(download.state == machine.stage.state && download.phase == machine.stage.phase)
                #expect((download.retryDate != nil) == (to == .waitingToRetry), "\(event.name) in \(sample.name)")
                #expect((download.pauseReason != nil) == (to == .paused), "\(event.name) in \(sample.name)")
                if to == .finished { #expect(download.progress == 1 && download.contentURL != nil, "\(event.name) in \(sample.name)") }
            }
        }
    }

    @Test func eventsOfStoppedWorkChangeNothing() {
        for sample in Self.samples() {
            // A token of work never started changes nothing. An older one may be the transfer a pause stopped, or an
            // install stopped and still returning: their endings count (DownloadMachineTests), every other event not.
            let returning: Set<String> = [
                "stopped", "install: no space", "install: damaged archive", "install: busy", "install: unsafe pack",
            ]
            for stale in [sample.machine.token - 1, sample.machine.token + 7] {
                for event in Self.events(token: stale) where Self.tokened.contains(event.name) {
                    if stale < sample.machine.token, returning.contains(event.name) { continue }
                    // Any ending of the transfer a pause stopped counts too: it says what that transfer kept.
                    if stale == sample.machine.stoppedTransfer, Self.transferEndings.contains(event.name) { continue }
                    if sample.machine.installOutstanding, event.name.hasPrefix("install") { continue }
                    var machine = sample.machine
                    let actions = event.apply(&machine)
                    #expect(actions.isEmpty, "\(event.name) with token \(stale) in \(sample.name) acted: \(actions)")
                    #expect(machine == sample.machine, "\(event.name) with token \(stale) changed \(sample.name)")
                }
            }
        }
    }

    @Test func settledStagesIgnoreEverythingButACompletedStoppedInstall() {
        for sample in Self.samples() where sample.machine.state == .finished || sample.machine.state == .cancelled {
            for event in Self.events(token: sample.machine.token) where event.name != "install done" {
                var machine = sample.machine
                _ = event.apply(&machine)
                #expect(machine.stage == sample.machine.stage, "\(event.name) moved \(sample.name)")
            }
        }
    }

    @Test func aStoppedInstallThatReturnsStartsTheOneWaitingForIt() {
        for sample in Self.samples() {
            guard case .installing(let token, _, afterPrevious: true, _) = sample.machine.stage else { continue }
            var machine = sample.machine
            let stopped = PackDeliveryError.stopped("stopped")
            #expect(
                machine.installFinished(token: token - 1, result: .failure(stopped), now: Self.t0) == [.install(token: token)],
                "\(sample.name)")
            #expect(machine.installOutstanding && machine.state == .active)
        }
    }
}
