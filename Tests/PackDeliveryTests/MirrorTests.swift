import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// Several sources per pack (issue 32): the manifest's `mirrors` and a pack's `urls`, failover from the kept bytes,
/// a mirror that serves wrong bytes, credentials kept to the manifest's origin. Bytes are counted at the servers.
@Suite(.serialized, .timeLimit(.minutes(3))) struct MirrorTests {
    static let size = 1 << 20

    /// A queue on a fresh home with short timeouts, so that a failover is quick.
    static func queue(_ label: String, stall: TimeInterval = 3, lowSpeed: Int64 = 1024) throws -> DownloadQueue {
        try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory(label)),
            configuration: DownloadQueue.Configuration(
                transfer: TransferOptions(connectTimeout: 2, stallTimeout: stall, lowSpeedLimit: lowSpeed, lowSpeedTime: stall),
                resumeWhenSpaceReturns: false, maxRetryDelay: 0.5))
    }

    /// A site with `count` products `com.example.p0`… of one random pack each (`p0.tar`…), and the SHA-256 of each
    /// pack's `Contents/data.bin`.
    static func catalog(_ label: String, count: Int, size: Int) throws -> (folder: URL, data: [String]) {
        let folder = try Fixtures.temporaryDirectory(label)
        var data: [String] = []
        for number in 0..<count {
            let site = try TestSite.random("\(label)-\(number)", product: "com.example.p\(number)", size: size)
            try FileManager.default.copyItem(at: site.folder.appending(path: "big.tar"), to: folder.appending(path: "p\(number).tar"))
            data.append(try #require(site.dataSHA256))
        }
        try ManifestBuilder.write(folder: folder)
        return (folder, data)
    }

    /// Sets the manifest's mirrors to the nginx servers on these loopback ports, in order.
    static func setMirrors(_ manifestURL: URL, _ ports: [Int]) throws {
        var edited = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: manifestURL))
        edited.mirrors = ports.map { "http://127.0.0.1:\($0)/" }
        try JSONEncoder().encode(edited).write(to: manifestURL)
    }

    /// An indexed tar pack of 20 MiB and more published in `site`, and in `copy` the same pack with one byte flipped at
    /// `percent` of it (at `at`), beside the same index: what a mirror that serves a corrupted copy holds.
    static func corruptedTarPack(_ label: String, percent: Int) throws -> (site: URL, copy: URL, at: Int) {
        let content = try WriteOnceTests.content("\(label)-content", big: 20)
        let site = try Fixtures.temporaryDirectory("\(label)-site")
        try WriteOnceTests.publish(content, site: site, format: .tar)
        let name = WriteOnceTests.packName(.tar)
        let copy = try Fixtures.temporaryDirectory("\(label)-bad")
        var bytes = try Data(contentsOf: site.appending(path: name))
        let at = bytes.count * percent / 100
        bytes[at] ^= 0xFF
        try bytes.write(to: copy.appending(path: name))
        try FileManager.default.copyItem(at: site.appending(path: name + ".index.json"), to: copy.appending(path: name + ".index.json"))
        return (site, copy, at)
    }

    /// A loopback URL nothing listens on: connecting to it is refused.
    static func closedPort() throws -> String {
        "http://127.0.0.1:\(try Fixtures.freePort())/"
    }

    @Test func relativeURLsResolveAgainstEachMirrorInOrderThenTheManifestsOwnPlace() throws {
        var manifest = try TestSite.random("mirror-resolve", size: 4096).manifest()
        manifest.mirrors = ["https://cdn-a.example.com/packs", "https://cdn-b.example.com/v1/"]
        manifest.products[0].contents[0].urls = ["https://origin.example.com/big.tar", "alt/big.tar"]
        manifest.products[0].contents[0].index = Manifest.IndexReference(
            url: "big.tar.index.json", sha256: String(repeating: "0", count: 64), length: 10)
        let loaded = try LoadedManifest(manifest: manifest, baseURL: URL(string: "https://shop.example.com/m/manifest.json")!)
        let content = manifest.products[0].contents[0]
        #expect(
            try loaded.packURLs(for: content).map(\.absoluteString) == [
                "https://cdn-a.example.com/packs/big.tar", "https://cdn-b.example.com/v1/big.tar", "https://shop.example.com/m/big.tar",
                "https://origin.example.com/big.tar", "https://cdn-a.example.com/packs/alt/big.tar",
                "https://cdn-b.example.com/v1/alt/big.tar", "https://shop.example.com/m/alt/big.tar",
            ])
        #expect(try loaded.packURL(for: content).absoluteString == "https://cdn-a.example.com/packs/big.tar")
        // A mirror that is not an absolute http(s) URL is refused when the manifest is read.
        manifest.mirrors = ["cdn.example.com/packs"]
        #expect { try LoadedManifest(manifest: manifest, baseURL: URL(string: "https://shop.example.com/manifest.json")!) } throws: {
            ($0 as? PackDeliveryError)?.code == .invalidManifest
        }
    }

    @Test func mirrorsAreWrittenByPacksManifestAndAMirrorListChangedAfterSigningIsRefused() throws {
        let site = try TestSite.random("mirror-signed", size: 4096)
        let key = try PublisherSigningKey.generate()
        let keyFile = site.folder.deletingLastPathComponent().appending(path: "mirror-signed-\(UUID().uuidString).key")
        try key.pem.write(to: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: keyFile) }
        let made = try Fixtures.run(
            CLI.binary,
            ["manifest", site.folder.path, "--sign", keyFile.path, "--mirror", "https://a.example.com/p/", "https://b.example.com/p/"])
        #expect(made.status == 0, "\(made.stderr)")
        #expect(try site.manifest().mirrors == ["https://a.example.com/p/", "https://b.example.com/p/"])
        let loaded = try LoadedManifest.load(site.manifestURL.path, trusting: [key.publicKey])
        #expect(try loaded.packURL(for: loaded.manifest.products[0].contents[0]).absoluteString == "https://a.example.com/p/big.tar")
        // The same manifest with another mirror list (a byte-for-byte edit of the signed file) is refused.
        let text = try String(contentsOf: site.manifestURL, encoding: .utf8)
        try text.replacingOccurrences(of: "https://a.example.com/p/", with: "https://evil.example.com/p/")
            .write(to: site.manifestURL, atomically: true, encoding: .utf8)
        #expect { try LoadedManifest.load(site.manifestURL.path, trusting: [key.publicKey]) } throws: {
            ($0 as? PackDeliveryError)?.code == .untrustedManifest
        }
    }

    /// Each way a source can fail, on the first mirror; the second (nginx) gives the rest from the kept bytes.
    enum Failure: String, CaseIterable, Sendable {
        case connectionRefused, resetMidway, serverError, notFound, stall, tooSlow
    }

    @Test(arguments: Failure.allCases) func aFailingMirrorHandsOverToTheNextFromTheKeptBytes(_ failure: Failure) async throws {
        let site = try TestSite.random("mirror-fail-\(failure.rawValue)", size: Self.size)
        let faults = try FaultServer(root: site.folder)
        defer { faults.stop() }
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let first: String =
            switch failure {
            case .connectionRefused: try Self.closedPort()
            case .resetMidway: faults.url("", fault: .resetAfter(bytes: 300_000)).absoluteString
            case .serverError: faults.url("", fault: .status(503, times: 1000, retryAfter: nil)).absoluteString
            case .notFound: faults.url("", fault: .status(404, times: 1000, retryAfter: nil)).absoluteString
            case .stall: faults.url("", fault: .stallOnce(afterBytes: 300_000)).absoluteString
            case .tooSlow: faults.url("", fault: .slow(bytesPerSecond: 2_000)).absoluteString
            }
        try site.editManifest { $0.mirrors = [first, "http://127.0.0.1:\(nginx.port)/"] }
        let queue = try Self.queue("mirror-fail-home-\(failure.rawValue)", stall: 2, lowSpeed: failure == .tooSlow ? 50_000 : 1024)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(site.manifestURL.path)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try await queue.settled(downloadID: id)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(download.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(download.source == "127.0.0.1/big.tar", "finished from the second mirror: \(download.source)")
        let fromFirst = faults.bodyBytesSent("big.tar")
        let fromSecond = nginx.bodyBytesSent(path: "/big.tar")
        #expect(fromSecond > 0, "the second mirror was asked")
        // A source given up on mid-answer may have written a few bytes to the socket that the client never read.
        let inFlight = failure == .tooSlow || failure == .stall ? 16 << 10 : 0
        #expect(
            (try site.packSize())...(try site.packSize()) + inFlight ~= fromFirst + fromSecond,
            "no byte kept was fetched twice: \(faults.requests()) \(nginx.requests())")
        if failure == .resetMidway || failure == .stall {
            #expect(fromFirst >= 300_000, "the first mirror's bytes were kept")
            #expect(nginx.requests().first?.range?.hasPrefix("bytes=") == true, "the rest was asked for by range: \(nginx.requests())")
        }
        if failure == .notFound {
            #expect(faults.requests().filter { $0.file == "big.tar" }.count == 1, "a 404 on one mirror is not asked again")
        }
        if failure == .serverError {
            #expect(faults.requests().filter { $0.file == "big.tar" }.count == 3, "a 5xx mirror is asked 1 + its 2 retries")
        }
    }

    /// A mirror that answers 503 once is asked again (a 5xx is passing trouble) and serves the pack; one that always
    /// answers 503 is asked again its two retries, then the next mirror serves the pack. `packs --json fetch` shows each
    /// wait: a download event with a retry date and the 503 naming the first mirror, then the download at the second.
    @Test(arguments: [1, 1000]) func a5xxMirrorGetsItsRetriesBeforeTheNext(_ times: Int) throws {
        let site = try TestSite.random("mirror-5xx-\(times)", size: Self.size)
        let faults = try FaultServer(root: site.folder)
        defer { faults.stop() }
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let first = faults.url("", fault: .status(503, times: times, retryAfter: nil))
        try site.editManifest { $0.mirrors = [first.absoluteString, "http://127.0.0.1:\(nginx.port)/"] }
        let home = try Fixtures.temporaryDirectory("mirror-5xx-home-\(times)")
        let fetched = try CLI.run(home: home, ["--json", "fetch", site.manifestURL.path, "com.example.big"])
        #expect(fetched.status == 0, "\(fetched.stderr)")
        let downloads = fetched.events.filter { $0["event"] as? String == "download" }
        // A wait begins with an event that has a retry date after one without.
        var waits: [String] = []
        var waiting = false
        for event in downloads {
            let date = event["retryDate"] as? String
            let message = (event["error"] as? [String: Any])?["message"] as? String ?? ""
            if date != nil, !waiting, message.contains("503"), message.contains("/f/status/503/") { waits.append(message) }
            waiting = date != nil
        }
        let asked = faults.requests().filter { $0.file == "big.tar" }.count
        let last = try #require(downloads.last)
        let content = try CLI.run(home: home, ["--json", "content"])
        let path = try #require(content.events.first?["contentURL"] as? String)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: path).appending(path: "Contents/data.bin")) == site.dataSHA256)
        if times == 1 {
            #expect(waits.count == 1, "one wait, naming the first mirror: \(waits)")
            #expect(asked == 2 && nginx.requests().isEmpty, "the first mirror served the pack on its retry: \(faults.requests())")
            #expect(faults.bodyBytesSent("big.tar") == (try site.packSize()))
            #expect((last["url"] as? String)?.hasPrefix(first.absoluteString) == true, "\(last)")
        } else {
            #expect(waits.count == 2, "two waits, each naming the first mirror: \(waits)")
            #expect(asked == 3, "the first mirror was asked once and retried twice: \(faults.requests())")
            #expect(nginx.bodyBytesSent(path: "/big.tar") == (try site.packSize()), "the second mirror served the pack")
            #expect((last["url"] as? String)?.hasPrefix("http://127.0.0.1:\(nginx.port)/") == true, "\(last)")
        }
    }

    /// Without an index, a mirror that serves other bytes is found out by the pack's SHA-256; the pack is then fetched
    /// whole from one good source, and installed exact.
    @Test func aCorruptedMirrorIsMarkedBadAndThePackComesWholeFromAGoodOne() async throws {
        let site = try TestSite.random("mirror-corrupt", size: Self.size)
        let bad = try Fixtures.temporaryDirectory("mirror-corrupt-copy")
        var bytes = try Data(contentsOf: site.folder.appending(path: "big.tar"))
        let at = bytes.count * 7 / 10
        bytes[at] ^= 0xFF
        try bytes.write(to: bad.appending(path: "big.tar"))
        let corrupted = try NginxServer(root: bad)
        defer { corrupted.stop() }
        let good = try NginxServer(root: site.folder)
        defer { good.stop() }
        try site.editManifest { $0.mirrors = ["http://127.0.0.1:\(corrupted.port)/", "http://127.0.0.1:\(good.port)/"] }
        let queue = try Self.queue("mirror-corrupt-home")
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(site.manifestURL.path)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try await queue.settled(downloadID: id)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(download.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(corrupted.requests().count == 1, "the corrupted mirror is not asked again: \(corrupted.requests())")
        #expect(good.bodyBytesSent(path: "/big.tar") == (try site.packSize()), "the pack came whole from the good mirror")
    }

    /// With chunk hashes (an indexed tar of 16 MiB or more, installed chunk by chunk), a mirror that serves one wrong
    /// byte at 70% is caught at the window holding it: the chunks checked before it are kept, the rest comes from the
    /// good mirror, the corrupted one is not asked again, and the tree equals `bsdtar -xf` of the pack.
    @Test func aCorruptedMirrorIsCaughtByChunkAndTheRestComesFromAGoodOne() async throws {
        let (site, copy, at) = try Self.corruptedTarPack("mirror-chunk", percent: 70)
        let name = WriteOnceTests.packName(.tar)
        let packLength = try WriteOnceTests.length(site.appending(path: name))
        let corrupted = try NginxServer(root: copy)
        defer { corrupted.stop() }
        let good = try NginxServer(root: site)
        defer { good.stop() }
        let manifestURL = site.appending(path: "manifest.json")
        try Self.setMirrors(manifestURL, [corrupted.port, good.port])
        let queue = try Self.queue("mirror-chunk-home")
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifestURL.path)
        let id = try #require(try await queue.add(product: WriteOnceTests.product, from: manifest).downloads.first?.id)
        let download = try await queue.settled(downloadID: id)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try treeContents(try #require(download.contentURL)) == (try WriteOnceTests.reference(site, .tar, "mirror-chunk-ref")))
        let window = 1 << 20
        let fromBad = corrupted.bodyBytesSent(path: "/" + name)
        let fromGood = good.bodyBytesSent(path: "/" + name)
        // Caught within two windows of the bad byte (the next range downloads while the previous one is checked).
        #expect(fromBad <= at + 2 * window, "the corrupted mirror sent \(fromBad) bytes; the bad one is at \(at)")
        #expect(fromBad + fromGood <= packLength + 3 * window, "at most the windows around the bad byte fetched twice")
        // Checked chunk by chunk as the bytes arrive: the good mirror sends the rest from the bad chunk on (at most
        // 256 KiB, a chunk's largest, before the bad byte), not from the start of its range.
        #expect(fromGood <= packLength - at + (256 << 10) + (16 << 10), "the good mirror sent more than the rest: \(fromGood)")
        let afterSwitch = corrupted.requests().filter { $0.uri == "/" + name }.count
        #expect(afterSwitch > 0 && good.requests().contains { $0.uri == "/" + name })
    }

    /// A mirror that serves one wrong byte (at 70%, where the bad chunk ends its 1 MiB range, and at 62%, mid-range):
    /// `packs --json fetch` names, in the download event that moves to the good mirror, the pack bytes of the chunk that
    /// did not match (the bad byte among them) and how many bytes after it the client had received when it stopped: no
    /// more than the rest of its 1 MiB range. The corrupted mirror's own count (nginx's, socket buffers included) is
    /// printed beside it; it wrote no further than its range's end.
    @Test(arguments: [70, 62]) func theBadChunksPackBytesAndTheBytesReceivedPastItAreNamedInTheEvents(_ percent: Int) throws {
        let (site, copy, at) = try Self.corruptedTarPack("mirror-named", percent: percent)
        let name = WriteOnceTests.packName(.tar)
        let corrupted = try NginxServer(root: copy)
        defer { corrupted.stop() }
        let good = try NginxServer(root: site)
        defer { good.stop() }
        let manifestURL = site.appending(path: "manifest.json")
        try Self.setMirrors(manifestURL, [corrupted.port, good.port])
        let home = try Fixtures.temporaryDirectory("mirror-named-home")
        let fetched = try CLI.run(home: home, ["--json", "fetch", manifestURL.path, WriteOnceTests.product])
        #expect(fetched.status == 0, "\(fetched.stderr)")
        let messages = fetched.events.compactMap { ($0["error"] as? [String: Any])?["message"] as? String }
        let named = try #require(
            messages.first { $0.contains("does not match") }, "an event names the chunk that did not match: \(Set(messages))")
        #expect(named.contains("127.0.0.1/\(name)"), "the source is named: \(named)")
        let numbers = try #require(named.firstMatch(of: /pack bytes (\d+)\.\.<(\d+); (\d+) bytes after it received/), "\(named)")
        let (start, end, past) = (try #require(Int(numbers.1)), try #require(Int(numbers.2)), try #require(Int(numbers.3)))
        #expect(start <= at && at < end, "the bad byte \(at) is in the chunk named, \(start)..<\(end)")
        #expect(end - start <= 256 << 10, "one chunk: \(end - start) bytes")
        #expect(past < 1 << 20, "the client stopped within the bad chunk's range: \(past) bytes past it")
        let reached = try #require(corrupted.furthestByteSent(path: "/" + name))
        #expect(past <= reached - end, "the client received no more than the server wrote")
        print("bad chunk \(start)..<\(end); past its end: client \(past) B, server \(reached - end) B")
        #expect(reached - end <= 1 << 20, "the corrupted mirror wrote at most its 1 MiB window past the bad chunk: \(reached - end)")
    }

    /// A slow mirror listed first beside a fast one: the first pack starts on the slow one, the next on the fast one
    /// (never measured, so tried), and from then on every pack starts on the fastest measured; `packs sources` and
    /// ``DownloadQueue/sourceRanking()`` show the fast one first.
    @Test func theFastestMeasuredSourceIsTriedFirst() async throws {
        let site = try Self.catalog("mirror-rank", count: 4, size: 512 << 10)
        let slow = try NginxServer(root: site.folder, limitRate: 256 << 10)
        defer { slow.stop() }
        let fast = try NginxServer(root: site.folder)
        defer { fast.stop() }
        let manifestURL = site.folder.appending(path: "manifest.json")
        try Self.setMirrors(manifestURL, [slow.port, fast.port])
        let home = try Fixtures.temporaryDirectory("mirror-rank-home")
        let queue = try DownloadQueue(home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false))
        let manifest = try await LoadedManifest.load(manifestURL.path)
        var sources: [Int?] = []
        for number in 0..<4 {
            let id = try #require(try await queue.add(product: "com.example.p\(number)", from: manifest).downloads.first?.id)
            let download = try await queue.settled(downloadID: id)
            #expect(download.state == .finished, "\(download.error?.description ?? "")")
            #expect(download.source == "127.0.0.1/p\(number).tar")
            sources.append(download.url.port)
        }
        #expect(sources == [slow.port, fast.port, fast.port, fast.port], "the port each pack came from")
        #expect(slow.requests().map(\.uri) == ["/p0.tar"], "the slow mirror served the first pack only")
        let ranking = try queue.sourceRanking()
        #expect(ranking.map(\.origin) == ["http://127.0.0.1:\(fast.port)", "http://127.0.0.1:\(slow.port)"])
        await queue.close()
        let shown = try CLI.run(home: home, ["sources"])
        #expect(shown.status == 0, "\(shown.stderr)")
        #expect(shown.stdout.hasPrefix("1. http://127.0.0.1:\(fast.port)"), "\(shown.stdout)")
    }

    /// Eight packs added together on a fresh home, a slow mirror listed first: four downloads start at once with nothing
    /// measured, and only one probes each mirror (the other two spread, fewest in flight), so the slow mirror serves at
    /// most two packs; every pack that starts after the first batch starts on the fast one (bytes counted per server).
    @Test func downloadsStartingTogetherProbeTheSlowFirstMirrorOnceAndTheRestGoToTheFastOne() async throws {
        let count = 8
        let site = try Self.catalog("mirror-together", count: count, size: 512 << 10)
        let slow = try NginxServer(root: site.folder, limitRate: 256 << 10)
        defer { slow.stop() }
        let fast = try NginxServer(root: site.folder)
        defer { fast.stop() }
        let manifestURL = site.folder.appending(path: "manifest.json")
        try Self.setMirrors(manifestURL, [slow.port, fast.port])
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("mirror-together-home")),
            configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifestURL.path)
        let products = (0..<count).map { "com.example.p\($0)" }
        let downloads = try await queue.add(products: products, from: manifest).flatMap(\.downloads)
        #expect(downloads.count == count)
        for download in downloads {
            let settled = try await queue.settled(downloadID: download.id)
            #expect(settled.state == .finished, "\(settled.source): \(settled.error?.description ?? "")")
            let number = try #require(Int(settled.source.dropFirst("127.0.0.1/p".count).dropLast(".tar".count)))
            #expect(try Fixtures.sha256Hex(of: try #require(settled.contentURL).appending(path: "Contents/data.bin")) == site.data[number])
        }
        let packSize = try #require(
            try FileManager.default.attributesOfItem(atPath: site.folder.appending(path: "p0.tar").path)[.size] as? Int)
        let askedSlow = Set(slow.requests().map(\.uri))
        #expect(askedSlow.count <= 2, "the slow mirror was asked for \(askedSlow.sorted()): one probe and one spread, no more")
        let fromFast = (0..<count).filter {
            fast.bodyBytesSent(path: "/p\($0).tar") == packSize && slow.bodyBytesSent(path: "/p\($0).tar") == 0
        }
        #expect(fromFast.count >= count - 2, "packs served whole by the fast mirror alone: \(fromFast)")
        #expect(slow.bodyBytesSent() + fast.bodyBytesSent() <= count * packSize + 2 * packSize, "nothing fetched more than twice")
    }

    /// A transfer much slower than another source measured moves there from the kept bytes (aria2's feedback): the
    /// first pack measures the fast mirror; the second starts on the slow one (never measured, so tried) and moves.
    @Test func aSlowTransferMovesToAMuchFasterSourceFromTheKeptBytes() async throws {
        let size = 4 << 20
        let site = try Self.catalog("mirror-move", count: 2, size: size)
        let fast = try NginxServer(root: site.folder)
        defer { fast.stop() }
        let slow = try NginxServer(root: site.folder, limitRate: 256 << 10)
        defer { slow.stop() }
        let manifestURL = site.folder.appending(path: "manifest.json")
        try Self.setMirrors(manifestURL, [fast.port, slow.port])
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("mirror-move-home")),
            configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifestURL.path)
        for number in 0..<2 {
            let id = try #require(try await queue.add(product: "com.example.p\(number)", from: manifest).downloads.first?.id)
            let download = try await queue.settled(downloadID: id)
            #expect(download.state == .finished, "pack \(number): \(download.error?.description ?? "")")
            #expect(download.url.port == fast.port, "pack \(number) finished on the fast mirror: \(slow.requests()) \(fast.requests())")
            #expect(
                try Fixtures.sha256Hex(of: try #require(download.contentURL).appending(path: "Contents/data.bin")) == site.data[number])
        }
        let packSize = try #require(
            try FileManager.default.attributesOfItem(atPath: site.folder.appending(path: "p1.tar").path)[.size] as? Int)
        let fromSlow = slow.bodyBytesSent(path: "/p1.tar")
        let fromFast = fast.bodyBytesSent(path: "/p1.tar")
        #expect(fromSlow > 0 && fromSlow < packSize / 2, "the slow mirror sent a little before the move: \(fromSlow)")
        #expect(
            fast.requests().last?.range.map { $0 != "bytes=0-" && $0.hasPrefix("bytes=") } == true, "moved by range: \(fast.requests())")
        #expect(fromSlow + fromFast <= packSize + (64 << 10), "the kept bytes were not fetched again: \(fromSlow) + \(fromFast)")
    }

    /// Every source down: the download fails naming each source's last error, the bytes kept; once a source is back,
    /// a resume finishes from them, and no byte was fetched twice.
    @Test func allSourcesDownFailsNamingEachKeepsTheBytesAndResumesLater() async throws {
        let site = try TestSite.random("mirror-down", size: Self.size)
        let down = Atomic<Bool>(false)
        let servedOnce = Atomic<Bool>(false)
        let first = try FaultServer(root: site.folder) { _ in
            // The first answer gives 300,000 bytes and breaks; then the server is down until told otherwise.
            if !servedOnce.exchange(true, ordering: .relaxed) { return nil }
            return down.load(ordering: .relaxed) ? 503 : nil
        }
        defer { first.stop() }
        let second = try FaultServer(root: site.folder) { _ in down.load(ordering: .relaxed) ? 503 : nil }
        defer { second.stop() }
        try site.editManifest {
            $0.mirrors = [first.url("", fault: .resetOnce(afterBytes: 300_000)).absoluteString, second.url("").absoluteString]
        }
        let queue = try Self.queue("mirror-down-home")
        defer { queue.close() }
        // Read over http from the second mirror's folder, so the manifest's own place is that mirror (no third source).
        let manifest = try await LoadedManifest.load(second.url("manifest.json").absoluteString)
        down.store(true, ordering: .relaxed)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let failed = try await queue.settled(downloadID: id)
        #expect(failed.state == .failed)
        let message = failed.error?.message ?? ""
        #expect(message.contains("Every source"), "\(message)")
        #expect(message.contains("127.0.0.1/f/reset-once/300000/big.tar") && message.contains("127.0.0.1/f/none/big.tar"), "\(message)")
        #expect(failed.error?.httpStatus == 503)
        #expect(failed.bytesReceived >= 300_000, "the bytes are kept: \(failed.bytesReceived)")
        down.store(false, ordering: .relaxed)
        _ = try queue.resume([id])
        let finished = try await queue.settled(downloadID: id)
        #expect(finished.state == .finished, "\(finished.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(first.bodyBytesSent("big.tar") + second.bodyBytesSent("big.tar") == (try site.packSize()), "no byte fetched twice")
    }

    /// The receipt goes to sources of the manifest's origin only, unless the manifest says it goes to all.
    @Test(arguments: [false, true]) func credentialsGoToMirrorsOfTheManifestsOriginOnly(_ toAll: Bool) async throws {
        let site = try TestSite.random("mirror-credentials-\(toAll)", size: Self.size)
        let seenAtOrigin = Mutex<[String?]>([])
        let seenElsewhere = Mutex<[String?]>([])
        let origin = try FaultServer(root: site.folder) { header in
            seenAtOrigin.withLock { $0.append(header) }
            return nil
        }
        defer { origin.stop() }
        let other = try FaultServer(root: site.folder) { header in
            seenElsewhere.withLock { $0.append(header) }
            return nil
        }
        defer { other.stop() }
        try site.editManifest {
            $0.mirrors = [origin.url("", fault: .resetAfter(bytes: 300_000)).absoluteString, other.url("").absoluteString]
            $0.credentialsToAllSources = toAll ? true : nil
        }
        let queue = try Self.queue("mirror-credentials-home-\(toAll)")
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(origin.url("manifest.json").absoluteString)
        let transaction = try await queue.add(product: "com.example.big", from: manifest, receipt: "secret-receipt-token")
        let id = try #require(transaction.downloads.first?.id)
        let download = try await queue.settled(downloadID: id)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(other.bodyBytesSent("big.tar") > 0, "the other origin's mirror served the rest")
        #expect(seenAtOrigin.withLock { $0 }.contains("Bearer secret-receipt-token"), "the manifest's origin got the receipt")
        let elsewhere = seenElsewhere.withLock { $0 }
        if toAll {
            #expect(elsewhere.allSatisfy { $0 == "Bearer secret-receipt-token" }, "\(elsewhere)")
        } else {
            #expect(elsewhere.allSatisfy { $0 == nil }, "no credential reached another origin: \(elsewhere)")
        }
        let shown = download.error.map { "\($0)" } ?? ""
        #expect(!shown.contains("secret-receipt-token"), "the receipt is never shown")
    }

    /// Killed while the second mirror delivers, after the first failed: `resume` goes on at the second mirror from the
    /// kept bytes.
    @Test func killedMidFailoverResumesAtTheSecondMirror() throws {
        let site = try TestSite.random("mirror-kill", size: 4 << 20)
        let faults = try FaultServer(root: site.folder)
        defer { faults.stop() }
        let nginx = try NginxServer(root: site.folder, limitRate: 1 << 20)
        defer { nginx.stop() }
        try site.editManifest {
            $0.mirrors = [
                faults.url("", fault: .status(503, times: 1000, retryAfter: nil)).absoluteString, "http://127.0.0.1:\(nginx.port)/",
            ]
        }
        let home = try Fixtures.temporaryDirectory("mirror-kill-home")
        let killed = try runAndKill(home: home, ["fetch", site.manifestURL.path, "com.example.big"]) { event in
            event["phase"] as? String == "downloading" && (event["progress"] as? Double ?? 0) > 0.4
        }
        #expect(killed, "the fetch was killed mid-download")
        let before = nginx.requests().count
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let after = Array(nginx.requests().dropFirst(before))
        #expect(
            after.first?.range?.hasPrefix("bytes=") == true && after.first?.range != "bytes=0-",
            "resumed by range at the second mirror: \(after)")
        let content = try CLI.run(home: home, ["--json", "content"])
        let path = try #require(content.events.first?["contentURL"] as? String)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: path).appending(path: "Contents/data.bin")) == site.dataSHA256)
        // At most the bytes not yet synced when it was killed are fetched twice.
        #expect(nginx.bodyBytesSent(path: "/big.tar") <= (try site.packSize()) + (2 << 20))
    }
}
