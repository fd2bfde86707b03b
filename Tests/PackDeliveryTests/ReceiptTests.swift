import Foundation
import Logging
import PackDelivery
import PackServer
import PackTestSupport
import Testing

/// `packs serve --receipt-key` serves a pack only to a signed receipt that names its
/// product (401 for a missing, forged, `alg: none`, HS256, expired or not-yet-valid receipt; 403 for another
/// product's pack), and `packs fetch --receipt` presents one. The real server, curl and the real binary.
@Suite(.serialized, .timeLimit(.minutes(2))) struct ReceiptTests {
    struct Store {
        let site: TestSite
        let keys: URL
        let key: PublisherSigningKey
        let server: RunningPackServer

        let log = LogLines()

        init(_ label: String) async throws {
            self.site = try TestSite.samples(label + "-site")
            self.keys = try Fixtures.temporaryDirectory(label + "-keys")
            let keygen = try await Fixtures.runAsync(CLI.binary, ["keygen", self.keys.appending(path: "store").path])
            #expect(keygen.status == 0, "\(keygen.stderr)")
            self.key = try PublisherSigningKey(pem: String(contentsOf: self.keys.appending(path: "store.key"), encoding: .utf8))
            self.server = try await PackServer.start(
                PackServerConfiguration(directory: self.site.folder, port: 0, authorizer: ReceiptAuthorizer(keys: [self.key.publicKey])),
                logger: self.log.logger())
        }

        /// The HTTP status of a GET of `path` with this bearer token (none when nil), and the WWW-Authenticate header.
        func status(_ path: String, bearer: String?) async throws -> (Int, String) {
            let headers = bearer.map { ["-H", "Authorization: Bearer \($0)"] } ?? []
            let result = try await Fixtures.runAsync(
                "curl",
                ["-s", "-o", "/dev/null", "-D", "-", "-w", "%{http_code}"] + headers
                    + [self.server.baseURL.appending(path: path).absoluteString], timeout: 30)
            let lines = result.stdout.split(whereSeparator: \.isNewline)
            let code = Int(lines.last ?? "") ?? -1
            let challenge = lines.first { $0.lowercased().hasPrefix("www-authenticate:") }.map(String.init) ?? ""
            return (code, challenge)
        }

        /// The product identifiers of `manifest.json` as served to this bearer token.
        func catalog(bearer: String) async throws -> [String] {
            let result = try await Fixtures.runAsync(
                "curl",
                [
                    "-sf", "-H", "Authorization: Bearer \(bearer)",
                    self.server.baseURL.appending(path: "manifest.json").absoluteString,
                ], timeout: 30)
            let manifest = try JSONDecoder().decode(Manifest.self, from: Data(result.stdout.utf8))
            return manifest.products.map(\.productIdentifier).sorted()
        }

        func receipt(_ products: [String], lifetime: TimeInterval = 3600, now: Date = Date(), key: PublisherSigningKey? = nil) throws
            -> String
        {
            try Receipt.issue(products: products, subject: "user-42", lifetime: lifetime, key: key ?? self.key, now: now)
        }
    }

    static func base64URL(_ text: String) -> String {
        Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// A compact JWS of exactly these header and claims texts, signed with `key`: what a store that signs
    /// whatever its code serializes could hand out.
    static func token(header: String, claims: String, key: PublisherSigningKey) throws -> String {
        let input = Self.base64URL(header) + "." + Self.base64URL(claims)
        let signature = try key.sign(Data(input.utf8)).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        return input + "." + signature
    }

    /// Claims for forest valid from a minute ago for an hour, as JSON text, with `extra` members appended.
    static func claims(_ products: String = #"["com.example.forest"]"#, extra: String = "") -> String {
        let now = Int64(Date().timeIntervalSince1970)
        return #"{"exp":\#(now + 3600),"iat":\#(now - 60),"jti":"r-1","nbf":\#(now - 60),"products":\#(products),"sub":"user-42"\#(extra)}"#
    }

    /// The problem `Receipt.verify` names for this token, or nil when it accepts it.
    static func problem(_ token: String, _ key: PublisherSigningKey) -> Receipt.Problem? {
        switch Receipt.verify(token, keys: [key.publicKey]) {
        case .success: nil
        case .failure(let refusal): refusal.problem
        }
    }

    @Test func aHeaderWithCriticalExtensionsIsRefused() async throws {
        let store = try await Store("receipt-crit")
        defer { Task { await store.server.stop() } }
        // The hand-made token is good without `crit`.
        let plain = try Self.token(header: #"{"alg":"EdDSA","typ":"JWT"}"#, claims: Self.claims(), key: store.key)
        #expect(try await store.status("forest.tar.gz", bearer: plain).0 == 200)
        // RFC 7515 §4.1.11: an extension listed in `crit` that the recipient does not understand makes the JWS
        // invalid. This verifier understands none, so any `crit` is refused, with a well-formed list or not.
        for header in [
            #"{"alg":"EdDSA","typ":"JWT","crit":["x-bound-host"],"x-bound-host":"elsewhere"}"#,
            #"{"crit":["exp"],"alg":"EdDSA","exp":0}"#, #"{"alg":"EdDSA","crit":[]}"#, #"{"alg":"EdDSA","crit":"b64","b64":false}"#,
            #"{"alg":"EdDSA","cr\u0069t":["x"]}"#,
        ] {
            let token = try Self.token(header: header, claims: Self.claims(), key: store.key)
            #expect(Self.problem(token, store.key) == .critical, "\(header)")
            let (code, challenge) = try await store.status("forest.tar.gz", bearer: token)
            #expect(code == 401 && challenge.contains("Bearer"), "\(header): \(code)")
        }
    }

    @Test func aMemberNameTwiceInTheHeaderOrTheClaimsIsRefused() async throws {
        let store = try await Store("receipt-duplicates")
        defer { Task { await store.server.stop() } }
        let header = #"{"alg":"EdDSA","typ":"JWT"}"#
        let past = Int64(Date().timeIntervalSince1970) - 7200
        let cases: [(String, header: String, claims: String)] = [
            // The second `products` names the product the store sold; the first one another.
            ("products twice", header, Self.claims(extra: #","products":["com.example.ocean"]"#)),
            ("a good exp, then an expired one", header, Self.claims(extra: #","exp":\#(past)"#)),
            ("the same name escaped", header, Self.claims(extra: #","\u0065xp":\#(past)"#)),
            ("a repeated member in a nested object", header, Self.claims(extra: #","cnf":{"jkt":"a","jkt":"b"}"#)),
            ("alg twice", #"{"alg":"EdDSA","alg":"none"}"#, Self.claims()),
            ("typ twice", #"{"alg":"EdDSA","typ":"JWT","typ":"JWT"}"#, Self.claims()),
        ]
        for (name, header, claims) in cases {
            let token = try Self.token(header: header, claims: claims, key: store.key)
            #expect(Self.problem(token, store.key) == .malformed, "\(name)")
            let (code, challenge) = try await store.status("forest.tar.gz", bearer: token)
            #expect(code == 401 && challenge.contains("Bearer"), "\(name): \(code)")
        }
        // Names that only look alike are different members.
        let distinct = try Self.token(header: header, claims: Self.claims(extra: #","Exp":1,"exp ":2"#), key: store.key)
        #expect(Self.problem(distinct, store.key) == nil)
        #expect(try await store.status("forest.tar.gz", bearer: distinct).0 == 200)
    }

    @Test func eachBadReceiptIs401AndAnotherProductsPackIs403() async throws {
        let store = try await Store("receipt-server")
        defer { Task { await store.server.stop() } }
        let forest = try store.receipt(["com.example.forest"])
        #expect(try await store.status("forest.tar.gz", bearer: forest).0 == 200)
        #expect(try await store.status("manifest.json", bearer: forest).0 == 200)
        // A receipt for forest cannot fetch ocean's pack by its URL.
        #expect(try await store.status("ocean.tar.xz", bearer: forest).0 == 403)
        // A zip pack's index goes with the pack: to its product's receipts only.
        let zipped = try #require(try store.site.manifest().products.first { $0.contents[0].index != nil })
        let index = try #require(zipped.contents[0].index?.url)
        #expect(try await store.status(index, bearer: try store.receipt([zipped.productIdentifier])).0 == 200)
        #expect(try await store.status(index, bearer: try store.receipt(["com.example.other"])).0 == 403)

        let claims = String(forest.split(separator: ".")[1])
        let forged = try store.receipt(["com.example.forest"], key: try PublisherSigningKey.generate())
        let none = Self.base64URL(#"{"alg":"none","typ":"JWT"}"#) + "." + claims + "."
        // HS256 with the public key as the HMAC secret: the classic confusion attack.
        let hsInput = Self.base64URL(#"{"alg":"HS256","typ":"JWT"}"#) + "." + claims
        let hmac = try await Fixtures.runAsync(
            "/bin/sh",
            [
                "-c",
                "printf %s '\(hsInput)' | openssl dgst -sha256 -binary -hmac \"$(cat '\(store.keys.appending(path: "store.pub").path)')\" | base64 -w0 | tr '+/' '-_' | tr -d '='",
            ])
        let hs256 = hsInput + "." + hmac.stdout
        let expired = try store.receipt(["com.example.forest"], lifetime: 60, now: Date().addingTimeInterval(-7200))
        let early = try store.receipt(["com.example.forest"], now: Date().addingTimeInterval(3600))
        for (name, token) in [
            ("none", nil), ("forged", forged), ("alg none", none), ("HS256", hs256), ("expired", expired),
            ("not yet valid", early), ("garbage", "abc.def.ghi"),
        ] as [(String, String?)] {
            let (code, challenge) = try await store.status("forest.tar.gz", bearer: token)
            #expect(code == 401, "\(name): \(code)")
            #expect(challenge.contains("Bearer"), "\(name): WWW-Authenticate: \(challenge)")
        }
    }

    @Test func theCatalogListsOnlyTheReceiptsProductsAndTheLogNamesTheReceiptNeverTheToken() async throws {
        let store = try await Store("receipt-catalog")
        defer { Task { await store.server.stop() } }
        let all = try store.site.manifest().products.map(\.productIdentifier).sorted()
        #expect(all.count > 2)
        let forest = try store.receipt(["com.example.forest"])
        #expect(try await store.catalog(bearer: forest) == ["com.example.forest"])
        let two = try store.receipt(["com.example.forest", "com.example.ocean"])
        #expect(try await store.catalog(bearer: two) == ["com.example.forest", "com.example.ocean"])
        // What the filtered catalog says about a pack is what the published one says.
        let published = try store.site.manifest().products.first { $0.productIdentifier == "com.example.forest" }
        let served = try await Fixtures.runAsync(
            "curl", ["-sf", "-H", "Authorization: Bearer \(forest)", store.server.baseURL.appending(path: "manifest.json").absoluteString])
        #expect(try JSONDecoder().decode(Manifest.self, from: Data(served.stdout.utf8)).products.first == published)

        #expect(try await store.status("forest.tar.gz", bearer: forest).0 == 200)
        let expired = try store.receipt(["com.example.forest"], lifetime: 60, now: Date().addingTimeInterval(-7200))
        #expect(try await store.status("forest.tar.gz", bearer: expired).0 == 401)
        let id = try Receipt.verify(forest, keys: [store.key.publicKey]).get().id
        let lines = await store.log.waitFor { lines in lines.contains { $0.contains("GET /forest.tar.gz") && $0.contains("(expired)") } }
        #expect(
            lines.contains { $0.contains("GET /forest.tar.gz") && $0.contains(" 200 ") && $0.contains("receipt=\(id) subject=user-42") },
            "\(lines)")
        #expect(lines.contains { $0.contains(" 401 ") && $0.contains("subject=user-42 (expired)") }, "\(lines)")
        for token in [forest, two, expired] {
            #expect(
                !lines.contains { $0.contains(token) || $0.contains(String(token.split(separator: ".")[2])) },
                "the token never appears in the log")
        }
    }

    @Test func aSignedCatalogIsServedWholeSoItsSignatureHolds() async throws {
        let store = try await Store("receipt-signed-catalog")
        defer { Task { await store.server.stop() } }
        let sign = try await Fixtures.runAsync(
            CLI.binary, ["manifest", store.site.folder.path, "--sign", store.keys.appending(path: "store.key").path])
        #expect(sign.status == 0, "\(sign.stderr)")
        let forest = try store.receipt(["com.example.forest"])
        #expect(try await store.catalog(bearer: forest) == (try store.site.manifest().products.map(\.productIdentifier).sorted()))
        let home = try Fixtures.temporaryDirectory("receipt-signed-catalog-home")
        let fetch = try await Fixtures.runAsync(
            CLI.binary,
            [
                "--home", home.path, "fetch", store.server.baseURL.appending(path: "manifest.json").absoluteString,
                "com.example.forest", "--receipt", forest, "--trust", store.keys.appending(path: "store.pub").path,
            ])
        #expect(fetch.status == 0, "a signed catalog behind receipts still verifies: \(fetch.stderr)")
    }

    @Test func fetchPresentsTheReceiptAndIsRefusedForAnotherProduct() async throws {
        let store = try await Store("receipt-fetch")
        defer { Task { await store.server.stop() } }
        let home = try Fixtures.temporaryDirectory("receipt-fetch-home")
        let file = store.keys.appending(path: "receipt.jws")
        let made = try await Fixtures.runAsync(
            CLI.binary,
            [
                "receipt", "--key", store.keys.appending(path: "store.key").path,
                "--product", "com.example.forest", "--subject", "user-42", "--expires", "1h",
            ])
        #expect(made.status == 0, "\(made.stderr)")
        try made.stdout.write(to: file, atomically: true, encoding: .utf8)
        let manifest = store.server.baseURL.appending(path: "manifest.json").absoluteString
        let without = try await Fixtures.runAsync(CLI.binary, ["--home", home.path, "fetch", manifest, "com.example.forest"])
        #expect(without.status == 77, "no receipt: \(without.stderr)")
        let fetch = try await Fixtures.runAsync(
            CLI.binary, ["--home", home.path, "fetch", manifest, "com.example.forest", "--receipt", file.path])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.forest/ContentInfo.plist").path))
        let other = try await Fixtures.runAsync(
            CLI.binary, ["--home", home.path, "fetch", manifest, "com.example.ocean", "--receipt", file.path])
        // The catalog served to this receipt does not list ocean at all (its pack by URL is 403, see above).
        #expect(
            other.status == 65 && other.stderr.contains("com.example.ocean") && other.stderr.contains("receipt names"),
            "another product: \(other.stderr)")
        #expect(!other.stderr.contains(made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), "the receipt never appears in errors")
    }
}
