import Foundation
import Logging
import PackDelivery
import PackServer
import PackTestSupport
import Testing

/// The `packs` binary against real servers: Hummingbird (`packs serve`'s server) and nginx.
@Suite(.timeLimit(.minutes(5))) struct EndToEndTests {
    static let products = ["com.example.atlas", "com.example.forest", "com.example.ocean"]
    static let sourceFolders = ["com.example.atlas": "atlas", "com.example.forest": "forest", "com.example.ocean": "ocean"]

    /// Checks what a user sees after a successful fetch: exit 0, content byte-identical to the source, nothing left over.
    func expectInstalled(home: URL, products: [String], destination: String = "Caches") throws {
        for product in products {
            let content = try CLI.run(home: home, ["--json", "content", product])
            #expect(content.status == 0, "content \(product): \(content.stderr)")
            let object = try #require(content.events.first)
            #expect(object["productIdentifier"] as? String == product)
            let path = try #require(object["contentURL"] as? String)
            #expect(path.hasPrefix("/") && path.contains("/\(destination)/"))
            let source = CLI.packageRoot.appending(path: "SampleContent/\(Self.sourceFolders[product]!)")
            #expect(try treeContents(URL(filePath: path)) == treeContents(source), "installed files of \(product) differ from the pack's")
        }
        #expect(leftoversAfterCleanup(home) == [])
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.status == 0)
        #expect(status.stdout.contains(#"{"transactions":[]}"#), "fetch must finish its transactions: \(status.stdout)")
    }

    @Test func fetchFromPackServeInstallsEveryPackByteForByte() async throws {
        let site = try TestSite.samples("e2e-serve-site")
        let server = try await PackServer.start(PackServerConfiguration(directory: site.folder, port: 0), logger: Logger(label: "test"))
        let home = try Fixtures.temporaryDirectory("e2e-serve-home")
        let fetch = try CLI.run(
            home: home, ["--json", "fetch", server.baseURL.appending(path: "manifest.json").absoluteString] + Self.products)
        await server.stop()
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        try self.expectInstalled(home: home, products: Self.products)

        // Every state change reached stdout, ending with finished at progress exactly 1, without duplicates.
        let downloads = fetch.events.filter { $0["event"] as? String == "download" }
        for id in Set(downloads.compactMap { $0["id"] as? String }) {
            let mine = downloads.filter { $0["id"] as? String == id }
            let last = try #require(mine.last)
            #expect(last["state"] as? String == "finished" && last["progress"] as? Double == 1.0)
            #expect(mine.contains { $0["phase"] as? String == "unpacking" })
            let keys = mine.map { "\($0["state"]!)/\($0["phase"]!)/\($0["progress"]!)/\($0["phaseProgress"]!)/\($0["bytesReceived"]!)" }
            #expect(zip(keys, keys.dropFirst()).allSatisfy { $0 != $1 }, "duplicate events: \(keys)")
            #expect(mine.compactMap { $0["progress"] as? Double } == mine.compactMap { $0["progress"] as? Double }.sorted())
        }
        let transactions = fetch.events.filter { $0["event"] as? String == "transaction" }
        #expect(transactions.filter { $0["state"] as? String == "finished" }.count == 3)
    }

    @Test func fetchFromNginxIntoDocuments() throws {
        let site = try TestSite.samples("e2e-nginx-site")
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("e2e-nginx-home")
        let fetch = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.ocean", "--to", "documents"])
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        #expect(!fetch.stdout.contains("\u{1B}") && !fetch.stdout.contains("\r"), "piped output must be plain lines")
        #expect(fetch.stdout.contains("installed com.example.ocean 2.1"))
        try self.expectInstalled(home: home, products: ["com.example.ocean"], destination: "Documents")
        #expect(FileManager.default.fileExists(atPath: home.appending(path: "Documents/CACHEDIR.TAG").path))

        // The same version again: finished without downloading a byte.
        let before = nginx.bodyBytesSent()
        let again = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.ocean", "--to", "documents"])
        #expect(again.status == 0, "stderr: \(again.stderr)")
        #expect(nginx.bodyBytesSent() - before < 4096, "only the manifest may be fetched again")
    }

    @Test func aLocalManifestPathWorksWithFileURLs() throws {
        let site = try TestSite.samples("e2e-local-site")
        let home = try Fixtures.temporaryDirectory("e2e-local-home")
        let fetch = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest"])
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        try self.expectInstalled(home: home, products: ["com.example.forest"])
    }

    @Test func anUnknownProductIsBadDataAndInstallsNothing() throws {
        let site = try TestSite.samples("e2e-unknown-site")
        let home = try Fixtures.temporaryDirectory("e2e-unknown-home")
        let fetch = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.forest", "com.example.nope"])
        #expect(fetch.status == 65)
        #expect(
            fetch.stderr.contains("com.example.nope") && fetch.stderr.contains("com.example.forest"),
            "the error names the product and what exists: \(fetch.stderr)")
        #expect(try CLI.run(home: home, ["content", "com.example.forest"]).status != 0)
    }

    @Test func aChecksumMismatchInstallsNothing() throws {
        let site = try TestSite.samples("e2e-sha-site")
        try site.editManifest { manifest in
            manifest.products = manifest.products.map { product in
                var product = product
                product.contents = product.contents.map {
                    var content = $0
                    content.sha256 = String(repeating: "0", count: 64)
                    return content
                }
                return product
            }
        }
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("e2e-sha-home")
        let fetch = try CLI.run(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest"])
        #expect(fetch.status == 65)
        #expect(fetch.stderr.contains("SHA-256"), "stderr: \(fetch.stderr)")
        let content = try CLI.run(home: home, ["content", "com.example.forest"])
        #expect(content.status != 0 && content.stdout.isEmpty)
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.forest").path))
        #expect(leftoversAfterCleanup(home) == [])
        // The failed download stays in the queue, resumable; the transaction is not finished.
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.stdout.contains(#""state":"failed""#))
    }

    @Test func unreadableAndMissingManifestsAreBadData() throws {
        let home = try Fixtures.temporaryDirectory("e2e-manifest-home")
        let garbage = home.appending(path: "garbage.json")
        try Data("this is not json".utf8).write(to: garbage)
        let unreadable = try CLI.run(home: home, ["fetch", garbage.path, "com.example.forest"])
        #expect(unreadable.status == 65)
        #expect(unreadable.stderr.contains("it is not JSON"), "stderr: \(unreadable.stderr)")

        let missing = try CLI.run(home: home, ["fetch", home.appending(path: "nope.json").path, "com.example.forest"])
        #expect(missing.status == 65)
        #expect(missing.stderr.contains("no such file"), "stderr: \(missing.stderr)")

        let site = try TestSite.samples("e2e-manifest-site")
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let notFound = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "missing.json").absoluteString, "com.example.forest"])
        #expect(notFound.status == 65)
        #expect(notFound.stderr.contains("404"), "stderr: \(notFound.stderr)")
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }

    @Test func usageErrorsExit64() throws {
        let home = try Fixtures.temporaryDirectory("e2e-usage-home")
        #expect(try CLI.run(home: home, ["fetch"]).status == 64)
        #expect(try CLI.run(home: home, ["fetch", "m.json", "p", "--to", "elsewhere"]).status == 64)
        #expect(try CLI.run(home: home, ["fetch", "m.json", "p", "--concurrency", "0"]).status == 64)
        let version = try Fixtures.run(CLI.binary, ["--version"])
        #expect(version.status == 0 && !version.stdout.isEmpty)
    }
}
