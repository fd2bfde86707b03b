import CLinux
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
import NIOPosix
import PackDelivery
import Synchronization

/// `packs agent`: serves the API on one Unix socket (bound here, or handed over by systemd), only to this uid,
/// until SIGTERM, SIGINT or the idle timeout; then closes every queue, keeping every byte.
public struct PackAgentServer: Sendable {
    public struct Configuration: Sendable {
        /// The socket's path (bound unless `activatedDescriptor` is set; then only named in logs).
        public var socketPath: String
        /// The listening socket systemd passed, if any.
        public var activatedDescriptor: Int32?
        /// Where the list of served homes is kept.
        public var stateFolder: URL
        /// Exit 0 after this long with nothing waiting or running and no client connected.
        public var idleTimeout: TimeInterval
        /// The agent's version (`Packs-Client-Version` must match its major and minor).
        public var version: String
        /// The configuration of each home's queue.
        public var queueConfiguration: @Sendable () -> DownloadQueue.Configuration
        public var logger: Logger
        /// How often an idle event stream sends a comment line.
        public var keepAlive: Duration = .seconds(2)

        public init(
            socketPath: String, activatedDescriptor: Int32?, stateFolder: URL, idleTimeout: TimeInterval, version: String,
            logger: Logger, queueConfiguration: @escaping @Sendable () -> DownloadQueue.Configuration
        ) {
            self.socketPath = socketPath
            self.activatedDescriptor = activatedDescriptor
            self.stateFolder = stateFolder
            self.idleTimeout = idleTimeout
            self.version = version
            self.logger = logger
            self.queueConfiguration = queueConfiguration
        }
    }

    /// Why the agent stopped.
    public enum Stop: Sendable {
        case signal(Int32)
        case idle
    }

    let configuration: Configuration

    public init(_ configuration: Configuration) {
        self.configuration = configuration
    }

    /// Listens, serves until a stop, then closes every served queue (their running downloads pause as interrupted,
    /// bytes kept, and the next agent resumes them).
    public func run() async throws(AgentStartError) -> Stop {
        let logger = self.configuration.logger
        let events = AgentEventLog()
        let homes = AgentHomes(
            stateFolder: self.configuration.stateFolder, events: events, logger: logger,
            configuration: self.configuration.queueConfiguration)
        let routes = AgentRoutes(homes: homes, events: events, version: self.configuration.version, keepAlive: self.configuration.keepAlive)
        let connections = ConnectionCount()
        let (stops, stop) = AsyncStream<Stop>.makeStream()
        let signals = [SIGTERM, SIGINT].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { stop.yield(.signal(number)) }
            source.resume()
            return source
        }
        defer { for source in signals { source.cancel() } }

