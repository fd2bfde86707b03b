import Foundation
import PackTestSupport
import Synchronization
import Testing

@_spi(Testing) @testable import PackDelivery

/// Launch day for a preload (issue 46), with a real `packs serve --keys` whose clock, and the client's, read
/// `PACKS_TEST_CLOCK_FILE`: a key request whose credentials expired renews them through the credential provider, and
/// `packs agent` installs a preload handed to it before the release once the release passes.
@Suite(.serialized, .timeLimit(.minutes(3))) struct PreloadLaunchTests {
    /// A key request refused with 401 (the token expired) asks the credential provider again with `refused` set, as a
    /// pack request's 401 does, and asks for the key once more with the fresh token: the preload installs, with one 401
    /// and one 200 for the key in the server's log, and the pack's bytes fetched once.
    @Test func aKeyRequestRefusedWith401RenewsTheCredentialsAndInstalls() async throws {
        let setup = try await KeyServerTests.Setup("launch-renew")
        defer { setup.remove() }
        try setup.setClock("2026-12-01T00:00:01Z")
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await PreloadDeliveryTests.manifest(server, receipt: receipt)
        // The pack goes with the receipt; the key first with an expired token, then with what a renewal gives.
        let asked = Mutex<[Bool]>([])
        let (queue, homeFolder) = try await PreloadDeliveryTests.queue("launch-renew-home", clock: setup.clock) { request in
            guard request.url.path.hasPrefix("/keys/") else { return ["Authorization: Bearer \(receipt)"] }
            asked.withLock { $0.append(request.refused) }
            return ["Authorization: Bearer \(request.refused ? receipt : "expired.token.0")"]
        }
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest)
        let id = try #require(bought.downloads.first?.id)
        try await waitUntilAsync("the preload to install after a renewed key request", timeout: 60) {
            let download = try queue.downloads([id])[0]
            if let error = download.error { throw error }
            return download.state == .finished
        }
        let installed = try #require(try queue.downloads([id])[0].contentURL)
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")))
        #expect(asked.withLock { $0 } == [false, true], "the provider asked once, then once more after the 401")
        #expect(queue.installer.keyring.heldKeyIDs.isEmpty, "the key is dropped once installed")

        server.stop()
        let keyLines = PreloadDeliveryTests.keyRequests(server, setup)
        #expect(keyLines.count == 2 && keyLines[0].contains(" 401 ") && keyLines[1].contains(" 200 "), "\(keyLines)")
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
    }

    /// Without a renewal the second 401 stays a refusal: a provider that gives the same expired token again leaves the
    /// download `paused(.awaitingRelease)` with `preloadKeyRefused` (HTTP 401), its ciphertext kept, after two requests.
    @Test func aSecond401IsARefusal() async throws {
        let setup = try await KeyServerTests.Setup("launch-renew-refused")
        defer { setup.remove() }
        try setup.setClock("2026-12-01T00:00:01Z")
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await PreloadDeliveryTests.manifest(server, receipt: receipt)
        let (queue, homeFolder) = try await PreloadDeliveryTests.queue("launch-renew-refused-home", clock: setup.clock) { request in
            ["Authorization: Bearer \(request.url.path.hasPrefix("/keys/") ? "expired.token.0" : receipt)"]
        }
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest)
        let id = try #require(bought.downloads.first?.id)
        try await waitUntilAsync("the second 401 to be the download's error", timeout: 60) {
            try queue.downloads([id])[0].error != nil
        }
        let download = try queue.downloads([id])[0]
        #expect(download.state == .paused && download.pauseReason == .awaitingRelease)
        #expect(download.error?.code == .preloadKeyRefused && download.error?.httpStatus == 401)
        #expect(!(download.error?.description.contains("expired.token.0") ?? true), "no credential in the error")
        try await Task.sleep(for: .seconds(2))
        let keyLines = PreloadDeliveryTests.keyRequests(server, setup)
        #expect(keyLines.count == 2 && keyLines.allSatisfy { $0.contains(" 401 ") }, "\(keyLines)")
        #expect(
            try PreloadDeliveryTests.digests(under: homeFolder).contains(
                try Fixtures.sha256Hex(of: setup.site.appending(path: "forest.tar.zst"))), "the ciphertext is kept")
    }

    /// A preload recorded in-process before its release (`packs fetch` exits 75, its ciphertext kept, the receipt stored
    /// with the transaction) is taken by `packs agent` when it serves the home (`POST /v1/homes`, as a library's queue
    /// hands its downloads over), and the agent does not stop when idle while it holds it (`--idle-timeout 1`, no client
    /// for 3 s); once the release passes on both clocks the agent asks for the key with the stored receipt, decrypts and
    /// installs with no pack byte fetched again, and a `packs watch` client sees it finish; `packs verify` passes.
    @Test func theAgentInstallsAPreloadWaitingForItsRelease() async throws {
        let setup = try await KeyServerTests.Setup("launch-agent")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receiptFile = setup.root.appending(path: "receipt")
        try Data(try await setup.receipt("com.example.forest").utf8).write(to: receiptFile)
        let folder = setup.root.appending(path: "agent")
        let environment = ["PACKS_TEST_CLOCK_FILE": setup.clock.path]
        let home = folder.appending(path: "home")
        let early = try CLI.run(
            home: home,
            ["fetch", server.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest", "--receipt", receiptFile.path],
            timeout: 120, environment: environment)
        #expect(early.status == 75, "held for its release: \(early.status) \(early.stderr)")

        // An idle timeout of 1 s: an agent that holds a preload for its release is not idle.
        let agent = try AgentProcess(folder: folder, arguments: ["--idle-timeout", "1"], environment: environment)
        defer { _ = try? agent.stop() }
        let served = try agent.request("POST", "/v1/homes", body: #"{"home": "\#(home.path)"}"#)
        #expect(served.status == 200, "\(served.body)")
        let downloads = {
            let answer = try agent.request("GET", "/v1/downloads?home=\(home.path)")
            return ((answer.json["transactions"] as? [[String: Any]]) ?? []).flatMap { ($0["downloads"] as? [[String: Any]]) ?? [] }
        }
        try waitUntil("the agent holding the preload paused for its release", timeout: 30) {
            try downloads().contains { $0["state"] as? String == "paused" && $0["pauseReason"] as? String == "awaitingRelease" }
        }
        let id = try #require(try downloads().first?["id"] as? String)
        try await Task.sleep(for: .seconds(3))
        #expect(agent.isRunning, "no client connected for 3 s: the agent still runs, holding the preload for its release")
        #expect(PreloadDeliveryTests.keyRequests(server, setup).isEmpty, "no key request before the release")
        let (watch, output) = try AgentCLITests.startWatch(["--json", "watch", "--socket", agent.socket], folder: folder)
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        try waitUntil("the watcher on the event stream", timeout: 20) {
            try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1
        }

        try setup.setClock("2026-12-01T00:00:01Z")
        let lines = {
            (try? String(contentsOf: output, encoding: .utf8))?.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            } ?? []
        }
        try waitUntil("the watcher showing the preload installed by the agent after its release", timeout: 90) {
            lines().contains { $0["id"] as? String == id && $0["state"] as? String == "finished" }
        }
        let verify = try CLI.run(home: home, ["verify", "com.example.forest"], timeout: 60)
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
        let content = try CLI.run(home: home, ["content", "com.example.forest"], timeout: 30)
        let installed = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")), "\(content.stderr)")
        server.stop()
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
        let keyLines = PreloadDeliveryTests.keyRequests(server, setup)
        #expect(keyLines.count == 1 && keyLines[0].contains(" 200 "), "\(keyLines)")
    }

    /// `packs fetch --detach --receipt` hands the receipt to the agent with the purchase: the agent reads the manifest
    /// with it (a server that checks receipts lists only what the receipt names), fetches the preload with it, and
    /// asks for the key with it at the release, after the client has gone. The receipt appears in no output, log or
    /// status. Without `--receipt`, the same detached fetch is refused: the server refuses the agent the manifest.
    @Test func aDetachedFetchCarriesItsReceiptToTheAgent() async throws {
        let setup = try await KeyServerTests.Setup("launch-detach")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let token = try await setup.receipt("com.example.forest")
        let receiptFile = setup.root.appending(path: "receipt")
        try Data(token.utf8).write(to: receiptFile)
        let folder = setup.root.appending(path: "agent")
        let environment = ["PACKS_TEST_CLOCK_FILE": setup.clock.path]
        let agent = try AgentProcess(folder: folder, environment: environment)
        defer { _ = try? agent.stop() }
        let home = folder.appending(path: "home")
        let manifest = server.baseURL.appending(path: "manifest.json").absoluteString

        let without = try CLI.run(
            home: home, ["fetch", "--detach", "--socket", agent.socket, manifest, "com.example.forest"], timeout: 60,
            environment: environment)
        #expect(without.status == 65 && without.stderr.contains("401"), "\(without.status) \(without.stderr)")

        let detached = try CLI.run(
            home: home,
            ["--json", "fetch", "--detach", "--socket", agent.socket, manifest, "com.example.forest", "--receipt", receiptFile.path],
            timeout: 60, environment: environment)
        #expect(detached.status == 0, "\(detached.stderr)")
        let id = try #require((detached.events.first?["downloads"] as? [String])?.first, "\(detached.stdout)")
        let status = { try agent.request("GET", "/v1/downloads?home=\(home.path)").body }
        try waitUntil("the agent holding the preload's ciphertext for its release", timeout: 60) {
            try status().contains("awaitingRelease")
        }
        try setup.setClock("2026-12-01T00:00:01Z")
        // Finished, its transaction too (the agent finishes what it fetches): the content is in place.
        try waitUntil("the agent installing the preload after its release", timeout: 90) {
            FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.forest/Contents/data.bin").path)
        }
        let content = try CLI.run(home: home, ["content", "com.example.forest"], timeout: 30)
        let installed = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")), "\(content.stderr)")
        let keyLines = PreloadDeliveryTests.keyRequests(server, setup)
        #expect(keyLines.count == 1 && keyLines[0].contains(" 200 "), "\(keyLines)")
        let everything = [detached.stdout, detached.stderr, without.stderr, agent.log, try status(), id].joined(separator: "\n")
        #expect(!everything.contains(token), "the receipt is never shown")
    }

    /// A release needs room for its files, not for a plain pack besides: a preload released onto a disk (a tmpfs) too
    /// full for its files is paused for space (`insufficientStorage`, saying the bytes needed and available), its
    /// ciphertext kept, no plaintext written and nothing installed; once there is room for the files and the margin
    /// (but not for a plain copy of the pack too), it installs on its own, decrypting as it unpacks.
    @Test(.enabled(if: Tmpfs.available, "mounting a tmpfs needs root"))
    func aReleaseOntoAFullDiskPausesForSpaceWithItsCiphertextKept() async throws {
        let setup = try await KeyServerTests.Setup("launch-full")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await PreloadDeliveryTests.manifest(server, receipt: receipt)
        let disk = try Tmpfs(megabytes: 16)
        var configuration = DownloadQueue.Configuration()
        configuration.clock = PreloadDeliveryTests.clock(setup.clock)
        let queue = try await DownloadQueue.open(home: Home(folder: disk.folder), configuration: configuration)
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await PreloadDeliveryTests.waitForRelease(queue, id)
        let waiting = try queue.downloads([id])[0]
        let description = try #require(try PreloadPack.description(of: setup.site.appending(path: "forest.tar.zst")))
        let unpacked = waiting.unpackedLength ?? waiting.contentLength
        disk.fill(leaving: unpacked / 2)

        try setup.setClock("2026-12-01T00:00:01Z")
        try await waitUntilAsync("the released preload to pause for space", timeout: 60) {
            try queue.downloads([id])[0].pauseReason == .insufficientStorage
        }
        let paused = try queue.downloads([id])[0]
        #expect(paused.state == .paused && paused.contentURL == nil)
        #expect(paused.error?.code == .insufficientStorage && (paused.error?.neededBytes ?? 0) >= unpacked)
        let ciphertext = try Fixtures.sha256Hex(of: setup.site.appending(path: "forest.tar.zst"))
        let held = try PreloadDeliveryTests.digests(under: disk.folder)
        #expect(held.contains(ciphertext), "the ciphertext is kept")
        #expect(!held.contains(description.plain.sha256), "no plain pack written")
        #expect(PreloadFetchTests.plaintextFiles(disk.folder).isEmpty, "\(PreloadFetchTests.plaintextFiles(disk.folder))")
        #expect(!FileManager.default.fileExists(atPath: disk.folder.appending(path: "Caches/com.example.forest").path), "nothing installed")

        // Room for the unpacked files and the margin, not for the plain pack besides.
        disk.unfill()
        disk.fill(leaving: unpacked + SpaceCheck.margin + waiting.contentLength / 2)
        try await waitUntilAsync("the preload to install once there is room for its files", timeout: 60) {
            try queue.downloads([id])[0].state == .finished
        }
        let installed = try #require(try queue.downloads([id])[0].contentURL)
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")))
        server.stop()
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
    }
}
