import HTTPTypes
import Hummingbird

/// Answers `GET /healthz` (and `HEAD`) with 200 `ok` for load balancers: before the request guard and
/// the authorization, so it needs no credential and no `Host`, in every mode (`--auth-only` too). It says
/// only that the server answers requests; a file named `healthz` at the folder's root is not served, under
/// whatever spelling of its path (``isHealthPath(_:)``).
struct HealthMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The path it answers.
    static var path: String { "/healthz" }

    /// Whether a request path (its query removed, still percent-encoded) names `/healthz` once the server has
    /// resolved it as it resolves a file: percent-decoded, empty segments dropped (`//healthz`, `/healthz/`).
    static func isHealthPath(_ path: some StringProtocol) -> Bool {
        if path == Self.path { return true }
        guard let decoded = ServedFolder.percentDecoded(String(path)) else { return false }
        return decoded.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true).map(Array.init) == [Array("healthz".utf8)]
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard Self.isHealthPath(request.uri.path), request.method == .get || request.method == .head else {
            return try await next(request, context)
        }
        let headers: HTTPFields = [.contentType: "text/plain; charset=utf-8", .cacheControl: "no-store", .contentLength: "3"]
        guard request.method == .get else { return Response(status: .ok, headers: headers, body: ResponseBody()) }
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: "ok\n")))
    }
}
