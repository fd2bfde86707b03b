import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

/// A new version (or a repair) of a chunked tar or tar.zst pack fetches only the chunks that are not in the installed
/// files, with range requests, and builds the new version from them and the installed files. Real libcurl,
/// libarchive and a loopback server that counts the bytes it sends; trees compared with `bsdtar -xf` of the new pack.
@Suite(.serialized, .timeLimit(.minutes(6))) struct ChunkDeltaTests {
    static let product = "com.example.chunks"

    /// Version 1's content: an 8 MiB random file, `files` random files of 200 KiB, an executable script and a symlink.
    static func content(_ label: String, files: Int = 4) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        // Pseudo-random with a fixed seed: the same chunks, and so the same numbers, on every run.
        try FileManager.default.createDirectory(at: contents, withIntermediateDirectories: true)
        try Data(chunkedPackBytes(8 << 20, seed: 42)).write(to: contents.appending(path: "big.bin"))
        for file in 0..<files {
            try Fixtures.randomFile(at: contents.appending(path: "small/f\(file).bin"), size: 200 << 10)
        }
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: contents.appending(path: "run.sh"))
        chmod(contents.appending(path: "run.sh").path, 0o755)
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "small/link").path, withDestinationPath: "../run.sh")
        return content
    }

    static func packName(_ format: PackFormat) -> String { "pack.\(format.rawValue)" }

    /// Publishes `content` as version `version`: the pack, its index and `manifest.json`.
    static func publish(_ content: URL, version: String, site: URL, format: PackFormat) throws {
        try PackWriter.write(
            folder: content, to: site.appending(path: Self.packName(format)), format: format,
            contentInfo: (productIdentifier: Self.product, contentVersion: version))
        try ManifestBuilder.write(folder: site)
    }

    static func fetch(_ manifestURL: URL, home: URL) async throws -> Download {
        let queue = try DownloadQueue(
            home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifestURL.absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        return try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
    }

    static func reference(_ site: URL, _ format: PackFormat, _ label: String) throws -> [String: Data] {
        let folder = try Fixtures.temporaryDirectory(label)
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", site.appending(path: Self.packName(format)).path, "-C", folder.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        return try treeContents(folder)
    }

    static func packLength(_ site: URL, _ format: PackFormat) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: site.appending(path: Self.packName(format)).path)[.size] as? Int)
    }

    static func index(_ site: URL, _ format: PackFormat) throws -> PackIndex {
        try JSONDecoder().decode(
            PackIndex.self, from: PackIndex.json(Data(contentsOf: PackWriter.indexURL(for: site.appending(path: Self.packName(format))))))
    }

    /// The bytes of the chunks of the site's index that `old` does not have, each once.
    static func newChunkBytes(_ site: URL, _ format: PackFormat, since old: PackIndex) -> Int {
        let known = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        var seen = Set<String>()
        return ((try? Self.index(site, format))?.entries.flatMap { $0.chunks ?? [] } ?? [])
            .filter { !known.contains($0.sha256) && seen.insert($0.sha256).inserted }.reduce(0) { $0 + Int($1.length) }
    }

    /// What a chunked update from `old` should report: the distinct chunks of the site's index that `old` does not
    /// have, and the chunks of the new files that it has (every file's chunks are in the installed version's files).
    static func chunkCounts(_ site: URL, _ format: PackFormat, since old: PackIndex) throws -> (fetched: Int, reused: Int) {
        let known = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        let pieces = try Self.index(site, format).entries.flatMap { $0.chunks ?? [] }
        return (Set(pieces.map(\.sha256)).subtracting(known).count, pieces.filter { known.contains($0.sha256) }.count)
    }

    /// Version 1 installed whole from a fresh site.
    static func installed(_ label: String, _ format: PackFormat, files: Int = 4) async throws -> (
        site: URL, server: FaultServer, home: URL, content: URL
    ) {
        let content = try Self.content(label + "-content", files: files)
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let server = try FaultServer(root: site)
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(first.state == .finished && first.delta == nil, "version 1 installs whole: \(first.error?.description ?? "")")
        return (site, server, home, content)
    }

    /// Overwrites `length` bytes at each of `offsets` of a file with random bytes.
    static func scribble(_ file: URL, at offsets: [Int], length: Int) throws {
        var bytes = try Data(contentsOf: file)
        for offset in offsets { bytes.replaceSubrange(offset..<(offset + length), with: chunkedPackBytes(length, seed: UInt64(offset))) }
        try bytes.write(to: file)
    }

    @Test(arguments: [PackFormat.tar, .tarZstd, .tarGzip])
    func aLargeFileChangedInPlacesThenGrownNearItsStartFetchesOnlyItsNewChunks(format: PackFormat) async throws {
        let label = "chunk-big-\(format.rawValue)"
        let (site, server, home, content) = try await Self.installed(label, format)
        defer { server.stop() }
        let big = content.appending(path: "Contents/big.bin")
        // 1% of the file, in three places.
        let oldIndex = try Self.index(site, format)
        try Self.scribble(big, at: [1_000_000, 4_000_000, 7_000_000], length: 28_000)
        try Self.publish(content, version: "2", site: site, format: format)
        var before = server.bodyBytesSent(Self.packName(format))
        let update = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        #expect(update.deltaFallback == nil, "\(update.deltaFallback?.message ?? "")")
        let delta = try #require(update.delta, "a delta update")
        var served = server.bodyBytesSent(Self.packName(format)) - before
        var length = try Self.packLength(site, format)
        print("chunk delta \(format.rawValue), 1% changed in 3 places: \(served) of \(length) bytes served (\(delta))")
        #expect(served == Int(delta.bytesToFetch), "the server sent exactly the ranges planned")
        #expect(Int(delta.bytesFetched) == served, "the bytes fetched are the bytes the server sent: \(delta)")
        let counts = try Self.chunkCounts(site, format, since: oldIndex)
        #expect(delta.chunksFetched == counts.fetched && delta.chunksFetched > 0, "each new chunk fetched once: \(delta), \(counts)")
        #expect(delta.chunksReused == counts.reused && delta.chunksReused > 0, "every other chunk reused: \(delta), \(counts)")
        // Each place costs its own bytes and about one chunk around them (64 KiB on average): the new chunks, and at
        // most a gap between two of them.
        let fresh = Self.newChunkBytes(site, format, since: oldIndex)
        #expect(served >= fresh && served <= fresh + Int(DeltaPlan.coalesceGap), "the new chunks: \(served), new \(fresh)")
        #expect(served * 100 <= 5 * length, "at most 5% of the pack: \(served) of \(length)")
        let installed = try #require(update.contentURL)
        #expect(try treeContents(installed) == (try Self.reference(site, format, label + "-bsdtar2")), "the new version, byte for byte")
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: installed.appending(path: "Contents/small/link").path) == "../run.sh")
        #expect(FileManager.default.isExecutableFile(atPath: installed.appending(path: "Contents/run.sh").path), "modes kept")

        // 4 KiB inserted near the start: the boundaries after it stay where they were.
        var bytes = try Data(contentsOf: big)
        bytes.insert(contentsOf: chunkedPackBytes(4096, seed: 7), at: 20_000)
        try bytes.write(to: big)
        try Self.publish(content, version: "3", site: site, format: format)
        before = server.bodyBytesSent(Self.packName(format))
        let grown = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(grown.state == .finished && grown.delta != nil, "\(grown.error?.description ?? "") \(grown.deltaFallback?.message ?? "")")
        served = server.bodyBytesSent(Self.packName(format)) - before
        length = try Self.packLength(site, format)
        print("chunk delta \(format.rawValue), 4 KiB inserted: \(served) of \(length) bytes served")
        #expect(served * 100 <= 2 * length, "at most 2% of the pack: \(served) of \(length)")
        #expect(try treeContents(try #require(grown.contentURL)) == (try Self.reference(site, format, label + "-bsdtar3")))
        #expect(leftoversAfterCleanup(home) == [], "no delta folder, staging or archive left")
        let verify = try await DownloadQueue(home: Home(folder: home)).verify()
        #expect(verify.allSatisfy { $0.isIntact }, "what is recorded matches the files: \(verify)")
    }

    /// An index as packs wrote them before indexes were compressed and recorded their normalization: plain JSON, files
    /// cut at level 2 (16, 64 and 256 KiB), no `normalization`. The client reads it and cuts its installed files at
    /// level 2 too (cut at today's level, they would share almost no chunk with it), so the update still fetches only
    /// the chunks around the changes.
    @Test func anIndexWrittenBeforeIndexesWereCompressedStillUpdatesByChunk() async throws {
        let format = PackFormat.tarZstd
        let (site, server, home, content) = try await Self.installed("chunk-plain-index", format)
        defer { server.stop() }
        try Self.scribble(content.appending(path: "Contents/big.bin"), at: [1_000_000, 4_000_000, 7_000_000], length: 28_000)
        let levelTwo = try #require(Chunker(minimum: 16 << 10, average: 64 << 10, maximum: 256 << 10, normalization: 2))
        let pack = site.appending(path: Self.packName(format))
        try PackWriter.write(
            folder: content, to: pack, format: format, contentInfo: (productIdentifier: Self.product, contentVersion: "2"),
            chunker: levelTwo)
        try ManifestBuilder.write(folder: site)
        let url = PackWriter.indexURL(for: pack)
        var object = try #require(try JSONSerialization.jsonObject(with: PackIndex.json(Data(contentsOf: url))) as? [String: Any])
        var chunking = try #require(object["chunking"] as? [String: Any])
        #expect(chunking.removeValue(forKey: "normalization") as? Int == 2)
        object["chunking"] = chunking
        try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]).write(to: url)
        let sha256 = try Fixtures.sha256Hex(of: url)
        let length = try #require(try FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int64)
        try DeltaIndexTests.editManifest(site) { $0["index"] = ["url": url.lastPathComponent, "sha256": sha256, "length": length] }
        #expect(try Data(contentsOf: url).first == UInt8(ascii: "{"), "plain JSON")

        let before = server.bodyBytesSent(Self.packName(format))
        let update = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        #expect(update.deltaFallback == nil, "\(update.deltaFallback?.message ?? "")")
        #expect(update.delta != nil, "a delta update")
        let served = server.bodyBytesSent(Self.packName(format)) - before
        let packLength = try Self.packLength(site, format)
        print("chunk delta with a plain level-2 index, 1% changed in 3 places: \(served) of \(packLength) bytes served")
        #expect(served * 100 <= 5 * packLength, "at most 5% of the pack: \(served) of \(packLength)")
        #expect(try treeContents(try #require(update.contentURL)) == (try Self.reference(site, format, "chunk-plain-index-bsdtar")))
    }

    @Test func fourChangedFilesOutOfFortyFetchOnlyTheirChangedChunks() async throws {
        let format = PackFormat.tarZstd
        let (site, server, home, content) = try await Self.installed("chunk-forty", format, files: 40)
        defer { server.stop() }
        let old = try Self.index(site, format)
        for file in [3, 11, 25, 38] {
            try Self.scribble(content.appending(path: "Contents/small/f\(file).bin"), at: [100_000], length: 2_000)
        }
        try Self.publish(content, version: "2", site: site, format: format)
        let new = try Self.index(site, format)
        let oldChunks = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        let changed = new.entries.flatMap { $0.chunks ?? [] }.filter { !oldChunks.contains($0.sha256) }
        let before = server.bodyBytesSent(Self.packName(format))
        let update = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(
            update.state == .finished && update.deltaFallback == nil,
            "\(update.error?.description ?? "") \(update.deltaFallback?.message ?? "")")
        let delta = try #require(update.delta)
        let served = server.bodyBytesSent(Self.packName(format)) - before
        let changedBytes = changed.reduce(0) { $0 + Int($1.length) }
        print(
            "chunk delta, 4 of 40 files changed: \(served) bytes served, \(changed.count) new chunks of \(changedBytes) bytes, pack \(try Self.packLength(site, format))"
        )
        #expect(served >= changedBytes, "every new chunk: \(served) of \(changedBytes)")
        // ContentInfo.plist is new too; the four files' new chunks lie apart, so no gap is fetched.
        #expect(served == changedBytes, "only the new chunks: \(served), new chunks \(changedBytes)")
        #expect(Int(delta.bytesFetched) == served, "the bytes fetched are the bytes the server sent: \(delta)")
        #expect(delta.chunksFetched == changed.count, "each new chunk once: \(delta)")
        #expect(delta.chunksReused == (try Self.chunkCounts(site, format, since: old)).reused, "\(delta)")
        #expect(delta.filesReused == 38, "36 files, big.bin and run.sh reused whole: \(delta)")
        #expect(delta.entriesToFetch == 5, "4 files and ContentInfo.plist: \(delta)")
        #expect(try treeContents(try #require(update.contentURL)) == (try Self.reference(site, format, "chunk-forty-bsdtar")))
    }

    @Test func aTamperedChunkIsFetchedTwiceThenFailsNamingItsFileAndTheOldVersionStays() async throws {
        let format = PackFormat.tarZstd
        let (site, server, home, content) = try await Self.installed("chunk-tampered", format)
        defer { server.stop() }
        let old = try treeContents(home.appending(path: "Caches/\(Self.product)"))
        try Fixtures.randomFile(at: content.appending(path: "Contents/small/f2.bin"), size: 200 << 10)
        try Self.publish(content, version: "2", site: site, format: format)
        let index = try Self.index(site, format)
        let chunks = try #require(index.entries.first { $0.path == "Contents/small/f2.bin" }?.chunks)
        let chunk = try #require(chunks.count > 1 ? chunks[1] : chunks.first)
        var pack = try Data(contentsOf: site.appending(path: Self.packName(format)))
        let middle = Int(chunk.offset + chunk.length / 2)
        for at in middle..<(middle + 16) { pack[at] ^= 0xFF }
        try pack.write(to: site.appending(path: Self.packName(format)))
        let before = server.bodyBytesSent(Self.packName(format))

        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .failed)
        #expect(
            download.error?.code == .checksumMismatch && download.error?.subject == "Contents/small/f2.bin",
            "\(download.error?.description ?? "")")
        let served = server.bodyBytesSent(Self.packName(format)) - before
        print("chunk delta, tampered chunk of \(chunk.length) bytes: \(served) bytes served")
        #expect(served >= 2 * Int(chunk.length), "the chunk was fetched once more: \(served)")
        #expect(served < 3 * (200 << 10), "and no more: \(served)")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")) == old, "version 1 untouched")
        let verify = try await DownloadQueue(home: Home(folder: home)).verify()
        #expect(verify.count == 1 && verify.allSatisfy { $0.isIntact } && verify.first?.content.contentVersion == "1")
    }

    @Test func aRepairOfOneFlippedByteFetchesOneChunk() async throws {
        let format = PackFormat.tarZstd
        let (site, server, home, _) = try await Self.installed("chunk-repair", format)
        defer { server.stop() }
        let installed = home.appending(path: "Caches/\(Self.product)")
        let reference = try treeContents(installed)
        let big = installed.appending(path: "Contents/big.bin").path
        flipByteKeepingTimes(big, at: 3_000_000)

        let queue = try DownloadQueue(
            home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        #expect(try await queue.verify().contains { !$0.isIntact }, "verify sees the damage")
        let before = server.bodyBytesSent(Self.packName(format))
        let id = try #require(try await queue.repair().first?.downloads.first?.id, "a download repairs the pack")
        let done = try #require(await waitFor(queue, id) { $0.state.isSettled }, "the repair settles")
        #expect(done.state == .finished, "\(done.error?.description ?? "")")
        #expect(done.delta != nil && done.deltaFallback == nil, "by chunks: \(done.deltaFallback?.message ?? "")")
        let served = server.bodyBytesSent(Self.packName(format)) - before
        let largest = try Self.index(site, format).entries.first { $0.path == "Contents/big.bin" }?.chunks?.map(\.length).max() ?? 0
        print("chunk repair, one flipped byte in an 8 MiB file: \(served) bytes served (largest chunk \(largest))")
        #expect(served <= Int(largest), "one chunk: \(served) bytes")
        #expect(try treeContents(installed) == reference, "the installed tree is whole again")
        #expect(try await queue.verify().allSatisfy(\.isIntact))
    }

    /// `packs fetch` killed with SIGKILL mid-update, then `packs resume`: the chunks verified before the kill are kept,
    /// so no range completed before it is asked for again, and the server sends at most the planned bytes plus the
    /// range in flight.
    @Test func killedMidUpdateThenResumedFetchesNoVerifiedChunkTwice() throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("chunk-kill-content", files: 40)
        let site = try Fixtures.temporaryDirectory("chunk-kill-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("chunk-kill-home")
        let manifestURL = server.url("manifest.json").absoluteString
        let first = try CLI.run(home: home, ["fetch", manifestURL, Self.product])
        #expect(first.status == 0, "version 1: \(first.stderr)")

        // Five new files of 200 KiB in separate ranges (unchanged files lie between them), served slowly.
        for file in [2, 10, 18, 26, 34] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/small/f\(file).bin"), size: 200 << 10)
        }
        try Self.publish(content, version: "2", site: site, format: format)
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 384 << 10)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let before = server.bodyBytesSent(Self.packName(format))
        let planned = Mutex<Int64>(0)
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product]) { event in
            guard let delta = event["delta"] as? [String: Any], let toFetch = (delta["bytesToFetch"] as? NSNumber)?.int64Value,
                let received = (event["bytesReceived"] as? NSNumber)?.int64Value
            else { return false }
            planned.withLock { $0 = toFetch }
            return received > toFetch * 6 / 10
        }
        #expect(killed, "killed mid-update")
        let bytesToFetch = planned.withLock { $0 }
        usleep(200_000)
        let beforeKill = server.bodyBytesSent(Self.packName(format)) - before
        #expect(beforeKill < Int(bytesToFetch), "killed before the end: \(beforeKill) of \(bytesToFetch)")
        let early = server.requests().filter { $0.file == Self.packName(format) && $0.range != nil }
        let completed = Set(early.dropLast().compactMap(\.range))
        #expect(completed.count >= 2, "ranges completed before the kill: \(early)")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let late = server.requests().filter { $0.file == Self.packName(format) && $0.range != nil }.dropFirst(early.count)
            .compactMap(\.range)
        #expect(completed.isDisjoint(with: late), "no range completed before the kill is asked for again: before \(early), after \(late)")
        let total = server.bodyBytesSent(Self.packName(format)) - before
        print("chunk delta killed and resumed: \(beforeKill) bytes before the kill, \(total) in all, \(bytesToFetch) planned")
        #expect(
            total <= Int(bytesToFetch) + (200 << 10) + Int(DeltaPlan.coalesceGap),
            "at most the range in flight again: \(beforeKill) before the kill, \(total) in all, of \(bytesToFetch)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, format, "chunk-kill-bsdtar")), "the new version, byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// `packs --json --verbose fetch` of a chunked update: the finished download's `delta` says how many chunks were
    /// fetched and reused and how many bytes were fetched (those the server sent for the ranges), the log says the
    /// plan, and the plain summary line the same counts.
    @Test func theCLISaysTheChunksAndBytesFetchedAndReused() throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("chunk-cli-content")
        let site = try Fixtures.temporaryDirectory("chunk-cli-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("chunk-cli-home")
        let manifestURL = server.url("manifest.json").absoluteString
        let first = try CLI.run(home: home, ["fetch", manifestURL, Self.product])
        #expect(first.status == 0, "version 1: \(first.stderr)")
        let old = try Self.index(site, format)
        try Self.scribble(content.appending(path: "Contents/big.bin"), at: [2_000_000, 6_000_000], length: 10_000)
        try Self.publish(content, version: "2", site: site, format: format)
        let counts = try Self.chunkCounts(site, format, since: old)
        var before = server.bodyBytesSent(Self.packName(format))
        let update = try CLI.run(home: home, ["--json", "--verbose", "fetch", manifestURL, Self.product])
        #expect(update.status == 0, "\(update.stderr)")
        let served = server.bodyBytesSent(Self.packName(format)) - before
        let finished = update.stdout.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }.last { $0["event"] as? String == "download" && $0["state"] as? String == "finished" }
        let delta = try #require(finished?["delta"] as? [String: Any], "a finished delta download: \(update.stdout)")
        #expect((delta["chunksFetched"] as? NSNumber)?.intValue == counts.fetched, "\(delta), \(counts)")
        #expect((delta["chunksReused"] as? NSNumber)?.intValue == counts.reused, "\(delta), \(counts)")
        #expect((delta["bytesFetched"] as? NSNumber)?.intValue == served, "the bytes the server sent: \(delta), served \(served)")
        #expect(
            update.stderr.contains("delta update planned") && update.stderr.contains("chunksFetched=\(counts.fetched)")
                && update.stderr.contains("chunksReused=\(counts.reused)"), "--verbose logs the plan: \(update.stderr)")

        // Version 3, printed plainly: the summary line counts the chunks.
        try Self.scribble(content.appending(path: "Contents/big.bin"), at: [3_000_000], length: 10_000)
        let older = try Self.index(site, format)
        try Self.publish(content, version: "3", site: site, format: format)
        let third = try Self.chunkCounts(site, format, since: older)
        before = server.bodyBytesSent(Self.packName(format))
        let plain = try CLI.run(home: home, ["fetch", manifestURL, Self.product])
        #expect(plain.status == 0, "\(plain.stderr)")
        #expect(
            plain.stdout.contains("\(third.fetched) chunks fetched, \(third.reused) reused"),
            "the summary counts the chunks: \(plain.stdout) (\(third), served \(server.bodyBytesSent(Self.packName(format)) - before))")
    }

    /// An index that would make the update write outside the pack's folder or through a symlink (a publisher's
    /// mistake or worse; the manifest names it) fails the update with `unsafeEntry`, and the installed version stays.
    @Test(arguments: ["absolute symlink", "file through a symlink"])
    func anIndexThatLeadsOutsideThePackFailsAndTheOldVersionStays(change: String) async throws {
        let format = PackFormat.tar
        let label = "chunk-hostile-\(change.replacingOccurrences(of: " ", with: "-"))"
        let (site, server, home, content) = try await Self.installed(label, format, files: 2)
        defer { server.stop() }
        let old = try treeContents(home.appending(path: "Caches/\(Self.product)"))
        try Self.publish(content, version: "2", site: site, format: format)
        var index = try Self.index(site, format)
        if change == "absolute symlink" {
            let number = try #require(index.entries.firstIndex { $0.path == "Contents/small/link" })
            let target = "/etc/passwd"
            index.entries[number].target = target
            index.entries[number].size = Int64(target.utf8.count)
            index.entries[number].sha256 = ChunkAssembly.sha256(Array(target.utf8))
        } else {
            let number = try #require(index.entries.firstIndex { $0.path == "Contents/small/f1.bin" })
            index.entries[number].path = "Contents/small/link/f1.bin"
        }
        try PackIndexer.write(index, to: PackWriter.indexURL(for: site.appending(path: Self.packName(format))))
        try ManifestBuilder.write(folder: site)
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .failed && download.error?.code == .unsafeEntry, "\(download.state) \(download.error?.description ?? "")")
        #expect(download.delta != nil, "it was a delta: \(download.deltaFallback?.message ?? "")")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")) == old, "version 1 untouched")
        #expect(leftoversAfterCleanup(home) == [], "nothing of the update left")
    }

    /// The plan itself, with no I/O: files reused whole, chunks found locally, identical chunks fetched once, close
    /// ones in one range, and each reason to fall back.
    @Test func thePlanTakesLocalChunksFetchesEachOnceAndSaysWhyItFallsBack() throws {
        let digests = (0..<10).map { String(repeating: "\($0)", count: 64) }
        func chunk(_ digest: Int, at offset: Int64, _ length: Int64) -> PackIndex.Chunk {
            PackIndex.Chunk(sha256: digests[digest], size: length, offset: offset, length: length, storage: .raw)
        }
        func file(_ path: String, _ digest: String, _ chunks: [PackIndex.Chunk]) -> PackIndex.Entry {
            PackIndex.Entry(
                path: path, kind: .file, size: chunks.reduce(0) { $0 + $1.size }, sha256: digest, method: 0, offset: 0, length: 0,
                mode: 0o100644, chunks: chunks)
        }
        func record(_ path: String, _ digest: String, _ size: Int64, kind: InstalledFile.Kind = .file) -> InstalledFileRecord {
            InstalledFileRecord(destination: .caches, contentIdentifier: "c", path: path, kind: kind, size: size, sha256: digest)
        }
        let whole = String(repeating: "a", count: 64)
        let linkDigest = String(repeating: "b", count: 64)
        // a: unchanged (reused whole). b: chunks 1 (found locally), 2 and 3 (fetched, 10 KB apart). c: chunk 2 again,
        // then chunk 4 far away.
        let entries = [
            PackIndex.Entry(path: "d", kind: .directory, size: 0, sha256: nil, method: 0, offset: 0, length: 0, mode: 0o040755),
            file("d/a", whole, [chunk(0, at: 512, 100_000)]),
            file(
                "d/b", String(repeating: "c", count: 64),
                [chunk(1, at: 101_000, 50_000), chunk(2, at: 151_000, 50_000), chunk(3, at: 211_000, 50_000)]),
            file("d/c", String(repeating: "d", count: 64), [chunk(2, at: 262_000, 50_000), chunk(4, at: 900_000, 50_000)]),
            PackIndex.Entry(
                path: "d/l", kind: .symlink, size: 1, sha256: linkDigest, method: 0, offset: 0, length: 0, mode: 0o120777),
        ]
        let index = PackIndex(container: .tar, pack: .init(length: 1_000_000, sha256: whole), chunking: .init(.standard), entries: entries)
        let installed = [
            record("old/a", whole, 100_000), record("old/b", String(repeating: "e", count: 64), 80_000),
            record("l", linkDigest, 1, kind: .symlink),
        ]
        let local = [digests[1]: ChunkPlan.LocalChunk(path: "old/b", offset: 30_000, size: 50_000)]
        #expect(ChunkPlan.seeds(index: index, installed: installed, all: installed).map(\.path) == ["old/b"], "only files not reused whole")
        #expect(ChunkPlan.wantedChunks(index: index, installed: installed) == Set(digests[1...4]))
        let plan = try ChunkPlan.make(index: index, packLength: 1_000_000, installed: installed, damaged: [], local: local).get()
        #expect(plan.reuse.map { [$0.path, $0.from] } == [["d/a", "old/a"]])
        #expect(plan.fetch.map(\.sha256) == [digests[2], digests[3], digests[4]], "chunk 2 fetched once")
        #expect(plan.build.map(\.number) == [2, 3])
        #expect(plan.build[0].pieces.map(\.source) == [.local(local[digests[1]]!), .fetched(0), .fetched(1)])
        #expect(plan.build[1].pieces.map(\.source) == [.fetched(0), .fetched(2)])
        #expect(plan.ranges.map { [$0.start, $0.end] } == [[151_000, 261_000], [900_000, 950_000]], "10 KB apart: one range")
        #expect(plan.links == [ChunkPlan.Link(number: 4, target: nil, from: "l")] && plan.directories == ["d"])
        #expect(plan.bytesReused == 150_000 && plan.chunksReused == 1)

        func reason(_ result: Result<ChunkPlan, DeltaRefusal>) -> Download.DeltaFallback.Reason? {
            if case .failure(let refusal) = result { return refusal.fallback.reason } else { return nil }
        }
        #expect(
            reason(ChunkPlan.make(index: index, packLength: 1_000_000, installed: installed, damaged: ["x"], local: local))
                == .installedFilesChanged)
        #expect(
            reason(ChunkPlan.make(index: index, packLength: 300_000, installed: installed, damaged: [], local: local)) == .indexUnusable,
            "another pack")
        #expect(
            reason(ChunkPlan.make(index: index, packLength: 1_000_000, installed: Array(installed.prefix(2)), damaged: [], local: local))
                == .indexUnusable, "a symlink whose target is nowhere")
        var small = index
        small.pack?.length = 330_000
        // 210 KB of 330 KB to fetch: the plan says so; whether that is too much is the machine's rule
        // (DeliveryPlanTests.aDeltaThatWouldFetchMoreThanSixtyPercentFetchesTheWholePack).
        let most = try ChunkPlan.make(index: small, packLength: 330_000, installed: installed, damaged: [], local: [:]).get()
        #expect(most.bytesToFetch == 210_000, "210 KB of 330 KB, more than 60%: \(most.bytesToFetch)")
        var bloated = index
        bloated.entries[3].chunks?[1].length = 500_000
        #expect(
            reason(ChunkPlan.make(index: bloated, packLength: 1_000_000, installed: installed, damaged: [], local: local))
                == .indexUnusable,
            "a chunk of 50 KB stored in 500 KB")
        var unchunked = index
        unchunked.entries[2].chunks = nil
        #expect(
            reason(ChunkPlan.make(index: unchunked, packLength: 1_000_000, installed: installed, damaged: [], local: local))
                == .indexUnusable)
    }

    /// A symlink's target is in a format 2 index, checked against the entry's SHA-256 when it is read.
    @Test func aSymlinksTargetIsCheckedAgainstItsDigest() throws {
        let content = try Self.content("chunk-target-content", files: 1)
        let site = try Fixtures.temporaryDirectory("chunk-target-site")
        try Self.publish(content, version: "1", site: site, format: .tar)
        let url = PackWriter.indexURL(for: site.appending(path: Self.packName(.tar)))
        let index = try PackIndex.decode(Data(contentsOf: url), maxEntries: 100, containers: [.tar])
        #expect(index.entries.first { $0.path == "Contents/small/link" }?.target == "../run.sh")
        let text = String(decoding: try PackIndex.json(Data(contentsOf: url)), as: UTF8.self).replacingOccurrences(
            of: "\"..\\/run.sh\"", with: "\"..\\/run.sx\""
        )
        .replacingOccurrences(of: "\"../run.sh\"", with: "\"../run.sx\"")
        #expect(text.contains("run.sx"))
        #expect(throws: DeltaRefusal.self) { try PackIndex.decode(Data(text.utf8), maxEntries: 100, containers: [.tar]) }
    }
}
