import Foundation
import Logging
import PackServer
import PackTestSupport
import Synchronization
import Testing

// Real clients (curl, aria2c) against the three servers the tests use: our own `packs serve`
// (PackServer), nginx as the reference, and the fault-injecting FaultServer.

// MARK: - Helpers

/// What curl saw: its exit code, the status, the headers of the last response and the body.
struct CurlResult {
    var exitCode: Int32
    var status: Int
    var headers: [String: String]
    var body: Data
    var stderr: String

    func header(_ name: String) -> String? { self.headers[name.lowercased()] }
}

/// Runs `curl -sS` on `url` (a string, so that `..` reaches curl as written) and collects the result.
func curl(_ url: String, _ arguments: [String] = [], timeout: TimeInterval = 30) async throws -> CurlResult {
    let folder = try Fixtures.temporaryDirectory("curl")
    defer { try? FileManager.default.removeItem(at: folder) }
    let headersFile = folder.appendingPathComponent("headers")
    let bodyFile = folder.appendingPathComponent("body")
    let result = try await Fixtures.runAsync(
        "/usr/bin/curl",
        ["-sS", "-D", headersFile.path, "-o", bodyFile.path, "-w", "%{http_code}"] + arguments + [url],
        timeout: timeout
    )
    let headerText = (try? String(contentsOf: headersFile, encoding: .utf8)) ?? ""
    // With several responses (e.g. 100 Continue) keep the last block.
    let lastBlock = headerText.components(separatedBy: "\r\n\r\n").last(where: { !$0.isEmpty }) ?? ""
    var headers: [String: String] = [:]
    for line in lastBlock.components(separatedBy: "\r\n").dropFirst() {
        guard let colon = line.firstIndex(of: ":") else { continue }
        headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    }
    return CurlResult(
        exitCode: result.status,
        status: Int(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0,
        headers: headers,
        body: (try? Data(contentsOf: bodyFile)) ?? Data(),
        stderr: result.stderr
    )
}

/// A folder with a random file of `size` bytes named `name`; returns the folder and the bytes.
func folderWithRandomFile(_ label: String, name: String = "pack.bin", size: Int) throws -> (root: URL, bytes: Data) {
    let root = try Fixtures.temporaryDirectory(label)
    let file = root.appendingPathComponent(name)
    try Fixtures.randomFile(at: file, size: size)
    return (root, try Data(contentsOf: file))
}

/// Log lines collected from a Logger, for checking what the server logs.
final class LogLines: Sendable {
    private let lines = Mutex<[String]>([])

    func append(_ line: String) { self.lines.withLock { $0.append(line) } }
    var all: [String] { self.lines.withLock { $0 } }

    /// The lines once `condition` holds for them, or after 10 seconds (the server logs a request
    /// when its body has been written, which may be a moment after the client saw the last byte).
    func waitFor(_ condition: ([String]) -> Bool) async -> [String] {
        for _ in 0..<1000 {
            let lines = self.all
            if condition(lines) { return lines }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return self.all
    }

    func logger() -> Logger {
        var logger = Logger(label: "PackServerTests") { _ in CollectingLogHandler(lines: self) }
        logger.logLevel = .info
        return logger
    }
}

struct CollectingLogHandler: LogHandler {
    let lines: LogLines
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?
    var logLevel: Logger.Level = .info

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        self.lines.append("\(event.level) \(event.message)")
    }
}

/// A raw HTTP client that reads only when asked to (to keep a response in flight).
final class SlowReader {
    private let fd: Int32

    init(port: Int, path: String) throws {
        self.fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(UInt32(0x7F00_0001).bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(self.fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        // Never wait more than 30 s for bytes (the test fails instead of hanging).
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        guard connected == 0, send(self.fd, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else {
            close(self.fd)
            throw FixtureError("Cannot connect to 127.0.0.1:\(port).")
        }
    }

    deinit {
        close(self.fd)
    }

    /// Reads until `count` bytes (head included), end-of-file, an error or a 30 s silence; returns the bytes read.
    func read(upTo count: Int) -> Int {
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        var total = 0
        while total < count {
            let received = recv(self.fd, &buffer, min(buffer.count, count - total), 0)
            if received < 0 && errno == EINTR { continue }
            if received <= 0 { break }
            total += received
        }
        return total
    }
}

// MARK: - PackServer (packs serve)

@Suite("PackServer with curl and aria2c", .timeLimit(.minutes(5)))
struct PackServerTests {
    static let size = 3 * 1024 * 1024

    /// Starts a server over a fresh folder with `pack.bin` (3 MiB) and `manifest.json`, runs `body`, stops.
    func withServer(
        token: String? = nil,
        _ body: (RunningPackServer, URL, Data, LogLines) async throws -> Void
    ) async throws {
        let (root, bytes) = try folderWithRandomFile("packserver", size: Self.size)
        try Data(#"{"products":[]}"#.utf8).write(to: root.appendingPathComponent("manifest.json"))
        let lines = LogLines()
        let server = try await PackServer.start(
            PackServerConfiguration(directory: root, port: 0, token: token),
            logger: lines.logger()
        )
        do {
            try await body(server, root, bytes, lines)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
        try? FileManager.default.removeItem(at: root)
    }

    @Test("full download, range download and curl -C - resume are byte-exact; one log line per request")
    func fullRangeAndResume() async throws {
        try await self.withServer { server, root, bytes, lines in
            #expect(server.port > 0)
            #expect(server.baseURL.absoluteString == "http://127.0.0.1:\(server.port)/")
            let url = server.baseURL.appendingPathComponent("pack.bin").absoluteString

            let full = try await curl(url)
            #expect(full.exitCode == 0)
            #expect(full.status == 200)
            #expect(full.body == bytes)
            #expect(full.header("Accept-Ranges") == "bytes")

            let ranged = try await curl(url, ["-r", "1000-"])
            #expect(ranged.status == 206)
            #expect(ranged.header("Content-Range") == "bytes 1000-\(Self.size - 1)/\(Self.size)")
            #expect(ranged.header("Content-Length") == "\(Self.size - 1000)")
            #expect(ranged.body == bytes.dropFirst(1000))

            // curl -C - continues a partial file from its size.
            let partial = root.appendingPathComponent("partial.bin")
            try bytes.prefix(1_234_567).write(to: partial)
            let resumed = try await Fixtures.runAsync("/usr/bin/curl", ["-sS", "-C", "-", "-o", partial.path, url])
            #expect(resumed.status == 0, "\(resumed.stderr)")
            #expect(try Fixtures.sha256Hex(of: partial) == Fixtures.sha256Hex(of: root.appendingPathComponent("pack.bin")))

            let manifest = try await curl(server.baseURL.appendingPathComponent("manifest.json").absoluteString)
            #expect(manifest.status == 200)
            #expect(manifest.header("Content-Type") == "application/json")

            let requestLines = await lines.waitFor { $0.filter { $0.contains("GET /") }.count >= 4 }
                .filter { $0.contains("GET /") }
            #expect(requestLines.count == 4, "\(lines.all)")
            #expect(requestLines.contains("info GET /pack.bin range=- 200 \(Self.size) bytes"), "\(requestLines)")
            #expect(requestLines.contains("info GET /pack.bin range=bytes=1000- 206 \(Self.size - 1000) bytes"), "\(requestLines)")
            #expect(
                requestLines.contains("info GET /pack.bin range=bytes=1234567- 206 \(Self.size - 1_234_567) bytes"),
                "\(requestLines)"
            )
        }
    }

    @Test("aria2c -x4 -s4 -k1M segmented download is byte-exact")
    func aria2Segmented() async throws {
        try await self.withServer { server, root, bytes, lines in
            let output = try Fixtures.temporaryDirectory("aria2")
            defer { try? FileManager.default.removeItem(at: output) }
            let result = try await Fixtures.runAsync(
                "/usr/bin/aria2c",
                [
                    "-x4", "-s4", "-k1M", "--file-allocation=none", "--allow-overwrite=true",
                    "--auto-file-renaming=false", "--console-log-level=warn", "--summary-interval=0",
                    "--max-tries=1", "-d", output.path, "-o", "pack.bin",
                    server.baseURL.appendingPathComponent("pack.bin").absoluteString,
                ],
                timeout: 60
            )
            #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)")
            #expect(try Data(contentsOf: output.appendingPathComponent("pack.bin")) == bytes)
            let logged = await lines.waitFor { $0.contains { $0.contains(" 206 ") } }
            #expect(logged.contains { $0.contains(" 206 ") }, "aria2c made no range request: \(logged)")
        }
    }

    @Test("strong ETag; If-Range matches only the exact tag or date; 416 past the end; suffix ranges; 304")
    func conditionalRequests() async throws {
        try await self.withServer { server, _, bytes, _ in
            let url = server.baseURL.appendingPathComponent("pack.bin").absoluteString
            let head = try await curl(url, ["-I"])
            #expect(head.status == 200)
            #expect(head.header("Content-Length") == "\(Self.size)")
            let etag = try #require(head.header("ETag"))
            let lastModified = try #require(head.header("Last-Modified"))
            #expect(etag.hasPrefix("\""), "the ETag must be strong for If-Range: \(etag)")

            let matching = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: \(etag)"])
            #expect(matching.status == 206)
            #expect(matching.body == bytes.dropFirst(100))
            #expect(matching.header("ETag") == etag)

            let byDate = try await curl(url, ["-H", "Range: bytes=100-199", "-H", "If-Range: \(lastModified)"])
            #expect(byDate.status == 206)
            #expect(byDate.body == bytes[100..<200])

            let wrong = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: \"not-the-tag\""])
            #expect(wrong.status == 200)
            #expect(wrong.body == bytes)

            let weak = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: W/\(etag)"])
            #expect(weak.status == 200, "a weak tag never matches If-Range")
            #expect(weak.body == bytes)

            let pastEnd = try await curl(url, ["-H", "Range: bytes=999999999-"])
            #expect(pastEnd.status == 416)
            #expect(pastEnd.header("Content-Range") == "bytes */\(Self.size)")
            #expect(pastEnd.body.isEmpty)

            // If-Range that does not match wins over an unsatisfiable Range: the whole file.
            let pastEndChanged = try await curl(url, ["-H", "Range: bytes=999999999-", "-H", "If-Range: \"old\""])
            #expect(pastEndChanged.status == 200)
            #expect(pastEndChanged.body.count == Self.size)

            let suffix = try await curl(url, ["-H", "Range: bytes=-500"])
            #expect(suffix.status == 206)
            #expect(suffix.header("Content-Range") == "bytes \(Self.size - 500)-\(Self.size - 1)/\(Self.size)")
            #expect(suffix.body == bytes.suffix(500))

            let several = try await curl(url, ["-H", "Range: bytes=0-1,5-6"])
            #expect(several.status == 200)
            #expect(several.body == bytes)

            let notModified = try await curl(url, ["-H", "If-None-Match: \(etag)"])
            #expect(notModified.status == 304)
            #expect(notModified.body.isEmpty)
        }
    }

    @Test("path traversal is refused and nothing outside the folder is served")
    func pathTraversal() async throws {
        try await self.withServer { server, root, _, _ in
            // A secret next to the served folder, and a symbolic link inside it pointing out.
            let secretText = "secret-\(UUID().uuidString)"
            let secret = root.deletingLastPathComponent().appendingPathComponent("\(root.lastPathComponent)-secret.txt")
            try Data(secretText.utf8).write(to: secret)
            defer { try? FileManager.default.removeItem(at: secret) }
            try FileManager.default.createSymbolicLink(
                at: root.appendingPathComponent("link.txt"),
                withDestinationURL: secret
            )
            let base = "http://127.0.0.1:\(server.port)"
            let attempts = [
                "/../\(secret.lastPathComponent)",
                "/%2e%2e/\(secret.lastPathComponent)",
                "/%2E%2E%2F\(secret.lastPathComponent)",
                "/..%2f\(secret.lastPathComponent)",
                "/../../../../etc/passwd",
                "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                "//etc/passwd",
                "/link.txt",
            ]
            for path in attempts {
                let result = try await curl(base + path, ["--path-as-is"])
                #expect((400..<500).contains(result.status), "\(path) → \(result.status)")
                let body = String(decoding: result.body, as: UTF8.self)
                #expect(!body.contains(secretText), "\(path) leaked the secret")
                #expect(!body.contains("root:"), "\(path) leaked /etc/passwd")
            }
        }
    }

    @Test("--token: 401 with WWW-Authenticate without the bearer token, 200 with it")
    func bearerToken() async throws {
        try await self.withServer(token: "s3cret-token") { server, _, bytes, lines in
            let url = server.baseURL.appendingPathComponent("pack.bin").absoluteString
            let missing = try await curl(url)
            #expect(missing.status == 401)
            #expect(missing.header("WWW-Authenticate")?.hasPrefix("Bearer") == true)

            let wrong = try await curl(url, ["-H", "Authorization: Bearer s3cret-tokeN"])
            #expect(wrong.status == 401)

            let right = try await curl(url, ["-H", "Authorization: Bearer s3cret-token"])
            #expect(right.status == 200)
            #expect(right.body == bytes)
            let logged = await lines.waitFor { $0.contains { $0.contains("GET /pack.bin range=- 401 ") } }
            #expect(logged.contains { $0.contains("GET /pack.bin range=- 401 ") }, "\(logged)")
        }
    }

    @Test("stop() ends a download in flight within the grace period and closes the port")
    func stopIsQuick() async throws {
        // Larger than what loopback socket buffers hold (tens of MiB), so the response is still in
        // flight when the server stops; sparse, so it costs nothing to make.
        let size = 256 * 1024 * 1024
        let root = try Fixtures.temporaryDirectory("packserver-stop")
        defer { try? FileManager.default.removeItem(at: root) }
        let file = root.appendingPathComponent("pack.bin")
        #expect(FileManager.default.createFile(atPath: file.path, contents: nil))
        let handle = try FileHandle(forWritingTo: file)
        try handle.truncate(atOffset: UInt64(size))
        try handle.close()

        let server = try await PackServer.start(
            PackServerConfiguration(directory: root, port: 0, gracefulShutdownTimeout: .milliseconds(300)),
            logger: LogLines().logger()
        )
        // A client that asks for the file and then stops reading: the server blocks on a full socket.
        let client = try SlowReader(port: server.port, path: "/pack.bin")
        #expect(client.read(upTo: 64 * 1024) == 64 * 1024)

        let clock = ContinuousClock()
        let elapsed = await clock.measure { await server.stop() }
        // Bounded by the grace period and cancellation, not by the download (minutes); loose for loaded machines.
        #expect(elapsed < .seconds(10), "stop() took \(elapsed)")
        // The connection is closed: what is buffered arrives, then end-of-file or a reset, well short of the file.
        let received = client.read(upTo: size)
        #expect(received < size - 64 * 1024)

        let refused = try await curl(server.baseURL.appendingPathComponent("pack.bin").absoluteString, ["--max-time", "5"])
        #expect(refused.exitCode == 7, "the port still answers: \(refused)")
    }

    @Test("run() reports the port through onReady and returns promptly when its task is cancelled")
    func runUntilCancelled() async throws {
        let (root, bytes) = try folderWithRandomFile("packserver-run", size: 64 * 1024)
        defer { try? FileManager.default.removeItem(at: root) }
        let (ports, portSink) = AsyncStream<Int>.makeStream()
        let serving = Task {
            try await PackServer.run(
                PackServerConfiguration(directory: root, port: 0),
                logger: LogLines().logger(),
                onReady: { port in portSink.yield(port) }
            )
        }
        var iterator = ports.makeAsyncIterator()
        let port = try #require(await iterator.next())
        let result = try await curl("http://127.0.0.1:\(port)/pack.bin")
        #expect(result.status == 200)
        #expect(result.body == bytes)

        serving.cancel()
        let clock = ContinuousClock()
        let elapsed = await clock.measure { _ = await serving.result }
        #expect(elapsed < .seconds(10), "run() took \(elapsed) to return after cancellation")
    }

    @Test("a folder that does not exist, or a port in use, is an error from start()")
    func startErrors() async throws {
        await #expect(throws: PackServerError.self) {
            _ = try await PackServer.start(
                PackServerConfiguration(directory: URL(fileURLWithPath: "/nonexistent/\(UUID().uuidString)"), port: 0),
                logger: LogLines().logger()
            )
        }
        let root = try Fixtures.temporaryDirectory("packserver-busy")
        defer { try? FileManager.default.removeItem(at: root) }
        let first = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        await #expect(throws: (any Error).self) {
            let second = try await PackServer.start(
                PackServerConfiguration(directory: root, port: first.port),
                logger: LogLines().logger()
            )
            await second.stop()
        }
        await first.stop()
    }
}

// MARK: - NginxServer

@Suite("NginxServer (reference server)", .timeLimit(.minutes(5)))
struct NginxServerTests {
    @Test("serves byte-exact, counts body bytes, logs ranges, honours If-Range")
    func servesAndCounts() async throws {
        let (root, bytes) = try folderWithRandomFile("nginx", name: "a.bin", size: 200 * 1024)
        defer { try? FileManager.default.removeItem(at: root) }
        let nginx = try NginxServer(root: root)
        defer { nginx.stop() }
        #expect(nginx.baseURL.absoluteString == "http://127.0.0.1:\(nginx.port)/")
        let url = nginx.baseURL.appendingPathComponent("a.bin").absoluteString

        let full = try await curl(url)
        #expect(full.status == 200)
        #expect(full.body == bytes)
        #expect(nginx.waitForRequests(1))
        #expect(nginx.bodyBytesSent(path: "/a.bin") == bytes.count)

        let ranged = try await curl(url, ["-r", "1000-1999"])
        #expect(ranged.status == 206)
        #expect(ranged.body == bytes[1000..<2000])
        #expect(nginx.waitForRequests(2))
        #expect(nginx.bodyBytesSent(path: "/a.bin") == bytes.count + 1000)
        #expect(nginx.bodyBytesSent(path: "/other.bin") == 0)
        #expect(nginx.bodyBytesSent() == bytes.count + 1000)

        let etag = try #require(full.header("ETag"))
        let matching = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: \(etag)"])
        #expect(matching.status == 206)
        let changed = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: \"other\""])
        #expect(changed.status == 200)
        let pastEnd = try await curl(url, ["-H", "Range: bytes=999999999-"])
        #expect(pastEnd.status == 416)
        #expect(pastEnd.header("Content-Range") == "bytes */\(bytes.count)")

        #expect(nginx.waitForRequests(5))
        let requests = nginx.requests()
        #expect(requests.map(\.uri) == Array(repeating: "/a.bin", count: 5))
        #expect(requests.map(\.status) == [200, 206, 206, 200, 416])
        #expect(requests[0].range == nil)
        #expect(requests[1].range == "bytes=1000-1999")
    }

    @Test("limitRate paces the body (200 KiB at 100 KiB/s takes over a second)")
    func limitRate() async throws {
        let (root, bytes) = try folderWithRandomFile("nginx-limit", name: "a.bin", size: 200 * 1024)
        defer { try? FileManager.default.removeItem(at: root) }
        let nginx = try NginxServer(root: root, limitRate: 100 * 1024)
        defer { nginx.stop() }
        let clock = ContinuousClock()
        var result: CurlResult?
        let elapsed = try await clock.measure {
            result = try await curl(nginx.baseURL.appendingPathComponent("a.bin").absoluteString)
        }
        #expect(result?.body == bytes)
        #expect(elapsed >= .seconds(1), "took only \(elapsed)")
    }
}

