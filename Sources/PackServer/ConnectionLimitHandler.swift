import Logging
import NIOCore
import NIOHTTPTypes

/// Keeps the number of open connections within ``PackServerConfiguration/Limits/maxConnections``: a
/// new connection is let in, let in by closing the connection idle longest, or refused — closed at
/// once — when every connection is busy sending a response (see ``ConnectionLimiter``).
///
/// Why here and not Hummingbird's `AvailableConnectionsChannelHandler`: that one stops accepting at
/// the limit, so a few hundred clients that open connections and send nothing would lock everyone
/// out until their request timeouts; nginx, like this, closes an idle connection to make room.
///
/// It acts once, when the connection is set up (first in the pipeline, so a refused connection gets
/// nothing else), and then leaves the pipeline of a connection it let in, so that no request passes it;
/// whether the connection is idle is kept in its ``IdleMark`` by the ``RequestTimeoutHandler``, which
/// knows when it waits for a request.
final class ConnectionLimitHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    private let limiter: ConnectionLimiter
    private let idleMark: IdleMark
    private let logger: Logger
    private var isRefused = false

    init(limiter: ConnectionLimiter, idleMark: IdleMark, logger: Logger) {
        self.limiter = limiter
        self.idleMark = idleMark
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        switch self.limiter.admit(channel, mark: self.idleMark) {
        case .admitted:
            break
        case .admittedByClosing(let idle):
            self.logger.debug("At the connection limit: closing an idle connection for a new one.")
            idle.close(promise: nil)
        case .refused:
            self.logger.warning("At the connection limit (\(self.limiter.maximum)) and none is idle: refusing a connection.")
            self.isRefused = true
            context.close(promise: nil)
            return
        }
        channel.closeFuture.whenComplete { [limiter = self.limiter] _ in limiter.remove(channel) }
        // Nothing more to do here: leave once the pipeline is set up (the connection may already be
        // closed then, and its handlers gone: nothing to remove).
        let leave = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.execute {
            leave.value.pipeline.syncOperations.removeHandler(context: leave.value, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Closing a connection that was just accepted may fail on the way: expected, nothing to report.
        if self.isRefused { return }
        context.fireErrorCaught(error)
    }
}

@available(*, unavailable)
extension ConnectionLimitHandler: Sendable {}
