import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

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

    @Test func aPreloadWaitsForItsReleaseThenInstallsWithoutFetchingItsBytesAgain() async throws {
        let setup = try await KeyServerTests.Setup("preload-e2e")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = try await setup.receipt("com.example.forest")
        let manifest = try await LoadedManifest.load(
            server.baseURL.appending(path: "manifest.json").absoluteString,
            options: TransferOptions(headers: ["Authorization: Bearer \(receipt)"]))
        let homeFolder = try Fixtures.temporaryDirectory("preload-e2e-home")
        defer { try? FileManager.default.removeItem(at: homeFolder) }
        let queue = try await DownloadQueue.open(home: Home(folder: homeFolder))
        defer { queue.close() }
        let bought = try await queue.add(product: "com.example.forest", from: manifest, receipt: receipt)
        let id = try #require(bought.downloads.first?.id)
        try await waitUntilAsync("the preload to pause awaiting its release", timeout: 60) {
            try queue.downloads([id])[0].pauseReason == .awaitingRelease
        }
        // Several refusals later it still waits, its bytes kept encrypted: no file of the home holds plaintext.
        try await Task.sleep(for: .seconds(2))
        let paused = try queue.downloads([id])[0]
        #expect(paused.state == .paused && paused.pauseReason == .awaitingRelease && paused.contentURL == nil && paused.error == nil)
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
        try await queue.finish([bought.id])
        #expect(!(try Self.digests(under: homeFolder)).contains(description.plain.sha256), "the decrypted pack is gone")

        server.stop()
        let lines = server.log.split(separator: "\n")
        let packFetches = lines.filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
        let keyLines = lines.filter { $0.contains("/keys/\(setup.key.keyID)") }
        #expect(keyLines.contains { $0.contains(" 403 ") } && keyLines.contains { $0.contains(" 200 ") }, "\(keyLines)")
        let keyHex = setup.key.data.map { String(format: "%02x", $0) }.joined()
        #expect(!server.log.contains(keyHex))
    }
}
