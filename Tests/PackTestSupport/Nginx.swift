import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A real nginx (`/usr/sbin/nginx`) serving one folder on a free loopback port: the reference
/// HTTP server for Range, If-Range, ETag, 416 and `limit_rate`.
///
/// Everything nginx writes (configuration, pid file, logs, temp folders) lives in a fresh temporary
/// folder, so it runs as root or not without touching `/var/lib/nginx` or `/var/log/nginx`. The access
/// log records `$request_uri $status $bytes_sent $body_bytes_sent "$http_range"` for each request;
/// nginx writes a line when a request ends, unbuffered.
///
/// nginx is stopped by ``stop()`` or when the object goes away; the temporary folder (and with it
/// the logs) is removed when the object goes away.
public final class NginxServer: Sendable {
    /// The port nginx listens on, on 127.0.0.1.
    public let port: Int
    /// The folder that holds the configuration, pid file and logs.
    public let directory: URL
    /// The access log.
    public let accessLog: URL
    /// The error log.
    public let errorLog: URL

    private let pid: pid_t
    private let stopped = Mutex(false)

    /// Starts nginx over `root` and waits until it accepts connections.
    ///
    /// - Parameters:
    ///   - root: The folder to serve.
    ///   - limitRate: When set, nginx's `limit_rate` in bytes per second, per connection.
    ///   - serverBlock: When set, the `server { … }` block to run instead of the plain one, made for
    ///     the port nginx will listen on (e.g. the README's example with its `listen` replaced).
    /// - Throws: When nginx cannot start or does not accept connections within 5 seconds; the error
    ///   carries the error log.
    public init(root: URL, limitRate: Int? = nil, serverBlock: ((Int) -> String)? = nil) throws {
        let directory = try Fixtures.temporaryDirectory("nginx")
        self.directory = directory
        self.accessLog = directory.appendingPathComponent("access.log")
        self.errorLog = directory.appendingPathComponent("error.log")
        for folder in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            try FileManager.default.createDirectory(
                at: directory.appendingPathComponent(folder),
                withIntermediateDirectories: true
            )
        }

