import Foundation
import HTTPTypes
import Hummingbird
import Logging

/// Refuses requests that are not for this server's kind of content, before anything else looks at
/// them (RFC 9112 §3.2, RFC 9110 §15.5.6):
///
/// - no `Host` header, or more than one: 400 (HTTP/1.1 requires exactly one; two are an attempt to
///   make a proxy and this server disagree about the target);
/// - a method other than GET and HEAD: 405 with `Allow: GET, HEAD` (unless `allowsAnyMethod`, for the
///   `--auth-only` gate, which judges the original request whatever the subrequest's method).
struct RequestGuardMiddleware<Context: RequestContext>: RouterMiddleware {
    var allowsAnyMethod = false

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // The first Host line becomes the request's authority; any further one stays a header field.
        guard let authority = request.head.authority, !request.headers.contains(where: { $0.name.canonicalName == "host" }),
            Self.isValidHost(authority)
        else {
            throw HTTPError(.badRequest, message: "A request needs exactly one valid Host header.")
        }
        guard self.allowsAnyMethod || request.method == .get || request.method == .head else {
            throw HTTPError(.methodNotAllowed, headers: [.allow: "GET, HEAD"], message: "Only GET and HEAD are served.")
        }
        return try await next(request, context)
    }

    /// `uri-host [ ":" port ]`: a reg-name, IPv4 or bracketed IPv6 literal; no spaces, slashes or `@`.
    static func isValidHost(_ host: String) -> Bool {
        !host.isEmpty
            && host.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                    true
                case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: ":"),
                    UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "%"):
                    true
                default:
                    false
                }
            }
    }
}

/// Serves a file only when the ``PackAuthorizer`` allows the request's credential to have it:
/// 401 with `WWW-Authenticate: Bearer realm="packs"` (RFC 6750 §3) or 403 otherwise.
struct AuthorizationMiddleware<Context: RequestContext>: RouterMiddleware {
    let authorizer: any PackAuthorizer
    let index: ManifestIndex
    /// Counts refusals by reason, when metrics are on.
    var metrics: ServerMetrics? = nil

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let resource = self.index.resource(forRequestTarget: request.uri.path) else {
            throw HTTPError(.badRequest, message: "The path must stay inside the served folder.")
        }
        let grant = self.authorizer.authorize(authorization: request.headers[.authorization], resource: resource)
        (context as? PackRequestContext)?.notes.credential = grant.credential
        if grant.decision != .allow { self.metrics?.refusal(grant) }
        switch grant.decision {
        case .allow:
            self.metrics?.allowed(grant)
            if case .catalog = resource.kind, let products = grant.products,
                let answer = self.index.catalog(for: products, logger: context.logger)
            {
                return Self.respond(with: answer, to: request)
            }
            return try await next(request, context)
        case .unauthorized:
            throw AuthGateMiddleware<Context>.unauthorized
        case .forbidden:
            throw HTTPError(.forbidden, message: "This credential does not cover this pack.")
        }
    }

    /// The catalog made for one credential: never cached by others (`private`, `Vary: Authorization`), whole
    /// (a Range is ignored, as RFC 9110 allows).
    static func respond(with body: Data, to request: Request) -> Response {
        var headers: HTTPFields = [.contentType: "application/json", .cacheControl: "private, no-store", .vary: "Authorization"]
        headers[.contentLength] = "\(body.count)"
        if request.method == .head {
            return Response(status: .ok, headers: headers, body: ResponseBody())
        }
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: body)))
    }
}

/// `packs serve --auth-only`: answers nginx `auth_request` subrequests (or a CDN's origin auth hook)
/// whatever their path, judging the original request named by `X-Original-URI` (nginx:
/// `proxy_set_header X-Original-URI $request_uri;`): 204 when the ``PackAuthorizer`` allows the
/// `Authorization` header to have that file, 401 (with `WWW-Authenticate: Bearer`) or 403 when not.
/// A subrequest without `X-Original-URI`, or with one that is not a path inside the site, gets 403.
/// The 204 and 403 answers to a genuine receipt say its environment, `X-Receipt-Environment: production` or
/// `sandbox`, which nginx can take with `auth_request_set` (for its log, a header to the client or upstream).
struct AuthGateMiddleware<Context: RequestContext>: RouterMiddleware {
    static var originalURI: HTTPField.Name { HTTPField.Name("X-Original-URI")! }
    static var receiptEnvironment: HTTPField.Name { HTTPField.Name("X-Receipt-Environment")! }

    static var unauthorized: HTTPError {
        HTTPError(.unauthorized, headers: [.wwwAuthenticate: "Bearer realm=\"packs\""], message: "A bearer credential is required.")
    }

    let authorizer: any PackAuthorizer
    let index: ManifestIndex
    /// Counts refusals by reason, when metrics are on.
    var metrics: ServerMetrics? = nil

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let original = request.headers[Self.originalURI], let resource = self.index.resource(forRequestTarget: original) else {
            context.logger.warning(
                "An auth subrequest without a usable X-Original-URI: refused (set proxy_set_header X-Original-URI $request_uri).")
            return Response(status: .forbidden)
        }
        let grant = self.authorizer.authorize(authorization: request.headers[.authorization], resource: resource)
        (context as? PackRequestContext)?.notes.credential = grant.credential
        if grant.decision != .allow { self.metrics?.refusal(grant) }
        var headers = HTTPFields()
        if let environment = grant.environment { headers[Self.receiptEnvironment] = environment.label }
        switch grant.decision {
        case .allow:
            self.metrics?.allowed(grant)
            return Response(status: .noContent, headers: headers)
        case .unauthorized:
            return Response(status: .unauthorized, headers: [.wwwAuthenticate: "Bearer realm=\"packs\""])
        case .forbidden:
            return Response(status: .forbidden, headers: headers)
        }
    }
}
