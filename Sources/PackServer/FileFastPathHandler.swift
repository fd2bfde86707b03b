import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOHTTPTypes
import PackDelivery

/// Answers a plain GET or HEAD of a file itself, on the event loop, when the router has nothing in
/// flight on the connection (so that answers stay in order); which requests, and their answers, are
/// ``FileFastPath``'s. The file's bytes go out as a ``FileRegionWrite`` (`sendfile`), and the request
/// is logged as ``RequestLogMiddleware`` logs it. Everything else goes on to Hummingbird's router.
///
/// Why: under 1,000 clients of 64 KiB ranges, Hummingbird's request path (a Swift task per request,
/// the async inbound stream and outbound writer, each a hop between the event loop and the task) cost
/// 270 µs of CPU per request against nginx's 43 µs; see Benchmarks/RESULTS.md.
///
/// Last of the connection's handlers: the ones before it see its answers as any other response.
final class FileFastPathHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let fastPath: FileFastPath
    /// The requests passed on to the router, and its responses.
    private var routed = ExchangeCount()
    /// The rest of a request answered here (its body and end) is dropped, not passed on.
    private var droppingRequest = false
    private var date = DateHeader()

    init(_ fastPath: FileFastPath) {
        self.fastPath = fastPath
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        switch part {
        case .head(let head):
            self.droppingRequest = false
            if self.routed.isIdle, let answer = self.fastPath.answer(to: head) {
                self.droppingRequest = true
                self.send(answer, to: head, context: context)
                return
            }
        case .body:
            if self.droppingRequest { return }
        case .end:
            if self.droppingRequest {
                self.droppingRequest = false
                return
            }
        }
        self.routed.read(part)
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        self.routed.wrote(self.unwrapOutboundIn(data))
        context.write(data, promise: promise)
    }

    /// Writes the head, the file's bytes and the end, then logs the request (and closes the connection
    /// when the request asked to).
    private func send(_ answer: FileFastPath.Answer, to head: HTTPRequest, context: ChannelHandlerContext) {
        let response = answer.response
        var headers = response.headers
        headers[.date] = self.date.now()
        headers[.server] = "packs"
        let closeAfter = head.headerFields.value(.connection)?.lowercased() == "close"
        if closeAfter {
            headers[.connection] = "close"
        }
        context.write(self.wrapOutboundOut(.head(HTTPResponse(status: response.status, headerFields: headers))), promise: nil)
        if !response.range.isEmpty {
            let region = FileRegionWrite(fd: answer.file.file.fd, offset: response.range.lowerBound, count: response.range.count)
            context.triggerUserOutboundEvent(region, promise: nil)
        }
        // Writes complete in order, and a failed one fails those after it: the end's completion is the
        // region's too. The file stays open until then.
        let end = context.eventLoop.makePromise(of: Void.self)
        context.write(self.wrapOutboundOut(.end(nil)), promise: end)
        context.flush()
        let file = answer.file
        let log = self.requestLog(answer, to: head)
        // Counted in the completion below, not in a closure of its own: no allocation more per request.
        let metrics = self.fastPath.metrics
        let started = metrics == nil ? nil : NIODeadline.now()
        let hadRange = metrics != nil && head.headerFields.contains(.range)
        end.futureResult.assumeIsolated().whenComplete { result in
            withExtendedLifetime(file) {}
            log?(result)
            if let metrics {
                let sent = if case .success = result { answer.response.range.count } else { 0 }
                metrics.request(
                    ServerMetrics.Route.of(path: answer.target, mode: .files), status: Int(answer.response.status.code),
                    hadRange: hadRange, bytes: sent, started: started)
            }
            if closeAfter { context.close(promise: nil) }
        }
    }
}

extension FileFastPathHandler {
    /// Logs a request answered here as ``RequestLogMiddleware`` does; `nil` when the log is off.
    private func requestLog(_ answer: FileFastPath.Answer, to head: HTTPRequest) -> ((Result<Void, any Error>) -> Void)? {
        let logger = self.fastPath.logger
        guard logger.logLevel <= .info else { return nil }
        let range = head.headerFields.value(.range).map(PackDeliveryError.printable) ?? "-"
        let request = "\(head.method) \(PackDeliveryError.printable(answer.target)) range=\(range) \(answer.response.status.code)"
        let count = answer.response.range.count
        let who = answer.credential.map { " " + $0 } ?? ""
        return { result in
            switch result {
            case .success: logger.info("\(request) \(count) bytes\(who)")
            case .failure(let error): logger.info("\(request) 0 bytes\(who)", metadata: ["error": "\(error)"])
            }
        }
    }
}

@available(*, unavailable)
extension FileFastPathHandler: Sendable {}