// MARK: - FaultServer

@Suite("FaultServer faults seen by curl", .timeLimit(.minutes(5)))
struct FaultServerTests {
    static let size = 64 * 1024

    func withServer(_ body: (FaultServer, Data) async throws -> Void) async throws {
        let (root, bytes) = try folderWithRandomFile("faults", name: "f.bin", size: Self.size)
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try FaultServer(root: root)
        defer { server.stop() }
        try await body(server, bytes)
    }

    @Test("none: ranges, If-Range, 416, strong ETag, byte counting")
    func correctServer() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin").absoluteString
            #expect(url == "http://127.0.0.1:\(server.port)/f/none/f.bin")
            let full = try await curl(url)
            #expect(full.status == 200)
            #expect(full.body == bytes)
            let etag = try #require(full.header("ETag"))
            #expect(etag.hasPrefix("\""))
            #expect(full.header("Last-Modified") != nil)

            let ranged = try await curl(url, ["-r", "100-199"])
            #expect(ranged.status == 206)
            #expect(ranged.header("Content-Range") == "bytes 100-199/\(Self.size)")
            #expect(ranged.body == bytes[100..<200])

            let open = try await curl(url, ["-H", "Range: bytes=1000-", "-H", "If-Range: \(etag)"])
            #expect(open.status == 206)
            #expect(open.body == bytes.dropFirst(1000))

