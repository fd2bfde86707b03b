import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Sandbox (test) receipts beside production ones (issue 46): `packs serve --receipt-key store.pub
/// --sandbox-receipt-key test.pub` tries the production key first and the sandbox key second, as TN2387 asks of
/// receipt validation; a sandbox receipt opens the same products and is marked in the request log, the metrics and
/// `--auth-only`'s answer; a key signs for one environment only; `--no-sandbox` refuses sandbox receipts. The real
/// binary (`packs keygen`, `packs receipt`, `packs serve`), real HTTP over loopback with curl.
@Suite(.serialized, .timeLimit(.minutes(2))) struct SandboxReceiptTests {
    /// The samples' site, a production store key and a sandbox one (`packs keygen`), and receipts made with
    /// `packs receipt` (with `--sandbox` for the test key's).
    struct Keys {
        let site: TestSite
        let folder: URL
        let store: PublisherSigningKey
        let test: PublisherSigningKey

        init(_ label: String) async throws {
            self.site = try TestSite.samples(label + "-site")
            self.folder = try Fixtures.temporaryDirectory(label + "-keys")
            for name in ["store", "test"] {
                let keygen = try await Fixtures.runAsync(CLI.binary, ["keygen", self.folder.appending(path: name).path], timeout: 30)
                #expect(keygen.status == 0, "\(keygen.stderr)")
            }
            self.store = try PublisherSigningKey(pem: String(contentsOf: self.folder.appending(path: "store.key"), encoding: .utf8))
            self.test = try PublisherSigningKey(pem: String(contentsOf: self.folder.appending(path: "test.key"), encoding: .utf8))
        }

        func path(_ name: String) -> String { self.folder.appending(path: name).path }

        /// `packs receipt --key KEY.key --product PRODUCT --subject SUBJECT [--sandbox]`'s token.
        func receipt(_ product: String, key: String, subject: String, sandbox: Bool = false) async throws -> String {
            let made = try await Fixtures.runAsync(
                CLI.binary,
                ["receipt", "--key", self.path(key + ".key"), "--product", product, "--subject", subject, "--expires", "1h"]
                    + (sandbox ? ["--sandbox"] : []), timeout: 30)
            #expect(made.status == 0, "\(made.stderr)")
            return made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        func removeAll() {
            try? FileManager.default.removeItem(at: self.site.folder)
            try? FileManager.default.removeItem(at: self.folder)
        }
    }

    /// The claims of a token, as JSON.
    static func claims(_ token: String) throws -> [String: Any] {
        var part = String(token.split(separator: ".")[1]).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        part += String(repeating: "=", count: (4 - part.count % 4) % 4)
        let data = try #require(Data(base64Encoded: part))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    static func problem(_ result: Result<Receipt, ReceiptRefusal>) -> Receipt.Problem? {
        if case .failure(let refusal) = result { return refusal.problem }
        return nil
    }

    @Test func verifyTriesProductionKeysFirstThenSandboxOnesAndAKeySignsForOneEnvironment() async throws {
        let store = try PublisherSigningKey.generate()
        let test = try PublisherSigningKey.generate()
        let production = try Receipt.issue(products: ["com.example.forest"], subject: "user-42", lifetime: 3600, key: store)
        let sandbox = try Receipt.issue(
            products: ["com.example.forest"], subject: "reviewer-1", lifetime: 3600, key: test, environment: .sandbox)
        // A production receipt has no `environment` claim, as before the claim existed; a sandbox one says "Sandbox".
        #expect(try Self.claims(production)["environment"] == nil)
        #expect(try Self.claims(sandbox)["environment"] as? String == "Sandbox")

        let both = (keys: [store.publicKey], sandboxKeys: [test.publicKey])
        let accepted = try Receipt.verify(production, keys: both.keys, sandboxKeys: both.sandboxKeys).get()
        #expect(accepted.environment == .production && accepted.products == ["com.example.forest"] && accepted.subject == "user-42")
        let tested = try Receipt.verify(sandbox, keys: both.keys, sandboxKeys: both.sandboxKeys).get()
        #expect(tested.environment == .sandbox && tested.products == ["com.example.forest"] && tested.subject == "reviewer-1")
        // The earlier API, and the new one with no sandbox key: production only; a sandbox receipt gets TN2387's 21007.
        #expect(try Receipt.verify(production, keys: [store.publicKey]).get().environment == .production)
        #expect(Self.problem(Receipt.verify(sandbox, keys: [store.publicKey])) == .sandbox)
        #expect(Self.problem(Receipt.verify(sandbox, keys: [store.publicKey], sandboxKeys: [])) == .sandbox)
        // A key signs for one environment only, both ways, whatever keys are trusted beside it.
        let claimsSandboxSignedByStore = try Receipt.issue(
            products: ["com.example.forest"], subject: "user-42", lifetime: 3600, key: store, environment: .sandbox)
        let productionSignedByTest = try Receipt.issue(products: ["com.example.forest"], subject: "user-42", lifetime: 3600, key: test)
        let explicitProductionSignedByTest = try ReceiptTests.token(
            header: #"{"alg":"EdDSA","typ":"JWT"}"#, claims: ReceiptTests.claims(extra: #","environment":"Production""#), key: test)
        let unknownEnvironment = try ReceiptTests.token(
            header: #"{"alg":"EdDSA","typ":"JWT"}"#, claims: ReceiptTests.claims(extra: #","environment":"Xcode""#), key: store)
        let lowercaseSandbox = try ReceiptTests.token(
            header: #"{"alg":"EdDSA","typ":"JWT"}"#, claims: ReceiptTests.claims(extra: #","environment":"sandbox""#), key: test)
        for (name, token) in [
            ("Sandbox signed by the production key", claimsSandboxSignedByStore),
            ("no claim signed by the sandbox key", productionSignedByTest),
            ("Production signed by the sandbox key", explicitProductionSignedByTest),
            ("an unknown environment", unknownEnvironment), ("sandbox in lower case", lowercaseSandbox),
        ] {
            #expect(Self.problem(Receipt.verify(token, keys: both.keys, sandboxKeys: both.sandboxKeys)) == .environment, "\(name)")
        }
        #expect(Self.problem(Receipt.verify(claimsSandboxSignedByStore, keys: [store.publicKey])) == .environment)
        // Explicit "Production" signed by the production key is a production receipt.
        let explicit = try ReceiptTests.token(
            header: #"{"alg":"EdDSA","typ":"JWT"}"#, claims: ReceiptTests.claims(extra: #","environment":"Production""#), key: store)
        #expect(try Receipt.verify(explicit, keys: both.keys, sandboxKeys: both.sandboxKeys).get().environment == .production)
        // Signed by neither: a bad signature, sandbox claim or not, once sandbox keys are trusted.
        let forged = try Receipt.issue(
            products: ["com.example.forest"], subject: "x", lifetime: 3600, key: try PublisherSigningKey.generate(), environment: .sandbox)
        #expect(Self.problem(Receipt.verify(forged, keys: both.keys, sandboxKeys: both.sandboxKeys)) == .signature)
        // Only sandbox keys: production receipts are refused, sandbox ones accepted.
        #expect(Self.problem(Receipt.verify(production, keys: [], sandboxKeys: [test.publicKey])) == .signature)
        #expect(try Receipt.verify(sandbox, keys: [], sandboxKeys: [test.publicKey]).get().environment == .sandbox)
        // Expiry is checked for sandbox receipts too, and the refusal carries the (sandbox) receipt.
        let expired = try Receipt.issue(
            products: ["com.example.forest"], subject: "reviewer-1", lifetime: 60, key: test, environment: .sandbox,
            now: Date().addingTimeInterval(-7200))
        guard case .failure(let refusal) = Receipt.verify(expired, keys: both.keys, sandboxKeys: both.sandboxKeys) else {
            Issue.record("an expired sandbox receipt was accepted")
            return
        }
        #expect(refusal.problem == .expired && refusal.receipt?.environment == .sandbox)
    }

    @Test func aSandboxReceiptOpensTheSameProductsAndIsMarkedInTheLogAndTheMetrics() async throws {
        let keys = try await Keys("sandbox-serve")
        defer { keys.removeAll() }
        let server = try PackServeProcess(
            binary: CLI.binary,
            [
                keys.site.folder.path, "--receipt-key", keys.path("store.pub"), "--sandbox-receipt-key", keys.path("test.pub"),
                "--metrics-address", "127.0.0.1:0",
            ])
        defer { server.stop() }
        let metricsPort = try #require(server.metricsPort)
        let production = try await keys.receipt("com.example.forest", key: "store", subject: "user-42")
        let sandbox = try await keys.receipt("com.example.forest", key: "test", subject: "reviewer-1", sandbox: true)
        let claimsSandboxSignedByStore = try await keys.receipt("com.example.forest", key: "store", subject: "user-42", sandbox: true)
        let productionSignedByTest = try await keys.receipt("com.example.forest", key: "test", subject: "reviewer-1")
        let base = server.baseURL.absoluteString
        func bearer(_ token: String) -> [String] { ["-H", "Authorization: Bearer \(token)"] }

        let pack = try Data(contentsOf: keys.site.folder.appending(path: "forest.tar.gz"))
        let byProduction = try await curl(base + "forest.tar.gz", bearer(production))
        let bySandbox = try await curl(base + "forest.tar.gz", bearer(sandbox))
        #expect(byProduction.status == 200 && byProduction.body == pack)
        #expect(bySandbox.status == 200 && bySandbox.body == pack)
        let catalog = try await curl(base + "manifest.json", bearer(sandbox))
        #expect(catalog.status == 200)
        let listed = try JSONDecoder().decode(Manifest.self, from: catalog.body).products.map(\.productIdentifier)
        #expect(listed == ["com.example.forest"], "the catalog shows a sandbox receipt its products only")
        // Another product's pack: 403 under either key.
        #expect(try await curl(base + "ocean.tar.xz", bearer(production)).status == 403)
        #expect(try await curl(base + "ocean.tar.xz", bearer(sandbox)).status == 403)
        // A key signs for one environment only: 401, both ways.
        for (name, token) in [
            ("Sandbox by the store key", claimsSandboxSignedByStore), ("production by the test key", productionSignedByTest),
        ] {
            let refused = try await curl(base + "forest.tar.gz", bearer(token))
            #expect(refused.status == 401 && refused.header("WWW-Authenticate") == "Bearer realm=\"packs\"", "\(name)")
            #expect(!refused.body.contains(pack.prefix(64)), "\(name)")
        }

        let receipts = "packs_auth_receipts_total"
        let refusals = "packs_auth_refusals_total"
        let (samples, text) = try await MetricsTests.scrape(metricsPort) {
            ($0[#"\#(receipts){environment="sandbox"}"#] ?? 0) >= 2 && ($0[#"\#(receipts){environment="production"}"#] ?? 0) >= 1
        }
        #expect(
            samples.filter { $0.key.hasPrefix(receipts) } == [
                #"\#(receipts){environment="production"}"#: 1, #"\#(receipts){environment="sandbox"}"#: 2,
            ], "\(text)")
        #expect(
            samples.filter { $0.key.hasPrefix(refusals) } == [
                #"\#(refusals){reason="other_product"}"#: 2, #"\#(refusals){reason="environment"}"#: 2,
            ], "\(text)")

        let sandboxID = try #require(try Self.claims(sandbox)["jti"] as? String)
        let productionID = try #require(try Self.claims(production)["jti"] as? String)
        var log = ""
        for _ in 0..<100 where !log.contains("GET /manifest.json") {
            try await Task.sleep(for: .milliseconds(100))
            log = server.log
        }
        let lines = log.split(whereSeparator: \.isNewline)
        #expect(
            lines.contains {
                $0.contains("GET /forest.tar.gz") && $0.contains(" 200 ")
                    && $0.contains("receipt=\(sandboxID) subject=reviewer-1 environment=sandbox")
            }, "\(log)")
        #expect(
            lines.contains { $0.contains("GET /manifest.json") && $0.contains(" 200 ") && $0.contains("environment=sandbox") }, "\(log)")
        #expect(
            lines.contains {
                $0.contains(" 200 ") && $0.contains("receipt=\(productionID) subject=user-42") && !$0.contains("environment=")
            },
            "a production receipt's line is as before: \(log)")
        for token in [production, sandbox, claimsSandboxSignedByStore, productionSignedByTest] {
            #expect(!log.contains(token) && !log.contains(String(token.split(separator: ".")[2])), "the log shows a token")
        }
    }

    @Test func theAuthOnlyGateSaysTheReceiptsEnvironment() async throws {
        let keys = try await Keys("sandbox-gate")
        defer { keys.removeAll() }
        let gate = try PackServeProcess(
            binary: CLI.binary,
            [keys.site.folder.path, "--auth-only", "--receipt-key", keys.path("store.pub"), "--sandbox-receipt-key", keys.path("test.pub")])
        defer { gate.stop() }
        let production = try await keys.receipt("com.example.forest", key: "store", subject: "user-42")
        let sandbox = try await keys.receipt("com.example.forest", key: "test", subject: "reviewer-1", sandbox: true)
        let claimsSandboxSignedByStore = try await keys.receipt("com.example.forest", key: "store", subject: "user-42", sandbox: true)
        func ask(_ path: String, _ token: String?) async throws -> CurlResult {
            try await curl(
                gate.baseURL.absoluteString,
                ["-H", "X-Original-URI: \(path)"] + (token.map { ["-H", "Authorization: Bearer \($0)"] } ?? []))
        }
        let allowedProduction = try await ask("/forest.tar.gz", production)
        #expect(allowedProduction.status == 204 && allowedProduction.header("X-Receipt-Environment") == "production")
        let allowedSandbox = try await ask("/forest.tar.gz", sandbox)
        #expect(allowedSandbox.status == 204 && allowedSandbox.header("X-Receipt-Environment") == "sandbox")
        let otherProduct = try await ask("/ocean.tar.xz", sandbox)
        #expect(otherProduct.status == 403 && otherProduct.header("X-Receipt-Environment") == "sandbox")
        let mismatch = try await ask("/forest.tar.gz", claimsSandboxSignedByStore)
        #expect(mismatch.status == 401 && mismatch.header("X-Receipt-Environment") == nil)
        let none = try await ask("/forest.tar.gz", nil)
        #expect(none.status == 401 && none.header("X-Receipt-Environment") == nil)
        let log = gate.log
        #expect(log.contains("environment=sandbox"), "\(log)")
        #expect(![production, sandbox, claimsSandboxSignedByStore].contains { log.contains($0) }, "the gate logged a token")
    }

    @Test func noSandboxRefusesSandboxReceiptsAndCannotBeGivenASandboxKey() async throws {
        let keys = try await Keys("sandbox-refused")
        defer { keys.removeAll() }
        // At startup: --no-sandbox with a sandbox key, or one key for both environments, is a usage error.
        let both = try await Fixtures.runAsync(
            CLI.binary,
            [
                "serve", keys.site.folder.path, "--port", "0", "--receipt-key", keys.path("store.pub"), "--sandbox-receipt-key",
                keys.path("test.pub"), "--no-sandbox",
            ], timeout: 30)
        #expect(both.status == 64 && both.stderr.contains("--no-sandbox") && both.stderr.contains("--sandbox-receipt-key"), "\(both)")
        #expect(!both.stdout.contains("Serving"))
        let sameKey = try await Fixtures.runAsync(
            CLI.binary,
            [
                "serve", keys.site.folder.path, "--port", "0", "--receipt-key", keys.path("store.pub"), "--sandbox-receipt-key",
                keys.path("store.pub"),
            ], timeout: 30)
        #expect(sameKey.status == 64 && sameKey.stderr.contains("one environment only"), "\(sameKey)")
        #expect(!sameKey.stdout.contains("Serving"))

        let server = try PackServeProcess(
            binary: CLI.binary,
            [keys.site.folder.path, "--receipt-key", keys.path("store.pub"), "--no-sandbox", "--metrics-address", "127.0.0.1:0"])
        defer { server.stop() }
        let metricsPort = try #require(server.metricsPort)
        let production = try await keys.receipt("com.example.forest", key: "store", subject: "user-42")
        let sandbox = try await keys.receipt("com.example.forest", key: "test", subject: "reviewer-1", sandbox: true)
        let base = server.baseURL.absoluteString
        #expect(try await curl(base + "forest.tar.gz", ["-H", "Authorization: Bearer \(production)"]).status == 200)
        // The documented status: 401, as any receipt that does not verify, with the Bearer challenge.
        for path in ["forest.tar.gz", "manifest.json"] {
            let refused = try await curl(base + path, ["-H", "Authorization: Bearer \(sandbox)"])
            #expect(refused.status == 401 && refused.header("WWW-Authenticate") == "Bearer realm=\"packs\"", "\(path)")
        }
        let (samples, text) = try await MetricsTests.scrape(metricsPort) { ($0[#"packs_auth_refusals_total{reason="sandbox"}"#] ?? 0) >= 2 }
        #expect(samples[#"packs_auth_refusals_total{reason="sandbox"}"#] == 2, "\(text)")
        #expect(samples[#"packs_auth_receipts_total{environment="sandbox"}"#] == nil, "\(text)")
        #expect(!server.log.contains(sandbox), "the log shows a token")

        // The help says so.
        let serveHelp = try await Fixtures.runAsync(CLI.binary, ["serve", "--help"], timeout: 30)
        #expect(serveHelp.stdout.contains("--sandbox-receipt-key") && serveHelp.stdout.contains("--no-sandbox"), "\(serveHelp.stdout)")
        let receiptHelp = try await Fixtures.runAsync(CLI.binary, ["receipt", "--help"], timeout: 30)
        #expect(receiptHelp.stdout.contains("--sandbox"), "\(receiptHelp.stdout)")
    }
}
