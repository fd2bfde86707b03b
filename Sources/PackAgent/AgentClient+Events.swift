import Foundation

/// A server-sent event of `GET /v1/events`.
public struct AgentEvent: Sendable, Equatable {
    public let id: UInt64?
    public let kind: String
    public let data: String

    public init(id: UInt64?, kind: String, data: String) {
        self.id = id
        self.kind = kind
        self.data = data
    }
}

extension AgentClient {
    /// What ended a followed event stream.
    public enum StreamEnd: Error, Sendable {
        /// The agent answered with another status than 200 (its error body).
        case refused(status: Int, body: Data)
        /// The connection closed (the agent stopped or restarted).
        case closed
    }

    /// Follows `GET /v1/events` (from after `lastEventID` when given), calling `opened` once the agent accepted the
    /// stream and `received` for each event as it arrives, until the connection ends; blocks the calling thread.
    /// - Throws: ``Unreachable`` when no agent accepts the connection; ``StreamEnd`` when the stream ends.
    public func followEvents(
        after lastEventID: UInt64?, opened: () -> Void = {}, _ received: (AgentEvent) -> Void
    ) throws -> Never {
        // No receive timeout: an idle stream carries a keep-alive comment now and then, and a dead agent closes it.
        let descriptor = try self.connect(timeout: 0)
        defer { close(descriptor) }
        var head =
            "GET /v1/events HTTP/1.1\r\nHost: localhost\r\nPacks-Client-Version: \(self.clientVersion)\r\nAccept: text/event-stream\r\n"
        if let lastEventID { head += "Last-Event-ID: \(lastEventID)\r\n" }
        guard Self.writeAll(descriptor, Data((head + "\r\n").utf8)) else { throw StreamEnd.closed }
        var parser = EventStreamParser()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0, errno == EINTR { continue }
            if count <= 0 { break }
            let wasOpen = parser.isOpen
            if let refused = parser.feed(buffer[0..<count]) { throw refused }
            if !wasOpen, parser.isOpen { opened() }
            for event in parser.takeEvents() { received(event) }
        }
        if let refused = parser.refusal() { throw refused }
        throw StreamEnd.closed
    }
}

/// Reads an HTTP/1.1 answer carrying server-sent events as its bytes arrive: the head, then a chunked or plain body,
/// then the events it holds (`id:`, `event:`, `data:` lines up to a blank line; comment lines skipped).
struct EventStreamParser {
    private var raw: [UInt8] = []
    private var status: Int?
    private var chunked = false
    private var text: [UInt8] = []
    private var events: [AgentEvent] = []
    private var errorBody = Data()

    /// Takes bytes; returns the end of the stream when the agent refused it (a complete non-200 answer is not needed:
    /// its body is kept as it comes, see ``refusal()``).
    mutating func feed(_ bytes: ArraySlice<UInt8>) -> AgentClient.StreamEnd? {
        self.raw.append(contentsOf: bytes)
        if self.status == nil {
            guard let end = Self.find([13, 10, 13, 10], in: self.raw) else { return nil }
            let head = String(decoding: self.raw[..<end], as: UTF8.self).components(separatedBy: "\r\n")
            let parts = head.first?.split(separator: " ") ?? []
            self.status = parts.count >= 2 ? Int(parts[1]) ?? 0 : 0
            self.chunked = head.contains { $0.lowercased().hasPrefix("transfer-encoding:") && $0.lowercased().contains("chunked") }
            self.raw.removeFirst(end + 4)
        }
        self.unchunk()
        if self.status != 200 {
            self.errorBody.append(contentsOf: self.text)
            self.text.removeAll()
            return nil
        }
        self.parseEvents()
        return nil
    }

    /// Whether the answer's head said 200: the stream is open.
    var isOpen: Bool { self.status == 200 }

    /// The refusal, once the connection closed on a non-200 answer.
    func refusal() -> AgentClient.StreamEnd? {
        guard let status = self.status, status != 200 else { return nil }
        return .refused(status: status, body: self.errorBody)
    }

    mutating func takeEvents() -> [AgentEvent] {
        defer { self.events.removeAll() }
        return self.events
    }

    /// Moves the body's bytes from `raw` to `text`, joining chunks whole.
    private mutating func unchunk() {
        guard self.chunked else {
            self.text.append(contentsOf: self.raw)
            self.raw.removeAll()
            return
        }
        while let lineEnd = Self.find([13, 10], in: self.raw) {
            let sizeText = String(decoding: self.raw[..<lineEnd], as: UTF8.self)
            guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16) else {
                self.raw.removeAll()
                return
            }
            guard self.raw.count >= lineEnd + 2 + size + 2 else { return }
            self.text.append(contentsOf: self.raw[(lineEnd + 2)..<(lineEnd + 2 + size)])
            self.raw.removeFirst(lineEnd + 2 + size + 2)
            if size == 0 { return }
        }
    }

    private mutating func parseEvents() {
        while let end = Self.find([10, 10], in: self.text) {
            let block = String(decoding: self.text[..<end], as: UTF8.self)
            self.text.removeFirst(end + 2)
            var id: UInt64?
            var kind = "message"
            var data: [String] = []
            for line in block.split(separator: "\n", omittingEmptySubsequences: true) where !line.hasPrefix(":") {
                let (field, value) = Self.field(line)
                switch field {
                case "id": id = UInt64(value)
                case "event": kind = value
                case "data": data.append(value)
                default: break
                }
            }
            if id != nil || !data.isEmpty { self.events.append(AgentEvent(id: id, kind: kind, data: data.joined(separator: "\n"))) }
        }
    }

    private static func field(_ line: Substring) -> (String, String) {
        guard let colon = line.firstIndex(of: ":") else { return (String(line), "") }
        var value = line[line.index(after: colon)...]
        if value.first == " " { value = value.dropFirst() }
        return (String(line[..<colon]), String(value))
    }

    private static func find(_ pattern: [UInt8], in bytes: [UInt8]) -> Int? {
        guard bytes.count >= pattern.count else { return nil }
        for start in 0...(bytes.count - pattern.count) where bytes[start] == pattern[0] {
            if Array(bytes[start..<(start + pattern.count)]) == pattern { return start }
        }
        return nil
    }
}
