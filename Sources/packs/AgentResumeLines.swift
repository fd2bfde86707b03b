import Foundation
import PackAgent
import PackDelivery
import Synchronization

/// The agent's events, followed on a thread of their own from before a request, kept until taken. The thread stays
/// blocked on the connection until the process exits (a command's run is short).
final class AgentEventInbox: Sendable {
    private let events = Mutex<[AgentEvent]>([])
    private let opened = DispatchSemaphore(value: 0)
    /// Signalled at each event: a follower waits on it instead of polling.
    private let arrived = DispatchSemaphore(value: 0)

    /// Starts following and waits (up to 5 s) until the agent accepted the stream.
    init(_ client: AgentClient) {
        Thread.detachNewThread {
            _ = try? client.followEvents(after: nil, opened: { self.opened.signal() }) { event in
                self.events.withLock { $0.append(event) }
                self.arrived.signal()
            }
            self.opened.signal()
        }
        _ = self.opened.wait(timeout: .now() + 5)
    }

    /// The events come so far; when there are none, waits up to `seconds` for the next.
    func take(waiting seconds: TimeInterval) -> [AgentEvent] {
        if self.events.withLock({ $0.isEmpty }) { _ = self.arrived.wait(timeout: .now() + seconds) }
        return self.take()
    }

    func take() -> [AgentEvent] {
        self.events.withLock { events in
            defer { events.removeAll() }
            return events
        }
    }
}

/// What `resume` through the agent prints of the downloads it follows, as the in-process resume does when its output
/// is not a terminal: a line when a download's state or phase changes (`installed …`, `paused …`), and at the end the
/// transactions finished. With `--json`, the events' data lines (they carry `home`).
struct AgentResumeLines {
    let ids: Set<String>
    let mode: ProgressDisplay.Mode
    private var shown: [String: String] = [:]
    private var transactions: Set<String> = []
    private var finished: [TransactionJSON] = []
    /// With `--json`, the run's last line, as the in-process resume prints it.
    private var summary = RunSummary()
    private var begun: Set<String> = []
    /// The state of each followed download's last event.
    private var eventState: [String: String] = [:]
    /// Each followed download's last event.
    private(set) var lastEvent: [String: DownloadJSON] = [:]

    init(ids: Set<String>, mode: ProgressDisplay.Mode) {
        self.ids = ids
        self.mode = mode
    }

    mutating func show(_ events: [AgentEvent]) {
        for event in events {
            let data = Data(event.data.utf8)
            if event.kind == "download", let download = try? AgentJSON.decoder.decode(DownloadJSON.self, from: data),
                self.ids.contains(download.id)
            {
                self.transactions.insert(download.transactionID)
                self.note(download, event: true)
                self.eventState[download.id] = download.state.rawValue
                self.lastEvent[download.id] = download
                if case .json = self.mode { printLine(JSONOutput.asciiControls(event.data)) }
                guard case .plain = self.mode.plainOrTerminal else { continue }
                let key = "\(download.state.rawValue)/\(download.phase.value?.rawValue ?? "")"
                guard self.shown[download.id] != key else { continue }
                self.shown[download.id] = key
                printLine(Self.summary(download))
            } else if event.kind == "transaction", let transaction = try? AgentJSON.decoder.decode(TransactionJSON.self, from: data),
                transaction.state == "finished", self.transactions.contains(transaction.id)
            {
                if case .json = self.mode { printLine(JSONOutput.asciiControls(event.data)) }
                if !self.finished.contains(where: { $0.id == transaction.id }) { self.finished.append(transaction) }
            }
        }
    }

    /// A followed download as the status or an event shows it, for the summary: the first sight begins it, and only
    /// events update it (the status may be a moment older than the last event).
    mutating func note(_ download: DownloadJSON, event: Bool = false) {
        guard self.ids.contains(download.id) else { return }
        if self.begun.insert(download.id).inserted {
            self.summary.begin(RunSummary.Seen(download))
        } else if event {
            self.summary.update(RunSummary.Seen(download))
        }
    }

    /// Whether the event saying that this download's transaction finished came.
    func transactionFinished(of id: String) -> Bool {
        guard let transaction = self.lastEvent[id]?.transactionID else { return false }
        return self.finished.contains { $0.id == transaction }
    }

    /// Whether a line for this state was printed (or none is printed in this mode).
    func showed(_ id: String, state: String) -> Bool {
        switch self.mode.plainOrTerminal {
        case .plain: self.shown[id]?.hasPrefix(state + "/") == true
        // The summary counts how each ended from the events.
        case .json: self.eventState[id] == state
        default: true
        }
    }

    /// The transactions the agent finished, as the in-process run says it finished them; with `--json`, the summary.
    mutating func end() {
        if case .json = self.mode { printJSON(self.summary.end()) }
        guard case .plain = self.mode.plainOrTerminal, !self.finished.isEmpty else { return }
        if self.finished.count == 1, let transaction = self.finished.first {
            printLine("finished transaction \(transaction.id) (\(PackDeliveryError.printable(transaction.productIdentifier)))")
        } else {
            printLine("finished \(self.finished.count) transactions")
        }
    }

    /// ``ProgressDisplay/summary(_:color:)`` of an event's download.
    static func summary(_ download: DownloadJSON) -> String {
        let content = PackDeliveryError.printable(download.contentIdentifier)
        let version = PackDeliveryError.printable(download.contentVersion)
        let bytes = "\(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(download.contentLength))"
        switch download.state {
        case .finished:
            let how =
                download.delta.map { ProgressDisplay.deltaSummary($0, contentLength: download.contentLength) }
                ?? ByteFormat.string(download.contentLength)
            return "installed \(content) \(version) (\(how)) → \(download.contentURL.value.map(PackDeliveryError.printable) ?? "?")"
        case .failed: return "failed \(content) \(download.id): \(download.error.value?.description ?? "unknown error")"
        case .paused: return "paused \(content) \(download.id) (\(download.pauseReason.value?.rawValue ?? "user")) at \(bytes)"
        case .cancelled: return "cancelled \(content) \(download.id)"
        case .waiting: return "waiting \(content) \(version) \(download.id)"
        case .active: return "\(download.phase.value?.rawValue ?? "active") \(content) \(version) \(download.id) \(bytes)"
        }
    }
}

extension ProgressDisplay.Mode {
    /// A terminal gets the plain lines too: the agent's downloads are not drawn as bars.
    var plainOrTerminal: Self {
        if case .terminal = self { return .plain }
        return self
    }
}
