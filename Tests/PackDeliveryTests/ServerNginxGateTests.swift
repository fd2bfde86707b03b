import Foundation
import PackDelivery
import PackServer
import PackTestSupport
import Testing

// The README's nginx configuration, as written there, run by the real nginx in front of
// `packs serve --auth-only`: nginx sends the bytes (sendfile, ETag, ranges, limit_rate), the gate
// decides who may have them.

/// The `nginx` block of the README's "Serving in production" section, made runnable here: its
/// `listen`, `root` and gate address replaced by a free port, the test's folder and the gate's port.
private func readmeServerBlock(root: URL, gatePort: Int) throws -> (Int) -> String {
    let readme = try String(contentsOf: CLI.packageRoot.appending(path: "README.md"), encoding: .utf8)
    guard let section = readme.range(of: "## Serving in production"),
        let start = readme.range(of: "```nginx\n", range: section.upperBound..<readme.endIndex),
        let end = readme.range(of: "```", range: start.upperBound..<readme.endIndex)
    else { throw FixtureError("README.md has no nginx block under '## Serving in production'.") }
    let block = String(readme[start.upperBound..<end.lowerBound])
    for placeholder in ["listen 80;", "/srv/packs", "127.0.0.1:9090"] where !block.contains(placeholder) {
        throw FixtureError("The README's nginx block no longer has '\(placeholder)', which this test replaces.")
    }
    return { port in
        block.replacingOccurrences(of: "listen 80;", with: "listen 127.0.0.1:\(port);")
            .replacingOccurrences(of: "/srv/packs", with: root.standardizedFileURL.path)
            .replacingOccurrences(of: "127.0.0.1:9090", with: "127.0.0.1:\(gatePort)")
    }
}

/// A site with two products' packs (1 MiB each) and a manifest.
private func twoProductSite(_ label: String) throws -> (root: URL, a: Data, b: Data) {
    let root = try Fixtures.temporaryDirectory(label)
    try Fixtures.randomFile(at: root.appendingPathComponent("a.zip"), size: 1 << 20)
    try Fixtures.randomFile(at: root.appendingPathComponent("packs/b.zip"), size: 1 << 20)
    let manifest = """
        {"products": [
          {"productIdentifier": "com.example.a", "contents": [{"url": "a.zip"}]},
          {"productIdentifier": "com.example.b", "contents": [{"url": "packs/b.zip"}]}
        ]}
        """
    try Data(manifest.utf8).write(to: root.appendingPathComponent("manifest.json"))
    return (
        root, try Data(contentsOf: root.appendingPathComponent("a.zip")), try Data(contentsOf: root.appendingPathComponent("packs/b.zip"))
    )
}

@Suite("nginx auth_request in front of packs serve --auth-only (the README's configuration)", .serialized, .timeLimit(.minutes(1)))
struct ServerNginxGateTests {
    @Test("the token gets the pack whole, by range and resumed; no token or a wrong one gets 401 with WWW-Authenticate")
    func sharedToken() async throws {
        let site = try twoProductSite("gate-token")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let token = "tok-\(UUID().uuidString)"
        let gate = try PackServeProcess(binary: CLI.binary, [site.root.path, "--auth-only"], environment: ["PACKS_TOKEN": token])
        defer { gate.stop() }
        let nginx = try NginxServer(root: site.root, serverBlock: try readmeServerBlock(root: site.root, gatePort: gate.port))
        defer { nginx.stop() }
        let url = nginx.baseURL.appendingPathComponent("a.zip").absoluteString
        let auth = ["-H", "Authorization: Bearer \(token)"]

        let whole = try await curl(url, auth)
        #expect(whole.status == 200, "\(nginx.errorLogText())")
        #expect(whole.body == site.a)
        #expect(whole.header("ETag") != nil)
        #expect(whole.header("X-Receipt-Environment") == nil, "a token has no environment: nginx adds no empty header")

        let ranged = try await curl(url, auth + ["-r", "1000-1999"])
        #expect(ranged.status == 206)
        #expect(ranged.body == site.a[1000..<2000])

        let folder = try Fixtures.temporaryDirectory("gate-resume")
        defer { try? FileManager.default.removeItem(at: folder) }
        let partial = folder.appendingPathComponent("a.zip")
        try site.a.prefix(300_000).write(to: partial)
        let resumed = try await Fixtures.runAsync(
            "/usr/bin/curl", ["-sS", "-f", "-C", "-", "-o", partial.path] + auth + [url], timeout: 30)
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(try Data(contentsOf: partial) == site.a)

        let catalog = try await curl(nginx.baseURL.appendingPathComponent("manifest.json").absoluteString, auth)
        #expect(catalog.status == 200)

        for refused in [[], ["-H", "Authorization: Bearer wrong"], ["-H", "Authorization: Basic \(token)"]] {
            let result = try await curl(url, refused)
            #expect(result.status == 401, "\(refused)")
            #expect(result.header("WWW-Authenticate") == "Bearer realm=\"packs\"", "\(refused)")
            #expect(!result.body.contains(site.a.prefix(64)))
        }
        // The subrequest location is internal: clients cannot ask the gate directly through nginx.
        #expect(try await curl(nginx.baseURL.appendingPathComponent("_packs_auth").absoluteString, auth).status == 404)
        #expect(!gate.log.contains(token), "the gate logged the token")
    }

