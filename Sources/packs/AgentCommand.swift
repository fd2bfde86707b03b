import ArgumentParser
import CLinux
import Foundation
import Logging
import PackAgent
import PackDelivery

extension Packs {
    struct Agent: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run the background agent: it owns the downloads of the homes it serves, over a Unix socket.",
            discussion: """
                It listens only on $XDG_RUNTIME_DIR/packs/agent.sock (its folder 0700), or on the socket systemd \
                passes (packs-agent.socket), and answers only this user (SO_PEERCRED). It keeps the homes it serves in \
                $XDG_STATE_HOME/packs/agent-homes.json and resumes their interrupted downloads at start. It exits 0 \
                on SIGTERM (downloads pause with their bytes kept) or after --idle-timeout with nothing to do. Exit 78 \
                when the socket's folder belongs to another user or is open to others, or no socket path is known; 74 \
                when it cannot listen (another agent listens there).

                Example:
                  packs agent --idle-timeout 600
                  curl --unix-socket "$XDG_RUNTIME_DIR/packs/agent.sock" http://localhost/v1/version
                """)

        @OptionGroup var transfer: TransferFlags

        @Option(help: ArgumentHelp("Listen on this socket instead of $XDG_RUNTIME_DIR/packs/agent.sock.", valueName: "path"))
        var socket: String?

        @Option(
            name: .customLong("idle-timeout"),
            help: ArgumentHelp("Exit after this many seconds with nothing queued or running and no client connected.", valueName: "seconds")
        )
        var idleTimeout: Double = 300

        @Flag(name: [.short, .long], help: "Log requests and downloads too, to stderr.")
        var verbose = false

        func validate() throws {
            if !(self.idleTimeout > 0) { throw ValidationError("--idle-timeout must be a positive number of seconds.") }
        }

        func run() async throws {
            // Allocations of 128 KiB and more in their own mappings, given back when freed: glibc otherwise raises
            // this threshold to the largest block freed (up to 32 MiB), and the large transient arrays of each
            // recording then land in the heaps among what outlives it. With 100,000 downloads queued over 10 homes
            // (case 19d), a debug agent held 143 MB of heap for 38-66 MB in use (Benchmarks/RESULTS.md).
            _ = clinux_mallopt(clinux_m_mmap_threshold(), 128 << 10)
            let activated = AgentSocket.activatedDescriptor()
            var logger = Logger(label: "packs-agent", factory: { SafeLogHandler(label: $0) })
            logger.logLevel = self.verbose ? .debug : .info
            let transfer = self.transfer
            do throws(AgentStartError) {
                let path: String
                if let socket = self.socket {
                    path = URL(filePath: socket).standardizedFileURL.path
                } else {
                    path = try AgentSocket.defaultPath()
                }
                let server = PackAgentServer(
                    .init(
                        socketPath: path, activatedDescriptor: activated, stateFolder: Self.stateFolder(),
                        idleTimeout: self.idleTimeout, version: Packs.version, logger: logger,
                        queueConfiguration: { transfer.configuration(resumeInterrupted: true) }))
                _ = try await server.run()
            } catch {
                printError("packs: \(error.message)")
                throw ExitCode(error.code == .listenFailed ? ExitStatus.io : ExitStatus.config)
            }
        }

        /// `$XDG_STATE_HOME/packs`, else `~/.local/state/packs`.
        static func stateFolder(environment: [String: String] = ProcessInfo.processInfo.environment) -> URL {
            if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return URL(filePath: state).appending(path: "packs") }
            return URL(filePath: environment["HOME"] ?? NSHomeDirectory()).appending(path: ".local/state/packs")
        }
    }
}

/// `packs fetch --detach`: hands the purchase to the agent and prints what it recorded, without waiting.
enum DetachedFetch {
    struct Request: Encodable {
        let home: String
        let manifest: String
        let products: [String]
        let destination: String
        /// Omitted when nil.
        let receipt: String?
    }

    /// - Returns: the exit code (0 when the agent took the work).
    static func run(
        global: GlobalOptions, socket: String?, manifest: String, products: [String], destination: Destination, receipt: String?
    ) -> Int32 {
        let path: String
        do throws(AgentStartError) {
            if let socket {
                path = socket
            } else {
                path = try AgentSocket.defaultPath()
            }
        } catch {
            printError("packs: \(error.message)")
            return ExitStatus.agentUnavailable
        }
        // A local manifest path is the caller's: the agent runs elsewhere.
        let location = manifest.contains("://") ? manifest : URL(filePath: manifest).standardizedFileURL.absoluteString
        guard let home = Self.homePath(global) else {
            printError(
                "packs: --detach needs one home folder: pass --home DIR or set PACKS_HOME (the agent does not serve the XDG layout yet).")
            return ExitStatus.usage
        }
        let request = Request(home: home, manifest: location, products: products, destination: destination.rawValue, receipt: receipt)
        let client = AgentClient(socketPath: path, clientVersion: Packs.version)
        let answer: AgentClient.Answer
        do throws(AgentClient.Unreachable) {
            answer = try client.send("POST", "/v1/fetch", json: Data(AgentJSON.line(request).utf8))
        } catch {
            printError(
                "packs: No agent answers on \(error.path) (\(error.reason)). Start it with packs agent, or systemctl --user enable --now packs-agent.socket."
            )
            return ExitStatus.agentUnavailable
        }
        guard answer.status == 202, let added = try? JSONDecoder().decode(FetchAnswer.self, from: answer.body) else {
            let error = try? JSONDecoder().decode(AgentErrorBody.self, from: answer.body)
            var reason = error?.error.message ?? "no reason given"
            if !reason.hasSuffix(".") { reason += "." }
            printError("packs: The agent refused the fetch (\(answer.status) \(error?.error.code ?? "")): \(reason)")
            return answer.status == 409 ? ExitStatus.agentUnavailable : (answer.status >= 500 ? ExitStatus.io : ExitStatus.badData)
        }
        for transaction in added.transactions {
            if global.json {
                printJSON(
                    DetachedJSON(
                        transactionID: transaction.id, productIdentifier: transaction.productIdentifier, downloads: transaction.downloads))
            } else if !global.quiet {
                printLine(
                    "\(transaction.id)  \(PackDeliveryError.printable(transaction.productIdentifier))  \(transaction.downloads.joined(separator: " "))"
                )
            }
        }
        return 0
    }

    struct DetachedJSON: Encodable {
        let event = "detached"
        let transactionID: String
        let productIdentifier: String
        let downloads: [String]
    }

    /// The home as one absolute folder (`--home`, else `$PACKS_HOME`); nil for the XDG layout, which the agent does
    /// not serve yet.
    static func homePath(_ global: GlobalOptions) -> String? {
        if let home = global.home { return URL(filePath: (home as NSString).expandingTildeInPath).standardizedFileURL.path }
        if let env = ProcessInfo.processInfo.environment["PACKS_HOME"], !env.isEmpty { return URL(filePath: env).standardizedFileURL.path }
        return nil
    }
}
