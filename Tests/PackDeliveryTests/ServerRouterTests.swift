import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import PackTestSupport
import Testing

@testable import PackServer

// The server's middleware driven through Hummingbird's router test framework (`app.test(.router)`):
// the real router PackServer builds, with no sockets. The preconditions, methods and bearer
// parsing, and the --auth-only gate's decisions.

/// A folder with two products' packs and a manifest listing them.
private struct Site {
    let root: URL
    let etag: String
    let lastModified: String

    static func make(_ label: String) throws -> Site {
        let root = try Fixtures.temporaryDirectory(label)
        try Fixtures.randomFile(at: root.appendingPathComponent("a.zip"), size: 10_000)
        try Fixtures.randomFile(at: root.appendingPathComponent("packs/b.zip"), size: 5_000)
        try Data("not listed".utf8).write(to: root.appendingPathComponent("other.txt"))
        let manifest = """
            {"products": [
              {"productIdentifier": "com.example.a", "contents": [{"url": "a.zip"}]},
              {"productIdentifier": "com.example.b", "contents": [{"url": "packs/b.zip"}]}
            ]}
            """
        try Data(manifest.utf8).write(to: root.appendingPathComponent("manifest.json"))
        var info = stat()
        stat(root.appendingPathComponent("a.zip").path, &info)
        let nanoseconds = Int(info.st_mtim.tv_sec) * 1_000_000_000 + Int(info.st_mtim.tv_nsec)
        let etag = "\"\(String(UInt64(info.st_ino), radix: 16))-\(String(nanoseconds, radix: 16))-\(String(10_000, radix: 16))\""
        return Site(root: root, etag: etag, lastModified: httpDateForTests(seconds: Int(info.st_mtim.tv_sec)))
    }

    func application(_ configuration: PackServerConfiguration? = nil) throws -> some ApplicationProtocol {
        let configuration = configuration ?? PackServerConfiguration(directory: self.root, port: 0)
        return Application(router: try PackServer.makeRouter(configuration, logger: LogLines().logger()))
    }
}

/// Grants the packs of the products named in `Authorization: Bearer receipt/<product>+<product>`:
/// how a receipt that names products plugs into the gate.
struct ProductListAuthorizer: PackAuthorizer {
    func decide(authorization: String?, resource: ProtectedResource) -> AccessDecision {
        guard let authorization, let token = BearerCredentials.token(in: authorization), token.hasPrefix("receipt/") else {
            return .unauthorized
        }
        let products = token.dropFirst("receipt/".count).split(separator: "+").map(String.init)
        switch resource.kind {
        case .catalog: return .allow
        case .pack(let owners): return owners.contains(where: products.contains) ? .allow : .forbidden
        case .unlisted: return .forbidden
        }
    }
}

func httpDateForTests(seconds: Int) -> String {
    let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    var time = time_t(seconds)
    var parts = tm()
    gmtime_r(&time, &parts)
    func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
    return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
        + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
}

private let xOriginalURI = HTTPField.Name("X-Original-URI")!

@Suite("PackServer router: preconditions, methods, bearer, auth gate (app.test(.router))", .timeLimit(.minutes(1)))
struct ServerRouterTests {
    @Test("If-Match and If-Unmodified-Since answer 412 when they fail, in RFC 9110's order")
    func preconditions() async throws {
        let site = try Site.make("router-preconditions")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let past = "Sun, 06 Nov 1994 08:49:37 GMT"
        let future = httpDateForTests(seconds: Int(Date().timeIntervalSince1970) + 86_400)
        let cases: [(HTTPFields, HTTPResponse.Status)] = [
            ([.ifMatch: "\"other\""], .preconditionFailed),
            ([.ifMatch: site.etag], .ok),
            ([.ifMatch: "\"x\", \(site.etag)"], .ok),
            ([.ifMatch: "*"], .ok),
            ([.ifMatch: "W/\(site.etag)"], .preconditionFailed),  // strong comparison
            ([.ifUnmodifiedSince: past], .preconditionFailed),
            ([.ifUnmodifiedSince: future], .ok),
            ([.ifUnmodifiedSince: site.lastModified], .ok),
            ([.ifUnmodifiedSince: "yesterday"], .ok),  // invalid dates are ignored
            ([.ifMatch: site.etag, .ifUnmodifiedSince: past], .ok),  // If-Match wins
            ([.ifMatch: "\"other\"", .ifNoneMatch: site.etag], .preconditionFailed),  // 412 before 304
            ([.ifNoneMatch: site.etag], .notModified),
            ([.ifNoneMatch: "W/\(site.etag)"], .notModified),  // weak comparison
            ([.ifNoneMatch: "\"other\"", .ifModifiedSince: future], .ok),  // If-None-Match wins
            ([.ifModifiedSince: future], .notModified),
            ([.ifModifiedSince: past], .ok),
        ]
        try await site.application().test(.router) { client in
            for (headers, expected) in cases {
                for method in [HTTPRequest.Method.get, .head] {
                    try await client.execute(uri: "/a.zip", method: method, headers: headers) { response in
                        #expect(response.status == expected, "\(method) \(headers)")
                        if response.status == .preconditionFailed || response.status == .notModified {
                            #expect(response.body.readableBytes == 0)
                            #expect(response.headers[.eTag] == site.etag)
                        }
                    }
                }
            }
            // A 412 wins over a Range: nothing is sent.
            try await client.execute(uri: "/a.zip", method: .get, headers: [.ifMatch: "\"other\"", .range: "bytes=0-9"]) { response in
                #expect(response.status == .preconditionFailed)
            }
            try await client.execute(uri: "/a.zip", method: .get, headers: [.ifMatch: site.etag, .range: "bytes=0-9"]) { response in
                #expect(response.status == .partialContent)
                #expect(response.body.readableBytes == 10)
            }
        }
    }

