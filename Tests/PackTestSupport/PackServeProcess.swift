import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A `packs serve` process started by a test, on a free loopback port (`--port 0`, read back from
/// its first line), optionally under a descriptor limit (`prlimit --nofile`).
///
/// Stopped (SIGTERM, then SIGKILL) by ``stop()`` or when the object goes away; its output is kept
/// in a temporary folder for failure messages.
public final class PackServeProcess: Sendable {
    /// The port it listens on, on 127.0.0.1.
    public let port: Int
    /// The port of its metrics listener, when started with `--metrics-address 127.0.0.1:0`.
    public let metricsPort: Int?
    /// Its process id (prlimit execs into it, so this is `packs` itself).
    public let pid: pid_t
    private let directory: URL
    private let stopped = Mutex(false)

    /// Starts `binary serve ARGUMENTS… --port 0` and waits until it listens.
    ///
    /// - Parameters:
    ///   - binary: The `packs` executable.
    ///   - arguments: What follows `serve` (the folder first), without `--port`.
    ///   - environment: Extra environment variables (e.g. `PACKS_TOKEN`).
    ///   - descriptorLimit: When set, the soft and hard `RLIMIT_NOFILE` of the process.
    /// - Throws: When it does not print its port within 10 seconds; the error carries its output.
    public init(binary: String, _ arguments: [String], environment: [String: String] = [:], descriptorLimit: Int? = nil) throws {
        let directory = try Fixtures.temporaryDirectory("packs-serve")
        self.directory = directory
        var command = [binary, "serve"] + arguments + ["--port", "0"]
        if let descriptorLimit {
            command = ["/usr/bin/prlimit", "--nofile=\(descriptorLimit):\(descriptorLimit)", "--"] + command
        }
        let stdout = directory.appendingPathComponent("stdout").path
        let stderr = directory.appendingPathComponent("stderr").path
        let pid = try withEnvironment(environment) {
            try spawn(command[0], Array(command.dropFirst()), stdout: stdout, stderr: stderr)
        }
        self.pid = pid
        let deadline = Date().addingTimeInterval(10)
        while true {
            let text = (try? String(contentsOfFile: stdout, encoding: .utf8)) ?? ""
            // The first line, once whole, says where it listens (and where its metrics are).
            if text.contains("\n"), let port = Self.port(in: text) {
                self.port = port
                self.metricsPort = Self.port(in: text, after: "metrics at http://127.0.0.1:")
                return
            }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid || Date() > deadline {
                terminate(pid: pid, signal: SIGKILL, grace: 0)
                let errors = (try? String(contentsOfFile: stderr, encoding: .utf8)) ?? ""
                try? FileManager.default.removeItem(at: directory)
                throw FixtureError("packs serve did not print its port within 10 s.\nstdout: \(text)\nstderr: \(errors)")
            }
            usleep(20_000)
        }
    }

    deinit {
        self.stop()
        try? FileManager.default.removeItem(at: self.directory)
    }

    /// `http://127.0.0.1:PORT/`
    public var baseURL: URL {
        URL(string: "http://127.0.0.1:\(self.port)/")!
    }

    /// What it wrote on stderr so far (its log).
    public var log: String {
        (try? String(contentsOf: self.directory.appendingPathComponent("stderr"), encoding: .utf8)) ?? ""
    }

    /// How many descriptors it has open now (`/proc/PID/fd`), or -1 when that cannot be read.
    public var openDescriptors: Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(self.pid)/fd").count) ?? -1
    }

    /// Whether it is still running.
    public var isRunning: Bool {
        var status: Int32 = 0
        return waitpid(self.pid, &status, WNOHANG) == 0
    }

    /// Stops it (SIGTERM, SIGKILL after 5 s) and reaps it. Harmless when repeated.
    public func stop() {
        let alreadyStopped = self.stopped.withLock { stopped in
            defer { stopped = true }
            return stopped
        }
        guard !alreadyStopped else { return }
        terminate(pid: self.pid, signal: SIGTERM, grace: 5)
    }

    private static func port(in text: String, after prefix: String = "http://127.0.0.1:") -> Int? {
        // "Serving DIR at http://127.0.0.1:PORT/ (Ctrl-C stops)[; metrics at http://127.0.0.1:PORT/metrics]"
        guard let range = text.range(of: prefix) else { return nil }
        return Int(text[range.upperBound...].prefix { $0.isNumber })
    }
}

/// Runs `body` with extra environment variables set in this process (posix_spawn passes `environ`),
/// restoring them afterwards. Tests run one at a time (`--no-parallel`).
private func withEnvironment<T>(_ variables: [String: String], _ body: () throws -> T) rethrows -> T {
    let saved = variables.keys.map { ($0, getenv($0).map { String(cString: $0) }) }
    for (name, value) in variables { setenv(name, value, 1) }
    defer {
        for (name, value) in saved {
            if let value { setenv(name, value, 1) } else { unsetenv(name) }
        }
    }
    return try body()
}

/// A raw TCP client for tests that need bytes the usual clients will not send.
public final class RawConnection: Sendable {
    /// The socket.
    public let fd: Int32

    /// Connects to 127.0.0.1:`port`; reads and writes give up after `timeout` seconds.
    ///
    /// - Throws: When the connection is refused or times out.
    public init(port: Int, timeout: Int = 10) throws {
        self.fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var time = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(self.fd, SOL_SOCKET, SO_SNDTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in.loopback(port: port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(self.fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let message = String(cString: strerror(errno))
            close(self.fd)
            throw FixtureError("Cannot connect to 127.0.0.1:\(port): \(message)")
        }
    }

    deinit {
        close(self.fd)
    }

    /// Sends all of `bytes`; returns how many were sent before an error or timeout.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Int {
        var sent = 0
        while sent < bytes.count {
            let result = bytes[sent...].withUnsafeBytes { Glibc.send(self.fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
            if result < 0, errno == EINTR { continue }
            if result <= 0 { break }
            sent += result
        }
        return sent
    }

    /// Sends a string's UTF-8 bytes.
    @discardableResult
    public func send(_ text: String) -> Int {
        self.send(Array(text.utf8))
    }

    /// Reads until end-of-file, an error, a timeout or `limit` bytes.
    ///
    /// - Returns: The bytes, and whether the peer closed (end-of-file or reset) rather than went silent.
    public func readToEnd(limit: Int = 1 << 24) -> (bytes: [UInt8], closed: Bool) {
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while output.count < limit {
            let received = recv(self.fd, &buffer, buffer.count, 0)
            if received < 0, errno == EINTR { continue }
            if received == 0 { return (output, true) }
            if received < 0 { return (output, errno == ECONNRESET) }
            output.append(contentsOf: buffer[..<received])
        }
        return (output, false)
    }

    /// Whether the peer has closed the connection (end-of-file or reset), without waiting; bytes
    /// waiting to be read are read and thrown away.
    public var isClosedByPeer: Bool {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let received = recv(self.fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if received > 0 { continue }
            if received == 0 { return true }
            return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
        }
    }

    /// Closes the sending side (FIN).
    public func shutdownWrite() {
        shutdown(self.fd, Int32(SHUT_WR))
    }
}
