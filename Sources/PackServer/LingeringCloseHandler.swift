import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes

/// Answers a malformed request and closes its connection the way nginx does (lingering close), so
/// that the connection's descriptor is released.
///
/// Why: Hummingbird answers a parse error with 400, half-closes and stops reading; a client with
/// unsent data then never closes its side, and the descriptor stays open for good (FIN-WAIT-2). Here
/// a header over the limit gets 431, any other parse error 400, both with `Connection: close`; then
/// the output is closed and the input read and thrown away until the client closes or
/// `lingeringTimeout` passes, and the connection is closed fully either way. A parse error while a
/// response is in flight closes at once: no answer could follow that response in order.
///
/// From then on nothing read goes further, and the handlers after this one are told with a
/// ``LingeringCloseEvent``. Nothing read goes further either once the connection is closed.
final class LingeringCloseHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private enum State {
        case open
        /// A parse error was answered and the output closed; input is drained until EOF or timeout.
        case lingering
        case closed
    }

    private let lingeringTimeout: Duration
    private let logger: Logger
    private var state = State.open
    /// Whether a response is in flight, as the ``RequestTimeoutHandler`` counts them.
    private let isResponding: () -> Bool
    private var timer = DeadlineTimer()

    /// Counts the 400 and 431 answers, when metrics are on.
    private let metrics: ServerMetrics?

    init(lingeringTimeout: Duration, isResponding: @escaping () -> Bool, logger: Logger, metrics: ServerMetrics? = nil) {
        self.lingeringTimeout = lingeringTimeout
        self.isResponding = isResponding
        self.logger = logger
        self.metrics = metrics
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.timer.cancel()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.state = .closed
        self.timer.cancel()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .open = self.state, context.channel.isActive else { return }
        context.fireChannelRead(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .lingering = self.state {
            // Nobody after this reads any more: ask for more input here, to drain it.
            context.read()
            return
        }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .lingering = self.state, let event = event as? ChannelEvent, event == .inputClosed {
            // The client closed its side after reading the answer: done.
            self.closeFully(context: context)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // After the parse error (ByteToMessageDecoderError.dataReceivedInErrorState) or once closed,
        // errors are expected: nothing to report.
        guard case .open = self.state, context.channel.isActive else { return }
        guard let parserError = error as? HTTPParserError else {
            context.fireErrorCaught(error)
            return
        }
        if self.isResponding() {
            self.closeFully(context: context)
        } else {
            self.answerAndLinger(context: context, status: parserError == .headerOverflow ? .requestHeaderFieldsTooLarge : .badRequest)
        }
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if self.state != .open, event is FileRegionWrite {
            // No response bytes after the answer that closes the connection.
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.triggerUserOutboundEvent(event, promise: promise)
    }

    private func answerAndLinger(context: ChannelHandlerContext, status: HTTPResponse.Status) {
        self.state = .lingering
        context.fireUserInboundEventTriggered(LingeringCloseEvent())
        self.logger.info("\(status.code) \(status.reasonPhrase): closing the connection")
        self.metrics?.request(.malformed, status: status.code, hadRange: false, bytes: 0, started: nil)
        let head = HTTPResponse(status: status, headerFields: [.connection: "close", .contentLength: "0"])
        context.write(self.wrapOutboundOut(.head(head)), promise: nil)
        let sent = context.eventLoop.makePromise(of: Void.self)
        context.write(self.wrapOutboundOut(.end(nil)), promise: sent)
        context.flush()
        sent.futureResult.assumeIsolated().whenComplete { result in
            guard case .lingering = self.state, case .success = result else {
                self.closeFully(context: context)
                return
            }
            // FIN after the answer, then read until the client closes (or the timer): closing with
            // unread input would send a reset, which can destroy the answer before it is read.
            context.close(mode: .output, promise: nil)
            context.read()
        }
        self.timer.schedule(by: .now() + TimeAmount(self.lingeringTimeout), on: context.eventLoop) {
            self.closeFully(context: context)
        }
    }

    private func closeFully(context: ChannelHandlerContext) {
        if case .closed = self.state { return }
        self.state = .closed
        self.timer.cancel()
        context.close(promise: nil)
    }
}

@available(*, unavailable)
extension LingeringCloseHandler: Sendable {}

/// The connection answered a malformed request and only drains its input until it closes: it takes
/// no more requests and is idle. Sent by ``LingeringCloseHandler`` to the handlers after it.
struct LingeringCloseEvent: Sendable {}
