import Logging
import NIOCore
import NIOHTTPTypes

/// Closes a connection that does not deliver a whole request within `requestTimeout` of being opened
/// (nginx `client_header_timeout`), or within `idleTimeout` of its previous response ending (nginx
/// `keepalive_timeout`): a client sending one header byte every few seconds, or one that keeps a
/// connection open and asks for nothing, would otherwise hold a descriptor for nothing. While a
/// response is being sent no request is due; a client that stops reading it is the
/// ``SendTimeoutHandler``'s business.
///
/// It also keeps the connection's ``IdleMark`` — idle while waiting for a request with nothing left to
/// send, or lingering — by which the ``ConnectionLimitHandler`` of a new connection picks the
/// connection to close for it: the same notion of idle as the idle timeout's.
final class RequestTimeoutHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let requestTimeout: Duration
    private let idleTimeout: Duration
    private let idleMark: IdleMark
    private let logger: Logger
    private var exchanges = ExchangeCount()
    /// Response ends written and not yet taken by the socket. Writes complete in order, so with none
    /// pending every response byte has been sent.
    private var unsentEnds = 0
    /// When a whole request must have arrived, and the timeout that set it; `nil` while responding.
    private var deadline: NIODeadline?
    private var timeout = Duration.zero
    /// Lingering or closed: no more requests.
    private var isStopped = false
    private var timer = DeadlineTimer()

    init(requestTimeout: Duration, idleTimeout: Duration, idleMark: IdleMark, logger: Logger) {
        self.requestTimeout = requestTimeout
        self.idleTimeout = idleTimeout
        self.idleMark = idleMark
        self.logger = logger
    }

    /// A request read to its end has not been answered to its end (for the ``LingeringCloseHandler``).
    var isResponding: Bool { self.exchanges.isResponding }

    func handlerAdded(context: ChannelHandlerContext) {
        self.startTimer(context: context, timeout: self.requestTimeout)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.stop()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.stop()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is LingeringCloseEvent {
            self.stop()
            self.idleMark.set(idle: true)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        self.exchanges.read(part)
        switch part {
        case .head:
            self.idleMark.set(idle: false)
        case .body:
            break
        case .end:
            // Answered already (on the event loop, before its end was read): waiting for the next one.
            if self.exchanges.isIdle {
                self.startTimer(context: context, timeout: self.idleTimeout)
                self.markIdleIfSent()
            } else {
                self.deadline = nil
            }
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let part = self.unwrapOutboundIn(data)
        guard !self.isStopped, case .end = part else {
            context.write(data, promise: promise)
            return
        }
        let written = promise ?? context.eventLoop.makePromise(of: Void.self)
        self.unsentEnds += 1
        written.futureResult.assumeIsolated().whenComplete { _ in
            self.unsentEnds -= 1
            self.markIdleIfSent()
        }
        context.write(data, promise: written)
        self.exchanges.wrote(part)
        if self.exchanges.isIdle {
            self.startTimer(context: context, timeout: self.idleTimeout)
        }
    }

    /// Marks the connection idle once it waits for a request with every response byte sent.
    private func markIdleIfSent() {
        if !self.isStopped, self.exchanges.isIdle, self.unsentEnds == 0 {
            self.idleMark.set(idle: true)
        }
    }

    private func startTimer(context: ChannelHandlerContext, timeout: Duration) {
        guard !self.isStopped else { return }
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        self.timeout = timeout
        self.deadline = deadline
        self.timer.schedule(by: deadline, on: context.eventLoop) { self.check(context: context) }
    }

    private func check(context: ChannelHandlerContext) {
        guard !self.isStopped, let deadline = self.deadline else { return }
        let now = NIODeadline.now()
        if deadline <= now {
            if self.exchanges.isReadingRequest || (self.exchanges.isIdle && self.unsentEnds == 0) {
                self.logger.debug(
                    self.exchanges.isFirstRequest
                        ? "No whole request within \(self.timeout): closing the connection."
                        : "Idle for \(self.timeout): closing the connection."
                )
                self.stop()
                context.close(promise: nil)
                return
            }
            // Responding (no request is due), or the last response is still being sent (the send
            // timeout's business): look again later.
            self.deadline = self.exchanges.isIdle ? now + TimeAmount(self.timeout) : nil
        }
        if let deadline = self.deadline {
            self.timer.schedule(by: deadline, on: context.eventLoop) { self.check(context: context) }
        }
    }

    private func stop() {
        self.isStopped = true
        self.deadline = nil
        self.timer.cancel()
    }
}

@available(*, unavailable)
extension RequestTimeoutHandler: Sendable {}
