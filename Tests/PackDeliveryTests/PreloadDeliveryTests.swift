import Foundation
import PackTestSupport
import Synchronization
import Testing

@_spi(Testing) @testable import PackDelivery

/// A preload end to end (issue 46): the queue fetches the encrypted pack from `packs serve --keys`, keeps it encrypted
/// and reports it `paused(.awaitingRelease)` while the key server refuses the key (its clock before the release, through
/// `PACKS_TEST_CLOCK_FILE`); once the release date passes it gets the key with the transaction's receipt, decrypts and
/// installs without fetching a pack byte again, and the transaction can be finished.
@Suite(.serialized, .timeLimit(.minutes(3))) struct PreloadDeliveryTests {
    /// The SHA-256 of every regular file under `folder`.
    static func digests(under folder: URL) throws -> Set<String> {
        var result = Set<String>()
        guard let walker = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: [.isRegularFileKey]) else {
            return result
        }
        for case let url as URL in walker where (try? url.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true {
            if let digest = try? Fixtures.sha256Hex(of: url) { result.insert(digest) }
        }
        return result
    }

    /// The clock a queue reads release dates from: the date written in `file` (as `PACKS_TEST_CLOCK_FILE` does for the CLI).
    static func clock(_ file: URL) -> @Sendable () -> Date {
        {
            let text = (try? String(contentsOf: file, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            return text.flatMap(Manifest.Content.Preload.date) ?? Date()
        }
    }

    /// A queue in a new home whose clock reads `clock`, with `credentials` as its credential provider.
    static func queue(
        _ label: String, clock: URL, credentials: CredentialProvider? = nil
    ) async throws -> (DownloadQueue, URL) {
        let homeFolder = try Fixtures.temporaryDirectory(label)
        var configuration = DownloadQueue.Configuration()
        configuration.clock = Self.clock(clock)
        configuration.credentials = credentials
        return (try await DownloadQueue.open(home: Home(folder: homeFolder), configuration: configuration), homeFolder)
    }

    /// The server's manifest, read with `receipt`.
    static func manifest(_ server: PackServeProcess, receipt: String) async throws -> LoadedManifest {
        try await LoadedManifest.load(
            server.baseURL.appending(path: "manifest.json").absoluteString,
            options: TransferOptions(headers: ["Authorization: Bearer \(receipt)"]))
    }

    /// Waits until download `id` of `queue` is paused awaiting its key's release.
    static func waitForRelease(_ queue: DownloadQueue, _ id: String) async throws {
        try await waitUntilAsync("the preload to pause awaiting its release", timeout: 60) {
            try queue.downloads([id])[0].pauseReason == .awaitingRelease
        }
    }

    /// The request log's lines for the key.
    static func keyRequests(_ server: PackServeProcess, _ setup: KeyServerTests.Setup) -> [Substring] {
        server.log.split(separator: "\n").filter { $0.contains("/keys/\(setup.key.keyID)") }
    }

    /// A preload fetched after its release: its install notes the key wanted, then pauses for it. A tick that comes
    /// between the two (here the install is held 1.5 s there, three ticks) must not forget the download: the key is
    /// asked for once it is paused, and it installs. (It stalled, paused for a key nobody asked for, when a tick fell
    /// in that gap: seen in a run of a 1 GiB release under `perf record`.)
    @Test func aTickBetweenWantingTheKeyAndPausingForItDoesNotStallThePreload() async throws {
        let setup = try await KeyServerTests.Setup("preload-gap")
        defer { setup.remove() }
        try setup.setClock("2026-12-01T00:00:01Z")
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await Self.manifest(server, receipt: receipt)
        let homeFolder = try Fixtures.temporaryDirectory("preload-gap-home")
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        final class Once: Sendable { let done = Atomic<Bool>(false) }
        let held = Once()
        var configuration = DownloadQueue.Configuration()
        configuration.clock = Self.clock(setup.clock)
        configuration.installHook = { step in
            if step == .awaitingKey, !held.done.exchange(true, ordering: .relaxed) { Thread.sleep(forTimeInterval: 1.5) }
        }
        let queue = try await DownloadQueue.open(home: Home(folder: homeFolder), configuration: configuration)
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await waitUntilAsync("the released preload to install (paused for a key nobody asks for if not)", timeout: 60) {
            try queue.downloads([id])[0].state == .finished
        }
        let wasHeld = held.done.load(ordering: .relaxed)
        #expect(wasHeld, "the install was held between wanting the key and pausing for it")
        let installed = try #require(try queue.downloads([id])[0].contentURL)
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")))
        let keyLines = Self.keyRequests(server, setup)
        #expect(keyLines.count == 1 && keyLines[0].contains(" 200 "), "\(keyLines)")
        #expect(queue.installer.keyring.heldKeyIDs.isEmpty && !queue.installer.keyring.isWaiting)
    }

    @Test func aPreloadWaitsForItsReleaseThenInstallsWithoutFetchingItsBytesAgain() async throws {
        let setup = try await KeyServerTests.Setup("preload-e2e")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await Self.manifest(server, receipt: receipt)
        // The queue's clock and the server's read the same file: both before the release.
        let (queue, homeFolder) = try await Self.queue("preload-e2e-home", clock: setup.clock)
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await Self.waitForRelease(queue, id)
        // Seconds later it still waits, its bytes kept encrypted (no file of the home holds plaintext), and no key was
        // asked for before the release date.
        try await Task.sleep(for: .seconds(3))
        let paused = try queue.downloads([id])[0]
        #expect(paused.state == .paused && paused.pauseReason == .awaitingRelease && paused.contentURL == nil && paused.error == nil)
        #expect(paused.releaseDate == Manifest.Content.Preload.date(KeyServerTests.releases))
        #expect(Self.keyRequests(server, setup).isEmpty, "no key request before the release: \(Self.keyRequests(server, setup))")
        let description = try #require(try PreloadPack.description(of: setup.site.appending(path: "forest.tar.zst")))
        let data = try Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin"))
        let held = try Self.digests(under: homeFolder)
        #expect(held.contains(try Fixtures.sha256Hex(of: setup.site.appending(path: "forest.tar.zst"))), "the encrypted pack is kept")
        #expect(!held.contains(data) && !held.contains(description.plain.sha256), "no plaintext before the key")
        await #expect(throws: PackDeliveryError.self) { try await queue.finish([bought.id]) }

        try setup.setClock("2026-12-01T00:00:01Z")
        try await waitUntilAsync("the preload to install after its release", timeout: 60) {
            try queue.downloads([id])[0].state == .finished
        }
        let installed = try #require(try queue.downloads([id])[0].contentURL)
        #expect(try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin")) == data)
        #expect(queue.installer.keyring.heldKeyIDs.isEmpty, "the key is dropped once installed")
        try await queue.finish([bought.id])
        #expect(!(try Self.digests(under: homeFolder)).contains(description.plain.sha256), "the decrypted pack is gone")

        server.stop()
        let lines = server.log.split(separator: "\n")
        let packFetches = lines.filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
        let keyLines = Self.keyRequests(server, setup)
        #expect(keyLines.count == 1 && keyLines.allSatisfy { $0.contains(" 200 ") }, "one request, after the release: \(keyLines)")
        let keyHex = setup.key.data.map { String(format: "%02x", $0) }.joined()
        #expect(!server.log.contains(keyHex))
    }

    /// A server whose clock is behind the client's answers 403 with `Retry-After` (its seconds to the release): the
    /// queue asks no sooner than that, then gets the key and installs.
    @Test func aRefusalBeforeTheServersReleaseIsAskedAgainNoSoonerThanItsRetryAfter() async throws {
        let setup = try await KeyServerTests.Setup("preload-retry")
        defer { setup.remove() }
        try setup.setClock("2026-11-30T23:59:54Z")  // Retry-After: 6
        let server = try setup.serve()
        defer { server.stop() }
        let clientClock = setup.root.appending(path: "client-clock")
        try Data("2026-12-01T00:00:01Z".utf8).write(to: clientClock)
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await Self.manifest(server, receipt: receipt)
        let (queue, homeFolder) = try await Self.queue("preload-retry-home", clock: clientClock)
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await waitUntilAsync("a first key request, refused with Retry-After", timeout: 60) {
            Self.keyRequests(server, setup).contains { $0.contains(" 403 ") }
        }
        try await Task.sleep(for: .seconds(4))
        let early = Self.keyRequests(server, setup)
        #expect(early.count == 1, "no second request within the 6 s the server asked for: \(early)")
        #expect(try queue.downloads([id])[0].error == nil, "a refusal before the release is no error")

        try setup.setClock("2026-12-01T00:00:01Z")
        try await waitUntilAsync("the preload to install once the server releases its key", timeout: 60) {
            try queue.downloads([id])[0].state == .finished
        }
        #expect(Self.keyRequests(server, setup).count == 2, "\(Self.keyRequests(server, setup))")
    }

    /// A receipt of another product is refused the key (403 with no `Retry-After`) after the release: the download stays
    /// `paused(.awaitingRelease)` with its encrypted bytes and a `preloadKeyRefused` error (in its state and its events)
    /// that names neither key nor receipt, and the key is not asked for again until it is resumed.
    @Test func aKeyRefusedForGoodIsTheDownloadsErrorAndIsNotAskedAgain() async throws {
        let setup = try await KeyServerTests.Setup("preload-refused")
        defer { setup.remove() }
        try setup.setClock("2026-12-01T00:00:01Z")
        let server = try setup.serve()
        defer { server.stop() }
        let forest = try await setup.receipt("com.example.forest")
        let ocean = try await setup.receipt("com.example.ocean")
        let manifest = try await Self.manifest(server, receipt: forest)
        // The pack with the product's receipt, the key with another product's.
        let (queue, homeFolder) = try await Self.queue("preload-refused-home", clock: setup.clock) { request in
            ["Authorization: Bearer \(request.url.path.hasPrefix("/keys/") ? ocean : forest)"]
        }
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let events = queue.events()
        let bought = try await queue.add(product: "com.example.forest", from: manifest)
        let id = try #require(bought.downloads.first?.id)
        let seenBox = Mutex<Download?>(nil)
        let watch = Task {
            for await event in events {
                if case .downloadUpdated(let download) = event, download.id == id, download.error != nil {
                    seenBox.withLock { $0 = download }
                }
            }
        }
        defer { watch.cancel() }
        try await waitUntilAsync("the refusal to be the download's error", timeout: 60) {
            try queue.downloads([id])[0].error != nil
        }
        try await waitUntilAsync("an event that carries the refusal", timeout: 10) { seenBox.withLock { $0 } != nil }
        let seen = seenBox.withLock { $0 }
        let download = try queue.downloads([id])[0]
        #expect(download.state == .paused && download.pauseReason == .awaitingRelease)
        let error = try #require(download.error)
        #expect(error.code == .preloadKeyRefused && error.httpStatus == 403)
        #expect(seen?.error?.code == .preloadKeyRefused, "an event carries the error")
        let keyHex = setup.key.data.map { String(format: "%02x", $0) }.joined()
        for text in [error.message, error.hint ?? "", error.description] {
            #expect(!text.contains(ocean) && !text.contains(forest) && !text.contains(keyHex), "\(text)")
        }
        #expect(try Self.digests(under: homeFolder).contains(try Fixtures.sha256Hex(of: setup.site.appending(path: "forest.tar.zst"))))
        try await Task.sleep(for: .seconds(3))
        #expect(Self.keyRequests(server, setup).count == 1, "asked once: \(Self.keyRequests(server, setup))")

        // Cancelled: nothing is held for it any more.
        try queue.cancel([id])
        #expect(queue.installer.keyring.heldKeyIDs.isEmpty && !queue.installer.keyring.isWaiting)
    }

    /// A key that arrives for a download cancelled meanwhile is not kept, and a cancel drops what was asked for.
    @Test func aCancelledPreloadKeepsNoKey() async throws {
        let setup = try await KeyServerTests.Setup("preload-cancel")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await Self.manifest(server, receipt: receipt)
        let (queue, homeFolder) = try await Self.queue("preload-cancel-home", clock: setup.clock)
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await Self.waitForRelease(queue, id)
        #expect(queue.installer.keyring.isWaiting)
        try queue.cancel([id])
        try await waitUntilAsync("the cancel", timeout: 30) { try queue.downloads([id])[0].state == .cancelled }
        #expect(!queue.installer.keyring.isWaiting && queue.installer.keyring.heldKeyIDs.isEmpty)
        // Past the release, nothing asks for the key of the cancelled download.
        try setup.setClock("2026-12-01T00:00:01Z")
        try await Task.sleep(for: .seconds(3))
        #expect(Self.keyRequests(server, setup).isEmpty, "\(Self.keyRequests(server, setup))")
    }

    /// The keyring a queue asks from: only downloads that wait for a key are visited, none before its release date, one
    /// request at a time, none sooner than the backoff or `Retry-After`, none after a refusal for good until wanted again;
    /// a key is kept only for a download that waits for it, and dropped with it.
    @Test func theKeyringAsksOnlyForKeysDue() {
        let keyring = PreloadKeyring()
        let (first, second) = (PreloadKey.generate(), PreloadKey.generate())
        let now = Date()
        let release = now.addingTimeInterval(3600)
        keyring.want("d1", keyID: first.keyID, releases: release)
        keyring.want("d2", keyID: second.keyID, releases: nil)
        #expect(keyring.claimDue(now: now, clock: now).map(\.downloadID) == ["d2"], "d1 is not released yet")
        #expect(keyring.claimDue(now: now, clock: now).isEmpty, "one request at a time")
        keyring.notYet("d2", retryAfter: 30, now: now)
        #expect(keyring.claimDue(now: now.addingTimeInterval(29), clock: now).isEmpty, "Retry-After is honoured")
        #expect(keyring.claimDue(now: now.addingTimeInterval(31), clock: now).map(\.downloadID) == ["d2"])
        keyring.refused("d2")
        #expect(keyring.claimDue(now: .distantFuture, clock: release).map(\.downloadID) == ["d1"], "a refusal is not asked again")
        keyring.want("d2", keyID: second.keyID, releases: nil)
        #expect(keyring.claimDue(now: .distantFuture, clock: release).map(\.downloadID) == ["d2"], "until wanted again")
        #expect(!keyring.keep(first, for: "d3") && keyring.heldKeyIDs.isEmpty, "no key for a download that does not wait")
        #expect(keyring.keep(first, for: "d1") && keyring.heldKeyIDs == [first.keyID])
        keyring.drop("d1")
        keyring.drop("d2")
        #expect(keyring.heldKeyIDs.isEmpty && !keyring.isWaiting)
    }
}