        var lastError = ""
        var started = false
        defer {
            if !started { try? FileManager.default.removeItem(at: directory) }
        }
        for _ in 0..<3 {
            let port = try Fixtures.freePort()
            let configuration = directory.appendingPathComponent("nginx.conf")
            try Self.configuration(directory: directory, root: root, port: port, limitRate: limitRate, serverBlock: serverBlock?(port))
                .write(to: configuration, atomically: true, encoding: .utf8)
            try? FileManager.default.removeItem(at: self.errorLog)

            let pid = try spawn(
                "/usr/sbin/nginx",
                ["-p", directory.path + "/", "-c", configuration.path, "-e", self.errorLog.path, "-g", "daemon off;"],
                stdout: directory.appendingPathComponent("stdout.log").path,
                stderr: directory.appendingPathComponent("stderr.log").path
            )
            switch Self.waitUntilListening(pid: pid, port: port) {
            case .listening:
                self.pid = pid
                self.port = port
                started = true
                return
            case .exited:
                lastError = Self.startupErrors(directory: directory)
                if lastError.contains("Address already in use") {
                    continue
                }
                throw FixtureError("nginx did not start:\n\(lastError)")
            case .timedOut:
                terminate(pid: pid, signal: SIGTERM, grace: 2)
                throw FixtureError("nginx did not accept connections within 5 s:\n\(Self.startupErrors(directory: directory))")
            }
        }
        throw FixtureError("nginx could not bind a free port in 3 tries:\n\(lastError)")
    }

    deinit {
        self.stop()
        try? FileManager.default.removeItem(at: self.directory)
    }

    /// `http://127.0.0.1:PORT/`
    public var baseURL: URL {
        URL(string: "http://127.0.0.1:\(self.port)/")!
    }

    /// Stops nginx (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. Harmless when repeated.
    public func stop() {
        let alreadyStopped = self.stopped.withLock { stopped in
            defer { stopped = true }
            return stopped
        }
        guard !alreadyStopped else { return }
        terminate(pid: self.pid, signal: SIGTERM, grace: 5)
    }

    /// The sum of `$body_bytes_sent` over the logged requests, for those whose URI (without the query)
    /// is `path` when given. A request is logged when it ends; see ``waitForRequests(_:timeout:)``.
    public func bodyBytesSent(path: String? = nil) -> Int {
        self.entries()
            .filter { path == nil || Self.uri($0.uri, matches: path!) }
            .reduce(0) { $0 + $1.bodyBytes }
    }

    /// How far into the file at `path` nginx wrote, by its last logged request for it: the first byte its `Range`
    /// asked for (0 without one) plus its `$body_bytes_sent` (bytes written to the socket, read or not). Nil when none.
    public func furthestByteSent(path: String) -> Int? {
        guard let last = self.entries().last(where: { Self.uri($0.uri, matches: path) }) else { return nil }
        let start = last.range.flatMap { $0.split(separator: "=").last?.split(separator: "-").first.flatMap { Int($0) } } ?? 0
        return start + last.bodyBytes
    }

    /// The logged requests, oldest first: URI, status and the `Range` header when there was one.
    public func requests() -> [(uri: String, status: Int, range: String?)] {
        self.entries().map { ($0.uri, $0.status, $0.range) }
    }

    /// Waits until at least `count` requests have been logged (nginx logs a request when it ends,
    /// possibly a moment after the client saw the last byte).
    ///
    /// - Returns: Whether `count` requests were logged within `timeout` seconds.
    @discardableResult
    public func waitForRequests(_ count: Int, timeout: TimeInterval = 5) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while self.entries().count < count {
            if Date() > deadline { return false }
            usleep(10_000)
        }
        return true
    }

    /// The error log's text (empty when there is none).
    public func errorLogText() -> String {
        (try? String(contentsOf: self.errorLog, encoding: .utf8)) ?? ""
    }

    // MARK: - Private

    private struct Entry {
        var uri: String
        var status: Int
        var bodyBytes: Int
        var range: String?
    }

    private func entries() -> [Entry] {
        guard let text = try? String(contentsOf: self.accessLog, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { line -> Entry? in
            // $request_uri $status $bytes_sent $body_bytes_sent "$http_range"
            let fields = line.split(separator: " ", maxSplits: 4, omittingEmptySubsequences: false)
            guard fields.count == 5, let status = Int(fields[1]), let bodyBytes = Int(fields[3]) else { return nil }
            var range = String(fields[4])
            if range.hasPrefix("\"") && range.hasSuffix("\"") && range.count >= 2 {
                range = String(range.dropFirst().dropLast())
            }
            return Entry(uri: String(fields[0]), status: status, bodyBytes: bodyBytes, range: range == "-" ? nil : range)
        }
    }

    private static func uri(_ uri: String, matches path: String) -> Bool {
        let withoutQuery = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? uri
        let wanted = path.hasPrefix("/") ? path : "/" + path
        return withoutQuery == wanted || uri == wanted
    }

    private static func startupErrors(directory: URL) -> String {
        let read = { (name: String) in (try? String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8)) ?? "" }
        return [read("error.log"), read("stderr.log")].filter { !$0.isEmpty }.joined(separator: "\n")
    }

    private enum Startup {
        case listening, exited, timedOut
    }

    private static func waitUntilListening(pid: pid_t, port: Int) -> Startup {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                return .exited
            }
            if acceptsConnections(port: port) {
                return .listening
            }
            usleep(20_000)
        }
        return .timedOut
    }

    private static func configuration(directory: URL, root: URL, port: Int, limitRate: Int?, serverBlock: String?) -> String {
        func quoted(_ path: String) -> String { "\"\(path.replacingOccurrences(of: "\"", with: "\\\""))\"" }
        let folder = directory.path
        return """
            \(geteuid() == 0 ? "user root;" : "")
            worker_processes 1;
            pid \(quoted(folder + "/nginx.pid"));
            error_log \(quoted(folder + "/error.log")) info;

            events {
                worker_connections 256;
            }

            http {
                types {
                    application/json json;
                    application/x-tar tar;
                    application/zip zip;
                }
                default_type application/octet-stream;
                log_format packs '$request_uri $status $bytes_sent $body_bytes_sent "$http_range"';
                access_log \(quoted(folder + "/access.log")) packs;
                client_body_temp_path \(quoted(folder + "/client_body"));
                proxy_temp_path \(quoted(folder + "/proxy"));
                fastcgi_temp_path \(quoted(folder + "/fastcgi"));
                uwsgi_temp_path \(quoted(folder + "/uwsgi"));
                scgi_temp_path \(quoted(folder + "/scgi"));
                sendfile on;
                etag on;
                server_tokens off;
                keepalive_timeout 5s;

                \(serverBlock ?? """
                server {
                    listen 127.0.0.1:\(port);
                    server_name localhost;
                    root \(quoted(root.standardizedFileURL.path));
                    \(limitRate.map { "limit_rate \($0);" } ?? "")
                }
                """)
            }

            """
    }
}

