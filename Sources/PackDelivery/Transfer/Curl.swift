import CCurl
import Foundation

/// libcurl's process-wide setup and small one-shot requests.
enum Curl {
    private static let initialized: Bool = {
        curl_global_init(Int(CURL_GLOBAL_DEFAULT))
        return true
    }()

    static func globalInit() { _ = Self.initialized }

    /// The error code for a failed transfer's libcurl result.
    static func errorCode(for code: CURLcode) -> PackDeliveryError.Code {
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_CONNECT: .networkUnreachable
        case CURLE_OPERATION_TIMEDOUT: .timedOut
        case CURLE_UNSUPPORTED_PROTOCOL: .unsupportedURL
        case CURLE_FILE_COULDNT_READ_FILE, CURLE_READ_ERROR: .fileSystem
        default: .networkFailure
        }
    }

    /// `PackDelivery/VERSION libcurl/VERSION`, sent with every request.
    static let userAgent: String = {
        let libcurl = ccurl_version_number().map { String(cString: $0) } ?? "unknown"
        return "PackDelivery/\(PackDeliveryVersion.current) libcurl/\(libcurl)"
    }()

    /// The text libcurl gives for a code.
    static func describe(_ code: CURLcode) -> String { String(cString: curl_easy_strerror(code)) }

    /// Fetches a small document (a manifest) into memory, following redirects.
    /// - Throws: ``PackDeliveryError`` of kind `network` with libcurl's message or the HTTP status.
    static func fetch(_ url: URL, options: TransferOptions, maxBytes: Int = 64 << 20) throws(PackDeliveryError) -> Data {
        let answer = try self.get(url, options: options, maxBytes: maxBytes)
        let status = answer.status
        if url.isFileURL == false, !(200..<300).contains(status) {
            throw PackDeliveryError(
                status == 401 || status == 403 ? .unauthorized : .httpStatus,
                message: "The server answered \(status) for \(url.redacted).",
                hint: status == 401 || status == 403 ? "The server refused the credentials sent with the request." : "Check the URL.",
                subject: url.redacted, underlying: .init(.http, status), httpStatus: status)
        }
        return answer.body
    }

    /// A small GET whose HTTP status is the caller's to judge: the status, the body and the response's `Retry-After` in
    /// seconds (nil when it has none).
    /// - Throws: ``PackDeliveryError`` for a failed transfer (libcurl's message), or a body over `maxBytes`.
    static func get(
        _ url: URL, options: TransferOptions, maxBytes: Int
    ) throws(PackDeliveryError) -> (status: Int, body: Data, retryAfter: TimeInterval?) {
        self.globalInit()
        let easy = try CurlEasy(url: url)
        try easy.apply(options)
        try easy.restrictProtocols(for: url, allowingFile: false)
        // A document (a manifest, TUF metadata) may come compressed: every encoding libcurl decodes is offered, and
        // the limit holds for the decoded bytes. (Never for packs, whose byte ranges must be the file's.)
        try easy.set(CURLOPT_ACCEPT_ENCODING, string: "")
        let (code, data, overflow) = easy.performCollecting(limit: maxBytes)
        if overflow {
            throw PackDeliveryError(
                .invalidManifest, message: "\(url.redacted) is larger than \(maxBytes) bytes, too large for a manifest.",
                subject: url.redacted)
        }
        guard code == CURLE_OK else {
            if let error = easy.speedFailure(
                code, url: url.redacted, hint: "The server or the network is too slow; try again later, or allow a longer stall timeout.")
            {
                throw error
            }
            if code == CURLE_COULDNT_CONNECT, easy.connectFailedForDescriptors {
                throw PackDeliveryError(
                    .tooManyOpenFiles, message: "Could not open a connection to fetch \(url.redacted): too many open files.",
                    hint: "The process ran out of file descriptors; raise its limit (ulimit -n) or lower the concurrency.",
                    subject: url.redacted, underlying: .init(.errno, Int(EMFILE)))
            }
            let detail =
                code == CURLE_TOO_MANY_REDIRECTS
                ? "the server redirected it too many times (a redirect loop?)"
                : code == CURLE_UNSUPPORTED_PROTOCOL
                    ? "it was redirected to a URL that is not http or https"
                    : PackDeliveryError.printable(easy.errorMessage(code))
            throw PackDeliveryError(
                Self.errorCode(for: code), message: "Could not fetch \(url.redacted): \(detail).",
                hint: "Check the URL and that the server is reachable.", subject: url.redacted, underlying: .init(.curl, Int(code.rawValue))
            )
        }
        var retryAfter: curl_off_t = 0
        _ = ccurl_easy_getinfo_off_t(easy.handle, CURLINFO_RETRY_AFTER, &retryAfter)
        return (easy.responseCode, data, retryAfter > 0 ? TimeInterval(retryAfter) : nil)
    }
}

