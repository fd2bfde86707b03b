import CCurl
import Foundation

/// One transfer on the transfer thread: its easy handle and its partial file; its SHA-256 runs beside it
/// in a ``HashFollower``.
///
/// libcurl calls back into it through `Unmanaged` user data; the callbacks return a byte count
/// (proceed) or 0 (abort) and never throw across the C boundary.
final class CurlTransfer {
    let request: TransferRequest
    let easy: CurlEasy
    /// Bytes in the file that belong to the current response's body (known good so far).
    private(set) var offset: Int64
    private let resumedFrom: Int64
    private let fd: Int32
    private let follower: HashFollower
    private let onEvent: @Sendable (TransferEvent) -> Void

    // The current response, reset at every status line (redirects bring several).
    private var status = 0
    private var headers: [String: String] = [:]
    private var decision: ResponseDecision?
    private var validator: String?
    private var writeFailure: TransferFailure?
    private var lastReport = Date.distantPast

    init(request: TransferRequest, onEvent: @escaping @Sendable (TransferEvent) -> Void) throws(PackDeliveryError) {
        self.request = request
        self.onEvent = onEvent
        let fd = open(request.file.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            let code = errno
            if code == ENOSPC || code == EDQUOT {
                throw .insufficientStorage(path: request.file.path, needed: request.expectedLength, available: nil, errno: code)
            }
            throw .io("open the partial download", path: request.file.path, errno: code)
        }
        self.fd = fd
        var info = stat()
        fstat(fd, &info)
        var offset = Int64(info.st_size)
        if request.fromZero || offset > request.expectedLength {
            ftruncate(fd, 0)
            offset = 0
        }
        self.offset = offset
        self.resumedFrom = offset
        self.follower = HashFollower(file: request.file)
        self.follower.advance(to: offset)
        do {
            self.easy = try CurlEasy(url: request.url)
        } catch {
            self.follower.cancel()
            close(fd)
            throw error
        }
        do {
            var extra: [String] = []
            if offset > 0, !request.url.isFileURL, let validator = request.validator {
                extra.append("If-Range: \(validator)")
            }
            try self.easy.apply(request.options, extraHeaders: extra)
            if offset > 0 {
                try self.easy.set(CURLOPT_RANGE, string: "\(offset)-")
            }
            // A large buffer for throughput. Under a rate limit libcurl's default (16 KiB): measured here, with
            // 128 KiB reads or more libcurl 7.88 overshot --max-rate by 2–3 times.
            try self.easy.set(CURLOPT_BUFFERSIZE, long: request.options.maxBytesPerSecond == nil ? 512 << 10 : 16 << 10)
            let user = Unmanaged.passUnretained(self).toOpaque()
            try self.easy.set(CURLOPT_WRITEDATA, pointer: user)
            try self.easy.set(CURLOPT_HEADERDATA, pointer: user)
            try self.easy.set(CURLOPT_WRITEFUNCTION, callback: { pointer, size, count, user in
                Unmanaged<CurlTransfer>.fromOpaque(user!).takeUnretainedValue()
                    .receiveBody(UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
            try self.easy.set(CURLOPT_HEADERFUNCTION, callback: { pointer, size, count, user in
                Unmanaged<CurlTransfer>.fromOpaque(user!).takeUnretainedValue()
                    .receiveHeader(UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
        } catch {
            self.follower.cancel()
            close(fd)
            throw error
        }
    }

    deinit { close(self.fd) }

    /// Stops hashing: the transfer was stopped, or it failed.
    func cancelHashing() { self.follower.cancel() }

    private func receiveHeader(_ bytes: UnsafeRawBufferPointer) -> Int {
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if line.hasPrefix("HTTP/") {
            let fields = line.split(separator: " ")
            self.status = fields.count > 1 ? Int(fields[1]) ?? 0 : 0
            self.headers = [:]
        } else if let colon = line.firstIndex(of: ":") {
            let name = line[..<colon].lowercased()
            self.headers[name] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return bytes.count
    }

    private func receiveBody(_ bytes: UnsafeRawBufferPointer) -> Int {
        if self.decision == nil {
            let decision = ResponseDecision.decide(
                status: self.request.url.isFileURL ? 0 : self.status, contentRange: self.headers["content-range"],
                offset: self.offset, expectedLength: self.request.expectedLength,
                retryAfter: self.headers["retry-after"], url: self.request.url.redacted)
            self.decision = decision
            switch decision {
            case .append:
                break
            case .restartFromZero:
                if self.offset > 0 {
                    ftruncate(self.fd, 0)
                    self.offset = 0
                    self.follower.restart()
                }
            case .rangeNotSatisfiable, .reject:
                return 0
            }
            self.validator = Self.validator(from: self.headers) ?? self.request.validator
        }
        switch self.decision {
        case .append, .restartFromZero: return self.write(bytes)
        default: return 0
        }
    }

    private func write(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard self.offset + Int64(bytes.count) <= self.request.expectedLength else {
            self.writeFailure = TransferFailure(
                error: PackDeliveryError(.lengthMismatch, message: "The server sent more than the manifest's contentLength of \(self.request.expectedLength) bytes for \(self.request.url.redacted).",
                                         hint: "The manifest or the server is out of date; the partial download was discarded.",
                                         subject: self.request.url.redacted),
                retryable: false)
            ftruncate(self.fd, 0)
            self.offset = 0
            self.follower.restart()
            return 0
        }
        var written = 0
        while written < bytes.count {
            let result = self.request.writer.pwrite(self.fd, bytes.baseAddress! + written, bytes.count - written, self.offset + Int64(written))
            if result < 0 {
                let code = errno
                if code == EINTR { continue }
                // Cut back to the last complete write, so the file and the hash agree.
                ftruncate(self.fd, off_t(self.offset))
                let path = self.request.file.path
                self.writeFailure = TransferFailure(
                    error: code == ENOSPC || code == EDQUOT
                        ? .insufficientStorage(path: path, needed: self.request.expectedLength - self.offset,
                                               available: SpaceCheck.available(at: self.request.file.deletingLastPathComponent()), errno: code)
                        : .io("write the partial download", path: path, errno: code),
                    retryable: false)
                return 0
            }
            written += result
        }
        self.offset += Int64(bytes.count)
        self.follower.advance(to: self.offset)
        let now = Date()
        if now.timeIntervalSince(self.lastReport) >= 0.1 {
            self.lastReport = now
            self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.offset, validator: self.validator))
        }
        return bytes.count
    }

    /// Reports how the attempt ended: at once for a failure, once the hash has caught up for a complete file.
    /// - Parameters:
    ///   - curlCode: libcurl's result for the transfer.
    ///   - report: called once, on this thread (failure) or the hash thread (complete).
    func complete(curlCode: CURLcode, report: @escaping @Sendable (TransferOutcome) -> Void) {
        let outcome = self.outcome(curlCode: curlCode)
        guard case .completed(_, let length, let resumedFrom) = outcome else {
            self.follower.cancel()
            report(outcome)
            return
        }
        self.follower.finish(length: length) { sha256 in
            report(.completed(sha256: sha256, length: length, resumedFrom: resumedFrom))
        }
    }

    /// How the attempt ended, from libcurl's result and what the callbacks saw; a complete file's digest
    /// is filled in by ``complete(curlCode:report:)``.
    private func outcome(curlCode: CURLcode) -> TransferOutcome {
        if let failure = self.writeFailure { return .failed(failure, bytesOnDisk: self.offset) }
        let url = self.request.url.redacted
        // A response with no body never reached the body callback: decide now.
        let decision = self.decision ?? ResponseDecision.decide(
            status: self.request.url.isFileURL ? 0 : self.easy.responseCode, contentRange: self.headers["content-range"],
            offset: self.offset, expectedLength: self.request.expectedLength,
            retryAfter: self.headers["retry-after"], url: url)
        switch decision {
        case .reject(let failure):
            if failure.retryable, failure.error.httpStatus == 206 {
                // A range we did not ask for: the partial is suspect, start over.
                ftruncate(self.fd, 0)
                self.offset = 0
            }
            return .failed(failure, bytesOnDisk: self.offset)
        case .rangeNotSatisfiable:
            if self.offset == self.request.expectedLength {
                return .completed(sha256: "", length: self.offset, resumedFrom: self.resumedFrom)
            }
            ftruncate(self.fd, 0)
            self.offset = 0
            return .failed(TransferFailure(
                error: PackDeliveryError(.httpStatus, message: "The server said the range is not satisfiable for \(url).", subject: url,
                                         underlying: .init(.http, 416), httpStatus: 416),
                retryable: true), bytesOnDisk: 0)
        case .append, .restartFromZero:
            break
        }
        if curlCode == CURLE_OK, self.offset == self.request.expectedLength {
            return .completed(sha256: "", length: self.offset, resumedFrom: self.resumedFrom)
        }
        if curlCode == CURLE_OK {
            return .failed(TransferFailure(
                error: PackDeliveryError(.networkFailure, message: "The server ended \(url) after \(self.offset) of \(self.request.expectedLength) bytes.",
                                         hint: "It will be resumed from there.", subject: url),
                retryable: true), bytesOnDisk: self.offset)
        }
        let retryable: Bool = switch curlCode {
        case CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT, CURLE_PARTIAL_FILE,
             CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR, CURLE_RECV_ERROR, CURLE_GOT_NOTHING, CURLE_HTTP2,
             CURLE_HTTP2_STREAM, CURLE_SSL_CONNECT_ERROR:
            true
        default:
            false
        }
        let message = curlCode == CURLE_OPERATION_TIMEDOUT
            ? "No data arrived from \(url) for \(Int(self.request.options.stallTimeout)) seconds (\(self.easy.errorMessage(curlCode)))."
            : "The transfer of \(url) failed: \(self.easy.errorMessage(curlCode))."
        return .failed(TransferFailure(
            error: PackDeliveryError(Curl.errorCode(for: curlCode), message: message,
                                     hint: "The partial download is kept; resume to continue.", subject: url, underlying: .init(.curl, Int(curlCode.rawValue))),
            retryable: retryable), bytesOnDisk: self.offset)
    }

    /// The strong ETag, else Last-Modified: what If-Range may carry.
    static func validator(from headers: [String: String]) -> String? {
        if let etag = headers["etag"], !etag.hasPrefix("W/"), !etag.isEmpty { return etag }
        return headers["last-modified"]
    }
}
