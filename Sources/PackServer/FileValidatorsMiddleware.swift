import Foundation
import HTTPTypes
import Hummingbird

/// Sits in front of Hummingbird's `FileMiddleware` and fixes what a resuming download client needs
/// and `FileMiddleware` (2.28) does not do:
///
/// - **Path safety**: every path goes through ``ServedFolder`` (bytes, component by component,
///   dotfiles refused, unresolvable paths refused); only regular files inside the root reach
///   `FileMiddleware`, already open. Malformed paths get 400, everything else that is not served 404.
/// - **Folders**: `FileMiddleware` redirects `/a` to `/a/` by appending a slash to the path as sent, so
///   `//evil.example` became `Location: //evil.example/`, a protocol-relative URL to another host. Here
///   the redirect is rebuilt from the path's segments (`/evil.example/`), and a folder with a slash
///   gets 404 (there is no listing).
/// - **Preconditions** (RFC 9110 §13.2.2, in its order): `If-Match` (strong comparison) and, without
///   it, `If-Unmodified-Since` answer 412 when they fail; `If-None-Match` (weak comparison) and,
///   without it, `If-Modified-Since` answer 304.
/// - **A strong ETag**: `FileMiddleware` sends a weak tag (`W/"…"`) built from the modification time
///   in whole seconds and the size, and compares `If-Range` to it byte for byte — so it honours
///   `If-Range` with a weak tag (RFC 9110 §13.1.5 forbids that) and cannot tell two versions of a
///   file written within the same second apart. This middleware replaces the tag with a strong one
///   made of inode, modification time in nanoseconds and size, and evaluates `If-Range` (strong
///   comparison, or an exact `Last-Modified` date) itself.
/// - **416**: `FileMiddleware` answers `Range: bytes=N-` with N past the end with a broken 206; here it
///   gets `416` with `Content-Range: bytes */LENGTH`.
/// - **Range forms**: suffix ranges (`bytes=-N`, which `FileMiddleware` reads as `0-N`) are turned into
///   the equivalent `bytes=START-END`; ranges it cannot satisfy as one part (several ranges, bad
///   syntax, `M < N`) are ignored and the whole file is sent with 200, as RFC 9110 §14.2 allows.
///   `Range` on HEAD is ignored.
///
/// What is left to `FileMiddleware`: 200/206 with `Content-Range` and `Content-Length`,
/// `Last-Modified`, `Content-Type`, `Accept-Ranges`; the bytes come from ``PackFileProvider``.
struct FileValidatorsMiddleware<Context: RequestContext>: RouterMiddleware {
    let folder: ServedFolder

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.method == .get || request.method == .head else {
            return try await next(request, context)
        }
        let file: ResolvedFile
        switch self.folder.resolve(encodedPath: request.uri.path) {
        case .file(let resolved):
            file = resolved
        case .folder(let canonicalPath):
            guard !request.uri.path.hasSuffix("/") else { throw HTTPError(.notFound) }
            // Never protocol-relative: canonicalPath starts with exactly one slash.
            return Response(status: .movedPermanently, headers: [.location: canonicalPath == "/" ? "/" : canonicalPath + "/"])
        case .missing, .refused:
            throw HTTPError(.notFound)
        case .malformed:
            throw HTTPError(.badRequest, message: "The path must stay inside the served folder.")
        }
        let status = file.status

        var validators = HTTPFields()
        validators[.eTag] = status.strongETag
        validators[.lastModified] = status.lastModifiedHeader

        switch Self.evaluatePreconditions(request.headers, file: status) {
        case .preconditionFailed:
            return Response(status: .preconditionFailed, headers: validators)
        case .notModified:
            return Response(status: .notModified, headers: validators)
        case .proceed:
            break
        }

