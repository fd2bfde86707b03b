import CLinux
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Agent) import PackDelivery

/// The agent's HTTP API, version 1 (Sources/PackAgent/agent-openapi.yaml describes it; a test holds the two alike).
struct AgentRoutes: Sendable {
    static let clientVersionField = HTTPField.Name("Packs-Client-Version")!

    let homes: AgentHomes
    let events: AgentEventLog
    let version: String
    /// How often an idle event stream sends a comment line, so that a client gone away is noticed.
    let keepAlive: Duration

    func router() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.middlewares.add(ErrorShapeMiddleware())
        router.middlewares.add(VersionMiddleware(version: self.version))
        router.middlewares.add(FreshStatusMiddleware(homes: self.homes))
        router.get("/v1/version") { request, _ in self.versionAnswer(request) }
        router.get("/v1/downloads") { request, _ in try await self.status(request) }
        router.post("/v1/fetch") { request, _ in try await self.fetch(request) }
        router.post("/v1/homes") { request, _ in try await self.serve(request) }
        for action in ["pause", "resume", "cancel"] {
            router.post("/v1/downloads/{id}/\(action)") { request, context in
                try await self.control(request, id: context.parameters.require("id"), action: action)
            }
        }
        router.put("/v1/downloads/{id}/priority") { request, context in
            try await self.control(request, id: context.parameters.require("id"), action: "priority")
        }
        router.get("/v1/events") { request, _ in self.eventStream(request) }
        self.addLibraryRoutes(to: router)
        self.addUseRoutes(to: router)
        return router
    }

    /// `GET /v1/version[?home=DIR]`: the version, what the agent serves, and whether it serves that home (a client's
    /// cheap check before it sends a home's request here rather than running it in-process).
    private func versionAnswer(_ request: Request) -> Response {
        let paths = self.homes.paths
        let serves = request.uri.queryParameters.get("home").map { paths.contains(URL(filePath: $0).standardizedFileURL.path) }
        return Self.json(
            VersionAnswer(
                version: self.version, api: "v1", homes: paths.count, eventStreams: self.events.subscriberCount, servesHome: serves))
    }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        Self.json(line: AgentJSON.line(value), status: status)
    }

    /// A JSON answer already encoded (``AgentJSON/line(_:)``).
    static func json(line: String, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: line + "\n")))
    }

    static func body(_ request: Request, allowed: Set<String>, required: Set<String>) async throws -> StrictBody {
        var request = request
        let buffer = try await request.collectBody(upTo: 1 << 20)
        return try StrictBody(Data(buffer.readableBytesView), allowed: allowed, required: required)
    }

    /// `GET /v1/downloads?home=DIR`: what `packs --json status` prints.
    private func status(_ request: Request) async throws -> Response {
        guard let home = request.uri.queryParameters.get("home"), home.hasPrefix("/") else {
            throw AgentAPIError.badRequest("Name the home: ?home=ABSOLUTE_PATH.", code: "invalidField")
        }
        guard self.homes.hasStore(home: home) else { return Self.json(StatusJSON(transactions: [], evicted: nil)) }
        let (queue, cache) = try self.homes.served(home: home)
        let body = try await cache.answer {
            let transactions = try await queue.transactions()
            let evicted = try queue.evictedContent()
            return AgentJSON.line(
                StatusJSON(
                    transactions: transactions.map { TransactionJSON($0) }, evicted: evicted.isEmpty ? nil : evicted.map { EvictedJSON($0) }
                ))
        }
        return Self.json(line: body)
    }

    /// `POST /v1/fetch`: records the purchase of products from a manifest and starts their downloads; does not wait.
    private func fetch(_ request: Request) async throws -> Response {
        let body = try await Self.body(
            request, allowed: ["home", "manifest", "products", "priority", "destination", "receipt"],
            required: ["home", "manifest", "products"])
        let home = try body.home()
        let manifest = try body.string("manifest") ?? ""
        let products = try body.strings("products") ?? []
        let priority = try body.priority()
        let destination = try body.string("destination").map { word throws(AgentAPIError) in
            guard let destination = Destination(rawValue: word) else {
                throw AgentAPIError.badRequest("The field 'destination' must be caches or documents.", code: "invalidField")
            }
            return destination
        }
        let receipt = try body.receipt()
        let publishers = try DownloadQueue.trustedPublishers(home: Home(folder: URL(filePath: home)))
        let repositories = try DownloadQueue.trustedRepositories(home: Home(folder: URL(filePath: home)))
        // The receipt goes with the manifest request (a server that checks receipts lists what the receipt names).
        let options = TransferOptions(headers: receipt.map { ["Authorization: Bearer \($0)"] } ?? [])
        let loaded = try await LoadedManifest.load(manifest, options: options, trusting: publishers, repositories: repositories)
        let known = Set(loaded.manifest.products.map(\.productIdentifier))
        if let unknown = products.first(where: { !known.contains($0) }) {
            throw AgentAPIError(
                status: .unprocessableContent, code: PackDeliveryError.Code.unknownProduct.rawValue,
                message: "The manifest has no product '\(PackDeliveryError.printable(unknown))'.")
        }
        let queue = try self.homes.queue(home: home)
        try queue.acceptManifest(loaded)
        let transactions = try await queue.add(
            products: Array(Set(products)).sorted(), from: loaded, destination: destination ?? .caches, autoFinish: true,
            priority: priority, receipt: receipt)
        // The manifest's parse and the recording of a catalog leave much freed memory in glibc's heaps: give it back.
        defer { _ = clinux_malloc_trim(0) }
        let added = transactions.map {
            FetchAnswer.Added(
                id: $0.id, productIdentifier: $0.productIdentifier, downloads: $0.downloads.map(\.id))
        }
        return Self.json(FetchAnswer(transactions: added), status: .accepted)
    }

    /// `POST /v1/downloads/{id}/pause|resume|cancel` and `PUT /v1/downloads/{id}/priority`: the download afterwards.
    private func control(_ request: Request, id: String, action: String) async throws -> Response {
        let body = try await Self.body(
            request, allowed: action == "priority" ? ["home", "priority"] : ["home"],
            required: action == "priority" ? ["home", "priority"] : ["home"])
        let home = try body.home()
        let priority = try body.priority()
        // The library refuses an unknown id (404 unknownDownload) with the message the in-process CLI prints.
        let queue = try self.homes.queue(home: home)
        switch action {
        case "pause": try queue.pause([id])
        case "resume": _ = try queue.resume([id])
        case "cancel": try queue.cancel([id])
        default: _ = try queue.setPriority([id], priority ?? .essential)
        }
        guard let download = try queue.downloads([id]).first else {
            throw AgentAPIError(status: .notFound, code: "unknownDownload", message: "The download is gone.")
        }
        return Self.json(DownloadJSON(download))
    }

    /// `GET /v1/events`: server-sent events, each with an id; `Last-Event-ID` replays what the ring still holds, or
    /// starts with a `reset` event (read the status again).
    private func eventStream(_ request: Request) -> Response {
        let lastID = request.headers[HTTPField.Name("Last-Event-ID")!].flatMap { UInt64($0.trimmingCharacters(in: .whitespaces)) }
        let (replay, stream) = self.events.subscribe(after: lastID)
        let keepAlive = self.keepAlive
        let body = ResponseBody { writer in
            switch replay {
            case .reset(let latest):
                try await writer.write(ByteBuffer(string: "id: \(latest)\nevent: reset\ndata: {\"event\":\"reset\"}\n\n"))
            case .events(let entries):
                for entry in entries { try await writer.write(ByteBuffer(string: entry.text)) }
            }
            try await writer.write(ByteBuffer(string: ": stream\n\n"))
            try await Self.forward(stream, to: &writer, keepAlive: keepAlive)
            try await writer.finish(nil)
        }
        return Response(
            status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"], body: body)
    }

    /// Writes the stream's events as they come, and a comment line after `keepAlive` without one; a write that
    /// fails (the client went away) ends it, and with it the subscription.
    private static func forward(
        _ stream: AsyncStream<AgentEventLog.Entry>, to writer: inout any ResponseBodyWriter, keepAlive: Duration
    ) async throws {
        let merged = AsyncStream<AgentEventLog.Entry?> { continuation in
            let events = Task {
                for await entry in stream { continuation.yield(entry) }
                continuation.finish()
            }
            let ticks = Task {
                while !Task.isCancelled {
                    try? await Task.sleep(for: keepAlive)
                    continuation.yield(nil)
                }
            }
            continuation.onTermination = { _ in
                events.cancel()
                ticks.cancel()
            }
        }
        for await entry in merged {
            try await writer.write(ByteBuffer(string: entry?.text ?? ": keep-alive\n\n"))
        }
    }
}

