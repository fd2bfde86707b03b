import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// How a ``FaultServer`` route misbehaves.
public enum Fault: Sendable, Hashable {
    /// A correct server: single ranges (`bytes=N-`, `bytes=N-M`, `bytes=-N`), If-Range against its strong
    /// ETag or its Last-Modified date, 206 with Content-Range, 416 with `Content-Range: bytes */LENGTH`
    /// when N is past the end, ETag and Last-Modified headers.
    case none
    /// Always 200 with the whole body, whatever the Range header says (no Accept-Ranges either).
    case ignoreRange
    /// A different ETag on every request, and If-Range never matches (the content "changed"):
    /// a range request with If-Range gets 200 and the whole body, as from a real server.
    case changeETag
    /// Every response: headers and the first N body bytes, then a TCP reset (SO_LINGER 0 + close).
    case resetAfter(bytes: Int)
    /// The first request of the route resets after N body bytes; later requests are served correctly.
    case resetOnce(afterBytes: Int)
    /// The first request of the route resets after N body bytes; later requests ignore Range (200 with the whole
    /// body, no Accept-Ranges), as another node of a CDN that does not serve ranges: the client starts over.
    case resetOnceThenIgnoreRange(afterBytes: Int)
    /// First request: Content-Length says the full size, N bytes are sent, then a clean close (FIN).
    case truncateOnce(afterBytes: Int)
    /// First request: N bytes are sent, then nothing, with the connection held open until the client
    /// closes it or the server stops.
    case stallOnce(afterBytes: Int)
    /// The first `times` requests of the route get this status (e.g. 503, 429, 408, 404) with an empty
    /// body and, when given, `Retry-After: seconds`; later requests are served correctly.
    case status(Int, times: Int, retryAfter: Int?)
    /// The body paced at about this many bytes per second (20 slices a second).
    case slow(bytesPerSecond: Int)
    /// Every request: `302 Found` with `Location` set to this URL (any scheme: `ftp://…`, `file:///…`, or the
    /// same route for a redirect loop).
    case redirect(to: String)
    /// Every request: a 200 whose head carries one extra header line of this many bytes, then the file.
    case hugeHeader(bytes: Int)
    /// Every request: this status with an S3-style XML error body whose `<Message>` is "Request has expired".
    case errorBody(status: Int)
    /// Range requests get a 206 whose Content-Range starts 1 byte after where they asked (and that body).
    case wrongRangeStart
    /// The request is read and nothing is ever answered; the connection is held open.
    case silent
    /// Every request: the file with each `{{token}}` replaced by a number that grows by one per request of
    /// the route — a manifest that hands out fresh presigned URLs.
    case mint
    /// A presigned URL: the query's `token=` is good for this many body bytes in all. A response is cut
    /// (a clean close, short of its Content-Length) when its token runs out, and a request with a spent or
    /// missing token gets 403 with S3's "Request has expired" body.
    case presigned(bytesPerToken: Int)
}

/// An HTTP/1.1 server on POSIX sockets that serves the files of one folder and misbehaves at the
/// byte level, one ``Fault`` per route: `/f/<fault>/<file>` (see ``url(_:fault:)``). A bare
/// `/<file>` is served without fault.
///
/// Every response carries `Connection: close`. "Once" faults and `status(_:times:retryAfter:)` count
/// requests per URL path (the query is ignored), so the same file under another fault, or another
/// server, starts afresh. Error responses (4xx, 5xx, 416) have empty bodies, so
/// ``bodyBytesSent(_:)`` counts file bytes only.
public final class FaultServer: Sendable {
    /// One request as the server saw it.
    public struct Request: Sendable, Hashable, CustomStringConvertible {
        /// `GET`, `HEAD`, …
        public let method: String
        /// The URL path as sent (percent-encoded, without the query).
        public let path: String
        /// The route's fault.
        public let fault: Fault
        /// The file the route serves, relative to the root (empty when the request was malformed).
        public let file: String
        /// The `Range` header, if any.
        public let range: String?
        /// The `If-Range` header, if any.
        public let ifRange: String?
        /// The status sent.
        public let status: Int
        /// Every request header, by lowercased name (repeated ones joined with ", ").
        public let headers: [String: String]
        /// Body bytes written to the socket for this request.
        public internal(set) var bodyBytesSent: Int

