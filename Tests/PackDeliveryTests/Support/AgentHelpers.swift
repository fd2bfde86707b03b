import Foundation
import PackAgent
import PackTestSupport
import Synchronization
import Testing

/// A `packs agent` started by a test: its socket in `run/` (0700) and its state in `state/` of a temporary folder,
/// its stderr in `agent.log` there.
final class AgentProcess {
    static let clientVersion = "0.2.0"

    let folder: URL
    let socket: String
    /// The user the agent runs as (through setpriv) when not this process's; requests then go as that user too.
    let user: String?
    /// The agent's pid (the launcher's, which execs the agent once a client connects).
    let pid: pid_t
    /// The exit status once reaped: the code, or 128 + the signal.
    private let exit = Mutex<Int32?>(nil)

    var log: String { (try? String(contentsOf: self.folder.appending(path: "agent.log"), encoding: .utf8)) ?? "" }
    var stateFolder: URL { self.folder.appending(path: "state") }

    /// Starts the agent (through `launcher` when given, e.g. systemd-socket-activate) and waits until it answers.
    ///
    /// Started with posix_spawn, not Foundation's `Process`: systemd-socket-activate closes the fds it inherits, which
    /// `Process` takes for the child's exit, and its monitoring thread then blocks in `waitpid` until the agent exits,
    /// reaping no other child of the test meanwhile (see `spawn`).
    init(
        folder: URL, arguments: [String] = [], launcher: [String] = [], environment: [String: String] = [:],
        waitForAnswer: Bool = true, socket: String? = nil, user: String? = nil
    ) throws {
        self.folder = folder
        self.user = user
        let run = folder.appending(path: "run")
        try FileManager.default.createDirectory(at: run, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        self.socket = socket ?? run.appending(path: "agent.sock").path
        let agent = [CLI.binary, "agent", "--socket", self.socket] + arguments
        var env = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        env["XDG_STATE_HOME"] = folder.appending(path: "state").path
        var command = agent
        if !launcher.isEmpty {
            // systemd-socket-activate passes the program only the variables named with -E.
            let passed = (["XDG_STATE_HOME"] + environment.keys.sorted()).flatMap { ["-E", "\($0)=\(env[$0]!)"] }
            command = launcher + passed + agent
        }
        let log = folder.appending(path: "agent.log").path
        if let user {
            // The whole folder becomes the user's: its socket folder, state and homes.
            _ = try Fixtures.run("chown", ["-R", "\(user):", folder.path], timeout: 30)
            _ = FileManager.default.createFile(atPath: log, contents: nil)
            _ = try Fixtures.run("chown", ["\(user):", log], timeout: 30)
            command = ["/usr/bin/setpriv", "--reuid=\(user)", "--regid=nogroup", "--clear-groups"] + command
        }
        self.pid = try spawn(command[0], Array(command.dropFirst()), stdout: log, stderr: log, environment: env, append: true)
        if waitForAnswer { try self.waitUntilAnswering() }
    }

    /// Whether the agent (or its launcher) has not exited yet; reaps it when it has.
    var isRunning: Bool {
        self.exit.withLock { exit in
            guard exit == nil else { return false }
            var status: Int32 = 0
            let reaped = waitpid(self.pid, &status, WNOHANG)
            guard reaped == self.pid else { return reaped == 0 }
            let signal = status & 0x7f
            exit = signal == 0 ? (status >> 8) & 0xff : 128 + signal
            return false
        }
    }

    /// The exit status once exited: the code, or 128 + the signal.
    var exitStatus: Int32? { self.isRunning ? nil : self.exit.withLock { $0 } }

    /// Waits until `GET /v1/version` answers 200.
    func waitUntilAnswering(timeout: TimeInterval = 30) throws {
        let start = Date()
        while Date().timeIntervalSince(start) < timeout {
            if let answer = try? self.request("GET", "/v1/version", timeout: 5), answer.status == 200 { return }
            guard self.isRunning || !FileManager.default.fileExists(atPath: self.socket) else { break }
            usleep(50_000)
        }
        throw AgentTestError("the agent on \(self.socket) did not answer GET /v1/version within \(timeout) s; log:\n\(self.log)")
    }

    struct Answer {
        var status: Int
        var body: String
        var json: [String: Any] { ((try? JSONSerialization.jsonObject(with: Data(self.body.utf8))) as? [String: Any]) ?? [:] }
        var errorCode: String? { (self.json["error"] as? [String: Any])?["code"] as? String }
        var errorMessage: String? { (self.json["error"] as? [String: Any])?["message"] as? String }
    }

    /// One request with `curl --unix-socket` (as `user` through setpriv when given).
    func request(
        _ method: String, _ path: String, body: String? = nil, version: String? = AgentProcess.clientVersion,
        headers: [String] = [], user: String? = nil, timeout: TimeInterval = 30
    ) throws -> Answer {
        let user = user ?? self.user
        if user == nil, headers.isEmpty, let version {
            // In this process, not through curl: a test that polls the agent spawns no process per poll.
            let client = AgentClient(socketPath: self.socket, clientVersion: version)
            do {
                let answer = try client.send(method, path, json: body.map { Data($0.utf8) }, timeout: timeout)
                return Answer(status: answer.status, body: String(decoding: answer.body, as: UTF8.self))
            } catch {
                return Answer(status: 0, body: "\(error.path): \(error.reason)")
            }
        }
        var arguments = [
            "-sS", "--unix-socket", self.socket, "-X", method, "--max-time", "\(Int(timeout))", "-o", "-", "-w", "\n%{http_code}",
        ]
        if let version { arguments += ["-H", "Packs-Client-Version: \(version)"] }
        for header in headers { arguments += ["-H", header] }
        if let body { arguments += ["-H", "Content-Type: application/json", "--data-binary", body] }
        arguments.append("http://localhost\(path)")
        var executable = "curl"
        if let user {
            executable = "setpriv"
            arguments = ["--reuid=\(user)", "--regid=nogroup", "--clear-groups", "curl"] + arguments
        }
        let result = try Fixtures.run(executable, arguments, timeout: timeout + 5)
        guard let newline = result.stdout.lastIndex(of: "\n"), let status = Int(result.stdout[result.stdout.index(after: newline)...])
        else {
            throw AgentTestError("curl \(method) \(path) gave no status: \(result.stdout) \(result.stderr)")
        }
        return Answer(status: status, body: String(result.stdout[..<newline]))
    }

    /// Sends a signal and waits for the exit. - Returns: the exit status (128 + the signal when one ended it).
    @discardableResult
    func stop(_ signal: Int32 = SIGTERM, timeout: TimeInterval = 30) throws -> Int32 {
        if self.isRunning { kill(self.pid, signal) }
        return try self.waitForExit(timeout: timeout, what: "exit after signal \(signal)")
    }

    func waitForExit(timeout: TimeInterval, what: String) throws -> Int32 {
        let start = Date()
        while self.isRunning && Date().timeIntervalSince(start) < timeout { usleep(20_000) }
        if let status = self.exitStatus { return status }
        kill(self.pid, SIGKILL)
        while self.isRunning { usleep(20_000) }
        throw AgentTestError("the agent did not \(what) within \(timeout) s; log:\n\(self.log)")
    }

    deinit {
        if self.isRunning {
            kill(self.pid, SIGKILL)
            while self.isRunning { usleep(10_000) }
        }
    }
}

struct AgentTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Waits until `condition` holds, polling every 50 ms; throws naming `what` after `timeout`.
func waitUntil(_ what: String, timeout: TimeInterval = 60, _ condition: () throws -> Bool) throws {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if try condition() { return }
        usleep(50_000)
    }
    throw AgentTestError("timed out after \(timeout) s waiting for \(what)")
}

