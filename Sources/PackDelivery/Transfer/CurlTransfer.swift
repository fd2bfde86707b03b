import CCurl
import Foundation

/// One transfer on the transfer thread: its easy handle and its partial file; its SHA-256 runs beside it
/// in a ``HashFollower``. A request with a ``TransferSink`` has no file: the body goes to the sink, in order, as it
/// is gathered, and nothing is hashed here (the sink checks what it takes).
///
/// libcurl hands the body over 16 KiB at a time; the pieces are gathered into writes of up to
/// ``writeSize`` (or whatever arrived within a tenth of a second, for slow transfers), so a 1 GiB pack
/// costs a few thousand `pwrite` calls rather than sixty thousand. Bytes count as kept once written.
///
/// libcurl calls back into it through `Unmanaged` user data; the callbacks return a byte count
/// (proceed) or 0 (abort) and never throw across the C boundary.
final class CurlTransfer {
    /// The most bytes gathered before one `pwrite`.
    static let writeSize = 512 << 10
    /// The most of an error response's body kept, to show what the server said.
    static let errorBodyLimit = 1024

    let request: TransferRequest
    let easy: CurlEasy
    /// Bytes in the file that belong to the current response's body (known good so far).
    private(set) var offset: Int64
    private let resumedFrom: Int64
    /// The partial file; -1 when the body goes to `request.sink`.
    private let fd: Int32
    /// Hashes the partial file; nil when the body goes to `request.sink`.
    private let follower: HashFollower?
    /// Where this transfer's events go.
    let onEvent: @Sendable (TransferEvent) -> Void

    /// Body bytes received but not yet written (at most `writeSize`), to be written at `offset`.
    private let pending: UnsafeMutableRawBufferPointer
    private var pendingCount = 0
    private var lastFlush = Date()

    // The current response, reset at every status line (redirects bring several).
    private var status = 0
    private var headers: [String: String] = [:]
    private var headerBytes = 0
    private var decision: ResponseDecision?
    private var validator: String?
    private var writeFailure: TransferFailure?
    private var lastReport = Date.distantPast
    private var serverSaid = Data()
    /// When a byte (header or body) last arrived; the transfer loop stops a transfer silent for the stall timeout.
    private(set) var lastActivity = Date()
    /// This transfer's share of the machine's rate cap, which paces its body (``pace(_:)``): the request's (a delta
    /// run's, held across its range requests), or one of its own taken at its first body byte and given back at its end.
    private var ticket: RateBoard.Ticket?
    private var ownsTicket = false
    /// Until when the transfer is paused to keep to the rate limit; the engine unpauses it then (``resume()``).
    private(set) var pausedUntil: Date?

    init(request: TransferRequest, onEvent: @escaping @Sendable (TransferEvent) -> Void) throws(PackDeliveryError) {
        self.request = request
        self.onEvent = onEvent
        if request.url.isFileURL {
            // A FIFO or a device would block the transfer thread forever; only regular files are packs.
            var info = stat()
            if stat(request.url.path, &info) == 0, (info.st_mode & S_IFMT) != S_IFREG {
                throw PackDeliveryError(
                    .unsupportedURL, message: "The pack \(request.url.redacted) is not a regular file.",
                    hint: "A pack URL must name an archive file.", subject: request.url.redacted)
            }
        }
        let fd = request.sink == nil ? open(request.file.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644) : -1
        guard fd >= 0 || request.sink != nil else {
            let code = errno
            if code == ENOSPC || code == EDQUOT {
                throw .insufficientStorage(path: request.file.path, needed: request.expectedLength, available: nil, errno: code)
            }
            throw .io("open the partial download", path: request.file.path, errno: code)
        }
        self.fd = fd
        var info = stat()
        var offset: Int64 = 0
        if fd >= 0, fstat(fd, &info) == 0 { offset = Int64(info.st_size) }
        if fd >= 0, request.fromZero || offset > request.expectedLength {
            ftruncate(fd, 0)
            offset = 0
        }
        self.offset = offset
        self.resumedFrom = offset
        // Buffers sized by the pack: a catalog of small packs must not churn megabytes per transfer.
        self.pending = UnsafeMutableRawBufferPointer.allocate(
            byteCount: Int(min(Int64(Self.writeSize), max(4096, request.expectedLength))), alignment: 16)
        let (id, report) = (request.id, onEvent)
        self.follower =
            request.sink != nil
            ? nil
            : HashFollower(file: request.file, length: request.expectedLength) { durable in
                report(.durable(id: id, bytes: durable))
            }
        self.follower?.advance(to: offset)
        self.request.stream?.growth.advance(to: offset)
        do {
            self.easy = try CurlEasy(url: request.url)
        } catch {
            self.follower?.cancel()
            self.request.stream?.discard()
            self.pending.deallocate()
            if fd >= 0 { close(fd) }
            throw error
        }
        do {
            try self.configure(offset: offset)
        } catch {
            self.follower?.cancel()
            self.request.stream?.discard()
            self.pending.deallocate()
            if fd >= 0 { close(fd) }
            throw error
        }
    }

