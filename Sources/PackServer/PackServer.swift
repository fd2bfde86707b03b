import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// What `packs serve` and the embedded server of `packs demo` serve, and where.
public struct PackServerConfiguration: Sendable {
    /// What the server answers.
    public enum Mode: Sendable, Hashable {
        /// Serve the folder's files.
        case files
        /// Serve no file: answer nginx `auth_request` subrequests (or a CDN's origin auth hook) for
        /// whatever path, with 204, 401 or 403 for the file named by `X-Original-URI`.
        case authOnly
    }

    /// Timeouts and limits that keep clients from holding the server without using it. The
    /// defaults are nginx's.
    public struct Limits: Sendable, Hashable {
        /// How long a new connection may take to send a whole request (nginx `client_header_timeout`).
        public var requestTimeout: Duration
        /// How long a connection may wait for its next request after a response (nginx `keepalive_timeout`).
        public var idleTimeout: Duration
        /// How long a response may wait for the client to take any bytes (nginx `send_timeout`).
        public var sendTimeout: Duration
        /// After answering a malformed request, how long its remaining input is read and discarded
        /// before the connection is closed (nginx `lingering_timeout`).
        public var lingeringTimeout: Duration
        /// The most connections open at once; `nil` derives it from the descriptor limit
        /// (`RLIMIT_NOFILE`): each connection may need two descriptors (its socket and the file it
        /// sends), and 32 are kept for the server itself.
        public var maxConnections: Int?
        /// Where a file cannot be sent with `sendfile` (no real connection, as in
        /// `app.test(.router)`): bytes read and handed over at a time, and the most a connection
        /// holds in flight.
        public var readChunkSize: Int
        /// The most connections the metrics listener (``PackServerConfiguration/metricsAddress``) keeps open at once:
        /// its own share of the descriptors, which it never exceeds and which the content port's derived limit leaves
        /// out. At the limit a new one closes the one idle longest, as on the content port; the metrics listener
        /// has the same request and idle timeouts. A scraper needs one or two.
        public var metricsMaxConnections: Int = 16

        /// Creates limits.
        ///
        /// - Parameters:
        ///   - requestTimeout: How long a new connection may take to send a whole request.
        ///   - idleTimeout: How long a connection may wait for its next request.
        ///   - sendTimeout: How long a response may wait for the client to take any bytes.
        ///   - lingeringTimeout: How long the input of a refused request is drained before closing.
        ///   - maxConnections: The most connections open at once, or `nil` for the descriptor limit's share.
        ///   - readChunkSize: Bytes read from a file at a time where `sendfile` cannot be used.
        public init(
            requestTimeout: Duration = .seconds(60),
            idleTimeout: Duration = .seconds(60),
            sendTimeout: Duration = .seconds(60),
            lingeringTimeout: Duration = .seconds(5),
            maxConnections: Int? = nil,
            readChunkSize: Int = 128 * 1024
        ) {
            self.requestTimeout = requestTimeout
            self.idleTimeout = idleTimeout
            self.sendTimeout = sendTimeout
            self.lingeringTimeout = lingeringTimeout
            self.maxConnections = maxConnections
            self.readChunkSize = readChunkSize
        }

