import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Guards one HTTP/1.1 connection against clients that hold it without using it. It sits in the
/// channel pipeline just after HTTP parsing (Hummingbird's `additionalChannelHandlers`), sees
/// request and response parts, and:
///
/// - **Request timeout** (nginx `client_header_timeout`): a connection must deliver a whole request
///   within `requestTimeout` of being opened or of its previous response ending (the latter is nginx's
///   `keepalive_timeout`, here `idleTimeout`); a client sending one header byte every few seconds is
///   closed then.
/// - **Send timeout** (nginx `send_timeout`): while response bytes wait for the client, some must be
///   taken within `sendTimeout`, or the connection is closed.
/// - **Malformed requests**: Hummingbird answers a parse error with 400, half-closes and stops
///   reading; a client with unsent data then never closes its side, and the connection's descriptor
///   stays open for good (FIN-WAIT-2). Here a header over the limit gets 431, any other parse error
///   400, both with `Connection: close`; then the output is closed and the input is read and thrown
///   away until the client closes or `lingeringTimeout` passes (nginx's lingering close), and the
///   connection is closed fully either way.
/// - **Files**: writes the file regions ``ConnectionFlow/sendFile(_:offset:count:)`` asks for (sent
///   with `sendfile`), and releases the body bytes of each other write from the connection's
///   ``ConnectionFlow`` once the socket took them, so a body never runs ahead of the socket.
/// - **Connection limit**: registers with the ``ConnectionLimiter``, telling it when the connection is
///   idle (waiting for a request, or lingering) and may be closed to make room for a new client.
final class ConnectionGuard: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private enum State {
        /// Reading requests and writing responses; see the counters for where it stands.
        case open
        /// A parse error was answered and the output closed; input is drained until EOF or timeout.
        case lingering
        case closed
    }

    private let limits: PackServerConfiguration.Limits
    private let limiter: ConnectionLimiter
    private let logger: Logger
    private var state = State.open
    /// Request heads received, requests read to their end, and responses written to their end. A
    /// client may send its next request before the previous response's end has passed here (it has
    /// all the bytes once the body is sent), so these are counts, not one state.
    private var requestsStarted = 0
    private var requestsEnded = 0
    private var responsesEnded = 0

    /// A request has started and not been read to its end.
    private var isReadingRequest: Bool { self.requestsStarted > self.requestsEnded }
    /// Every request read has been answered to its end: waiting for the next one.
    private var isIdle: Bool { self.requestsStarted == self.requestsEnded && self.responsesEnded == self.requestsEnded }
    // Deadlines, checked by one scheduled task at a time (rescheduling a timer for every request
    // and every write cost 12 % of the CPU of a small request under load).
    /// When a whole request must have arrived (new connection, or idle after a response).
    private var requestDeadline: NIODeadline?
    private var requestTimeout = Duration.zero
    /// When the client must have taken some of the response bytes waiting for it.
    private var sendDeadline: NIODeadline?
    /// When a lingering close ends.
    private var lingerDeadline: NIODeadline?
    private var check: Scheduled<Void>?
    private var checkAt: NIODeadline?
    /// This connection's idle mark in the ``ConnectionLimiter``.
    private let idleMark = IdleMark()
    private var pendingWrites = 0
    private let flow: ConnectionFlow
    private let fastPath: FileFastPath?
    /// The rest of a request answered here (its body and end) is dropped, not passed on.
    private var droppingRequest = false

    init(limits: PackServerConfiguration.Limits, limiter: ConnectionLimiter, logger: Logger, fastPath: FileFastPath?) {
        self.limits = limits
        self.limiter = limiter
        self.logger = logger
        self.fastPath = fastPath
        self.flow = ConnectionFlow(window: max(4096, limits.readChunkSize))
    }

    // MARK: - Lifecycle

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
            self.state = .closed
            context.close(promise: nil)
            return
        }
        channel.closeFuture.whenComplete { [limiter = self.limiter] _ in limiter.remove(channel) }
        ConnectionFlow.register(self.flow, for: channel)
        // File regions are written from the HTTP codec's position, so they enter the HTTP/1 encoder
        // (which frames them with the Content-Length already sent) below the typed HTTP parts.
        if let codec = try? context.pipeline.syncOperations.context(handlerType: HTTP1ToHTTPServerCodec.self) {
            let bound = NIOLoopBound((handler: self, context: context, codec: codec), eventLoop: context.eventLoop)
            let eventLoop = context.eventLoop
            self.flow.attachRegionWriter(
                { fd, offset, count, done in
                    eventLoop.execute {
                        let (handler, context, codec) = bound.value
                        handler.writeRegion(context: context, codec: codec, fd: fd, offset: offset, count: count, done: done)
                    }
                },
                abort: { channel.close(promise: nil) }
            )
        }
        self.startRequestTimer(context: context, timeout: self.limits.requestTimeout)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.cancelTimers()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.state = .closed
        self.cancelTimers()
        context.fireChannelInactive()
    }

    // MARK: - Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .open = self.state else { return }
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            self.droppingRequest = false
            self.idleMark.set(idle: false)
            if self.answerHere(context: context, head) {
                self.droppingRequest = true
                return
            }
            self.requestsStarted += 1
        case .body:
            if self.droppingRequest { return }
        case .end:
            if self.droppingRequest {
                self.droppingRequest = false
                return
            }
            self.requestsEnded += 1
            self.requestDeadline = nil
        }
        context.fireChannelRead(data)
    }

    // MARK: - Fast path

    /// Answers a plain GET or HEAD of a file here, on the event loop, when nothing else is in flight
    /// on the connection; returns whether it did. Everything else — errors, redirects, 304, 412,
    /// 416, refusals, requests with a body — goes on to Hummingbird's router, which answers it the
    /// same way (the checks are the same functions).
    ///
    /// Why: under 1,000 clients of 64 KiB ranges, Hummingbird's request path (a Swift task per
    /// request, the async inbound stream and outbound writer, each a hop between the event loop and
    /// the task) cost 270 µs of CPU per request against nginx's 43 µs; see Benchmarks/RESULTS.md.
    private func answerHere(context: ChannelHandlerContext, _ head: HTTPRequest) -> Bool {
        guard let fastPath = self.fastPath, self.isIdle, head.method == .get || head.method == .head,
            let path = head.path, let authority = head.authority, RequestGuardMiddleware<PackRequestContext>.isValidHost(authority),
            !head.headerFields.contains(where: { $0.name.canonicalName == "host" }),
            head.headerFields[.transferEncoding] == nil, (head.headerFields[.contentLength] ?? "0") == "0"
        else { return false }
        let target = path.prefix { $0 != "?" }
        var credential: String?
        if let authorizer = fastPath.authorizer {
            guard let resource = fastPath.index.resource(forRequestTarget: String(target)) else { return false }
            let grant = authorizer.authorize(authorization: head.headerFields[.authorization], resource: resource)
            // Refusals, and a catalog made for the credential's products, are the router's.
            guard grant.decision == .allow else { return false }
            if case .catalog = resource.kind, grant.products != nil { return false }
            credential = grant.credential
        }
        guard case .file(let file) = fastPath.folder.resolve(encodedPath: String(target)),
            case .send(let answer) = PackFileMiddleware<PackRequestContext>.outcome(
                method: head.method, path: String(target), headers: head.headerFields, file: file)
        else { return false }

        self.requestDeadline = nil
        var headers = answer.headers
        headers[.date] = HTTPDate.format(seconds: Int(time(nil)))
        headers[.server] = "packs"
        let closeAfter = head.headerFields[.connection]?.lowercased() == "close"
        if closeAfter {
            headers[.connection] = "close"
        }
        self.trackedWrite(
            context: context, data: self.wrapOutboundOut(.head(HTTPResponse(status: answer.status, headerFields: headers))), promise: nil)

        let logger = fastPath.logger
        let who = credential.map { " " + $0 } ?? ""
        let log: @Sendable (Int, (any Error)?) -> Void = { bytes, failure in
            guard logger.logLevel <= .info else { return }
            let line: Logger.Message =
                "\(head.method) \(target) range=\(head.headerFields[.range] ?? "-") \(answer.status.code) \(bytes) bytes\(who)"
            if let failure { logger.info(line, metadata: ["error": "\(failure)"]) } else { logger.info(line) }
        }
        let end = context.eventLoop.makePromise(of: Void.self)
        if answer.range.isEmpty {
            self.trackedWrite(context: context, data: self.wrapOutboundOut(.end(nil)), promise: end)
            context.flush()
        } else {
            guard let codec = try? context.pipeline.syncOperations.context(handlerType: HTTP1ToHTTPServerCodec.self) else {
                // Cannot happen in Hummingbird's HTTP/1 pipeline; if it did, the head is out: close.
                self.closeFully(context: context)
                return true
            }
            // `file` stays open until its bytes are sent (the closure holds it).
            self.writeRegion(context: context, codec: codec, fd: file.file.fd, offset: answer.range.lowerBound, count: answer.range.count) {
                result in
                withExtendedLifetime(file) {}
                if case .failure(let error) = result { log(0, error) }
            }
            self.trackedWrite(context: context, data: self.wrapOutboundOut(.end(nil)), promise: end)
            context.flush()
        }
        end.futureResult.assumeIsolated().whenComplete { result in
            if case .success = result { log(answer.range.count, nil) }
            if closeAfter { self.closeFully(context: context) }
        }
        if !closeAfter {
            self.startRequestTimer(context: context, timeout: self.limits.idleTimeout)
        }
        return true
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .lingering = self.state {
            // Nobody above reads any more: ask for more input ourselves, to drain it.
            context.read()
            return
        }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .lingering = self.state, let event = event as? ChannelEvent, event == .inputClosed {
            // The client closed its side after reading our answer: done.
            self.closeFully(context: context)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        switch self.state {
        case .lingering, .closed:
            // Bytes after the parse error (ByteToMessageDecoderError.dataReceivedInErrorState), or
            // a reset while draining: expected, nothing to report.
            return
        case .open:
            guard let parserError = error as? HTTPParserError else { break }
            if self.responsesEnded < self.requestsEnded {
                // A request after one still being answered is malformed: no answer can follow the
                // response in flight in order. Close.
                self.closeFully(context: context)
            } else {
                self.answerAndLinger(context: context, status: parserError == .headerOverflow ? .requestHeaderFieldsTooLarge : .badRequest)
            }
            return
        }
        context.fireErrorCaught(error)
    }

    // MARK: - Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let isEnd: Bool
        if case .end = self.unwrapOutboundIn(data) { isEnd = true } else { isEnd = false }
        self.trackedWrite(context: context, data: data, promise: promise)
        if isEnd, case .open = self.state {
            self.responsesEnded += 1
            if self.isIdle {
                self.startRequestTimer(context: context, timeout: self.limits.idleTimeout)
            }
        }
    }

    /// Writes and counts the write as pending until the socket took it; while any is pending the
    /// send timer runs, restarted by each completed write.
    private func trackedWrite(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let written = promise ?? context.eventLoop.makePromise(of: Void.self)
        if case .body(let buffer) = self.unwrapOutboundIn(data) {
            let bytes = buffer.readableBytes
            written.futureResult.whenComplete { [flow = self.flow] _ in flow.release(bytes) }
        }
        self.pendingWrites += 1
        if self.sendDeadline == nil {
            self.sendDeadline = .now() + TimeAmount(self.limits.sendTimeout)
            self.armCheck(context: context)
        }
        written.futureResult.assumeIsolated().whenComplete { _ in
            self.writeCompleted(context: context)
        }
        context.write(data, promise: written)
    }

    /// Writes `count` bytes of `fd` from `offset` as a `FileRegion` (sent with `sendfile`), tracked
    /// by the send timer like any write. `fd` stays owned by the caller, who keeps it open until `done`.
    private func writeRegion(
        context: ChannelHandlerContext,
        codec: ChannelHandlerContext,
        fd: Int32,
        offset: Int,
        count: Int,
        done: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        guard case .open = self.state, context.channel.isActive else {
            done(.failure(ChannelError.ioOnClosedChannel))
            return
        }
        let handle = NIOFileHandle(_deprecatedTakingOwnershipOfDescriptor: fd)
        let region = FileRegion(fileHandle: handle, readerIndex: offset, endIndex: offset + count)
        let written = context.eventLoop.makePromise(of: Void.self)
        self.pendingWrites += 1
        if self.sendDeadline == nil {
            self.sendDeadline = .now() + TimeAmount(self.limits.sendTimeout)
            self.armCheck(context: context)
        }
        written.futureResult.assumeIsolated().whenComplete { result in
            // The descriptor belongs to the caller's OpenFile: let go without closing it.
            _ = try? handle.takeDescriptorOwnership()
            self.writeCompleted(context: context)
            done(result)
        }
        codec.writeAndFlush(NIOAny(HTTPServerResponsePart.body(.fileRegion(region))), promise: written)
    }

    private func writeCompleted(context: ChannelHandlerContext) {
        self.pendingWrites -= 1
        if self.pendingWrites > 0 {
            // Progress: the client took bytes. A later deadline needs no new check (the one
            // scheduled finds it not yet due and reschedules).
            self.sendDeadline = .now() + TimeAmount(self.limits.sendTimeout)
        } else {
            self.sendDeadline = nil
            if case .open = self.state, self.isIdle {
                self.idleMark.set(idle: true)
            }
        }
    }

    // MARK: - Parse errors

    private func answerAndLinger(context: ChannelHandlerContext, status: HTTPResponse.Status) {
        self.state = .lingering
        self.requestDeadline = nil
        self.idleMark.set(idle: true)
        self.logger.info("\(status.code) \(status.reasonPhrase): closing the connection")
        let head = HTTPResponse(status: status, headerFields: [.connection: "close", .contentLength: "0"])
        self.trackedWrite(context: context, data: self.wrapOutboundOut(.head(head)), promise: nil)
        let sent = context.eventLoop.makePromise(of: Void.self)
        self.trackedWrite(context: context, data: self.wrapOutboundOut(.end(nil)), promise: sent)
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
        self.lingerDeadline = .now() + TimeAmount(self.limits.lingeringTimeout)
        self.armCheck(context: context)
    }

    // MARK: - Timers

    private func startRequestTimer(context: ChannelHandlerContext, timeout: Duration) {
        self.requestTimeout = timeout
        self.requestDeadline = .now() + TimeAmount(timeout)
        self.armCheck(context: context)
    }

    /// Makes sure a check runs no later than the earliest deadline.
    private func armCheck(context: ChannelHandlerContext) {
        guard let earliest = [self.requestDeadline, self.sendDeadline, self.lingerDeadline].compactMap({ $0 }).min() else { return }
        if let checkAt = self.checkAt, checkAt <= earliest { return }
        self.check?.cancel()
        self.checkAt = earliest
        self.check = context.eventLoop.assumeIsolated().scheduleTask(deadline: earliest) {
            self.check = nil
            self.checkAt = nil
            self.runChecks(context: context)
        }
    }

    private func runChecks(context: ChannelHandlerContext) {
        let now = NIODeadline.now()
        if let deadline = self.lingerDeadline, deadline <= now {
            self.closeFully(context: context)
            return
        }
        if let deadline = self.sendDeadline, deadline <= now, self.pendingWrites > 0 {
            self.logger.info("The client took no response bytes for \(self.limits.sendTimeout): closing the connection.")
            self.closeFully(context: context)
            return
        }
        if let deadline = self.requestDeadline, deadline <= now, case .open = self.state {
            if self.isReadingRequest || (self.isIdle && self.pendingWrites == 0) {
                self.logger.debug(
                    self.responsesEnded == 0
                        ? "No whole request within \(self.requestTimeout): closing the connection."
                        : "Idle for \(self.requestTimeout): closing the connection."
                )
                self.closeFully(context: context)
                return
            }
            // Responding (no request timeout then), or the last response is still being sent (the
            // send deadline's business): look again later.
            self.requestDeadline = self.isIdle ? now + TimeAmount(self.requestTimeout) : nil
        }
        self.armCheck(context: context)
    }

    private func cancelTimers() {
        self.check?.cancel()
        self.check = nil
        self.checkAt = nil
        self.requestDeadline = nil
        self.sendDeadline = nil
        self.lingerDeadline = nil
    }

    private func closeFully(context: ChannelHandlerContext) {
        if case .closed = self.state { return }
        self.state = .closed
        self.cancelTimers()
        context.close(promise: nil)
    }
}

