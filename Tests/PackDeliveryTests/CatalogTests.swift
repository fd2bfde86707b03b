import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Whole catalogs in one process, descriptors bounded by the work that runs, and no download that
/// can stall silently: every internal failure ends with a named error and a documented exit code.
/// (The 1,000- and 10,000-pack runs are in the benchmark; these are their short versions.)
@Suite(.timeLimit(.minutes(5))) struct CatalogTests {
    /// A site of `count` tiny packs (a ContentInfo.plist and one small file each), with its manifest.
    static func catalog(_ label: String, count: Int) throws -> URL {
        let folder = try Fixtures.temporaryDirectory(label)
        let script = """
            import tarfile, io, hashlib, json, os, sys
            n, out = int(sys.argv[1]), sys.argv[2]
            products = []
            for i in range(n):
                pid = "com.example.p%05d" % i
                plist = ('<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>ContentVersion</key><string>1.0</string>'
                         '<key>IAPProductIdentifier</key><string>%s</string></dict></plist>' % pid).encode()
                data = ("pack %d\\n" % i).encode() * 20
                buf = io.BytesIO()
                with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
                    for name, body in [("ContentInfo.plist", plist), ("Contents/data.txt", data)]:
                        ti = tarfile.TarInfo(name); ti.size = len(body); ti.mode = 0o644; t.addfile(ti, io.BytesIO(body))
                raw = buf.getvalue()
                open(os.path.join(out, "p%05d.tar" % i), "wb").write(raw)
                products.append({"productIdentifier": pid, "contents": [{"contentIdentifier": pid, "contentVersion": "1.0",
                    "url": "p%05d.tar" % i, "contentLength": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                    "unpackedLength": len(plist) + len(data)}]})
            json.dump({"products": products}, open(os.path.join(out, "manifest.json"), "w"))
            """
        let result = try Fixtures.run("python3", ["-c", script, "\(count)", folder.path])
        guard result.status == 0 else { throw FixtureError("making the catalog failed: \(result.stderr)") }
        return folder
    }

    /// Runs `packs --home HOME ARGS…` in a shell with `ulimit -n limit` (and `input` on standard input).
    static func packs(home: URL, limit: Int? = nil, input: String? = nil, _ arguments: [String], timeout: TimeInterval = 120) throws
        -> CLI.Result
    {
        let quoted = ([CLI.binary, "--home", home.path] + arguments).map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }
            .joined(separator: " ")
        var command = (limit.map { "ulimit -n \($0) && " } ?? "") + "exec " + quoted
        if let input { command = "printf '%s' '\(input.replacingOccurrences(of: "'", with: "'\\''"))' | (\(command))" }
        let result = try Fixtures.run("/bin/bash", ["-c", command], timeout: timeout)
        return CLI.Result(status: result.status, stdout: result.stdout, stderr: result.stderr)
    }

    @Test func aWholeCatalogInstallsUnderASixtyFourDescriptorLimit() throws {
        let site = try Self.catalog("catalog-300", count: 300)
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("catalog-300-home")
        let fetch = try Self.packs(
            home: home, limit: 64, ["--quiet", "fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "--all"])
        #expect(fetch.status == 0, "exit 0 under ulimit -n 64: \(fetch.stderr)")
        let content = try CLI.run(home: home, ["content"])
        #expect(content.stdout.split(separator: "\n").count == 300, "all 300 installed")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#), "all finished")
        #expect(leftoversAfterCleanup(home).isEmpty, "no partial or staging left: \(leftovers(home).prefix(3))")
    }

    /// A catalog's transactions are all recorded before an event stream is read, so the stream buffers an event for
    /// each (`packs fetch --all` of 10,000 packs: 10,000). Each takes a pointer there, not the size of a download.
    @Test func aBufferedEventTakesAPointerNotADownload() {
        #expect(
            MemoryLayout<DownloadQueueEvent>.stride <= 16,
            "an event takes \(MemoryLayout<DownloadQueueEvent>.stride) bytes in a stream's buffer (a download: \(MemoryLayout<Download>.stride))"
        )
    }

    /// A server that compresses JSON (nginx's `gzip_types application/json`) sends a catalog's manifest compressed,
    /// since the client offers the encodings it decodes; the packs still arrive byte for byte as they are.
    @Test func aCatalogsManifestArrivesCompressedFromAServerThatCompressesJSON() throws {
        let site = try Self.catalog("catalog-gzip", count: 300)
        let nginx = try NginxServer(root: site) { port in
            """
            server {
                listen 127.0.0.1:\(port);
                root "\(site.standardizedFileURL.path)";
                gzip on;
                gzip_types application/json;
                gzip_min_length 1024;
            }
            """
        }
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("catalog-gzip-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let fetch = try CLI.run(home: home, ["--quiet", "fetch", manifest, "com.example.p00001", "com.example.p00002"])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let length = try #require(
            try FileManager.default.attributesOfItem(atPath: site.appending(path: "manifest.json").path)[.size] as? Int)
        let sent = nginx.bodyBytesSent(path: "/manifest.json")
        #expect(sent > 0 && sent * 4 < length, "the manifest's \(length) bytes came as \(sent)")
        #expect(try CLI.run(home: home, ["verify", "com.example.p00001"]).status == 0)
        #expect(try CLI.run(home: home, ["content"]).stdout.split(separator: "\n").count == 2)
    }

    @Test func productsComeFromAFileOrStandardInput() throws {
        let site = try Self.catalog("catalog-from", count: 6)
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("catalog-from-home")
        let list = site.appending(path: "wanted.txt")
        try Data("# purchases\ncom.example.p00001\n\n  com.example.p00002  \ncom.example.p00001\n".utf8).write(to: list)
        #expect(try CLI.run(home: home, ["--quiet", "fetch", manifest, "--products-from", list.path]).status == 0)
        let fromStdin = try Self.packs(
            home: home, input: "com.example.p00003\ncom.example.p00004\n", ["--quiet", "fetch", manifest, "--products-from", "-"])
        #expect(fromStdin.status == 0, "\(fromStdin.stderr)")
        let installed = try CLI.run(home: home, ["content"]).stdout
        #expect(
            ["p00001", "p00002", "p00003", "p00004"].allSatisfy { installed.contains("com.example.\($0)") }
                && !installed.contains("p00005"), "\(installed)")
        let unknown = try Self.packs(home: home, input: "com.example.nope\n", ["fetch", manifest, "--products-from", "-"])
        #expect(unknown.status == 65 && unknown.stderr.contains("com.example.nope"), "\(unknown.stderr)")
        #expect(try CLI.run(home: home, ["fetch", manifest]).status == 64, "no products, no --all: usage")
    }

    @Test func runningOutOfDescriptorsEndsWithANamedErrorAndNeverStalls() throws {
        let site = try Self.catalog("catalog-fd", count: 8)
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        var named = 0
        var installed = 0
        for limit in stride(from: 10, through: 40, by: 2) {
            let home = try Fixtures.temporaryDirectory("catalog-fd-\(limit)")
            let started = Date()
            let fetch = try Self.packs(
                home: home, limit: limit,
                ["--quiet", "fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "--all", "--retries", "1"], timeout: 60)
            #expect(Date().timeIntervalSince(started) < 50, "ulimit -n \(limit): ended, not stalled")
            switch fetch.status {
            case 0: installed += 1
            case 74:
                named += 1
                #expect(
                    fetch.stderr.contains("file descriptors") || fetch.stderr.contains("Too many open files"),
                    "ulimit -n \(limit): names the cause: \(fetch.stderr)")
                #expect(fetch.stderr.split(separator: "\n").count == 1, "one line: \(fetch.stderr)")
            default:
                Issue.record("ulimit -n \(limit): exit \(fetch.status), not 0 or 74: \(fetch.stderr)")
            }
        }
        #expect(named > 0, "some limit was too low, and said so")
        #expect(installed > 0, "a limit a little higher suffices: descriptors do not grow with the queue")
    }
}

