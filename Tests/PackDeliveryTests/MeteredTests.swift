import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A connection that flips between metered and not when the test says so, reporting each change.
final class FlippingNetworkPolicy: NetworkPolicy {
    private let state = Mutex((metered: false, handlers: [@Sendable (Bool) -> Void]()))

    init(metered: Bool) { self.state.withLock { $0.metered = metered } }

    var isMetered: Bool { self.state.withLock { $0.metered } }

    func observe(_ changed: @escaping @Sendable (Bool) -> Void) { self.state.withLock { $0.handlers.append(changed) } }

    func set(metered: Bool) {
        let handlers = self.state.withLock { state in
            state.metered = metered
            return state.handlers
        }
        for handler in handlers { handler(metered) }
    }
}

/// Metered connections end to end: nginx counts what it sent while a policy flips (library), and `--metered yes` (CLI).
@Suite(.timeLimit(.minutes(4))) struct MeteredTests {
    /// Waits until `condition` holds for the download, reading it every 50 ms; fails naming what it waited for.
    static func waitFor(
        _ queue: DownloadQueue, _ id: String, _ what: String, timeout: TimeInterval = 30, _ condition: (Download) -> Bool
    ) throws -> Download {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let download = try queue.downloads([id]).first, condition(download) { return download }
            Thread.sleep(forTimeInterval: 0.05)
        }
        Issue.record("waited \(timeout) s for \(id): \(what); it is \(String(describing: try? queue.downloads([id]).first))")
        throw FixtureError("timed out waiting for \(what)")
    }

    /// On a metered connection a purchase's essential pack and a pack asked for go ahead whatever their size; a
    /// prefetch pack above the limit waits (0 bytes at nginx), starts when the connection is not metered, pauses with
    /// its bytes kept when it is again, and finishes from those bytes (a Range request) once allowed.
    @Test func largePacksTheUserDidNotAskForWaitForAnUnmeteredConnectionWithTheirBytesKept() async throws {
        let site = try DeliveryPolicyTests.site(
            "metered-site", delivery: [DeliveryPolicyTests.prefetch: .prefetch, DeliveryPolicyTests.onDemand: .onDemand],
            sizes: [2 << 20, 4 << 20, 2 << 20])
        let nginx = try NginxServer(root: site, limitRate: 2 << 20)
        defer { nginx.stop() }
        let network = FlippingNetworkPolicy(metered: true)
        var configuration = DownloadQueue.Configuration()
        configuration.networkPolicy = network
        configuration.meteredLimit = 1 << 20
        let queue = try await DownloadQueue.open(
            home: Home(folder: try Fixtures.temporaryDirectory("metered-home")), configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let transaction = try await queue.add(product: "com.example.game", from: manifest)
        _ = try await queue.delivered(transactionID: transaction.id)
        let prefetch = transaction.downloads[1].id
        let waiting = try Self.waitFor(queue, prefetch, "paused for the metered connection") { $0.state == .paused }
        #expect(waiting.pauseReason == .waitingForUnmeteredNetwork)
        #expect(nginx.bodyBytesSent(path: "/b.tar") == 0, "nothing of the prefetch pack was fetched on the metered connection")
        // Asked for by the user: goes ahead on the metered connection.
        let folders = try await queue.ensureAvailable(contentIDs: [DeliveryPolicyTests.onDemand])
        #expect(FileManager.default.fileExists(atPath: folders[0].appending(path: "Contents/c.bin").path))

        network.set(metered: false)
        let moving = try Self.waitFor(queue, prefetch, "bytes of the prefetch pack once unmetered") { $0.bytesReceived > 256 << 10 }
        #expect(moving.state == .active)
        network.set(metered: true)
        let paused = try Self.waitFor(queue, prefetch, "paused again, metered") { $0.state == .paused }
        #expect(paused.pauseReason == .waitingForUnmeteredNetwork)
        #expect(paused.bytesReceived > 0 && paused.bytesReceived < paused.contentLength, "its bytes kept: \(paused.bytesReceived)")
        try await Task.sleep(for: .milliseconds(600))
        #expect(try queue.downloads([prefetch]).first?.state == .paused, "still waiting while metered")

        #expect(try queue.allowMetered([prefetch]) == [prefetch])
        let landed = try await queue.settled(downloadID: prefetch)
        #expect(landed.state == .finished, "\(String(describing: landed.error))")
        let requests = nginx.requests().filter { $0.uri.hasPrefix("/b.tar") }
        #expect(requests.count == 2, "\(requests)")
        #expect(
            requests.last?.range.map { $0.hasPrefix("bytes=") && !$0.hasPrefix("bytes=0-") } ?? false,
            "resumed from the bytes kept: \(requests)")
    }

    /// `--metered yes`: a restore of a pack above `--metered-limit` exits 75 without a byte fetched, a plain resume
    /// waits again, `resume --allow-metered` fetches it; a fetch the user typed is fetched at once.
    @Test func theCommandLineWaitsForAnUnmeteredConnectionUnlessAllowed() throws {
        let site = try TestSite.random("metered-cli-site", size: 2 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("metered-cli-home")
        let limit = ["--metered", "yes", "--metered-limit", "1M"]
        let restore = try CLI.run(home: home, ["fetch", manifest, "com.example.big", "--restore"] + limit)
        #expect(restore.status == 75, "\(restore.stderr)")
        #expect(restore.stderr.contains("unmetered") && restore.stderr.contains("--allow-metered"), "\(restore.stderr)")
        #expect(nginx.bodyBytesSent(path: "/big.tar") == 0)
        let resume = try CLI.run(home: home, ["resume"] + limit)
        #expect(resume.status == 75, "a resume is not the user's explicit yes: \(resume.stderr)")
        #expect(nginx.bodyBytesSent(path: "/big.tar") == 0)
        let allowed = try CLI.run(home: home, ["resume", "--allow-metered"] + limit)
        #expect(allowed.status == 0, "\(allowed.stderr)")
        #expect(try CLI.run(home: home, ["content", "com.example.big"]).status == 0)

        let typed = try CLI.run(home: try Fixtures.temporaryDirectory("metered-cli-home2"), ["fetch", manifest, "com.example.big"] + limit)
        #expect(typed.status == 0, "a fetch the user typed is explicit: \(typed.stderr)")
        #expect(try CLI.run(home: home, ["fetch", manifest, "com.example.big", "--metered", "sometimes"]).status == 64)
    }
}