    @Test("methods other than GET and HEAD get 405 with Allow: GET, HEAD")
    func methods() async throws {
        let site = try Site.make("router-methods")
        defer { try? FileManager.default.removeItem(at: site.root) }
        try await site.application().test(.router) { client in
            for method in [HTTPRequest.Method.post, .put, .delete, .options, .patch, .trace, .connect] {
                for uri in ["/a.zip", "/missing.zip"] {
                    try await client.execute(uri: uri, method: method) { response in
                        #expect(response.status == .methodNotAllowed, "\(method) \(uri)")
                        #expect(response.headers[.allow] == "GET, HEAD", "\(method) \(uri)")
                    }
                }
            }
        }
    }

    @Test("a header's value read on the fast path is what HTTPFields gives: absent, once, repeated (joined), a cookie")
    func headerValues() {
        let range = HTTPField.Name.range
        var fields = HTTPFields()
        #expect(fields.value(range) == nil)
        fields.append(HTTPField(name: range, value: "bytes=0-9"))
        fields.append(HTTPField(name: .accept, value: "*/*"))
        #expect(fields.value(range) == "bytes=0-9" && fields.value(range) == fields[range])
        fields.append(HTTPField(name: range, value: "bytes=20-29"))
        #expect(fields.value(range) == "bytes=0-9, bytes=20-29" && fields.value(range) == fields[range])
        fields.append(HTTPField(name: .cookie, value: "a=1"))
        fields.append(HTTPField(name: .cookie, value: "b=2"))
        #expect(fields.value(.cookie) == "a=1; b=2")
    }

    @Test("a Range sent twice is one list of ranges, which this server ignores (200, whole file); once, 206")
    func repeatedRange() async throws {
        let site = try Site.make("router-range-twice")
        defer { try? FileManager.default.removeItem(at: site.root) }
        try await site.application().test(.router) { client in
            var twice = HTTPFields()
            twice.append(HTTPField(name: .range, value: "bytes=0-9"))
            twice.append(HTTPField(name: .range, value: "bytes=20-29"))
            try await client.execute(uri: "/a.zip", method: .get, headers: twice) { response in
                #expect(response.status == .ok && response.body.readableBytes == 10_000)
            }
            try await client.execute(uri: "/a.zip", method: .get, headers: [.range: "bytes=0-9"]) { response in
                #expect(response.status == .partialContent && response.body.readableBytes == 10)
            }
        }
    }

    @Test("two Host headers get 400")
    func duplicateHost() async throws {
        let site = try Site.make("router-host")
        defer { try? FileManager.default.removeItem(at: site.root) }
        try await site.application().test(.router) { client in
            // The test client sets the first Host (the authority); this is a second one.
            try await client.execute(uri: "/a.zip", method: .get, headers: [HTTPField.Name("Host")!: "evil.example"]) { response in
                #expect(response.status == .badRequest)
            }
            try await client.execute(uri: "/a.zip", method: .get) { response in
                #expect(response.status == .ok)
            }
        }
    }

    @Test("bearer: scheme case-insensitive, one or more spaces, token68 only")
    func bearerParsing() {
        #expect(BearerCredentials.token(in: "Bearer abc") == "abc")
        #expect(BearerCredentials.token(in: "bearer abc") == "abc")
        #expect(BearerCredentials.token(in: "BEARER abc") == "abc")
        #expect(BearerCredentials.token(in: "Bearer  abc") == "abc")
        #expect(BearerCredentials.token(in: "Bearer     a-b.c_d~e+f/g==") == "a-b.c_d~e+f/g==")
        #expect(BearerCredentials.token(in: " \tBearer abc \t") == "abc")
        #expect(BearerCredentials.token(in: "Bearer") == nil)
        #expect(BearerCredentials.token(in: "Bearer ") == nil)
        #expect(BearerCredentials.token(in: "Bearer\tabc") == nil)  // 1*SP, not a tab
        #expect(BearerCredentials.token(in: "Bearer a b") == nil)
        #expect(BearerCredentials.token(in: "Bearer ==") == nil)
        #expect(BearerCredentials.token(in: "Bearer a=b") == nil)
        #expect(BearerCredentials.token(in: "Basic abc") == nil)
        #expect(BearerCredentials.token(in: "Bearerabc") == nil)
    }

