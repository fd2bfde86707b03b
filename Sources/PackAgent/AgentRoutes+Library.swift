import Foundation
import Hummingbird
import PackDelivery

// The library's calls beyond fetching and controlling downloads: finishing a transaction and collecting garbage in
// the caches (agent-openapi.yaml describes them).
extension AgentRoutes {
    func addLibraryRoutes(to router: Router<BasicRequestContext>) {
        router.post("/v1/transactions/{id}/finish") { request, context in
            try await self.finish(request, id: context.parameters.require("id"))
        }
        router.post("/v1/gc") { request, _ in try await self.collectGarbage(request) }
        router.get("/v1/content") { request, _ in try self.content(request) }
    }

    /// `GET /v1/content?home=DIR[&product=ID]`: the packs installed and evicted (one product's, or all), as the library
    /// lists them; naming a product with something installed records a use, as `packs content PRODUCT` does.
    private func content(_ request: Request) throws -> Response {
        guard let home = request.uri.queryParameters.get("home"), home.hasPrefix("/") else {
            throw AgentAPIError.badRequest("Name the home: ?home=ABSOLUTE_PATH.", code: "invalidField")
        }
        guard self.homes.hasStore(home: home) else { return Self.json(ContentAnswer(installed: [], evicted: [])) }
        let product = request.uri.queryParameters.get("product")
        let queue = try self.homes.queue(home: home)
        let installed = try queue.installedContent(forProductID: product)
        let evicted = try queue.evictedContent(forProductID: product)
        if let product, !installed.isEmpty { try? queue.recordUse(productID: product) }
        return Self.json(ContentAnswer(installed: installed, evicted: evicted))
    }

    /// `POST /v1/transactions/{id}/finish`: the transaction finished (200), or 409 `finishRefused` naming the downloads
    /// not settled, or 404 `unknownTransaction`.
    private func finish(_ request: Request, id: String) async throws -> Response {
        let body = try await Self.body(request, allowed: ["home"], required: ["home"])
        let queue = try self.homes.queue(home: try body.home())
        let finished = try await queue.finish([id])
        guard let transaction = finished.first else {
            throw AgentAPIError(
                status: .notFound, code: PackDeliveryError.Code.unknownTransaction.rawValue,
                message: "There is no transaction '\(PackDeliveryError.printable(id))'.")
        }
        return Self.json(TransactionJSON(transaction))
    }

    /// `POST /v1/gc`: evicts cached packs down to `to` bytes (the home's cache budget when absent, else 0), or only
    /// lists them with `dryRun`; answers what went and what the caches hold afterwards.
    private func collectGarbage(_ request: Request) async throws -> Response {
        let body = try await Self.body(request, allowed: ["home", "to", "dryRun"], required: ["home"])
        let queue = try self.homes.queue(home: try body.home())
        let dryRun = try body.bool("dryRun") ?? false
        let target = try body.byteCount("to") ?? queue.homeCacheBudget() ?? 0
        let evicted = try queue.evictCaches(downTo: target, dryRun: dryRun)
        let left = try queue.cachedBytes() - (dryRun ? evicted.reduce(0) { $0 + $1.byteCount } : 0)
        return Self.json(
            GCAnswer(
                evicted: evicted.map { EvictedJSON($0, event: dryRun ? "wouldEvict" : "evicted") }, target: target, cachedBytes: left))
    }
}

extension StrictBody {
    /// JSONSerialization reads `true` and `false` as numbers whose type is `c` (a C char), and numbers as other types.
    private static func isBoolean(_ number: NSNumber) -> Bool { String(cString: number.objCType) == "c" }

    func bool(_ key: String) throws(AgentAPIError) -> Bool? {
        guard let value = self.value(key) else { return nil }
        guard let number = value as? NSNumber, Self.isBoolean(number) else {
            throw .badRequest("The field '\(key)' must be true or false.", code: "invalidField")
        }
        return number.boolValue
    }

    /// A whole number of bytes, zero or more.
    func byteCount(_ key: String) throws(AgentAPIError) -> Int64? {
        guard let value = self.value(key) else { return nil }
        guard let number = value as? NSNumber, !Self.isBoolean(number), let bytes = value as? Int64, bytes >= 0 else {
            throw .badRequest("The field '\(key)' must be a whole number of bytes, zero or more.", code: "invalidField")
        }
        return bytes
    }
}

/// `POST /v1/gc`'s answer: the packs evicted (or that would be, `"event": "wouldEvict"`), the size aimed at, and the
/// bytes the caches hold afterwards.
public struct GCAnswer: Codable {
    public let evicted: [EvictedJSON]
    public let target: Int64
    public let cachedBytes: Int64
}
