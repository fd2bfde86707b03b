import HTTPTypes
import Logging

/// Which requests a connection answers itself, on the event loop (``FileFastPathHandler``): a plain
/// GET or HEAD of a file that the router would answer with 200 or 206 — the same checks as the
/// router's middleware, in the same order, with the same functions (request guard, authorization,
/// ``PackFileMiddleware``). Everything else — errors, redirects, 304, 412, 416, refusals, a catalog
/// made for the credential's products, requests with a body — is left to the router, which answers
/// it the same way.
struct FileFastPath: Sendable {
    let folder: ServedFolder
    let authorizer: (any PackAuthorizer)?
    let index: ManifestIndex
    /// The request log (one info line per request, as ``RequestLogMiddleware`` writes it).
    let logger: Logger
    /// Counts the answers sent here, when metrics are on.
    var metrics: ServerMetrics? = nil
    /// Whether `/keys/…` is the router's (``KeyMiddleware``), never a file.
    var answersKeys = false

    /// What to send for a request answered on the event loop.
    struct Answer {
        /// The request's path, without its query.
        let target: String
        /// The open file; its descriptor stays valid while this is kept.
        let file: ResolvedFile
        /// Status, headers and the bytes of the file to send.
        let response: PackFileMiddleware<PackRequestContext>.Answer
        /// Who presented the credential, for the request log.
        let credential: String?
    }

    /// The answer to `head` when it is a plain GET or HEAD of a file answered with 200 or 206, else `nil`.
    func answer(to head: HTTPRequest) -> Answer? {
        guard head.method == .get || head.method == .head,
            let path = head.path, let authority = head.authority, RequestGuardMiddleware<PackRequestContext>.isValidHost(authority),
            !head.headerFields.contains(where: { $0.name.canonicalName == "host" }),
            head.headerFields.value(.transferEncoding) == nil, (head.headerFields.value(.contentLength) ?? "0") == "0"
        else { return nil }
        let target = String(path.prefix { $0 != "?" })
        // Never a file: the router answers it, before any credential is asked for.
        if HealthMiddleware<PackRequestContext>.isHealthPath(target) { return nil }
        if self.answersKeys, KeyMiddleware<PackRequestContext>.isKeyPath(target) { return nil }
        var credential: String?
        var grant: AccessGrant?
        if let authorizer = self.authorizer {
            guard let resource = self.index.resource(forRequestTarget: target) else { return nil }
            let decided = authorizer.authorize(authorization: head.headerFields.value(.authorization), resource: resource)
            // Refusals, and a catalog made for the credential's products, are the router's.
            guard decided.decision == .allow else { return nil }
            if case .catalog = resource.kind, decided.products != nil { return nil }
            credential = decided.credential
            grant = decided
        }
        guard case .file(let file) = self.folder.resolve(encodedPath: target),
            case .send(let response) = PackFileMiddleware<PackRequestContext>.outcome(
                method: head.method, path: target, headers: head.headerFields, file: file)
        else { return nil }
        // Counted only when answered here: a request left to the router is counted there, once.
        if let grant { self.metrics?.allowed(grant) }
        return Answer(target: target, file: file, response: response, credential: credential)
    }
}