        public var description: String {
            "\(self.method) \(self.path) range=\(self.range ?? "-") if-range=\(self.ifRange ?? "-") → \(self.status), \(self.bodyBytesSent) bytes"
        }
    }

    /// The port, on 127.0.0.1.
    public let port: Int
    private let core: FaultServerCore

    /// Starts listening on 127.0.0.1 on a free port.
    ///
    /// - Parameter root: The folder whose files are served.
    /// - Throws: When the folder does not exist or no socket can be bound.
    ///   - authorize: Asked with each request's `Authorization` header (nil when none): a status to refuse it
    ///     with (401 gets `WWW-Authenticate: Bearer`), or nil to serve it.
    public init(root: URL, authorize: (@Sendable (String?) -> Int?)? = nil) throws {
        guard let resolved = realpath(root.standardizedFileURL.path, nil) else {
            throw FixtureError("The folder to serve, \(root.path), does not exist.")
        }
        let rootPath = String(cString: resolved)
        free(resolved)

        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw FixtureError("socket() failed: \(String(cString: strerror(errno)))") }
        var yes: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in.loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(listener, 128) == 0 else {
            let message = String(cString: strerror(errno))
            close(listener)
            throw FixtureError("Cannot listen on 127.0.0.1: \(message)")
        }
        let port: Int
        do {
            port = try boundPort(of: listener)
        } catch {
            close(listener)
            throw error
        }
        self.port = port
        self.core = FaultServerCore(root: rootPath, listener: listener, authorize: authorize)
        let core = self.core
        Thread.detachNewThread { core.acceptLoop() }
    }

    deinit {
        self.core.stop()
    }

    /// `http://127.0.0.1:PORT/`
    public var baseURL: URL {
        URL(string: "http://127.0.0.1:\(self.port)/")!
    }

    /// The URL of `file` (relative to the root, `/` allowed) on the route with `fault`,
    /// e.g. `http://127.0.0.1:PORT/f/reset-after/1000/file.tar`.
    public func url(_ file: String, fault: Fault = .none) -> URL {
        let encodedFile = file.split(separator: "/").map {
            String($0).addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/;?#")))
                ?? String($0)
        }.joined(separator: "/")
        return URL(string: "http://127.0.0.1:\(self.port)/f/\(fault.pathComponents.joined(separator: "/"))/\(encodedFile)")!
    }

    /// Total body bytes written to sockets, over all routes, or for `file` (relative to the root) only.
    public func bodyBytesSent(_ file: String? = nil) -> Int {
        self.requests().filter { file == nil || $0.file == file!.trimmingPrefix("/") }.reduce(0) { $0 + $1.bodyBytesSent }
    }

    /// The requests so far, oldest first.
    public func requests() -> [Request] {
        self.core.requests()
    }

    /// Closes the listener and every connection (stalled ones too) and waits for their threads.
    /// Harmless when repeated.
    public func stop() {
        self.core.stop()
    }
}

extension Fault {
    /// The path segments that name this fault in a route.
    var pathComponents: [String] {
        switch self {
        case .none: return ["none"]
        case .ignoreRange: return ["ignore-range"]
        case .changeETag: return ["change-etag"]
        case .resetAfter(let bytes): return ["reset-after", "\(bytes)"]
        case .resetOnce(let bytes): return ["reset-once", "\(bytes)"]
        case .resetOnceThenIgnoreRange(let bytes): return ["reset-once-then-ignore-range", "\(bytes)"]
        case .truncateOnce(let bytes): return ["truncate-once", "\(bytes)"]
        case .stallOnce(let bytes): return ["stall-once", "\(bytes)"]
        case .status(let code, let times, let retryAfter): return ["status", "\(code)", "\(times)", retryAfter.map { "\($0)" } ?? "-"]
        case .slow(let rate): return ["slow", "\(rate)"]
        case .redirect(let location): return ["redirect", Array(location.utf8).map { String(format: "%02x", $0) }.joined()]
        case .hugeHeader(let bytes): return ["huge-header", "\(bytes)"]
        case .errorBody(let status): return ["error-body", "\(status)"]
        case .wrongRangeStart: return ["wrong-range"]
        case .silent: return ["silent"]
        case .mint: return ["mint"]
        case .presigned(let bytes): return ["presigned", "\(bytes)"]
        }
    }