/// One libcurl easy handle; cleans up in deinit. Not Sendable: used on one thread.
final class CurlEasy {
    let handle: UnsafeMutableRawPointer
    let url: URL
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
    /// The low-speed check in force (set by ``apply(_:extraHeaders:)``), and the body bytes seen, to say why it ended a transfer.
    private var lowSpeed: (limit: Int64, window: Int)?
    private var arrivals = Arrivals()

    init(url: URL) throws(PackDeliveryError) {
        guard let handle = curl_easy_init() else {
            throw PackDeliveryError(.internalError, message: "libcurl could not create a handle (out of memory).")
        }
        self.handle = handle
        self.url = url
        self.errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        try self.set(CURLOPT_ERRORBUFFER, pointer: UnsafeMutableRawPointer(self.errorBuffer))
        try self.set(CURLOPT_URL, string: url.absoluteString)
        try self.set(CURLOPT_NOSIGNAL, long: 1)
        try self.set(CURLOPT_FOLLOWLOCATION, long: 1)
        try self.set(CURLOPT_MAXREDIRS, long: 10)
        try self.set(CURLOPT_FAILONERROR, long: 0)
        try self.set(CURLOPT_USERAGENT, string: Curl.userAgent)
    }

    /// Allows http and https (and `file` for a local pack), and only http and https for redirects.
    /// - Parameter url: the URL requested. A redirect from https may only lead to https, so headers (credentials
    ///   among them) never travel in clear text because a server said so.
    /// - Parameter allowingFile: whether a file URL may be read.
    func restrictProtocols(for url: URL, allowingFile: Bool) throws(PackDeliveryError) {
        try self.set(CURLOPT_PROTOCOLS_STR, string: allowingFile && url.isFileURL ? "file" : "http,https")
        try self.set(CURLOPT_REDIR_PROTOCOLS_STR, string: url.scheme?.lowercased() == "https" ? "https" : "http,https")
    }

    deinit {
        curl_easy_cleanup(self.handle)
        curl_slist_free_all(self.headerList)
        self.errorBuffer.deallocate()
    }

    /// Applies timeouts, rate limit, TLS verification and extra headers.
    func apply(_ options: TransferOptions, extraHeaders: [String] = []) throws(PackDeliveryError) {
        try self.set(CURLOPT_CONNECTTIMEOUT_MS, long: Int(options.connectTimeout * 1000))
        // Less than the low-speed limit for the whole window ends the attempt with CURLE_OPERATION_TIMEDOUT; with the
        // speed check off, the limit is 1 byte per second, so that silence still ends it at the stall timeout (on a
        // manifest request, which has no transfer loop to watch it). The progress callback notes the body bytes, so
        // that ``speedFailure(_:url:hint:)`` can say what arrived within the window.
        let limit = max(1, options.effectiveLowSpeedLimit)
        let window = options.lowSpeedWindow
        try self.set(CURLOPT_LOW_SPEED_LIMIT, long: Int(limit))
        try self.set(CURLOPT_LOW_SPEED_TIME, long: window)
        self.lowSpeed = (limit, window)
        self.arrivals = Arrivals(window: window)
        // Unretained: libcurl calls back only while the handle lives, and this object owns the handle.
        try self.set(CURLOPT_XFERINFODATA, pointer: Unmanaged.passUnretained(self).toOpaque())
        try self.check(
            ccurl_easy_setopt_xferinfo_callback(
                self.handle, CURLOPT_XFERINFOFUNCTION,
                { user, _, received, _, _ in
                    Unmanaged<CurlEasy>.fromOpaque(user!).takeUnretainedValue().arrivals.observe(transferred: Int64(received))
                    return 0
                }), "CURLOPT_XFERINFOFUNCTION")
        try self.set(CURLOPT_NOPROGRESS, long: 0)
        if let rate = options.maxBytesPerSecond, rate > 0 {
            try self.set(CURLOPT_MAX_RECV_SPEED_LARGE, offset: rate)
        }
        try self.set(CURLOPT_SSL_VERIFYPEER, long: options.verifyTLS ? 1 : 0)
        try self.set(CURLOPT_SSL_VERIFYHOST, long: options.verifyTLS ? 2 : 0)
        try self.setHeaders(options.headers + extraHeaders)
    }

