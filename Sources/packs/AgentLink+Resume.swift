import Foundation
import PackAgent
import PackDelivery
import Synchronization

// `packs resume` through the agent: the agent runs the downloads, the command waits until they settle and exits as
// the in-process resume does (0 all finished, 75 paused again, the error's code for a failure).
extension AgentLink {
    /// A download as the status lists it, with what deciding the exit code needs.
    struct Followed {
        let id: String
        let state: String
        let pauseReason: String?
        let contentIdentifier: String
        let error: PackDeliveryError?

        init(id: String, state: String, pauseReason: String?, contentIdentifier: String, error: PackDeliveryError?) {
            self.id = id
            self.state = state
            self.pauseReason = pauseReason
            self.contentIdentifier = contentIdentifier
            self.error = error
        }

        init(_ download: DownloadJSON) {
            self.init(
                id: download.id, state: download.state.rawValue, pauseReason: download.pauseReason.value?.rawValue,
                contentIdentifier: download.contentIdentifier, error: download.error.value)
        }
    }

    /// The downloads of the home, as `GET /v1/downloads` lists them.
    func followed() throws -> [Followed] { try self.listed().map(Followed.init) }

    /// The downloads of the home, as `GET /v1/downloads` lists them.
    func listed() throws -> [DownloadJSON] {
        let body = try self.status()
        guard let status = try? AgentJSON.decoder.decode(StatusJSON.self, from: body) else {
            throw PackDeliveryError(.internalError, message: "The agent's status could not be read.")
        }
        return status.transactions.flatMap(\.downloads)
    }

    /// Resumes `ids` (every paused or failed download but those added not started, when none is named) in the agent,
    /// showing their events as they come, and waits until each is finished, failed, paused or cancelled.
    /// - Returns: the exit code.
    func resume(_ ids: [String], mode: ProgressDisplay.Mode) throws -> Int32 {
        var wanted = ids
        if ids.isEmpty {
            wanted = try self.followed().filter {
                ($0.state == "paused" || $0.state == "failed") && $0.pauseReason != PauseReason.notStarted.rawValue
            }.map(\.id)
        }
        // Followed from before the resume, so that no change is missed; a stop signal is noted from before it too.
        let inbox = AgentEventInbox(self.client)
        let stop = StopFlag()
        defer { stop.cancel() }
        try self.control(wanted, "resume")
        return try self.follow(wanted, inbox: inbox, stop: stop, mode: mode)
    }

    /// Shows the events of `wanted` as they come (from `inbox`, opened before they were started) and waits until each
    /// is finished, failed, paused or cancelled; stopped (`stop` raised before or meanwhile), pauses them.
    /// - Returns: the exit code.
    func follow(_ wanted: [String], inbox: AgentEventInbox, stop: StopFlag, mode: ProgressDisplay.Mode) throws -> Int32 {
        var lines = AgentResumeLines(ids: Set(wanted), mode: mode)
        var settled: [String: Followed] = [:]
        var statusRead = Date.distantPast
        // Settled because the status no longer lists them: their transaction was finished, and its event is awaited.
        var gone: [String] = []
        while settled.count < wanted.count {
            if stop.raised || Output.broken.load(ordering: .relaxed) {
                let open = wanted.filter { settled[$0] == nil }
                try self.control(open, "pause")
                lines.show(inbox.take())
                lines.end()
                return RunSession.interrupted(paused: open)
            }
            // Events first: a download that failed, paused or was cancelled settles when its event says so; one that
            // finished when the status shows whether its transaction was finished too (read at once).
            lines.show(inbox.take(waiting: 0.25))
            for id in wanted where settled[id] == nil {
                guard let download = lines.lastEvent[id] else { continue }
                if download.state == .finished { statusRead = .distantPast }
                if [.failed, .paused, .cancelled].contains(download.state) { settled[id] = Followed(download) }
            }
            // The status once a second besides, for what no event says: a download whose transaction was finished
            // leaves it, and a stream that broke (an agent restarted) misses events.
            guard settled.count < wanted.count, Date().timeIntervalSince(statusRead) >= 1 else { continue }
            statusRead = Date()
            let listed = try self.listed()
            for download in listed { lines.note(download) }
            let open = Dictionary(listed.map { ($0.id, Followed($0)) }, uniquingKeysWith: { first, _ in first })
            for id in wanted where settled[id] == nil {
                // Gone from the status: its transaction was finished, so it finished.
                guard let download = open[id] else {
                    settled[id] = Followed(id: id, state: "finished", pauseReason: nil, contentIdentifier: "", error: nil)
                    gone.append(id)
                    continue
                }
                if ["finished", "failed", "paused", "cancelled"].contains(download.state) { settled[id] = download }
            }
        }
        // The events of the last changes may trail the status by a moment (longer on a busy machine).
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline,
            !wanted.allSatisfy({ lines.showed($0, state: settled[$0]?.state ?? "") })
                || !gone.allSatisfy({ lines.transactionFinished(of: $0) })
        {
            usleep(50_000)
            lines.show(inbox.take())
        }
        lines.show(inbox.take())
        lines.end()
        return Self.exitCode(wanted.compactMap { settled[$0] })
    }

    /// The stop signals (RunSession.stopSignals) while a command follows downloads in the agent, noted from before it
    /// starts them: stopped, the command pauses them in the agent, their bytes kept, and exits 130 with one line, as
    /// the in-process run does. Until `cancel()`, the signals do not end the process.
    final class StopFlag: Sendable {
        private final class Flag: Sendable {
            let value = Atomic<Bool>(false)
        }

        private let flag: Flag
        private let watch: Mutex<SignalWatch>

        init() {
            let flag = Flag()
            self.flag = flag
            self.watch = Mutex(SignalWatch(RunSession.stopSignals) { flag.value.store(true, ordering: .relaxed) })
        }

        var raised: Bool { self.flag.value.load(ordering: .relaxed) }

        /// Gives the signals back.
        func cancel() { self.watch.withLock { $0.cancel() } }
    }

    /// 0 when all finished or were cancelled; a failure's code and line; else 75 with a line per paused download.
    static func exitCode(_ downloads: [Followed]) -> Int32 {
        if let failed = downloads.first(where: { $0.state == "failed" }) {
            let error = failed.error ?? PackDeliveryError(.internalError, message: "The download failed.")
            let hint = ExitStatus.hint(for: error) ?? error.hint
            printError(
                "packs: \(failed.id) (\(PackDeliveryError.printable(failed.contentIdentifier))) failed: "
                    + (hint.map { "\(error.message) \($0)" } ?? error.message))
            return ExitStatus.code(for: error)
        }
        let paused = downloads.filter { $0.state == "paused" }
        for download in paused {
            printError(
                "packs: \(download.id) (\(PackDeliveryError.printable(download.contentIdentifier))) is paused (\(download.pauseReason ?? "user")). Run packs resume \(download.id) to continue, or packs cancel \(download.id) to discard it."
            )
        }
        return paused.isEmpty ? 0 : ExitStatus.resumable
    }
}
