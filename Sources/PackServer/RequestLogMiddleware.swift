import Hummingbird
import Logging
import PackDelivery
import Synchronization

/// Logs one info line per request once its body has been written (or has failed):
/// method, path (never the query, which may carry credentials), `Range` header (both as
/// ``PackDeliveryError/printable(_:)`` shows them: a raw ESC or U+009B from a client does not reach a terminal), status and the body
/// bytes handed to the connection (for a failed sendfile body: those counted before it failed, 0), then
/// who presented the credential when the authorizer said (`receipt=<id> subject=<subject>`, never the token).
struct RequestLogMiddleware<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        } catch {
            Self.log(request, status: 500, bytes: 0, credential: nil, failure: error, logger: context.logger)
            throw error
        }

        let status = Int(response.status.code)
        let logger = context.logger
        let credential = (context as? PackRequestContext)?.notes.credential
        guard logger.logLevel <= .info else {
            // Nothing would be logged (packs serve --quiet): leave the body as it is.
            return response
        }
        response.body = response.body.whenSent { bytes, failure in
            Self.log(request, status: status, bytes: bytes, credential: credential, failure: failure, logger: logger)
        }
        return response
    }

    private static func log(_ request: Request, status: Int, bytes: Int, credential: String?, failure: (any Error)?, logger: Logger) {
        let line: Logger.Message =
            "\(request.method) \(PackDeliveryError.printable(request.uri.path)) range=\(request.headers[.range].map(PackDeliveryError.printable) ?? "-") \(status) \(bytes) bytes\(credential.map { " " + $0 } ?? "")"
        if let failure {
            logger.info(line, metadata: ["error": "\(failure)"])
        } else {
            logger.info(line)
        }
    }
}

extension ResponseBody {
    /// This body, calling `report` once it has been written (with the bytes handed to the connection) or has failed
    /// (with the bytes counted before the failure, and the error): for the request log and the metrics.
    func whenSent(_ report: @escaping @Sendable (_ bytes: Int, _ failure: (any Error)?) -> Void) -> ResponseBody {
        let body = self
        let counter = ByteCounter()
        return ResponseBody(contentLength: body.contentLength) { writer in
            do {
                try await body.write(
                    writer.map { buffer in
                        counter.add(buffer.readableBytes)
                        return buffer
                    }
                )
            } catch {
                report(counter.value, error)
                throw error
            }
            // A file sent with sendfile does not pass through the writer: once the body finished, all of its
            // announced length was sent.
            report(body.contentLength ?? counter.value, nil)
        }
    }
}

/// Bytes written so far by one response body.
final class ByteCounter: Sendable {
    private let count = Atomic<Int>(0)

    func add(_ bytes: Int) {
        self.count.add(bytes, ordering: .relaxed)
    }

    var value: Int {
        self.count.load(ordering: .relaxed)
    }
}