    /// Sends these header lines (`Name: value`) with the request, besides those set before.
    func setHeaders(_ lines: [String]) throws(PackDeliveryError) {
        for line in lines {
            guard let list = curl_slist_append(self.headerList, line) else {
                throw PackDeliveryError(.internalError, message: "libcurl could not add a request header (out of memory).")
            }
            self.headerList = list
        }
        if let list = self.headerList {
            try self.check(ccurl_easy_setopt_slist(self.handle, CURLOPT_HTTPHEADER, list), "CURLOPT_HTTPHEADER")
        }
    }

    /// Performs the request, keeping the body in memory up to `limit` bytes (more ends it, `overflow`).
    func performCollecting(limit: Int) -> (code: CURLcode, data: Data, overflow: Bool) {
        final class Sink {
            var data = Data()
            var limit = 0
            var overflow = false
        }
        let sink = Sink()
        sink.limit = limit
        do {
            try self.set(CURLOPT_WRITEDATA, pointer: Unmanaged.passUnretained(sink).toOpaque())
            try self.set(
                CURLOPT_WRITEFUNCTION,
                callback: { pointer, size, count, user in
                    let sink = Unmanaged<Sink>.fromOpaque(user!).takeUnretainedValue()
                    let length = size * count
                    if sink.data.count + length > sink.limit {
                        sink.overflow = true
                        return 0
                    }
                    sink.data.append(UnsafeRawPointer(pointer!).assumingMemoryBound(to: UInt8.self), count: length)
                    return length
                })
        } catch {
            return (CURLE_FAILED_INIT, Data(), false)
        }
        let code = withExtendedLifetime(sink) { curl_easy_perform(self.handle) }
        return (code, sink.data, sink.overflow)
    }

    func set(_ option: CURLoption, long value: Int) throws(PackDeliveryError) {
        try self.check(ccurl_easy_setopt_long(self.handle, option, value), "option \(option.rawValue)")
    }

    func set(_ option: CURLoption, offset value: Int64) throws(PackDeliveryError) {
        try self.check(ccurl_easy_setopt_off_t(self.handle, option, curl_off_t(value)), "option \(option.rawValue)")
    }

    func set(_ option: CURLoption, string value: String) throws(PackDeliveryError) {
        try self.check(ccurl_easy_setopt_string(self.handle, option, value), "option \(option.rawValue)")
    }

    func set(_ option: CURLoption, pointer value: UnsafeMutableRawPointer?) throws(PackDeliveryError) {
        try self.check(ccurl_easy_setopt_pointer(self.handle, option, value), "option \(option.rawValue)")
    }

    func set(_ option: CURLoption, callback: ccurl_write_callback) throws(PackDeliveryError) {
        try self.check(ccurl_easy_setopt_write_callback(self.handle, option, callback), "option \(option.rawValue)")
    }

    /// Whether a failed connect was the process running out of descriptors: libcurl reports that as
    /// "Couldn't connect", with EMFILE as the OS errno on most paths but not all (libcurl 7.88 sometimes leaves it 0),
    /// so a 0 is checked by opening a descriptor now.
    var connectFailedForDescriptors: Bool {
        let code = self.osErrno
        if code == EMFILE || code == ENFILE { return true }
        return code == 0 && Descriptors.exhausted
    }

    /// The errno of the last failed connect (libcurl reports a process out of descriptors as "Couldn't connect").
    var osErrno: Int32 {
        var code: Int = 0
        _ = ccurl_easy_getinfo_long(self.handle, CURLINFO_OS_ERRNO, &code)
        return Int32(code)
    }

    /// The last response's HTTP status (0 for file:// and before any response).
    var responseCode: Int {
        var code: Int = 0
        _ = ccurl_easy_getinfo_long(self.handle, CURLINFO_RESPONSE_CODE, &code)
        return code
    }

