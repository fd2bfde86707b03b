import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// Packs written by the previous writer (index format 2: every chunk its own zstd frame, no shared frames), as
/// publishers have them on their servers: the tar.zst, its index and manifest of two small versions and a big one, in
/// `Fixtures/FormatTwo` (see its README for the commit and commands that made them). Served by nginx, which counts the
/// bytes it sends; installed, updated (to format 2 and to today's format 3, and from format 3 back to format 2),
/// repaired and resumed after a kill over real libcurl and libarchive; trees compared with `bsdtar -xf` of the pack.
@Suite("Format 2 packs of the previous writer", .serialized, .timeLimit(.minutes(6)))
struct FormatTwoTests {
    static let product = "com.example.formattwo"
    static let packName = "pack.tar.zst"
    static let fixtures = URL(filePath: #filePath).deletingLastPathComponent().appending(path: "Fixtures/FormatTwo")

    /// Puts the fixture `name` (`v1`, `v2` or `big`: pack, index and the manifest the old `packs manifest` wrote) in
    /// `site`, replacing what is there. The big pack (18.6 MB, over the 16 MiB from which a first install writes each
    /// chunk once) is checked in xz-compressed.
    static func publishFixture(_ name: String, site: URL) throws {
        let folder = Self.fixtures.appending(path: name)
        for file in [Self.packName, Self.packName + ".index.json", "manifest.json"] {
            let target = site.appending(path: file)
            try? FileManager.default.removeItem(at: target)
            if FileManager.default.fileExists(atPath: folder.appending(path: file).path) {
                try FileManager.default.copyItem(at: folder.appending(path: file), to: target)
            } else {
                let xz = try Fixtures.run(
                    "/bin/sh", ["-c", "xz -dc '\(folder.appending(path: file + ".xz").path)' > '\(target.path)'"], timeout: 60)
                #expect(xz.status == 0, "xz -d: \(xz.stderr)")
            }
        }
    }

    /// Publishes the tree of version `version`'s fixture pack (unpacked by bsdtar, without its ContentInfo.plist) with
    /// today's writer: a format 3 pack when it has small files.
    static func publishToday(_ version: Int, site: URL, label: String) throws {
        let tree = try Fixtures.temporaryDirectory(label)
        let bsdtar = try Fixtures.run(
            "bsdtar", ["-xf", Self.fixtures.appending(path: "v\(version)/\(Self.packName)").path, "-C", tree.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        try FileManager.default.removeItem(at: tree.appending(path: "ContentInfo.plist"))
        try PackWriter.write(
            folder: tree, to: site.appending(path: Self.packName), format: .tarZstd,
            contentInfo: (productIdentifier: Self.product, contentVersion: "\(version)"))
        try ManifestBuilder.write(folder: site)
    }

    /// Replaces the site's index by its JSON, uncompressed, and names that in the manifest.
    static func plainIndex(_ site: URL) throws {
        let url = site.appending(path: Self.packName + ".index.json")
        let json = try PackIndex.json(Data(contentsOf: url))
        #expect(json.first == UInt8(ascii: "{"), "plain JSON")
        try json.write(to: url)
        let manifestURL = site.appending(path: "manifest.json")
        var manifest = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: manifestURL)) as? [String: Any])
        var products = try #require(manifest["products"] as? [[String: Any]])
        var contents = try #require(products[0]["contents"] as? [[String: Any]])
        contents[0]["index"] = ["url": Self.packName + ".index.json", "length": json.count, "sha256": ChunkedPackTests.sha256(json)]
        products[0]["contents"] = contents
        manifest["products"] = products
        try JSONSerialization.data(withJSONObject: manifest, options: [.sortedKeys]).write(to: manifestURL)
    }

    static func index(_ site: URL) throws -> PackIndex {
        try JSONDecoder().decode(
            PackIndex.self, from: PackIndex.json(Data(contentsOf: site.appending(path: Self.packName + ".index.json"))))
    }

