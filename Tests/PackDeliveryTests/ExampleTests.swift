import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// The example store client (`Examples/StoreClient`), run as a user would: it is documentation, so it must work.
@Suite struct ExampleTests {
    static let products = ["com.example.atlas", "com.example.forest", "com.example.ocean"]
    static let sourceFolders = ["com.example.atlas": "atlas", "com.example.forest": "forest", "com.example.ocean": "ocean"]

    /// The `StoreClientExample` binary built beside the tests (`swift build --build-tests` builds it).
    static let binary: String = {
        if let path = ProcessInfo.processInfo.environment["STORE_CLIENT_EXAMPLE_BINARY"] { return path }
        return URL(filePath: CommandLine.arguments[0]).deletingLastPathComponent().appending(path: "StoreClientExample").path
    }()

    /// Runs `StoreClientExample --home HOME MANIFEST PRODUCTS…` and returns its exit status and stdout lines.
    func runExample(home: URL, manifest: URL) throws -> (status: Int32, lines: [String], stderr: String) {
        let result = try Fixtures.run(Self.binary, ["--home", home.path, manifest.path] + Self.products)
        return (result.status, result.stdout.split(separator: "\n").map(String.init), result.stderr)
    }

    @Test func theExampleDeliversEveryProductFinishesItsTransactionsAndFindsTheContent() throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "no StoreClientExample at \(Self.binary)")
        let site = try TestSite.samples("example-site")
        let home = try Fixtures.temporaryDirectory("example-home")

        let first = try self.runExample(home: home, manifest: site.manifestURL)
        #expect(first.status == 0, "stderr: \(first.stderr)\nstdout:\n\(first.lines.joined(separator: "\n"))")
        for product in Self.products {
            #expect(first.lines.contains { $0.hasPrefix("download ") && $0.contains(" \(product) finished at /") },
                    "no finished download for \(product)")
            #expect(first.lines.contains { $0.hasPrefix("transaction ") && $0.contains(" \(product) purchased finished") },
                    "the observer must finish the transaction of \(product)")
            let prefix = "content \(product) "
            let line = try #require(first.lines.first { $0.hasPrefix(prefix) })
            let path = String(line.dropFirst(prefix.count))
            #expect(path.hasPrefix("/") && path.hasSuffix("/Caches/\(product)"), "\(line)")
            let source = CLI.packageRoot.appending(path: "SampleContent/\(Self.sourceFolders[product]!)")
            #expect(try treeContents(URL(filePath: path)) == treeContents(source), "installed files of \(product) differ from the pack's")
        }
        #expect(!first.lines.contains { $0.contains("cannot finish") }, "finish was called too early")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.status == 0 && status.stdout.contains(#"{"transactions":[]}"#), "open transactions left: \(status.stdout)")

        // A second purchase of installed content: no download runs, the observer finishes each transaction at once.
        let second = try self.runExample(home: home, manifest: site.manifestURL)
        #expect(second.status == 0, "stderr: \(second.stderr)")
        #expect(!second.lines.contains { $0.hasPrefix("download ") }, "nothing to download: \(second.lines)")
        #expect(second.lines.filter { $0.hasPrefix("transaction ") && $0.contains(" purchased finished") }.count == Self.products.count)
        #expect(second.lines.filter { $0.hasPrefix("content ") && $0.contains("/Caches/") }.count == Self.products.count)
        #expect(try CLI.run(home: home, ["--json", "status"]).stdout.contains(#"{"transactions":[]}"#))
    }
}
