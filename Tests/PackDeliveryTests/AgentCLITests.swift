import Foundation
import PackTestSupport
import Testing

/// `status`, `pause`, `resume`, `cancel` and `priority` through the agent when it serves the home: the real binary and
/// agent, a throttled FaultServer, and the agent's event stream.
@Suite(.serialized, .timeLimit(.minutes(3))) struct AgentCLITests {
    /// An agent running a throttled download of `com.example.big` into `home`, handed to it with `fetch --detach`.
    static func slowDownload(_ test: AgentSite) throws -> (agent: AgentProcess, home: URL, id: String) {
        let agent = try AgentProcess(folder: test.folder)
        let home = test.folder.appending(path: "home")
        let fetch = try CLI.run(
            home: home, ["--json", "fetch", "--detach", "--socket", agent.socket, test.manifest, "com.example.big"], timeout: 30)
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        let id = try #require((fetch.events.first?["downloads"] as? [String])?.first, "\(fetch.stdout)")
        try waitUntil("the agent receiving bytes", timeout: 30) {
            (try AgentTests.download(agent, home: home)?["bytesReceived"] as? Int ?? 0) > 0
        }
        return (agent, home, id)
    }

    static func firstDownload(_ result: CLI.Result) -> [String: Any]? {
        ((result.events.first?["transactions"] as? [[String: Any]])?.first?["downloads"] as? [[String: Any]])?.first
    }

    /// `resume --json` through the agent ends as the in-process one does: with the run's summary, which counts the
    /// bytes kept before the pause as resumed, not fetched.
    @Test func resumeWithJSONThroughTheAgentEndsWithTheSummary() throws {
        let test = try AgentSite("agent-cli-summary", size: 600_000, bytesPerSecond: 100_000)
        defer { test.remove() }
        let (agent, home, id) = try Self.slowDownload(test)
        #expect(try CLI.run(home: home, ["pause", "--socket", agent.socket, id], timeout: 30).status == 0)
        let paused = try #require(try AgentTests.download(agent, home: home))
        let (kept, length) = (paused["bytesReceived"] as? Int ?? 0, paused["contentLength"] as? Int ?? 0)
        let resume = try CLI.run(home: home, ["--json", "resume", "--socket", agent.socket, id], timeout: 60)
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let summary = try #require(resume.events.last, "\(resume.stdout)")
        #expect(summary["event"] as? String == "summary", "\(resume.stdout)")
        #expect(summary["downloads"] as? Int == 1 && summary["finished"] as? Int == 1, "\(summary)")
        let (resumed, fetched) = (summary["bytesResumed"] as? Int ?? -1, summary["bytesFetched"] as? Int ?? -1)
        #expect(resumed >= kept && kept > 0, "the bytes kept at the pause (\(kept)) are resumed: \(summary)")
        #expect(resumed + fetched == length, "\(summary)")
        #expect(summary["sources"] as? [String] == ["http://127.0.0.1:\(test.server.port)"], "\(summary)")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    /// Ctrl-C on `resume` through the agent stops it as in-process: the downloads it follows are paused in the agent
    /// with their bytes kept, and the command exits 130 with one line naming them.
    @Test func interruptingResumeThroughTheAgentPausesItsDownloads() throws {
        let test = try AgentSite("agent-cli-interrupt", size: 1_000_000, bytesPerSecond: 100_000)
        defer { test.remove() }
        let folder = test.folder
        let (agent, home, id) = try Self.slowDownload(test)
        #expect(try CLI.run(home: home, ["pause", "--socket", agent.socket, id], timeout: 30).status == 0)
        let (resume, output) = try Self.startWatch(["--home", home.path, "resume", "--socket", agent.socket, id], folder: folder)
        defer { if resume.isRunning { kill(resume.processIdentifier, SIGKILL) } }
        try waitUntil("the download running again in the agent", timeout: 20) {
            try AgentTests.download(agent, home: home)?["state"] as? String == "active"
        }
        kill(resume.processIdentifier, SIGINT)
        try waitUntil("resume exited after SIGINT", timeout: 10) { !resume.isRunning }
        let printed = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        #expect(resume.terminationReason == .exit && resume.terminationStatus == 130, "\(printed)")
        #expect(printed.contains("Interrupted; the downloads are paused with their data kept. Run packs resume \(id)"), "\(printed)")
        let now = try #require(try AgentTests.download(agent, home: home))
        #expect(now["state"] as? String == "paused" && now["pauseReason"] as? String == "user", "\(now)")
        #expect(now["bytesReceived"] as? Int ?? 0 > 0, "its bytes kept: \(now)")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    @Test func pauseGoesThroughTheAgentThenResumeFinishesIt() throws {
        let test = try AgentSite("agent-cli-pause", size: 1_000_000, bytesPerSecond: 100_000)
        defer { test.remove() }
        let folder = test.folder
        let (agent, home, id) = try Self.slowDownload(test)
        let stream = try EventStreamClient(socket: agent.socket)
        try waitUntil("the event stream counted", timeout: 10) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
        }

        let pause = try CLI.run(home: home, ["pause", "--socket", agent.socket, id], timeout: 30)
        #expect(pause.status == 0, "stderr: \(pause.stderr)")
        #expect(pause.stdout.isEmpty && pause.stderr.isEmpty, "\(pause.stdout)\(pause.stderr)")
        // Through the agent the pause is done when the command returns (through the store it takes up to a second).
        let now = try AgentTests.download(agent, home: home)
        #expect(now?["state"] as? String == "paused", "\(String(describing: now))")
        try waitUntil("a paused event for \(id) on the agent's stream", timeout: 10) {
            stream.events.contains {
                $0.kind == "download" && $0.data.contains("\"id\":\"\(id)\"") && $0.data.contains("\"state\":\"paused\"")
            }
        }

        let viaAgent = try CLI.run(home: home, ["--json", "status", "--socket", agent.socket], timeout: 30)
        #expect(viaAgent.status == 0, "stderr: \(viaAgent.stderr)")
        #expect(Self.firstDownload(viaAgent)?["state"] as? String == "paused", "\(viaAgent.stdout)")
        #expect(Self.firstDownload(viaAgent)?["pauseReason"] as? String == "user", "\(viaAgent.stdout)")
        // The same bytes as the in-process status of the same home (no agent on that socket), --json and not.
        let nowhere = folder.appending(path: "nothing.sock").path
        let inProcess = try CLI.run(home: home, ["--json", "status", "--socket", nowhere], timeout: 30)
        #expect(inProcess.status == 0 && inProcess.stdout == viaAgent.stdout, "agent:\n\(viaAgent.stdout)\nhere:\n\(inProcess.stdout)")
        let humanAgent = try CLI.run(home: home, ["status", "--socket", agent.socket], timeout: 30)
        let humanHere = try CLI.run(home: home, ["status", "--socket", nowhere], timeout: 30)
        #expect(humanAgent.status == 0 && humanAgent.stdout == humanHere.stdout, "agent:\n\(humanAgent.stdout)\nhere:\n\(humanHere.stdout)")
        #expect(humanAgent.stdout.contains("\(id)  paused (user)"), "\(humanAgent.stdout)")

        let resume = try CLI.run(home: home, ["resume", "--socket", agent.socket, id], timeout: 60)
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        #expect(FileManager.default.fileExists(atPath: data.path), "resume returned once the agent installed the pack")
        // The lines the in-process resume prints when piped: a line per change, the install, the transaction finished.
        let printed = resume.stdout.split(separator: "\n").map(String.init)
        let transaction = try #require(Self.firstDownload(viaAgent)?["transactionID"] as? String)
        #expect(printed.contains { $0.hasPrefix("downloading com.example.big ") && $0.contains(id) }, "\(resume.stdout)")
        #expect(
            printed.contains { $0.hasPrefix("installed com.example.big ") && $0.hasSuffix("→ \(home.path)/Caches/com.example.big") },
            "\(resume.stdout)")
        #expect(printed.last == "finished transaction \(transaction) (com.example.big)", "\(resume.stdout)")
        #expect(try Fixtures.sha256Hex(of: data) == test.site.dataSHA256)
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    @Test func priorityAndCancelGoThroughTheAgentAndAnUnknownIDFailsAsInProcess() throws {
        let test = try AgentSite("agent-cli-cancel", size: 1_000_000, bytesPerSecond: 100_000)
        defer { test.remove() }
        let folder = test.folder
        let (agent, home, id) = try Self.slowDownload(test)
        let priority = try CLI.run(home: home, ["priority", "--socket", agent.socket, id, "high"], timeout: 30)
        #expect(priority.status == 0 && priority.stdout.isEmpty, "stderr: \(priority.stderr)")
        #expect(try AgentTests.download(agent, home: home)?["priority"] as? String == "userInitiated")

        let nowhere = folder.appending(path: "nothing.sock").path
        let unknownAgent = try CLI.run(home: home, ["pause", "--socket", agent.socket, "d-nothere"], timeout: 30)
        let unknownHere = try CLI.run(home: home, ["pause", "--socket", nowhere, "d-nothere"], timeout: 30)
        #expect(unknownAgent.status == 64 && unknownHere.status == 64, "\(unknownAgent.stderr) / \(unknownHere.stderr)")
        #expect(unknownAgent.stderr == unknownHere.stderr, "agent: \(unknownAgent.stderr) here: \(unknownHere.stderr)")

        let cancel = try CLI.run(home: home, ["cancel", "--socket", agent.socket, id], timeout: 30)
        #expect(cancel.status == 0, "stderr: \(cancel.stderr)")
        let status = try CLI.run(home: home, ["--json", "status", "--socket", agent.socket], timeout: 30)
        let state = Self.firstDownload(status)?["state"] as? String
        #expect(state == nil || state == "cancelled", "\(status.stdout)")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.big").path))
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    @Test func anAgentThatDoesNotServeTheHomeIsLeftAlone() throws {
        let folder = try Fixtures.temporaryDirectory("agent-cli-other-home")
        defer { try? FileManager.default.removeItem(at: folder) }
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let status = try CLI.run(home: home, ["status", "--socket", agent.socket], timeout: 30)
        #expect(status.status == 0 && status.stdout == "No open transactions.\n", "\(status.stdout)\(status.stderr)")
        let version = try agent.request("GET", "/v1/version?home=\(home.path)")
        #expect(version.json["homes"] as? Int == 0, "asking did not make the agent serve the home: \(version.body)")
        #expect(version.json["servesHome"] as? Bool == false, "\(version.body)")
        #expect(try agent.stop() == 0)
    }

    /// `packs watch` started with its output in a file of `folder`.
    static func startWatch(_ arguments: [String], folder: URL) throws -> (Process, URL) {
        let output = folder.appending(path: "watch.out")
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        let process = Process()
        process.executableURL = URL(filePath: CLI.binary)
        process.arguments = arguments
        process.standardOutput = try FileHandle(forWritingTo: output)
        process.standardError = process.standardOutput
        try process.run()
        return (process, output)
    }

    @Test func watchFollowsADetachedFetchToTheEndAndExits0OnSIGINT() throws {
        let test = try AgentSite("agent-cli-watch", size: 400_000, bytesPerSecond: 200_000)
        defer { test.remove() }
        let (folder, manifest) = (test.folder, test.manifest)
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let (json, jsonOutput) = try Self.startWatch(["--json", "watch", "--socket", agent.socket], folder: folder)
        defer { if json.isRunning { kill(json.processIdentifier, SIGKILL) } }
        let human = Process()
        human.executableURL = URL(filePath: CLI.binary)
        human.arguments = ["watch", "--socket", agent.socket]
        let humanOutput = folder.appending(path: "human.out")
        _ = FileManager.default.createFile(atPath: humanOutput.path, contents: nil)
        human.standardOutput = try FileHandle(forWritingTo: humanOutput)
        try human.run()
        defer { if human.isRunning { kill(human.processIdentifier, SIGKILL) } }
        try waitUntil("both watchers on the event stream", timeout: 20) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 2
        }
        let fetch = try CLI.run(
            home: home, ["--json", "fetch", "--detach", "--socket", agent.socket, manifest, "com.example.big"], timeout: 30)
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        let id = try #require((fetch.events.first?["downloads"] as? [String])?.first, "\(fetch.stdout)")
        let lines = {
            (try? String(contentsOf: jsonOutput, encoding: .utf8))?.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            } ?? []
        }
        try waitUntil("the watcher showing the transaction finished", timeout: 60) {
            lines().contains { $0["event"] as? String == "transaction" && $0["state"] as? String == "finished" }
        }
        #expect(lines().contains { $0["id"] as? String == id && $0["state"] as? String == "active" && $0["home"] as? String == home.path })
        #expect(lines().contains { $0["id"] as? String == id && $0["state"] as? String == "finished" })
        try waitUntil("the human watcher showing the installed pack", timeout: 10) {
            let text = (try? String(contentsOf: humanOutput, encoding: .utf8)) ?? ""
            return text.contains("\(id)  finished") && text.contains("finished") && text.contains("com.example.big")
        }
        for process in [json, human] {
            kill(process.processIdentifier, SIGINT)
            let start = Date()
            while process.isRunning && Date().timeIntervalSince(start) < 10 { usleep(20_000) }
            #expect(!process.isRunning, "watch did not exit within 10 s of SIGINT")
            if !process.isRunning { #expect(process.terminationStatus == 0 && process.terminationReason == .exit) }
        }
        #expect(try agent.stop() == 0)
    }

    @Test func watchReconnectsToARestartedAgentAndReadsTheStatusAgainOnReset() throws {
        let test = try AgentSite("agent-cli-watch-restart", size: 800_000, bytesPerSecond: 200_000)
        defer { test.remove() }
        let folder = test.folder
        var (agent, home, id) = try Self.slowDownload(test)
        let (watch, output) = try Self.startWatch(["--json", "watch", "--socket", agent.socket], folder: folder)
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        let lines = {
            (try? String(contentsOf: output, encoding: .utf8))?.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            } ?? []
        }
        try waitUntil("the watcher showing the running download", timeout: 20) {
            lines().contains { $0["id"] as? String == id && $0["state"] as? String == "active" }
        }
        #expect(try agent.stop() == 0, "log: \(agent.log)")
        agent = try AgentProcess(folder: folder)
        try waitUntil("a reset after the restart, then the download finished by the new agent", timeout: 60) {
            let seen = lines()
            guard let reset = seen.firstIndex(where: { $0["event"] as? String == "reset" }) else { return false }
            return seen[reset...].contains { $0["id"] as? String == id && $0["state"] as? String == "finished" }
        }
        let afterReset = lines().drop { $0["event"] as? String != "reset" }.dropFirst().first
        #expect(
            afterReset?["id"] as? String == id && afterReset?["home"] as? String == home.path,
            "the status read again: \(String(describing: afterReset))")
        #expect(watch.isRunning, "watch outlived the restart")
        kill(watch.processIdentifier, SIGTERM)
        let start = Date()
        while watch.isRunning && Date().timeIntervalSince(start) < 10 { usleep(20_000) }
        #expect(!watch.isRunning && watch.terminationStatus == 0, "watch exits 0 on SIGTERM")
        #expect(try agent.stop() == 0)
    }

    @Test func watchWaitsForAnAgentThatComesBackAndExits79WhenItStaysAway() throws {
        let folder = try Fixtures.temporaryDirectory("agent-cli-watch-away")
        defer { try? FileManager.default.removeItem(at: folder) }
        var agent = try AgentProcess(folder: folder)
        let (watch, output) = try Self.startWatch(["watch", "--reconnect-timeout", "3", "--socket", agent.socket], folder: folder)
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        for round in 1...2 {
            try waitUntil("the watcher on the event stream (round \(round))", timeout: 20) {
                try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
            }
            // Longer than --reconnect-timeout with the stream open: the next absence is counted from its start.
            usleep(4_000_000)
            #expect(try agent.stop() == 0)
            agent = try AgentProcess(folder: folder)
        }
        try waitUntil("the watcher back after two restarts", timeout: 20) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
        }
        #expect(watch.isRunning, "\((try? String(contentsOf: output, encoding: .utf8)) ?? "")")
        #expect(try agent.stop() == 0)
        let start = Date()
        while watch.isRunning && Date().timeIntervalSince(start) < 20 { usleep(50_000) }
        #expect(!watch.isRunning && watch.terminationStatus == 79, "watch gives up after --reconnect-timeout")
        let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        #expect(text.contains("stopped answering and did not come back within 3 s"), "\(text)")
    }

    @Test func watchWithNoAgentExits79() throws {
        let folder = try Fixtures.temporaryDirectory("agent-cli-watch-none")
        defer { try? FileManager.default.removeItem(at: folder) }
        let result = try CLI.run(
            home: folder.appending(path: "home"), ["watch", "--socket", folder.appending(path: "none.sock").path], timeout: 30)
        #expect(result.status == 79, "\(result.stdout)\(result.stderr)")
        #expect(result.stderr.contains("No agent answers on"), "\(result.stderr)")
    }

    @Test func finishContentAndGCGoThroughTheAgent() throws {
        let test = try AgentSite("agent-cli-gc", size: 600_000, bytesPerSecond: 150_000)
        defer { test.remove() }
        let folder = test.folder
        let (agent, home, id) = try Self.slowDownload(test)
        let nowhere = folder.appending(path: "nothing.sock").path
        let transaction = try #require(try AgentTests.download(agent, home: home)?["transactionID"] as? String)
        // Refused while the download runs: the same line and exit code as in-process (the pending download named).
        let refusedAgent = try CLI.run(home: home, ["finish", "--socket", agent.socket, transaction], timeout: 30)
        let refusedHere = try CLI.run(home: home, ["finish", "--socket", nowhere, transaction], timeout: 30)
        #expect(refusedAgent.status == 64, "\(refusedAgent.stderr)")
        #expect(
            refusedAgent.stderr == refusedHere.stderr && refusedAgent.stderr.contains("packs resume \(id)"),
            "agent: \(refusedAgent.stderr) here: \(refusedHere.stderr)")
        let unknown = try CLI.run(home: home, ["finish", "--socket", agent.socket, "t-nothere"], timeout: 30)
        #expect(unknown.status == 64, "\(unknown.stderr)")
        let finish = try agent.request("POST", "/v1/transactions/t-nothere/finish", body: jsonBody(["home": home.path]))
        #expect(finish.status == 404 && finish.errorCode == "unknownTransaction", "\(finish.body)")

        let data = home.appending(path: "Caches/com.example.big/Contents/data.bin")
        try waitUntil("the pack installed by the agent") { FileManager.default.fileExists(atPath: data.path) }
        try waitUntil("the transaction finished by the agent", timeout: 20) { try AgentTests.download(agent, home: home) == nil }
        for arguments in [["content", "com.example.big"], ["--json", "content"], ["content"]] {
            let viaAgent = try CLI.run(home: home, arguments + ["--socket", agent.socket], timeout: 30)
            let here = try CLI.run(home: home, arguments + ["--socket", nowhere], timeout: 30)
            #expect(
                viaAgent.status == 0 && viaAgent.stdout.contains("com.example.big"), "\(arguments): \(viaAgent.stdout)\(viaAgent.stderr)")
            #expect(viaAgent.stdout == here.stdout, "\(arguments): agent: \(viaAgent.stdout) here: \(here.stdout)")
        }
        let dryAgent = try CLI.run(home: home, ["gc", "--to", "0", "--dry-run", "--socket", agent.socket], timeout: 30)
        let dryHere = try CLI.run(home: home, ["gc", "--to", "0", "--dry-run", "--socket", nowhere], timeout: 30)
        #expect(dryAgent.status == 0 && dryAgent.stdout.hasPrefix("would evict  com.example.big"), "\(dryAgent.stdout)\(dryAgent.stderr)")
        #expect(dryAgent.stdout == dryHere.stdout, "agent: \(dryAgent.stdout) here: \(dryHere.stdout)")
        #expect(FileManager.default.fileExists(atPath: data.path), "a dry run evicts nothing")
        let badFlag = try agent.request("POST", "/v1/gc", body: #"{"home": "\#(home.path)", "dryRun": 1}"#)
        #expect(badFlag.status == 400 && badFlag.errorCode == "invalidField", "\(badFlag.body)")

        let gc = try CLI.run(home: home, ["--json", "gc", "--to", "0", "--socket", agent.socket], timeout: 30)
        #expect(gc.status == 0, "\(gc.stderr)")
        #expect(
            gc.events.first?["event"] as? String == "evicted" && gc.events.first?["contentIdentifier"] as? String != nil, "\(gc.stdout)")
        #expect(!FileManager.default.fileExists(atPath: data.path), "evicted by the agent")
        let evictedAgent = try CLI.run(home: home, ["content", "com.example.big", "--socket", agent.socket], timeout: 30)
        let evictedHere = try CLI.run(home: home, ["content", "com.example.big", "--socket", nowhere], timeout: 30)
        #expect(evictedAgent.status == 64 && evictedAgent.stderr.contains("evicted"), "\(evictedAgent.stderr)")
        #expect(evictedAgent.stderr == evictedHere.stderr && evictedAgent.status == evictedHere.status)
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }

    /// `packs use` through the agent: the agent fetches the paused pack ahead of everything (userInitiated), the command
    /// shows the agent's events (with `home`) and prints the installed folder as the in-process use does; asked again,
    /// the folder comes at once without a request; a `packs lease` keeps it from the agent's gc until it ends; a pack of
    /// another product is refused as in-process (64).
    @Test func useGoesThroughTheAgentAndPrintsTheFolder() throws {
        let test = try AgentSite("agent-cli-use", size: 1_000_000, bytesPerSecond: 400_000)
        defer { test.remove() }
        let folder = test.folder
        let (agent, home, id) = try Self.slowDownload(test)
        let pause = try CLI.run(home: home, ["pause", "--socket", agent.socket, id], timeout: 30)
        #expect(pause.status == 0, "stderr: \(pause.stderr)")

        let use = try CLI.run(home: home, ["--json", "use", "--socket", agent.socket, "com.example.big"], timeout: 60)
        #expect(use.status == 0, "stderr: \(use.stderr)")
        let pack = home.appending(path: "Caches/com.example.big")
        let last = use.events.last
        #expect(last?["contentURL"] as? String == pack.path && last?["missing"] as? Bool == false, "\(use.stdout)")
        #expect(
            use.events.contains { $0["event"] as? String == "download" && $0["home"] as? String == home.path },
            "the agent's events: \(use.stdout)")
        #expect(try Fixtures.sha256Hex(of: pack.appending(path: "Contents/data.bin")) == test.site.dataSHA256)
        let packRequests = test.server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.count == 2 && packRequests.last?.range?.hasPrefix("bytes=0-") == false, "resumed: \(packRequests)")

        let again = try CLI.run(home: home, ["use", "--socket", agent.socket, "com.example.big"], timeout: 30)
        #expect(again.status == 0 && again.stdout == pack.path + "\n", "\(again.stdout)\(again.stderr)")
        #expect(test.server.requests().filter { $0.file == "big.tar" }.count == 2, "an installed pack needs no request")

        // A lease stays the holding process's own (it dies with it); the agent's evictions honour it from the store.
        let (lease, leaseOutput) = try Self.startWatch(["--home", home.path, "lease", "com.example.big"], folder: folder)
        defer { if lease.isRunning { kill(lease.processIdentifier, SIGKILL) } }
        try waitUntil("packs lease printing its token", timeout: 20) {
            ((try? String(contentsOf: leaseOutput, encoding: .utf8)) ?? "").hasPrefix("leased ")
        }
        let held = try CLI.run(home: home, ["gc", "--socket", agent.socket, "--to", "0"], timeout: 30)
        #expect(
            held.status == 75 && FileManager.default.fileExists(atPath: pack.path),
            "the leased pack stays (75: not down to 0): \(held.stdout)\(held.stderr)")
        kill(lease.processIdentifier, SIGTERM)
        try waitUntil("packs lease ending on SIGTERM", timeout: 20) { !lease.isRunning }
        let released = try CLI.run(home: home, ["gc", "--socket", agent.socket, "--to", "0"], timeout: 30)
        #expect(released.status == 0 && !FileManager.default.fileExists(atPath: pack.path), "\(released.stdout)\(released.stderr)")

        let stranger = try CLI.run(home: home, ["use", "--socket", agent.socket, "com.example.big", "com.example.other"], timeout: 30)
        #expect(stranger.status == 64 && stranger.stderr.contains("is not a pack of com.example.big"), "\(stranger.stderr)")
        #expect(try agent.stop() == 0, "log: \(agent.log)")
    }
}
