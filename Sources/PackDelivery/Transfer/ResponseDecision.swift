import Foundation

/// What to do with a response's body, given what the partial file already holds. Pure; no I/O.
enum ResponseDecision: Equatable, Sendable {
    /// Append the body at the current offset (a 206 whose Content-Range starts where we asked).
    case append
    /// Discard the partial file and write the body from byte 0 (a 200: the range was ignored or the validator changed).
    case restartFromZero
    /// The server says the range starts past its end: check the file on disk before deciding.
    case rangeNotSatisfiable
    /// Do not write the body; the attempt fails with this.
    case reject(TransferFailure)

    /// Decides for an HTTP response.
    /// - Parameters:
    ///   - status: the final response's status (after redirects); 0 for file:// URLs.
    ///   - contentRange: the Content-Range header, if any.
    ///   - offset: bytes already in the file (what was asked for with `Range: bytes=offset-`).
    ///   - retryAfter: the Retry-After header, if any.
    static func decide(status: Int, contentRange: String?, offset: Int64, expectedLength: Int64,
                       retryAfter: String?, url: String, now: Date = Date()) -> ResponseDecision {
        switch status {
        case 0:
            // file:// has no status; libcurl honours the range for it.
            return .append
        case 200:
            return .restartFromZero
        case 206:
            guard let range = ContentRange(contentRange), range.start == offset,
                  range.total == nil || range.total == expectedLength
            else {
                return .reject(TransferFailure(
                    error: PackDeliveryError(.networkFailure, message: "The server answered bytes '\(PackDeliveryError.printable(contentRange ?? "(none)"))' for a request from byte \(offset) of \(url).",
                                             hint: "It will be fetched again from the start.", subject: url, underlying: .init(.http, 206), httpStatus: 206),
                    retryable: true))
            }
            return .append
        case 416:
            return .rangeNotSatisfiable
        case 408, 429, 500...599:
            return .reject(TransferFailure(
                error: PackDeliveryError(.httpStatus, message: "The server answered \(status) for \(url).",
                                         hint: "Try again later; the partial download is kept.", subject: url, underlying: .init(.http, status), httpStatus: status),
                retryable: true, retryAfter: Self.retryAfterSeconds(retryAfter, now: now)))
        default:
            let hint = switch status {
            case 401, 403: "The server refused the credentials sent with the request."
            case 404, 410: "The pack is not on the server; the manifest may be out of date."
            default: "Check the manifest and the server."
            }
            return .reject(TransferFailure(
                error: PackDeliveryError(status == 401 || status == 403 ? .unauthorized : .httpStatus,
                                         message: "The server answered \(status) for \(url).", hint: hint, subject: url,
                                         underlying: .init(.http, status), httpStatus: status),
                retryable: false))
        }
    }

    /// Retry-After in seconds: either delta-seconds or an HTTP date.
    static func retryAfterSeconds(_ value: String?, now: Date) -> TimeInterval? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = TimeInterval(value) { return max(0, seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return max(0, date.timeIntervalSince(now))
    }
}

/// A parsed `Content-Range: bytes START-END/TOTAL` header.
struct ContentRange: Equatable, Sendable {
    var start: Int64
    var end: Int64
    var total: Int64?

    init?(_ header: String?) {
        guard let header = header?.trimmingCharacters(in: .whitespaces).lowercased(), header.hasPrefix("bytes ") else { return nil }
        let spec = header.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard parts.count == 2 else { return nil }
        let bounds = parts[0].split(separator: "-", maxSplits: 1)
        guard bounds.count == 2, let start = Int64(bounds[0]), let end = Int64(bounds[1]), start <= end else { return nil }
        self.start = start
        self.end = end
        if parts[1] == "*" { self.total = nil } else {
            guard let total = Int64(parts[1]), total > end else { return nil }
            self.total = total
        }
    }
}
