import Foundation

/// What to do with a response's body, given what the partial file already holds. Pure; no I/O.
enum ResponseDecision: Equatable, Sendable {
    /// Append the body at the current offset (a 206 whose Content-Range starts where we asked).
    case append
    /// Discard the partial file and write the body from byte 0 (a 200: the range was ignored or the validator changed).
    case restartFromZero
    /// The file already holds the whole pack (a 416 for a range that starts at its end).
    case complete
    /// Do not write the body; the attempt fails with this. With `discardPartial`, the partial file is from
    /// another version of the pack and is emptied.
    case reject(TransferFailure, discardPartial: Bool)

    /// The response headers a decision needs.
    struct Headers: Equatable, Sendable {
        var contentRange: String?
        var contentLength: String?
        var retryAfter: String?
        var contentEncoding: String?

        init(_ fields: [String: String]) {
            self.contentRange = fields["content-range"]
            self.contentLength = fields["content-length"]
            self.retryAfter = fields["retry-after"]
            self.contentEncoding = fields["content-encoding"]
        }

        init(contentRange: String? = nil, contentLength: String? = nil, retryAfter: String? = nil) {
            self.contentRange = contentRange
            self.contentLength = contentLength
            self.retryAfter = retryAfter
        }
    }

    /// Decides for an HTTP response.
    /// - Parameters:
    ///   - status: the final response's status (after redirects); 0 for file:// URLs.
    ///   - headers: its Content-Range, Content-Length and Retry-After.
    ///   - offset: bytes already in the file (what was asked for with `Range: bytes=offset-`).
    ///   - expectedLength: the manifest's `contentLength`.
    ///   - url: the URL without credentials, for messages.
    static func decide(status: Int, headers: Headers, offset: Int64, expectedLength: Int64, url: String, now: Date = Date())
        -> ResponseDecision
    {
        switch status {
        case 0:
            // file:// has no status; libcurl honours the range for it. Its length is checked at the end.
            return .append
        case 200:
            if headers.contentEncoding == nil,
                let length = headers.contentLength.flatMap({ Int64($0.trimmingCharacters(in: .whitespaces)) }),
                length != expectedLength
            {
                return .reject(Self.lengthMismatch(serverLength: length, expectedLength: expectedLength, url: url), discardPartial: false)
            }
            return .restartFromZero
        case 206:
            guard let range = ContentRange(headers.contentRange) else {
                return .reject(Self.unexpectedRange(headers.contentRange, offset: offset, url: url), discardPartial: true)
            }
            if let total = range.total, total != expectedLength {
                // The file on the server has another length now: what we hold is from another version.
                return .reject(Self.lengthMismatch(serverLength: total, expectedLength: expectedLength, url: url), discardPartial: true)
            }
            guard range.start == offset else {
                return .reject(Self.unexpectedRange(headers.contentRange, offset: offset, url: url), discardPartial: true)
            }
            return .append
        case 416:
            // RFC 9110: a 416 should say the file's length as `bytes */LENGTH`.
            let total = ContentRange.unsatisfiedTotal(headers.contentRange)
            if let total, total != expectedLength {
                return .reject(Self.lengthMismatch(serverLength: total, expectedLength: expectedLength, url: url), discardPartial: true)
            }
            if offset == expectedLength { return .complete }
            return .reject(
                TransferFailure(
                    error: PackDeliveryError(
                        .httpStatus, message: "The server said the range from byte \(offset) is not satisfiable for \(url).", subject: url,
                        underlying: .init(.http, 416), httpStatus: 416),
                    retryable: true, countsAlways: true), discardPartial: true)
        case 408, 429, 500...599:
            let retryAfter = Self.retryAfterSeconds(headers.retryAfter, now: now)
            let wait = retryAfter.map { " and asked to wait \(Self.duration($0))" } ?? ""
            return .reject(
                TransferFailure(
                    error: PackDeliveryError(
                        .httpStatus, message: "The server answered \(status)\(wait) for \(url).",
                        hint: "It is tried again; the partial download is kept.", subject: url, underlying: .init(.http, status),
                        httpStatus: status),
                    retryable: true, retryAfter: retryAfter), discardPartial: false)
        default:
            let hint =
                switch status {
                case 401, 403: "The server refused the credentials sent with the request."
                case 404, 410: "The pack is not on the server; the manifest may be out of date."
                default: "Check the manifest and the server."
                }
            return .reject(
                TransferFailure(
                    error: PackDeliveryError(
                        status == 401 || status == 403 ? .unauthorized : .httpStatus,
                        message: "The server answered \(status) for \(url).", hint: hint, subject: url,
                        underlying: .init(.http, status), httpStatus: status),
                    retryable: false), discardPartial: false)
        }
    }

