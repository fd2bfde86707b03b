import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Files, folders, processes and ports for tests. Depends on nothing but Foundation and the C library.
public enum Fixtures {
    /// Creates a fresh, empty folder under the system's temporary folder.
    ///
    /// The folder is removed when the test process exits (a test may remove it sooner), so that a run of the suite
    /// leaves nothing behind in the temporary folder. Set `PACKS_KEEP_TEST_FOLDERS=1` to keep them for inspection.
    ///
    /// - Parameter label: A readable part of the folder name (e.g. the test's name).
    /// - Returns: The folder's URL.
    /// - Throws: When the folder cannot be created.
    public static func temporaryDirectory(_ label: String) throws -> URL {
        let safeLabel = String(label.map { $0.isLetter || $0.isNumber || $0 == "-" ? $0 : "-" }.prefix(40))
        let url = FileManager.default.temporaryDirectory
            .appendingPathComponent("PackDelivery-\(safeLabel)-\(UUID().uuidString.prefix(8))", isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        self.removedAtExit.withLock { folders in
            if folders.isEmpty, ProcessInfo.processInfo.environment["PACKS_KEEP_TEST_FOLDERS"] == nil {
                atexit { Fixtures.removeTemporaryDirectories() }
            }
            folders.append(url.path)
        }
        return url
    }

    /// The folders ``temporaryDirectory(_:)`` created, removed at exit.
    private static let removedAtExit = Mutex<[String]>([])

    private static func removeTemporaryDirectories() {
        let folders = self.removedAtExit.withLock { folders in
            defer { folders = [] }
            return folders
        }
        for folder in folders {
            try? FileManager.default.removeItem(atPath: folder)
        }
    }

    /// Writes `size` pseudo-random bytes to `url` (creating parent folders), replacing any file there.
    ///
    /// The bytes come from a fast generator seeded from the system's random source, so two files
    /// are different and the content does not compress.
    ///
    /// - Parameters:
    ///   - url: Where to write.
    ///   - size: How many bytes.
    /// - Throws: When the file cannot be written.
    public static func randomFile(at url: URL, size: Int) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: url.path, contents: nil) else {
            throw FixtureError("Cannot create \(url.path).")
        }
        let handle = try FileHandle(forWritingTo: url)
        defer { try? handle.close() }
        var state = UInt64.random(in: 1...UInt64.max)
        var remaining = size
        let chunkWords = 1 << 15  // 256 KiB
        var words = [UInt64](repeating: 0, count: chunkWords)
        while remaining > 0 {
            for index in 0..<chunkWords {
                // SplitMix64
                state &+= 0x9E37_79B9_7F4A_7C15
                var mixed = state
                mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
                mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
                words[index] = mixed ^ (mixed >> 31)
            }
            let count = min(remaining, chunkWords * 8)
            let data = words.withUnsafeBytes { Data(bytes: $0.baseAddress!, count: count) }
            try handle.write(contentsOf: data)
            remaining -= count
        }
    }

    /// The SHA-256 of a file as lowercase hex, computed by `/usr/bin/sha256sum` (independent of the
    /// library's own hashing).
    ///
    /// - Throws: When `sha256sum` fails.
    public static func sha256Hex(of url: URL) throws -> String {
        let result = try self.run("/usr/bin/sha256sum", ["--binary", url.path])
        guard result.status == 0, let hex = result.stdout.split(separator: " ").first, hex.count == 64 else {
            throw FixtureError("sha256sum \(url.path) failed (\(result.status)): \(result.stderr)")
        }
        return String(hex)
    }

    /// Runs a program to completion and returns its exit status and output.
    ///
    /// Both pipes are read on their own threads while the program runs, so a chatty program cannot
    /// block on a full pipe.
    ///
    /// - Parameters:
    ///   - executable: Absolute path of the program, or a name looked up in `PATH`.
    ///   - args: Its arguments.
    ///   - environment: Its environment; `nil` inherits this process's.
    ///   - currentDirectory: Its working folder; `nil` inherits this process's.
    ///   - timeout: After this many seconds the program gets SIGTERM, then SIGKILL, and the call throws.
    /// - Returns: The exit status (128 + signal number when killed by a signal), stdout and stderr.
    /// - Throws: When the program cannot be started, or on timeout.
    public static func run(
        _ executable: String,
        _ args: [String],
        environment: [String: String]? = nil,
        currentDirectory: URL? = nil,
        timeout: TimeInterval = 120
    ) throws -> (status: Int32, stdout: String, stderr: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try self.resolveExecutable(executable))
        process.arguments = args
        if let environment { process.environment = environment }
        if let currentDirectory { process.currentDirectoryURL = currentDirectory }
        let stdoutPipe = Pipe()
        let stderrPipe = Pipe()
        process.standardOutput = stdoutPipe
        process.standardError = stderrPipe
        process.standardInput = FileHandle.nullDevice

        let exited = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in exited.signal() }

        let output = Mutex<(stdout: Data, stderr: Data)>((Data(), Data()))
        let readers = DispatchGroup()
        let stdoutHandle = stdoutPipe.fileHandleForReading
        let stderrHandle = stderrPipe.fileHandleForReading
        // Process closes the parent's copies of the write ends, so the reads see end-of-file.
        try process.run()
        // Threads of their own, not Dispatch's global queues: on Linux those share a pool as wide
        // as the machine has cores with Swift concurrency, and a read that blocks for the whole
        // life of a program there stalls every task in the process.
        readers.enter()
        readers.enter()
        Thread.detachNewThread {
            let data = stdoutHandle.readDataToEndOfFile()
            output.withLock { $0.stdout = data }
            readers.leave()
        }
        Thread.detachNewThread {
            let data = stderrHandle.readDataToEndOfFile()
            output.withLock { $0.stderr = data }
            readers.leave()
        }

        var timedOut = false
        if exited.wait(timeout: .now() + timeout) == .timedOut {
            timedOut = true
            kill(process.processIdentifier, SIGTERM)
            if exited.wait(timeout: .now() + 2) == .timedOut {
                kill(process.processIdentifier, SIGKILL)
                if exited.wait(timeout: .now() + 5) == .timedOut {
                    // Foundation missed the exit (seen with many short-lived children): reap it here rather than hang.
                    var status: Int32 = 0
                    _ = waitpid(process.processIdentifier, &status, WNOHANG)
                }
            }
        }
        // A grandchild that kept the pipes open must not hang the caller.
        _ = readers.wait(timeout: .now() + 5)
        let (stdoutData, stderrData) = output.withLock { ($0.stdout, $0.stderr) }
        let stdout = String(decoding: stdoutData, as: UTF8.self)
        let stderr = String(decoding: stderrData, as: UTF8.self)
        if timedOut {
            throw FixtureError(
                "\(executable) \(args.joined(separator: " ")) timed out after \(timeout) s.\nstdout: \(stdout)\nstderr: \(stderr)"
            )
        }
        let status =
            process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
        return (status, stdout, stderr)
    }

    /// ``run(_:_:environment:currentDirectory:timeout:)`` on a thread of its own, for async code.
    ///
    /// Use this from async tests: waiting for a program blocks a thread, and blocking the few
    /// threads of Swift's cooperative pool (two on a two-core machine) would starve in-process
    /// servers — such as Hummingbird's — that the program talks to.
    public static func runAsync(
        _ executable: String,
        _ args: [String],
        environment: [String: String]? = nil,
        currentDirectory: URL? = nil,
        timeout: TimeInterval = 120
    ) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                continuation.resume(
                    with: Result {
                        try self.run(executable, args, environment: environment, currentDirectory: currentDirectory, timeout: timeout)
                    }
                )
            }
        }
    }

    /// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
    ///
    /// Another process may take it before the caller binds it; callers that start a server should
    /// retry with a new port when binding fails.
    ///
    /// - Throws: When no socket can be bound.
    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw FixtureError("socket() failed: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = sockaddr_in.loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { throw FixtureError("bind() failed: \(String(cString: strerror(errno)))") }
        return try boundPort(of: fd)
    }

    private static func resolveExecutable(_ executable: String) throws -> String {
        if executable.contains("/") { return executable }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        for folder in path.split(separator: ":") {
            let candidate = "\(folder)/\(executable)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        throw FixtureError("\(executable) was not found in PATH (\(path)).")
    }
}

/// A failure of a test fixture, with a sentence saying what went wrong.
public struct FixtureError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

extension sockaddr_in {
    /// 127.0.0.1:`port`.
    static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(UInt32(0x7F00_0001).bigEndian)
        return address
    }
}

/// The local port a bound socket got.
func boundPort(of fd: Int32) throws -> Int {
    var address = sockaddr_in()
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let result = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard result == 0 else { throw FixtureError("getsockname() failed: \(String(cString: strerror(errno)))") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether something accepts TCP connections on 127.0.0.1:`port` right now.
func acceptsConnections(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = sockaddr_in.loopback(port: port)
    let result = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    return result == 0
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) for `seconds` since 1970, locale-free.
func httpDate(seconds: Int) -> String {
    let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    var time = time_t(seconds)
    var parts = tm()
    gmtime_r(&time, &parts)
    func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
    return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
        + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
}
