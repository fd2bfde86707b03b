import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// `packs fetch MANIFEST PRODUCT` of a preload, with no agent (issue 46): before the release it downloads the encrypted
/// pack, asks for no key, and exits 75 saying when the release is and what to do; the same fetch after the release
/// installs it with its key, fetching no pack byte again. The real binary and `packs serve --keys`, their clocks set
/// through `PACKS_TEST_CLOCK_FILE`.
@Suite(.serialized, .timeLimit(.minutes(3))) struct PreloadFetchTests {
    @Test func aFetchBeforeTheReleaseKeepsTheCiphertextAndOneAfterInstallsIt() async throws {
        let setup = try await KeyServerTests.Setup("preload-fetch")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = setup.root.appending(path: "receipt")
        try Data(try await setup.receipt("com.example.forest").utf8).write(to: receipt)
        let home = try Fixtures.temporaryDirectory("preload-fetch-home")
        defer { try? FileManager.default.removeItem(at: home) }
        let fetch = [
            "fetch", server.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest", "--receipt", receipt.path,
        ]
        let environment = ["PACKS_TEST_CLOCK_FILE": setup.clock.path]

        let early = try CLI.run(home: home, fetch, timeout: 120, environment: environment)
        #expect(early.status == 75, "\(early.status) \(early.stdout) \(early.stderr)")
        #expect(early.stderr.contains(KeyServerTests.releases), "the message names the release date: \(early.stderr)")
        #expect(early.stderr.contains("packs agent") && early.stderr.contains("again after"), "\(early.stderr)")
        let keyLines = { server.log.split(separator: "\n").filter { $0.contains("/keys/") } }
        #expect(keyLines().isEmpty, "no key request before the release: \(keyLines())")
        #expect(try CLI.run(home: home, ["content", "com.example.forest"]).status != 0, "not installed before the release")

        try setup.setClock("2026-12-01T00:00:01Z")
        let late = try CLI.run(home: home, fetch, timeout: 120, environment: environment)
        #expect(late.status == 0, "\(late.status) \(late.stdout) \(late.stderr)")
        let content = try CLI.run(home: home, ["content", "com.example.forest"])
        #expect(content.status == 0, "\(content.stderr)")
        let folder = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(
            try Fixtures.sha256Hex(of: folder.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")))
        #expect(try CLI.run(home: home, ["verify", "com.example.forest"]).status == 0)

        server.stop()
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
        #expect(keyLines().count == 1 && keyLines().allSatisfy { $0.contains(" 200 ") }, "\(keyLines())")
    }

    /// The plain-pack files a home holds (a zip preload decrypted for its install, or being decrypted).
    static func plaintextFiles(_ home: URL) -> [String] {
        guard let walker = FileManager.default.enumerator(atPath: home.path) else { return [] }
        return walker.compactMap { $0 as? String }.filter { $0.hasSuffix(".decrypted") || $0.hasSuffix(".decrypted.part") }
    }

    /// The regular files under a home's staging folders (an unpack under way).
    static func stagedFiles(_ home: URL) -> [String] {
        guard let walker = FileManager.default.enumerator(atPath: home.path) else { return [] }
        return walker.compactMap { $0 as? String }.filter {
            $0.contains("staging/")
                && (try? FileManager.default.attributesOfItem(atPath: home.appending(path: $0).path)[.type] as? FileAttributeType)
                    == .typeRegular
        }
    }

    /// A SIGKILL while the release installs (the unpack under way, decrypting the kept bytes as it reads them) leaves
    /// it resumable: `packs resume` asks for the key again, decrypts the kept bytes once more and installs, with no pack
    /// byte fetched again. No plain pack is written at any time: the tar.zst is decrypted straight into its unpack.
    @Test func aKillDuringTheDecryptingInstallResumesAndLeavesNoPlaintext() async throws {
        let setup = try await KeyServerTests.Setup("preload-kill")
        defer { setup.remove() }
        try setup.setClock("2026-12-01T00:00:01Z")
        let server = try setup.serve()
        defer { server.stop() }
        let receipt = setup.root.appending(path: "receipt")
        try Data(try await setup.receipt("com.example.forest").utf8).write(to: receipt)
        let description = try #require(try PreloadPack.description(of: setup.site.appending(path: "forest.tar.zst")))
        let home = try Fixtures.temporaryDirectory("preload-kill-home")
        defer { try? FileManager.default.removeItem(at: home) }
        let process = Process()
        process.executableURL = URL(filePath: CLI.binary)
        process.arguments = [
            "--home", home.path, "fetch", server.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest",
            "--receipt", receipt.path,
        ]
        process.environment = ProcessInfo.processInfo.environment.merging(
            ["PACKS_TEST_CLOCK_FILE": setup.clock.path, "PACKS_TEST_PAUSE_AT": "mid-unpack"]) { $1 }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        try await waitUntilAsync("the release's unpack to write its first file into staging", timeout: 60) {
            !Self.stagedFiles(home).isEmpty
        }
        #expect(Self.plaintextFiles(home).isEmpty, "no plain pack file: \(Self.plaintextFiles(home))")
        #expect(!(try PreloadDeliveryTests.digests(under: home)).contains(description.plain.sha256), "no plain pack written")
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()

        let resumed = try CLI.run(
            home: home, ["resume", "--receipt", receipt.path], timeout: 120, environment: ["PACKS_TEST_CLOCK_FILE": setup.clock.path])
        #expect(resumed.status == 0, "\(resumed.stdout) \(resumed.stderr)")
        let content = try CLI.run(home: home, ["content", "com.example.forest"])
        let folder = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(
            try Fixtures.sha256Hex(of: folder.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin")))
        #expect(try CLI.run(home: home, ["verify", "com.example.forest"]).status == 0)
        #expect(Self.plaintextFiles(home).isEmpty, "no plaintext left: \(Self.plaintextFiles(home))")
        server.stop()
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once: \(packFetches)")
    }
}
