import Hummingbird

/// Refuses every request that does not carry `Authorization: Bearer <token>` with 401 and
/// `WWW-Authenticate: Bearer realm="packs"` (RFC 6750 §3).
struct BearerTokenMiddleware<Context: RequestContext>: RouterMiddleware {
    let token: String

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let credentials = request.headers[.authorization], self.accepts(credentials) else {
            var headers = HTTPFields()
            headers[.wwwAuthenticate] = "Bearer realm=\"packs\""
            throw HTTPError(.unauthorized, headers: headers, message: "A bearer token is required.")
        }
        return try await next(request, context)
    }

    /// The scheme is case-insensitive; the token is compared in constant time.
    private func accepts(_ credentials: String) -> Bool {
        let parts = credentials.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return false }
        let given = Array(parts[1].utf8)
        let expected = Array(self.token.utf8)
        var difference = given.count ^ expected.count
        for index in 0..<expected.count {
            difference |= Int(expected[index] ^ (index < given.count ? given[index] : 0))
        }
        return difference == 0
    }
}
