import CCurl
import Foundation
import Synchronization

/// Follows the agent's event stream (`GET /v1/events`, server-sent events) on a thread of its own, reconnecting with
/// `Last-Event-ID` after a break so that nothing is missed, and hands each event to `handle`.
final class AgentEventFollower: Sendable {
    /// One server-sent event.
    struct Event: Sendable, Equatable {
        var id: UInt64?
        var kind: String
        var data: String
    }

    /// What the follower reports: an event, or whether the stream is connected now.
    enum Report: Sendable {
        case event(Event)
        case connected(Bool)
    }

    private let link: AgentLink
    private let handle: @Sendable (Report) -> Void
    private let stopped = Atomic<Bool>(false)

    init(link: AgentLink, handle: @escaping @Sendable (Report) -> Void) {
        self.link = link
        self.handle = handle
    }

    func start() {
        let thread = Thread { [self] in self.run() }
        thread.name = "PackDelivery.AgentEvents"
        thread.start()
    }

    /// Ends the stream within about a second (libcurl's progress callback); does not wait.
    func stop() { self.stopped.store(true, ordering: .relaxed) }

    private var isStopped: Bool { self.stopped.load(ordering: .relaxed) }

    private func run() {
        var lastID: UInt64?
        var delay = 0.05
        while !self.isStopped {
            let (connected, last) = self.follow(after: lastID)
            lastID = last ?? lastID
            if connected { self.handle(.connected(false)) }
            delay = connected ? 0.05 : min(delay * 2, 2)
            if !self.isStopped { Thread.sleep(forTimeInterval: delay) }
        }
    }

    /// The state one connection's callbacks share.
    private final class Stream {
        let follower: AgentEventFollower
        var parser = SSEParser()
        var connected = false
        var lastID: UInt64?

        init(_ follower: AgentEventFollower) { self.follower = follower }
    }

    /// One connection, until it breaks or the follower stops: whether it connected, and the last event id seen.
    private func follow(after lastID: UInt64?) -> (connected: Bool, lastID: UInt64?) {
        guard let easy = try? CurlEasy(url: URL(string: "http://localhost/v1/events")!) else { return (false, nil) }
        let stream = Stream(self)
        do {
            try easy.set(CURLOPT_UNIX_SOCKET_PATH, string: self.link.socket)
            try easy.set(CURLOPT_CONNECTTIMEOUT_MS, long: 2000)
            try easy.setHeaders(AgentLink.headers + (lastID.map { ["Last-Event-ID: \($0)"] } ?? []))
            let context = Unmanaged.passUnretained(stream).toOpaque()
            try easy.set(CURLOPT_WRITEDATA, pointer: context)
            try easy.set(
                CURLOPT_WRITEFUNCTION,
                callback: { pointer, size, count, user in
                    let stream = Unmanaged<Stream>.fromOpaque(user!).takeUnretainedValue()
                    let length = size * count
                    if stream.follower.isStopped { return 0 }
                    if !stream.connected {
                        stream.connected = true
                        stream.follower.handle(.connected(true))
                    }
                    let bytes = UnsafeRawBufferPointer(start: pointer, count: length)
                    for event in stream.parser.feed(bytes) {
                        if let id = event.id { stream.lastID = id }
                        stream.follower.handle(.event(event))
                    }
                    return length
                })
            try easy.set(CURLOPT_XFERINFODATA, pointer: context)
            try easy.set(CURLOPT_NOPROGRESS, long: 0)
            _ = ccurl_easy_setopt_xferinfo_callback(
                easy.handle, CURLOPT_XFERINFOFUNCTION,
                { user, _, _, _, _ in Unmanaged<Stream>.fromOpaque(user!).takeUnretainedValue().follower.isStopped ? 1 : 0 })
        } catch {
            return (false, nil)
        }
        _ = withExtendedLifetime(stream) { curl_easy_perform(easy.handle) }
        // A refusal (another version: 409) is no stream.
        guard easy.responseCode == 200 else { return (false, stream.lastID) }
        return (stream.connected, stream.lastID)
    }
}

/// Splits server-sent events (`id:`, `event:`, `data:` lines, a blank line after each) out of the bytes as they
/// arrive; comment lines (`: keep-alive`) are skipped.
struct SSEParser {
    private var pending: [UInt8] = []
    private var current = AgentEventFollower.Event(id: nil, kind: "message", data: "")
    private var hasData = false

    mutating func feed(_ bytes: UnsafeRawBufferPointer) -> [AgentEventFollower.Event] {
        var events: [AgentEventFollower.Event] = []
        for byte in bytes {
            guard byte == UInt8(ascii: "\n") else {
                self.pending.append(byte)
                continue
            }
            var line = self.pending
            self.pending.removeAll(keepingCapacity: true)
            if line.last == UInt8(ascii: "\r") { line.removeLast() }
            if line.isEmpty {
                if self.hasData { events.append(self.current) }
                self.current = AgentEventFollower.Event(id: nil, kind: "message", data: "")
                self.hasData = false
                continue
            }
            let text = String(decoding: line, as: UTF8.self)
            guard let colon = text.firstIndex(of: ":"), colon != text.startIndex else { continue }
            let field = text[..<colon]
            var value = text[text.index(after: colon)...]
            if value.first == " " { value = value.dropFirst() }
            switch field {
            case "id": self.current.id = UInt64(value)
            case "event": self.current.kind = String(value)
            case "data":
                self.current.data += self.hasData ? "\n" + value : String(value)
                self.hasData = true
            default: break
            }
        }
        return events
    }
}
