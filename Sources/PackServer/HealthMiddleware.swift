import HTTPTypes
import Hummingbird

/// Answers `GET /healthz` (and `HEAD`) with 200 `ok` for load balancers: before the request guard and
/// the authorization, so it needs no credential and no `Host`, in every mode (`--auth-only` too). It says
/// only that the server answers requests; a file named `healthz` at the folder's root is not served.
struct HealthMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The path it answers.
    static var path: String { "/healthz" }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.uri.path == Self.path, request.method == .get || request.method == .head else {
            return try await next(request, context)
        }
        let headers: HTTPFields = [.contentType: "text/plain; charset=utf-8", .cacheControl: "no-store", .contentLength: "3"]
        guard request.method == .get else { return Response(status: .ok, headers: headers, body: ResponseBody()) }
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(string: "ok\n")))
    }
}
