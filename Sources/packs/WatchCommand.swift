import ArgumentParser
import Foundation
import PackAgent
import PackDelivery

extension Packs {
    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show live progress of everything the agent runs, until Ctrl-C.",
            discussion: """
                It follows the agent's event stream (GET /v1/events): a line when a download changes state or phase, \
                and about once a second while it runs; with --json, each event's data line as the agent sends it. When \
                the agent restarts (socket activation), it reconnects and goes on from the last event it showed; when \
                the agent no longer holds those events, it prints the status of the homes it has seen again. Exit 0 on \
                Ctrl-C or SIGTERM; 79 when no agent answers on the socket, or it stays away longer than \
                --reconnect-timeout.

                Example:
                  packs watch
                  packs --json watch --socket /run/user/1000/packs/agent.sock
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var agent: AgentOptions

        @Option(
            name: .customLong("reconnect-timeout"),
            help: ArgumentHelp("How long to keep reconnecting to an agent that went away.", valueName: "seconds"))
        var reconnectTimeout: Double = 30

        func validate() throws {
            if !(self.reconnectTimeout >= 0) { throw ValidationError("--reconnect-timeout must be zero or more seconds.") }
        }

        func run() async throws {
            guard let path = self.agent.path else {
                printError("packs: XDG_RUNTIME_DIR is not set, so there is no agent socket to watch; pass --socket PATH.")
                throw ExitCode(ExitStatus.agentUnavailable)
            }
            // Nothing to save on the way out: stopping is exit 0.
            let signals = [SIGINT, SIGTERM].map { (number: Int32) -> any DispatchSourceSignal in
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler { Glibc.exit(0) }
                source.resume()
                return source
            }
            defer { for source in signals { source.cancel() } }
            let watcher = AgentWatcher(
                client: AgentClient(socketPath: path, clientVersion: Packs.version), json: self.global.json, quiet: self.global.quiet,
                reconnectTimeout: self.reconnectTimeout)
            let code = await Task.detached { watcher.run() }.value
            if code != 0 { throw ExitCode(code) }
        }
    }
}

/// `packs watch`'s loop: follows the event stream, reconnects with the last id, and shows what comes.
struct AgentWatcher: Sendable {
    let client: AgentClient
    let json: Bool
    let quiet: Bool
    let reconnectTimeout: Double

    /// Blocks until the agent is gone for good. - Returns: the exit code (79).
    func run() -> Int32 {
        var display = WatchDisplay(json: self.json, quiet: self.quiet)
        var lastID: UInt64?
        var connected = false
        var lostSince: Date?
        while true {
            do {
                try self.client.followEvents(after: lastID, opened: { lostSince = nil }) { event in
                    if let id = event.id { lastID = id }
                    if event.kind == "reset" {
                        display.reset(self.client, event: event)
                    } else {
                        display.show(event)
                    }
                }
            } catch AgentClient.StreamEnd.refused(let status, let body) {
                let error = try? JSONDecoder().decode(AgentErrorBody.self, from: body)
                printError("packs: The agent refused the event stream (\(status)): \(error?.error.message ?? "no reason given").")
                return ExitStatus.agentUnavailable
            } catch let error as AgentClient.Unreachable {
                if !connected {
                    printError(
                        "packs: No agent answers on \(error.path) (\(error.reason)). Start it with packs agent, or systemctl --user enable --now packs-agent.socket."
                    )
                    return ExitStatus.agentUnavailable
                }
            } catch {
                // The stream closed: the agent stopped or restarted.
            }
            connected = true
            let since = lostSince ?? Date()
            lostSince = since
            if Date().timeIntervalSince(since) > self.reconnectTimeout {
                printError(
                    "packs: The agent on \(self.client.socketPath) stopped answering and did not come back within \(Int(self.reconnectTimeout)) s."
                )
                return ExitStatus.agentUnavailable
            }
            usleep(200_000)
        }
    }
}

/// What `watch` prints for each event: the data line with `--json`; else a line per download when its state or phase
/// changes, and about once a second while it runs, and one when a transaction finishes.
struct WatchDisplay {
    let json: Bool
    let quiet: Bool
    private var shown: [String: (key: String, at: Date)] = [:]
    /// The homes seen in events, whose status a `reset` reads again.
    private var homes: Set<String> = []

    init(json: Bool, quiet: Bool) {
        self.json = json
        self.quiet = quiet
    }

    mutating func show(_ event: AgentEvent) {
        let object = (try? JSONSerialization.jsonObject(with: Data(event.data.utf8))) as? [String: Any] ?? [:]
        if let home = object["home"] as? String { self.homes.insert(home) }
        if self.quiet { return }
        if self.json {
            printLine(JSONOutput.asciiControls(event.data))
            return
        }
        switch event.kind {
        case "download":
            guard let id = object["id"] as? String else { return }
            let state = object["state"] as? String ?? "?"
            let key = "\(state)/\(object["phase"] as? String ?? "")"
            let now = Date()
            if let last = self.shown[id], last.key == key, state != "active" || now.timeIntervalSince(last.at) < 1 { return }
            self.shown[id] = (key, now)
            printLine(Self.line(object))
        case "transaction":
            guard object["state"] as? String == "finished", let id = object["id"] as? String else { return }
            printLine("\(id)  \(PackDeliveryError.printable(object["productIdentifier"] as? String ?? ""))  finished")
        default:
            return
        }
    }

    /// The agent no longer holds the events after the last one shown: the status of every home seen, again.
    mutating func reset(_ client: AgentClient, event: AgentEvent) {
        if self.json, !self.quiet { printLine(JSONOutput.asciiControls(event.data)) }
        for home in self.homes.sorted() {
            let path = "/v1/downloads?home=" + AgentLink.escaped(home)
            guard let answer = try? client.send("GET", path, timeout: 10), answer.status == 200,
                let status = (try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any]
            else { continue }
            let transactions = status["transactions"] as? [[String: Any]] ?? []
            for transaction in transactions {
                for case var download as [String: Any] in transaction["downloads"] as? [Any] ?? [] {
                    download["event"] = "download"
                    download["home"] = home
                    guard let data = try? JSONSerialization.data(withJSONObject: download, options: [.sortedKeys, .withoutEscapingSlashes])
                    else { continue }
                    self.shown[download["id"] as? String ?? ""] = nil
                    self.show(AgentEvent(id: nil, kind: "download", data: String(decoding: data, as: UTF8.self)))
                }
            }
        }
    }

    /// `ID  STATE (REASON)  PHASE  NN%  RECEIVED/TOTAL  CONTENT VERSION`.
    static func line(_ download: [String: Any]) -> String {
        let text = { (key: String) in PackDeliveryError.printable(download[key] as? String ?? "") }
        var line = "\(text("id"))  \(text("state"))"
        if let reason = download["pauseReason"] as? String { line += " (\(PackDeliveryError.printable(reason)))" }
        if let phase = download["phase"] as? String { line += "  \(PackDeliveryError.printable(phase))" }
        let progress = (download["progress"] as? NSNumber)?.doubleValue ?? 0
        let received = (download["bytesReceived"] as? NSNumber)?.int64Value ?? 0
        let total = (download["contentLength"] as? NSNumber)?.int64Value ?? 0
        line +=
            "  \(Int((progress * 100).rounded(.down)))%  \(ByteFormat.string(received))/\(ByteFormat.string(total))  \(text("contentIdentifier")) \(text("contentVersion"))"
        if let error = download["error"] as? [String: Any], let message = error["message"] as? String {
            line += "  — \(PackDeliveryError.printable(message))"
        }
        return line
    }
}
