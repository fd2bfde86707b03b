import Foundation
import PackTestSupport
import Testing

/// `packs agent` end to end: the real binary on a socket in a temporary folder, the suite's FaultServer serving the
/// packs, and clients that go away while the agent goes on.
@Suite(.serialized, .timeLimit(.minutes(3))) struct AgentTests {
    /// A site with one pack of `size` random bytes, its pack served at `bytesPerSecond` when given.
    static func slowSite(_ label: String, size: Int, bytesPerSecond: Int?) throws -> (TestSite, FaultServer, String) {
        let site = try TestSite.random(label, size: size)
        let server = try FaultServer(root: site.folder)
        if let bytesPerSecond {
            let packURL = server.url("big.tar", fault: .slow(bytesPerSecond: bytesPerSecond))
            try site.editManifest { $0.products[0].contents[0].url = packURL.absoluteString }
        }
        return (site, server, server.url("manifest.json").absoluteString)
    }

    static func download(_ agent: AgentProcess, home: URL) throws -> [String: Any]? {
        let status = try agent.request("GET", "/v1/downloads?home=\(home.path)")
        let transactions = status.json["transactions"] as? [[String: Any]] ?? []
        return (transactions.first?["downloads"] as? [[String: Any]])?.first
    }

    @Test func aDetachedFetchFinishesWithTheClientGone() throws {
        let test = try AgentSite("agent-detach", size: 300_000, bytesPerSecond: nil)
        defer { test.remove() }
        let (folder, site, manifest) = (test.folder, test.site, test.manifest)
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let result = try CLI.run(
            home: home, ["--json", "fetch", "--detach", "--socket", agent.socket, manifest, "com.example.big"], timeout: 30)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        let line = result.events.first
        #expect(line?["event"] as? String == "detached")
        #expect((line?["transactionID"] as? String)?.hasPrefix("t-") == true, "\(result.stdout)")
        #expect((line?["downloads"] as? [String])?.count == 1, "\(result.stdout)")
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack installed by the agent") { FileManager.default.fileExists(atPath: data.path) }
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        // The agent finishes the transaction (fetch's default): nothing open remains.
        try waitUntil("the transaction finished by the agent", timeout: 20) { try Self.download(agent, home: home) == nil }
        #expect(try agent.stop() == 0, "log: \(agent.log)")
        let saved = try String(contentsOf: agent.stateFolder.appending(path: "packs/agent-homes.json"), encoding: .utf8)
        #expect(saved.contains(home.lastPathComponent), "the served home is kept for the next agent: \(saved)")
    }

    /// `fetch --detach --all` hands every product of the manifest to the agent, as an install script needs; with
    /// `--products-from`, a product the manifest lacks is refused as in-process, before anything is handed over.
    @Test func aDetachedFetchTakesAllProductsOrAListFromAFile() throws {
        let test = try AgentSite("agent-detach-all", size: 200_000, bytesPerSecond: nil)
        defer { test.remove() }
        let agent = try AgentProcess(folder: test.folder)
        let home = test.folder.appending(path: "home")
        let all = try CLI.run(home: home, ["--json", "fetch", "--detach", "--socket", agent.socket, test.manifest, "--all"], timeout: 30)
        #expect(all.status == 0, "stderr: \(all.stderr)")
        #expect((all.events.first?["downloads"] as? [String])?.count == 1, "\(all.stdout)")
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack installed by the agent") { FileManager.default.fileExists(atPath: data.path) }
        #expect(try Fixtures.sha256Hex(of: data) == test.site.dataSHA256)

        let list = test.folder.appending(path: "products.txt")
        try Data("com.example.big\ncom.example.nothing\n".utf8).write(to: list)
        let other = test.folder.appending(path: "other")
        let detached = try CLI.run(
            home: other, ["fetch", "--detach", "--socket", agent.socket, test.manifest, "--products-from", list.path], timeout: 30)
        let here = try CLI.run(home: other, ["fetch", test.manifest, "--products-from", list.path], timeout: 30)
        #expect(detached.status == here.status && detached.status != 0, "\(detached.stderr)")
        #expect(detached.stderr.contains("com.example.nothing") && detached.stderr == here.stderr, "\(detached.stderr)")
        #expect(try Self.download(agent, home: other) == nil, "nothing was handed to the agent")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    /// One rate cap for the machine (`packs config max-rate`): the agent's downloads of two homes share it, paced
    /// mid-transfer as each starts and ends, where each alone would take it all.
    @Test func theMachinesRateCapIsSharedByEveryDownloadOfTheAgent() throws {
        let test = try AgentSite("agent-rate", size: 1_500_000, bytesPerSecond: nil)
        defer { test.remove() }
        let (folder, site, manifest) = (test.folder, test.site, test.manifest)
        let config = ["XDG_CONFIG_HOME": folder.appending(path: "config").path]
        #expect(try CLI.run(home: folder.appending(path: "unused"), ["config", "max-rate", "1M"], environment: config).status == 0)
        let agent = try AgentProcess(folder: folder, environment: config)
        let homes = [folder.appending(path: "home-a"), folder.appending(path: "home-b")]
        let start = Date()
        for home in homes {
            let result = try CLI.run(home: home, ["fetch", "--detach", "--socket", agent.socket, manifest, "com.example.big"], timeout: 30)
            #expect(result.status == 0, "stderr: \(result.stderr)")
        }
        for home in homes {
            let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
            try waitUntil("the pack installed in \(home.lastPathComponent)", timeout: 60) {
                FileManager.default.fileExists(atPath: data.path)
            }
            #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        }
        // 3 MB at 1 MiB/s together: about 2.9 s (each transfer may take a first burst of 16 KiB unpaced); with a cap
        // per home, or none, it would take half that, or a blink.
        let elapsed = Date().timeIntervalSince(start)
        #expect(elapsed >= 2.4, "two homes' downloads took \(elapsed) s under a cap of 1 MiB/s for 3 MB")
        #expect(try agent.stop() == 0)
    }

    /// One admission order for the machine: with one slot (`--concurrency 1`), the agent runs one download of all its
    /// homes at a time, and a user-initiated one that came last starts before an essential one that came earlier.
    @Test func twoHomesWithPrioritiesCrossingFollowOneOrder() throws {
        let test = try AgentSite("agent-order", size: 600_000, bytesPerSecond: 400_000)
        defer { test.remove() }
        let (folder, manifest) = (test.folder, test.manifest)
        let agent = try AgentProcess(folder: folder, arguments: ["--concurrency", "1"])
        let (first, earlier, urgent) = (
            folder.appending(path: "first"), folder.appending(path: "earlier"), folder.appending(path: "urgent")
        )
        func fetch(_ home: URL, _ priority: String) throws {
            let body = jsonBody(["home": home.path, "manifest": manifest, "products": ["com.example.big"], "priority": priority])
            let answer = try agent.request("POST", "/v1/fetch", body: body)
            #expect(answer.status == 202, "\(answer.body)")
        }
        func state(_ home: URL) throws -> String? {
            let download = try Self.download(agent, home: home)
            // A slot is held while the pack transfers; its install runs beside the next transfer.
            if download?["state"] as? String == "active", download?["phase"] as? String != "downloading" { return "installing" }
            return download?["state"] as? String
        }
        try fetch(first, "essential")
        try waitUntil("the first download running", timeout: 20) { try state(first) == "active" }
        try fetch(earlier, "essential")
        try fetch(urgent, "userInitiated")
        // One slot for the machine: the two others wait while the first runs, though their homes' queues are idle.
        var started: [String] = []
        try waitUntil("every download started, one at a time", timeout: 60) {
            let states = try [("first", first), ("earlier", earlier), ("urgent", urgent)].map { ($0.0, try state($0.1)) }
            #expect(states.filter { $0.1 == "active" }.count <= 1, "one transfer at a time: \(states)")
            for (name, state) in states where state != "waiting" && !started.contains(name) { started.append(name) }
            return started.count == 3
        }
        #expect(started == ["first", "urgent", "earlier"], "by priority, then first come: \(started)")
        #expect(try agent.stop() == 0)
    }

    /// One home's background work holds the machine's one slot; another home's user-initiated download starts beside
    /// it at once, and the background download goes on (nothing running is stopped).
    @Test func aUserInitiatedDownloadOfAnotherHomeStartsBesideBackgroundWork() throws {
        let test = try AgentSite("agent-beside", size: 2_000_000, bytesPerSecond: 400_000)
        defer { test.remove() }
        let (folder, site, manifest) = (test.folder, test.site, test.manifest)
        let agent = try AgentProcess(folder: folder, arguments: ["--concurrency", "1"])
        let (background, urgent) = (folder.appending(path: "background"), folder.appending(path: "urgent"))
        func fetch(_ home: URL, _ priority: String) throws {
            let body = jsonBody(["home": home.path, "manifest": manifest, "products": ["com.example.big"], "priority": priority])
            let answer = try agent.request("POST", "/v1/fetch", body: body)
            #expect(answer.status == 202, "\(answer.body)")
        }
        func state(_ home: URL) throws -> String? { try Self.download(agent, home: home)?["state"] as? String }
        try fetch(background, "background")
        try waitUntil("the background download running", timeout: 20) { try state(background) == "active" }
        try fetch(urgent, "userInitiated")
        try waitUntil("the user-initiated download running beside the background one", timeout: 3) {
            try state(urgent) == "active"
        }
        #expect(try state(background) == "active", "the background download was not stopped")
        for home in [background, urgent] {
            let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
            try waitUntil("\(home.lastPathComponent)'s pack installed", timeout: 30) { FileManager.default.fileExists(atPath: data.path) }
            #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        }
        #expect(try agent.stop() == 0)
    }

    /// A home deleted while the agent runs its download (an uninstall) is no longer served: its download stops holding
    /// the machine's one slot, so another home's download, which came later, starts at once.
    @Test func aHomeDeletedUnderTheAgentIsDroppedAndFreesItsSlot() throws {
        let test = try AgentSite("agent-deleted", size: 4_000_000, bytesPerSecond: 200_000)
        defer { test.remove() }
        let agent = try AgentProcess(folder: test.folder, arguments: ["--concurrency", "1"])
        let (deleted, other) = (test.folder.appending(path: "deleted"), test.folder.appending(path: "other"))
        for home in [deleted, other] {
            let body = jsonBody(["home": home.path, "manifest": test.manifest, "products": ["com.example.big"]])
            let answer = try agent.request("POST", "/v1/fetch", body: body)
            #expect(answer.status == 202, "\(answer.body)")
        }
        try waitUntil("the first home's download running", timeout: 20) {
            try Self.download(agent, home: deleted)?["state"] as? String == "active"
        }
        #expect(try Self.download(agent, home: other)?["state"] as? String == "waiting", "one slot: the second home waits")
        try FileManager.default.removeItem(at: deleted)
        // 4 MB at 200 KB/s: the deleted home's download would hold the slot for about 20 s more.
        do {
            try waitUntil("the other home's download running", timeout: 6) {
                try Self.download(agent, home: other)?["state"] as? String == "active"
            }
        } catch {
            Issue.record("\(error); agent log:\n\(agent.log)")
            throw error
        }
        let version = try agent.request("GET", "/v1/version?home=\(deleted.path)")
        #expect(version.json["servesHome"] as? Bool == false && version.json["homes"] as? Int == 1, "\(version.body)")
        #expect(agent.log.contains("A served home's store was removed"), "\(agent.log)")
        #expect(!FileManager.default.fileExists(atPath: deleted.path), "nothing was written again where the home was")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    /// A status read after an event of the stream shows what the event said, though the agent answers status reads
    /// from its last answer while only progress changes: a download starting is not progress.
    @Test func aStatusReadAfterADownloadStartsShowsItActive() throws {
        let test = try AgentSite("agent-fresh", size: 400_000, bytesPerSecond: 200_000)
        defer { test.remove() }
        let (folder, manifest) = (test.folder, test.manifest)
        let agent = try AgentProcess(folder: folder, arguments: ["--concurrency", "1"])
        let stream = try EventStreamClient(socket: agent.socket)
        try waitUntil("the event stream counted", timeout: 10) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
        }
        let (first, second) = (folder.appending(path: "first"), folder.appending(path: "second"))
        for home in [first, second] {
            let body = jsonBody(["home": home.path, "manifest": manifest, "products": ["com.example.big"]])
            #expect(try agent.request("POST", "/v1/fetch", body: body).status == 202)
        }
        // The second waits for the one slot, and its status answer is kept.
        #expect(try Self.download(agent, home: second)?["state"] as? String == "waiting")
        let id = try #require(try Self.download(agent, home: second)?["id"] as? String)
        try waitUntil("the second download's active event", timeout: 30) {
            stream.events.contains {
                $0.kind == "download" && $0.data.contains("\"id\":\"\(id)\"") && $0.data.contains("\"home\":\"\(second.path)\"")
                    && $0.data.contains("\"state\":\"active\"")
            }
        }
        #expect(try Self.download(agent, home: second)?["state"] as? String == "active", "the status read right after the event")
        #expect(try agent.stop() == 0)
    }

    @Test func withNoAgentADetachedFetchSaysSoAndExits79() throws {
        let folder = try Fixtures.temporaryDirectory("agent-none")
        defer { try? FileManager.default.removeItem(at: folder) }
        let result = try CLI.run(
            home: folder.appending(path: "home"),
            ["fetch", "--detach", "--socket", folder.appending(path: "nothing.sock").path, "http://127.0.0.1:9/manifest.json", "p"],
            timeout: 30)
        #expect(result.status == 79)
        #expect(result.stderr.contains("No agent answers on"), "\(result.stderr)")
        #expect(!FileManager.default.fileExists(atPath: folder.appending(path: "home").path), "nothing was created")
    }

    @Test func aClientKilledMidStreamStopsNothingAndLeavesNothingBehind() throws {
        let test = try AgentSite("agent-kill-client", size: 600_000, bytesPerSecond: 200_000)
        defer { test.remove() }
        let (folder, site, manifest) = (test.folder, test.site, test.manifest)
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let stream = try EventStreamClient(socket: agent.socket)
        try waitUntil("the event stream counted", timeout: 10) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
        }
        let result = try CLI.run(home: home, ["fetch", "--detach", "--socket", agent.socket, manifest, "com.example.big"], timeout: 30)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        try waitUntil("a download event on the stream", timeout: 20) { stream.events.contains { $0.kind == "download" } }
        stream.kill()
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack installed after the client was killed") { FileManager.default.fileExists(atPath: data.path) }
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        try waitUntil("the killed client's stream gone from the agent", timeout: 15) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 0
        }
        #expect(try agent.stop() == 0)
    }

    @Test func sigtermKeepsTheBytesAndTheNextAgentResumesThem() throws {
        let test = try AgentSite("agent-sigterm", size: 1_000_000, bytesPerSecond: 250_000)
        defer { test.remove() }
        let (folder, site, server, manifest) = (test.folder, test.site, test.server, test.manifest)
        var agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let result = try CLI.run(home: home, ["fetch", "--detach", "--socket", agent.socket, manifest, "com.example.big"], timeout: 30)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        try waitUntil("200 KB received by the agent", timeout: 30) {
            (try Self.download(agent, home: home)?["bytesReceived"] as? Int ?? 0) >= 200_000
        }
        #expect(try agent.stop(SIGTERM) == 0, "log: \(agent.log)")
        let status = try CLI.run(home: home, ["--json", "status"])
        let kept = ((status.events.first?["transactions"] as? [[String: Any]])?.first?["downloads"] as? [[String: Any]])?.first
        #expect(kept?["state"] as? String == "paused", "\(status.stdout)")
        #expect(kept?["pauseReason"] as? String == "interrupted", "\(status.stdout)")
        let keptBytes = kept?["bytesReceived"] as? Int ?? 0
        #expect(keptBytes >= 200_000, "\(status.stdout)")

        agent = try AgentProcess(folder: folder)
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack finished by the next agent") { FileManager.default.fileExists(atPath: data.path) }
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        let packRequests = server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.count == 2, "\(packRequests)")
        #expect(packRequests.last?.range?.hasPrefix("bytes=0-") == false, "the kept bytes were not fetched again: \(packRequests)")
        #expect(try agent.stop() == 0)
    }

    @Test func socketActivationAndReadiness() throws {
        let folder = try Fixtures.temporaryDirectory("agent-activate")
        defer { try? FileManager.default.removeItem(at: folder) }
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-socket-activate") else {
            Issue.record("systemd-socket-activate is missing: install Debian's systemd package (scripts/install-deps)")
            return
        }
        let notify = try NotifyListener(path: folder.appending(path: "notify.sock").path)
        let socket = folder.appending(path: "run/agent.sock").path
        let agent = try AgentProcess(
            folder: folder, arguments: ["--idle-timeout", "2"], launcher: ["/usr/bin/systemd-socket-activate", "-l", socket],
            environment: ["NOTIFY_SOCKET": notify.path], waitForAnswer: false)
        try agent.waitUntilAnswering()
        #expect(notify.receive(timeout: 10)?.contains("READY=1") == true, "READY=1 on NOTIFY_SOCKET; log: \(agent.log)")
        #expect(agent.log.contains("activated: true") || agent.log.contains("activated=true"), "log: \(agent.log)")
        // Idle for 2 s with no client and nothing queued: the agent exits 0 and the socket stays systemd's.
        try waitUntil("the activated agent's idle exit", timeout: 20) { agent.log.contains("Agent stopping") }
    }

    /// The agent SIGKILLed mid-download, as the OOM killer does: nothing runs until the next request, which socket
    /// activation answers by starting the agent again (systemd keeps the socket; `systemd-socket-activate` stands in
    /// for it here), and that agent resumes the download from the kept bytes.
    @Test func anAgentKilledMidDownloadIsStartedByTheNextRequestAndResumes() throws {
        let folder = try Fixtures.temporaryDirectory("agent-killed")
        defer { try? FileManager.default.removeItem(at: folder) }
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-socket-activate") else {
            Issue.record("systemd-socket-activate is missing: install Debian's systemd package (scripts/install-deps)")
            return
        }
        let (site, server, manifest) = try Self.slowSite("agent-killed-site", size: 1_000_000, bytesPerSecond: 250_000)
        defer {
            server.stop()
            try? FileManager.default.removeItem(at: site.folder)
        }
        let socket = folder.appending(path: "run/agent.sock").path
        let activate = ["/usr/bin/systemd-socket-activate", "-l", socket]
        let first = try AgentProcess(folder: folder, launcher: activate)
        let home = folder.appending(path: "home")
        let fetch = try CLI.run(home: home, ["fetch", "--detach", "--socket", socket, manifest, "com.example.big"], timeout: 30)
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        try waitUntil("200 KB received by the agent", timeout: 30) {
            (try Self.download(first, home: home)?["bytesReceived"] as? Int ?? 0) >= 200_000
        }
        _ = try first.stop(SIGKILL)
        let requestsBefore = server.requests().filter { $0.file == "big.tar" }.count
        usleep(1_000_000)
        #expect(server.requests().filter { $0.file == "big.tar" }.count == requestsBefore, "nothing runs with the agent gone")

        // systemd listens again; the agent starts only when a client connects. (Both write to agent.log.)
        let firstLog = first.log.count
        let second = try AgentProcess(folder: folder, launcher: activate, waitForAnswer: false)
        try waitUntil("the socket listened on again", timeout: 10) { second.log.dropFirst(firstLog).contains("Listening on") }
        #expect(!second.log.dropFirst(firstLog).contains("activated"), "the agent waits for a request: \(second.log)")
        let status = try CLI.run(home: home, ["--json", "status", "--socket", socket], timeout: 30)
        #expect(status.status == 0, "stderr: \(status.stderr)")
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack finished by the agent the request started") { FileManager.default.fileExists(atPath: data.path) }
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        let packRequests = server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.count == 2, "\(packRequests)")
        #expect(packRequests.last?.range?.hasPrefix("bytes=0-") == false, "the kept bytes were not fetched again: \(packRequests)")
        #expect(try second.stop() == 0, "log: \(second.log)")
    }

    @Test func anotherUserIsRefusedAndLogged() throws {
        let folder = try Fixtures.temporaryDirectory("agent-uid")
        defer { try? FileManager.default.removeItem(at: folder) }
        guard getuid() == 0 else {
            Issue.record("this test switches to nobody with setpriv and needs root")
            return
        }
        let agent = try AgentProcess(folder: folder)
        // For this test only: let nobody reach the socket, so that only the peer check stands in its way.
        chmod(folder.path, 0o755)
        chmod(folder.appending(path: "run").path, 0o755)
        chmod(agent.socket, 0o666)
        let refused = try agent.request("GET", "/v1/version", user: "nobody", timeout: 10)
        #expect(refused.status == 0 && refused.body.isEmpty, "nothing answered to another uid: \(refused)")
        #expect(agent.log.contains("Refused a connection from another user"), "log: \(agent.log)")
        #expect(try agent.request("GET", "/v1/version").status == 200, "the owner is still served")
        #expect(try agent.stop() == 0)
    }

    @Test func aSocketFolderOpenToOthersIsRefusedWith78() throws {
        let folder = try Fixtures.temporaryDirectory("agent-unsafe")
        defer { try? FileManager.default.removeItem(at: folder) }
        let run = folder.appending(path: "run")
        try FileManager.default.createDirectory(at: run, withIntermediateDirectories: true)
        chmod(run.path, 0o755)
        let result = try Fixtures.run(CLI.binary, ["agent", "--socket", run.appending(path: "agent.sock").path], timeout: 30)
        #expect(result.status == 78)
        #expect(result.stderr.contains("open to other users"), "\(result.stderr)")
        #expect(!FileManager.default.fileExists(atPath: run.appending(path: "agent.sock").path))
    }

    @Test func theUserUnitsVerify() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-analyze") else {
            print("skipped: systemd-analyze is missing (Debian's systemd package; scripts/install-deps installs it)")
            return
        }
        let folder = try Fixtures.temporaryDirectory("agent-units")
        defer { try? FileManager.default.removeItem(at: folder) }
        let runtime = folder.appending(path: "runtime")
        try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var units: [String] = []
        for name in ["packs-agent.socket", "packs-agent.service"] {
            let text = try String(contentsOf: CLI.packageRoot.appending(path: "Packaging/\(name)"), encoding: .utf8)
            // The installed path is /usr/bin/packs; here the built binary stands in for it.
            let unit = folder.appending(path: name)
            try text.replacingOccurrences(of: "/usr/bin/packs", with: CLI.binary).write(to: unit, atomically: true, encoding: .utf8)
            units.append(unit.path)
        }
        let service = try String(contentsOf: CLI.packageRoot.appending(path: "Packaging/packs-agent.service"), encoding: .utf8)
        let socket = try String(contentsOf: CLI.packageRoot.appending(path: "Packaging/packs-agent.socket"), encoding: .utf8)
        #expect(service.contains("Type=notify") && service.contains("ExecStart=/usr/bin/packs agent"))
        #expect(socket.contains("ListenStream=%t/packs/agent.sock") && socket.contains("SocketMode=0600"))
        let result = try Fixtures.run(
            "systemd-analyze", ["verify", "--user", "--man=no"] + units,
            environment: ProcessInfo.processInfo.environment.merging(["XDG_RUNTIME_DIR": runtime.path]) { $1 }, timeout: 60)
        #expect(result.status == 0 && result.stdout.isEmpty && result.stderr.isEmpty, "\(result.stdout)\(result.stderr)")
    }
}