extension TimeAmount {
    /// A `Duration` as NIO's `TimeAmount` (nanoseconds, saturating).
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        self = .nanoseconds(overflow ? Int64.max : scaled &+ attoseconds / 1_000_000_000)
    }
}

/// Whether a connection is idle (waiting for a request, or lingering), and since when: an atomic, so
/// that marking it costs no lock on every request.
final class IdleMark: Sendable {
    /// Nanoseconds of `NIODeadline.now()` when it became idle, or 0 while busy.
    private let since = Atomic<Int64>(0)

    init() {
        self.set(idle: true)
    }

    func set(idle: Bool) {
        if idle {
            // Keep the first moment it became idle.
            _ = self.since.compareExchange(
                expected: 0, desired: max(1, Int64(NIODeadline.now().uptimeNanoseconds & UInt64(Int64.max))), ordering: .relaxed)
        } else if self.since.load(ordering: .relaxed) != 0 {
            self.since.store(0, ordering: .relaxed)
        }
    }

    /// When it became idle (uptime nanoseconds), or `nil` while busy.
    var idleSince: Int64? {
        let value = self.since.load(ordering: .relaxed)
        return value == 0 ? nil : value
    }
}

/// Counts open connections and keeps room for new ones: at the limit, a new connection is let in by
/// closing the connection that has been idle longest (waiting for a request, or draining after a
/// refused one). Only when none is idle — every connection is busy sending a response — is the new
/// one refused (closed at once). nginx does the same with its reusable connections.
final class ConnectionLimiter: Sendable {
    enum Admission {
        case admitted
        case admittedByClosing(any Channel)
        case refused
    }

    private struct Entry {
        var channel: any Channel
        var mark: IdleMark
    }

    /// The most connections open at once.
    let maximum: Int
    private let entries = Mutex<[ObjectIdentifier: Entry]>([:])

    init(maximum: Int) {
        self.maximum = max(1, maximum)
    }

    /// How many connections are open.
    var count: Int {
        self.entries.withLock { $0.count }
    }

    func admit(_ channel: any Channel, mark: IdleMark) -> Admission {
        self.entries.withLock { entries in
            var admission = Admission.admitted
            if entries.count >= self.maximum {
                var idlest: (key: ObjectIdentifier, since: Int64)?
                for (key, entry) in entries {
                    if let since = entry.mark.idleSince, since < idlest?.since ?? .max {
                        idlest = (key, since)
                    }
                }
                guard let idlest, let victim = entries.removeValue(forKey: idlest.key) else { return .refused }
                admission = .admittedByClosing(victim.channel)
            }
            entries[ObjectIdentifier(channel)] = Entry(channel: channel, mark: mark)
            return admission
        }
    }

    func remove(_ channel: any Channel) {
        _ = self.entries.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }
}