    /// Reads a fault from the front of `segments`; returns it and how many segments it used.
    static func parse(_ segments: ArraySlice<Substring>) -> (fault: Fault, used: Int)? {
        guard let name = segments.first else { return nil }
        let numbers = segments.dropFirst().prefix(3).map { Int($0) }
        func number(_ index: Int) -> Int? { index < numbers.count ? numbers[index] : nil }
        switch name {
        case "none": return (.none, 1)
        case "ignore-range": return (.ignoreRange, 1)
        case "change-etag": return (.changeETag, 1)
        case "reset-after": return number(0).map { (.resetAfter(bytes: $0), 2) }
        case "reset-once": return number(0).map { (.resetOnce(afterBytes: $0), 2) }
        case "reset-once-then-ignore-range": return number(0).map { (.resetOnceThenIgnoreRange(afterBytes: $0), 2) }
        case "truncate-once": return number(0).map { (.truncateOnce(afterBytes: $0), 2) }
        case "stall-once": return number(0).map { (.stallOnce(afterBytes: $0), 2) }
        case "slow": return number(0).flatMap { $0 > 0 ? (.slow(bytesPerSecond: $0), 2) : nil }
        case "redirect":
            guard let hex = segments.dropFirst().first, hex.count % 2 == 0 else { return nil }
            var bytes: [UInt8] = []
            var index = hex.startIndex
            while index < hex.endIndex {
                let next = hex.index(index, offsetBy: 2)
                guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
                bytes.append(byte)
                index = next
            }
            return (.redirect(to: String(decoding: bytes, as: UTF8.self)), 2)
        case "huge-header": return number(0).map { (.hugeHeader(bytes: $0), 2) }
        case "error-body": return number(0).map { (.errorBody(status: $0), 2) }
        case "wrong-range": return (.wrongRangeStart, 1)
        case "silent": return (.silent, 1)
        case "mint": return (.mint, 1)
        case "presigned": return number(0).flatMap { $0 > 0 ? (.presigned(bytesPerToken: $0), 2) : nil }
        case "status":
            guard let code = number(0), let times = number(1), segments.count >= 4 else { return nil }
            return (.status(code, times: times, retryAfter: number(2)), 4)
        default: return nil
        }
    }
}

// MARK: - The server's inside

/// Owns the sockets and threads; the public `FaultServer` only fronts it, so that its `deinit`
/// runs (threads retain the core, not the front).
final class FaultServerCore: Sendable {
    private struct State {
        var stopping = false
        var listenerOpen = true
        var connections: Set<Int32> = []
        var liveThreads = 1  // the accept thread
        var requests: [FaultServer.Request] = []
        var routeHits: [String: Int] = [:]
        /// Body bytes sent per presigned token.
        var tokenBytes: [String: Int] = [:]
    }

    let root: String
    private let listener: Int32
    private let authorize: (@Sendable (String?) -> Int?)?
    private let state = Mutex(State())

    init(root: String, listener: Int32, authorize: (@Sendable (String?) -> Int?)?) {
        self.root = root
        self.listener = listener
        self.authorize = authorize
    }

    func requests() -> [FaultServer.Request] {
        self.state.withLock { $0.requests }
    }

    func stop() {
        self.state.withLock { state in
            guard !state.stopping else { return }
            state.stopping = true
            if state.listenerOpen {
                // Wakes the accept thread, which closes the listener.
                shutdown(self.listener, Int32(SHUT_RDWR))
            }
            for connection in state.connections {
                // Wakes the connection threads (blocked in recv, send or poll); each closes its socket.
                shutdown(connection, Int32(SHUT_RDWR))
            }
        }
        let deadline = Date().addingTimeInterval(5)
        while self.state.withLock({ $0.liveThreads }) > 0, Date() < deadline {
            usleep(2_000)
        }
    }