        /// ``maxConnections``, or the share of the descriptor limit when it is `nil`: what is left after the 32 kept
        /// for the server and, with a metrics listener, its ``metricsMaxConnections``.
        func effectiveMaxConnections(metrics: Bool) -> Int {
            if let maxConnections { return max(1, maxConnections) }
            var limit = rlimit()
            guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return 4096 }
            let metricsShare = metrics ? max(1, self.metricsMaxConnections) : 0
            return max(1, (Int(clamping: limit.rlim_cur) - 32 - metricsShare) / 2)
        }
    }

    /// The folder whose files are served; nothing outside it is ever served.
    public var directory: URL
    /// The address to listen on.
    public var host: String = "127.0.0.1"
    /// The port to listen on; 0 picks any free port (read it back from ``RunningPackServer/port``).
    public var port: Int = 8080
    /// When set (and ``authorizer`` is not), every request must carry `Authorization: Bearer <token>`;
    /// others get 401.
    public var token: String? = nil
    /// Decides who may have which file; when `nil`, ``token`` decides (or nobody is asked).
    public var authorizer: (any PackAuthorizer)? = nil
    /// Serve files, or only answer authorization subrequests.
    public var mode: Mode = .files
    /// Whether files and folders whose names start with `.` (`.git/`, `.env`) are served.
    public var servesDotfiles: Bool = false
    /// Timeouts and limits.
    public var limits: Limits = Limits()
    /// How long a graceful shutdown may wait for responses in flight before they are cancelled.
    public var gracefulShutdownTimeout: Duration = .seconds(2)
    /// Where to serve `GET /metrics` (Prometheus text), on a listener of its own; `nil` (the default)
    /// counts nothing and serves no metrics.
    public var metricsAddress: MetricsAddress? = nil
    /// The preload keys to hand out at `GET /keys/<keyID>` (`packs serve --keys DIR`), with ``authorizer``'s receipts
    /// and the manifest's release dates; nil (the default) answers no key path. Needs an ``authorizer``.
    public var preloadKeys: PreloadKeyStore? = nil
    /// The clock the release dates of ``preloadKeys`` are compared with (tests set their own).
    public var now: @Sendable () -> Date = { Date() }

    /// The address of the metrics listener (`packs serve --metrics-address HOST:PORT`).
    ///
    /// A listener of its own, not a path of the content port: the content port faces clients (often the
    /// internet, through a CDN) and may demand credentials, while metrics are for the operator's network
    /// only and Prometheus scrapes them without credentials.
    public struct MetricsAddress: Sendable, Hashable {
        /// The address to listen on.
        public var host: String
        /// The port to listen on; 0 picks any free port (read it back from ``RunningPackServer/metricsPort``).
        public var port: Int

        /// Creates an address.
        ///
        /// - Parameters:
        ///   - host: The address to listen on.
        ///   - port: The port to listen on; 0 picks any free port.
        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }
    }

    /// Creates a configuration.
    ///
    /// - Parameters:
    ///   - directory: The folder whose files are served (in `.authOnly` mode: the folder of `manifest.json`).
    ///   - host: The address to listen on.
    ///   - port: The port to listen on; 0 picks any free port.
    ///   - token: The bearer token every request must carry, or `nil` for none.
    ///   - authorizer: Decides who may have which file; overrides `token` when set.
    ///   - mode: Serve files, or only answer authorization subrequests.
    ///   - servesDotfiles: Whether names starting with `.` are served.
    ///   - limits: Timeouts and limits.
    ///   - gracefulShutdownTimeout: How long a shutdown waits for responses in flight.
    public init(
        directory: URL,
        host: String = "127.0.0.1",
        port: Int = 8080,
        token: String? = nil,
        authorizer: (any PackAuthorizer)? = nil,
        mode: Mode = .files,
        servesDotfiles: Bool = false,
        limits: Limits = Limits(),
        gracefulShutdownTimeout: Duration = .seconds(2)
    ) {
        self.directory = directory
        self.host = host
        self.port = port
        self.token = token
        self.authorizer = authorizer
        self.mode = mode
        self.servesDotfiles = servesDotfiles
        self.limits = limits
        self.gracefulShutdownTimeout = gracefulShutdownTimeout
    }

    /// The authorizer in force: ``authorizer``, else one for ``token``, else none.
    var effectiveAuthorizer: (any PackAuthorizer)? {
        self.authorizer ?? self.token.map { SharedTokenAuthorizer(token: $0) }
    }
}

/// A content server started by ``PackServer/start(_:logger:)``; stop it with ``stop()``.
public final class RunningPackServer: Sendable {
    /// The port the server listens on (the real one when the configuration asked for 0).
    public let port: Int
    /// The host the server listens on.
    public let host: String
    /// The port of the metrics listener, when ``PackServerConfiguration/metricsAddress`` is set.
    public let metricsPort: Int?
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    init(port: Int, host: String, metricsPort: Int?, group: ServiceGroup, task: Task<Void, any Error>) {
        self.port = port
        self.host = host
        self.metricsPort = metricsPort
        self.group = group
        self.task = task
    }

    deinit {
        self.task.cancel()
    }

    /// The root URL of the server, `http://host:port/`.
    public var baseURL: URL {
        let host: String
        if self.host.contains(":") && !self.host.hasPrefix("[") {
            host = "[\(self.host)]"
        } else if self.host == "0.0.0.0" || self.host.isEmpty {
            host = "127.0.0.1"
        } else {
            host = self.host
        }
        return URL(string: "http://\(host):\(self.port)/")!
    }

    /// Stops the server gracefully: it stops accepting connections, closes idle ones, lets
    /// responses in flight finish for at most the configured grace period, then cancels them.
    ///
    /// Returns once the listening socket is closed and every connection has ended. Calling it again
    /// is harmless.
    public func stop() async {
        await self.group.triggerGracefulShutdown()
        _ = await self.task.result
    }
}

