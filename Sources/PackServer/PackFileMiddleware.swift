import Foundation
import HTTPTypes
import Hummingbird

/// Serves the files of the folder: GET and HEAD, 200 and 206, with the validators and conditions a
/// resuming download client needs.
///
/// It started as a layer in front of Hummingbird's `FileMiddleware` (2.28) fixing what that does not
/// do, until nothing was left to it but assembling headers — which cost 8 % of the CPU of a 64 KiB
/// range request under load (it also builds and hashes its own ETag, formats dates and parses the
/// range again). What it does, and why not `FileMiddleware`:
///
/// - **Path safety**: every path goes through ``ServedFolder`` (bytes, component by component,
///   dotfiles refused, unresolvable paths refused). Malformed paths get 400, everything else that is
///   not served 404.
/// - **Folders**: `FileMiddleware` redirects `/a` to `/a/` by appending a slash to the path as sent, so
///   `//evil.example` became `Location: //evil.example/`, a protocol-relative URL to another host. Here
///   the redirect is rebuilt from the path's segments (`/evil.example/`), and a folder with a slash
///   gets 404 (there is no listing).
/// - **Preconditions** (RFC 9110 §13.2.2, in its order): `If-Match` (strong comparison) and, without
///   it, `If-Unmodified-Since` answer 412 when they fail; `If-None-Match` (weak comparison) and,
///   without it, `If-Modified-Since` answer 304.
/// - **A strong ETag** made of inode, modification time in nanoseconds and size. `FileMiddleware`'s is
///   weak (`W/"…"`, whole seconds and size), and it compares `If-Range` to it byte for byte — so it
///   honours `If-Range` with a weak tag (RFC 9110 §13.1.5 forbids that) and cannot tell two versions
///   of a file written within the same second apart. `If-Range` is a strong comparison here, or an
///   exact `Last-Modified` date.
/// - **Ranges**: `bytes=N-M`, `N-` and suffix `-N`; N past the end gets 416 with
///   `Content-Range: bytes */LENGTH` (`FileMiddleware` sends a broken 206); what cannot be satisfied as
///   one part (several ranges, bad syntax, `M < N`) is ignored and the whole file sent with 200, as
///   RFC 9110 §14.2 allows. `Range` on HEAD is ignored.
/// - **The bytes** come from ``FileBodies``: `sendfile` on a real connection, one chunk at a time
///   elsewhere; validators, length and bytes all from one open descriptor.
struct PackFileMiddleware<Context: RequestContext>: RouterMiddleware {
    let folder: ServedFolder
    let bodies: FileBodies

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
        switch Self.outcome(method: request.method, path: request.uri.path, headers: request.headers, file: file) {
        case .response(let response):
            return response
        case .send(let answer):
            guard request.method == .get, !answer.range.isEmpty else {
                return Response(status: answer.status, headers: answer.headers, body: ResponseBody())
            }
            let flow = (context as? PackRequestContext)?.flow
            return Response(status: answer.status, headers: answer.headers, body: self.bodies.body(file, range: answer.range, flow: flow))
        }
    }

    /// A 200 or 206 answer: its status, its headers (`Content-Length` included) and the bytes of the
    /// file to send (a HEAD request sends none of them).
    struct Answer {
        var status: HTTPResponse.Status
        var headers: HTTPFields
        var range: Range<Int>
    }

    /// What a GET or HEAD of a resolved file gets.
    enum Outcome {
        /// 200 or 206 with bytes of the file.
        case send(Answer)
        /// 304, 412 or 416: a response without a body.
        case response(Response)
    }

    /// The answer to a GET or HEAD of `file` with these request headers: preconditions, then Range
    /// and If-Range. Shared by this middleware and the connections' fast path (``FileFastPath``).
    static func outcome(method: HTTPRequest.Method, path: String, headers requestHeaders: HTTPFields, file: ResolvedFile) -> Outcome {
        let status = file.status
        var headers = HTTPFields()
        headers.reserveCapacity(8)
        headers[.eTag] = status.strongETag
        headers[.lastModified] = status.lastModifiedHeader

        switch Self.evaluatePreconditions(requestHeaders, file: status) {
        case .preconditionFailed:
            return .response(Response(status: .preconditionFailed, headers: headers))
        case .notModified:
            return .response(Response(status: .notModified, headers: headers))
        case .proceed:
            break
        }

        headers[.acceptRanges] = "bytes"
        if let mediaType = Self.mediaType(forPath: path) {
            headers[.contentType] = mediaType
        }
        var range = 0..<status.size
        var responseStatus = HTTPResponse.Status.ok
        // Range and If-Range.
        if let rangeHeader = requestHeaders.value(.range), method == .get,
            requestHeaders.value(.ifRange).map({ status.matchesIfRange($0) }) ?? true
        {
            switch Self.parseSingleRange(rangeHeader, size: status.size) {
            case .satisfiable(let lower, let upper):
                range = lower..<(upper + 1)
                responseStatus = .partialContent
                headers[.contentRange] = "bytes \(lower)-\(upper)/\(status.size)"
            case .unsatisfiable:
                headers[.contentRange] = "bytes */\(status.size)"
                return .response(Response(status: .rangeNotSatisfiable, headers: headers))
            case .ignored:
                break
            }
        }
        headers[.contentLength] = String(range.count)
        return .send(Answer(status: responseStatus, headers: headers, range: method == .get ? range : 0..<0))
    }

    /// The media type for the path's extension (`manifest.json` → `application/json`), or `nil`.
    static func mediaType(forPath path: String) -> String? {
        guard let dot = path.lastIndex(of: "."), !path[dot...].contains("/") else { return nil }
        let fileExtension = path[path.index(after: dot)...].lowercased()
        if fileExtension == "json" { return "application/json" }
        return MediaType.getMediaType(forExtension: fileExtension)?.description
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
        } else if let ifUnmodifiedSince = headers.value(.ifUnmodifiedSince), let date = HTTPDate.parse(ifUnmodifiedSince) {
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
        } else if let ifModifiedSince = headers.value(.ifModifiedSince), let date = HTTPDate.parse(ifModifiedSince) {
            if file.modifiedSeconds <= date {
                return .notModified
            }
        }
        return .proceed
    }

    enum RangeDecision: Equatable {
        case satisfiable(Int, Int)
        case unsatisfiable
        case ignored
    }

    /// Interprets a `Range` header against a file of `size` bytes (RFC 9110 §14.1.2), on its bytes
    /// (Foundation's `trimmingCharacters` cost 5 % of a range request's CPU under load).
    static func parseSingleRange(_ header: String, size: Int) -> RangeDecision {
        var bytes = Array(header.utf8)[...]
        func trim(_ part: inout ArraySlice<UInt8>) {
            while let first = part.first, first == UInt8(ascii: " ") || first == UInt8(ascii: "\t") { part.removeFirst() }
            while let last = part.last, last == UInt8(ascii: " ") || last == UInt8(ascii: "\t") { part.removeLast() }
        }
        func number(_ part: ArraySlice<UInt8>) -> Int? {
            guard !part.isEmpty, part.count <= 18, part.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else {
                return nil
            }
            return part.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) }
        }
        trim(&bytes)
        guard let equals = bytes.firstIndex(of: UInt8(ascii: "=")) else { return .ignored }
        var unit = bytes[..<equals]
        trim(&unit)
        guard unit.count == 5, unit.map({ $0 | 0x20 }) == Array("bytes".utf8) else { return .ignored }
        var spec = bytes[(equals + 1)...]
        trim(&spec)
        guard !spec.contains(UInt8(ascii: ",")), let dash = spec.firstIndex(of: UInt8(ascii: "-")) else { return .ignored }
        var first = spec[..<dash]
        var last = spec[(dash + 1)...]
        trim(&first)
        trim(&last)

        if first.isEmpty {
            // Suffix range: the last N bytes.
            guard let suffix = number(last) else { return .ignored }
            guard suffix > 0, size > 0 else { return .unsatisfiable }
            return .satisfiable(max(0, size - suffix), size - 1)
        }
        guard let lower = number(first) else { return .ignored }
        var upper = Int.max
        if !last.isEmpty {
            guard let value = number(last) else { return .ignored }
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
