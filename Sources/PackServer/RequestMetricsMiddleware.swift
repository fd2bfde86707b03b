import Hummingbird
import NIOCore

/// Counts every request the router answers (``ServerMetrics/request(_:status:hadRange:bytes:started:)``)
/// once its body has been written, or has failed: its route and status, whether it carried a `Range`,
/// the body bytes handed to the connection (a `sendfile` body that finished: its announced length) and
/// its duration. Errors thrown below it become their responses here, as Hummingbird would make them.
struct RequestMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: ServerMetrics
    let mode: PackServerConfiguration.Mode

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = NIODeadline.now()
        let route = ServerMetrics.Route.of(path: request.uri.path, mode: self.mode)
        let hadRange = request.headers.contains(.range)
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        } catch {
            self.metrics.request(route, status: 500, hadRange: hadRange, bytes: 0, started: started)
            throw error
        }
        let status = Int(response.status.code)
        let metrics = self.metrics
        response.body = response.body.whenSent { bytes, _ in
            metrics.request(route, status: status, hadRange: hadRange, bytes: bytes, started: started)
        }
        return response
    }
}