    /// The failure for a transfer that libcurl's low-speed check ended: `timedOut` when no body byte arrived within
    /// the window, else `tooSlow`, naming the rate measured over it and the limit; nil for any other result.
    /// - Parameters:
    ///   - code: libcurl's result.
    ///   - url: the URL without credentials, for the message.
    ///   - hint: what happens next or what to do.
    func speedFailure(_ code: CURLcode, url: String, hint: String?) -> PackDeliveryError? {
        let detail = self.errorMessage(code).lowercased()
        guard code == CURLE_OPERATION_TIMEDOUT, detail.contains("too slow") || detail.contains("less than"),
            let (limit, window) = self.lowSpeed
        else { return nil }
        let received = self.arrivals.received(inLast: TimeInterval(window))
        let underlying = PackDeliveryError.Underlying(.curl, Int(code.rawValue))
        guard received > 0 else {
            return PackDeliveryError(
                .timedOut, message: "No data arrived from \(url) for \(window) seconds.", hint: hint, subject: url, underlying: underlying)
        }
        return PackDeliveryError(
            .tooSlow,
            message:
                "Data from \(url) arrived at \(Self.rate(Double(received) / Double(window))) over the last \(window) seconds, below the low-speed limit of \(Self.rate(Double(limit))).",
            hint: hint, subject: url, underlying: underlying)
    }

    /// A rate said for people: `1 byte per second`, `0.5 bytes per second`, `800 bytes per second`.
    static func rate(_ bytesPerSecond: Double) -> String {
        let shown = bytesPerSecond < 10 ? (bytesPerSecond * 10).rounded() / 10 : bytesPerSecond.rounded()
        let number = shown == shown.rounded() ? "\(Int(shown))" : "\(shown)"
        return "\(number) byte\(shown == 1 ? "" : "s") per second"
    }

    /// libcurl's detailed message for a failed call (the error buffer), else its generic text.
    func errorMessage(_ code: CURLcode) -> String {
        let detail = String(cString: self.errorBuffer)
        return detail.isEmpty ? Curl.describe(code) : detail
    }

    private func check(_ code: CURLcode, _ what: String) throws(PackDeliveryError) {
        guard code == CURLE_OK else {
            throw PackDeliveryError(
                code == CURLE_UNSUPPORTED_PROTOCOL ? .unsupportedURL : .internalError,
                message: "libcurl refused \(what) for \(self.url.redacted): \(Curl.describe(code)).",
                subject: self.url.redacted, underlying: .init(.curl, Int(code.rawValue)))
        }
    }
}

/// The body bytes one handle received, sampled over time by libcurl's progress callback (at least once a second,
/// on the handle's thread): what arrived within the low-speed window when libcurl ends a transfer as too slow.
struct Arrivals {
    /// The longest window asked about (seconds); older samples are dropped.
    let window: TimeInterval
    /// (time, bytes received in all), at most four a second, oldest first; the first is when counting began.
    private var samples: [(at: Date, total: Int64)]
    /// Body bytes received in all, over every transfer of the handle.
    private(set) var total: Int64 = 0
    /// libcurl's count for the current transfer (it starts again at 0 for each transfer on the handle).
    private var current: Int64 = 0

    init(window: Int = 60, start: Date = Date()) {
        self.window = TimeInterval(window)
        self.samples = [(start, 0)]
    }

    /// libcurl says the current transfer has received `transferred` body bytes.
    mutating func observe(transferred: Int64, at now: Date = Date()) {
        if transferred < self.current { self.current = 0 }
        self.total += transferred - self.current
        self.current = transferred
        guard let last = self.samples.last, now.timeIntervalSince(last.at) >= 0.25 else { return }
        self.samples.append((now, self.total))
        // Keep one sample at or before the oldest moment a window may start from.
        while self.samples.count > 2, now.timeIntervalSince(self.samples[1].at) > self.window { self.samples.removeFirst() }
    }

    /// The body bytes received in the last `seconds` (at most ``window``; all of them when counting began later).
    func received(inLast seconds: TimeInterval, now: Date = Date()) -> Int64 {
        let baseline = self.samples.last { now.timeIntervalSince($0.at) >= seconds }?.total ?? 0
        return self.total - baseline
    }
}