/// Every thrown error as `{"error": {"code", "message"}}` with its status.
struct ErrorShapeMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as AgentAPIError {
            return Self.response(error)
        } catch let error as PackDeliveryError {
            return Self.response(AgentAPIError(error))
        } catch let error as any HTTPResponseError {
            let status = error.status
            let code =
                switch status.code {
                case 404: "notFound"
                case 405: "methodNotAllowed"
                case 413: "bodyTooLarge"
                default: status.code < 500 ? "badRequest" : "internalError"
                }
            return Self.response(AgentAPIError(status: status, code: code, message: "\(status.code) \(status.reasonPhrase)."))
        } catch {
            return Self.response(AgentAPIError(status: .internalServerError, code: "internalError", message: "The agent failed to answer."))
        }
    }

    static func response(_ error: AgentAPIError) -> Response {
        Response(
            status: error.status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(string: error.body + "\n")))
    }
}

/// A status read after a change asked of the agent sees it: every request but a read makes each home's next status
/// answer new (``AgentHomes/StatusCache``), whether or not the queue has reported its event yet.
struct FreshStatusMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext
    let homes: AgentHomes

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.method != .get else { return try await next(request, context) }
        defer { self.homes.statusChanged() }
        return try await next(request, context)
    }
}

/// Refuses a client of another major or minor version with 409 naming both; every request but `GET /v1/version`
/// must say its version.
struct VersionMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext
    let version: String

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let client = request.headers[AgentRoutes.clientVersionField] else {
            if request.uri.path == "/v1/version" { return try await next(request, context) }
            throw AgentAPIError(
                status: .badRequest, code: "missingClientVersion",
                message: "Send the Packs-Client-Version header with the client's version (this agent is \(self.version)).")
        }
        guard Self.majorMinor(client) == Self.majorMinor(self.version) else {
            throw AgentAPIError(
                status: .conflict, code: "versionMismatch",
                message:
                    "The client is version \(PackDeliveryError.printable(client)) and the agent is version \(self.version); their major and minor versions must match. Restart the agent with the same packs as the client."
            )
        }
        return try await next(request, context)
    }

    static func majorMinor(_ version: String) -> [Substring] {
        Array(version.trimmingCharacters(in: .whitespaces).split(separator: ".", omittingEmptySubsequences: false).prefix(2))
    }
}
