import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1

/// Ties a connection's ``ConnectionFlow`` to its pipeline, so that a response body never runs ahead
/// of the socket:
///
/// - registers the flow for the connection, where the router's ``PackRequestContext`` finds it;
/// - releases the bytes of each body write from the flow once the socket took them;
/// - sends file regions: a ``FileRegionWrite`` event becomes a `FileRegion` written from the HTTP
///   codec's position, so that it enters NIO's HTTP/1 encoder (which frames it with the
///   `Content-Length` already sent) below the typed HTTP parts; NIO sends it with `sendfile`.
///
/// It sits just after the codec, so that every write and region passes the handlers before it (the
/// ``SendTimeoutHandler`` times them). Outbound only.
final class ConnectionFlowHandler: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let flow: ConnectionFlow
    /// The HTTP codec's context, where file regions are written from.
    private var codec: ChannelHandlerContext?

    init(flow: ConnectionFlow) {
        self.flow = flow
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        ConnectionFlow.register(self.flow, for: channel)
        // The head and file region of a range of up to 256 KiB stay below the high watermark, so the
        // channel stays writable while they are sent: two writability events fewer per such request,
        // each passing every handler and Hummingbird's writer. Body bytes are held to the flow's
        // window anyway.
        let waterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 128 * 1024, high: 320 * 1024)
        try? channel.syncOptions?.setOption(.writeBufferWaterMark, value: waterMark)
        guard let codec = try? context.pipeline.syncOperations.context(handlerType: HTTP1ToHTTPServerCodec.self) else { return }
        self.codec = codec
        // A body's region enters at the tail, like the body's other writes, and passes every handler.
        self.flow.attachRegionWriter(
            { fd, offset, count, done in
                channel.eventLoop.execute {
                    let written = channel.eventLoop.makePromise(of: Void.self)
                    written.futureResult.whenComplete(done)
                    channel.pipeline.syncOperations.triggerUserOutboundEvent(
                        FileRegionWrite(fd: fd, offset: offset, count: count), promise: written)
                }
            },
            abort: { channel.close(promise: nil) }
        )
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .body(let buffer) = self.unwrapOutboundIn(data) else {
            context.write(data, promise: promise)
            return
        }
        let bytes = buffer.readableBytes
        let written = promise ?? context.eventLoop.makePromise(of: Void.self)
        written.futureResult.whenComplete { [flow = self.flow] _ in flow.release(bytes) }
        context.write(data, promise: written)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let region = event as? FileRegionWrite else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        guard let codec = self.codec, context.channel.isActive else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            // Without the codec (not Hummingbird's HTTP/1 pipeline) a head announcing the region may be out: close.
            if self.codec == nil { context.close(promise: nil) }
            return
        }
        let handle = NIOFileHandle(_deprecatedTakingOwnershipOfDescriptor: region.fd)
        let written = promise ?? context.eventLoop.makePromise(of: Void.self)
        written.futureResult.assumeIsolated().whenComplete { _ in
            // The descriptor is the sender's: let go without closing it.
            _ = try? handle.takeDescriptorOwnership()
        }
        let fileRegion = FileRegion(fileHandle: handle, readerIndex: region.offset, endIndex: region.offset + region.count)
        codec.writeAndFlush(NIOAny(HTTPServerResponsePart.body(.fileRegion(fileRegion))), promise: written)
    }
}

@available(*, unavailable)
extension ConnectionFlowHandler: Sendable {}

/// An outbound user event asking for `count` bytes of the open file `fd` from `offset` to be sent as
/// the body (or part of it) of the response being written, with `sendfile`. Its promise completes once
/// the socket took the last byte; `fd` stays the sender's, open until then.
struct FileRegionWrite: Sendable {
    let fd: Int32
    let offset: Int
    let count: Int
}
