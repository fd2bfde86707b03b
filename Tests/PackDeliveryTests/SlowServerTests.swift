import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// Hostile input, round three, item 8 (TUF's slow-retrieval attack): a server that trickles a pack or a manifest
/// ends within the stall timeout per attempt, with `tooSlow` and the rate it measured, while a slow but acceptable
/// server (above the low-speed limit) still delivers.
@Suite(.timeLimit(.minutes(3))) struct SlowServerTests {
    /// The download events of a `--json` run, last one last.
    static func downloadEvents(_ result: CLI.Result) -> [[String: Any]] {
        result.events.filter { $0["event"] as? String == "download" }
    }

    /// The first "N bytes per second" (or "1 byte per second") of a message: the measured rate.
    static func firstRate(_ message: String) -> Double? {
        guard let match = message.firstMatch(of: /([0-9]+(?:\.[0-9]+)?) bytes? per second/) else { return nil }
        return Double(match.1)
    }

    @Test func theRateIsMeasuredOverTheWindowAcrossTransfersOfOneHandle() {
        let start = Date(timeIntervalSince1970: 1_000)
        var arrivals = Arrivals(window: 2, start: start)
        arrivals.observe(transferred: 100, at: start + 0.5)
        arrivals.observe(transferred: 150, at: start + 1)
        arrivals.observe(transferred: 10, at: start + 1.5)  // a new transfer on the same handle counts from 0
        arrivals.observe(transferred: 20, at: start + 3)
        #expect(arrivals.total == 170)
        #expect(arrivals.received(inLast: 2, now: start + 3) == 20, "what arrived after the sample of 1 s")
        #expect(arrivals.received(inLast: 10, now: start + 3) == 170, "all of it, when counting began later")
        #expect(
            CurlEasy.rate(1) == "1 byte per second" && CurlEasy.rate(1.24) == "1.2 bytes per second"
                && CurlEasy.rate(812.6) == "813 bytes per second")
    }

    @Test func aPackAtOneBytePerSecondFailsAfterTheRetriesWithTooSlowAndItsRate() throws {
        let site = try TestSite.random("trickle-pack", size: 2_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        let packURL = server.url("big.tar", fault: .slow(bytesPerSecond: 1))
        try site.editManifest { $0.products[0].contents[0].url = packURL.absoluteString }
        let home = try Fixtures.temporaryDirectory("trickle-pack-home")
        let started = Date()
        let result = try CLI.run(
            home: home,
            [
                "--json", "fetch", server.url("manifest.json").absoluteString, "com.example.big", "--stall-timeout", "2", "--retries", "2",
            ], timeout: 45)
        let seconds = Date().timeIntervalSince(started)
        // (retries + 1) × (stall timeout + backoff): 3 attempts of 2 s, backoffs of at most 0.5 s and 1 s, and the start.
        #expect(seconds < 15, "ended after \(seconds) s")
        #expect(result.status == 69, "stderr: \(result.stderr)")
        let error = try #require(Self.downloadEvents(result).last?["error"] as? [String: Any], "the last event carries the error")
        #expect(error["code"] as? String == "tooSlow", "\(error)")
        let message = error["message"] as? String ?? ""
        let rate = try #require(Self.firstRate(message), "the message names the measured rate: \(message)")
        #expect(rate > 0 && rate < 4, "about 1 byte per second measured: \(message)")
        #expect(message.contains("1024 bytes per second"), "and the limit: \(message)")
        #expect(server.requests().filter { $0.file == "big.tar" }.count == 3, "\(server.requests())")
        let lines = result.stderr.split(separator: "\n").filter { !$0.isEmpty }
        #expect(lines.count == 1 && lines[0].contains("per second") && lines[0].contains("packs resume"), "stderr: \(result.stderr)")
    }

    @Test(arguments: [("silent", "timedOut"), ("trickle", "tooSlow")])
    func theManifestRequestEndsAtTheStallTimeout(route: String, code: String) throws {
        let site = try TestSite.random("slow-manifest-\(route)", size: 2_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        let manifestURL = server.url("manifest.json", fault: route == "silent" ? .silent : .slow(bytesPerSecond: 1))
        let home = try Fixtures.temporaryDirectory("slow-manifest-\(route)-home")
        let started = Date()
        let result = try CLI.run(home: home, ["fetch", manifestURL.absoluteString, "com.example.big", "--stall-timeout", "2"], timeout: 30)
        let seconds = Date().timeIntervalSince(started)
        #expect(seconds < 8, "ended after \(seconds) s, not libcurl's 60 s window")
        #expect(result.status == 69, "stderr: \(result.stderr)")
        let lines = result.stderr.split(separator: "\n").filter { !$0.isEmpty }
        #expect(lines.count == 1, "one line: \(result.stderr)")
        if code == "tooSlow" {
            let rate = try #require(Self.firstRate(result.stderr), "names the measured rate: \(result.stderr)")
            #expect(rate > 0 && rate < 4, "\(result.stderr)")
        } else {
            #expect(result.stderr.contains("No data arrived") && result.stderr.contains("2 seconds"), "\(result.stderr)")
        }
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains("com.example.big") == false, "nothing was recorded")
    }

    @Test func aSlowButAcceptableServerIsNotFailed() throws {
        // 4 KiB/s, four times the low-speed limit, with a 2 s window and no retry allowed: about 7 s.
        let site = try TestSite.random("slow-ok", size: 24_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        let packURL = server.url("big.tar", fault: .slow(bytesPerSecond: 4096))
        try site.editManifest { $0.products[0].contents[0].url = packURL.absoluteString }
        let home = try Fixtures.temporaryDirectory("slow-ok-home")
        let result = try CLI.run(
            home: home,
            ["fetch", server.url("manifest.json").absoluteString, "com.example.big", "--stall-timeout", "2", "--retries", "0"], timeout: 60)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        #expect(server.requests().filter { $0.file == "big.tar" }.count == 1, "one attempt: \(server.requests())")
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
    }
}