/// The content server: static files of one folder over HTTP/1.1 with Range, If-Range, ETag and
/// Last-Modified, built on Hummingbird's `FileMiddleware`.
public enum PackServer {
    /// Starts serving in the background and returns once the server is listening.
    ///
    /// - Parameters:
    ///   - configuration: What to serve and where.
    ///   - logger: Receives one info line per request and the server's own messages.
    /// - Returns: The running server; its `port` is the real port when the configuration asked for 0.
    /// - Throws: When the folder does not exist, a port is outside 0–65535 or the address cannot be bound.
    public static func start(_ configuration: PackServerConfiguration, logger: Logger) async throws -> RunningPackServer {
        let ready = ReadySignal()
        let metricsReady = ReadySignal()
        let group = try Self.makeServiceGroup(configuration, logger: logger, signals: false, ready: ready, metricsReady: metricsReady)
        let task = Task {
            defer {
                ready.fail(PackServerError.stoppedBeforeListening)
                metricsReady.fail(PackServerError.stoppedBeforeListening)
            }
            try await group.run()
        }
        do {
            let port = try await ready.wait()
            let metricsPort: Int? = if configuration.metricsAddress == nil { nil } else { try await metricsReady.wait() }
            return RunningPackServer(port: port, host: configuration.host, metricsPort: metricsPort, group: group, task: task)
        } catch {
            task.cancel()
            // Prefer the server's own error (e.g. "address already in use") over ours.
            if case .failure(let serverError) = await task.result {
                throw serverError
            }
            throw error
        }
    }

    /// Serves until the task is cancelled or SIGINT or SIGTERM arrives (for `packs serve`).
    ///
    /// A signal shuts down gracefully (responses in flight get the configured grace period);
    /// cancelling the task stops at once.
    ///
    /// - Parameters:
    ///   - configuration: What to serve and where.
    ///   - logger: Receives one info line per request and the server's own messages.
    ///   - onReady: Called once with the real port as soon as the server listens.
    /// - Throws: When the folder does not exist, a port is outside 0–65535 or the address cannot be bound.
    public static func run(
        _ configuration: PackServerConfiguration,
        logger: Logger,
        onReady: @Sendable (Int) -> Void
    ) async throws {
        try await Self.run(configuration, logger: logger) { port, _ in onReady(port) }
    }