    @Test("--token through the router: 401 with WWW-Authenticate, 200 however the scheme is written")
    func bearerThroughRouter() async throws {
        let site = try Site.make("router-token")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let app = try site.application(PackServerConfiguration(directory: site.root, port: 0, token: "s3cret"))
        try await app.test(.router) { client in
            for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret", "Bearer   s3cret"] {
                try await client.execute(uri: "/a.zip", method: .get, headers: [.authorization: value]) { response in
                    #expect(response.status == .ok, "\(value)")
                }
            }
            for value in [nil, "Bearer s3cre", "Bearer s3crett", "Basic czNjcmV0", "s3cret"] as [String?] {
                let headers: HTTPFields = value.map { [.authorization: $0] } ?? [:]
                try await client.execute(uri: "/a.zip", method: .get, headers: headers) { response in
                    #expect(response.status == .unauthorized, "\(value ?? "none")")
                    #expect(response.headers[.wwwAuthenticate] == "Bearer realm=\"packs\"")
                    #expect(!String(decoding: response.body.readableBytesView, as: UTF8.self).contains("s3cret"))
                }
            }
        }
    }

    @Test("--auth-only: 204/401 for the token on any path; the product that owns X-Original-URI decides")
    func authGate() async throws {
        let site = try Site.make("router-gate")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let tokenGate = try site.application(PackServerConfiguration(directory: site.root, port: 0, token: "s3cret", mode: .authOnly))
        try await tokenGate.test(.router) { client in
            for path in ["/auth", "/", "/anything/at/all"] {
                try await client.execute(
                    uri: path, method: .get, headers: [.authorization: "Bearer s3cret", xOriginalURI: "/a.zip?x=1"]
                ) { response in
                    #expect(response.status == .noContent, "\(path)")
                    #expect(response.body.readableBytes == 0)
                }
            }
            try await client.execute(uri: "/auth", method: .get, headers: [xOriginalURI: "/a.zip"]) { response in
                #expect(response.status == .unauthorized)
                #expect(response.headers[.wwwAuthenticate] == "Bearer realm=\"packs\"")
            }
            try await client.execute(uri: "/auth", method: .get, headers: [.authorization: "Bearer nope", xOriginalURI: "/a.zip"]) {
                #expect($0.status == .unauthorized)
            }
            // The gate never serves the file itself.
            try await client.execute(uri: "/a.zip", method: .get, headers: [.authorization: "Bearer s3cret", xOriginalURI: "/a.zip"]) {
                #expect($0.status == .noContent)
                #expect($0.body.readableBytes == 0)
            }
            // No X-Original-URI: refused.
            try await client.execute(uri: "/a.zip", method: .get, headers: [.authorization: "Bearer s3cret"]) {
                #expect($0.status == .forbidden)
            }
        }

        let receipts = try site.application(
            PackServerConfiguration(directory: site.root, port: 0, authorizer: ProductListAuthorizer(), mode: .authOnly)
        )
        let onlyA: HTTPFields = [.authorization: "Bearer receipt/com.example.a"]
        let cases: [(String, HTTPResponse.Status)] = [
            ("/a.zip", .noContent),
            ("/a.zip?token=x#f", .noContent),
            ("/%61.zip", .noContent),
            ("//a.zip", .noContent),
            ("/packs/../a.zip", .noContent),
            ("/packs/b.zip", .forbidden),
            ("/packs/./b.zip", .forbidden),
            ("/a.zip/../packs/b.zip", .forbidden),
            ("/packs%2Fb.zip", .forbidden),
            ("/manifest.json", .noContent),
            ("/other.txt", .forbidden),
            ("/../a.zip", .forbidden),  // above the root: not a path
            ("/a%zz.zip", .forbidden),
        ]
        try await receipts.test(.router) { client in
            for (original, expected) in cases {
                var headers = onlyA
                headers[xOriginalURI] = original
                try await client.execute(uri: "/auth", method: .get, headers: headers) { response in
                    #expect(response.status == expected, "\(original)")
                }
            }
            try await client.execute(uri: "/auth", method: .get, headers: [xOriginalURI: "/a.zip"]) {
                #expect($0.status == .unauthorized)
            }
        }
    }

    @Test("a new manifest is read without a restart")
    func manifestReload() async throws {
        let site = try Site.make("router-reload")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let app = try site.application(
            PackServerConfiguration(directory: site.root, port: 0, authorizer: ProductListAuthorizer(), mode: .authOnly))
        try await app.test(.router) { client in
            let headers: HTTPFields = [.authorization: "Bearer receipt/com.example.a", xOriginalURI: "/other.txt"]
            try await client.execute(uri: "/auth", method: .get, headers: headers) { #expect($0.status == .forbidden) }
            let manifest = #"{"products": [{"productIdentifier": "com.example.a", "contents": [{"url": "a.zip"}, {"url": "other.txt"}]}]}"#
            try Data(manifest.utf8).write(to: site.root.appendingPathComponent("manifest.json"))
            try await client.execute(uri: "/auth", method: .get, headers: headers) { #expect($0.status == .noContent) }
        }
    }
}
