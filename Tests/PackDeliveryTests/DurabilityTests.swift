import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Kills, relaunches and concurrent processes: nothing is lost, half-installed or fetched twice.
@Suite(.timeLimit(.minutes(5))) struct DurabilityTests {
    static let size = 8 << 20

    @Test func aKilledFetchResumesFetchingOnlyTheMissingBytes() throws {
        let site = try TestSite.random("kill-transfer-site", size: Self.size)
        let pack = try #require(try site.manifest().products.first?.contents.first)
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("kill-transfer-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString

        let fetch = try CLI.start(home: home, ["fetch", manifestURL, "com.example.big"])
        let started = Date()
        while partialArchive(home) == nil && Date().timeIntervalSince(started) < 10 { usleep(10_000) }
        let partial = try #require(partialArchive(home))
        #expect(waitForFile(partial, atLeast: 3 << 20))
        kill(fetch.processIdentifier, SIGKILL)
        fetch.waitUntilExit()
        let kept = try #require(try FileManager.default.attributesOfItem(atPath: partial.path)[.size] as? Int64)
        #expect(kept >= 3 << 20 && kept < pack.contentLength)

        // A killed fetch shows up in the queue until it is resumed.
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains("com.example.big"))

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let sent = nginx.bodyBytesSent(path: "/big.tar")
        #expect(sent - Int(pack.contentLength) <= 1 << 20, "sent \(sent) bytes for a \(pack.contentLength)-byte pack")
        let installed = try CLI.run(home: home, ["content", "com.example.big"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: installed).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(leftoversAfterCleanup(home) == [])
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }

    /// Kills `packs fetch` in each phase, then resumes: the right content ends up installed exactly once.
    @Test(arguments: ["downloading", "verifying", "unpacking", "installing", "finished"])
    func killedInAPhaseAndResumedInstallsExactlyOnce(phase: String) throws {
        let site = try TestSite.random("kill-\(phase)-site", size: 6 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: phase == "downloading" ? 8 << 20 : nil)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("kill-\(phase)-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let killed = try runAndKill(home: home, ["fetch", manifestURL, "com.example.big"]) { event in
            if phase == "finished" { return event["state"] as? String == "finished" }
            return event["phase"] as? String == phase && ((event["progress"] as? Double ?? 0) > 0.3 || phase != "downloading")
        }
        #expect(killed, "the fetch was killed once it reported \(phase)")
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "resume after a kill while \(phase): \(resume.stderr)")
        let content = try CLI.run(home: home, ["--json", "content"])
        #expect(content.events.count == 1, "installed exactly once: \(content.stdout)")
        let path = try #require(content.events.first?["contentURL"] as? String)
        let data = URL(filePath: path).appending(path: "Contents/data.bin")
        #expect(try Fixtures.sha256Hex(of: data) == site.dataSHA256)
        #expect(
            try FileManager.default.contentsOfDirectory(atPath: home.appending(path: "Caches").path).sorted() == [
                ".packdelivery", "CACHEDIR.TAG", "com.example.big",
            ])
        #expect(leftoversAfterCleanup(home) == [])
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }

    @Test func finishIsRefusedWhileDownloadsArePendingAndChangesNothing() throws {
        let site = try TestSite.random("finish-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("finish-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        try runAndKill(home: home, ["fetch", manifestURL, "com.example.big", "--no-finish"]) { event in
            (event["progress"] as? Double ?? 0) > 0.1
        }
        let status = try CLI.run(home: home, ["--json", "status"])
        let document = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let transaction = try #require((document["transactions"] as? [[String: Any]])?.first)
        let transactionID = try #require(transaction["id"] as? String)
        let download = try #require((transaction["downloads"] as? [[String: Any]])?.first)
        let downloadID = try #require(download["id"] as? String)

        let refused = try CLI.run(home: home, ["finish", transactionID])
        #expect(refused.status == 64)
        #expect(
            refused.stderr.contains(downloadID) && refused.stderr.contains("paused"),
            "names the pending download and its state: \(refused.stderr)")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout == status.stdout, "a refused finish changes nothing")

        // resume with --no-finish origin: the content installs, the transaction stays open until finish.
        let resume = try CLI.run(home: home, ["resume", downloadID])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(transactionID))
        let finish = try CLI.run(home: home, ["finish", transactionID])
        #expect(finish.status == 0, "stderr: \(finish.stderr)")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
        #expect(try CLI.run(home: home, ["content", "com.example.big"]).status == 0, "content outlives its finished transaction")
    }

    @Test func updateRestoreAndRemove() throws {
        let v1 = try TestSite.random("update-v1", version: "1.0", size: 256 << 10)
        let v2 = try TestSite.random("update-v2", version: "2.0", size: 300 << 10)
        let home = try Fixtures.temporaryDirectory("update-home")
        #expect(try CLI.run(home: home, ["fetch", v1.manifestURL.path, "com.example.big"]).status == 0)
        let first = try CLI.run(home: home, ["--json", "content", "com.example.big"]).events.first
        #expect(first?["contentVersion"] as? String == "1.0")
        let update = try CLI.run(home: home, ["fetch", v2.manifestURL.path, "com.example.big"])
        #expect(update.status == 0, "stderr: \(update.stderr)")
        let second = try #require(try CLI.run(home: home, ["--json", "content", "com.example.big"]).events.first)
        #expect(second["contentVersion"] as? String == "2.0")
        #expect(second["contentURL"] as? String == first?["contentURL"] as? String, "an update replaces the folder in place")
        let data = URL(filePath: second["contentURL"] as! String).appending(path: "Contents/data.bin")
        #expect((try? FileManager.default.attributesOfItem(atPath: data.path)[.size] as? Int) == 300 << 10)
        #expect(leftoversAfterCleanup(home) == [])

        #expect(try CLI.run(home: home, ["remove", "com.example.big"]).status == 0)
        #expect(try CLI.run(home: home, ["content", "com.example.big"]).status != 0)
        #expect(!FileManager.default.fileExists(atPath: data.path))
        let restore = try CLI.run(home: home, ["--json", "fetch", v2.manifestURL.path, "com.example.big", "--restore"])
        #expect(restore.status == 0, "stderr: \(restore.stderr)")
        #expect(restore.events.contains { $0["event"] as? String == "transaction" && $0["kind"] as? String == "restored" })
        #expect(FileManager.default.fileExists(atPath: data.path))
    }

    @Test func processesOpeningANewHomeAtOnceAllSucceed() throws {
        for round in 0..<4 {
            let home = try Fixtures.temporaryDirectory("open-race-\(round)")
            let results = Mutex<[String]>([])
            DispatchQueue.concurrentPerform(iterations: 4) { _ in
                let result = try? CLI.run(home: home, ["--json", "status"])
                results.withLock { $0.append(result.map { "\($0.status) \($0.stderr)" } ?? "did not run") }
            }
            #expect(results.withLock { $0 } == Array(repeating: "0 ", count: 4))
        }
    }

    @Test func twoResumesOfTheSameDownloadRunItOnce() throws {
        let site = try TestSite.random("double-resume-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 2 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("double-resume-home")
        try runAndKill(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"]) {
            ($0["progress"] as? Double ?? 0) > 0.1
        }
        let results = Mutex<[Int32]>([])
        DispatchQueue.concurrentPerform(iterations: 2) { _ in
            let status = (try? CLI.run(home: home, ["resume"]))?.status ?? -1
            results.withLock { $0.append(status) }
        }
        // One resume runs it; the other finds it owned elsewhere and has nothing to do.
        #expect(results.withLock { $0 }.allSatisfy { $0 == 0 }, "\(results.withLock { $0 })")
        let requests = nginx.requests().filter { $0.uri == "/big.tar" }
        #expect(requests.count == 2, "the killed fetch and exactly one resume: \(requests)")
        #expect(try CLI.run(home: home, ["--json", "content"]).events.count == 1)
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }

    @Test func twoProcessesFetchDifferentProductsOnOneHome() throws {
        let site = try TestSite.samples("two-site")
        let nginx = try NginxServer(root: site.folder, limitRate: 64 << 10)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("two-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let results = Mutex<[Int32]>([])
        let products = ["com.example.ocean", "com.example.forest", "com.example.atlas"]
        let errors = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: products.count) { index in
            let result = try? CLI.run(home: home, ["fetch", manifestURL, products[index]])
            results.withLock { $0.append(result?.status ?? -1) }
            if let result, result.status != 0 { errors.withLock { $0.append(result.stderr) } }
        }
        #expect(results.withLock { $0 } == [0, 0, 0], "\(errors.withLock { $0 })")
        #expect(try CLI.run(home: home, ["--json", "content"]).events.count == 3)
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
        // Each pack was sent once.
        let requests = nginx.requests().filter { $0.uri != "/manifest.json" }
        #expect(requests.count == 3, "\(requests)")
    }
}