    @Test("a credential for product A gets A's pack (ranges, resume) and 403 for B's")
    func productCredential() async throws {
        let site = try twoProductSite("gate-receipt")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let gate = try await PackServer.start(
            PackServerConfiguration(directory: site.root, port: 0, authorizer: ProductListAuthorizer(), mode: .authOnly),
            logger: LogLines().logger()
        )
        let nginx = try NginxServer(root: site.root, serverBlock: try readmeServerBlock(root: site.root, gatePort: gate.port))
        defer { nginx.stop() }
        let receiptA = ["-H", "Authorization: Bearer receipt/com.example.a"]
        let a = nginx.baseURL.appendingPathComponent("a.zip").absoluteString
        let b = nginx.baseURL.appendingPathComponent("packs/b.zip").absoluteString

        let whole = try await curl(a, receiptA)
        let ranged = try await curl(a, receiptA + ["-r", "500000-"])
        let folder = try Fixtures.temporaryDirectory("gate-receipt-resume")
        defer { try? FileManager.default.removeItem(at: folder) }
        let partial = folder.appendingPathComponent("a.zip")
        try site.a.prefix(123_456).write(to: partial)
        let resumed = try await Fixtures.runAsync(
            "/usr/bin/curl", ["-sS", "-f", "-C", "-", "-o", partial.path] + receiptA + [a], timeout: 30)
        let forbidden = try await curl(b, receiptA)
        let sneaky = try await curl(nginx.baseURL.absoluteString + "a.zip/../packs/b.zip", receiptA + ["--path-as-is"])
        let both = try await curl(b, ["-H", "Authorization: Bearer receipt/com.example.a+com.example.b"])
        await gate.stop()

        #expect(whole.status == 200, "\(nginx.errorLogText())")
        #expect(whole.body == site.a)
        #expect(ranged.status == 206)
        #expect(ranged.body == site.a.dropFirst(500_000))
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(try Data(contentsOf: partial) == site.a)
        #expect(forbidden.status == 403)
        #expect(!forbidden.body.contains(site.b.prefix(64)))
        #expect(sneaky.status == 403, "a path that nginx normalizes to B's pack must be judged as B's")
        #expect(both.status == 200)
        #expect(both.body == site.b)
    }

