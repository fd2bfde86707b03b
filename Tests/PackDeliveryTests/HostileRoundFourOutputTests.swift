import Foundation
import Logging
import PackDelivery
import PackFuzzHarness
import PackTestSupport
import Testing

/// Issue 43, items 6 to 8 (crashes on numbers from the command line, a manifest and the store) and 13 to 17 (escape
/// sequences from hostile input reaching the terminal and the logs), through the `packs` binary as a user runs it.
@Suite(.serialized, .timeLimit(.minutes(5))) struct HostileRoundFourOutputTests {
    /// The characters of `text` that a terminal acts on (the line breaks and tabs of the output's own layout aside),
    /// as `U+XXXX`.
    static func rawControls(_ text: String) -> [String] {
        text.unicodeScalars.filter { scalar in
            scalar != "\n" && scalar != "\t"
                && (scalar.properties.generalCategory == .control || scalar.properties.isBidiControl || scalar == "\u{2028}"
                    || scalar == "\u{2029}")
        }.map { "U+" + String($0.value, radix: 16, uppercase: true) }
    }

    static func expectClean(_ text: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(
            Self.rawControls(text).isEmpty, "\(what) holds raw \(Self.rawControls(text)): \(text.debugDescription)",
            sourceLocation: sourceLocation)
    }

    /// Runs `sqlite3 HOME/state.sqlite SQL` (after a `packs status` has made the database).
    static func sql(_ home: URL, _ statement: String) throws {
        #expect(try CLI.run(home: home, ["status"]).status == 0)
        let result = try Fixtures.run("sqlite3", [home.appending(path: "state.sqlite").path, statement])
        #expect(result.status == 0, "sqlite3: \(result.stderr)")
    }

    /// A publisher key pair made by `packs keygen`, in a fresh folder: the private key's path.
    static func key(_ label: String) throws -> String {
        let folder = try Fixtures.temporaryDirectory(label)
        let name = folder.appending(path: "k").path
        let made = try Fixtures.run(CLI.binary, ["keygen", name])
        #expect(made.status == 0, "keygen: \(made.stderr)")
        return name + ".key"
    }

    // MARK: - Crashes (items 6 to 8)

    /// Item 6: a lifetime that is no number of seconds (infinite, or past what a date holds) crashed the conversion to
    /// Int64 (SIGILL); it is a usage error.
    @Test(arguments: ["infh", "1e300h", "infd", "nanh", "36501d"])
    func aReceiptLifetimeOutOfRangeIsAUsageError(expires: String) throws {
        let key = try Self.key("expires-key")
        let home = try Fixtures.temporaryDirectory("expires-home")
        let result = try CLI.run(
            home: home, ["receipt", "--key", key, "--product", "com.example.forest", "--subject", "u", "--expires", expires])
        #expect(result.status == 64, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("--expires"), "\(result.stderr)")
        #expect(result.stdout.isEmpty, "no receipt: \(result.stdout)")
        // And the library refuses it too, with a code.
        let signing = try PublisherSigningKey(pem: String(contentsOfFile: key, encoding: .utf8))
        #expect(throws: PackDeliveryError.self) {
            try Receipt.issue(products: ["p"], subject: "u", lifetime: .infinity, key: signing)
        }
    }

    /// Item 6: the same durations in `packs manifest --sign --expires`.
    @Test func aManifestExpiryOutOfRangeIsAUsageError() throws {
        let key = try Self.key("manifest-expires-key")
        let site = try TestSite.random("manifest-expires", size: 4096)
        let before = try Data(contentsOf: site.manifestURL)
        let result = try Fixtures.run(CLI.binary, ["manifest", site.folder.path, "--sign", key, "--expires", "1e300h"])
        #expect(result.status == 64, "exit \(result.status): \(result.stderr)")
        #expect(try Data(contentsOf: site.manifestURL) == before, "manifest.json is unchanged")
    }

    /// Item 7: `packs manifest --sign` over a manifest whose version is the largest there is overflowed adding one
    /// (SIGILL); it is a data error (65) that says why, and manifest.json stays as it was.
    @Test func aManifestAtTheLargestVersionCannotBeFollowed() throws {
        let key = try Self.key("max-version-key")
        let site = try TestSite.random("max-version", size: 4096)
        try site.editManifest { $0.version = Int.max }
        let before = try Data(contentsOf: site.manifestURL)
        let result = try Fixtures.run(CLI.binary, ["manifest", site.folder.path, "--sign", key])
        #expect(result.status == 65, "exit \(result.status): \(result.stderr)")
        #expect(result.stderr.contains("\(Int.max)") && result.stderr.contains("largest"), "\(result.stderr)")
        HostileInputTests.expectOneLine(result.stderr)
        #expect(try Data(contentsOf: site.manifestURL) == before, "manifest.json is unchanged")
        #expect(!FileManager.default.fileExists(atPath: site.folder.appending(path: "manifest.json.sig").path))
        // A version given explicitly still signs.
        #expect(try Fixtures.run(CLI.binary, ["manifest", site.folder.path, "--sign", key, "--manifest-version", "7"]).status == 0)
    }

    /// Item 8: a measured throughput that is not a number (`UPDATE sourceStats SET bytesPerSecond='fast'`) stopped
    /// `packs sources` and every fetch with several sources in GRDB's decoding (SIGILL). The row is left out; the
    /// store stays usable, and the next measurement replaces it.
    @Test func aSourceStatsRowThatIsNotANumberIsLeftOut() throws {
        let home = try Fixtures.temporaryDirectory("stats-home")
        try Self.sql(
            home,
            """
            INSERT INTO sourceStats (origin, bytesPerSecond, failures, updatedAt) VALUES
              ('http://good.example:80', 2000000, 0, '2026-01-01 00:00:00.000'),
              ('http://bad.example:80', 'fast', 0, '2026-01-01 00:00:00.000'),
              ('http://worse.example:80', 1, 'many', 'yesterday');
            """)
        let text = try CLI.run(home: home, ["sources"])
        #expect(text.status == 0, "exit \(text.status): \(text.stderr)")
        #expect(text.stdout.contains("good.example") && !text.stdout.contains("bad.example"), "\(text.stdout)")
        let json = try CLI.run(home: home, ["--json", "sources"])
        #expect(json.status == 0 && json.events.count == 1, "exit \(json.status): \(json.stdout) \(json.stderr)")

        // A fetch of a pack with two sources (two mirrors), with the bad rows in place.
        let site = try TestSite.random("stats-site", size: 64 << 10)
        let first = try NginxServer(root: site.folder)
        defer { first.stop() }
        let second = try NginxServer(root: site.folder)
        defer { second.stop() }
        try site.editManifest { $0.mirrors = ["http://127.0.0.1:\(first.port)/", "http://127.0.0.1:\(second.port)/"] }
        try Self.sql(home, "UPDATE sourceStats SET bytesPerSecond = 'fast' WHERE origin = 'http://good.example:80';")
        let fetched = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.big"])
        #expect(fetched.status == 0, "exit \(fetched.status): \(fetched.stderr)")
        let after = try CLI.run(home: home, ["sources"])
        #expect(after.status == 0 && after.stdout.contains("127.0.0.1"), "the source measured is listed: \(after.stdout) \(after.stderr)")
    }

    // MARK: - The escape (items 13 to 17)

    /// One escape for everything printed or logged: C0, DEL, C1, bidirectional controls (isolates too, which were
    /// printed raw), line separators; the backslash escaped too, so two texts never print alike and it reads back.
    @Test func printableEscapesEveryControlAndReadsBack() {
        #expect(PackDeliveryError.printable("a\u{1B}]0;T\u{07}") == #"a\x1B]0;T\x07"#)
        #expect(PackDeliveryError.printable("\u{9B}31m\u{7F}\u{85}") == #"\x9B31m\x7F\x85"#)
        #expect(PackDeliveryError.printable("id\u{2066}x\u{2069}\u{202E}") == #"id\u{2066}x\u{2069}\u{202E}"#)
        #expect(PackDeliveryError.printable("\u{061C}\u{200E}\u{200F}\u{2028}") == #"\u{061C}\u{200E}\u{200F}\u{2028}"#)
        #expect(PackDeliveryError.printable("café 😀 com.example.forest") == "café 😀 com.example.forest")
        // Injective: a text that looks like an escape does not print like the character.
        #expect(PackDeliveryError.printable(#"\x1B"#) == #"\\x1B"#)
        #expect(PackDeliveryError.printable(#"\x1B"#) != PackDeliveryError.printable("\u{1B}"))
        var every = ""
        for value in UInt32(0)..<0x3000 { if let scalar = Unicode.Scalar(value) { every.unicodeScalars.append(scalar) } }
        every += "\\\u{E000}\u{FEFF}\u{1F600}"
        let shown = PackDeliveryError.printable(every)
        #expect(Self.rawControls(shown).isEmpty, "\(Self.rawControls(shown))")
        #expect(shown.unicodeScalars.allSatisfy { $0 != "\n" && $0 != "\t" })
        #expect(FuzzHarness.unescapePrintable(shown) == every, "reads back")
        // Error messages, built from any text, hold no bidirectional control raw either.
        let error = PackDeliveryError(.invalidArgument, message: "No product x\u{2067}y\u{202E}.")
        #expect(Self.rawControls(error.message).isEmpty, "\(error.message.debugDescription)")
    }

    /// Item 13: a file name from a pack (here: one added to the installed folder, which verify lists) with a raw OSC
    /// (sets the terminal's title) and a raw U+009B (CSI), in `packs verify` and `packs --json verify`.
    @Test func verifyEscapesFileNamesInTextAndJSON() throws {
        let site = try TestSite.random("verify-names", size: 4096)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("verify-names-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        #expect(try CLI.run(home: home, ["fetch", manifest, "com.example.big"]).status == 0)
        let folder = try CLI.run(home: home, ["content", "com.example.big"]).stdout.trimmingCharacters(in: .newlines)
        let name = "x\u{1B}]0;owned\u{07}\u{9B}31m\u{202E}gnp.png"
        try Data("added".utf8).write(to: URL(filePath: folder).appending(path: name))

        let text = try CLI.run(home: home, ["verify"])
        #expect(text.status == 65, "exit \(text.status): \(text.stderr)")
        Self.expectClean(text.stdout + text.stderr, "packs verify")
        #expect(text.stdout.contains(#"x\x1B]0;owned\x07\x9B31m\u{202E}gnp.png"#), "the name, escaped: \(text.stdout)")

        let json = try CLI.run(home: home, ["--json", "verify"])
        #expect(json.status == 65)
        Self.expectClean(json.stdout, "packs --json verify")
        #expect(json.stdout.contains(#"\u009B"#) && json.stdout.contains(#"\u202E"#), "C1 and bidi as JSON escapes: \(json.stdout)")
        let decoded = try #require(json.events.first, "one JSON object: \(json.stdout)")
        #expect(Self.strings(in: decoded).contains { $0.hasSuffix(name) }, "the name, decoded as it is: \(json.stdout)")
    }

    /// Every string value in a decoded JSON value.
    static func strings(in value: Any) -> [String] {
        switch value {
        case let text as String: [text]
        case let array as [Any]: array.flatMap(Self.strings(in:))
        case let object as [String: Any]: object.values.flatMap(Self.strings(in:))
        default: []
        }
    }

    /// Item 14: a mirror host decoded from `%1B%5D0;…%07` (and with U+009B and U+202E), as stored, in `packs sources`
    /// and `packs --json sources`.
    @Test func sourcesEscapesHostsInTextAndJSON() throws {
        let home = try Fixtures.temporaryDirectory("sources-hosts-home")
        try Self.sql(
            home,
            """
            INSERT INTO sourceStats (origin, bytesPerSecond, failures, updatedAt) VALUES
              ('http://m' || char(27) || ']0;T' || char(7) || char(155) || '2J' || char(8238) || '.example:80', 1000, 0,
               '2026-01-01 00:00:00.000');
            """)
        let text = try CLI.run(home: home, ["sources"])
        #expect(text.status == 0, "\(text.stderr)")
        Self.expectClean(text.stdout, "packs sources")
        #expect(text.stdout.contains(#"http://m\x1B]0;T\x07\x9B2J\u{202E}.example:80"#), "\(text.stdout)")
        let json = try CLI.run(home: home, ["--json", "sources"])
        #expect(json.status == 0, "\(json.stderr)")
        Self.expectClean(json.stdout, "packs --json sources")
        #expect(json.events.first?["origin"] as? String == "http://m\u{1B}]0;T\u{07}\u{9B}2J\u{202E}.example:80", "\(json.stdout)")
    }

    /// Item 14: `packs --verbose fetch` logs the source it fetches from: a mirror whose host is percent-encoded
    /// control characters is logged escaped.
    @Test func verboseFetchLogsHostsEscaped() throws {
        let site = try TestSite.random("verbose-host", size: 4096)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        try site.editManifest { $0.mirrors = ["http://m%1B%5D0;T%07%C2%9B.invalid/", "http://127.0.0.1:\(nginx.port)/"] }
        let home = try Fixtures.temporaryDirectory("verbose-host-home")
        let result = try CLI.run(home: home, ["--verbose", "fetch", site.manifestURL.path, "com.example.big", "--retries", "0"])
        Self.expectClean(result.stdout + result.stderr, "packs --verbose fetch")
        #expect(result.stderr.contains("source="), "the sources are logged: \(result.stderr)")
    }

    /// Item 14, the library's own logs (an app's log handler, not the CLI's): the source a download fetches from is
    /// logged escaped, whatever host its percent-encoding decodes to.
    @Test func theLibraryLogsSourcesEscaped() async throws {
        let site = try TestSite.random("library-log-host", size: 4096)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        try site.editManifest { $0.mirrors = ["http://m%1B%5D0;T%07%C2%9B%E2%80%AE.invalid/", "http://127.0.0.1:\(nginx.port)/"] }
        let lines = LogLines()
        var logger = Logger(label: "round-four") { _ in EveryValueLogHandler(lines: lines) }
        logger.logLevel = .debug
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("library-log-home")),
            configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxAttempts: 2, maxRetryDelay: 0.1), logger: logger)
        let manifest = try await LoadedManifest.load(site.manifestURL.path)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try await queue.settled(downloadID: id)
        await queue.close()
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        let logged = lines.all.joined(separator: "\n")
        #expect(logged.contains("source="), "the sources are logged: \(logged)")
        Self.expectClean(logged, "the library's log")
    }

    /// Item 16: a bidirectional override in a product id, printed by `fetch`, `content`, `gc --dry-run`, and as JSON;
    /// an isolate in an error line.
    @Test func productIdsWithBidiControlsAreEscaped() throws {
        let product = "com.example.\u{202E}gib"
        let site = try TestSite.random("bidi-product", product: product, size: 4096)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("bidi-product-home")
        let manifest = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let fetched = try CLI.run(home: home, ["fetch", manifest, product])
        #expect(fetched.status == 0, "\(fetched.stderr)")
        Self.expectClean(fetched.stdout + fetched.stderr, "packs fetch")
        #expect(fetched.stdout.contains(#"com.example.\u{202E}gib"#), "\(fetched.stdout)")
        for arguments in [["content"], ["content", product], ["gc", "--to", "0", "--dry-run"], ["status"]] {
            let result = try CLI.run(home: home, arguments)
            Self.expectClean(result.stdout + result.stderr, "packs \(arguments.joined(separator: " "))")
        }
        let listed = try CLI.run(home: home, ["content"])
        #expect(listed.stdout.contains(#"com.example.\u{202E}gib"#), "\(listed.stdout)")
        let dryRun = try CLI.run(home: home, ["gc", "--to", "0", "--dry-run"])
        #expect(dryRun.stdout.contains(#"com.example.\u{202E}gib"#), "\(dryRun.stdout)")
        let json = try CLI.run(home: home, ["--json", "content"])
        Self.expectClean(json.stdout, "packs --json content")
        #expect(json.events.first?["productIdentifier"] as? String == product, "\(json.stdout)")

        let isolate = try CLI.run(home: home, ["content", "com.example.\u{2066}none\u{2069}"])
        #expect(isolate.status == 64)
        Self.expectClean(isolate.stderr, "the error line")
        #expect(isolate.stderr.contains(#"com.example.\u{2066}none\u{2069}"#), "\(isolate.stderr)")
    }

    /// Item 17: `packs content|remove|verify $'x\e]0;T\a'` echoed the argument raw in the hint of its error line.
    @Test(arguments: ["content", "remove", "verify"])
    func anArgumentEchoedInAHintIsEscaped(command: String) throws {
        let home = try Fixtures.temporaryDirectory("echo-\(command)-home")
        let result = try CLI.run(home: home, [command, "x\u{1B}]0;T\u{07}"])
        #expect(result.status == 64, "exit \(result.status): \(result.stderr)")
        Self.expectClean(result.stderr, "packs \(command)")
        #expect(result.stderr.contains(#"x\x1B]0;T\x07"#), "the argument, escaped: \(result.stderr)")
        HostileInputTests.expectOneLine(result.stderr)
    }

    /// Item 15: `packs serve`'s request log, a raw U+009B in a `Range` header and in the path, on the fast path (a
    /// file) and through the router (a missing one).
    @Test func theServersRequestLogEscapesWhatTheClientSent() async throws {
        let root = try Fixtures.temporaryDirectory("log-escape")
        try Fixtures.randomFile(at: root.appending(path: "pack.bin"), size: 4096)
        try Data(#"{"products":[]}"#.utf8).write(to: root.appending(path: "manifest.json"))
        let server = try PackServeProcess(binary: CLI.binary, [root.path])
        defer { server.stop() }
        let port = server.port
        let requests = [
            Array("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nRange: bytes=0-9\u{9B}2J\r\n\r\n".utf8),
            Array("GET /pack.bin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nRange: bytes=0-9,\u{202E}\r\n\r\n".utf8),
            // Through the router: a missing file (a raw byte in the path is the parser's 400, before any log line).
            Array("GET /missing%1B%5D0;T%07 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nRange: \u{9B}x\r\n\r\n".utf8),
        ]
        for request in requests {
            let connection = try RawConnection(port: port, timeout: 5)
            _ = connection.send(request)
            _ = connection.readToEnd()
        }
        let deadline = Date().addingTimeInterval(5)
        while server.log.components(separatedBy: "\n").filter({ $0.contains("GET") }).count < 3, Date() < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        let log = server.log
        #expect(log.components(separatedBy: "\n").filter { $0.contains("GET") }.count == 3, "three requests logged: \(log)")
        Self.expectClean(log, "the request log")
        #expect(log.contains(#"range=bytes=0-9\x9B2J 200"#), "U+009B escaped, on the fast path: \(log)")
        #expect(log.contains(#"range=\x9Bx 404"#), "U+009B escaped, through the router: \(log)")
    }
}

/// Keeps every log line with its metadata, as `message key=value…`.
struct EveryValueLogHandler: LogHandler {
    let lines: LogLines
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?
    var logLevel: Logger.Level = .debug

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let values = (event.metadata ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        self.lines.append(([event.message.description] + values).joined(separator: " "))
    }
}
