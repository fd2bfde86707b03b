import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs serve --keys DIR` (issue 46, preloads): `GET /keys/KEYID` answers a receipt of the product whose preload the
/// manifest marks with that key — 403 before the manifest's release date (the server's clock set through
/// `PACKS_TEST_CLOCK_FILE`), the key's 32 bytes after — and 403 to a receipt of another product, 401 to no receipt.
/// The key never shows in the log. The real binary, real HTTP over loopback with curl.
@Suite(.serialized, .timeLimit(.minutes(2))) struct KeyServerTests {
    static let releases = "2026-12-01T00:00:00Z"

    /// A site with a preload pack of `com.example.forest` and a plain one of `com.example.ocean`, a key folder, a store
    /// key and a clock file.
    struct Setup {
        let root: URL
        let site: URL
        let keys: URL
        let key: PreloadKey
        let clock: URL

        init(_ label: String) async throws {
            self.root = try Fixtures.temporaryDirectory(label)
            self.site = self.root.appending(path: "site")
            self.keys = self.root.appending(path: "keys")
            self.clock = self.root.appending(path: "clock")
            for folder in [self.site, self.keys, self.root.appending(path: "forest/Contents"), self.root.appending(path: "ocean/Contents")]
            {
                try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            }
            for name in ["forest", "ocean"] {
                try Fixtures.randomFile(at: self.root.appending(path: "\(name)/Contents/data.bin"), size: 200_000)
            }
            let keygen = try await Fixtures.runAsync(
                CLI.binary, ["keygen", "--preload", self.keys.appending(path: "launch").path], timeout: 30)
            #expect(keygen.status == 0, "\(keygen.stderr)")
            let store = try await Fixtures.runAsync(CLI.binary, ["keygen", self.root.appending(path: "store").path], timeout: 30)
            #expect(store.status == 0, "\(store.stderr)")
            self.key = try PreloadKey(contentsOf: self.keys.appending(path: "launch.preloadkey"))
            try PreloadPack.write(
                folder: self.root.appending(path: "forest"), to: self.site.appending(path: "forest.tar.zst"), format: .tarZstd,
                contentInfo: ("com.example.forest", "1.0"), key: self.key, releases: KeyServerTests.releases)
            try PackWriter.write(
                folder: self.root.appending(path: "ocean"), to: self.site.appending(path: "ocean.tar"), format: .tar,
                contentInfo: ("com.example.ocean", "1.0"))
            try ManifestBuilder.write(folder: self.site)
            try self.setClock("2026-11-30T00:00:00Z")
        }

        func setClock(_ date: String) throws { try Data(date.utf8).write(to: self.clock) }

        func receipt(_ product: String) async throws -> String {
            let made = try await Fixtures.runAsync(
                CLI.binary,
                [
                    "receipt", "--key", self.root.appending(path: "store.key").path, "--product", product, "--subject", "user-1",
                    "--expires", "1h",
                ],
                timeout: 30)
            #expect(made.status == 0, "\(made.stderr)")
            return made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        func serve() throws -> PackServeProcess {
            try PackServeProcess(
                binary: CLI.binary,
                [self.site.path, "--receipt-key", self.root.appending(path: "store.pub").path, "--keys", self.keys.path],
                environment: ["PACKS_TEST_CLOCK_FILE": self.clock.path])
        }

        func remove() { try? FileManager.default.removeItem(at: self.root) }
    }

    static func bearer(_ token: String) -> [String] { ["-H", "Authorization: Bearer \(token)"] }

    @Test func theKeyIsServedToAReceiptOfItsProductFromTheReleaseDateOn() async throws {
        let setup = try await Setup("keys-release")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let url = server.baseURL.absoluteString + "keys/" + setup.key.keyID
        let forest = try await setup.receipt("com.example.forest")
        let ocean = try await setup.receipt("com.example.ocean")

        #expect(try await curl(url).status == 401)
        let early = try await curl(url, Self.bearer(forest))
        #expect(early.status == 403 && early.headers["retry-after"] == "86400", "\(early.status) \(early.headers)")
        #expect(early.body.count != PreloadKey.length || early.body != setup.key.data)
        #expect(try await curl(url, Self.bearer(ocean)).status == 403)
        // The encrypted pack itself is served before the release, as any pack.
        #expect(try await curl(server.baseURL.absoluteString + "forest.tar.zst", Self.bearer(forest)).status == 200)

        try setup.setClock("2026-12-01T00:00:01Z")
        let released = try await curl(url, Self.bearer(forest))
        #expect(released.status == 200 && released.body == setup.key.data)
        #expect(released.headers["cache-control"] == "private, no-store")
        #expect(try await curl(url, Self.bearer(ocean)).status == 403, "a receipt of another product never gets the key")
        #expect(try await curl(url, Self.bearer("x.y.z")).status == 401)
        let unknown = String(repeating: "ab", count: 16)
        #expect(try await curl(server.baseURL.absoluteString + "keys/" + unknown, Self.bearer(forest)).status == 404)
        #expect(try await curl(server.baseURL.absoluteString + "keys/..%2fmanifest.json", Self.bearer(forest)).status == 404)

        server.stop()
        let log = server.log
        #expect(log.contains("/keys/\(setup.key.keyID)"), "the request log names the key's id")
        let keyHex = setup.key.data.map { String(format: "%02x", $0) }.joined()
        #expect(!log.contains(keyHex) && !log.contains(setup.key.data.base64EncodedString()), "the key never shows in the log")
        #expect(!log.contains(forest), "nor the receipt")
    }

    @Test func keysNeedReceipts() async throws {
        let setup = try await Setup("keys-usage")
        defer { setup.remove() }
        let result = try await Fixtures.runAsync(
            CLI.binary, ["serve", setup.site.path, "--keys", setup.keys.path, "--port", "0"], timeout: 30)
        #expect(result.status == 64, "\(result.status) \(result.stderr)")
        #expect(result.stderr.contains("--receipt-key"))
    }
}