        var forwarded = request.headers
        for name in [HTTPField.Name.ifMatch, .ifUnmodifiedSince, .ifNoneMatch, .ifModifiedSince, .ifRange, .range] {
            forwarded[name] = nil
        }
        // Range and If-Range. FileMiddleware never sees If-Range: it is decided here.
        if let rangeHeader = request.headers[.range], request.method == .get {
            let conditionHolds = request.headers[.ifRange].map { status.matchesIfRange($0) } ?? true
            if conditionHolds {
                switch Self.parseSingleRange(rangeHeader, size: status.size) {
                case .satisfiable(let lower, let upper):
                    forwarded[.range] = "bytes=\(lower)-\(upper)"
                case .unsatisfiable:
                    var headers = validators
                    headers[.contentRange] = "bytes */\(status.size)"
                    headers[.acceptRanges] = "bytes"
                    return Response(status: .rangeNotSatisfiable, headers: headers)
                case .ignored:
                    break
                }
            }
        }

        var response = try await PackFileProvider.$resolved.withValue(file) {
            try await next(Self.request(request, withHeaders: forwarded), context)
        }
        if response.headers[.eTag] != nil {
            response.headers[.eTag] = status.strongETag
        }
        return response
    }

    enum Precondition: Equatable {
        case proceed
        case preconditionFailed
        case notModified
    }

    /// The preconditions of RFC 9110 §13.2.2 for a GET or HEAD of `file`, in their order.
    static func evaluatePreconditions(_ headers: HTTPFields, file: FileStatus) -> Precondition {
        let ifMatch = headers[values: .ifMatch]
        if !ifMatch.isEmpty {
            // Strong comparison; a weak tag never matches (§13.1.1).
            let tags = Self.entityTags(in: ifMatch)
            if !tags.contains(where: { $0 == "*" || $0 == file.strongETag }) {
                return .preconditionFailed
            }
        } else if let ifUnmodifiedSince = headers[.ifUnmodifiedSince], let date = HTTPDate.parse(ifUnmodifiedSince) {
            // An invalid date is ignored (§13.1.4).
            if file.modifiedSeconds > date {
                return .preconditionFailed
            }
        }
        let ifNoneMatch = headers[values: .ifNoneMatch]
        if !ifNoneMatch.isEmpty {
            if Self.entityTags(in: ifNoneMatch).contains(where: { $0 == "*" || Self.weakEqual($0, file.strongETag) }) {
                return .notModified
            }
        } else if let ifModifiedSince = headers[.ifModifiedSince], let date = HTTPDate.parse(ifModifiedSince) {
            if file.modifiedSeconds <= date {
                return .notModified
            }
        }
        return .proceed
    }

    /// `request` with its header fields replaced (`Request.headers` is read-only).
    private static func request(_ request: Request, withHeaders headers: HTTPFields) -> Request {
        var head = request.head
        head.headerFields = headers
        return Request(head: head, body: request.body)
    }

    enum RangeDecision: Equatable {
        case satisfiable(Int, Int)
        case unsatisfiable
        case ignored
    }

    /// Interprets a `Range` header against a file of `size` bytes (RFC 9110 §14.1.2).
    static func parseSingleRange(_ header: String, size: Int) -> RangeDecision {
        let trimmed = header.trimmingCharacters(in: .whitespaces)
        guard let equals = trimmed.firstIndex(of: "="),
            trimmed[..<equals].trimmingCharacters(in: .whitespaces).lowercased() == "bytes"
        else { return .ignored }
        let spec = trimmed[trimmed.index(after: equals)...].trimmingCharacters(in: .whitespaces)
        guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return .ignored }
        let first = spec[..<dash].trimmingCharacters(in: .whitespaces)
        let last = spec[spec.index(after: dash)...].trimmingCharacters(in: .whitespaces)
        let isDigits = { (text: String) in !text.isEmpty && text.allSatisfy(\.isASCIIDigit) }

        if first.isEmpty {
            // Suffix range: the last N bytes.
            guard isDigits(last), let suffix = Int(last) else { return .ignored }
            guard suffix > 0, size > 0 else { return .unsatisfiable }
            return .satisfiable(max(0, size - suffix), size - 1)
        }
        guard isDigits(first), let lower = Int(first) else { return .ignored }
        var upper = Int.max
        if !last.isEmpty {
            guard isDigits(last), let value = Int(last) else { return .ignored }
            guard value >= lower else { return .ignored }
            upper = value
        }
        guard lower < size else { return .unsatisfiable }
        return .satisfiable(lower, min(upper, size - 1))
    }

    /// The entity tags of `If-None-Match` field lines (a list, possibly spread over several lines).
    static func entityTags(in fieldValues: [String]) -> [String] {
        fieldValues.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    /// Weak comparison: equal opaque tags, whatever the `W/` prefixes (RFC 9110 §8.8.3.2).
    static func weakEqual(_ lhs: String, _ rhs: String) -> Bool {
        func opaque(_ tag: String) -> Substring { tag.hasPrefix("W/") ? tag.dropFirst(2) : Substring(tag) }
        return opaque(lhs) == opaque(rhs)
    }
}