/// ``waitUntil(_:timeout:_:)`` for an async test: it sleeps with `Task.sleep`, so that it holds none of the
/// cooperative pool's threads (two on a two-core machine) that the other tests run on.
func waitUntilAsync(_ what: String, timeout: TimeInterval = 60, _ condition: () throws -> Bool) async throws {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if try condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw AgentTestError("timed out after \(timeout) s waiting for \(what)")
}

/// A JSON body.
func jsonBody(_ object: [String: Any]) -> String {
    String(decoding: (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data(), as: UTF8.self)
}

/// `curl -N` following `GET /v1/events`, its server-sent events parsed as they arrive.
final class EventStreamClient: Sendable {
    struct Event: Sendable, Equatable {
        var id: UInt64
        var kind: String
        var data: String
    }

    /// The events parsed so far, shared with the reading thread.
    final class Received: Sendable {
        let events = Mutex<[Event]>([])
    }

    private let process: Process
    private let received = Received()

    var events: [Event] { self.received.events.withLock { $0 } }

    init(socket: String, lastEventID: String? = nil) throws {
        let process = Process()
        process.executableURL = URL(filePath: "/usr/bin/curl")
        var arguments = ["-sN", "--unix-socket", socket, "--max-time", "120", "-H", "Packs-Client-Version: \(AgentProcess.clientVersion)"]
        if let lastEventID { arguments += ["-H", "Last-Event-ID: \(lastEventID)"] }
        process.arguments = arguments + ["http://localhost/v1/events"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        let handle = pipe.fileHandleForReading
        let received = self.received
        Thread.detachNewThread {
            var buffer = ""
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { return }
                buffer += String(decoding: chunk, as: UTF8.self)
                while let end = buffer.range(of: "\n\n") {
                    let block = String(buffer[..<end.lowerBound])
                    buffer = String(buffer[end.upperBound...])
                    var event = Event(id: 0, kind: "", data: "")
                    var hasID = false
                    for line in block.split(separator: "\n") {
                        if line.hasPrefix("id: ") {
                            event.id = UInt64(line.dropFirst(4)) ?? 0
                            hasID = true
                        }
                        if line.hasPrefix("event: ") { event.kind = String(line.dropFirst(7)) }
                        if line.hasPrefix("data: ") { event.data = String(line.dropFirst(6)) }
                    }
                    if hasID { received.events.withLock { $0.append(event) } }
                }
            }
        }
    }

    /// SIGKILLs curl, as a client that dies mid-stream.
    func kill() {
        if self.process.isRunning { Glibc.kill(self.process.processIdentifier, SIGKILL) }
        self.process.waitUntilExit()
    }

    deinit { self.kill() }
}

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`.
final class NotifyListener {
    let path: String
    private let descriptor: Int32

    init(path: String) throws {
        self.path = path
        self.descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { target in
            for (index, byte) in path.utf8.enumerated() { target[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(self.descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard self.descriptor >= 0, bound == 0 else { throw AgentTestError("cannot bind \(path)") }
    }

    /// The next datagram, or nil after `timeout`.
    func receive(timeout: TimeInterval) -> String? {
        var wait = timeval(tv_sec: Int(timeout), tv_usec: 0)
        setsockopt(self.descriptor, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(self.descriptor, &buffer, buffer.count, 0)
        return count > 0 ? String(decoding: buffer[0..<count], as: UTF8.self) : nil
    }

    deinit { close(self.descriptor) }
}

/// An agent test's temporary folder and the site it fetches from: a `FaultServer` serving one product
/// (`com.example.big`, one pack of `size` bytes, paced at `bytesPerSecond` when given). `remove()` stops the server and
/// removes both folders; each test calls it in one `defer`, so the order of cleanup is the test's, not ARC's.
final class AgentSite {
    let folder: URL
    let site: TestSite
    let server: FaultServer
    /// The manifest's URL.
    let manifest: String

    init(_ label: String, size: Int, bytesPerSecond: Int?) throws {
        self.folder = try Fixtures.temporaryDirectory(label)
        do {
            (self.site, self.server, self.manifest) = try AgentTests.slowSite("\(label)-site", size: size, bytesPerSecond: bytesPerSecond)
        } catch {
            try? FileManager.default.removeItem(at: self.folder)
            throw error
        }
    }

    func remove() {
        self.server.stop()
        try? FileManager.default.removeItem(at: self.site.folder)
        try? FileManager.default.removeItem(at: self.folder)
    }
}