        let http = Self.http(routes: routes, logger: logger)
        let server = try await self.listen(http: http, connections: connections)
        homes.openSaved()
        let accepting = Task { await Self.accept(server, http: http, logger: logger) }
        AgentSocket.notifyReady()
        logger.info(
            "Agent ready",
            metadata: ["socket": "\(self.configuration.socketPath)", "activated": "\(self.configuration.activatedDescriptor != nil)"])
        let idle = Task { await self.watchIdle(homes: homes, events: events, connections: connections, stop: stop) }
        var reason = Stop.idle
        for await first in stops {
            reason = first
            break
        }
        idle.cancel()
        logger.info("Agent stopping; downloads pause with their bytes kept", metadata: ["reason": "\(reason)"])
        try? await server.channel.close()
        accepting.cancel()
        await homes.closeAll()
        return reason
    }

    private typealias ServerChannel = NIOAsyncChannel<NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>, Never>

    /// HTTP/1.1 over the routes.
    private static func http(routes: AgentRoutes, logger: Logger) -> HTTP1Channel {
        let responder = routes.router().buildResponder()
        return HTTP1Channel(responder: { request, writer, channel in
            let context = BasicRequestContext(source: .init(channel: channel, logger: logger))
            let response: Response
            do {
                response = try await responder.respond(to: request, context: context)
            } catch {
                response = ErrorShapeMiddleware.response(
                    AgentAPIError(status: .internalServerError, code: "internalError", message: "The agent failed to answer."))
            }
            try await writer.write(response: response.head, body: response.body)
        })
    }

    /// Binds the socket (or takes systemd's), with the peer check and HTTP/1.1 on each accepted connection.
    private func listen(http: HTTP1Channel, connections: ConnectionCount) async throws(AgentStartError) -> ServerChannel {
        let logger = self.configuration.logger
        let uid = getuid()
        let initializer: @Sendable (any Channel) -> EventLoopFuture<NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>> = { channel in
            AgentSocket.peerUID(channel).flatMap { peer in
                guard peer == uid else {
                    logger.warning("Refused a connection from another user", metadata: ["peerUID": "\(peer.map(String.init) ?? "unknown")"])
                    channel.close(promise: nil)
                    return channel.eventLoop.makeFailedFuture(ChannelError.inputClosed)
                }
                connections.opened()
                channel.closeFuture.whenComplete { _ in connections.closed() }
                return http.setup(channel: channel, logger: logger)
            }
        }
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(ChannelOptions.backlog, value: 256)
            .childChannelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
        do {
            if let descriptor = self.configuration.activatedDescriptor {
                return try await bootstrap.bind(descriptor, childChannelInitializer: initializer)
            }
            let path = self.configuration.socketPath
            try AgentSocket.prepareFolder(of: path)
            if AgentSocket.answers(path) {
                throw AgentStartError(code: .listenFailed, message: "Another agent already listens on \(path).")
            }
            let channel = try await bootstrap.bind(
                unixDomainSocketPath: path, cleanupExistingSocketFile: true, childChannelInitializer: initializer)
            _ = chmod(path, 0o600)
            return channel
        } catch let error as AgentStartError {
            throw error
        } catch {
            throw AgentStartError(
                code: .listenFailed, message: "Cannot listen on \(self.configuration.socketPath): \(error).")
        }
    }

    /// Serves each accepted connection in its own task until the server channel closes.
    private static func accept(_ server: ServerChannel, http: HTTP1Channel, logger: Logger) async {
        await withDiscardingTaskGroup { group in
            do {
                try await server.executeThenClose { inbound in
                    for try await connection in inbound {
                        group.addTask { await http.handle(value: connection, logger: logger) }
                    }
                }
            } catch {
                logger.debug("The listening socket closed", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Stops after the idle timeout with no client connected and nothing waiting or running in any served home; on the
    /// way, at most once a second, stops serving the homes whose store was removed.
    private func watchIdle(
        homes: AgentHomes, events: AgentEventLog, connections: ConnectionCount, stop: AsyncStream<Stop>.Continuation
    ) async {
        let timeout = self.configuration.idleTimeout
        let step = min(1, max(0.05, timeout / 4))
        var idleSince: Date?
        var busy = true
        // The event log's mark when the memory was last given back: a delivery shorter than a step leaves events.
        var released: UInt64 = 0
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(step))
            await homes.dropRemoved()
            let wasBusy = busy
            busy = await homes.isBusy()
            let mark = events.nextID
            if !busy, wasBusy || mark != released {
                released = mark
                // Nothing waits or runs any more: what the deliveries used goes back to the system, not kept in
                // glibc's heaps for later (an agent with nothing to do should be small, clients connected or not);
                // and so do the pages of code they ran (most of an idle agent's RSS), which stay in the page cache.
                _ = clinux_malloc_trim(0)
                _ = clinux_release_code_pages()
            }
            guard connections.current == 0 && !busy else {
                idleSince = nil
                continue
            }
            let since = idleSince ?? Date()
            idleSince = since
            if Date().timeIntervalSince(since) >= timeout {
                stop.yield(.idle)
                return
            }
        }
    }
}

/// How many clients are connected now (the idle timeout waits for none).
final class ConnectionCount: Sendable {
    private let value = Atomic<Int>(0)

    var current: Int { self.value.load(ordering: .relaxed) }
    func opened() { self.value.add(1, ordering: .relaxed) }
    func closed() { self.value.subtract(1, ordering: .relaxed) }
}
