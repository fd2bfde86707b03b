import Foundation
import Logging
import PackDelivery
import PackServer
import PackTestSupport
import Testing

/// The example store client (`Examples/StoreClient`), a package of its own that depends on the library as an
/// app does, run against a real `packs serve` as a user would: it is documentation, so it must work.
@Suite(.timeLimit(.minutes(5))) struct ExampleTests {
    static let products = ["com.example.atlas", "com.example.forest", "com.example.ocean"]
    static let sourceFolders = ["com.example.atlas": "atlas", "com.example.forest": "forest", "com.example.ocean": "ocean"]

    /// The example's binary, built by scripts/test (`swift build --package-path Examples/StoreClient`).
    static let binary: String =
        ProcessInfo.processInfo.environment["STORE_CLIENT_BINARY"]
        ?? CLI.packageRoot.appending(path: "Examples/StoreClient/.build/debug/StoreClient").path

    func runExample(home: URL, manifest: URL, _ extra: [String] = []) async throws -> (status: Int32, lines: [String], stderr: String) {
        let result = try await Fixtures.runAsync(Self.binary, ["--home", home.path, manifest.absoluteString] + Self.products + extra)
        return (result.status, result.stdout.split(separator: "\n").map(String.init), result.stderr)
    }

    /// A GUI toolkit's own main loop (GTK-style, no async main) that drains the main queue each turn: main-actor
    /// observers are called there, on the main thread, and the purchase completes (issue 30, item 9).
    @Test func aToolkitsOwnMainLoopThatDrainsTheMainQueueGetsTheMainActorCallbacks() async throws {
        let loop = URL(filePath: Self.binary).deletingLastPathComponent().appending(path: "ToolkitLoop").path
        try #require(FileManager.default.isExecutableFile(atPath: loop), "no ToolkitLoop at \(loop): build Examples/StoreClient")
        let site = try TestSite.samples("toolkit-site")
        let server = try await PackServer.start(PackServerConfiguration(directory: site.folder, port: 0), logger: Logger(label: "toolkit"))
        let home = try Fixtures.temporaryDirectory("toolkit-home")
        let result = try await Fixtures.runAsync(
            loop, ["--home", home.path, server.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest"], timeout: 90)
        await server.stop()
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(result.status == 0, "stderr: \(result.stderr)\nstdout: \(lines)")
        let callbacks = lines.first { $0.hasPrefix("main-actor callbacks ") }
        #expect(callbacks?.hasSuffix("all on the main thread: yes") == true, "\(lines)")
        let count = callbacks.flatMap { Int($0.split(separator: " ")[2].filter(\.isNumber)) } ?? 0
        #expect(count > 0, "\(lines)")
        #expect(lines.contains("installed com.example.forest"), "\(lines)")
    }

    @Test func theExampleDeliversOnTheMainActorAwaitsMatchesErrorsByCodeAndIsRedeliveredAfterARelaunch() async throws {
        try #require(
            FileManager.default.isExecutableFile(atPath: Self.binary),
            "no StoreClient at \(Self.binary): build it with swift build --package-path Examples/StoreClient (scripts/test does)")
        let site = try TestSite.samples("example-site")
        let server = try await PackServer.start(PackServerConfiguration(directory: site.folder, port: 0), logger: Logger(label: "example"))
        let manifest = server.baseURL.appending(path: "manifest.json")
        let home = try Fixtures.temporaryDirectory("example-home")

        // A first run that buys everything but leaves the purchases open (as if the app were killed).
        let first = try await self.runExample(home: home, manifest: manifest, ["--leave-open"])
        #expect(first.status == 0, "stderr: \(first.stderr)\nstdout:\n\(first.lines.joined(separator: "\n"))")
        #expect(first.lines.contains("observer on the main actor: yes"), "\(first.lines)")
        #expect(first.lines.contains("matched unknownProduct"), "an error matched by its code")
        #expect(
            first.lines.contains { $0.hasPrefix("refused finishRefused d-") },
            "finish refused, matched by code, naming the pending download")
        for product in Self.products {
            #expect(first.lines.contains { $0.hasPrefix("progress \(product) 100%") }, "the view model saw \(product) complete")
            #expect(first.lines.contains("settled \(product) finished"), "one await settled \(product)")
            #expect(
                first.lines.contains { $0.hasPrefix("delivered t-") && $0.hasSuffix(" \(product)") },
                "one await (queue.delivered) for the purchase of \(product)")
        }
        let open = try CLI.run(home: home, ["--json", "status"])
        #expect(!open.stdout.contains(#"{"transactions":[]}"#), "the purchases were left open: \(open.stdout)")

        // The relaunch: the open purchases are delivered again to the observer, and finished.
        let second = try await self.runExample(home: home, manifest: manifest)
        await server.stop()
        #expect(second.status == 0, "stderr: \(second.stderr)\nstdout:\n\(second.lines.joined(separator: "\n"))")
        #expect(second.lines.filter { $0.hasPrefix("redelivered t-") }.count == Self.products.count, "\(second.lines)")
        for product in Self.products {
            let prefix = "content \(product) "
            let line = try #require(second.lines.first { $0.hasPrefix(prefix) })
            let path = String(line.dropFirst(prefix.count))
            let source = CLI.packageRoot.appending(path: "SampleContent/\(Self.sourceFolders[product]!)")
            #expect(try treeContents(URL(filePath: path)) == treeContents(source), "installed files of \(product) differ from the pack's")
        }
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#), "everything finished")
    }
    /// The same example, unchanged, on a machine where the agent runs (issue 44): its default configuration finds the
    /// agent at `$XDG_RUNTIME_DIR/packs/agent.sock` and hands it the downloads; its observers, awaits and the relaunch's
    /// redelivery work as in-process, and the agent serves the home.
    @Test func theExampleWorksUnchangedWithTheAgent() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "no StoreClient at \(Self.binary)")
        let folder = try Fixtures.temporaryDirectory("example-agent")
        defer { try? FileManager.default.removeItem(at: folder) }
        let runtime = folder.appending(path: "run")
        let agent = try AgentProcess(folder: folder, socket: runtime.appending(path: "packs/agent.sock").path)
        let site = try TestSite.samples("example-agent-site")
        let server = try await PackServer.start(PackServerConfiguration(directory: site.folder, port: 0), logger: Logger(label: "example"))
        let manifest = server.baseURL.appending(path: "manifest.json").absoluteString
        let home = folder.appending(path: "home")
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_RUNTIME_DIR"] = runtime.path
        let run = { (extra: [String]) in
            try await Fixtures.runAsync(Self.binary, ["--home", home.path, manifest] + Self.products + extra, environment: environment)
        }
        let first = try await run(["--leave-open"])
        let lines = first.stdout.split(separator: "\n").map(String.init)
        #expect(first.status == 0, "stderr: \(first.stderr)\nstdout: \(lines)")
        for product in Self.products {
            #expect(lines.contains { $0.hasPrefix("progress \(product) 100%") }, "the view model saw \(product) complete: \(lines)")
            #expect(lines.contains("settled \(product) finished"), "one await settled \(product): \(lines)")
        }
        #expect(try agent.request("GET", "/v1/version").json["homes"] as? Int == 1, "the agent serves the example's home")
        let second = try await run([])
        await server.stop()
        let relaunch = second.stdout.split(separator: "\n").map(String.init)
        #expect(second.status == 0, "stderr: \(second.stderr)\nstdout: \(relaunch)")
        #expect(relaunch.filter { $0.hasPrefix("redelivered t-") }.count == Self.products.count, "\(relaunch)")
        for product in Self.products {
            let line = try #require(relaunch.first { $0.hasPrefix("content \(product) ") })
            let source = CLI.packageRoot.appending(path: "SampleContent/\(Self.sourceFolders[product]!)")
            #expect(
                try treeContents(URL(filePath: String(line.dropFirst("content \(product) ".count)))) == treeContents(source),
                "installed files of \(product) differ from the pack's")
        }
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#), "everything finished")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    /// The example launched while a `packs fetch` in another process delivers a purchase in the same home: its
    /// main-actor view model sees that download's progress as it goes (the queue watches other processes), its one
    /// await for the redelivered purchase returns once the other process is done, and the pack is served once.
    @Test func theExampleFollowsADeliveryAnotherProcessRuns() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "no StoreClient at \(Self.binary)")
        let site = try TestSite.random("example-other-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("example-other-home")
        let fetch = try CLI.start(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"])
        defer { if fetch.isRunning { fetch.terminate() } }
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline, try !CLI.run(home: home, ["--json", "status"]).stdout.contains("com.example.big") {
            try await Task.sleep(for: .milliseconds(100))
        }
        let result = try await Fixtures.runAsync(
            Self.binary, ["--home", home.path, nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"],
            timeout: 90)
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(result.status == 0, "stderr: \(result.stderr)\nstdout: \(lines)")
        #expect(
            lines.contains { $0.hasPrefix("redelivered t-") }, "the other process's purchase, delivered to the example at launch: \(lines)")
        let steps = lines.filter { $0.hasPrefix("progress com.example.big ") && !$0.hasPrefix("progress com.example.big 100%") }
        #expect(!steps.isEmpty, "the view model saw the other process's download move before it ended: \(lines)")
        fetch.waitUntilExit()
        nginx.waitForRequests(2)
        #expect(nginx.requests().filter { $0.uri.hasSuffix("/big.tar") }.count == 1, "the pack was served once: \(nginx.requests())")
    }

    /// On-demand content with a lease (issue 31): a purchase transfers 0 bytes of its on-demand pack; opening the level
    /// that needs it (`--play`) fetches it, with progress, and holds it: `packs gc --to 0` in another process cannot
    /// evict it (exit 75, files still there) until the level closes, and then can.
    @Test func theExampleFetchesAnOnDemandLevelWhenOpenedAndHoldsItWhileOpen() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "no StoreClient at \(Self.binary)")
        let level = DeliveryPolicyTests.onDemand
        let site = try DeliveryPolicyTests.site(
            "example-level-site", delivery: [level: .onDemand], sizes: [64 << 10, 64 << 10, 1 << 20])
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("example-level-home")

        // The purchase: delivered and finished, its on-demand pack not fetched.
        let bought = try await Fixtures.runAsync(Self.binary, ["--home", home.path, manifest, "com.example.game"], timeout: 90)
        let boughtLines = bought.stdout.split(separator: "\n").map(String.init)
        #expect(bought.status == 0, "stderr: \(bought.stderr)\nstdout: \(boughtLines)")
        #expect(boughtLines.contains { $0.hasPrefix("finished t-") && $0.hasSuffix(" com.example.game") }, "\(boughtLines)")
        #expect(nginx.bodyBytesSent(path: "/a.tar") > 0)
        #expect(nginx.bodyBytesSent(path: "/c.tar") == 0, "the on-demand pack is not fetched with the purchase")
        #expect(!nginx.requests().contains { $0.uri.hasPrefix("/c.tar") }, "\(nginx.requests())")

        // The level opens: fetched now, with progress, and leased while open. Its output goes, line by line, to the
        // watched standard error.
        let input = Pipe()
        let player = try WatchedProcess(
            "/bin/sh", ["-c", "exec stdbuf -oL \"$0\" \"$@\" 1>&2", Self.binary, "--home", home.path, manifest, "--play", level],
            input: input)
        defer { player.kill() }
        #expect(player.waitForStderr("level open \(level) ", timeout: 60), "the level opened: \(player.stderr)")
        let packSize = try #require(
            try FileManager.default.attributesOfItem(atPath: site.appending(path: "c.tar").path)[.size] as? Int)
        #expect(nginx.bodyBytesSent(path: "/c.tar") == packSize, "the level's pack, fetched once it was opened")
        // Main-actor callbacks may still be on their way when ensureAvailable returns.
        #expect(player.waitForStderr("progress \(level) 100%", timeout: 10), "the view model showed its progress: \(player.stderr)")
        let installed = home.appending(path: "Caches/\(level)/Contents/c.bin")
        #expect(FileManager.default.fileExists(atPath: installed.path))

        let blocked = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(blocked.status == 75, "the open level's pack keeps the caches above 0: \(blocked.stdout) \(blocked.stderr)")
        #expect(!blocked.stdout.contains(level), "\(blocked.stdout)")
        #expect(FileManager.default.fileExists(atPath: installed.path), "the leased pack is still installed")

        // The level closes (standard input ends): the lease ends, and the pack may go.
        try input.fileHandleForWriting.close()
        #expect(player.waitForStderr("level closed \(level)", timeout: 30), "\(player.stderr)")
        #expect(player.waitForExit(timeout: 30) == 0, "\(player.stderr)")
        let freed = try CLI.run(home: home, ["gc", "--to", "0"])
        #expect(freed.status == 0, "stderr: \(freed.stderr)")
        #expect(freed.stdout.contains(" \(level) "), "\(freed.stdout)")
        #expect(!FileManager.default.fileExists(atPath: installed.path))
    }
}
