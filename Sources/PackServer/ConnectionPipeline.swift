import Logging
import NIOCore

/// The channel handlers `packs serve` adds to every HTTP/1.1 connection, one per concern, between
/// Hummingbird's HTTP parsing and its request handling (`HTTP1Channel`'s `additionalChannelHandlers`,
/// called once per connection). In pipeline order, from the socket's side:
///
/// 1. ``ConnectionLimitHandler``: admits the connection, closes an idle one for it, or refuses it;
///    then leaves the pipeline of a connection it let in.
/// 2. ``ConnectionFlowHandler``: flow control of response bodies, and file regions sent with `sendfile`.
/// 3. ``SendTimeoutHandler``: closes a connection whose client stops taking response bytes.
/// 4. ``LingeringCloseHandler``: answers a malformed request with 400 or 431 and drains the connection.
/// 5. ``RequestTimeoutHandler``: request and idle timeouts; keeps the connection's idle mark, and counts
///    its requests and responses for the ``LingeringCloseHandler`` too.
/// 6. ``FileFastPathHandler`` (serving files only): answers plain file requests on the event loop.
///
/// The order is what makes them work together: every write and file region passes the send timeout
/// on its way to ``ConnectionFlowHandler``, which sends regions below the HTTP encoder; the answer to
/// a malformed request passes the send timeout but not the request timeout's count of responses;
/// nothing read after a parse error reaches the handlers after ``LingeringCloseHandler``; and the
/// fast path's requests and answers pass the request timeout like the router's.
///
/// Each handler costs every request time, also where it only passes an event on: under 1,000
/// connections of 64 KiB ranges, about 1 µs of CPU per request each (its context and state are one
/// more thing to fetch from memory per request). So each sees only the direction it needs (flow
/// control and the send timeout are outbound only), keeps its state in itself rather than in objects
/// of its own, and the connection limit leaves once it has admitted the connection.
enum ConnectionPipeline {
    /// A new set of handlers for one connection.
    static func handlers(
        limits: PackServerConfiguration.Limits,
        limiter: ConnectionLimiter,
        fastPath: FileFastPath?,
        logger: Logger,
        metrics: ServerMetrics? = nil
    ) -> [any RemovableChannelHandler] {
        let idleMark = IdleMark()
        let requestTimeout = RequestTimeoutHandler(
            requestTimeout: limits.requestTimeout, idleTimeout: limits.idleTimeout, idleMark: idleMark, logger: logger)
        var handlers: [any RemovableChannelHandler] = [
            ConnectionLimitHandler(limiter: limiter, idleMark: idleMark, logger: logger),
            ConnectionFlowHandler(flow: ConnectionFlow(window: max(4096, limits.readChunkSize))),
            SendTimeoutHandler(timeout: limits.sendTimeout, logger: logger),
            // Asked only on a parse error, on the event loop, while both are in the pipeline.
            LingeringCloseHandler(
                lingeringTimeout: limits.lingeringTimeout, isResponding: { [unowned requestTimeout] in requestTimeout.isResponding },
                logger: logger, metrics: metrics),
            requestTimeout,
        ]
        if let fastPath {
            handlers.append(FileFastPathHandler(fastPath))
        }
        return handlers
    }

    /// A new set of handlers for one connection of the metrics listener: its own connection limit (the idlest
    /// closed for a new one), and the request and idle timeouts. Nothing else: it sends a few KiB of text and no
    /// files.
    static func metricsHandlers(
        limits: PackServerConfiguration.Limits, limiter: ConnectionLimiter, logger: Logger
    ) -> [any RemovableChannelHandler] {
        let idleMark = IdleMark()
        return [
            ConnectionLimitHandler(limiter: limiter, idleMark: idleMark, logger: logger),
            RequestTimeoutHandler(
                requestTimeout: limits.requestTimeout, idleTimeout: limits.idleTimeout, idleMark: idleMark, logger: logger),
        ]
    }
}