    /// Serves until the task is cancelled or SIGINT or SIGTERM arrives, saying where it listens.
    ///
    /// - Parameters:
    ///   - configuration: What to serve and where.
    ///   - logger: Receives one info line per request and the server's own messages.
    ///   - onListening: Called once with the real port and the metrics listener's (when
    ///     ``PackServerConfiguration/metricsAddress`` is set) as soon as both listen.
    /// - Throws: When the folder does not exist, a port is outside 0–65535 or an address cannot be bound.
    public static func run(
        _ configuration: PackServerConfiguration,
        logger: Logger,
        onListening: @Sendable (_ port: Int, _ metricsPort: Int?) -> Void
    ) async throws {
        let ready = ReadySignal()
        let metricsReady = ReadySignal()
        let group = try Self.makeServiceGroup(configuration, logger: logger, signals: true, ready: ready, metricsReady: metricsReady)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask {
                defer {
                    ready.fail(PackServerError.stoppedBeforeListening)
                    metricsReady.fail(PackServerError.stoppedBeforeListening)
                }
                try await group.run()
            }
            if let port = try? await ready.wait() {
                if configuration.metricsAddress == nil {
                    onListening(port, nil)
                } else if let metricsPort = try? await metricsReady.wait() {
                    onListening(port, metricsPort)
                }
            }
            // Rethrows the server's error, if any.
            try await tasks.waitForAll()
        }
    }

    /// What the connections need to answer plain file requests themselves (see ``FileFastPathHandler``).
    private static func fastPath(_ configuration: PackServerConfiguration, logger: Logger, metrics: ServerMetrics?) throws -> FileFastPath {
        let folder = try ServedFolder(directory: configuration.directory, allowsDotfiles: configuration.servesDotfiles)
        return FileFastPath(
            folder: folder,
            authorizer: configuration.effectiveAuthorizer,
            index: ManifestIndex(folder: folder.rootPath, logger: logger),
            logger: logger,
            metrics: metrics,
            answersKeys: configuration.preloadKeys != nil
        )
    }

    /// The router of a server: request log, metrics (when on), `/healthz`, request guard, authorization, then
    /// the files (or the auth gate). Internal so that tests can drive it with `app.test(.router)`.
    static func makeRouter(
        _ configuration: PackServerConfiguration, logger: Logger, metrics: ServerMetrics? = nil
    ) throws -> Router<PackRequestContext> {
        let folder = try ServedFolder(directory: configuration.directory, allowsDotfiles: configuration.servesDotfiles)
        let index = ManifestIndex(folder: folder.rootPath, logger: logger)
        let authorizer = configuration.effectiveAuthorizer

        let router = Router(context: PackRequestContext.self)
        router.add(middleware: RequestLogMiddleware<PackRequestContext>())
        if let metrics {
            router.add(middleware: RequestMetricsMiddleware<PackRequestContext>(metrics: metrics, mode: configuration.mode))
        }
        router.add(middleware: HealthMiddleware<PackRequestContext>())
        switch configuration.mode {
        case .authOnly:
            guard let authorizer else { throw PackServerError.authOnlyWithoutCredential }
            router.add(middleware: RequestGuardMiddleware<PackRequestContext>(allowsAnyMethod: true))
            router.add(middleware: AuthGateMiddleware<PackRequestContext>(authorizer: authorizer, index: index, metrics: metrics))
        case .files:
            router.add(middleware: RequestGuardMiddleware<PackRequestContext>())
            if let keys = configuration.preloadKeys {
                guard let authorizer else { throw PackServerError.keysWithoutCredential }
                router.add(
                    middleware: KeyMiddleware<PackRequestContext>(
                        store: keys, authorizer: authorizer, index: index, now: configuration.now, metrics: metrics))
            }
            if let authorizer {
                router.add(middleware: AuthorizationMiddleware<PackRequestContext>(authorizer: authorizer, index: index, metrics: metrics))
            }
            let bodies = FileBodies(chunkSize: max(4096, configuration.limits.readChunkSize))
            router.add(middleware: PackFileMiddleware<PackRequestContext>(folder: folder, bodies: bodies))
        }

        return router
    }

    private static func makeServiceGroup(
        _ configuration: PackServerConfiguration,
        logger: Logger,
        signals: Bool,
        ready: ReadySignal,
        metricsReady: ReadySignal
    ) throws -> ServiceGroup {
        // A port out of range would be taken modulo 65536 by the socket layer (70000 listens on 4464).
        for port in [configuration.port] + (configuration.metricsAddress.map { [$0.port] } ?? []) where !(0...65535).contains(port) {
            throw PackServerError.portOutOfRange(port)
        }
        let limits = configuration.limits
        let limiter = ConnectionLimiter(maximum: limits.effectiveMaxConnections(metrics: configuration.metricsAddress != nil))
        let metrics = configuration.metricsAddress.map { _ in ServerMetrics(limiter: limiter) }
        let router = try Self.makeRouter(configuration, logger: logger, metrics: metrics)
        let fastPath: FileFastPath? =
            try configuration.mode == .files ? Self.fastPath(configuration, logger: logger, metrics: metrics) : nil
        let connectionLogger = logger
        let application = Application(
            router: router,
            server: .http1(
                configuration: HTTP1Channel.Configuration(
                    additionalChannelHandlers: ConnectionPipeline.handlers(
                        limits: limits, limiter: limiter, fastPath: fastPath, logger: connectionLogger, metrics: metrics)
                )
            ),
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "packs",
                // nginx's listen backlog on Linux (Hummingbird's default is 256): a burst of new
                // clients waits in the kernel instead of retrying its SYN seconds later.
                backlog: 511
            ),
            onServerRunning: { channel in
                // Accept up to 256 waiting clients per turn of the event loop instead of NIO's 4: the
                // loop also serves every connection, and under load a turn takes tens of
                // milliseconds, so 4 per turn let 1,000 new clients wait in the listen queue for
                // seconds (measured: 50 accepted per second).
                try? await channel.setOption(ChannelOptions.maxMessagesPerRead, value: 256).get()
                ready.succeed(channel.localAddress?.port ?? configuration.port)
            },
            logger: logger
        )

        var services: [any Service] = [application]
        if let metrics, let address = configuration.metricsAddress {
            services.append(Self.metricsApplication(metrics, address: address, limits: limits, logger: logger, ready: metricsReady))
        }
        var groupConfiguration = ServiceGroupConfiguration(
            services: services,
            gracefulShutdownSignals: signals ? [.sigterm, .sigint] : [],
            logger: logger
        )
        groupConfiguration.maximumGracefulShutdownDuration = configuration.gracefulShutdownTimeout
        groupConfiguration.maximumCancellationDuration = .seconds(2)
        return ServiceGroup(configuration: groupConfiguration)
    }
}