            let changed = try await curl(url, ["-H", "Range: bytes=1000-", "-H", "If-Range: \"other\""])
            #expect(changed.status == 200)
            #expect(changed.body == bytes)

            let pastEnd = try await curl(url, ["-H", "Range: bytes=\(Self.size)-"])
            #expect(pastEnd.status == 416)
            #expect(pastEnd.header("Content-Range") == "bytes */\(Self.size)")

            let bare = try await curl(server.baseURL.appendingPathComponent("f.bin").absoluteString)
            #expect(bare.body == bytes)

            let missing = try await curl(server.url("nothing.bin").absoluteString)
            #expect(missing.status == 404)

            #expect(server.bodyBytesSent("f.bin") == 3 * Self.size + 100 + (Self.size - 1000))
            #expect(server.bodyBytesSent("nothing.bin") == 0)
            let requests = server.requests()
            #expect(requests.map(\.status) == [200, 206, 206, 200, 416, 200, 404])
            #expect(requests[1].range == "bytes=100-199")
            #expect(requests[2].ifRange == etag)
            #expect(requests.allSatisfy { $0.method == "GET" && $0.fault == .none })
        }
    }

    @Test("ignoreRange answers a range request with 200 and the whole body")
    func ignoreRange() async throws {
        try await self.withServer { server, bytes in
            let result = try await curl(server.url("f.bin", fault: .ignoreRange).absoluteString, ["-r", "100-"])
            #expect(result.status == 200)
            #expect(result.body == bytes)
            #expect(server.requests().first?.fault == .ignoreRange)
        }
    }

    @Test("changeETag gives a new ETag each time, so If-Range never matches")
    func changeETag() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .changeETag).absoluteString
            let first = try await curl(url, ["-I"])
            let second = try await curl(url, ["-I"])
            let etag = try #require(first.header("ETag"))
            #expect(etag != second.header("ETag"))
            let resumed = try await curl(url, ["-H", "Range: bytes=100-", "-H", "If-Range: \(etag)"])
            #expect(resumed.status == 200)
            #expect(resumed.body == bytes)
        }
    }

    @Test("resetAfter: curl fails after exactly N body bytes, every time")
    func resetAfter() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .resetAfter(bytes: 1000)).absoluteString
            for _ in 0..<2 {
                let result = try await curl(url)
                #expect(result.exitCode != 0, "curl succeeded: \(result.stderr)")
                #expect(result.body == bytes.prefix(1000))
            }
            #expect(server.bodyBytesSent("f.bin") == 2000)
        }
    }

    @Test("resetOnce: the first request resets, the next one is whole")
    func resetOnce() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .resetOnce(afterBytes: 5000)).absoluteString
            let first = try await curl(url)
            #expect(first.exitCode != 0)
            #expect(first.body == bytes.prefix(5000))
            let second = try await curl(url, ["-r", "5000-"])
            #expect(second.exitCode == 0)
            #expect(second.status == 206)
            #expect(second.body == bytes.dropFirst(5000))
            #expect(server.bodyBytesSent() == Self.size)
        }
    }

    @Test("status(503, times: 1, retryAfter: 1): 503 with Retry-After, then 200")
    func statusThenSuccess() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .status(503, times: 1, retryAfter: 1)).absoluteString
            #expect(url.hasSuffix("/f/status/503/1/1/f.bin"))
            let first = try await curl(url)
            #expect(first.status == 503)
            #expect(first.header("Retry-After") == "1")
            #expect(first.body.isEmpty)
            let second = try await curl(url)
            #expect(second.status == 200)
            #expect(second.body == bytes)

            let notFoundTwice = server.url("f.bin", fault: .status(404, times: 2, retryAfter: nil)).absoluteString
            #expect(try await curl(notFoundTwice).status == 404)
            #expect(try await curl(notFoundTwice).header("Retry-After") == nil)
            #expect(try await curl(notFoundTwice).status == 200)
        }
    }

    @Test("truncateOnce: curl error 18 after N bytes, then a whole download")
    func truncateOnce() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .truncateOnce(afterBytes: 1000)).absoluteString
            let first = try await curl(url)
            #expect(first.exitCode == 18, "\(first.stderr)")
            #expect(first.body == bytes.prefix(1000))
            let second = try await curl(url)
            #expect(second.exitCode == 0)
            #expect(second.body == bytes)
        }
    }

    @Test("stallOnce: curl --max-time 3 times out after N bytes, then a whole download")
    func stallOnce() async throws {
        try await self.withServer { server, bytes in
            let url = server.url("f.bin", fault: .stallOnce(afterBytes: 1000)).absoluteString
            let first = try await curl(url, ["--max-time", "3"])
            #expect(first.exitCode == 28, "\(first.stderr)")
            #expect(first.body == bytes.prefix(1000))
            let second = try await curl(url)
            #expect(second.exitCode == 0)
            #expect(second.body == bytes)
        }
    }

    @Test("stop() closes a stalled connection")
    func stopClosesStalled() async throws {
        let (root, _) = try folderWithRandomFile("faults-stop", name: "f.bin", size: Self.size)
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try FaultServer(root: root)
        let url = server.url("f.bin", fault: .stallOnce(afterBytes: 1000)).absoluteString
        let stalled = Task { try await curl(url, ["--max-time", "60"]) }
        let deadline = Date().addingTimeInterval(30)
        while server.bodyBytesSent() < 1000, Date() < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        try #require(server.bodyBytesSent() == 1000, "curl did not get the first 1000 bytes in 30 s")
        let clock = ContinuousClock()
        let elapsed = clock.measure { server.stop() }
        let result = try await stalled.value
        #expect(elapsed < .seconds(5))
        #expect(result.exitCode == 18, "\(result.stderr)")
        #expect(result.body.count == 1000)
    }

    @Test("slow paces the body")
    func slow() async throws {
        try await self.withServer { server, bytes in
            let clock = ContinuousClock()
            var result: CurlResult?
            let elapsed = try await clock.measure {
                result = try await curl(server.url("f.bin", fault: .slow(bytesPerSecond: 64 * 1024)).absoluteString)
            }
            #expect(result?.body == bytes)
            #expect(elapsed >= .milliseconds(800), "took only \(elapsed)")
        }
    }
}