    /// Sets the handle up for the request: its options and headers (If-Range when resuming), the range from `offset`,
    /// the receive buffer, and the body and header callbacks into this transfer.
    private func configure(offset: Int64) throws(PackDeliveryError) {
        var extra: [String] = []
        if offset > 0, self.request.range == nil, !self.request.url.isFileURL, let validator = self.request.validator {
            extra.append("If-Range: \(validator)")
        }
        try self.easy.apply(self.request.options, extraHeaders: extra)
        try self.easy.restrictProtocols(for: self.request.url, allowingFile: self.request.range == nil)
        if let range = self.request.range {
            try self.easy.set(CURLOPT_RANGE, string: "\(range.bytes.lowerBound + offset)-\(range.bytes.upperBound - 1)")
        } else if offset > 0 {
            try self.easy.set(CURLOPT_RANGE, string: "\(offset)-")
        }
        // A large buffer for throughput. Under a rate limit libcurl's default (16 KiB): measured here, with
        // 128 KiB reads or more libcurl 7.88 overshot --max-rate by 2–3 times.
        let buffer =
            self.request.options.maxBytesPerSecond == nil ? min(Int64(512 << 10), max(16 << 10, self.request.expectedLength)) : 16 << 10
        try self.easy.set(CURLOPT_BUFFERSIZE, long: Int(buffer))
        let user = Unmanaged.passUnretained(self).toOpaque()
        try self.easy.set(CURLOPT_WRITEDATA, pointer: user)
        try self.easy.set(CURLOPT_HEADERDATA, pointer: user)
        try self.easy.set(
            CURLOPT_WRITEFUNCTION,
            callback: { pointer, size, count, user in
                Unmanaged<CurlTransfer>.fromOpaque(user!).takeUnretainedValue()
                    .receiveBody(UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
        try self.easy.set(
            CURLOPT_HEADERFUNCTION,
            callback: { pointer, size, count, user in
                Unmanaged<CurlTransfer>.fromOpaque(user!).takeUnretainedValue()
                    .receiveHeader(UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
    }

    deinit {
        if let ticket = self.ticket, self.ownsTicket { RateBoard.shared.leave(ticket) }
        self.pending.deallocate()
        if self.fd >= 0 { close(self.fd) }
    }

    /// Stops the transfer (pause, cancel, shutdown): writes what was received, makes the kept bytes
    /// durable, and stops hashing.
    func stop() {
        if case .append? = self.decision { _ = self.flush() } else if case .restartFromZero? = self.decision { _ = self.flush() }
        if self.fd >= 0 { _ = Durability.syncData(self.fd) }
        self.follower?.cancel()
        self.request.stream?.discard()
        self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.offset, validator: self.validator))
    }

    /// How long to wait before taking `count` more body bytes, so that the body arrives no faster than
    /// ``TransferOptions/maxBytesPerSecond`` (but for a first burst of ``RateBoard/Ticket/paceBurst(_:)``); nil to take them now.
    ///
    /// libcurl's own limit (`CURLOPT_MAX_RECV_SPEED_LARGE`, set too) is checked between its reads, and one read takes
    /// whatever the socket holds, up to a second's worth: a body that arrives in one read (a first install's range of
    /// 1 MiB, a pack smaller than its buffer) was never slowed (issue 43: 17 MiB in 0.4 s at `--max-rate 4M`).
    private func pace(_ count: Int) -> TimeInterval? {
        let ticket: RateBoard.Ticket
        if let held = self.ticket {
            ticket = held
        } else {
            ticket = self.request.ticket ?? RateBoard.shared.join(priority: self.request.options.ratePriority)
            self.ticket = ticket
            self.ownsTicket = self.request.ticket == nil
        }
        let own = self.request.options.maxBytesPerSecond.flatMap { $0 > 0 ? $0 : nil }
        return ticket.pace(count, own: own, now: Date())
    }

    /// The pause for the rate limit is over (the engine unpauses the easy handle right after): a paused transfer was not
    /// silent, so the stall timeout counts from now.
    func resume() {
        self.pausedUntil = nil
        self.lastActivity = Date()
    }

    /// Stops hashing (and unpacking): the transfer failed.
    func cancelHashing() {
        self.follower?.cancel()
        self.request.stream?.discard()
    }

    // MARK: Callbacks

    private func receiveHeader(_ bytes: UnsafeRawBufferPointer) -> Int {
        self.lastActivity = Date()
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if line.hasPrefix("HTTP/") {
            let fields = line.split(separator: " ")
            self.status = fields.count > 1 ? Int(fields[1]) ?? 0 : 0
            self.headers = [:]
            self.headerBytes = 0
        } else if let colon = line.firstIndex(of: ":") {
            let name = line[..<colon].lowercased()
            self.headers[name] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        self.headerBytes += bytes.count
        return bytes.count
    }

    private func receiveBody(_ bytes: UnsafeRawBufferPointer) -> Int {
        self.lastActivity = Date()
        if self.decision == nil {
            let decision = self.decide(status: self.status)
            self.decision = decision
            if case .restartFromZero = decision, self.offset > 0 {
                if self.fd >= 0 { ftruncate(self.fd, 0) }
                self.offset = 0
                self.follower?.restart()
                self.request.stream?.growth.restart()
            }
            self.validator = Self.validator(from: self.headers) ?? self.request.validator
        }
        switch self.decision {
        case .append, .restartFromZero:
            if let wait = self.pace(bytes.count) {
                // libcurl hands these bytes again once the engine unpauses the transfer, at `pausedUntil`.
                self.pausedUntil = Date().addingTimeInterval(wait)
                return ccurl_writefunc_pause()
            }
            return self.gather(bytes)
        case .reject:
            // Keep the start of an error body: what the server said goes into the message.
            guard self.status >= 400 else { return 0 }
            let room = Self.errorBodyLimit - self.serverSaid.count
            if room > 0 { self.serverSaid.append(contentsOf: bytes.prefix(room)) }
            return self.serverSaid.count < Self.errorBodyLimit ? bytes.count : 0
        case .complete, nil:
            return bytes.count
        }
    }

    /// Adds received bytes to the pending write; writes when it is full or a tenth of a second passed.
    private func gather(_ bytes: UnsafeRawBufferPointer) -> Int {
        let (end, overflow) = self.offset.addingReportingOverflow(Int64(self.pendingCount + bytes.count))
        guard !overflow, end <= self.request.expectedLength else {
            _ = self.flush()
            self.writeFailure = TransferFailure(
                error: PackDeliveryError(
                    .lengthMismatch,
                    message:
                        "The server sent more than the manifest's contentLength of \(self.request.expectedLength) bytes for \(self.request.url.redacted).",
                    hint: "The manifest or the server is out of date; the partial download was discarded.",
                    subject: self.request.url.redacted),
                retryable: true, countsAlways: true)
            if self.fd >= 0 { ftruncate(self.fd, 0) }
            self.offset = 0
            self.follower?.restart()
            self.request.stream?.growth.restart()
            return 0
        }
        var remaining = bytes[...]
        while !remaining.isEmpty {
            let take = min(remaining.count, self.pending.count - self.pendingCount)
            UnsafeMutableRawBufferPointer(rebasing: self.pending[self.pendingCount..<(self.pendingCount + take)])
                .copyMemory(from: UnsafeRawBufferPointer(rebasing: remaining.prefix(take)))
            self.pendingCount += take
            remaining = remaining.dropFirst(take)
            if self.pendingCount == self.pending.count, !self.flush() { return 0 }
        }
        if Date().timeIntervalSince(self.lastFlush) >= 0.1, !self.flush() { return 0 }
        return bytes.count
    }

    /// Writes the pending bytes at `offset`. - Returns: false when the write failed (recorded in `writeFailure`).
    private func flush() -> Bool {
        self.lastFlush = Date()
        if let hostile = self.request.stream?.hostile, self.writeFailure == nil {
            // The pack streamed so far holds an entry that is never installed: the rest is not worth fetching.
            self.writeFailure = TransferFailure(error: hostile, retryable: false)
        }
        guard self.pendingCount > 0, self.writeFailure == nil else { return self.writeFailure == nil }
        if let sink = self.request.sink {
            guard sink.consume(UnsafeRawBufferPointer(rebasing: self.pending[..<self.pendingCount])) else {
                self.pendingCount = 0
                self.writeFailure = TransferFailure(
                    error: PackDeliveryError(
                        .internalError, message: "The bytes of \(self.request.url.redacted) could not be placed.",
                        subject: self.request.url.redacted),
                    retryable: false)
                return false
            }
            self.offset += Int64(self.pendingCount)
            self.pendingCount = 0
            self.reportProgress()
            return true
        }
        // Something else shortened the file under us: writing on would leave a hole of zeros that the hash thread
        // may already be reading. End the attempt; the retry resumes from what the file still holds.
        var info = stat()
        if fstat(self.fd, &info) == 0, Int64(info.st_size) < self.offset {
            let path = self.request.file.path
            self.writeFailure = TransferFailure(
                error: PackDeliveryError(
                    .fileSystem,
                    message:
                        "The partial download \(path) is \(info.st_size) bytes long, shorter than the \(self.offset) bytes written: something else changed it.",
                    hint: "It will be fetched again.", subject: path),
                retryable: true)
            return false
        }
        var written = 0
        while written < self.pendingCount {
            let result = self.request.writer.pwrite(
                self.fd, self.pending.baseAddress! + written, self.pendingCount - written, self.offset + Int64(written))
            if result < 0 {
                let code = errno
                if code == EINTR { continue }
                // Keep what reached the file; cut anything after it, so the file and the hash agree.
                self.offset += Int64(written)
                ftruncate(self.fd, off_t(self.offset))
                self.follower?.advance(to: self.offset)
                self.request.stream?.growth.advance(to: self.offset)
                self.pendingCount = 0
                // The kept bytes and the validator they came with, before the failure is reported.
                self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.offset, validator: self.validator))
                let path = self.request.file.path
                self.writeFailure = TransferFailure(
                    error: code == ENOSPC || code == EDQUOT
                        ? .insufficientStorage(
                            path: path, needed: self.request.expectedLength - self.offset,
                            available: SpaceCheck.available(at: self.request.file.deletingLastPathComponent()), errno: code)
                        : .io("write the partial download", path: path, errno: code),
                    retryable: false)
                return false
            }
            written += result
        }
        self.offset += Int64(self.pendingCount)
        self.pendingCount = 0
        self.follower?.advance(to: self.offset)
        self.request.stream?.growth.advance(to: self.offset)
        self.reportProgress()
        return true
    }

    /// Reports the bytes kept, about ten times a second.
    private func reportProgress() {
        let now = Date()
        if now.timeIntervalSince(self.lastReport) >= 0.1 {
            self.lastReport = now
            self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.offset, validator: self.validator))
        }
    }

    // MARK: Outcome

    /// Reports how the attempt ended: at once for a failure, once the hash has caught up for a complete file.
    /// - Parameters:
    ///   - curlCode: libcurl's result for the transfer.
    ///   - stalled: the transfer loop stopped it after the stall timeout without a byte.
    ///   - report: called once, on this thread (failure) or the hash thread (complete).
    func complete(curlCode: CURLcode, stalled: Bool = false, report: @escaping @Sendable (TransferOutcome) -> Void) {
        if case .append? = self.decision { _ = self.flush() } else if case .restartFromZero? = self.decision { _ = self.flush() }
        if self.validator != nil { self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.offset, validator: self.validator)) }
        let outcome = stalled ? self.stalledOutcome() : self.outcome(curlCode: curlCode)
        guard case .completed(_, let length, let resumedFrom) = outcome, let follower = self.follower else {
            // A sink's bytes are checked by the sink: a complete body has no digest here.
            self.follower?.cancel()
            self.request.stream?.discard()
            report(outcome)
            return
        }
        let bytes = self.offset
        self.request.stream?.growth.finish(length: length)
        follower.finish(length: length) { result in
            switch result {
            case .success(let sha256):
                report(.completed(sha256: sha256, length: length, resumedFrom: resumedFrom))
            case .failure(let error):
                report(.failed(TransferFailure(error: error, retryable: true, countsAlways: true), bytesOnDisk: bytes))
            }
        }
    }

    /// What to do with the response's body, by ``ResponseDecision``: for the whole file, or for a range of it.
    private func decide(status: Int) -> ResponseDecision {
        let (headers, url) = (ResponseDecision.Headers(self.headers), self.request.url.redacted)
        guard let range = self.request.range else {
            return ResponseDecision.decide(
                status: self.request.url.isFileURL ? 0 : status, headers: headers, offset: self.offset,
                expectedLength: self.request.expectedLength, url: url)
        }
        return ResponseDecision.decide(
            status: status, headers: headers, range: range, offset: self.offset, validator: Self.validator(from: self.headers),
            expectedValidator: self.request.validator, url: url)
    }

    private func stalledOutcome() -> TransferOutcome {
        let url = self.request.url.redacted
        return .failed(
            TransferFailure(
                error: PackDeliveryError(
                    .timedOut, message: "No data arrived from \(url) for \(Int(self.request.options.stallTimeout)) seconds.",
                    hint: "It is tried again; the partial download is kept.", subject: url),
                retryable: true, countsAlways: true), bytesOnDisk: self.offset)
    }

    /// How the attempt ended, from libcurl's result and what the callbacks saw; a complete file's digest
    /// is filled in by ``complete(curlCode:stalled:report:)``.
    private func outcome(curlCode: CURLcode) -> TransferOutcome {
        if let failure = self.writeFailure { return .failed(failure, bytesOnDisk: self.offset) }
        let url = self.request.url.redacted
        // A response with no body never reached the body callback: decide now.
        let decision = self.decision ?? (curlCode == CURLE_OK || self.status >= 400 ? self.decide(status: self.easy.responseCode) : .append)
        switch decision {
        case .reject(let failure, let discardPartial):
            if discardPartial {
                if self.fd >= 0 { ftruncate(self.fd, 0) }
                self.offset = 0
            }
            return .failed(self.withServerSaid(failure), bytesOnDisk: self.offset)
        case .complete:
            return .completed(sha256: "", length: self.offset, resumedFrom: self.resumedFrom)
        case .append, .restartFromZero:
            break
        }
        if curlCode == CURLE_OK, self.offset == self.request.expectedLength {
            return .completed(sha256: "", length: self.offset, resumedFrom: self.resumedFrom)
        }
        if curlCode == CURLE_OK {
            if self.request.url.isFileURL {
                return .failed(
                    TransferFailure(
                        error: PackDeliveryError(
                            .lengthMismatch,
                            message: "The file \(url) is \(self.offset) bytes long, but the manifest says \(self.request.expectedLength).",
                            hint: "The manifest and the file disagree; one of them is out of date.", subject: url), retryable: false),
                    bytesOnDisk: self.offset)
            }
            return .failed(
                TransferFailure(
                    error: PackDeliveryError(
                        .networkFailure, message: "The server ended \(url) after \(self.offset) of \(self.request.expectedLength) bytes.",
                        hint: "It is resumed from there.", subject: url),
                    retryable: true), bytesOnDisk: self.offset)
        }
        return .failed(self.curlFailure(curlCode, url: url), bytesOnDisk: self.offset)
    }

    /// A libcurl failure, said in the words a person needs.
    private func curlFailure(_ curlCode: CURLcode, url: String) -> TransferFailure {
        let detail = self.easy.errorMessage(curlCode)
        let underlying = PackDeliveryError.Underlying(.curl, Int(curlCode.rawValue))
        func failure(_ code: PackDeliveryError.Code, _ message: String, retryable: Bool, countsAlways: Bool = false) -> TransferFailure {
            TransferFailure(
                error: PackDeliveryError(
                    code, message: message, hint: retryable ? "It is tried again; the partial download is kept." : nil,
                    subject: url, underlying: underlying),
                retryable: retryable, countsAlways: countsAlways)
        }
        switch curlCode {
        case CURLE_OPERATION_TIMEDOUT:
            // Too slow (or silent) for the low-speed window: counts as a failed attempt, whatever bytes it kept.
            if let error = self.easy.speedFailure(curlCode, url: url, hint: "It is tried again; the partial download is kept.") {
                return TransferFailure(error: error, retryable: true, countsAlways: true)
            }
            return failure(.timedOut, "The transfer of \(url) timed out (\(detail)).", retryable: true, countsAlways: true)
        case CURLE_TOO_MANY_REDIRECTS:
            return failure(.networkFailure, "The server redirected \(url) too many times (a redirect loop?).", retryable: false)
        case CURLE_UNSUPPORTED_PROTOCOL:
            return failure(.unsupportedURL, "\(url) was redirected to a URL that is not http or https (\(detail)).", retryable: false)
        case CURLE_OUT_OF_MEMORY where self.decision == nil, CURLE_RECV_ERROR where detail.lowercased().contains("header"):
            // libcurl 7.88 answers a response header over 100 KiB with "Out of memory" before any body.
            return failure(
                .networkFailure, "The server sent a response header for \(url) larger than libcurl accepts (100 KiB).", retryable: false)
        case CURLE_COULDNT_CONNECT where self.easy.connectFailedForDescriptors:
            return TransferFailure(
                error: .io("open a connection to the server of \(url) for", path: self.request.file.path, errno: EMFILE),
                retryable: true, countsAlways: true)
        case CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT:
            return failure(
                .networkUnreachable, "Could not reach the server of \(url): \(PackDeliveryError.printable(detail)).", retryable: true)
        case CURLE_PARTIAL_FILE, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING, CURLE_HTTP2, CURLE_HTTP2_STREAM,
            CURLE_SSL_CONNECT_ERROR:
            return failure(.networkFailure, "The transfer of \(url) failed: \(PackDeliveryError.printable(detail)).", retryable: true)
        default:
            return failure(
                Curl.errorCode(for: curlCode), "The transfer of \(url) failed: \(PackDeliveryError.printable(detail)).", retryable: false)
        }
    }

    /// The failure with a short piece of the server's own error text (S3's `<Message>`, or its first line).
    private func withServerSaid(_ failure: TransferFailure) -> TransferFailure {
        guard let said = Self.excerpt(self.serverSaid) else { return failure }
        var failure = failure
        let error = failure.error
        failure.error = PackDeliveryError(
            error.code, message: "\(error.message) The server said: “\(said)”.", hint: error.hint, subject: error.subject,
            underlying: error.underlying, httpStatus: error.httpStatus)
        return failure
    }

    /// A short, printable excerpt of an error body: the text of an XML `<Message>` element, else the first non-empty line.
    static func excerpt(_ body: Data) -> String? {
        let text = String(decoding: body, as: UTF8.self)
        var candidate: Substring?
        if let start = text.range(of: "<Message>"), let end = text.range(of: "</Message>", range: start.upperBound..<text.endIndex) {
            candidate = text[start.upperBound..<end.lowerBound]
        } else {
            let stripped = text.replacingOccurrences(of: "<[^>]*>", with: " ", options: .regularExpression)
            candidate = stripped.split(whereSeparator: \.isNewline).first { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
        }
        guard let candidate else { return nil }
        let line = candidate.trimmingCharacters(in: .whitespaces)
        guard !line.isEmpty else { return nil }
        let short = line.count > 120 ? String(line.prefix(117)) + "…" : line
        return PackDeliveryError.printable(short)
    }

    /// The strong ETag, else Last-Modified: what If-Range may carry.
    static func validator(from headers: [String: String]) -> String? {
        if let etag = headers["etag"], !etag.hasPrefix("W/"), !etag.isEmpty { return etag }
        return headers["last-modified"]
    }
}