/// Starts `executable` with `arguments`, stdin from /dev/null and stdout/stderr to files (appended to with `append`),
/// with the default signal mask and dispositions (the test process may block or ignore some), and `environment`
/// when given (else this process's).
///
/// Not Foundation's `Process`: it learns of a child's exit when a socket it leaves in the child closes, then blocks its
/// one monitoring thread in `waitpid` for that child. A child that closes the fds it inherited and goes on
/// (`systemd-socket-activate` does) blocks that thread, and no other `Process` of the test is reaped after it.
public func spawn(
    _ executable: String, _ arguments: [String], stdout: String, stderr: String, environment: [String: String]? = nil,
    append: Bool = false
) throws -> pid_t {
    var fileActions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&fileActions)
    defer { posix_spawn_file_actions_destroy(&fileActions) }
    posix_spawn_file_actions_addopen(&fileActions, 0, "/dev/null", O_RDONLY, 0)
    let mode = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC)
    posix_spawn_file_actions_addopen(&fileActions, 1, stdout, mode, 0o644)
    posix_spawn_file_actions_addopen(&fileActions, 2, stderr, mode, 0o644)
    // Sockets of other test servers in this process must not leak into the child (a leaked copy
    // keeps a connection open after its owner closes it). Most are close-on-exec already; this also
    // covers one accepted a moment before its flag was set. glibc ≥ 2.34 has the call, but Swift
    // cannot see its declaration, so it is looked up at run time.
    if let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") {
        typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        _ = unsafeBitCast(symbol, to: AddCloseFrom.self)(&fileActions, 3)
    }

    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    var defaultSignals = sigset_t()
    sigemptyset(&defaultSignals)
    for signal in [SIGPIPE, SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2, SIGWINCH] {
        sigaddset(&defaultSignals, signal)
    }
    posix_spawnattr_setsigdefault(&attributes, &defaultSignals)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

    let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    let environmentList: [UnsafeMutablePointer<CChar>?]? = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
    defer { for pointer in environmentList ?? [] { free(pointer) } }
    var pid: pid_t = 0
    let result =
        environmentList.map { list in
            list.withUnsafeBufferPointer { posix_spawn(&pid, executable, &fileActions, &attributes, argv, $0.baseAddress) }
        }
        ?? posix_spawn(&pid, executable, &fileActions, &attributes, argv, environ)
    guard result == 0 else {
        throw FixtureError("Cannot start \(executable): \(String(cString: strerror(result)))")
    }
    return pid
}

/// Sends `signal` to `pid` and reaps it, escalating to SIGKILL after `grace` seconds.
public func terminate(pid: pid_t, signal: Int32, grace: TimeInterval) {
    var status: Int32 = 0
    if waitpid(pid, &status, WNOHANG) == pid { return }
    kill(pid, signal)
    let deadline = Date().addingTimeInterval(grace)
    while Date() < deadline {
        let reaped = waitpid(pid, &status, WNOHANG)
        if reaped == pid || (reaped < 0 && errno == ECHILD) { return }
        usleep(10_000)
    }
    kill(pid, SIGKILL)
    _ = waitpid(pid, &status, 0)
}
