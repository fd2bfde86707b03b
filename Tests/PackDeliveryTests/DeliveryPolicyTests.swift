import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Delivery policies, ensureAvailable and priorities end to end: real nginx counting what it sent, the library and the
/// `packs` binary.
@Suite(.timeLimit(.minutes(4))) struct DeliveryPolicyTests {
    /// A product `com.example.game` of three tar packs: `a.tar` (essential, the product's identifier), `b.tar`
    /// (`com.example.game.b`) and `c.tar` (`com.example.game.c`), with the policies given, of `sizes` bytes of
    /// random data each.
    static func site(_ label: String, delivery: [String: DeliveryPolicy], sizes: [Int] = [64 << 10, 64 << 10, 64 << 10]) throws -> URL {
        let site = try Fixtures.temporaryDirectory(label)
        for (name, size) in zip(["a", "b", "c"], sizes) {
            let content = try Fixtures.temporaryDirectory("\(label)-\(name)")
            try FileManager.default.createDirectory(at: content.appending(path: "Contents"), withIntermediateDirectories: true)
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(name).bin"), size: size)
            try PackWriter.write(
                folder: content, to: site.appending(path: "\(name).tar"), format: .tar,
                contentInfo: (productIdentifier: "com.example.game", contentVersion: "1"))
        }
        try ManifestBuilder.write(folder: site, signing: nil, delivery: delivery)
        return site
    }

    static let prefetch = "com.example.game.b"
    static let onDemand = "com.example.game.c"

    /// A purchase is delivered (and finishable) once its essential pack is in, while its prefetch pack still downloads;
    /// the prefetch pack lands after the finish; the on-demand pack is not fetched (0 bytes at nginx) until
    /// ensureAvailable asks for it; an installed pack is then handed out with no request at all.
    @Test func eachPolicyDeliversAsItSaysAndEnsureAvailableFetchesOnlyWhatIsMissing() async throws {
        let site = try Self.site(
            "policy-site", delivery: [Self.prefetch: .prefetch, Self.onDemand: .onDemand], sizes: [64 << 10, 3 << 20, 256 << 10])
        let nginx = try NginxServer(root: site, limitRate: 1 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("policy-home")
        let queue = try await DownloadQueue.open(home: Home(folder: home))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        #expect(manifest.manifest.products[0].contents.map(\.deliveryPolicy) == [.essential, .prefetch, .onDemand])
        let transaction = try await queue.add(product: "com.example.game", from: manifest)
        #expect(transaction.downloads.map(\.priority) == [.essential, .prefetch, .essential])
        #expect(transaction.downloads[2].state == .paused && transaction.downloads[2].pauseReason == .onDemand)

        let delivered = try await queue.delivered(transactionID: transaction.id)
        #expect(delivered.isFinishable)
        let prefetchID = transaction.downloads[1].id
        let prefetchNow = try #require(try queue.downloads([prefetchID]).first)
        #expect(prefetchNow.state != .finished, "the 3 MiB prefetch pack (1 MiB/s) is still on its way when the purchase is delivered")
        try await queue.finish(delivered.id)
        // The prefetch pack goes on after the finish and is reported as it lands.
        let landed = try await queue.settled(downloadID: prefetchID)
        #expect(landed.state == .finished, "\(landed.error.map { "\($0)" } ?? "")")
        #expect(nginx.bodyBytesSent(path: "/b.tar") == Int(landed.contentLength))
        #expect(nginx.bodyBytesSent(path: "/c.tar") == 0, "the on-demand pack was not fetched")
        #expect(!nginx.requests().contains { $0.uri.hasPrefix("/c.tar") })

        // Asked for: fetched ahead of everything, once.
        let raised = Task {
            var seen: Download?
            for await event in queue.events() {
                if case .priorityChanged(let download) = event {
                    seen = download
                    break
                }
            }
            return seen
        }
        try await Task.sleep(for: .milliseconds(100))
        let folders = try await queue.ensureAvailable(contentIDs: [Self.onDemand])
        #expect(folders.count == 1)
        #expect(FileManager.default.fileExists(atPath: folders[0].appending(path: "Contents/c.bin").path))
        let reported = await raised.value
        #expect(reported?.contentIdentifier == Self.onDemand && reported?.priority == .userInitiated, "\(String(describing: reported))")
        let sent = nginx.bodyBytesSent(path: "/c.tar")
        let asked = try #require(try queue.downloads([transaction.downloads[2].id]).first)
        #expect(sent > 0 && sent == Int(asked.contentLength))

        // Installed: handed out without a request.
        let requests = nginx.requests().count
        let again = try await queue.ensureAvailable(productIDs: ["com.example.game"])
        #expect(again.count == 3)
        #expect(again[2] == folders[0])
        #expect(nginx.requests().count == requests, "no request for installed packs")
    }

    /// Cancelling the task that awaits ensureAvailable pauses the download it started, its bytes kept; asking again
    /// finishes it from those bytes (a Range request).
    @Test func cancellingEnsureAvailablePausesItsDownloadKeepingTheBytes() async throws {
        let site = try Self.site("cancel-site", delivery: [Self.onDemand: .onDemand], sizes: [64 << 10, 64 << 10, 3 << 20])
        let nginx = try NginxServer(root: site, limitRate: 1 << 20)
        defer { nginx.stop() }
        let queue = try await DownloadQueue.open(home: Home(folder: try Fixtures.temporaryDirectory("cancel-home")))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let transaction = try await queue.add(product: "com.example.game", from: manifest)
        _ = try await queue.delivered(transactionID: transaction.id)
        let id = transaction.downloads[2].id
        let asking = Task { try await queue.ensureAvailable(contentIDs: [Self.onDemand]) }
        _ = try MeteredTests.waitFor(queue, id, "the on-demand pack downloading") { $0.state == .active && $0.bytesReceived > 0 }
        asking.cancel()
        do {
            _ = try await asking.value
            Issue.record("ensureAvailable returned though its task was cancelled")
        } catch let error as PackDeliveryError {
            #expect(error.code == .cancelled, "\(error)")
        }
        let paused = try MeteredTests.waitFor(queue, id, "paused by the cancel") { $0.state == .paused }
        #expect(paused.pauseReason == .user && paused.bytesReceived > 0 && paused.bytesReceived < paused.contentLength)
        let folders = try await queue.ensureAvailable(contentIDs: [Self.onDemand])
        #expect(FileManager.default.fileExists(atPath: folders[0].appending(path: "Contents/c.bin").path))
        let requests = nginx.requests().filter { $0.uri.hasPrefix("/c.tar") }
        #expect(requests.count == 2 && requests[1].range.map { !$0.hasPrefix("bytes=0-") } == true, "\(requests)")
    }

    /// With one slot, a restore recorded while a purchase's essential pack downloads starts before the purchase's
    /// prefetch packs that wait (nginx's order of requests).
    @Test func aRestoreGoesAheadOfQueuedPrefetchWork() async throws {
        let site = try Fixtures.temporaryDirectory("restore-order-site")
        let names = ["a", "b", "c", "d"]
        for (index, name) in names.enumerated() {
            let content = try Fixtures.temporaryDirectory("restore-order-\(name)")
            try FileManager.default.createDirectory(at: content.appending(path: "Contents"), withIntermediateDirectories: true)
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(name).bin"), size: index == 0 ? 2 << 20 : 64 << 10)
            try PackWriter.write(
                folder: content, to: site.appending(path: "\(name).tar"), format: .tar,
                contentInfo: (productIdentifier: "com.example.game", contentVersion: "1"))
        }
        for name in ["r1", "r2"] {
            let content = try Fixtures.temporaryDirectory("restore-order-\(name)")
            try FileManager.default.createDirectory(at: content.appending(path: "Contents"), withIntermediateDirectories: true)
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(name).bin"), size: 64 << 10)
            try PackWriter.write(
                folder: content, to: site.appending(path: "\(name).tar"), format: .tar,
                contentInfo: (productIdentifier: "com.example.\(name)", contentVersion: "1"))
        }
        try ManifestBuilder.write(
            folder: site, signing: nil,
            delivery: ["com.example.game.b": .prefetch, "com.example.game.c": .prefetch, "com.example.game.d": .prefetch])
        let nginx = try NginxServer(root: site, limitRate: 1 << 20)
        defer { nginx.stop() }
        let queue = try await DownloadQueue.open(
            home: Home(folder: try Fixtures.temporaryDirectory("restore-order-home")), configuration: .init(concurrency: 1))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let purchase = try await queue.add(product: "com.example.game", from: manifest)
        // nginx logs a request when it ends: the essential pack is followed from the queue instead.
        _ = try MeteredTests.waitFor(queue, purchase.downloads[0].id, "the essential pack downloading") {
            $0.state == .active && $0.bytesReceived > 0
        }
        let restores = try await queue.add(products: ["com.example.r1", "com.example.r2"], from: manifest, kind: .restored)
        for transaction in restores { _ = try await queue.delivered(transactionID: transaction.id) }
        for download in purchase.downloads { _ = try await queue.settled(downloadID: download.id) }
        let order = nginx.requests().map(\.uri).filter { $0.hasSuffix(".tar") }
        #expect(order == ["/a.tar", "/r1.tar", "/r2.tar", "/b.tar", "/c.tar", "/d.tar"], "\(order)")
    }

    /// `packs manifest --delivery`, `packs fetch` (exits once the essential pack is in, the on-demand one never
    /// fetched), `packs use` (fetches the on-demand pack, prints its folder; a second time without a request),
    /// `packs resume` (the prefetch pack left paused by the fetch lands), and priority in `status --json`.
    @Test func theCommandLineFetchesEssentialsAndUseFetchesOnDemand() throws {
        let site = try Self.site("policy-cli-site", delivery: [:])
        let made = try Fixtures.run(
            CLI.binary, ["manifest", site.path, "--delivery", "\(Self.prefetch)=prefetch", "--delivery", "\(Self.onDemand)=onDemand"])
        #expect(made.status == 0, "\(made.stderr)")
        let manifestText = try String(contentsOf: site.appending(path: "manifest.json"), encoding: .utf8)
        #expect(manifestText.contains("\"delivery\" : \"onDemand\"") && manifestText.contains("\"delivery\" : \"prefetch\""))
        let bad = try Fixtures.run(CLI.binary, ["manifest", site.path, "--delivery", "nope=onDemand"])
        #expect(bad.status == 64, "an unknown pack is a usage error: \(bad.stderr)")

        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("policy-cli-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let fetch = try CLI.run(home: home, ["--json", "fetch", manifestURL, "com.example.game", "--no-finish"])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(nginx.bodyBytesSent(path: "/c.tar") == 0, "the on-demand pack is not fetched")
        let status = try CLI.run(home: home, ["--json", "status"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let transaction = try #require((object["transactions"] as? [[String: Any]])?.first)
        #expect(transaction["finishable"] as? Bool == true, "finishable once the essential pack is in")
        let downloads = try #require(transaction["downloads"] as? [[String: Any]])
        #expect(downloads.map { $0["delivery"] as? String } == ["essential", "prefetch", "onDemand"])
        #expect(downloads.map { $0["priority"] as? String } == ["essential", "prefetch", "essential"])
        #expect(downloads[2]["pauseReason"] as? String == "onDemand")
        #expect(try CLI.run(home: home, ["finish", try #require(transaction["id"] as? String)]).status == 0)

        let use = try CLI.run(home: home, ["use", "com.example.game", Self.onDemand])
        #expect(use.status == 0, "\(use.stderr)")
        let path = use.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(FileManager.default.fileExists(atPath: path + "/Contents/c.bin"), "printed: \(use.stdout)")
        #expect(nginx.bodyBytesSent(path: "/c.tar") > 0)
        let requests = nginx.requests().count
        let again = try CLI.run(home: home, ["use", "com.example.game", Self.onDemand])
        #expect(again.status == 0 && again.stdout == use.stdout)
        #expect(nginx.requests().count == requests, "an installed pack is printed without a request")

        // The prefetch pack, if the fetch left it, lands with resume; then every pack of the product is in place.
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let all = try CLI.run(home: home, ["use", "com.example.game"])
        #expect(all.status == 0 && all.stdout.split(separator: "\n").count == 3, "\(all.stdout) \(all.stderr)")
        #expect(try CLI.run(home: home, ["use", "com.example.nothing"]).status == 65, "an unknown product, as fetch says it")

        // Nothing recorded in a new home: --manifest buys the product, then the pack asked for is fetched and printed.
        let fresh = try Fixtures.temporaryDirectory("policy-cli-fresh")
        #expect(
            try CLI.run(home: fresh, ["use", "com.example.game", Self.onDemand]).status == 64, "nothing recorded, no manifest: notInstalled"
        )
        let sentBefore = nginx.bodyBytesSent(path: "/c.tar")
        let bought = try CLI.run(home: fresh, ["use", "com.example.game", Self.onDemand, "--manifest", manifestURL])
        #expect(bought.status == 0, "\(bought.stderr)")
        #expect(FileManager.default.fileExists(atPath: bought.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + "/Contents/c.bin"))
        #expect(nginx.bodyBytesSent(path: "/c.tar") > sentBefore)
    }
}
