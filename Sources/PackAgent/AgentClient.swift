import Foundation

/// One request to the agent over its Unix socket (HTTP/1.1, `Connection: close`), for `packs fetch --detach`:
/// small enough that the CLI needs no HTTP library that speaks Unix sockets.
public struct AgentClient: Sendable {
    public struct Answer: Sendable {
        public let status: Int
        public let body: Data
    }

    /// Nothing accepted a connection on the socket.
    public struct Unreachable: Error, Sendable {
        public let path: String
        public let reason: String
    }

    public let socketPath: String
    public let clientVersion: String

    public init(socketPath: String, clientVersion: String) {
        self.socketPath = socketPath
        self.clientVersion = clientVersion
    }

    /// Sends one request and reads the whole answer.
    public func send(_ method: String, _ path: String, json: Data? = nil, timeout: TimeInterval = 60) throws(Unreachable) -> Answer {
        let descriptor = try self.connect(timeout: timeout)
        defer { close(descriptor) }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nPacks-Client-Version: \(self.clientVersion)\r\n"
        if let json { head += "Content-Type: application/json\r\nContent-Length: \(json.count)\r\n" }
        let request = Data((head + "\r\n").utf8) + (json ?? Data())
        guard Self.writeAll(descriptor, request) else {
            throw Unreachable(path: self.socketPath, reason: "the agent closed the connection")
        }
        var received = Data()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0, errno == EINTR { continue }
            if count <= 0 { break }
            received.append(contentsOf: buffer[0..<count])
        }
        guard let answer = Self.parse(received) else {
            throw Unreachable(path: self.socketPath, reason: "the agent sent no HTTP answer")
        }
        return answer
    }

    func connect(timeout: TimeInterval) throws(Unreachable) -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw Unreachable(path: self.socketPath, reason: String(cString: strerror(errno))) }
        var seconds = timeval(tv_sec: Int(timeout), tv_usec: 0)
        _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &seconds, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &seconds, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(self.socketPath.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(descriptor)
            throw Unreachable(path: self.socketPath, reason: "the socket path is too long")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { target in
            for (index, byte) in bytes.enumerated() { target[index] = byte }
        }
        let result = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            throw Unreachable(path: self.socketPath, reason: reason)
        }
        return descriptor
    }

    static func writeAll(_ descriptor: Int32, _ data: Data) -> Bool {
        var remaining = data[...]
        while !remaining.isEmpty {
            let written = remaining.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if written < 0, errno == EINTR { continue }
            if written <= 0 { return false }
            remaining = remaining.dropFirst(written)
        }
        return true
    }

    /// The status and body of an HTTP/1.1 answer read to its end (a chunked body is joined).
    static func parse(_ data: Data) -> Answer? {
        guard let end = data.firstRange(of: Data("\r\n\r\n".utf8)) else { return nil }
        let head = String(decoding: data[data.startIndex..<end.lowerBound], as: UTF8.self)
        let lines = head.components(separatedBy: "\r\n")
        let parts = lines.first?.split(separator: " ") ?? []
        guard parts.count >= 2, let status = Int(parts[1]) else { return nil }
        var body = Data(data[end.upperBound...])
        if lines.contains(where: { $0.lowercased().hasPrefix("transfer-encoding:") && $0.lowercased().contains("chunked") }) {
            body = Self.unchunk(body)
        }
        return Answer(status: status, body: body)
    }

    private static func unchunk(_ data: Data) -> Data {
        var result = Data()
        var rest = data[...]
        while let lineEnd = rest.firstRange(of: Data("\r\n".utf8)) {
            let sizeText = String(decoding: rest[rest.startIndex..<lineEnd.lowerBound], as: UTF8.self)
            guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16), size > 0 else { break }
            let start = lineEnd.upperBound
            guard rest.distance(from: start, to: rest.endIndex) >= size else { break }
            let stop = rest.index(start, offsetBy: size)
            result.append(rest[start..<stop])
            rest = rest[stop...].dropFirst(2)
        }
        return result
    }
}
