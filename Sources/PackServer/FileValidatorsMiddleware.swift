import Foundation
import Hummingbird

/// Sits in front of Hummingbird's `FileMiddleware` and fixes what a resuming download client needs
/// and `FileMiddleware` (2.28) does not do:
///
/// - **Path safety**: rejects `..` and `.` segments and NUL bytes after percent-decoding (400), and
///   answers 404 for any path whose real location (symbolic links resolved) is outside the root.
/// - **A strong ETag**: `FileMiddleware` sends a weak tag (`W/"…"`) built from the modification time
///   in whole seconds and the size, and compares `If-Range` to it byte for byte — so it honours
///   `If-Range` with a weak tag (RFC 9110 §13.1.5 forbids that) and cannot tell two versions of a
///   file written within the same second apart. This middleware replaces the tag with a strong one
///   made of inode, modification time in nanoseconds and size, and evaluates `If-None-Match`
///   (weak comparison) and `If-Range` (strong comparison, or an exact `Last-Modified` date) itself.
/// - **416**: `FileMiddleware` answers `Range: bytes=N-` with N past the end with a broken 206; here it
///   gets `416` with `Content-Range: bytes */LENGTH`.
/// - **Range forms**: suffix ranges (`bytes=-N`, which `FileMiddleware` reads as `0-N`) are turned into
///   the equivalent `bytes=START-END`; ranges it cannot satisfy as one part (several ranges, bad
///   syntax, `M < N`) are ignored and the whole file is sent with 200, as RFC 9110 §14.2 allows.
///   `Range` on HEAD is ignored.
///
/// What is left to `FileMiddleware`: reading the file, 200/206 with `Content-Range` and
/// `Content-Length`, `Last-Modified`, `Content-Type`, `Accept-Ranges`, `If-Modified-Since`.
struct FileValidatorsMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The served folder, absolute, symbolic links resolved.
    let root: String

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard request.method == .get || request.method == .head else {
            return try await next(request, context)
        }
        guard let decoded = request.uri.path.removingPercentEncoding else {
            throw HTTPError(.badRequest, message: "Invalid percent encoding in the path.")
        }
        let segments = decoded.split(separator: "/", omittingEmptySubsequences: true)
        guard decoded.hasPrefix("/"), !decoded.contains("\0"), !segments.contains(where: { $0 == ".." || $0 == "." }) else {
            throw HTTPError(.badRequest, message: "The path must stay inside the served folder.")
        }
        guard let file = FileStatus(root: self.root, relativePath: segments.joined(separator: "/")) else {
            // Missing (FileMiddleware answers 404) or a folder (FileMiddleware redirects or answers 404).
            return try await next(self.stripped(request), context)
        }
        guard file.isInsideRoot else {
            throw HTTPError(.notFound)
        }
        guard file.isRegularFile else {
            return try await next(self.stripped(request), context)
        }

        var forwarded = request.headers
        var validators = HTTPFields()
        validators[.eTag] = file.strongETag
        validators[.lastModified] = file.lastModifiedHeader

        // If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2); weak comparison.
        if let ifNoneMatch = request.headers[values: .ifNoneMatch].nonEmpty {
            forwarded[.ifNoneMatch] = nil
            forwarded[.ifModifiedSince] = nil
            if Self.entityTags(in: ifNoneMatch).contains(where: { $0 == "*" || Self.weakEqual($0, file.strongETag) }) {
                return Response(status: .notModified, headers: validators)
            }
        }

        // Range and If-Range. FileMiddleware never sees If-Range: it is decided here.
        let ifRange = request.headers[.ifRange]
        forwarded[.ifRange] = nil
        if let rangeHeader = request.headers[.range] {
            forwarded[.range] = nil
            let conditionHolds = ifRange.map { file.matchesIfRange($0) } ?? true
            if request.method == .get, conditionHolds {
                switch Self.parseSingleRange(rangeHeader, size: file.size) {
                case .satisfiable(let lower, let upper):
                    forwarded[.range] = "bytes=\(lower)-\(upper)"
                case .unsatisfiable:
                    var headers = validators
                    headers[.contentRange] = "bytes */\(file.size)"
                    headers[.acceptRanges] = "bytes"
                    return Response(status: .rangeNotSatisfiable, headers: headers)
                case .ignored:
                    break
                }
            }
        }

        var response = try await next(Self.request(request, withHeaders: forwarded), context)
        if response.headers[.eTag] != nil {
            response.headers[.eTag] = file.strongETag
        }
        return response
    }

    /// The request without the conditional and range headers this middleware owns.
    private func stripped(_ request: Request) -> Request {
        var headers = request.headers
        headers[.ifRange] = nil
        headers[.range] = nil
        return Self.request(request, withHeaders: headers)
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
struct FileStatus {
    let isInsideRoot: Bool
    let isRegularFile: Bool
    let size: Int
    let inode: UInt64
    let modifiedSeconds: Int
    let modifiedNanoseconds: Int

    /// Stats `root/relativePath` (following symbolic links); `nil` when it does not exist.
    init?(root: String, relativePath: String) {
        let candidate = relativePath.isEmpty ? root : root + "/" + relativePath
        guard let resolvedPointer = realpath(candidate, nil) else { return nil }
        let resolved = String(cString: resolvedPointer)
        free(resolvedPointer)
        var info = stat()
        guard stat(resolved, &info) == 0 else { return nil }
        self.isInsideRoot = resolved == root || resolved.hasPrefix(root == "/" ? "/" : root + "/")
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

extension Array {
    fileprivate var nonEmpty: Self? { self.isEmpty ? nil : self }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { ("0"..."9").contains(self) }
}