    private var isStopping: Bool {
        self.state.withLock { $0.stopping }
    }

    func acceptLoop() {
        while true {
            // accept4 is not visible from Swift (it needs _GNU_SOURCE); children spawned by the test
            // support close inherited descriptors themselves (see `spawn`).
            let fd = accept(self.listener, nil, nil)
            if fd >= 0 {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            }
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if !self.isStopping && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    usleep(10_000)
                    continue
                }
                break
            }
            let accepted = self.state.withLock { state -> Bool in
                guard !state.stopping else { return false }
                state.connections.insert(fd)
                state.liveThreads += 1
                return true
            }
            guard accepted else {
                close(fd)
                break
            }
            Thread.detachNewThread { [self] in
                let ending = self.serve(fd)
                self.finish(fd, ending)
            }
        }
        self.state.withLock { state in
            state.listenerOpen = false
            close(self.listener)
            state.liveThreads -= 1
        }
    }

    // MARK: Connections

    private enum Ending {
        /// FIN after the response, then wait (briefly) for the client's FIN so no RST is sent.
        case graceful
        /// RST: SO_LINGER 0 and close.
        case reset
    }

    private func finish(_ fd: Int32, _ ending: Ending) {
        switch ending {
        case .graceful:
            shutdown(fd, Int32(SHUT_WR))
            self.waitForClientClose(fd, timeout: 1)
        case .reset:
            self.waitUntilSent(fd, timeout: 2)
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        }
        _ = self.state.withLock { $0.connections.remove(fd) }
        close(fd)
        self.state.withLock { $0.liveThreads -= 1 }
    }

    /// Waits until the kernel has sent (and had acknowledged) everything written, so that a reset
    /// does not throw away bytes the client is meant to receive.
    private func waitUntilSent(_ fd: Int32, timeout: TimeInterval) {
        let deadline = Date().addingTimeInterval(timeout)
        var pending: Int32 = 0
        while ioctl(fd, UInt(TIOCOUTQ), &pending) == 0, pending > 0, Date() < deadline, !self.isStopping {
            usleep(1_000)
        }
    }

    /// Reads and discards until the client closes, the server stops, or `timeout` passes.
    private func waitForClientClose(_ fd: Int32, timeout: TimeInterval?) {
        let deadline = timeout.map { Date().addingTimeInterval($0) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !self.isStopping {
            if let deadline, Date() >= deadline { return }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, 50)
            if ready < 0 && errno != EINTR { return }
            if ready > 0 {
                let count = recv(fd, &buffer, buffer.count, 0)
                if count <= 0 { return }
            }
        }
    }

    private struct ParsedRequest {
        var method: String
        var target: String
        var headers: [String: String]
    }

    /// Reads the request head: up to the blank line, at most 64 KiB, within 10 seconds.
    private func readRequest(_ fd: Int32) -> ParsedRequest? {
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var data = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        let terminator: [UInt8] = [13, 10, 13, 10]
        while data.count < 65536 {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { return nil }
            data.append(contentsOf: buffer[0..<count])
            if let end = data.firstRange(of: terminator) {
                let head = String(decoding: data[..<end.lowerBound], as: UTF8.self)
                var lines = head.components(separatedBy: "\r\n")
                let requestLine = lines.removeFirst().split(separator: " ")
                guard requestLine.count == 3 else { return nil }
                var headers: [String: String] = [:]
                for line in lines {
                    guard let colon = line.firstIndex(of: ":") else { continue }
                    let name = line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()
                    let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                    headers[name] = headers[name].map { "\($0), \(value)" } ?? value
                }
                return ParsedRequest(method: String(requestLine[0]), target: String(requestLine[1]), headers: headers)
            }
        }
        return nil
    }

    private func serve(_ fd: Int32) -> Ending {
        guard let request = self.readRequest(fd) else { return .graceful }
        let path = String(request.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0])

        // Route: /f/<fault...>/<file> or /<file>.
        var segments = path.split(separator: "/")[...]
        var fault = Fault.none
        if segments.first == "f" {
            guard let (parsed, used) = Fault.parse(segments.dropFirst()) else {
                return self.respondEmpty(fd, request, path: path, fault: .none, file: "", status: 400)
            }
            fault = parsed
            segments = segments.dropFirst(1 + used)
        }
        let decodedSegments = segments.map { $0.removingPercentEncoding ?? String($0) }
        let file = decodedSegments.joined(separator: "/")
        guard !file.isEmpty, !decodedSegments.contains(where: { $0 == ".." || $0 == "." || $0.contains("\0") }) else {
            return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 400)
        }
        guard request.method == "GET" || request.method == "HEAD" else {
            return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 405, extra: ["Allow": "GET, HEAD"])
        }
        if let refusal = self.authorize?(request.headers["authorization"]) {
            return self.respondEmpty(
                fd, request, path: path, fault: fault, file: file, status: refusal,
                extra: refusal == 401 ? ["WWW-Authenticate": "Bearer"] : [:])
        }
        let hit = self.state.withLock { state -> Int in
            state.routeHits[path, default: 0] += 1
            return state.routeHits[path]!
        }
        let query = request.target.split(separator: "?", maxSplits: 1).dropFirst().first ?? ""
        let token = query.split(separator: "&").first { $0.hasPrefix("token=") }.map { String($0.dropFirst(6)) }

        switch fault {
        case .redirect(let location):
            return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 302, extra: ["Location": location])
        case .errorBody(let code):
            _ = self.record(request, path: path, fault: fault, file: file, status: code)
            let body =
                #"<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"#
            _ = self.sendHead(fd, status: code, headers: [("Content-Type", "application/xml"), ("Content-Length", "\(body.utf8.count)")])
            _ = Array(body.utf8).withUnsafeBytes { self.sendAll(fd, $0) }
            return .graceful
        case .silent:
            _ = self.record(request, path: path, fault: fault, file: file, status: 0)
            self.waitForClientClose(fd, timeout: nil)
            return .graceful
        case .mint:
            guard let data = FileManager.default.contents(atPath: self.root + "/" + file) else {
                return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 404)
            }
            let body = Array(String(decoding: data, as: UTF8.self).replacingOccurrences(of: "{{token}}", with: "\(hit)").utf8)
            let index = self.record(request, path: path, fault: fault, file: file, status: 200)
            _ = self.sendHead(fd, status: 200, headers: [("Content-Type", "application/json"), ("Content-Length", "\(body.count)")])
            if body.withUnsafeBytes({ self.sendAll(fd, $0) }) { self.state.withLock { $0.requests[index].bodyBytesSent += body.count } }
            return .graceful
        case .presigned(let budget):
            let spent = token.map { token in self.state.withLock { $0.tokenBytes[token, default: 0] } } ?? budget
            if spent >= budget {
                _ = self.record(request, path: path, fault: fault, file: file, status: 403)
                let body =
                    #"<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"#
                _ = self.sendHead(
                    fd, status: 403, headers: [("Content-Type", "application/xml"), ("Content-Length", "\(body.utf8.count)")])
                _ = Array(body.utf8).withUnsafeBytes { self.sendAll(fd, $0) }
                return .graceful
            }
        default:
            break
        }

        if case .status(let code, let times, let retryAfter) = fault, hit <= times {
            return self.respondEmpty(
                fd, request, path: path, fault: fault, file: file, status: code,
                extra: retryAfter.map { ["Retry-After": "\($0)"] } ?? [:]
            )
        }

        // The file, inside the root.
        guard let resolvedPointer = realpath(self.root + "/" + file, nil) else {
            return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 404)
        }
        let resolved = String(cString: resolvedPointer)
        free(resolvedPointer)
        var info = stat()
        guard resolved.hasPrefix(self.root + "/"), stat(resolved, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            return self.respondEmpty(fd, request, path: path, fault: fault, file: file, status: 404)
        }
        let size = Int(info.st_size)
        let modifiedNanoseconds = Int(info.st_mtim.tv_sec) &* 1_000_000_000 &+ Int(info.st_mtim.tv_nsec)
        var etag = "\"\(String(size, radix: 16))-\(String(modifiedNanoseconds, radix: 16))\""
        if fault == .changeETag {
            etag = "\"\(String(size, radix: 16))-\(String(modifiedNanoseconds, radix: 16))-\(hit)-\(UInt32.random(in: 0...UInt32.max))\""
        }
        let lastModified = httpDate(seconds: Int(info.st_mtim.tv_sec))

        var headers: [(String, String)] = [
            ("ETag", etag),
            ("Last-Modified", lastModified),
            ("Content-Type", file.hasSuffix(".json") ? "application/json" : "application/octet-stream"),
        ]
        var ignoresRange = fault == .ignoreRange
        if case .resetOnceThenIgnoreRange = fault, hit > 1 { ignoresRange = true }
        if !ignoresRange {
            headers.append(("Accept-Ranges", "bytes"))
        }

        // Range and If-Range.
        var status = 200
        var offset = 0
        var length = size
        if request.method == "GET", !ignoresRange, let range = request.headers["range"] {
            var conditionHolds = true
            if let ifRange = request.headers["if-range"] {
                conditionHolds = fault != .changeETag && (ifRange == etag || ifRange == lastModified)
            }
            if conditionHolds {
                switch parseRange(range, size: size) {
                case .satisfiable(var lower, let upper):
                    if fault == .wrongRangeStart, lower + 1 <= upper { lower += 1 }
                    status = 206
                    offset = lower
                    length = upper - lower + 1
                    headers.append(("Content-Range", "bytes \(lower)-\(upper)/\(size)"))
                case .unsatisfiable:
                    return self.respondEmpty(
                        fd, request, path: path, fault: fault, file: file, status: 416,
                        extra: ["Content-Range": "bytes */\(size)", "ETag": etag, "Last-Modified": lastModified]
                    )
                case .ignored:
                    break
                }
            }
        }
        headers.append(("Content-Length", "\(length)"))
        if case .hugeHeader(let bytes) = fault {
            headers.append(("X-Padding", String(repeating: "a", count: bytes)))
        }

        let index = self.record(request, path: path, fault: fault, file: file, status: status)
        guard self.sendHead(fd, status: status, headers: headers) else { return .graceful }
        guard request.method == "GET" else { return .graceful }

        let firstRequest = hit == 1
        switch fault {
        case .resetAfter(let bytes):
            self.sendFile(fd, resolved, offset: offset, length: min(bytes, length), record: index)
            return .reset
        case .resetOnce(let bytes) where firstRequest, .resetOnceThenIgnoreRange(let bytes) where firstRequest:
            self.sendFile(fd, resolved, offset: offset, length: min(bytes, length), record: index)
            return .reset
        case .truncateOnce(let bytes) where firstRequest:
            self.sendFile(fd, resolved, offset: offset, length: min(bytes, length), record: index)
            return .graceful
        case .stallOnce(let bytes) where firstRequest:
            self.sendFile(fd, resolved, offset: offset, length: min(bytes, length), record: index)
            self.waitForClientClose(fd, timeout: nil)
            return .graceful
        case .slow(let rate):
            self.sendFile(fd, resolved, offset: offset, length: length, record: index, bytesPerSecond: rate)
            return .graceful
        case .presigned(let budget):
            let token = token ?? ""
            let allowed = min(length, budget - self.state.withLock { $0.tokenBytes[token, default: 0] })
            self.sendFile(fd, resolved, offset: offset, length: allowed, record: index)
            let sent = self.state.withLock { $0.requests[index].bodyBytesSent }
            self.state.withLock { $0.tokenBytes[token, default: 0] += sent }
            return .graceful
        default:
            self.sendFile(fd, resolved, offset: offset, length: length, record: index)
            return .graceful
        }
    }

    private func record(_ request: ParsedRequest, path: String, fault: Fault, file: String, status: Int) -> Int {
        self.state.withLock { state in
            state.requests.append(
                FaultServer.Request(
                    method: request.method, path: path, fault: fault, file: file,
                    range: request.headers["range"], ifRange: request.headers["if-range"],
                    status: status, headers: request.headers, bodyBytesSent: 0
                )
            )
            return state.requests.count - 1
        }
    }

    private func respondEmpty(
        _ fd: Int32, _ request: ParsedRequest, path: String, fault: Fault, file: String, status: Int,
        extra: [String: String] = [:]
    ) -> Ending {
        _ = self.record(request, path: path, fault: fault, file: file, status: status)
        var headers = extra.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        headers.append(("Content-Length", "0"))
        _ = self.sendHead(fd, status: status, headers: headers)
        return .graceful
    }

    private func sendHead(_ fd: Int32, status: Int, headers: [(String, String)]) -> Bool {
        var head = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        head += "Date: \(httpDate(seconds: Int(time(nil))))\r\nServer: FaultServer\r\nConnection: close\r\n"
        for (name, value) in headers {
            head += "\(name): \(value)\r\n"
        }
        head += "\r\n"
        return Array(head.utf8).withUnsafeBytes { self.sendAll(fd, $0) }
    }

    /// Sends `length` bytes of the file from `offset`, counting them into request `record`;
    /// paced when `bytesPerSecond` is given. Stops early when the client goes away.
    private func sendFile(_ fd: Int32, _ path: String, offset: Int, length: Int, record: Int, bytesPerSecond: Int? = nil) {
        let file = open(path, O_RDONLY | O_CLOEXEC)
        guard file >= 0 else { return }
        defer { close(file) }
        let sliceSize = bytesPerSecond.map { max(1, min(65536, $0 / 20)) } ?? 65536
        var buffer = [UInt8](repeating: 0, count: sliceSize)
        let started = Date()
        var sent = 0
        while sent < length, !self.isStopping {
            let wanted = min(sliceSize, length - sent)
            let count = buffer.withUnsafeMutableBytes { pread(file, $0.baseAddress, wanted, off_t(offset + sent)) }
            guard count > 0 else { return }
            guard buffer.withUnsafeBytes({ self.sendAll(fd, UnsafeRawBufferPointer(rebasing: $0[0..<count])) }) else { return }
            sent += count
            self.state.withLock { $0.requests[record].bodyBytesSent += count }
            if let bytesPerSecond {
                let due = started.addingTimeInterval(Double(sent) / Double(bytesPerSecond))
                let wait = due.timeIntervalSinceNow
                if wait > 0 { usleep(useconds_t(wait * 1_000_000)) }
            }
        }
    }

    private func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var done = 0
        while done < bytes.count {
            let count = send(fd, bytes.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL))
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { return false }
            done += count
        }
        return true
    }
}