    /// Decides for the response to a range request (a delta update's): `range.bytes`, of which the partial file
    /// already holds the first `offset`, were asked for without If-Range.
    /// - Parameters:
    ///   - validator: the response's strong ETag or Last-Modified.
    ///   - expectedValidator: the one the bytes kept so far came with, if any: another means the file changed.
    static func decide(
        status: Int, headers: Headers, range: ByteRange, offset: Int64, validator: String?, expectedValidator: String?, url: String,
        now: Date = Date()
    ) -> ResponseDecision {
        switch status {
        case 206:
            // A server that answers another range than the one asked for does not serve ranges that can be used.
            var unexpected = Self.unexpectedRange(headers.contentRange, offset: range.bytes.lowerBound + offset, url: url)
            unexpected.rangeProblem = .ignored
            guard let given = ContentRange(headers.contentRange), let total = given.total else {
                return .reject(unexpected, discardPartial: true)
            }
            if total != range.fileLength {
                // Another length: another version of the file, whatever its validator says.
                var failure = Self.lengthMismatch(serverLength: total, expectedLength: range.fileLength, url: url)
                failure.rangeProblem = .fileChanged
                return .reject(failure, discardPartial: true)
            }
            guard given.start == range.bytes.lowerBound + offset, given.end < range.bytes.upperBound else {
                return .reject(unexpected, discardPartial: true)
            }
            if let expectedValidator, let validator, validator != expectedValidator {
                return .reject(
                    TransferFailure(
                        error: PackDeliveryError(
                            .networkFailure, message: "The file \(url) changed on the server (its ETag or Last-Modified changed).",
                            hint: "The bytes kept from it are discarded; it is read again from the start.", subject: url),
                        retryable: true, countsAlways: true, rangeProblem: .fileChanged), discardPartial: true)
            }
            return .append
        case 200, 416:
            return .reject(
                TransferFailure(
                    error: PackDeliveryError(
                        .httpStatus, message: "The server answered \(status) to a range request for \(url): it does not serve ranges.",
                        subject: url, underlying: .init(.http, status), httpStatus: status),
                    retryable: false, rangeProblem: .ignored), discardPartial: false)
        default:
            // Everything else means the same for a range as for the whole file.
            return Self.decide(status: status, headers: headers, offset: offset, expectedLength: range.fileLength, url: url, now: now)
        }
    }

    /// The server's file is not as long as the manifest says: tried again (the server may be mid-deployment),
    /// but every attempt counts.
    static func lengthMismatch(serverLength: Int64, expectedLength: Int64, url: String) -> TransferFailure {
        let difference = serverLength - expectedLength
        let how =
            difference < 0
            ? "\(-difference) byte\(difference == -1 ? "" : "s") shorter" : "\(difference) byte\(difference == 1 ? "" : "s") longer"
        return TransferFailure(
            error: PackDeliveryError(
                .lengthMismatch,
                message: "The server's file \(url) is \(how) than the manifest says (\(serverLength) bytes, not \(expectedLength)).",
                hint: "The manifest and the server disagree; one of them is out of date.", subject: url),
            retryable: true, countsAlways: true)
    }

    private static func unexpectedRange(_ contentRange: String?, offset: Int64, url: String) -> TransferFailure {
        TransferFailure(
            error: PackDeliveryError(
                .networkFailure,
                message:
                    "The server answered bytes '\(PackDeliveryError.printable(String((contentRange ?? "(none)").prefix(100))))' for a request from byte \(offset) of \(url).",
                hint: "It will be fetched again from the start.", subject: url, underlying: .init(.http, 206), httpStatus: 206),
            retryable: true, countsAlways: true)
    }

    /// Retry-After in seconds: either delta-seconds or an HTTP date.
    static func retryAfterSeconds(_ value: String?, now: Date) -> TimeInterval? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = TimeInterval(value), seconds.isFinite { return max(0, seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return max(0, date.timeIntervalSince(now))
    }

    static func duration(_ seconds: TimeInterval) -> String {
        let whole = Int(seconds.rounded())
        if whole < 120 { return "\(whole) s" }
        if whole < 7200 { return "\(whole / 60) min" }
        return "\(whole / 3600) h"
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
        guard bounds.count == 2, let start = Int64(bounds[0]), let end = Int64(bounds[1]), start >= 0, start <= end else { return nil }
        self.start = start
        self.end = end
        if parts[1] == "*" {
            self.total = nil
        } else {
            guard let total = Int64(parts[1]), total > end else { return nil }
            self.total = total
        }
    }

    /// The length in a 416's `Content-Range: bytes */LENGTH`, if any.
    static func unsatisfiedTotal(_ header: String?) -> Int64? {
        guard let header = header?.trimmingCharacters(in: .whitespaces).lowercased(), header.hasPrefix("bytes */") else { return nil }
        return Int64(header.dropFirst(8))
    }
}
