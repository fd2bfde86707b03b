import Foundation
import Logging

/// What a queue that hands its downloads to the agent keeps (``AgentUse``).
struct AgentSession: Sendable {
    let link: AgentLink
    let follower: AgentEventFollower
    /// The agent's event stream is connected: the downloads it runs are reported from the stream, not read from the store.
    var streaming = false
    /// The agent went away: this queue runs its downloads itself from now on.
    var gone = false
}

/// A download's change as the agent's stream carries it: the fields of a `download` event that change.
struct AgentDownloadUpdate: Decodable {
    let home: String
    let id: String
    let state: DownloadState
    let phase: DownloadPhase?
    let progress: Double
    let phaseProgress: Double
    let timeRemaining: Double
    let bytesReceived: Int64
    let pauseReason: PauseReason?
    let priority: DownloadPriority
    let contentURL: String?
    let retryDate: Date?
    let error: PackDeliveryError?
    let delta: Download.Delta?
    let deltaFallback: Download.DeltaFallback?

    /// The download as last known, with these fields.
    func applied(to known: Download) -> Download {
        var download = known
        download.state = self.state
        download.phase = self.phase
        download.progress = self.progress
        download.phaseProgress = self.phaseProgress
        download.timeRemaining = self.timeRemaining
        download.bytesReceived = self.bytesReceived
        download.pauseReason = self.pauseReason
        download.priority = self.priority
        download.contentURL = self.contentURL.map { URL(filePath: $0) }
        download.retryDate = self.retryDate
        download.error = self.error
        download.delta = self.delta
        download.deltaFallback = self.deltaFallback
        return download
    }
}

// The queue with the machine's agent (``AgentUse``): its waiting downloads handed over, the agent's events pushed to its
// listeners, and its downloads taken back when the agent goes away. Everything here runs on `driver`.
extension DownloadQueue {
    /// At open: the session with the agent when it serves this home, else nil (this process runs the downloads).
    /// - Throws: `agentUnavailable` with ``AgentUse/required`` when no agent serves the home.
    func openAgentSession() throws(PackDeliveryError) -> AgentSession? {
        guard let link = AgentLink.link(for: self.configuration) else {
            guard self.configuration.agent == .required else { return nil }
            throw PackDeliveryError(
                .agentUnavailable,
                message: AgentLink.keepsCredentials(self.configuration)
                    ? "A queue with a credentials provider or request headers of its own cannot hand its downloads to the agent, which has neither."
                    : "No agent socket is known: XDG_RUNTIME_DIR is not set.",
                hint: "Use AgentUse.automatic or .never, or set Configuration.agentSocket.")
        }
        do {
            try link.serve(self.home)
        } catch {
            guard self.configuration.agent != .required else { throw error }
            self.logger.notice(
                "no agent serves this home; its downloads run in this process",
                metadata: ["socket": "\(link.socket)", "error": "\(error.message)"])
            return nil
        }
        let follower = AgentEventFollower(link: link) { [weak self] report in
            guard let self else { return }
            self.driver.async { self.agentReported(report) }
        }
        self.logger.info("the agent serves this home; its downloads run there", metadata: ["socket": "\(link.socket)"])
        return AgentSession(link: link, follower: follower)
    }

    /// Gives the agent the downloads waiting here (never started here) and asks it to take them; when it does not
    /// answer, this queue takes them back and runs everything itself from now on.
    func handOverToAgent() {
        guard let session = self.driven({ $0.agent }), !session.gone else { return }
        guard self.driven({ state in state.machine.entries.values.contains { $0.state == .waiting } }) else { return }
        // A resume or a launch's adoption changed their rows: saved first, so the agent reads them waiting.
        self.save(includingProgress: false)
        let handed = self.driven { $0.machine.handOver() }
        guard !handed.isEmpty else { return }
        let ids = handed.map(\.id)
        do {
            try self.store.release(ids, owner: self.owner)
            // Joined: if the agent dies, they are taken back (takeOverJoinedDeliveries) and handed over again.
            self.driven { $0.joinedElsewhere.formUnion(handed.map(\.transactionID)) }
            try session.link.serve(self.home)
        } catch {
            self.agentGone(error)
            try? self.store.release(ids, owner: self.owner)
            if let taken = try? self.take(ids) { self.resumeInterrupted(taken) }
        }
    }

    /// The agent no longer answers: said once, and this queue admits its own downloads from now on.
    func agentGone(_ error: PackDeliveryError) {
        let session = self.driven { state -> AgentSession? in
            guard var session = state.agent, !session.gone else { return nil }
            session.gone = true
            session.streaming = false
            state.agent = session
            return session
        }
        guard let session else { return }
        session.follower.stop()
        self.logger.warning(
            "the agent went away; this queue runs its downloads itself from now on",
            metadata: ["socket": "\(session.link.socket)", "error": "\(error.message)"])
        self.change { $0.stopHandingOver() }
    }

    /// What the agent's event stream brought.
    func agentReported(_ report: AgentEventFollower.Report) {
        guard self.driven({ $0.agent.map { !$0.gone } ?? false }) else { return }
        switch report {
        case .connected(let connected):
            self.driven { $0.agent?.streaming = connected }
            // Caught up from the store once; from now on the stream reports.
            if connected { self.watchOthers() }
        case .event(let event):
            self.agentEvent(event)
        }
    }

    private func agentEvent(_ event: AgentEventFollower.Event) {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        let data = Data(event.data.utf8)
        let path = self.home.stateFolder.standardizedFileURL.path
        switch event.kind {
        case "download", "priorityChanged":
            guard let update = try? decoder.decode(AgentDownloadUpdate.self, from: data), update.home == path else { return }
            self.pushed(update)
        case "transaction":
            struct Named: Decodable {
                let home: String
                let id: String
            }
            guard let named = try? decoder.decode(Named.self, from: data), named.home == path, self.hasListeners else { return }
            self.emitTransaction(named.id)
        case "reset":
            self.watchOthers()
        default:
            break
        }
    }

    private var hasListeners: Bool { self.registry.withLock { !$0.continuations.isEmpty || !$0.observers.isEmpty } }

    /// A download the agent runs changed: reported to this queue's listeners, as ``watchOthers()`` reports what it reads.
    private func pushed(_ update: AgentDownloadUpdate) {
        guard self.hasListeners, self.driven({ $0.machine.entries[update.id] == nil }) else { return }
        let known: Download?
        if let seen = self.driven({ $0.others?[update.id] }) {
            known = seen
        } else {
            known = (try? self.store.downloadRecord(update.id))??.download
        }
        guard let known else { return }
        let now = update.applied(to: known)
        self.driven { state in
            var others = state.others ?? [:]
            others[update.id] = now
            state.others = others
        }
        if now != known { self.emit(.downloadUpdated(now)) }
    }
}