enum RangeDecision: Equatable {
    case satisfiable(Int, Int)
    case unsatisfiable
    case ignored
}

/// A single byte range of a `Range` header against a body of `size` bytes (RFC 9110 §14.1.2);
/// several ranges or bad syntax are ignored (whole body with 200).
func parseRange(_ header: String, size: Int) -> RangeDecision {
    let trimmed = header.trimmingCharacters(in: .whitespaces)
    guard trimmed.lowercased().hasPrefix("bytes=") else { return .ignored }
    let spec = trimmed.dropFirst(6).trimmingCharacters(in: .whitespaces)
    guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return .ignored }
    let first = String(spec[..<dash])
    let last = String(spec[spec.index(after: dash)...])
    if first.isEmpty {
        guard let suffix = Int(last), suffix >= 0 else { return .ignored }
        guard suffix > 0, size > 0 else { return .unsatisfiable }
        return .satisfiable(max(0, size - suffix), size - 1)
    }
    guard let lower = Int(first), lower >= 0 else { return .ignored }
    var upper = Int.max
    if !last.isEmpty {
        guard let value = Int(last), value >= lower else { return .ignored }
        upper = value
    }
    guard lower < size else { return .unsatisfiable }
    return .satisfiable(lower, min(upper, size - 1))
}

private func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 200: return "OK"
    case 206: return "Partial Content"
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 408: return "Request Timeout"
    case 416: return "Range Not Satisfiable"
    case 429: return "Too Many Requests"
    case 500: return "Internal Server Error"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    default: return "Status \(status)"
    }
}
