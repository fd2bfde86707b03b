import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// A power cut during a preload's decrypting install (issue 46): the home on an ext4 loop image (``PowerCutDisk``), the
/// ciphertext fetched before the release by `packs fetch` (exit 75), then the release's `packs fetch` paused at a step
/// of its install (`PACKS_TEST_PAUSE_AT`) and the power cut there. After the remount the pack is either not installed
/// with its ciphertext kept, or installed with `packs verify` passing; `packs resume` then installs it with no pack
/// byte fetched again and no plaintext left.
@Suite(.timeLimit(.minutes(5)), .serialized, .enabled(if: PowerCutDisk.unavailableReason == nil, powerCutSkipped))
struct PreloadPowerCutTests {
    @Test(arguments: [PowerCutTests.Moment.midUnpack, .beforeRename, .afterRename])
    func aCutDuringTheDecryptingInstallLeavesTheCiphertextOrTheInstall(moment: PowerCutTests.Moment) async throws {
        let setup = try await KeyServerTests.Setup("preload-cut-\(moment.rawValue)")
        defer { setup.remove() }
        let server = try setup.serve()
        defer { server.stop() }
        let receiptFile = setup.root.appending(path: "receipt")
        try Data(try await setup.receipt("com.example.forest").utf8).write(to: receiptFile)
        let disk = try PowerCutDisk("preload-cut-\(moment.rawValue)", megabytes: 64)
        let home = disk.mountPoint.appending(path: "home")
        let fetch = [
            "--home", home.path, "fetch", server.baseURL.appending(path: "manifest.json").absoluteString, "com.example.forest",
            "--receipt", receiptFile.path,
        ]
        let clock = ["PACKS_TEST_CLOCK_FILE": setup.clock.path]
        let early = try Fixtures.run(
            CLI.binary, fetch, environment: ProcessInfo.processInfo.environment.merging(clock) { $1 }, timeout: 120)
        #expect(early.status == 75, "the ciphertext fetched before the release: \(early.stderr)")
        let ciphertext = try Fixtures.sha256Hex(of: setup.site.appending(path: "forest.tar.zst"))
        let plain = try Fixtures.sha256Hex(of: setup.root.appending(path: "forest/Contents/data.bin"))

        try setup.setClock("2026-12-01T00:00:01Z")
        let release = try WatchedProcess(
            CLI.binary, fetch,
            environment: ProcessInfo.processInfo.environment.merging(clock) { $1 }.merging(["PACKS_TEST_PAUSE_AT": moment.rawValue]) { $1 })
        #expect(
            release.waitForStderr("paused at \(moment.rawValue)", timeout: 60), "the release reached \(moment.rawValue): \(release.stderr)")
        try disk.cut()
        release.kill()
        try disk.remount()

        let content = try CLI.run(home: home, ["content", "com.example.forest"], timeout: 30)
        if content.status == 0 {
            let folder = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(try Fixtures.sha256Hex(of: folder.appending(path: "Contents/data.bin")) == plain, "installed: its bytes")
            let verify = try CLI.run(home: home, ["verify", "com.example.forest"], timeout: 60)
            #expect(verify.status == 0, "installed: verify passes: \(verify.stdout)\(verify.stderr)")
        } else {
            #expect(
                try PreloadDeliveryTests.digests(under: home).contains(ciphertext),
                "not installed after a cut at \(moment.rawValue): its ciphertext is kept")
        }

        let resume = try CLI.run(home: home, ["resume"], timeout: 120, environment: clock)
        #expect(resume.status == 0, "resume after a cut at \(moment.rawValue): \(resume.stderr)")
        let installed = try CLI.run(home: home, ["content", "com.example.forest"], timeout: 30)
        let folder = URL(filePath: installed.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(try Fixtures.sha256Hex(of: folder.appending(path: "Contents/data.bin")) == plain, "\(installed.stderr)")
        #expect(try CLI.run(home: home, ["verify", "com.example.forest"], timeout: 60).status == 0)
        #expect(PreloadFetchTests.plaintextFiles(home).isEmpty, "no plaintext left: \(PreloadFetchTests.plaintextFiles(home))")
        server.stop()
        let packFetches = server.log.split(separator: "\n").filter { $0.contains("GET /forest.tar.zst ") }
        #expect(packFetches.count == 1, "the pack's bytes are fetched once, before the release: \(packFetches)")
    }
}