extension PackServer {
    /// The metrics listener: `GET /metrics` answers the Prometheus text format (0.0.4) of ``ServerMetrics``,
    /// with the gauges read at that moment; `GET /healthz` answers as on the content port.
    ///
    /// Its connections have a limit of their own (``PackServerConfiguration/Limits/metricsMaxConnections``, the
    /// idlest closed for a new one) and the content port's request, idle and send timeouts, so that clients holding
    /// it open cannot take the descriptors the content port needs.
    private static func metricsApplication(
        _ metrics: ServerMetrics,
        address: PackServerConfiguration.MetricsAddress,
        limits: PackServerConfiguration.Limits,
        logger: Logger,
        ready: ReadySignal
    ) -> some Service {
        let limiter = ConnectionLimiter(maximum: limits.metricsMaxConnections)
        let router = Router()
        router.add(middleware: HealthMiddleware<BasicRequestContext>())
        router.get("/metrics") { _, _ in
            Response(
                status: .ok,
                headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8", .cacheControl: "no-store"],
                body: ResponseBody(byteBuffer: ByteBuffer(bytes: metrics.scrape()))
            )
        }
        return Application(
            router: router,
            server: .http1(
                configuration: HTTP1Channel.Configuration(
                    additionalChannelHandlers: ConnectionPipeline.metricsHandlers(limits: limits, limiter: limiter, logger: logger))
            ),
            configuration: ApplicationConfiguration(address: .hostname(address.host, port: address.port), serverName: "packs"),
            onServerRunning: { channel in ready.succeed(channel.localAddress?.port ?? address.port) },
            logger: logger
        )
    }
}

/// Why the content server could not start.
public struct PackServerError: Error, CustomStringConvertible, Sendable {
    private enum Code: Sendable {
        case directoryNotFound(String)
        case stoppedBeforeListening
        case authOnlyWithoutCredential
        case keysWithoutCredential
        case portOutOfRange(Int)
    }

    private let code: Code

    /// The folder to serve does not exist or is not a folder.
    public static func directoryNotFound(_ path: String) -> Self { Self(code: .directoryNotFound(path)) }
    /// The server stopped before it started listening.
    public static var stoppedBeforeListening: Self { Self(code: .stoppedBeforeListening) }
    /// `.authOnly` mode needs a token or an authorizer to decide with.
    public static var authOnlyWithoutCredential: Self { Self(code: .authOnlyWithoutCredential) }
    /// A port of the configuration is outside 0–65535.
    public static func portOutOfRange(_ port: Int) -> Self { Self(code: .portOutOfRange(port)) }
    /// Preload keys (``PackServerConfiguration/preloadKeys``) need an authorizer.
    public static var keysWithoutCredential: Self { Self(code: .keysWithoutCredential) }

    public var description: String {
        switch self.code {
        case .directoryNotFound(let path):
            return "The folder to serve, \(path), does not exist or is not a folder."
        case .stoppedBeforeListening:
            return "The server stopped before it started listening."
        case .authOnlyWithoutCredential:
            return "The auth-only gate needs a token or an authorizer to decide with."
        case .keysWithoutCredential:
            return "Preload keys are handed out only to credentials an authorizer checks."
        case .portOutOfRange(let port):
            return "The port \(port) is not a port: ports run from 0 (any free one) to 65535."
        }
    }
}

/// A one-shot signal carrying the listening port from `onServerRunning` to whoever waits for it.
final class ReadySignal: Sendable {
    private enum State {
        case waiting([CheckedContinuation<Int, any Error>])
        case done(Result<Int, any Error>)
    }

    private let state = Mutex<State>(.waiting([]))

    func succeed(_ port: Int) {
        self.complete(.success(port))
    }

    func fail(_ error: any Error) {
        self.complete(.failure(error))
    }

    private func complete(_ result: Result<Int, any Error>) {
        let waiters: [CheckedContinuation<Int, any Error>] = self.state.withLock { state in
            guard case .waiting(let waiters) = state else { return [] }
            state = .done(result)
            return waiters
        }
        for waiter in waiters {
            waiter.resume(with: result)
        }
    }

    func wait() async throws -> Int {
        try await withCheckedThrowingContinuation { continuation in
            let result: Result<Int, any Error>? = self.state.withLock { state in
                switch state {
                case .waiting(var waiters):
                    waiters.append(continuation)
                    state = .waiting(waiters)
                    return nil
                case .done(let result):
                    return result
                }
            }
            if let result {
                continuation.resume(with: result)
            }
        }
    }
}