/// What `stat` says about a requested file, and the validators derived from it.
struct FileStatus: Sendable {
    let isRegularFile: Bool
    let size: Int
    let inode: UInt64
    let modifiedSeconds: Int
    let modifiedNanoseconds: Int

    /// What `fstat` said about an open file.
    init(_ info: stat) {
        self.isRegularFile = (info.st_mode & S_IFMT) == S_IFREG
        self.size = Int(info.st_size)
        self.inode = UInt64(info.st_ino)
        self.modifiedSeconds = Int(info.st_mtim.tv_sec)
        self.modifiedNanoseconds = Int(info.st_mtim.tv_nsec)
    }

    /// A strong entity tag: changes whenever the file is replaced (inode), rewritten (mtime in ns) or
    /// resized. Same idea as nginx's and Apache's tags, with nanoseconds.
    var strongETag: String {
        let nanoseconds = self.modifiedSeconds &* 1_000_000_000 &+ self.modifiedNanoseconds
        return "\"\(String(self.inode, radix: 16))-\(String(nanoseconds, radix: 16))-\(String(self.size, radix: 16))\""
    }

    /// `Last-Modified` as FileMiddleware sends it (IMF-fixdate, whole seconds).
    var lastModifiedHeader: String {
        HTTPDate.format(seconds: self.modifiedSeconds)
    }

    /// `If-Range` (RFC 9110 §13.1.5): a strong tag must equal ours exactly (a weak tag never matches);
    /// a date must equal the modification time to the second.
    func matchesIfRange(_ value: String) -> Bool {
        let value = value.trimmingCharacters(in: .whitespaces)
        if value.hasPrefix("W/") { return false }
        if value.hasPrefix("\"") { return value == self.strongETag }
        guard let seconds = HTTPDate.parse(value) else { return false }
        return seconds == self.modifiedSeconds
    }
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) without locale or formatter state.
enum HTTPDate {
    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func format(seconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    static func parse(_ text: String) -> Int? {
        // "Sun, 06 Nov 1994 08:49:37 GMT"
        let fields = text.split(separator: " ")
        guard fields.count == 6, fields[0].hasSuffix(","), fields[5] == "GMT",
            let day = Int32(fields[1]), let monthIndex = months.firstIndex(of: String(fields[2])),
            let year = Int32(fields[3])
        else { return nil }
        let clock = fields[4].split(separator: ":")
        guard clock.count == 3, let hour = Int32(clock[0]), let minute = Int32(clock[1]), let second = Int32(clock[2]) else {
            return nil
        }
        var parts = tm()
        parts.tm_year = year - 1900
        parts.tm_mon = Int32(monthIndex)
        parts.tm_mday = day
        parts.tm_hour = hour
        parts.tm_min = minute
        parts.tm_sec = second
        return Int(timegm(&parts))
    }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
