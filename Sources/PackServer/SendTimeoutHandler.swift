import Logging
import NIOCore
import NIOHTTPTypes

/// Closes a connection whose client stops taking response bytes (nginx `send_timeout`): while any
/// write waits for the socket, one must complete within `timeout` of the last that did, or the
/// connection is closed. A client that stops reading would otherwise hold its connection, and the
/// file it was sent, for good.
///
/// It times every write that passes it — response parts, the answer to a malformed request, and file
/// regions (``FileRegionWrite`` events): it sits just before ``ConnectionFlowHandler``, which sends them.
///
/// Outbound only: the requests never pass it.
final class SendTimeoutHandler: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let timeout: Duration
    private let logger: Logger
    /// Writes handed on and not yet taken by the socket.
    private var pendingWrites = 0
    /// When the client must have taken some of the bytes waiting for it; `nil` while none wait.
    private var deadline: NIODeadline?
    private var timer = DeadlineTimer()
    private var isClosed = false

    init(timeout: Duration, logger: Logger) {
        self.timeout = timeout
        self.logger = logger
    }

    /// Also when the connection closes: its pipeline's handlers are removed then.
    func handlerRemoved(context: ChannelHandlerContext) {
        self.isClosed = true
        self.timer.cancel()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        context.write(data, promise: self.track(context: context, promise))
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if event is FileRegionWrite {
            context.triggerUserOutboundEvent(event, promise: self.track(context: context, promise))
        } else {
            context.triggerUserOutboundEvent(event, promise: promise)
        }
    }

    /// Counts a write as pending until the socket took it; the first pending write starts the timer,
    /// each completed one restarts it.
    private func track(context: ChannelHandlerContext, _ promise: EventLoopPromise<Void>?) -> EventLoopPromise<Void> {
        let written = promise ?? context.eventLoop.makePromise(of: Void.self)
        self.pendingWrites += 1
        if self.deadline == nil {
            let deadline = NIODeadline.now() + TimeAmount(self.timeout)
            self.deadline = deadline
            self.timer.schedule(by: deadline, on: context.eventLoop) { self.check(context: context) }
        }
        written.futureResult.assumeIsolated().whenComplete { _ in
            self.pendingWrites -= 1
            // Progress: the client took bytes. A later deadline needs no new check (the one
            // scheduled finds it not yet due and schedules again).
            self.deadline = self.pendingWrites > 0 ? .now() + TimeAmount(self.timeout) : nil
        }
        return written
    }

    private func check(context: ChannelHandlerContext) {
        guard !self.isClosed, context.channel.isActive, let deadline = self.deadline, self.pendingWrites > 0 else { return }
        guard deadline <= .now() else {
            self.timer.schedule(by: deadline, on: context.eventLoop) { self.check(context: context) }
            return
        }
        self.logger.info("The client took no response bytes for \(self.timeout): closing the connection.")
        self.isClosed = true
        context.close(promise: nil)
    }
}

@available(*, unavailable)
extension SendTimeoutHandler: Sendable {}