    static func packLength(_ site: URL) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: site.appending(path: Self.packName).path)[.size] as? Int)
    }

    /// What a user sees of a tree: each path's kind, a file's bytes and whether it is executable, a symlink's target;
    /// folders (empty ones too) by their path.
    static func tree(_ folder: URL) throws -> [String: String] {
        var result: [String: String] = [:]
        let enumerator = FileManager.default.enumerator(atPath: folder.path)
        while let path = enumerator?.nextObject() as? String {
            let url = folder.appending(path: path)
            var info = stat()
            guard lstat(url.path, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFDIR: result[path] = "folder"
            case S_IFLNK: result[path] = "symlink to " + (try FileManager.default.destinationOfSymbolicLink(atPath: url.path))
            case S_IFREG:
                let executable = info.st_mode & 0o100 != 0 ? "executable " : ""
                result[path] = "\(executable)file \(ChunkedPackTests.sha256(try Data(contentsOf: url)))"
            default: result[path] = "other \(info.st_mode)"
            }
        }
        return result
    }

    /// ``tree(_:)`` of `bsdtar -xf` of the site's pack.
    static func reference(_ site: URL, _ label: String) throws -> [String: String] {
        let folder = try Fixtures.temporaryDirectory(label)
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", site.appending(path: Self.packName).path, "-C", folder.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        return try Self.tree(folder)
    }

    /// The bytes nginx sent of the pack, once the requests it is still logging are logged (it logs a request when it
    /// ends, a moment after the client saw its last byte): the count once it has stayed the same for 0.3 s.
    static func served(_ nginx: NginxServer) -> Int {
        var (last, stable) = (nginx.bodyBytesSent(path: "/" + Self.packName), 0)
        for _ in 0..<50 where stable < 3 {
            usleep(100_000)
            let now = nginx.bodyBytesSent(path: "/" + Self.packName)
            (last, stable) = (now, now == last ? stable + 1 : 0)
        }
        return last
    }

    static func fetch(_ nginx: NginxServer, home: URL) async throws -> Download {
        let queue = try WriteOnceTests.queue(home)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        return try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
    }

    /// What a chunked update from `old` to the site's index should report: the distinct chunks it does not have, and
    /// the chunks of the new files that it has.
    static func chunkCounts(_ site: URL, since old: PackIndex) throws -> (fetched: Int, reused: Int) {
        let known = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        let pieces = try Self.index(site).entries.flatMap { $0.chunks ?? [] }
        return (Set(pieces.map(\.sha256)).subtracting(known).count, pieces.filter { known.contains($0.sha256) }.count)
    }

    /// The stored bytes of the site's pack holding chunks that `old` does not have (each frame, or shared frame, once),
    /// and what the ranges that fetch them cost: frames less than ``DeltaPlan/coalesceGap`` apart share a range, the
    /// gap fetched with them (in a pack this small, that gap is most of what an update costs).
    static func newFrameBytes(_ site: URL, since old: PackIndex) throws -> (bytes: Int, frames: Int, ranges: Int) {
        let known = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        let fresh = try Self.index(site).entries.flatMap { $0.chunks ?? [] }.filter { !known.contains($0.sha256) }
        let frames = Set(fresh.map { [$0.offset, $0.length] })
        return (frames.reduce(0) { $0 + Int($1[1]) }, frames.count, Self.rangeBytes(frames))
    }

    /// The bytes of ranges covering `frames` (offset, length), joining those at most ``DeltaPlan/coalesceGap`` apart.
    static func rangeBytes(_ frames: Set<[Int64]>) -> Int {
        var ranges: [(start: Int64, end: Int64)] = []
        for frame in frames.sorted(by: { $0[0] < $1[0] }) {
            if let last = ranges.last, frame[0] >= last.end, frame[0] - last.end <= DeltaPlan.coalesceGap {
                ranges[ranges.count - 1].end = max(last.end, frame[0] + frame[1])
            } else {
                ranges.append((frame[0], frame[0] + frame[1]))
            }
        }
        return ranges.reduce(0) { $0 + Int($1.end - $1.start) }
    }

    /// Version `version` of the fixtures, installed whole from nginx at a fresh site.
    static func installedFixture(_ label: String, _ name: String = "v1") async throws -> (site: URL, nginx: NginxServer, home: URL) {
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publishFixture(name, site: site)
        let nginx = try NginxServer(root: site)
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await Self.fetch(nginx, home: home)
        #expect(first.state == .finished && first.delta == nil, "\(name) installs whole: \(first.error?.description ?? "")")
        return (site, nginx, home)
    }

    /// Whether the library's verify finds every installed product as its record gives it.
    static func verifiedIntact(_ home: URL) async throws -> Bool {
        let queue = try WriteOnceTests.queue(home)
        defer { queue.close() }
        let results = try await queue.verify()
        return !results.isEmpty && results.allSatisfy(\.isIntact)
    }

    static func installedTree(_ home: URL) -> URL { home.appending(path: "Caches/\(Self.product)") }

    @Test("The fixtures are what the previous writer wrote: format 2, one zstd frame per chunk, no slices")
    func theFixturesAreFormatTwo() throws {
        for name in ["v1", "v2", "big"] {
            let site = try Fixtures.temporaryDirectory("format2-fixtures-\(name)")
            try Self.publishFixture(name, site: site)
            let index = try Self.index(site)
            let chunks = index.entries.flatMap { $0.chunks ?? [] }
            #expect(index.format == 2 && index.container == .tarZstd, "\(name): format \(index.format)")
            #expect(!chunks.isEmpty && chunks.allSatisfy { $0.storage == .zstdFrame && $0.frameSize == nil && $0.frameOffset == nil })
            #expect(index.pack?.length == Int64(try Self.packLength(site)), "the index describes the checked-in pack")
            let kinds = Set(index.entries.map(\.kind))
            #expect(kinds.isSuperset(of: [.file, .directory, .symlink]), "files, folders and a symlink: \(kinds)")
        }
    }

    /// The small pack is fetched whole and unpacked as it streams; the big one (over 16 MiB) is fetched in ranges and
    /// each chunk written once into the new version's files.
    @Test(
        "A first install of a format 2 tar.zst is bsdtar -xf of the pack, fetched once, and verifies clean",
        arguments: ["v1", "big"])
    func firstInstallOfAFormatTwoPack(name: String) async throws {
        let (site, nginx, home) = try await Self.installedFixture("format2-first-\(name)", name)
        defer { nginx.stop() }
        let installed = Self.installedTree(home)
        let reference = try Self.reference(site, "format2-first-\(name)-bsdtar")
        #expect(try Self.tree(installed) == reference, "the installed tree is bsdtar's")
        #expect(reference["Contents/deep/emptydir"] == "folder" && reference["Contents/small/link"] == "symlink to ../run.sh")
        let served = Self.served(nginx)
        let length = try Self.packLength(site)
        let requests = nginx.requests().filter { $0.uri.hasSuffix(Self.packName) }
        print("format 2 first install of \(name): \(served) bytes served of a \(length) byte pack in \(requests.count) requests")
        #expect(served <= length, "each byte of the pack sent at most once: \(served) of \(length)")
        if Int64(length) >= IndexDigests.minimumPackLength {
            #expect(requests.allSatisfy { $0.range != nil && $0.status == 206 }, "only ranges of the pack, chunk by chunk: \(requests)")
        }
        let queue = try WriteOnceTests.queue(home)
        defer { queue.close() }
        let verify = try await queue.verify()
        #expect(verify.count == 1 && verify.allSatisfy(\.isIntact), "verify is clean: \(verify)")
        let cli = try CLI.run(home: home, ["verify"])
        #expect(cli.status == 0, "packs verify: \(cli.stdout) \(cli.stderr)")
        #expect(leftoversAfterCleanup(home) == [], "nothing left in staging or downloads")
    }

    /// Version 2's index as it is, and as plain JSON (as indexes were written before they were zstd-compressed: the
    /// same JSON, the manifest naming its length and SHA-256).
    @Test(
        "An update from format 2 version 1 to format 2 version 2 fetches only the new chunks' frames",
        arguments: ["zstd index", "plain JSON index"])
    func updateFormatTwoToFormatTwo(index: String) async throws {
        let label = index == "zstd index" ? "format2-update" : "format2-update-plain"
        let (site, nginx, home) = try await Self.installedFixture(label)
        defer { nginx.stop() }
        let old = try Self.index(site)
        try Self.publishFixture("v2", site: site)
        if index == "plain JSON index" { try Self.plainIndex(site) }
        let before = Self.served(nginx)
        let update = try await Self.fetch(nginx, home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        let delta = try #require(update.delta, "a delta update: \(update.deltaFallback?.message ?? "")")
        let served = Self.served(nginx) - before
        let length = try Self.packLength(site)
        let fresh = try Self.newFrameBytes(site, since: old)
        let counts = try Self.chunkCounts(site, since: old)
        print("format 2 → format 2: \(served) of \(length) bytes served, new frames \(fresh) (\(delta))")
        #expect(served == Int(delta.bytesToFetch) && Int(delta.bytesFetched) == served, "the server sent the ranges planned: \(delta)")
        #expect(
            served >= fresh.bytes && served == fresh.ranges, "the new chunks' frames, each once, in their ranges: \(served), \(fresh)")
        #expect(served * 2 < length, "less than half the pack: \(served) of \(length)")
        #expect(delta.chunksFetched == counts.fetched && delta.chunksReused == counts.reused && counts.reused > 0, "\(delta), \(counts)")
        let installed = try #require(update.contentURL)
        #expect(try Self.tree(installed) == (try Self.reference(site, label + "-bsdtar2")), "version 2, byte for byte")
        #expect(try await Self.verifiedIntact(home), "verify is clean")
        #expect(leftoversAfterCleanup(home) == [], "nothing of the update left")
    }

    /// An installed format 2 version 1 updated to today's format 3 version 2 of the same tree, and an installed
    /// format 3 version 1 updated to the fixture's format 2 version 2: the tree exact, and every chunk whose bytes the
    /// installed files hold reused (chunks are cut from a file's bytes alone, so the two writers cut the same ones).
    @Test(
        "Updates between format 2 and today's format 3 reuse the chunks the installed files hold",
        arguments: ["format 2 → format 3", "format 3 → format 2"])
    func updateAcrossFormats(direction: String) async throws {
        let label = direction.hasPrefix("format 2") ? "format2-to-3" : "format3-to-2"
        let site = try Fixtures.temporaryDirectory(label + "-site")
        let upward = direction.hasPrefix("format 2")
        if upward { try Self.publishFixture("v1", site: site) } else { try Self.publishToday(1, site: site, label: label + "-v1tree") }
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await Self.fetch(nginx, home: home)
        #expect(first.state == .finished && first.delta == nil, "version 1 installs whole: \(first.error?.description ?? "")")
        let old = try Self.index(site)
        #expect(old.format == (upward ? 2 : 3))
        if upward { try Self.publishToday(2, site: site, label: label + "-v2tree") } else { try Self.publishFixture("v2", site: site) }
        let new = try Self.index(site)
        #expect(new.format == (upward ? 3 : 2), "today's writer groups the small files: format \(new.format)")

        let before = Self.served(nginx)
        let update = try await Self.fetch(nginx, home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        let delta = try #require(update.delta, "a delta update: \(update.deltaFallback?.message ?? "")")
        let served = Self.served(nginx) - before
        let length = try Self.packLength(site)
        let fresh = try Self.newFrameBytes(site, since: old)
        let counts = try Self.chunkCounts(site, since: old)
        print(
            "\(direction): \(served) of \(length) bytes served, new frames \(fresh) (\(delta), expected \(counts))"
        )
        #expect(served == Int(delta.bytesToFetch) && Int(delta.bytesFetched) == served, "the server sent the ranges planned: \(delta)")
        #expect(
            served >= fresh.bytes && served == fresh.ranges, "the new chunks' frames, each once, in their ranges: \(served), \(fresh)")
        #expect(served * 10 < length * 6, "less than 60 % of the pack: \(served) of \(length)")
        #expect(delta.chunksFetched == counts.fetched && delta.chunksReused == counts.reused && counts.reused > 0, "\(delta), \(counts)")
        let installed = try #require(update.contentURL)
        #expect(try Self.tree(installed) == (try Self.reference(site, label + "-bsdtar2")), "version 2, byte for byte")
        #expect(try await Self.verifiedIntact(home), "verify is clean")
        #expect(leftoversAfterCleanup(home) == [], "nothing of the update left")
    }

    @Test("A repair of a format 2 install fetches the damaged chunks' frames only")
    func repairByChunkOfAFormatTwoInstall() async throws {
        let (site, nginx, home) = try await Self.installedFixture("format2-repair")
        defer { nginx.stop() }
        let installed = Self.installedTree(home)
        let index = try Self.index(site)
        // One byte flipped in the first chunk of the large file, and one in a small file (one chunk), more than
        // DeltaPlan.coalesceGap apart in the pack: two ranges, of one frame each.
        let damage = [("Contents/media/big.bin", 1_000), ("Contents/small/s5.bin", 100)]
        var frames = Set<[Int64]>()
        for (path, offset) in damage {
            flipByteKeepingTimes(installed.appending(path: path).path, at: off_t(offset))
            var start: Int64 = 0
            let chunk = try #require(
                index.entries.first { $0.path == path }?.chunks?.first { chunk in
                    defer { start += chunk.size }
                    return (start..<(start + chunk.size)).contains(Int64(offset))
                })
            frames.insert([chunk.offset, chunk.length])
        }
        let bound = Self.rangeBytes(frames)
        #expect(bound == frames.reduce(0) { $0 + Int($1[1]) }, "two ranges: \(frames)")
        let queue = try WriteOnceTests.queue(home)
        defer { queue.close() }
        #expect(try await queue.verify().contains { !$0.isIntact }, "verify sees the damage")
        let before = Self.served(nginx)
        let id = try #require(try await queue.repair().first?.downloads.first?.id, "a download repairs the pack")
        let done = try #require(await waitFor(queue, id) { $0.state.isSettled }, "the repair settles")
        #expect(done.state == .finished && done.delta != nil, "\(done.error?.description ?? "") \(done.deltaFallback?.message ?? "")")
        let repaired = Self.served(nginx) - before
        print("format 2 repair, a byte flipped in two files: \(repaired) bytes served (their chunks' frames: \(bound))")
        #expect(repaired > 0 && repaired <= bound, "the two damaged chunks' frames only: \(repaired) of \(bound)")
        #expect(try Self.tree(installed) == (try Self.reference(site, "format2-repair-bsdtar")), "the tree is whole again")
        #expect(try await queue.verify().allSatisfy(\.isIntact))
        #expect(leftoversAfterCleanup(home) == [], "nothing of the repair left")
    }

    /// `packs fetch` SIGKILLed halfway through a first install of the big format 2 pack (each chunk written once, nginx at
    /// 8 MiB/s), then `packs resume`: no range completed before the kill is asked for again, at most the two ranges in
    /// flight are sent twice, the tree is bsdtar's and verify is clean.
    @Test func killedMidInstallOfAFormatTwoPackThenResumed() throws {
        let site = try Fixtures.temporaryDirectory("format2-kill-site")
        try Self.publishFixture("big", site: site)
        let length = try Self.packLength(site)
        let nginx = try NginxServer(root: site, limitRate: 8 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("format2-kill-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product]) { event in
            guard let received = (event["bytesReceived"] as? NSNumber)?.int64Value else { return false }
            return received > Int64(length) / 2
        }
        #expect(killed, "killed mid-install")
        #expect(!FileManager.default.fileExists(atPath: Self.installedTree(home).path), "killed before the install ended")
        let beforeKill = Self.served(nginx)
        let early = nginx.requests().filter { $0.uri.hasSuffix(Self.packName) && $0.range != nil }
        let completed = early.dropLast(2).compactMap { $0.range.flatMap(WriteOnceTests.bounds) }
        #expect(completed.count >= 2, "ranges completed before the kill: \(early)")
        #expect(beforeKill < length, "killed before the end: \(beforeKill) of \(length)")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let total = Self.served(nginx)
        let late = nginx.requests().filter { $0.uri.hasSuffix(Self.packName) && $0.range != nil }.dropFirst(early.count)
            .compactMap { $0.range.flatMap(WriteOnceTests.bounds) }
        #expect(!late.isEmpty, "the resume fetched the rest")
        for range in late {
            #expect(!completed.contains { $0.overlaps(range) }, "\(range) asks again for bytes completed before the kill: \(completed)")
        }
        let window = Int(ChunkPlan.window(packLength: Int64(length)))
        print("format 2 pack killed and resumed: \(beforeKill) bytes before the kill, \(total) in all, pack \(length)")
        #expect(total <= length + 2 * window, "at most the two ranges in flight again: \(total) of \(length)")
        #expect(try Self.tree(Self.installedTree(home)) == (try Self.reference(site, "format2-kill-bsdtar")), "byte for byte")
        let verify = try CLI.run(home: home, ["verify"])
        #expect(verify.status == 0, "packs verify: \(verify.stdout) \(verify.stderr)")
        #expect(leftoversAfterCleanup(home) == [])
    }
}
