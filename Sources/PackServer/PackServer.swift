import Foundation
import Hummingbird
import Logging
import ServiceLifecycle
import Synchronization

/// What `packs serve` and the embedded server of `packs demo` serve, and where.
public struct PackServerConfiguration: Sendable {
    /// The folder whose files are served; nothing outside it is ever served.
    public var directory: URL
    /// The address to listen on.
    public var host: String = "127.0.0.1"
    /// The port to listen on; 0 picks any free port (read it back from ``RunningPackServer/port``).
    public var port: Int = 8080
    /// When set, every request must carry `Authorization: Bearer <token>`; others get 401.
    public var token: String? = nil
    /// How long a graceful shutdown may wait for responses in flight before they are cancelled.
    public var gracefulShutdownTimeout: Duration = .seconds(2)

    /// Creates a configuration.
    ///
    /// - Parameters:
    ///   - directory: The folder whose files are served.
    ///   - host: The address to listen on.
    ///   - port: The port to listen on; 0 picks any free port.
    ///   - token: The bearer token every request must carry, or `nil` for none.
    ///   - gracefulShutdownTimeout: How long a shutdown waits for responses in flight.
    public init(
        directory: URL,
        host: String = "127.0.0.1",
        port: Int = 8080,
        token: String? = nil,
        gracefulShutdownTimeout: Duration = .seconds(2)
    ) {
        self.directory = directory
        self.host = host
        self.port = port
        self.token = token
        self.gracefulShutdownTimeout = gracefulShutdownTimeout
    }
}

/// A content server started by ``PackServer/start(_:logger:)``; stop it with ``stop()``.
public final class RunningPackServer: Sendable {
    /// The port the server listens on (the real one when the configuration asked for 0).
    public let port: Int
    /// The host the server listens on.
    public let host: String
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    init(port: Int, host: String, group: ServiceGroup, task: Task<Void, any Error>) {
        self.port = port
        self.host = host
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
    /// - Throws: When the folder does not exist or the address cannot be bound.
    public static func start(_ configuration: PackServerConfiguration, logger: Logger) async throws -> RunningPackServer {
        let ready = ReadySignal()
        let group = try Self.makeServiceGroup(configuration, logger: logger, signals: false, ready: ready)
        let task = Task {
            defer { ready.fail(PackServerError.stoppedBeforeListening) }
            try await group.run()
        }
        do {
            let port = try await ready.wait()
            return RunningPackServer(port: port, host: configuration.host, group: group, task: task)
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
    /// - Throws: When the folder does not exist or the address cannot be bound.
    public static func run(
        _ configuration: PackServerConfiguration,
        logger: Logger,
        onReady: @Sendable (Int) -> Void
    ) async throws {
        let ready = ReadySignal()
        let group = try Self.makeServiceGroup(configuration, logger: logger, signals: true, ready: ready)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask {
                defer { ready.fail(PackServerError.stoppedBeforeListening) }
                try await group.run()
            }
            if let port = try? await ready.wait() {
                onReady(port)
            }
            // Rethrows the server's error, if any.
            try await tasks.waitForAll()
        }
    }

    private static func makeServiceGroup(
        _ configuration: PackServerConfiguration,
        logger: Logger,
        signals: Bool,
        ready: ReadySignal
    ) throws -> ServiceGroup {
        let root = try Self.resolvedRoot(configuration.directory)

        let router = Router()
        router.add(middleware: RequestLogMiddleware<BasicRequestContext>())
        if let token = configuration.token {
            router.add(middleware: BearerTokenMiddleware<BasicRequestContext>(token: token))
        }
        router.add(middleware: FileValidatorsMiddleware<BasicRequestContext>(root: root))
        router.add(
            middleware: FileMiddleware<BasicRequestContext, LocalFileSystem>(
                root,
                searchForIndexHtml: false,
                logger: logger
            )
            .withAdditionalMediaType(.applicationJson, mappedToFileExtension: "json")
        )

        let application = Application(
            router: router,
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "packs"
            ),
            onServerRunning: { channel in
                ready.succeed(channel.localAddress?.port ?? configuration.port)
            },
            logger: logger
        )

        var groupConfiguration = ServiceGroupConfiguration(
            services: [application],
            gracefulShutdownSignals: signals ? [.sigterm, .sigint] : [],
            logger: logger
        )
        groupConfiguration.maximumGracefulShutdownDuration = configuration.gracefulShutdownTimeout
        groupConfiguration.maximumCancellationDuration = .seconds(2)
        return ServiceGroup(configuration: groupConfiguration)
    }

    /// The served folder as an absolute path with symbolic links resolved, so that the
    /// "inside the folder" check compares like with like.
    private static func resolvedRoot(_ directory: URL) throws -> String {
        let path = directory.standardizedFileURL.path
        guard let resolved = realpath(path, nil) else {
            throw PackServerError.directoryNotFound(path)
        }
        defer { free(resolved) }
        let root = String(cString: resolved)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw PackServerError.directoryNotFound(path)
        }
        return root
    }
}

/// Why the content server could not start.
public struct PackServerError: Error, CustomStringConvertible, Sendable {
    private enum Code: Sendable {
        case directoryNotFound(String)
        case stoppedBeforeListening
    }

    private let code: Code

    /// The folder to serve does not exist or is not a folder.
    public static func directoryNotFound(_ path: String) -> Self { Self(code: .directoryNotFound(path)) }
    /// The server stopped before it started listening.
    public static var stoppedBeforeListening: Self { Self(code: .stoppedBeforeListening) }

    public var description: String {
        switch self.code {
        case .directoryNotFound(let path):
            return "The folder to serve, \(path), does not exist or is not a folder."
        case .stoppedBeforeListening:
            return "The server stopped before it started listening."
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
