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
        let hadRange = request.headers[.range] != nil
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
        let body = response.body
        let metrics = self.metrics
        let counter = ByteCounter()
        response.body = ResponseBody(contentLength: body.contentLength) { writer in
            do {
                try await body.write(
                    writer.map { buffer in
                        counter.add(buffer.readableBytes)
                        return buffer
                    }
                )
            } catch {
                metrics.request(route, status: status, hadRange: hadRange, bytes: counter.value, started: started)
                throw error
            }
            // A file sent with sendfile does not pass through the writer: once the body finished, all of
            // its announced length was sent.
            metrics.request(route, status: status, hadRange: hadRange, bytes: body.contentLength ?? counter.value, started: started)
        }
        return response
    }
}