/// A writer that blocks the first write of at least `bytes` bytes for `seconds` (a disk that hangs once).
final class HangingWriter: FileWriting {
    private let hung = Atomic<Bool>(false)
    let seconds: Double
    let threshold: Int

    init(seconds: Double, atLeast threshold: Int) {
        self.seconds = seconds
        self.threshold = threshold
    }

    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        if count >= self.threshold, !self.hung.exchange(true, ordering: .relaxed) {
            usleep(useconds_t(self.seconds * 1_000_000))
        }
        return Glibc.pwrite(fd, buffer, count, off_t(offset))
    }
}

/// Internal failures of the queue: each ends the download with an error that names it, or
/// is retried by the watchdog; none leaves a download active forever.
@Suite(.timeLimit(.minutes(5))) struct StallTests {
    static func setup(_ label: String, size: Int = 2 << 20, fault: Fault = .none, configuration: DownloadQueue.Configuration)
        throws -> (server: FaultServer, queue: DownloadQueue, manifest: LoadedManifest, site: TestSite, home: URL)
    {
        let site = try TestSite.random(label, size: size)
        let server = try FaultServer(root: site.folder)
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: fault).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory(label + "-home")
        return (server, try DownloadQueue(home: Home(folder: home), configuration: configuration), loaded, site, home)
    }

    @Test func theWatchdogRetriesADownloadWhoseDiskHungThenItFinishes() async throws {
        let writer = HangingWriter(seconds: 6, atLeast: 64 << 10)
        let (server, queue, manifest, site, _) = try Self.setup(
            "watchdog",
            configuration: .init(
                transfer: TransferOptions(stallTimeout: 30), resumeWhenSpaceReturns: false, maxRetryDelay: 0.2, watchdogTimeout: 2,
                writer: writer))
        defer {
            queue.close()
            server.stop()
        }
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let stalled = try #require(await waitFor(queue, id, timeout: 20) { $0.error?.code == .stalled }, "the watchdog said so")
        #expect(stalled.state == .active && stalled.error?.message.contains("no progress") == true)
        let done = try #require(await waitFor(queue, id, timeout: 40) { !$0.state.isRunning })
        #expect(done.state == .finished, "\(String(describing: done.error))")
        #expect(try Fixtures.sha256Hex(of: try #require(done.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }

    @Test func aDatabaseLockedTooLongEndsTheDownloadNamingIt() async throws {
        let (server, queue, manifest, _, home) = try Self.setup(
            "db-busy", fault: .slow(bytesPerSecond: 400_000),
            configuration: .init(
                resumeWhenSpaceReturns: false, maxRetryDelay: 0.2, databaseBusyTimeout: 1))
        defer {
            queue.close()
            server.stop()
        }
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        _ = await waitFor(queue, id) { $0.bytesReceived > 0 }
        // Another process takes the write lock and keeps it.
        let holder = try WatchedProcess(
            "/usr/bin/python3",
            [
                "-c",
                """
                import sqlite3, sys, time
                db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
                db.execute("BEGIN IMMEDIATE"); print("locked", file=sys.stderr, flush=True); time.sleep(30)
                """, home.appending(path: "state.sqlite").path,
            ])
        defer { holder.kill() }
        #expect(holder.waitForStderr("locked", timeout: 10))
        try queue.pause([id])
        let ended = try #require(await waitFor(queue, id, timeout: 30) { $0.state == .failed || $0.state == .paused && $0.error != nil })
        #expect(ended.error?.code == .databaseBusy, "names the locked database: \(String(describing: ended.error))")
    }

    @Test func aPartialFileTruncatedUnderTheQueuesFeetIsNamedAndFetchedAgain() async throws {
        let (server, queue, manifest, site, home) = try Self.setup(
            "truncated-under", fault: .slow(bytesPerSecond: 1_000_000),
            configuration: .init(
                resumeWhenSpaceReturns: false, maxRetryDelay: 0.2))
        defer {
            queue.close()
            server.stop()
        }
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        _ = await waitFor(queue, id) { $0.bytesReceived > 1 << 20 }
        let partial = try #require(partialArchive(home))
        #expect(truncate(partial.path, 100) == 0)
        let done = try #require(await waitFor(queue, id, timeout: 60) { !$0.state.isRunning })
        #expect(done.state == .finished, "fetched again rather than stalled: \(String(describing: done.error))")
        #expect(try Fixtures.sha256Hex(of: try #require(done.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }
}
