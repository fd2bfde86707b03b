import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Bad manifests, misbehaving servers and odd archives end with one clear line and a
/// documented exit code, and never with a crash, a loop, a silent wait or lost content.
@Suite(.timeLimit(.minutes(5))) struct HostileInputTests {
    /// A site of the sample packs, served by nginx, and a fresh home.
    struct Served {
        let site: TestSite
        let nginx: NginxServer
        let home: URL
        var manifestURL: String { self.nginx.baseURL.appending(path: "manifest.json").absoluteString }

        init(_ label: String) throws {
            self.site = try TestSite.samples(label + "-site")
            self.nginx = try NginxServer(root: self.site.folder)
            self.home = try Fixtures.temporaryDirectory(label + "-home")
        }

        /// Writes a second manifest, changed by `edit`, and returns its URL.
        func manifest(_ name: String, _ edit: (inout [String: Any]) -> Void) throws -> String {
            var object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: self.site.manifestURL)) as? [String: Any])
            edit(&object)
            try JSONSerialization.data(withJSONObject: object).write(to: self.site.folder.appending(path: name))
            return self.nginx.baseURL.appending(path: name).absoluteString
        }
    }

    static func expectOneLine(_ stderr: String, sourceLocation: SourceLocation = #_sourceLocation) {
        let lines = stderr.split(separator: "\n", omittingEmptySubsequences: false).filter { !$0.isEmpty }
        #expect(lines.count == 1, "one line on stderr, not: \(stderr)", sourceLocation: sourceLocation)
    }

    /// Item 1: a content id installed for one product cannot be taken by another.
    @Test func aCollidingContentIdentifierIsRefusedAndTheInstalledContentStays() throws {
        let served = try Served("collide")
        defer { served.nginx.stop() }
        #expect(try CLI.run(home: served.home, ["fetch", served.manifestURL, "com.example.forest"]).status == 0)
        let forestBefore = try treeContents(served.home.appending(path: "Caches/com.example.forest"))
        let hostile = try served.manifest("atlas-as-forest.json") { object in
            var products = object["products"] as! [[String: Any]]
            let atlas = products.firstIndex { $0["productIdentifier"] as? String == "com.example.atlas" }!
            var contents = products[atlas]["contents"] as! [[String: Any]]
            contents[0]["contentIdentifier"] = "com.example.forest"
            products[atlas]["contents"] = contents
            object["products"] = products.filter { $0["productIdentifier"] as? String != "com.example.forest" }
        }
        let result = try CLI.run(home: served.home, ["fetch", hostile, "com.example.atlas"])
        #expect(result.status == 65, "stderr: \(result.stderr)")
        #expect(result.stderr.contains("com.example.forest") && result.stderr.contains("com.example.atlas"), "names both: \(result.stderr)")
        Self.expectOneLine(result.stderr)
        #expect(try treeContents(served.home.appending(path: "Caches/com.example.forest")) == forestBefore, "forest is untouched")
        #expect(try CLI.run(home: served.home, ["content", "com.example.forest"]).status == 0)
    }

    /// Item 1: no id may name a file the home itself uses.
    @Test func anIdThatNamesAFileOfTheHomeIsRefused() throws {
        let served = try Served("reserved")
        defer { served.nginx.stop() }
        #expect(try CLI.run(home: served.home, ["fetch", served.manifestURL, "com.example.forest"]).status == 0)
        let tag = try Data(contentsOf: served.home.appending(path: "Caches/CACHEDIR.TAG"))
        let hostile = try served.manifest("tag.json") { object in
            var products = object["products"] as! [[String: Any]]
            var contents = products[0]["contents"] as! [[String: Any]]
            contents[0]["contentIdentifier"] = "CACHEDIR.TAG"
            products[0]["contents"] = contents
            object["products"] = products
        }
        let product = try #require(try served.site.manifest().products.first?.productIdentifier)
        let result = try CLI.run(home: served.home, ["fetch", hostile, product])
        #expect(result.status == 65 && result.stderr.contains("CACHEDIR.TAG"), "stderr: \(result.stderr)")
        #expect(try Data(contentsOf: served.home.appending(path: "Caches/CACHEDIR.TAG")) == tag)
    }

    /// Item 2: sizes from outside never trap, and a refused manifest leaves nothing that crashes later.
    @Test(arguments: ["contentLength", "unpackedLength"])
    func aSizeOfTwoToTheSixtyThreeIsRefusedWithoutACrash(field: String) throws {
        let served = try Served("huge-\(field)")
        defer { served.nginx.stop() }
        let hostile = try served.manifest("huge.json") { object in
            var products = object["products"] as! [[String: Any]]
            var contents = products[0]["contents"] as! [[String: Any]]
            contents[0][field] = Int64.max
            products[0]["contents"] = contents
            object["products"] = products
        }
        let product = try #require(try served.site.manifest().products.first?.productIdentifier)
        let result = try CLI.run(home: served.home, ["fetch", hostile, product])
        #expect(result.status == 65 && result.stderr.contains(field), "stderr: \(result.stderr)")
        Self.expectOneLine(result.stderr)
        #expect(try CLI.run(home: served.home, ["resume"]).status == 0, "nothing poisons the home")
    }

    /// Item 3: a manifest one byte longer than the file ends failed, saying so, after a bounded number of requests.
    @Test func aStaleManifestLengthFailsSayingByHowMuchInsteadOfLooping() async throws {
        let site = try TestSite.random("stale-length", size: 200_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].contentLength += 1
        manifest.products[0].contents[0].url = server.url("big.tar").absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("stale-length-home")),
            configuration: .init(resumeWhenSpaceReturns: false, maxAttempts: 4, maxRetryDelay: 0.2))
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let ended = try #require(await waitFor(queue, id, timeout: 60) { !$0.state.isRunning }, "the download ended")
        #expect(ended.state == .failed && ended.error?.code == .lengthMismatch, "\(String(describing: ended.error))")
        #expect(ended.error?.message.contains("1 byte shorter than the manifest says") == true, "\(ended.error?.message ?? "")")
        #expect(server.requests().count <= 4, "at most the retry limit of requests: \(server.requests())")
        #expect(ended.bytesReceived == 0, "nothing is kept from a body whose length is known to be wrong")
    }

    /// Item 3: a 206 whose Content-Range does not start where asked starts over from zero, and ends.
    @Test func a206ThatStartsElsewhereStartsOverAndInstalls() async throws {
        let site = try TestSite.random("wrong-range", size: 600_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .wrongRangeStart).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let writer = DiskFullWriter(space: 300_000)
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("wrong-range-home")),
            configuration: .init(resumeWhenSpaceReturns: false, maxAttempts: 4, maxRetryDelay: 0.2, writer: writer))
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let paused = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(paused.state == .paused && paused.bytesReceived > 0)
        writer.setSpace(.max)
        try queue.resume([id])
        let ended = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(ended.state == .finished, "\(String(describing: ended.error))")
        #expect(server.requests().count <= 4, "\(server.requests())")
    }

    /// Item 4: a server sending a byte a second is too slow, and runs out of attempts instead of retrying forever.
    @Test func aTrickleIsTooSlowAndEndsAfterTheRetryLimit() async throws {
        let site = try TestSite.random("trickle", size: 100_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .slow(bytesPerSecond: 20)).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("trickle-home")),
            configuration: .init(
                transfer: TransferOptions(stallTimeout: 30, lowSpeedLimit: 1000, lowSpeedTime: 2),
                resumeWhenSpaceReturns: false, maxAttempts: 2, maxRetryDelay: 0.2))
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let ended = try #require(await waitFor(queue, id, timeout: 40) { !$0.state.isRunning }, "ended instead of trickling on")
        #expect(ended.state == .failed && ended.error?.code == .tooSlow, "\(String(describing: ended.error))")
        #expect(
            ended.error?.message.contains("below the low-speed limit of 1000 bytes per second") == true, "\(ended.error?.message ?? "")")
        #expect(server.requests().count == 2)
    }

    /// Item 5: a 503 with Retry-After and a server that never answers are said, not silent.
    @Test func waitsAreSaidInEventsWithTheReasonAndTheTime() async throws {
        let site = try TestSite.random("wait-said", size: 10_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .status(503, times: 1, retryAfter: 300)).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("wait-said-home")), configuration: .init(resumeWhenSpaceReturns: false))
        defer { queue.close() }
        let started = Date()
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let waiting = try #require(await waitFor(queue, id, timeout: 20) { $0.retryDate != nil }, "the wait shows up in an event")
        #expect(
            waiting.state == .active && waiting.error?.httpStatus == 503 && waiting.error?.message.contains("5 min") == true,
            "\(String(describing: waiting.error))")
        let seconds = try #require(waiting.retryDate).timeIntervalSince(started)
        #expect(seconds > 290 && seconds < 320, "waits as long as the server asked: \(seconds) s")
        try queue.cancel([id])
    }

    @Test func aServerThatNeverAnswersIsSaidAtTheStallTimeout() async throws {
        let site = try TestSite.random("silent", size: 10_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar", fault: .silent).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("silent-home")),
            configuration: .init(
                transfer: TransferOptions(stallTimeout: 2), resumeWhenSpaceReturns: false, maxAttempts: 2, maxRetryDelay: 0.2))
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let said = try #require(await waitFor(queue, id, timeout: 15) { $0.error != nil }, "said within seconds")
        #expect(
            said.error?.code == .timedOut && said.error?.message.contains("No data arrived") == true, "\(String(describing: said.error))")
        let ended = try #require(await waitFor(queue, id, timeout: 30) { !$0.state.isRunning })
        #expect(ended.state == .failed && ended.error?.code == .timedOut)
    }

    /// Items 7 and 13: redirects go to http(s) only, and a loop is called a loop.
    @Test(arguments: ["ftp://127.0.0.1:1/pack.tar", "file:///etc/passwd", "LOOP"])
    func redirectsLeadOnlyToHTTPAndALoopIsNamed(target: String) async throws {
        let site = try TestSite.random("redirect", size: 10_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        // A route that redirects to "./big.tar" redirects to itself: a loop.
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url =
            server.url("big.tar", fault: .redirect(to: target == "LOOP" ? "./big.tar" : target)).absoluteString
        let loaded = try LoadedManifest.decode(try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("redirect-home")),
            configuration: .init(resumeWhenSpaceReturns: false, maxAttempts: 2, maxRetryDelay: 0.2))
        defer { queue.close() }
        let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
        let ended = try #require(await waitFor(queue, id, timeout: 30) { !$0.state.isRunning })
        #expect(ended.state == .failed, "\(String(describing: ended.error))")
        if target == "LOOP" {
            #expect(ended.error?.message.contains("too many times") == true, "\(ended.error?.message ?? "")")
        } else {
            #expect(ended.error?.code == .unsupportedURL, "\(String(describing: ended.error))")
            #expect(server.requests().count == 1, "refused at once, not retried")
        }
    }

    /// Item 8: a manifest from a server may not name local files.
    @Test func aRemoteManifestNamingAFileURLIsRefused() throws {
        let served = try Served("remote-file")
        defer { served.nginx.stop() }
        let hostile = try served.manifest("file.json") { object in
            var products = object["products"] as! [[String: Any]]
            var contents = products[0]["contents"] as! [[String: Any]]
            contents[0]["url"] = "file:///etc/hostname"
            products[0]["contents"] = contents
            object["products"] = products
        }
        let product = try #require(try served.site.manifest().products.first?.productIdentifier)
        let result = try CLI.run(home: served.home, ["fetch", hostile, product])
        #expect(result.status == 65 && result.stderr.contains("may not name local files"), "stderr: \(result.stderr)")
        #expect(served.nginx.requests().filter { $0.uri != "/file.json" }.isEmpty, "nothing downloaded")
    }

    /// Item 9: ids with control characters are refused when the manifest is read; nothing raw reaches the terminal.
    @Test(arguments: ["\u{1B}]0;pwned\u{07}", "a\rb", "a\nb", "a\tb", "a\u{7F}b"])
    func controlCharactersInIdsAreRefused(id: String) throws {
        let served = try Served("control")
        defer { served.nginx.stop() }
        let hostile = try served.manifest("control.json") { object in
            var products = object["products"] as! [[String: Any]]
            products[0]["productIdentifier"] = "com.example." + id
            object["products"] = products
        }
        let result = try CLI.run(home: served.home, ["fetch", hostile, "--all"])
        #expect(result.status == 65, "stderr: \(result.stderr)")
        #expect(
            !result.stderr.contains("\u{1B}") && !result.stderr.contains("\r") && !result.stderr.contains("\u{7F}"),
            "escaped: \(result.stderr.debugDescription)")
        Self.expectOneLine(result.stderr)
    }

    /// Item 13: valid JSON that is not a usable manifest is not called "not JSON"; a digest of full-width digits is refused at once.
    @Test(arguments: [
        (
            #"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p","contentVersion":"1","url":"p.tar","contentLength":1.5,"sha256":"\#(String(repeating: "a", count: 64))"}]}]}"#,
            "not a whole number"
        ),
        (
            #"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p","contentVersion":"1","url":"p.tar","contentLength":1e400,"sha256":"\#(String(repeating: "a", count: 64))"}]}]}"#,
            "number"
        ),
        (String(repeating: "[", count: 1000) + String(repeating: "]", count: 1000), "deep"),
        (
            #"{"products":[{"productIdentifier":"p","contents":[{"contentIdentifier":"p","contentVersion":"1","url":"p.tar","contentLength":1,"sha256":"\#(String(repeating: "０", count: 64))"}]}]}"#,
            "64 hex digits"
        ),
        ("[1, 2, 3]", "not a manifest"),
        ("not json at all", "not JSON"),
    ])
    func manifestErrorsSayWhatIsWrong(json: String, says: String) throws {
        let folder = try Fixtures.temporaryDirectory("manifest-words")
        try Data(json.utf8).write(to: folder.appending(path: "manifest.json"))
        let result = try CLI.run(home: folder.appending(path: "home"), ["fetch", folder.appending(path: "manifest.json").path, "p"])
        #expect(result.status == 65, "stderr: \(result.stderr)")
        #expect(result.stderr.lowercased().contains(says.lowercased()), "says '\(says)': \(result.stderr)")
        if says != "not JSON" { #expect(!result.stderr.contains("not JSON"), "\(result.stderr)") }
        Self.expectOneLine(result.stderr)
    }

    /// Items 12 and 13: a local pack shorter than the manifest says is a length mismatch, not "resumed"; a FIFO is refused at once.
    @Test func localPacksMustBeRegularFilesOfTheRightLength() throws {
        let site = try TestSite.random("local-short", size: 50_000)
        try site.editManifest { $0.products[0].contents[0].contentLength += 10 }
        let home = try Fixtures.temporaryDirectory("local-short-home")
        let short = try CLI.run(home: home, ["fetch", site.manifestURL.path, "com.example.big"])
        #expect(
            short.status == 65 && short.stderr.contains("bytes long, but the manifest says") && !short.stderr.contains("resumed"),
            "stderr: \(short.stderr)")
        Self.expectOneLine(short.stderr)

        let fifo = site.folder.appending(path: "fifo.json")
        #expect(mkfifo(fifo.path, 0o644) == 0)
        let started = Date()
        let blocked = try CLI.run(home: home, ["fetch", fifo.path, "com.example.big"], timeout: 20)
        #expect(blocked.status == 65 && blocked.stderr.contains("not a regular file"), "stderr: \(blocked.stderr)")
        #expect(Date().timeIntervalSince(started) < 10, "refused at once, not blocked on the FIFO")
    }

    /// What a server says in its error body is shown, short and escaped.
    @Test func whatTheServerSaidIsShownAndAHugeHeaderIsNamed() async throws {
        let site = try TestSite.random("server-said", size: 10_000)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        for (fault, expected) in [(Fault.errorBody(status: 403), "Request has expired"), (.hugeHeader(bytes: 10 << 20), "header")] {
            var manifest = try site.manifest()
            manifest.products[0].contents[0].url = server.url("big.tar", fault: fault).absoluteString
            let loaded = try LoadedManifest.decode(
                try JSONEncoder().encode(manifest), from: server.baseURL.appending(path: "manifest.json"))
            let queue = try DownloadQueue(
                home: Home(folder: try Fixtures.temporaryDirectory("server-said-home")),
                configuration: .init(resumeWhenSpaceReturns: false, maxAttempts: 1))
            let id = try await #require(try queue.add(product: "com.example.big", from: loaded).downloads.first?.id)
            let ended = try #require(await waitFor(queue, id, timeout: 30) { !$0.state.isRunning })
            await queue.close()
            // A 403 pauses (unauthorized: renewed credentials may fix it); an oversized header fails.
            #expect(!ended.state.isRunning && ended.error?.message.contains(expected) == true, "\(fault): \(ended.error?.message ?? "")")
            #expect(ended.error?.message.contains("Out of memory") != true)
        }
    }

    /// Item 10: content that was deleted behind the queue's back is reported missing, with the way to repair it.
    @Test func contentOfAMissingFolderSaysSoAndNothingInstalledIs64() throws {
        let served = try Served("content-missing")
        defer { served.nginx.stop() }
        #expect(try CLI.run(home: served.home, ["content", "com.example.forest"]).status == 64)
        #expect(try CLI.run(home: served.home, ["content"]).status == 64)
        #expect(try CLI.run(home: served.home, ["fetch", served.manifestURL, "com.example.forest"]).status == 0)
        try FileManager.default.removeItem(at: served.home.appending(path: "Caches/com.example.forest"))
        let result = try CLI.run(home: served.home, ["content", "com.example.forest"])
        #expect(
            result.status == 65 && result.stderr.contains("missing") && result.stderr.contains("packs verify --repair"),
            "stderr: \(result.stderr)")
        #expect(result.stdout.isEmpty, "no path printed for a missing folder: \(result.stdout)")
    }
}
