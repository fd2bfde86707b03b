import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// Issue 43, the download and install engine: a resume that checks what it reuses from staging (item 9), a first
/// install whose memory an index's chunk sizes cannot blow up (item 10), a silent server behind many sources that
/// fails in bounded time with a short error (item 12), and `--max-rate` on every transfer of a download (item 20).
/// The built `packs`, nginx or the test server, real files.
@Suite(.serialized, .timeLimit(.minutes(8))) struct HostileRoundFourEngineTests {
    static let product = WriteOnceTests.product

    /// Item 9: a write-once first install killed mid-way, every file of its staging tree cut to half its size, then
    /// `packs resume`: the chunks the record counts but the files no longer hold are fetched again, so the installed
    /// tree is the pack's (`bsdtar -xf`) and `packs verify` passes.
    @Test func aResumeFetchesAgainTheChunksOfAStagedFileCutShort() throws {
        let format = PackFormat.tarZstd
        let content = try WriteOnceTests.content("round4-cut-content", big: 10)
        let site = try Fixtures.temporaryDirectory("round4-cut-site")
        try WriteOnceTests.publish(content, site: site, format: format)
        let packLength = try WriteOnceTests.length(site.appending(path: WriteOnceTests.packName(format)))
        let nginx = try NginxServer(root: site, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("round4-cut-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product]) { event in
            guard let received = (event["bytesReceived"] as? NSNumber)?.int64Value else { return false }
            return received > Int64(packLength) * 2 / 3
        }
        #expect(killed, "killed mid-install")
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        let folder = try #require(
            try FileManager.default.contentsOfDirectory(atPath: downloads.path).first { $0.hasSuffix(".delta") }, "the install's folder")
        let verified = WriteOnceTests.verifiedChunks(home, String(folder.dropLast(".delta".count)))
        #expect(!verified.isEmpty, "chunks recorded before the kill")
        // Every file of the staging tree cut to half its size: the record still counts the chunks cut off.
        let tree = downloads.appending(path: "\(folder)/tree")
        var cut = 0
        let enumerator = FileManager.default.enumerator(atPath: tree.path)
        while let path = enumerator?.nextObject() as? String {
            var info = stat()
            let file = tree.appending(path: path).path
            guard lstat(file, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, info.st_size > 1 else { continue }
            #expect(truncate(file, info.st_size / 2) == 0)
            cut += 1
        }
        #expect(cut > 0, "files cut in the staging tree")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let verify = try CLI.run(home: home, ["verify", Self.product])
        #expect(verify.status == 0, "the installed content verifies: \(verify.stdout) \(verify.stderr)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try WriteOnceTests.reference(site, format, "round4-cut-bsdtar")), "byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The peak resident set of `packs ARGS…`, in bytes, and its exit status: the largest `VmHWM` (the process's own
    /// high-water mark, which starts afresh at its `exec`) read from `/proc` while it runs. (Its rusage would not do: a
    /// child spawned from this large test process keeps, across `exec`, the high-water mark of the memory it shared.)
    static func peakRSS(home: URL, _ arguments: [String], timeout: TimeInterval = 240) throws -> (status: Int32, bytes: Int64) {
        let argv = [CLI.binary, "--home", home.path] + arguments
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var pid: pid_t = 0
        let cArguments = argv.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        let spawned = posix_spawn(&pid, CLI.binary, &actions, nil, cArguments, environ)
        try #require(spawned == 0, "spawned \(CLI.binary): \(spawned)")
        var status: Int32 = 0
        var peak: Int64 = 0
        let deadline = Date().addingTimeInterval(timeout)
        while waitpid(pid, &status, WNOHANG) == 0 {
            let lines = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8))?.split(separator: "\n") ?? []
            if let line = lines.first(where: { $0.hasPrefix("VmHWM:") }),
                let kib = Int64(line.dropFirst("VmHWM:".count).trimmingCharacters(in: .whitespaces).split(separator: " ").first ?? "")
            {
                peak = max(peak, kib * 1024)
            }
            if Date() > deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                Issue.record("packs \(arguments) did not end within \(timeout) s")
                break
            }
            usleep(10_000)
        }
        let exit = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return (exit, peak)
    }

    /// Item 10: a valid tar.zst of 17 MiB (so installed chunk by chunk) with three chunks of 64 MiB, each a zstd frame
    /// of a few KiB, installs byte for byte with a peak RSS at most 64 MiB above that of installing an ordinary pack
    /// (before, each check held every decoded chunk of its batch: hundreds of MiB); so does a plain tar with the same
    /// chunks, each stored as its 64 MiB.
    @Test(arguments: [PackFormat.tarZstd, .tar])
    func chunksThatDecodeToFarMoreThanTheyAreStoredInstallInBoundedMemory(format: PackFormat) throws {
        // The baseline: an ordinary first install of about 9 MiB (chunks of 32 KiB or so), through the same path.
        let ordinary = try Fixtures.temporaryDirectory("round4-rss-ordinary-site")
        try WriteOnceTests.publish(try WriteOnceTests.content("round4-rss-ordinary-content", big: 1), site: ordinary, format: .tarZstd)
        // Three files of 64 MiB, each one byte repeated: one chunk each with a chunker whose chunks are at least 16 MiB.
        let content = try Fixtures.temporaryDirectory("round4-rss-content-\(format.rawValue)")
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents, withIntermediateDirectories: true)
        for (number, byte) in [UInt8(0x41), 0x42, 0x43].enumerated() {
            try Data(repeating: byte, count: 64 << 20).write(to: contents.appending(path: "f\(number).bin"))
        }
        // Random bytes, so that the pack is long enough (16 MiB) to be installed chunk by chunk, written once.
        try Fixtures.randomFile(at: contents.appending(path: "random.bin"), size: 17 << 20)
        let site = try Fixtures.temporaryDirectory("round4-rss-site-\(format.rawValue)")
        let pack = site.appending(path: WriteOnceTests.packName(format))
        try PackWriter.write(
            folder: content, to: pack, format: format, contentInfo: (productIdentifier: Self.product, contentVersion: "1"),
            chunker: try #require(Chunker(minimum: 16 << 20, average: 16 << 20, maximum: 64 << 20)))
        try ManifestBuilder.write(folder: site)
        let index = try PackIndex.decode(
            Data(contentsOf: site.appending(path: WriteOnceTests.packName(format) + ".index.json")), maxEntries: 100,
            containers: [.tar, .tarZstd])
        let chunks = index.entries.flatMap { $0.chunks ?? [] }
        #expect(
            chunks.filter { $0.size == 64 << 20 && (format == .tar || $0.length < 64 << 10) }.count == 3,
            "three 64 MiB chunks (stored small in a tar.zst): \(chunks)")
        try? FileManager.default.removeItem(at: content)
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let ordinaryServer = try NginxServer(root: ordinary)
        defer { ordinaryServer.stop() }

        let baselineHome = try Fixtures.temporaryDirectory("round4-rss-baseline-home")
        let baseline = try Self.peakRSS(
            home: baselineHome, ["fetch", ordinaryServer.baseURL.appending(path: "manifest.json").absoluteString, Self.product])
        #expect(baseline.status == 0)
        let home = try Fixtures.temporaryDirectory("round4-rss-home-\(format.rawValue)")
        let large = try Self.peakRSS(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, Self.product])
        print("peak RSS, \(format.rawValue): ordinary install \(baseline.bytes >> 20) MiB, 64 MiB chunks \(large.bytes >> 20) MiB")
        #expect(large.status == 0)
        #expect(large.bytes <= baseline.bytes + (64 << 20), "peak RSS \(large.bytes >> 20) MiB, baseline \(baseline.bytes >> 20) MiB")
        let installed = home.appending(path: "Caches/\(Self.product)/Contents")
        for (number, byte) in [UInt8(0x41), 0x42, 0x43].enumerated() {
            let data = try Data(contentsOf: installed.appending(path: "f\(number).bin"))
            #expect(data.count == 64 << 20 && data.allSatisfy { $0 == byte }, "f\(number).bin byte for byte")
        }
        #expect(try CLI.run(home: home, ["verify", Self.product]).status == 0)
        #expect(nginx.requests().contains { $0.range != nil }, "installed chunk by chunk, by ranges: \(nginx.requests())")
    }

    /// Item 10, for an update: version 2 adds three files of 64 MiB, each one chunk stored as a frame of a few KiB;
    /// the update fetches those chunks by range, keeps and assembles them with a peak RSS at most 32 MiB above that
    /// of the version 1 install (a chunk held whole alone takes 64 MiB), and the tree is byte for byte.
    @Test func anUpdateWhoseChunksDecodeToFarMoreThanTheyAreStoredStaysInBoundedMemory() throws {
        let chunker = try #require(Chunker(minimum: 16 << 20, average: 16 << 20, maximum: 64 << 20))
        let content = try Fixtures.temporaryDirectory("round4-rss-update-content")
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents, withIntermediateDirectories: true)
        try Fixtures.randomFile(at: contents.appending(path: "random.bin"), size: 1 << 20)
        let site = try Fixtures.temporaryDirectory("round4-rss-update-site")
        func publish(_ version: String) throws {
            try PackWriter.write(
                folder: content, to: site.appending(path: WriteOnceTests.packName(.tarZstd)), format: .tarZstd,
                contentInfo: (productIdentifier: Self.product, contentVersion: version), chunker: chunker)
            try ManifestBuilder.write(folder: site)
        }
        try publish("1")
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let home = try Fixtures.temporaryDirectory("round4-rss-update-home")
        let first = try Self.peakRSS(home: home, ["fetch", manifestURL, Self.product])
        #expect(first.status == 0)
        for (number, byte) in [UInt8(0x41), 0x42, 0x43].enumerated() {
            try Data(repeating: byte, count: 64 << 20).write(to: contents.appending(path: "f\(number).bin"))
        }
        try publish("2")
        let before = nginx.requests().count
        let update = try Self.peakRSS(home: home, ["fetch", manifestURL, Self.product])
        print("peak RSS: version 1 \(first.bytes >> 20) MiB, the update to 64 MiB chunks \(update.bytes >> 20) MiB")
        #expect(update.status == 0)
        #expect(nginx.requests().dropFirst(before).contains { $0.range != nil }, "an update by ranges: \(nginx.requests())")
        #expect(update.bytes <= first.bytes + (32 << 20), "peak RSS \(update.bytes >> 20) MiB, version 1 \(first.bytes >> 20) MiB")
        let installed = home.appending(path: "Caches/\(Self.product)/Contents")
        for (number, byte) in [UInt8(0x41), 0x42, 0x43].enumerated() {
            let data = try Data(contentsOf: installed.appending(path: "f\(number).bin"))
            #expect(data.count == 64 << 20 && data.allSatisfy { $0 == byte }, "f\(number).bin byte for byte")
        }
        try? FileManager.default.removeItem(at: content)
        #expect(try CLI.run(home: home, ["verify", Self.product]).status == 0)
    }

    /// Item 12: a pack whose 272 sources (16 mirrors × 17 relative URLs) all lead to one silent server fails within a
    /// few stall timeouts (the origin counted once), with one short line naming the failure and how many sources it
    /// covers (before: 329 s, and a line of 55 KB).
    @Test func manySourcesOfOneSilentServerFailInBoundedTimeWithAShortError() throws {
        let site = try TestSite.random("round4-silent", size: 256 << 10)
        let silent = try FaultServer(root: site.folder)
        defer { silent.stop() }
        try site.editManifest { manifest in
            manifest.mirrors = (0..<16).map { silent.url("m\($0)", fault: .silent).absoluteString }
            manifest.products[0].contents[0].urls = (0..<16).map { "u\($0)/big.tar" }
        }
        let loaded = try LoadedManifest(
            manifest: try site.manifest(), baseURL: site.manifestURL)
        #expect(try loaded.packURLs(for: loaded.manifest.products[0].contents[0]).count == 272)
        let home = try Fixtures.temporaryDirectory("round4-silent-home")
        let started = Date()
        let result = try CLI.run(
            home: home, ["fetch", site.manifestURL.path, "com.example.big", "--stall-timeout", "1", "--retries", "0"], timeout: 120)
        let elapsed = Date().timeIntervalSince(started)
        #expect(result.status == 69, "a network failure: \(result.stderr.prefix(500))")
        #expect(elapsed < 20, "bounded by the origins, not the sources: \(elapsed) s")
        #expect(result.stderr.utf8.count < 2_000, "a short error: \(result.stderr.utf8.count) bytes: \(result.stderr.prefix(500))")
        #expect(result.stderr.contains("272 sources") && result.stderr.contains("(×272)"), "\(result.stderr)")
        HostileInputTests.expectOneLine(result.stderr)
    }

    /// Item 20: `--max-rate` holds for a write-once first install (its range requests; a pack of 16 MiB or more), and
    /// for a pack smaller than libcurl's buffer: about 17 MiB at 4 MiB/s takes 3 s or more (before: 0.4 s), a pack of
    /// less than 16 KiB at 4 KiB/s 1.5 s or more (before: at once). A lower bound only: a behaviour, not a benchmark.
    @Test func maxRateHoldsForAWriteOnceInstallAndATinyPack() throws {
        let site = try Fixtures.temporaryDirectory("round4-rate-site")
        try WriteOnceTests.publish(try WriteOnceTests.content("round4-rate-content", big: 9), site: site, format: .tarZstd)
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("round4-rate-home")
        var started = Date()
        let fetch = try CLI.run(
            home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, Self.product, "--max-rate", "4M"])
        let elapsed = Date().timeIntervalSince(started)
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(nginx.requests().contains { $0.range != nil }, "a write-once install, by ranges: \(nginx.requests())")
        #expect(elapsed >= 3, "17 MiB at 4 MiB/s: \(elapsed) s")

        let tiny = try TestSite.random("round4-rate-tiny", size: 4 << 10)
        let tinyServer = try NginxServer(root: tiny.folder)
        defer { tinyServer.stop() }
        let tinyLength = try WriteOnceTests.length(tiny.folder.appending(path: "big.tar"))
        let tinyHome = try Fixtures.temporaryDirectory("round4-rate-tiny-home")
        started = Date()
        let small = try CLI.run(
            home: tinyHome,
            ["fetch", tinyServer.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big", "--max-rate", "4K"])
        let tinyElapsed = Date().timeIntervalSince(started)
        #expect(small.status == 0, "\(small.stderr)")
        #expect(tinyLength < 16 << 10, "smaller than libcurl's buffer: \(tinyLength)")
        // 7 KiB at 4 KiB/s, less the first burst of an eighth of a second (512 bytes), is 1.6 s at least; before: at once.
        // (A bound of 2 s leaned on the process's own start, and failed at 1.86 s in a full run.)
        #expect(tinyElapsed >= 1.5, "\(tinyLength) bytes at 4 KiB/s: \(tinyElapsed) s")
    }
}