    @Test("a receipt with an unknown critical header or a claim given twice gets 401 from the gate, so nginx serves nothing")
    func strictReceipts() async throws {
        let site = try twoProductSite("gate-strict-receipt")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let keys = try Fixtures.temporaryDirectory("gate-strict-receipt-keys")
        defer { try? FileManager.default.removeItem(at: keys) }
        let key = try PublisherSigningKey.generate()
        let pub = keys.appendingPathComponent("store.pub")
        try Data(key.publicKey.pem.utf8).write(to: pub)
        let gate = try PackServeProcess(binary: CLI.binary, [site.root.path, "--auth-only", "--receipt-key", pub.path])
        defer { gate.stop() }
        let nginx = try NginxServer(root: site.root, serverBlock: try readmeServerBlock(root: site.root, gatePort: gate.port))
        defer { nginx.stop() }
        let b = nginx.baseURL.appendingPathComponent("packs/b.zip").absoluteString

        let now = Int64(Date().timeIntervalSince1970)
        func claims(_ extra: String = "") -> String {
            #"{"exp":\#(now + 3600),"iat":\#(now),"jti":"r-1","nbf":\#(now),"products":["com.example.b"],"sub":"user-42"\#(extra)}"#
        }
        func token(_ header: String, _ claims: String) throws -> String {
            func encoded(_ data: Data) -> String {
                data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                    .replacingOccurrences(of: "=", with: "")
            }
            let input = encoded(Data(header.utf8)) + "." + encoded(Data(claims.utf8))
            return input + "." + encoded(try key.sign(Data(input.utf8)))
        }
        let header = #"{"alg":"EdDSA","typ":"JWT"}"#
        let good = try token(header, claims())
        let refused = [
            ("crit", try token(#"{"alg":"EdDSA","typ":"JWT","crit":["x-bound-host"],"x-bound-host":"elsewhere"}"#, claims())),
            ("products twice", try token(header, claims(#","products":["com.example.a"]"#))),
            ("exp twice", try token(header, claims(#","exp":\#(now - 7200)"#))),
        ]
        // The gate itself, asked as nginx asks it.
        func gateStatus(_ token: String) async throws -> Int {
            try await curl(gate.baseURL.absoluteString, ["-H", "X-Original-URI: /packs/b.zip", "-H", "Authorization: Bearer \(token)"])
                .status
        }

        let served = try await curl(b, ["-H", "Authorization: Bearer \(good)"])
        #expect(served.status == 200, "\(nginx.errorLogText())")
        #expect(served.body == site.b)
        #expect(try await gateStatus(good) == 204)
        for (name, token) in refused {
            let result = try await curl(b, ["-H", "Authorization: Bearer \(token)"])
            #expect(result.status == 401, "\(name) through nginx")
            #expect(result.header("WWW-Authenticate") == "Bearer realm=\"packs\"", "\(name)")
            #expect(!result.body.contains(site.b.prefix(64)), "\(name)")
            #expect(try await gateStatus(token) == 401, "\(name) at the gate")
        }
        #expect(!gate.log.contains(good) && !refused.contains { gate.log.contains($0.1) }, "the gate logged a token")
    }

    @Test("a sandbox receipt gets its product's pack through nginx, which passes on X-Receipt-Environment; a key signs for one environment")
    func sandboxReceipts() async throws {
        let site = try twoProductSite("gate-sandbox-receipt")
        defer { try? FileManager.default.removeItem(at: site.root) }
        let keys = try Fixtures.temporaryDirectory("gate-sandbox-receipt-keys")
        defer { try? FileManager.default.removeItem(at: keys) }
        let store = try PublisherSigningKey.generate()
        let test = try PublisherSigningKey.generate()
        for (name, key) in [("store.pub", store), ("test.pub", test)] {
            try Data(key.publicKey.pem.utf8).write(to: keys.appendingPathComponent(name))
        }
        let gate = try PackServeProcess(
            binary: CLI.binary,
            [
                site.root.path, "--auth-only", "--receipt-key", keys.appendingPathComponent("store.pub").path,
                "--sandbox-receipt-key", keys.appendingPathComponent("test.pub").path,
            ])
        defer { gate.stop() }
        let nginx = try NginxServer(root: site.root, serverBlock: try readmeServerBlock(root: site.root, gatePort: gate.port))
        defer { nginx.stop() }
        func receipt(_ key: PublisherSigningKey, _ environment: Receipt.Environment) throws -> [String] {
            let token = try Receipt.issue(
                products: ["com.example.a"], subject: "reviewer-1", lifetime: 3600, key: key, environment: environment)
            return ["-H", "Authorization: Bearer \(token)"]
        }
        let a = nginx.baseURL.appendingPathComponent("a.zip").absoluteString
        let b = nginx.baseURL.appendingPathComponent("packs/b.zip").absoluteString

        let sandbox = try await curl(a, try receipt(test, .sandbox))
        #expect(sandbox.status == 200, "\(nginx.errorLogText())")
        #expect(sandbox.body == site.a)
        #expect(sandbox.header("X-Receipt-Environment") == "sandbox")
        let ranged = try await curl(a, try receipt(test, .sandbox) + ["-r", "1000-1999"])
        #expect(ranged.status == 206 && ranged.body == site.a[1000..<2000])
        let production = try await curl(a, try receipt(store, .production))
        #expect(production.status == 200 && production.header("X-Receipt-Environment") == "production")
        let otherProduct = try await curl(b, try receipt(test, .sandbox))
        #expect(otherProduct.status == 403 && !otherProduct.body.contains(site.b.prefix(64)))
        for (name, arguments) in [
            ("Sandbox by the store key", try receipt(store, .sandbox)), ("production by the test key", try receipt(test, .production)),
        ] {
            let refused = try await curl(a, arguments)
            #expect(refused.status == 401, "\(name)")
            #expect(refused.header("WWW-Authenticate") == "Bearer realm=\"packs\"", "\(name)")
            #expect(!refused.body.contains(site.a.prefix(64)), "\(name)")
        }
        #expect(gate.log.contains("environment=sandbox"), "\(gate.log)")
    }
}
