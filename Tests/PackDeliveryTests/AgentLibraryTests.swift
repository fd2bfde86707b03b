import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// The library with the machine's agent (`Configuration.agent`): a real `packs agent` on a socket in a temporary
/// folder, this test process as the app, the suite's FaultServer serving the pack.
@Suite(.serialized, .timeLimit(.minutes(3))) struct AgentLibraryTests {
    /// A queue on `home` that uses the agent on `socket` as `use` says.
    static func queue(home: URL, socket: String, _ use: AgentUse) throws -> DownloadQueue {
        var configuration = DownloadQueue.Configuration()
        configuration.agent = use
        configuration.agentSocket = socket
        configuration.networkPolicy = FixedNetworkPolicy(metered: false)
        return try DownloadQueue(home: Home(folder: home), configuration: configuration)
    }

    /// Every event of a queue, as they come.
    final class Recorder: Sendable {
        final class Box: Sendable {
            let value = Mutex<[DownloadQueueEvent]>([])
        }
        private let box = Box()
        let task: Task<Void, Never>

        init(_ queue: DownloadQueue) {
            let stream = queue.events()
            let box = self.box
            self.task = Task.detached { for await event in stream { box.value.withLock { $0.append(event) } } }
        }

        var downloads: [Download] {
            self.box.value.withLock { events in
                events.compactMap { if case .downloadUpdated(let download) = $0 { download } else { nil } }
            }
        }

        var transactions: [Transaction] {
            self.box.value.withLock { events in
                events.compactMap { if case .transactionUpdated(let transaction) = $0 { transaction } else { nil } }
            }
        }
    }

    @Test func theAppQuitsMidDownloadAndTheAgentFinishesIt() async throws {
        let test = try AgentSite("agent-library", size: 1_000_000, bytesPerSecond: 250_000)
        defer { test.remove() }
        let (folder, site, server, manifestURL) = (test.folder, test.site, test.server, test.manifest)
        let agent = try AgentProcess(folder: folder)
        // Request headers of the app's own (an API key) stay in the app: such a queue cannot hand over.
        var keyed = DownloadQueue.Configuration()
        (keyed.agent, keyed.agentSocket, keyed.transfer.headers) = (.required, agent.socket, ["X-Api-Key: s3cret"])
        do {
            _ = try DownloadQueue(home: Home(folder: folder.appending(path: "keyed")), configuration: keyed)
            Issue.record("a queue with headers of its own handed its downloads to the agent")
        } catch {
            #expect(error.code == .agentUnavailable && !error.message.contains("s3cret"), "\(error)")
        }
        let home = folder.appending(path: "home")
        let manifest = try await LoadedManifest.load(manifestURL)
        var app: DownloadQueue? = try Self.queue(home: home, socket: agent.socket, .required)
        let recorder = Recorder(app!)
        let transaction = try await app!.add(product: "com.example.big", from: manifest)
        // The agent runs it, and this queue hears of its progress from the agent's stream.
        try await waitUntilAsync("the agent receiving the pack", timeout: 30) {
            (try AgentTests.download(agent, home: home)?["bytesReceived"] as? Int ?? 0) > 0
        }
        try await waitUntilAsync("a download event with bytes, pushed by the agent", timeout: 30) {
            recorder.downloads.contains { $0.id == transaction.downloads[0].id && $0.bytesReceived > 0 && $0.state == .active }
        }
        // The app quits.
        await app!.close()
        app = nil
        recorder.task.cancel()
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try await waitUntilAsync("the pack installed by the agent after the app quit", timeout: 60) {
            FileManager.default.fileExists(atPath: data.path)
        }
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        // The next launch finds the transaction finishable, and finishes it.
        let next = try Self.queue(home: home, socket: agent.socket, .required)
        let open = try await next.transactions().first { $0.id == transaction.id }
        #expect(open?.isFinishable == true, "\(String(describing: open))")
        #expect(try await next.finish([transaction.id]).count == 1)
        await next.close()
        // One request for the whole pack: nothing was fetched twice, nothing by the app.
        let packRequests = server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.count == 1, "\(packRequests)")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    @Test func withNoAgentARequiredQueueRefusesAndAnAutomaticOneRunsItself() async throws {
        let test = try AgentSite("agent-library-none", size: 200_000, bytesPerSecond: nil)
        defer { test.remove() }
        let (folder, site, manifestURL) = (test.folder, test.site, test.manifest)
        let home = folder.appending(path: "home")
        let socket = folder.appending(path: "nothing.sock").path
        do {
            _ = try Self.queue(home: home, socket: socket, .required)
            Issue.record("a required agent that does not answer: the queue opened anyway")
        } catch let error as PackDeliveryError {
            #expect(error.code == .agentUnavailable && error.message.contains(socket), "\(error)")
        }
        let manifest = try await LoadedManifest.load(manifestURL)
        let queue = try Self.queue(home: home, socket: socket, .automatic)
        defer { queue.close() }
        let recorder = Recorder(queue)
        let transaction = try await queue.add(product: "com.example.big", from: manifest)
        try await waitUntilAsync("the transaction finishable, delivered in this process", timeout: 60) {
            recorder.transactions.contains { $0.id == transaction.id && $0.isFinishable }
        }
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
    }

    @Test func whenTheAgentIsKilledTheAppTakesItsDownloadBackFromTheKeptBytes() async throws {
        let test = try AgentSite("agent-library-kill", size: 1_000_000, bytesPerSecond: 250_000)
        defer { test.remove() }
        let (folder, site, server, manifestURL) = (test.folder, test.site, test.server, test.manifest)
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let manifest = try await LoadedManifest.load(manifestURL)
        let queue = try Self.queue(home: home, socket: agent.socket, .automatic)
        defer { queue.close() }
        let recorder = Recorder(queue)
        let transaction = try await queue.add(product: "com.example.big", from: manifest)
        try await waitUntilAsync("150 KB received by the agent", timeout: 30) {
            (try AgentTests.download(agent, home: home)?["bytesReceived"] as? Int ?? 0) >= 150_000
        }
        #expect(try agent.stop(SIGKILL) == 128 + SIGKILL)
        try await waitUntilAsync("the transaction finishable, taken back by the app", timeout: 90) {
            recorder.transactions.contains { $0.id == transaction.id && $0.isFinishable }
        }
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        let packRequests = server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.count == 2, "\(packRequests)")
        #expect(
            packRequests.last?.range.map { !$0.hasPrefix("bytes=0-") } == true, "the kept bytes were not fetched again: \(packRequests)")
    }
}
