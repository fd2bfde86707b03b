import Foundation
import Logging
import PackDelivery
import PackServer
import PackTestSupport
import Synchronization
import Testing

/// The CLI as people and scripts use it: signals, another shell, authorisation, authoring, terminals.
@Suite(.timeLimit(.minutes(5))) struct CLITests {
    @Test(arguments: [SIGINT, SIGTERM, SIGHUP])
    func anInterruptPausesSavesAndExits130(signal: Int32) throws {
        let site = try TestSite.random("signal-\(signal)-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("signal-\(signal)-home")
        let result = try runWatching(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"],
            when: { ($0["progress"] as? Double ?? 0) > 0.1 }, do: { pid in kill(pid, signal) })
        #expect(result.matched && result.status == 130)
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#""state":"paused""#) && status.stdout.contains(#""pauseReason":"user""#), "\(status.stdout)")
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
        let ranges = nginx.requests().filter { $0.uri == "/big.tar" }.map(\.range)
        #expect(ranges.count == 2 && ranges[1]?.hasPrefix("bytes=") == true, "resumed with a range: \(ranges)")
    }

    /// `packs resume ID` of a download that a killed `fetch` started finishes its transaction as that fetch would
    /// have (it left it open, finishable); after `fetch --no-finish` it stays open.
    @Test(arguments: [false, true])
    func resumingANamedDownloadFinishesItsTransactionAsTheFetchChose(noFinish: Bool) throws {
        let site = try TestSite.random("resume-finish-\(noFinish)-site", size: 2 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("resume-finish-\(noFinish)-home")
        let fetch = ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"]
        let killed = try runAndKill(home: home, fetch + (noFinish ? ["--no-finish"] : [])) { event in
            (event["progress"] as? Double ?? 0) > 0.1
        }
        #expect(killed, "the fetch was killed mid-download")
        let status = try CLI.run(home: home, ["--json", "status"])
        let id = try #require(
            ((try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])?["transactions"] as? [[String: Any]])?
                .first.flatMap { ($0["downloads"] as? [[String: Any]])?.first?["id"] as? String }, "\(status.stdout)")
        let resume = try CLI.run(home: home, ["resume", id])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let after = try CLI.run(home: home, ["--json", "status"]).stdout
        if noFinish {
            #expect(after.contains(#""state":"finished""#) && after.contains(id), "left open, its download finished: \(after)")
        } else {
            #expect(after.contains(#"{"transactions":[]}"#), "finished, as the fetch would have: \(after)")
        }
    }

    /// `packs fetch … | head -1` — the reader goes away; the fetch pauses, saves and says so, like SIGTERM.
    @Test func aClosedOutputPipeStopsLikeSIGTERM() throws {
        let site = try TestSite.random("sigpipe-site", size: 4 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("sigpipe-home")
        let errors = home.appending(path: "stderr.txt")
        let command =
            "'\(CLI.binary)' --home '\(home.path)' --json fetch '\(nginx.baseURL.appending(path: "manifest.json").absoluteString)' com.example.big"
            + " 2>'\(errors.path)' | head -1 >/dev/null; echo \"${PIPESTATUS[0]}\""
        let result = try Fixtures.run("/bin/bash", ["-c", command], timeout: 60)
        #expect(
            result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "130",
            "exit status of packs: \(result.stdout) \(result.stderr)")
        let said = try String(contentsOf: errors, encoding: .utf8)
        #expect(said.split(separator: "\n").count == 1 && said.contains("paused"), "one line on stderr: \(said)")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#""state":"paused""#), "the download was paused and saved: \(status.stdout)")
    }

    @Test func pauseAndCancelFromAnotherShellReachARunningFetchWithinASecond() throws {
        let site = try TestSite.random("other-shell-site", size: 8 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("other-shell-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        final class When: Sendable { let date = Mutex<Date?>(nil) }
        let pausedAt = When()
        let result = try runWatching(
            home: home, ["fetch", manifestURL, "com.example.big"], when: { ($0["progress"] as? Double ?? 0) > 0.05 }
        ) { _ in
            let status = try? CLI.run(home: home, ["--json", "status"])
            let id =
                status.flatMap { try? JSONSerialization.jsonObject(with: Data($0.stdout.utf8)) as? [String: Any] }
                .flatMap { ($0["transactions"] as? [[String: Any]])?.first?["downloads"] as? [[String: Any]] }?.first?["id"] as? String
            pausedAt.date.withLock { $0 = Date() }
            _ = try? CLI.run(home: home, ["pause", id ?? "missing"])
        }
        let ended = Date()
        #expect(result.matched && result.status == 75, "a fetch that ends with a download paused exits 75")
        if let pausedAt = pausedAt.date.withLock({ $0 }) { #expect(ended.timeIntervalSince(pausedAt) < 3) }
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#""pauseReason":"user""#))
        let id = try #require(
            ((try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])?["transactions"] as? [[String: Any]])?
                .first.flatMap { ($0["downloads"] as? [[String: Any]])?.first?["id"] as? String })
        let partial = home.appending(path: "Caches/.packdelivery/downloads/\(id).pack")
        #expect(FileManager.default.fileExists(atPath: partial.path), "pause keeps the partial data")
        #expect(try CLI.run(home: home, ["cancel", id]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: partial.path), "cancel deletes it")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#""state":"cancelled""#))
    }

    @Test func headersReachAServerThatChecksATokenAndAMissingOneFailsWith77() async throws {
        let site = try TestSite.samples("token-site")
        let server = try await PackServer.start(
            PackServerConfiguration(directory: site.folder, port: 0, token: "s3cret"), logger: Logger(label: "test"))
        let home = try Fixtures.temporaryDirectory("token-home")
        let manifestURL = server.baseURL.appending(path: "manifest.json").absoluteString
        let denied = try await Fixtures.runAsync(CLI.binary, ["--home", home.path, "fetch", manifestURL, "com.example.forest"])
        #expect(denied.status == 77 && denied.stderr.contains("401"), "stderr: \(denied.stderr)")
        let allowed = try await Fixtures.runAsync(
            CLI.binary, ["--home", home.path, "fetch", manifestURL, "com.example.forest", "--header", "Authorization: Bearer s3cret"])
        await server.stop()
        #expect(allowed.status == 0, "stderr: \(allowed.stderr)")
    }

    @Test func anUnsafePackExits65NamingTheEntryAndTouchesNothing() throws {
        let site = try Fixtures.temporaryDirectory("unsafe-site")
        let canary = site.deletingLastPathComponent().appending(path: "unsafe-canary-\(UUID().uuidString)")
        let script = """
            import tarfile, io
            with tarfile.open('\(site.path)/evil.tar.gz', 'w:gz') as t:
                data = b'ok'
                info = tarfile.TarInfo('Contents/good.txt'); info.size = len(data); t.addfile(info, io.BytesIO(data))
                link = tarfile.TarInfo('Contents/escape'); link.type = tarfile.SYMTYPE; link.linkname = '../../../../\(canary.lastPathComponent)'; t.addfile(link)
                bad = tarfile.TarInfo('Contents/escape/pwned'); bad.size = len(data); t.addfile(bad, io.BytesIO(data))
            """
        #expect(try Fixtures.run("python3", ["-c", script]).status == 0)
        let pack = site.appending(path: "evil.tar.gz")
        let manifest = """
            {"products":[{"productIdentifier":"com.example.evil","contents":[{"contentIdentifier":"com.example.evil","contentVersion":"1",
            "url":"evil.tar.gz","contentLength":\(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as! Int),"sha256":"\(try Fixtures.sha256Hex(of: pack))"}]}]}
            """
        try Data(manifest.utf8).write(to: site.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory("unsafe-home")
        let fetch = try CLI.run(home: home, ["fetch", site.appending(path: "manifest.json").path, "com.example.evil"])
        #expect(fetch.status == 65)
        #expect(fetch.stderr.contains("Contents/escape"), "the error names the entry: \(fetch.stderr)")
        #expect(!FileManager.default.fileExists(atPath: canary.path))
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.evil").path))
        #expect(leftoversAfterCleanup(home) == [])
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#""state":"failed""#))
    }

    @Test func packAndManifestFeedFetch() throws {
        let work = try Fixtures.temporaryDirectory("authoring")
        let content = work.appending(path: "content")
        try FileManager.default.createDirectory(at: content.appending(path: "maps"), withIntermediateDirectories: true)
        try Data("level one".utf8).write(to: content.appending(path: "maps/one.txt"))
        try Fixtures.randomFile(at: content.appending(path: "music.bin"), size: 200_000)
        let site = work.appending(path: "site")
        try FileManager.default.createDirectory(at: site, withIntermediateDirectories: true)
        for (format, product) in [
            ("zip", "com.example.a"), ("tar.gz", "com.example.b"), ("tar.xz", "com.example.c"), ("tar.zst", "com.example.d"),
        ] {
            let pack = try Fixtures.run(
                CLI.binary,
                [
                    "pack", content.path, "--product", product, "--version", "3.1", "--output",
                    site.appending(path: "\(product).\(format)").path,
                ])
            #expect(pack.status == 0, "pack \(format): \(pack.stderr)")
        }
        #expect(try Fixtures.run(CLI.binary, ["manifest", site.path]).status == 0)
        let manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        #expect(manifest.products.count == 4)
        #expect(
            manifest.products.allSatisfy { $0.contents.first?.unpackedLength ?? 0 > 200_000 && $0.contents.first?.contentVersion == "3.1" })
        let home = work.appending(path: "home")
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let fetch = try CLI.run(
            home: home,
            ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString] + manifest.products.map(\.productIdentifier))
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        for product in manifest.products {
            let path = try CLI.run(home: home, ["content", product.productIdentifier]).stdout.trimmingCharacters(
                in: .whitespacesAndNewlines)
            #expect(try treeContents(URL(filePath: path).appending(path: "Contents")) == treeContents(content))
        }
        let bad = try Fixtures.run(CLI.binary, ["pack", content.path, "--output", work.appending(path: "x.rar").path])
        #expect(bad.status == 64 && bad.stderr.contains(".zip"))
    }

    @Test func aTerminalGetsALiveLineWithPercentSpeedAndTimeLeft() throws {
        let site = try TestSite.random("tty-site", size: 3 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("tty-home")
        let transcript = home.appending(path: "typescript")
        let command =
            "\(CLI.binary) --home \(home.path) fetch \(nginx.baseURL.appending(path: "manifest.json").absoluteString) com.example.big"
        // `script` runs the command under a pseudo-terminal and records what the terminal received.
        let run = try Fixtures.run("script", ["-qfec", command, transcript.path], environment: ["TERM": "xterm", "PATH": "/usr/bin:/bin"])
        #expect(run.status == 0, "stderr: \(run.stderr)")
        let screen = try String(decoding: Data(contentsOf: transcript), as: UTF8.self)
        #expect(screen.contains("\r\u{1B}[2K"), "lines are redrawn in place")
        #expect(screen.range(of: #"\[#+-*\] +\d+%"#, options: .regularExpression) != nil, "a bar and a percentage")
        #expect(screen.range(of: #"\d+\.\d (KiB|MiB)/s ETA \d+s"#, options: .regularExpression) != nil, "speed and time left")
        #expect(screen.contains("installed"))
    }

    /// Installed from the Debian package (scripts/package), packs is /usr/bin/packs and its samples are in
    /// /usr/share/packs/SampleContent: `packs demo` run from any folder finds them there. scripts/test-package
    /// checks the same with the real package.
    @Test func demoOfAnInstalledBinaryFindsTheSamplesInShare() throws {
        let prefix = try Fixtures.temporaryDirectory("installed-prefix")
        defer { try? FileManager.default.removeItem(at: prefix) }
        let samples = prefix.appending(path: "share/packs/SampleContent")
        try FileManager.default.createDirectory(at: prefix.appending(path: "bin"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: samples.deletingLastPathComponent(), withIntermediateDirectories: true)
        // A hard link: a symbolic one would lead packs back to .build, beside the package's own SampleContent.
        try FileManager.default.linkItem(atPath: CLI.binary, toPath: prefix.appending(path: "bin/packs").path)
        try FileManager.default.copyItem(at: CLI.packageRoot.appending(path: "SampleContent"), to: samples)
        let elsewhere = try Fixtures.temporaryDirectory("installed-cwd")
        let home = try Fixtures.temporaryDirectory("installed-home")
        let demo = try Fixtures.run(
            prefix.appending(path: "bin/packs").path, ["demo", "--home", home.path], currentDirectory: elsewhere, timeout: 120)
        #expect(demo.status == 0, "stdout: \(demo.stdout) stderr: \(demo.stderr)")
        #expect(demo.stdout.contains("sample packs from \(samples.path)"), "\(demo.stdout)")
        let content = try CLI.run(home: home, ["--json", "content"])
        let installed = content.stdout.split(separator: "\n").filter { $0.contains(#""missing":false"#) }
        #expect(installed.count == 3, "the three sample products are installed: \(content.stdout)")
    }
}

/// The exit codes are told in three places: the README's table, `packs --help` and `ExitStatus.swift`. They must
/// name the same codes (the help once missed 77).
@Suite(.timeLimit(.minutes(1))) struct ExitCodeDocumentationTests {
    @Test func theReadmeTheHelpAndTheCodeListTheSameExitCodes() throws {
        let root = URL(filePath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appending(path: "README.md"), encoding: .utf8)
        let section = try #require(
            readme.components(separatedBy: "### Exit codes").dropFirst().first?.components(separatedBy: "\n## ").first)
        let documented = Set(
            section.split(separator: "\n").compactMap { line -> Int? in
                let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
                return line.hasPrefix("|") ? cells.first.flatMap { Int($0) } : nil
            })
        let source = try String(contentsOf: root.appending(path: "Sources/packs/ExitStatus.swift"), encoding: .utf8)
        let declared = Set(
            source.split(separator: "\n").compactMap { line -> Int? in
                guard line.contains("static let"), line.contains(": Int32 = ") else { return nil }
                return Int(line.components(separatedBy: ": Int32 = ").last!.trimmingCharacters(in: .whitespaces))
            } + [0])
        let help = try CLI.run(home: Fixtures.temporaryDirectory("help-home"), ["--help"])
        #expect(help.status == 0, "\(help.stderr)")
        let paragraph = try #require(
            help.stdout.components(separatedBy: "Exit codes:").dropFirst().first?.components(separatedBy: "Example:").first)
        let helped = Set(paragraph.split { !$0.isNumber }.compactMap { Int($0) })
        #expect(declared.contains(77) && declared.count >= 8, "codes declared in ExitStatus.swift: \(declared.sorted())")
        #expect(documented == declared, "README \(documented.sorted()) vs ExitStatus.swift \(declared.sorted())")
        #expect(helped == declared, "packs --help \(helped.sorted()) vs ExitStatus.swift \(declared.sorted())")
    }
}

/// `fetch --json` ends with a summary a pipeline can read instead of parsing text: its byte counts agree with the
/// server's, and a second fetch of installed content fetches nothing.
@Suite(.timeLimit(.minutes(2))) struct RunSummaryTests {
    @Test func fetchJSONEndsWithASummaryThatAgreesWithTheServer() throws {
        let site = try TestSite.random("summary-site", size: 3 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("summary-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        func summary(_ result: CLI.Result) throws -> [String: Any] {
            #expect(result.status == 0, "\(result.stderr)")
            let last = try #require(result.stdout.split(separator: "\n").last)
            return try #require(try JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any])
        }
        let first = try summary(try CLI.run(home: home, ["--json", "fetch", manifest, "com.example.big"]))
        #expect(first["event"] as? String == "summary")
        #expect(first["downloads"] as? Int == 1 && first["finished"] as? Int == 1 && first["alreadyInstalled"] as? Int == 0)
        nginx.waitForRequests(2)
        let served = nginx.bodyBytesSent(path: "/big.tar")
        #expect(served > 3 << 20 && first["bytesFetched"] as? Int == served, "summary \(first), nginx sent \(served)")
        #expect(first["sources"] as? [String] == ["http://\(nginx.baseURL.host()!):\(nginx.baseURL.port!)"], "\(first)")
        let seconds = try #require(first["seconds"] as? [String: Double])
        #expect(seconds["elapsed"]! > 0 && seconds["downloading"]! > 0 && seconds["downloading"]! <= seconds["elapsed"]!, "\(seconds)")

        let again = try summary(try CLI.run(home: home, ["--json", "fetch", manifest, "com.example.big"]))
        #expect(again["alreadyInstalled"] as? Int == 1 && again["bytesFetched"] as? Int == 0, "\(again)")
        #expect(again["bytesAlreadyInstalled"] as? Int == served, "\(again)")
    }
}

/// One delivery per product across processes: a second `packs fetch` of a product another `fetch` is delivering in the
/// same home joins it (both exit 0, the pack is served once), and takes it over if the first dies.
@Suite(.timeLimit(.minutes(3))) struct CrossProcessJoinTests {
    @Test func twoFetchesOfOneProductInOneHomeServeThePackOnce() throws {
        let site = try TestSite.random("join-cli-site", size: 6 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 2 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("join-cli-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let first = try CLI.start(home: home, ["fetch", manifest, "com.example.big"])
        defer { if first.isRunning { first.terminate() } }
        Thread.sleep(forTimeInterval: 0.5)
        let second = try CLI.run(home: home, ["fetch", manifest, "com.example.big"], timeout: 60)
        first.waitUntilExit()
        #expect(
            first.terminationStatus == 0 && second.status == 0,
            "first \(first.terminationStatus), second \(second.status): \(second.stderr)")
        nginx.waitForRequests(2)
        #expect(nginx.bodyBytesSent(path: "/big.tar") < 2 * (6 << 20), "the pack was served once, not twice: \(nginx.requests())")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "both transactions finished: \(status.stdout)")
        #expect(try CLI.run(home: home, ["verify"]).status == 0)
    }

    @Test func aFetchThatJoinedTakesTheDeliveryOverWhenTheFirstProcessDies() throws {
        let site = try TestSite.random("join-kill-site", size: 6 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("join-kill-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let first = try CLI.start(home: home, ["fetch", manifest, "com.example.big"])
        defer { if first.isRunning { first.terminate() } }
        Thread.sleep(forTimeInterval: 0.8)
        let second = try CLI.start(home: home, ["fetch", manifest, "com.example.big"])
        defer { if second.isRunning { second.terminate() } }
        Thread.sleep(forTimeInterval: 1.2)
        kill(first.processIdentifier, SIGKILL)
        first.waitUntilExit()
        let deadline = Date().addingTimeInterval(60)
        while second.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
        #expect(!second.isRunning && second.terminationStatus == 0, "the second fetch finished the delivery the first left")
        #expect(try CLI.run(home: home, ["verify"]).status == 0)
        let ranges = nginx.requests().filter { $0.uri.hasSuffix("/big.tar") }.map(\.range)
        #expect(ranges.count == 2 && ranges[1] != nil, "taken over from the bytes kept, with a range: \(ranges)")
    }
}

/// Priorities from the command line: a download raised with `packs priority` while a catalog runs one at a time
/// starts next, ahead of those added before it.
@Suite(.timeLimit(.minutes(3))) struct PriorityTests {
    @Test func aDownloadRaisedWhileACatalogRunsStartsNext() throws {
        let site = try Fixtures.temporaryDirectory("priority-site")
        for n in 0..<4 {
            let content = try Fixtures.temporaryDirectory("priority-content-\(n)")
            try FileManager.default.createDirectory(at: content.appending(path: "Contents"), withIntermediateDirectories: true)
            try Fixtures.randomFile(at: content.appending(path: "Contents/data.bin"), size: 2 << 20)  // 2 s each at the rate limit
            try PackWriter.write(
                folder: content, to: site.appending(path: "p\(n).tar"), format: .tar,
                contentInfo: (productIdentifier: "com.example.p\(n)", contentVersion: "1"))
        }
        try ManifestBuilder.write(folder: site)
        let nginx = try NginxServer(root: site, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("priority-home")
        let fetch = try CLI.start(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "--all", "--concurrency", "1"])
        defer { if fetch.isRunning { fetch.terminate() } }
        // The last product's download, once the catalog is recorded.
        var last: String?
        let deadline = Date().addingTimeInterval(20)
        while last == nil, Date() < deadline {
            let status = try CLI.run(home: home, ["--json", "status"])
            let object = try? JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
            let transactions = object?["transactions"] as? [[String: Any]] ?? []
            last = transactions.first { $0["productIdentifier"] as? String == "com.example.p3" }
                .flatMap { ($0["downloads"] as? [[String: Any]])?.first?["id"] as? String }
            if last == nil { Thread.sleep(forTimeInterval: 0.1) }
        }
        let id = try #require(last, "the catalog was not recorded in 20 s")
        let raise = try CLI.run(home: home, ["priority", id, "high"])
        #expect(raise.status == 0, "\(raise.stderr)")
        fetch.waitUntilExit()
        #expect(fetch.terminationStatus == 0)
        let order = nginx.requests().map(\.uri).filter { $0.hasSuffix(".tar") }
        #expect(order.count == 4 && order[1] == "/p3.tar", "p3, raised while p0 ran, was fetched second: \(order)")
        #expect(try CLI.run(home: home, ["priority", id, "sideways"]).status == 64, "an unknown priority is a usage error")
    }
}
