import Foundation
import Testing

@testable import PackDelivery

/// The download state machine, driven with event sequences: no sockets, no sleeps.
@Suite struct DownloadMachineTests {
    static let sha = String(repeating: "ab", count: 32)

    static func download(length: Int64 = 1000) -> Download {
        Download(id: "d-1", transactionID: "t-1", productIdentifier: "p", contentIdentifier: "p", contentVersion: "1",
                 contentLength: length, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
                 contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/p.zip")!, sha256: Self.sha,
                 unpackedLength: nil, destination: .caches, bytesReceived: 0)
    }

    static let networkFailure = TransferFailure(error: PackDeliveryError(.networkFailure, message: "reset"), retryable: true)

    @Test func startRunsATransferAndCompletionInstalls() {
        var machine = DownloadMachine(download: Self.download())
        #expect(machine.start() == [.startTransfer(token: 1, fromZero: false)])
        #expect(machine.state == .active && machine.download.phase == .downloading)
        let moved = machine.progress(token: 1, bytesOnDisk: 500, validator: "\"e1\"")
        #expect(moved)
        #expect(machine.download.progress == 0.5 && machine.validator == "\"e1\"")
        #expect(machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0)) == [.install(token: 1)])
        #expect(machine.download.phase == .verifying && machine.verified)
        #expect(machine.installFinished(token: 1, result: .success(URL(filePath: "/c/p"))) == [])
        #expect(machine.state == .finished && machine.download.progress == 1 && machine.download.contentURL?.path == "/c/p")
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

    @Test func retryableFailuresBackOffAndTheBudgetRestartsWhenBytesArrive() {
        var machine = DownloadMachine(download: Self.download(), retryPolicy: .init(maxAttempts: 3, baseDelay: 1, maxDelay: 8))
        _ = machine.start()
        var actions = machine.transferFinished(token: 1, outcome: .failed(Self.networkFailure, bytesOnDisk: 100), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 2, after: 1)])
        #expect(machine.retryDue(token: 2) == [.startTransfer(token: 2, fromZero: false)])
        actions = machine.transferFinished(token: 2, outcome: .failed(Self.networkFailure, bytesOnDisk: 100), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 3, after: 2)])
        _ = machine.retryDue(token: 3)
        // Bytes arrived: the budget starts again.
        let arrived = machine.progress(token: 3, bytesOnDisk: 200, validator: nil)
        #expect(arrived)
        #expect(machine.attempt == 0)
        actions = machine.transferFinished(token: 3, outcome: .failed(Self.networkFailure, bytesOnDisk: 200), jitter: 1)
        #expect(actions == [.scheduleRetry(token: 4, after: 1)])
        #expect(machine.download.bytesReceived == 200)
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
        #expect(machine.start() == [.startTransfer(token: 4, fromZero: false)])
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
        #expect(machine.state == .paused && machine.download.bytesReceived == 400)
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
        #expect(machine.cancel() == [.deleteFiles])
        #expect(machine.state == .cancelled)
        #expect(machine.start() == [])
        #expect(machine.resume() == [])
    }

    @Test func cancelWhileDownloadingStopsAndDeletes() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(machine.cancel() == [.stopTransfer(token: 1), .deleteFiles])
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
        #expect(machine.transferFinished(token: 1, outcome: .completed(sha256: wrong, length: 1000, resumedFrom: 600)) == [.startTransfer(token: 2, fromZero: true)])
        #expect(machine.retriedFromZero)
        #expect(machine.transferFinished(token: 2, outcome: .completed(sha256: wrong, length: 1000, resumedFrom: 0)) == [.deleteFiles])
        #expect(machine.state == .failed && machine.download.error?.kind == .badData)
        #expect(machine.download.error?.message.contains(wrong) == true)
    }

    @Test func aFreshFileWithTheWrongChecksumFailsAtOnce() {
        var machine = DownloadMachine(download: Self.download())
        _ = machine.start()
        #expect(machine.transferFinished(token: 1, outcome: .completed(sha256: String(repeating: "0", count: 64), length: 1000, resumedFrom: 0)) == [.deleteFiles])
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
        #expect(machine.installFinished(token: 1, result: .failure(.unsafeEntry("../x", "escapes"))) == [.deleteFiles])
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

@Suite struct ResponseDecisionTests {
    let url = "http://h/p"

    @Test func a206MustStartWhereWeAsked() {
        #expect(ResponseDecision.decide(status: 206, contentRange: "bytes 100-999/1000", offset: 100, expectedLength: 1000, retryAfter: nil, url: self.url) == .append)
        guard case .reject(let failure) = ResponseDecision.decide(status: 206, contentRange: "bytes 0-999/1000", offset: 100, expectedLength: 1000, retryAfter: nil, url: self.url) else {
            Issue.record("a mismatched Content-Range must be rejected"); return
        }
        #expect(failure.retryable)
        guard case .reject = ResponseDecision.decide(status: 206, contentRange: "bytes 100-999/2000", offset: 100, expectedLength: 1000, retryAfter: nil, url: self.url) else {
            Issue.record("a different total must be rejected"); return
        }
    }

    @Test func a200RestartsFromZeroAnd416ChecksTheFile() {
        #expect(ResponseDecision.decide(status: 200, contentRange: nil, offset: 500, expectedLength: 1000, retryAfter: nil, url: self.url) == .restartFromZero)
        #expect(ResponseDecision.decide(status: 416, contentRange: "bytes */1000", offset: 1000, expectedLength: 1000, retryAfter: nil, url: self.url) == .rangeNotSatisfiable)
    }

    @Test func serverErrorsAreRetriedAndOther4xxAreNot() {
        for status in [408, 429, 500, 502, 503] {
            guard case .reject(let failure) = ResponseDecision.decide(status: status, contentRange: nil, offset: 0, expectedLength: 1, retryAfter: "3", url: self.url) else {
                Issue.record("\(status) must be rejected"); continue
            }
            #expect(failure.retryable && failure.retryAfter == 3)
        }
        guard case .reject(let failure) = ResponseDecision.decide(status: 404, contentRange: nil, offset: 0, expectedLength: 1, retryAfter: nil, url: self.url) else {
            Issue.record("404 must be rejected"); return
        }
        #expect(!failure.retryable && failure.error.code == .httpStatus && failure.error.httpStatus == 404 && failure.error.message.contains("404"))
    }

    @Test func retryAfterAsAnHTTPDate() {
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        let seconds = ResponseDecision.retryAfterSeconds("Tue, 14 Nov 2023 22:13:30 GMT", now: now)
        #expect(seconds == 10)
        #expect(ContentRange("bytes 5-9/*")?.total == nil)
        #expect(ContentRange("bytes 9-5/10") == nil)
    }
}

@Suite struct ManifestTests {
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
            do { _ = try LoadedManifest.decode(Data(json.utf8), from: self.base); return nil } catch { return error.kind == .badData ? error.message : "wrong kind" }
        }
        #expect(message("not json")?.contains("not JSON") == true)
        #expect(message(#"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p"}]}]}"#)?.contains("contentVersion") == true)
        #expect(message(#"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p","contentVersion":"1","url":"a","contentLength":1,"sha256":"xyz"}]}]}"#)?.contains("sha256") == true)
        #expect(message(#"{"products":[{"productIdentifier":"../p","contents":[]}]}"#)?.contains("productIdentifier") == true)
    }

    @Test func aMissingLocalManifestIsBadData() {
        #expect(throws: PackDeliveryError.self) { try LoadedManifest.load("/nonexistent/manifest.json") }
        do { _ = try LoadedManifest.load("/nonexistent/manifest.json") } catch {
            #expect(error.kind == .badData && error.message.contains("no such file"))
        }
    }
}
