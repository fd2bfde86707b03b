import Foundation
import Logging
import PackServer
import PackTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// `packs serve` under attack, through the real server — the `packs` binary
// spawned (under a low descriptor limit where that is the point) or PackServer started in-process on
// a socket — and real clients (curl, raw sockets).

/// The response head's first line and the value of `name`, from raw response bytes.
private func statusLine(_ bytes: [UInt8]) -> String {
    String(decoding: bytes.prefix { $0 != 13 }, as: UTF8.self)
}

private func header(_ name: String, in bytes: [UInt8]) -> String? {
    let text = String(decoding: bytes, as: UTF8.self)
    let head = text.components(separatedBy: "\r\n\r\n").first ?? ""
    for line in head.components(separatedBy: "\r\n").dropFirst() {
        let parts = line.split(separator: ":", maxSplits: 1)
        if parts.count == 2, parts[0].lowercased() == name.lowercased() {
            return parts[1].trimmingCharacters(in: .whitespaces)
        }
    }
    return nil
}

/// Waits up to `timeout` seconds for `condition`; returns whether it held.
private func eventually(timeout: TimeInterval, _ condition: () -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return condition()
}

/// Runs blocking socket work on a thread of its own (not one of Swift's two cooperative threads,
/// which the in-process server needs).
private func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// A folder with `pack.bin` (64 KiB) and a manifest.
private func packFolder(_ label: String) throws -> URL {
    let root = try Fixtures.temporaryDirectory(label)
    try Fixtures.randomFile(at: root.appendingPathComponent("pack.bin"), size: 64 * 1024)
    try Data(#"{"products":[]}"#.utf8).write(to: root.appendingPathComponent("manifest.json"))
    return root
}

/// Creates a folder from raw bytes (no normalization on the way).
private func makeDirectory(bytes: [UInt8]) throws {
    let made = (bytes + [0]).withUnsafeBufferPointer { buffer in
        buffer.withMemoryRebound(to: CChar.self) { mkdir($0.baseAddress!, 0o755) }
    }
    guard made == 0 else { throw FixtureError("mkdir failed: \(String(cString: strerror(errno)))") }
}

@Suite("packs serve under attack", .serialized, .timeLimit(.minutes(1)))
struct ServerAttackTests {
    // MARK: 18. A header too large: 431, and the connection closed fully

    @Test("a 1 MiB header gets 431; 60 of them under a 64-descriptor limit leak nothing and leave room for curl")
    func headerOverflow() async throws {
        let root = try packFolder("attack-431")
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--request-timeout", "2"], descriptorLimit: 64)
        defer { server.stop() }
        let baseline = server.openDescriptors
        let port = server.port
        let big =
            Array("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".utf8) + [UInt8](repeating: UInt8(ascii: "a"), count: 1 << 20)
            + Array("\r\n\r\n".utf8)

        // The attackers keep their sockets open after the answer, as the issue's client did: the
        // server must close its side fully on its own.
        let results = try await onThread { () -> [(status: String, closed: Bool, sent: Int)] in
            var held: [RawConnection] = []
            var results: [(String, Bool, Int)] = []
            for _ in 0..<60 {
                let connection = try RawConnection(port: port, timeout: 5)
                let sent = connection.send(big)
                let (bytes, closed) = connection.readToEnd()
                results.append((statusLine(bytes), closed, sent))
                held.append(connection)
                // One wrong answer says enough (and each would wait for the socket timeouts).
                if !closed || sent < big.count { break }
            }
            return results
        }
        #expect(results.allSatisfy { $0.status == "HTTP/1.1 431 Request Header Fields Too Large" }, "\(results.map(\.status))")
        #expect(results.allSatisfy { $0.closed }, "the server did not close its side")
        #expect(results.allSatisfy { $0.sent == big.count }, "the server stopped reading: a client with unsent data stays stuck")

        let curlResult = try await curl(server.baseURL.appendingPathComponent("pack.bin").absoluteString, ["--max-time", "5"])
        #expect(curlResult.status == 200, "no room left for a real client: \(curlResult.stderr)\n\(server.log)")
        let released = await eventually(timeout: 5) { server.openDescriptors <= baseline + 2 }
        #expect(released, "descriptors: \(server.openDescriptors), at the start \(baseline)")
        #expect(server.isRunning)
    }

    // MARK: 19. Timeouts and a connection limit that keeps room

    @Test("slow headers are closed after the request timeout, and 100 of them under a 64-descriptor limit do not lock curl out")
    func slowHeaders() async throws {
        let root = try packFolder("attack-slow")
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--request-timeout", "1.5"], descriptorLimit: 64)
        defer { server.stop() }
        let port = server.port
        let slow = try await onThread { () -> [RawConnection] in
            try (0..<100).map { _ in
                let connection = try RawConnection(port: port, timeout: 6)
                connection.send("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                return connection
            }
        }
        let served = try await curl(server.baseURL.appendingPathComponent("pack.bin").absoluteString, ["--max-time", "3"])
        #expect(served.status == 200, "a real client was locked out: \(served.stderr)")

        // Every slow connection is closed by the server: the oldest to make room, the rest by the timeout.
        let allClosed = await eventually(timeout: 6) { slow.allSatisfy(\.isClosedByPeer) }
        #expect(allClosed, "\(slow.filter { !$0.isClosedByPeer }.count) slow connections still open after 6 s")
        #expect(server.isRunning)
    }

    @Test("a client that stops reading is closed after the send timeout")
    func sendTimeout() async throws {
        let root = try Fixtures.temporaryDirectory("attack-send")
        defer { try? FileManager.default.removeItem(at: root) }
        // Larger than the loopback socket buffers hold; sparse, so it costs nothing.
        let size = 256 * 1024 * 1024
        let file = root.appendingPathComponent("big.bin")
        #expect(FileManager.default.createFile(atPath: file.path, contents: nil))
        try FileHandle(forWritingTo: file).truncate(atOffset: UInt64(size))
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--send-timeout", "1"])
        defer { server.stop() }
        let port = server.port
        let received = try await onThread { () -> (Int, Bool) in
            let connection = try RawConnection(port: port, timeout: 10)
            connection.send("GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sleep(3)
            let (bytes, closed) = connection.readToEnd(limit: size + 4096)
            return (bytes.count, closed)
        }
        #expect(received.1, "the connection was not closed")
        #expect(received.0 < size, "the whole file arrived: the server waited for the stalled client")
    }

    @Test("a keep-alive connection is closed after the idle timeout")
    func idleTimeout() async throws {
        let root = try packFolder("attack-idle")
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--idle-timeout", "1"])
        defer { server.stop() }
        let port = server.port
        let (bytes, closed, elapsed) = try await onThread { () -> ([UInt8], Bool, TimeInterval) in
            let connection = try RawConnection(port: port, timeout: 8)
            connection.send("GET /manifest.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            let start = Date()
            let (bytes, closed) = connection.readToEnd()
            return (bytes, closed, Date().timeIntervalSince(start))
        }
        #expect(statusLine(bytes) == "HTTP/1.1 200 OK")
        #expect(closed, "still open after 8 s")
        #expect(elapsed < 5, "closed only after \(elapsed) s")
    }

    // MARK: 20. Never outside the folder

    @Test("a symbolic link into a sibling folder whose name is the root's in NFD is refused (bytes, not String.hasPrefix)")
    func unicodeSibling() async throws {
        let base = try Fixtures.temporaryDirectory("attack-nfc")
        defer { try? FileManager.default.removeItem(at: base) }
        let nfc = Array(base.path.utf8) + Array("/caf\u{E9}".utf8)  // é as one code point
        let nfd = Array(base.path.utf8) + Array("/cafe\u{301}".utf8)  // e + combining acute
        #expect(nfc != nfd)
        try makeDirectory(bytes: nfc)
        try makeDirectory(bytes: nfd)
        let root = URL(fileURLWithPath: String(decoding: nfc, as: UTF8.self))
        let secretText = "secret-\(UUID().uuidString)"
        let secretPath = String(decoding: nfd, as: UTF8.self) + "/secret.txt"
        #expect(FileManager.default.createFile(atPath: secretPath, contents: Data(secretText.utf8)))
        #expect(symlink(secretPath, root.path + "/link.txt") == 0)
        try Data("fine".utf8).write(to: root.appendingPathComponent("ok.txt"))

        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        let link = try await curl("http://127.0.0.1:\(server.port)/link.txt")
        let ok = try await curl("http://127.0.0.1:\(server.port)/ok.txt")
        await server.stop()
        #expect(link.status == 404)
        #expect(!String(decoding: link.body, as: UTF8.self).contains(secretText), "the NFD sibling's file was served")
        #expect(ok.status == 200)
    }

    @Test("a link whose real path is longer than PATH_MAX is refused, not served unchecked")
    func unresolvablePath() async throws {
        let base = try Fixtures.temporaryDirectory("attack-long")
        defer { Self.removeDeep(base) }
        let root = base.appendingPathComponent("root")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        let secretText = "secret-\(UUID().uuidString)"
        let hop = try Self.makeDeepSecret(under: base.appendingPathComponent("outside"), text: secretText)
        #expect(symlink(hop, root.path + "/link.txt") == 0)
        // The kernel follows it (each link is short); realpath cannot (the result is > 4096 bytes).
        let direct = FileManager.default.contents(atPath: root.path + "/link.txt")
        #expect(direct.map { String(decoding: $0, as: UTF8.self) } == secretText, "the fixture is wrong: the kernel cannot follow the link")
        #expect(realpath(root.path + "/link.txt", nil) == nil)

        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        let result = try await curl("http://127.0.0.1:\(server.port)/link.txt")
        await server.stop()
        #expect(result.status == 404)
        #expect(!String(decoding: result.body, as: UTF8.self).contains(secretText), "served a file it could not check")
    }

    @Test("dotfiles and dot-folders are not served unless asked (--serve-dotfiles)")
    func dotfiles() async throws {
        let root = try packFolder("attack-dot")
        defer { try? FileManager.default.removeItem(at: root) }
        try Data("SECRET=1".utf8).write(to: root.appendingPathComponent(".env"))
        try FileManager.default.createDirectory(at: root.appendingPathComponent(".git"), withIntermediateDirectories: true)
        try Data("[core]".utf8).write(to: root.appendingPathComponent(".git/config"))
        #expect(symlink(root.path + "/.env", root.path + "/env.txt") == 0)

        let server = try PackServeProcess(binary: CLI.binary, [root.path])
        for path in ["/.env", "/.git/config", "/%2Eenv", "/.git/", "/env.txt"] {
            let result = try await curl(server.baseURL.absoluteString.dropLast() + path, ["--path-as-is"])
            #expect(result.status == 404, "\(path) → \(result.status)")
        }
        #expect(try await curl(server.baseURL.appendingPathComponent("pack.bin").absoluteString).status == 200)
        server.stop()

        let allowing = try PackServeProcess(binary: CLI.binary, [root.path, "--serve-dotfiles"])
        defer { allowing.stop() }
        let env = try await curl(allowing.baseURL.absoluteString + ".env")
        #expect(env.status == 200)
        #expect(env.body == Data("SECRET=1".utf8))
    }

    // MARK: 21. Token out of ps, Host, protocol-relative redirects

    @Test("--token-file and PACKS_TOKEN: the token works and is not on the command line")
    func tokenFromFileOrEnvironment() async throws {
        let root = try packFolder("attack-token")
        defer { try? FileManager.default.removeItem(at: root) }
        let token = "tok-\(UUID().uuidString)"
        let tokenFile = root.deletingLastPathComponent().appendingPathComponent("\(root.lastPathComponent).token")
        try Data((token + "\n").utf8).write(to: tokenFile)
        defer { try? FileManager.default.removeItem(at: tokenFile) }

        for (arguments, environment) in [([root.path, "--token-file", tokenFile.path], [:]), ([root.path], ["PACKS_TOKEN": token])] {
            let server = try PackServeProcess(binary: CLI.binary, arguments, environment: environment)
            defer { server.stop() }
            let commandLine = (try? String(contentsOfFile: "/proc/\(server.pid)/cmdline", encoding: .utf8)) ?? ""
            #expect(!commandLine.contains(token), "the token shows in ps")
            let url = server.baseURL.appendingPathComponent("pack.bin").absoluteString
            #expect(try await curl(url).status == 401)
            #expect(try await curl(url, ["-H", "Authorization: Bearer \(token)"]).status == 200)
            #expect(try await curl(url, ["-H", "Authorization: bearer  \(token)"]).status == 200)
            #expect(!server.log.contains(token), "the token is in the log")
        }
    }

    @Test("no Host or two Host headers get 400; one gets 200")
    func hostHeaders() async throws {
        let root = try packFolder("attack-host")
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        let port = server.port
        let requests = [
            ("GET /pack.bin HTTP/1.1\r\nConnection: close\r\n\r\n", "HTTP/1.1 400 Bad Request"),
            ("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n", "HTTP/1.1 400 Bad Request"),
            ("GET /pack.bin HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n", "HTTP/1.1 400 Bad Request"),
            ("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", "HTTP/1.1 200 OK"),
        ]
        let lines = try await onThread {
            try requests.map { request, _ in
                let connection = try RawConnection(port: port)
                connection.send(request)
                return statusLine(connection.readToEnd().bytes)
            }
        }
        await server.stop()
        #expect(lines == requests.map(\.1))
    }

    @Test("//folder redirects to /folder/, never to a protocol-relative //folder/")
    func noProtocolRelativeRedirect() async throws {
        let root = try packFolder("attack-redirect")
        defer { try? FileManager.default.removeItem(at: root) }
        try FileManager.default.createDirectory(at: root.appendingPathComponent("packs/evil.example"), withIntermediateDirectories: true)
        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        let port = server.port
        let paths = ["//packs", "///packs", "/packs", "//packs/evil.example", "/%2Fpacks"]
        let answers = try await onThread {
            try paths.map { path in
                let connection = try RawConnection(port: port)
                connection.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                let bytes = connection.readToEnd().bytes
                return (statusLine(bytes), header("Location", in: bytes))
            }
        }
        await server.stop()
        for (path, (status, location)) in zip(paths, answers) {
            #expect(status == "HTTP/1.1 301 Moved Permanently", "\(path)")
            #expect(location?.hasPrefix("//") == false, "\(path) → Location: \(location ?? "none")")
        }
        #expect(answers.map(\.1) == ["/packs/", "/packs/", "/packs/", "/packs/evil.example/", "/packs/"])
    }

    // MARK: Keep-alive

    @Test("five range requests on one keep-alive connection all get their bytes (sendfile, next request before the last end)")
    func keepAliveRanges() async throws {
        let root = try packFolder("keepalive")
        defer { try? FileManager.default.removeItem(at: root) }
        let bytes = try Data(contentsOf: root.appendingPathComponent("pack.bin"))
        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: LogLines().logger())
        let port = server.port
        let bodies = try await onThread { () -> [[UInt8]] in
            let connection = try RawConnection(port: port, timeout: 5)
            var bodies: [[UInt8]] = []
            var pending: [UInt8] = []
            for index in 0..<5 {
                connection.send("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: bytes=\(index * 1000)-\(index * 1000 + 9999)\r\n\r\n")
                // Read the head and exactly 10,000 body bytes.
                var buffer = [UInt8](repeating: 0, count: 65536)
                while true {
                    if let end = pending.firstRange(of: Array("\r\n\r\n".utf8)), pending.count >= end.upperBound + 10_000 {
                        bodies.append(Array(pending[end.upperBound..<(end.upperBound + 10_000)]))
                        pending.removeFirst(end.upperBound + 10_000)
                        break
                    }
                    let received = recv(connection.fd, &buffer, buffer.count, 0)
                    if received <= 0 { return bodies }
                    pending.append(contentsOf: buffer[..<received])
                }
            }
            return bodies
        }
        await server.stop()
        #expect(bodies.count == 5, "the connection broke after \(bodies.count) responses")
        for (index, body) in bodies.enumerated() {
            #expect(Data(body) == bytes[(index * 1000)..<(index * 1000 + 10_000)], "response \(index)")
        }
    }

    // MARK: Connection handling: send timeout through the router, the connection limit, Connection: close

    @Test("a client that stops reading a file sent through the router (a GET with a body) is closed after the send timeout")
    func sendTimeoutThroughRouter() async throws {
        let root = try Fixtures.temporaryDirectory("attack-send-router")
        defer { try? FileManager.default.removeItem(at: root) }
        let size = 256 * 1024 * 1024
        try Self.sparseFile(at: root.appendingPathComponent("big.bin"), size: size)
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--send-timeout", "1"])
        defer { server.stop() }
        let port = server.port
        let (status, count, closed) = try await onThread { () -> (String, Int, Bool) in
            let connection = try RawConnection(port: port, timeout: 10)
            // A body: not one the connection answers itself, so the router sends the file (sendfile from a task).
            connection.send("GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\n\r\nx")
            sleep(3)
            // Far more than the socket buffers hold, far less than the file.
            let (bytes, closed) = connection.readToEnd(limit: 32 * 1024 * 1024)
            return (statusLine(bytes), bytes.count, closed)
        }
        #expect(status == "HTTP/1.1 200 OK")
        #expect(closed, "the connection was not closed")
        #expect(count < size, "the whole file arrived: the server waited for the stalled client")
    }

    @Test("at --max-connections a new client closes the connection idle longest, never a busy one; with none idle it is refused")
    func connectionLimit() async throws {
        let root = try packFolder("attack-limit")
        defer { try? FileManager.default.removeItem(at: root) }
        let size = 64 * 1024 * 1024
        try Self.sparseFile(at: root.appendingPathComponent("big.bin"), size: size)
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--max-connections", "2", "--metrics-address", "127.0.0.1:0"])
        defer { server.stop() }
        let port = server.port
        let metricsPort = try #require(server.metricsPort, "packs serve did not print where its metrics are")
        let small = "GET /manifest.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        let large = "GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        let outcome = try await onThread { () -> [String] in
            var outcome: [String] = []
            // Idle: answered, waiting for its next request.
            let idle = try RawConnection(port: port, timeout: 5)
            idle.send(small)
            outcome.append("idle: \(Self.readResponse(idle).status)")
            // Busy: its response waits for it to read.
            let busy = try RawConnection(port: port, timeout: 5)
            busy.send(large)
            usleep(300_000)
            let newcomer = try RawConnection(port: port, timeout: 5)
            newcomer.send(small)
            outcome.append("newcomer: \(Self.readResponse(newcomer).status)")
            usleep(300_000)
            outcome.append("idle closed: \(idle.isClosedByPeer)")
            // The newcomer is idle now and the busy one still busy: the next client closes the newcomer.
            let busyToo = try RawConnection(port: port, timeout: 5)
            busyToo.send(large)
            usleep(300_000)
            outcome.append("newcomer closed: \(newcomer.isClosedByPeer)")
            // Both busy: the next one is refused, closed without an answer.
            let refused = try RawConnection(port: port, timeout: 5)
            refused.send(small)
            let (bytes, closed) = refused.readToEnd()
            outcome.append("refused: \(bytes.count) bytes, closed: \(closed)")
            // The busy ones were kept: they get all of their responses.
            outcome.append("busy: \(Self.readResponse(busy).body)")
            outcome.append("busyToo: \(Self.readResponse(busyToo).body)")
            return outcome
        }
        #expect(
            outcome == [
                "idle: HTTP/1.1 200 OK", "newcomer: HTTP/1.1 200 OK", "idle closed: true", "newcomer closed: true",
                "refused: 0 bytes, closed: true", "busy: \(size)", "busyToo: \(size)",
            ], "\(server.log)")
        #expect(server.isRunning)
        // What an operator sees of it: one connection refused, two idle ones closed to let others in.
        let scraped = try await MetricsTests.scrape(metricsPort)
        #expect(scraped.samples["packs_http_connections_refused_total"] == 1, "\(scraped.text)")
        #expect(scraped.samples["packs_http_connections_closed_idle_total"] == 2, "\(scraped.text)")
    }

    // MARK: Issue 43, items 11, 21 and 22

    @Test("issue 43 item 11: 150 idle connections on the metrics port under a 96-descriptor limit leave the content port serving")
    func idleMetricsConnectionsDoNotStarveTheContentPort() async throws {
        let root = try packFolder("attack-metrics-idle")
        defer { try? FileManager.default.removeItem(at: root) }
        let server = try PackServeProcess(
            binary: CLI.binary, [root.path, "--metrics-address", "127.0.0.1:0", "--request-timeout", "2", "--idle-timeout", "2"],
            descriptorLimit: 96)
        defer { server.stop() }
        let metricsPort = try #require(server.metricsPort, "packs serve did not print where its metrics are")
        let held = try await onThread { () -> [RawConnection] in
            // One that scraped and waits for its next request (the idle timeout), and 150 that send nothing.
            let scraper = try RawConnection(port: metricsPort, timeout: 5)
            scraper.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _ = Self.readResponse(scraper)
            return [scraper] + (try (0..<150).map { _ in try RawConnection(port: metricsPort, timeout: 5) })
        }
        try await Task.sleep(for: .milliseconds(300))
        let served = try await curl(server.baseURL.appendingPathComponent("pack.bin").absoluteString, ["--max-time", "3"])
        #expect(served.status == 200, "the content port was starved: \(served.stderr)\n\(server.log)")
        #expect(server.openDescriptors < 96, "descriptors: \(server.openDescriptors)")
        // Every held connection is closed by the server: the oldest to make room, the rest by the timeouts.
        let allClosed = await eventually(timeout: 8) { held.allSatisfy(\.isClosedByPeer) }
        #expect(allClosed, "\(held.filter { !$0.isClosedByPeer }.count) metrics connections still open after 8 s")
        #expect(held[0].isClosedByPeer, "the idle scraper was closed after the idle timeout")
        let scraped = try await MetricsTests.scrape(metricsPort)
        #expect(scraped.text.contains("packs_http_requests_total"), "the metrics port still answers: \(scraped.text)")
        #expect(server.isRunning)
    }

    @Test("issue 43 item 21: /%68ealthz, /healthz/ and //healthz with a valid token answer the health check, never a root file healthz")
    func healthzIsNeverAFile() async throws {
        let root = try packFolder("attack-healthz")
        defer { try? FileManager.default.removeItem(at: root) }
        try Data("SECRET-FILE\n".utf8).write(to: root.appendingPathComponent("healthz"))
        try FileManager.default.createSymbolicLink(atPath: root.appendingPathComponent("alias").path, withDestinationPath: "healthz")
        let server = try PackServeProcess(binary: CLI.binary, [root.path, "--token", "t0ken"])
        defer { server.stop() }
        let port = server.port
        let paths = ["/healthz", "/%68ealthz", "/healthz/", "//healthz", "/%2Fhealthz", "/healthz//", "/alias"]
        let answers = try await onThread { () -> [String: String] in
            var answers: [String: String] = [:]
            for path in paths {
                let connection = try RawConnection(port: port, timeout: 5)
                connection.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t0ken\r\nConnection: close\r\n\r\n")
                let text = String(decoding: connection.readToEnd().bytes, as: UTF8.self)
                answers[path] = statusLine(Array(text.utf8)) + " " + (text.components(separatedBy: "\r\n\r\n").dropFirst().first ?? "")
            }
            return answers
        }
        for path in paths {
            let answer = answers[path] ?? ""
            #expect(!answer.contains("SECRET"), "\(path) served the file: \(answer)")
            if path != "/alias" { #expect(answer == "HTTP/1.1 200 OK ok\n", "\(path): \(answer)") }
        }
        #expect(answers["/alias"]?.hasPrefix("HTTP/1.1 404") == true, "a link to it is not served: \(answers["/alias"] ?? "")")
    }

    @Test("issue 43 item 22: a port outside 0-65535 is a usage error, for --port and --metrics-address alike")
    func portsOutOfRangeAreUsageErrors() async throws {
        let root = try packFolder("attack-ports")
        defer { try? FileManager.default.removeItem(at: root) }
        for arguments in [
            ["--port", "70000"], ["--port", "65536"], ["--port", "-1"], ["--port", "0", "--metrics-address", "127.0.0.1:70000"],
            ["--port", "0", "--metrics-address", "127.0.0.1:-5"],
        ] {
            let result = try await Fixtures.runAsync(CLI.binary, ["serve", root.path] + arguments, timeout: 10)
            #expect(result.status == 64, "\(arguments): exit \(result.status), \(result.stdout) \(result.stderr)")
            #expect(result.stdout.isEmpty, "\(arguments) listened: \(result.stdout)")
        }
        // The library refuses them too, before listening.
        var configuration = PackServerConfiguration(directory: root, port: 70000)
        await #expect(throws: PackServerError.self) { _ = try await PackServer.start(configuration, logger: Logger(label: "test")) }
        configuration.port = 0
        configuration.metricsAddress = .init(host: "127.0.0.1", port: 65536)
        await #expect(throws: PackServerError.self) { _ = try await PackServer.start(configuration, logger: Logger(label: "test")) }
    }

    @Test("Connection: close gets one answer, then the server closes; a request pipelined after it is not answered")
    func connectionClose() async throws {
        let root = try packFolder("attack-close")
        defer { try? FileManager.default.removeItem(at: root) }
        let log = LogLines()
        let server = try await PackServer.start(PackServerConfiguration(directory: root, port: 0), logger: log.logger())
        let port = server.port
        let (bytes, closed) = try await onThread { () -> ([UInt8], Bool) in
            let connection = try RawConnection(port: port, timeout: 5)
            connection.send(
                "GET /manifest.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    + "GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return connection.readToEnd()
        }
        // Give a second answer, if one were attempted, the time to be logged.
        try await Task.sleep(for: .milliseconds(200))
        await server.stop()
        let requests = log.all.filter { $0.contains(" bytes") }
        #expect(requests.count == 1 && requests.first?.contains("GET /manifest.json") == true, "\(requests)")
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(statusLine(bytes) == "HTTP/1.1 200 OK")
        #expect(header("Connection", in: bytes) == "close")
        #expect(text.components(separatedBy: "HTTP/1.1 ").count == 2, "more than one answer")
        #expect(closed, "the server did not close the connection")
    }

    // MARK: - Fixtures

    /// A sparse file of `size` bytes (zeros that cost no disk).
    static func sparseFile(at url: URL, size: Int) throws {
        guard FileManager.default.createFile(atPath: url.path, contents: nil) else { throw FixtureError("cannot create \(url.path)") }
        try FileHandle(forWritingTo: url).truncate(atOffset: UInt64(size))
    }

    /// Reads one response: its status line and how many body bytes arrived of its `Content-Length`
    /// (reading stops there, at end-of-file or at the socket's timeout).
    static func readResponse(_ connection: RawConnection) -> (status: String, body: Int) {
        var head: [UInt8] = []
        var body = 0
        var length: Int?
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while length.map({ body < $0 }) ?? true {
            let count = recv(connection.fd, &buffer, length.map { min(buffer.count, $0 - body) } ?? 1, 0)
            if count < 0, errno == EINTR { continue }
            if count <= 0 { break }
            if length != nil {
                body += count
                continue
            }
            // The head one byte at a time, so that nothing of the body or the next response is taken.
            head.append(buffer[0])
            if head.count >= 4, head.suffix(4).elementsEqual("\r\n\r\n".utf8) {
                length = Int(header("Content-Length", in: head) ?? "") ?? 0
            }
        }
        return (statusLine(head), body)
    }

    /// Makes OUTSIDE/d…/d…/…/secret.txt, more than 4096 bytes deep, and a short symbolic link
    /// halfway down pointing at it; returns the link's path (itself shorter than PATH_MAX).
    static func makeDeepSecret(under outside: URL, text: String) throws -> String {
        try FileManager.default.createDirectory(at: outside, withIntermediateDirectories: true)
        let name = String(repeating: "d", count: 200)
        var fd = open(outside.path, O_RDONLY | O_DIRECTORY)
        guard fd >= 0 else { throw FixtureError("cannot open \(outside.path)") }
        var halfway = outside.path
        var hopFD: Int32 = -1
        for level in 0..<24 {
            guard mkdirat(fd, name, 0o755) == 0 else { throw FixtureError("mkdirat: \(String(cString: strerror(errno)))") }
            let next = openat(fd, name, O_RDONLY | O_DIRECTORY)
            guard next >= 0 else { throw FixtureError("openat: \(String(cString: strerror(errno)))") }
            if level < 12 { halfway += "/" + name }
            if level == 11 { hopFD = dup(next) }
            close(fd)
            fd = next
        }
        let secret = openat(fd, "secret.txt", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        _ = text.withCString { write(secret, $0, strlen($0)) }
        close(secret)
        close(fd)
        // From level 12, the remaining 12 levels and the file, relative.
        let rest = Array(repeating: name, count: 12).joined(separator: "/") + "/secret.txt"
        guard symlinkat(rest, hopFD, "hop") == 0 else { throw FixtureError("symlinkat: \(String(cString: strerror(errno)))") }
        close(hopFD)
        return halfway + "/hop"
    }

    /// Removes a tree that may be deeper than PATH_MAX (`rm -rf` copes).
    static func removeDeep(_ folder: URL) {
        _ = try? Fixtures.run("/bin/rm", ["-rf", folder.path])
    }
}
