import Foundation
import PackTestSupport
import Testing

@_spi(Fuzzing) @testable import PackDelivery

/// Index format 3: in a tar.zst, files smaller than ``PackFrameSink/groupedFileLimit`` share zstd frames with their tar
/// headers, and each of their chunks is a slice of its frame (`zstd-frame-slice`). Read back by `zstd -d | tar x`
/// and `bsdtar`; installed, updated and repaired by chunk over real libcurl against a loopback server that counts
/// the bytes it sends; hostile slices refused, or caught by their SHA-256 with the old version kept.
@Suite("Grouped frames", .serialized, .timeLimit(.minutes(6)))
struct GroupedFramesTests {
    static let product = ChunkDeltaTests.product
    static let format = PackFormat.tarZstd
    static var packName: String { ChunkDeltaTests.packName(Self.format) }

    /// Small random files (4–100 KiB), small text files, a 1 MiB random file, an empty file, an executable script
    /// and a symlink.
    static func content(_ label: String) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "small"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: contents.appending(path: "text"), withIntermediateDirectories: true)
        try Data(chunkedPackBytes(1 << 20, seed: 5)).write(to: contents.appending(path: "big.bin"))
        for file in 0..<30 {
            let size = 4096 + (file * 7_919 % 97) * 1_024
            try Data(chunkedPackBytes(size, seed: UInt64(100 + file))).write(to: contents.appending(path: "small/s\(file).bin"))
        }
        for file in 0..<20 {
            let text = (0..<(200 + file * 10)).map { "text \(file), line \($0): a tree, a rock and \($0 % 13) birds\n" }.joined()
            try Data(text.utf8).write(to: contents.appending(path: "text/t\(file).txt"))
        }
        try Data().write(to: contents.appending(path: "small/empty"))
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: contents.appending(path: "run.sh"))
        chmod(contents.appending(path: "run.sh").path, 0o755)
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "small/link").path, withDestinationPath: "../run.sh")
        return content
    }

    /// A chunk's bytes as the standard tools read them: its range of the pack through `zstd -dc`, and for a slice,
    /// its bytes of the frame decompressed (whose length must be the frame's size).
    static func chunkBytes(_ pack: URL, _ chunk: PackIndex.Chunk) throws -> Data {
        let stored = try ChunkedPackTests.stored(pack, offset: chunk.offset, length: chunk.length, storage: chunk.storage)
        guard chunk.storage == .zstdFrameSlice else { return stored }
        let (size, offset) = (try #require(chunk.frameSize), try #require(chunk.frameOffset))
        #expect(Int64(stored.count) == size, "the frame at \(chunk.offset) decompresses to the size the index gives")
        return stored.subdata(in: Int(offset)..<Int(offset + chunk.size))
    }

    /// The bytes of the pack holding the chunks of the site's index whose SHA-256 `old` does not have: each frame once.
    static func newFrameBytes(_ site: URL, since old: PackIndex) throws -> (bytes: Int, frames: Int) {
        let known = Set(old.entries.flatMap { $0.chunks ?? [] }.map(\.sha256))
        let fresh = try ChunkDeltaTests.index(site, Self.format).entries.flatMap { $0.chunks ?? [] }.filter { !known.contains($0.sha256) }
        let frames = Set(fresh.map { [$0.offset, $0.length] })
        return (frames.reduce(0) { $0 + Int($1[1]) }, frames.count)
    }

    @Test("Small files share frames, read back by zstd -d | tar x and bsdtar; every slice has its chunk's SHA-256")
    func groupedPackReadsEverywhere() throws {
        let content = try Self.content("grouped-content")
        let (pack, index) = try ChunkedPackTests.pack(content, Self.format, label: "grouped-site")
        #expect(index.format == 3, "a pack with shared frames says format 3")
        for (tool, command) in [
            ("zstd -d | tar x", "zstd -dc '\(pack.path)' | tar -x -C \"$out\""), ("bsdtar", "bsdtar -xf '\(pack.path)' -C \"$out\""),
        ] {
            let out = try Fixtures.temporaryDirectory("grouped-unpacked")
            let run = try Fixtures.run("/bin/sh", ["-c", "out='\(out.path)'; \(command)"])
            #expect(run.status == 0, "\(tool): \(run.stderr)")
            #expect(try treeContents(out.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))), "\(tool)")
        }
        let files = try treeContents(content)
        var slices: [PackIndex.Chunk] = []
        for entry in index.entries where entry.kind == .file {
            var joined = Data()
            for chunk in entry.chunks ?? [] {
                let bytes = try Self.chunkBytes(pack, chunk)
                #expect(ChunkedPackTests.sha256(bytes) == chunk.sha256 && Int64(bytes.count) == chunk.size, "\(entry.path)")
                joined.append(bytes)
                if chunk.storage == .zstdFrameSlice { slices.append(chunk) }
            }
            #expect(ChunkedPackTests.sha256(joined) == entry.sha256, "\(entry.path): its chunks make the file")
            let grouped = entry.chunks?.contains { $0.storage == .zstdFrameSlice } == true
            if let file = files[entry.path], entry.path != "ContentInfo.plist" {
                #expect(grouped == (!file.isEmpty && file.count < PackFrameSink.groupedFileLimit), "\(entry.path): \(file.count) bytes")
            }
        }
        let frames = Set(slices.map(\.offset))
        #expect(slices.count >= 50 && frames.count < slices.count / 3, "\(slices.count) slices in \(frames.count) frames")
        #expect(slices.allSatisfy { ($0.frameSize ?? 0) <= Int64(PackFrameSink.groupLimit) + (16 << 10) }, "frames of at most the limit")
        // The seek table lists the shared frames too: its frames tile the pack up to the table.
        let bytes = try Data(contentsOf: pack)
        func u32(_ at: Int) -> Int { (0..<4).reduce(0) { $0 | Int(bytes[at + $1]) << (8 * $1) } }
        let count = u32(bytes.count - 9)
        let tableStart = bytes.count - 9 - 8 * count - 8
        #expect(u32(tableStart) == 0x184D_2A5E && (0..<count).reduce(0) { $0 + u32(tableStart + 8 + 8 * $1) } == tableStart)
    }

    @Test("Hostile slices are refused with what is wrong; slices sharing one frame are read")
    func hostileSlices() throws {
        let digest = PackIndexFormat2Tests.digest
        func slice(_ offset: Int, _ length: Int, size: Int, frameSize: Int, frameOffset: Int) -> [String: Any] {
            [
                "sha256": digest, "size": size, "offset": offset, "length": length, "storage": "zstd-frame-slice",
                "frameSize": frameSize, "frameOffset": frameOffset,
            ]
        }
        /// Two files of one slice each, in the frame at 1000+3000 of 100,000 bytes, with `change` applied to the root.
        func index(format: Int = 3, _ change: (inout [String: Any]) -> Void = { _ in }) throws -> Data {
            var root: [String: Any] = [
                "format": format, "container": "tar.zst", "pack": ["length": 10_000, "sha256": digest],
                "chunking": ["algorithm": "fastcdc", "minimum": 16_384, "average": 32_768, "maximum": 262_144, "normalization": 1],
                "entries": [
                    [
                        "path": "a", "kind": "file", "size": 40_000, "sha256": digest, "mode": 0o100644,
                        "chunks": [slice(1_000, 3_000, size: 40_000, frameSize: 100_000, frameOffset: 512)],
                    ],
                    [
                        "path": "b", "kind": "file", "size": 50_000, "sha256": digest, "mode": 0o100644,
                        "chunks": [slice(1_000, 3_000, size: 50_000, frameSize: 100_000, frameOffset: 41_472)],
                    ],
                ],
            ]
            change(&root)
            return try JSONSerialization.data(withJSONObject: root)
        }
        func chunk(_ root: inout [String: Any], file: Int, _ change: (inout [String: Any]) -> Void) {
            var entries = root["entries"] as! [[String: Any]]
            var chunks = entries[file]["chunks"] as! [[String: Any]]
            change(&chunks[0])
            entries[file]["chunks"] = chunks
            root["entries"] = entries
        }
        #expect(PackIndexFormat2Tests.refusal(try index()) == nil, "two slices of one frame")
        let decoded = try PackIndex.decode(try index(), maxEntries: 10, containers: [.tarZstd])
        #expect(decoded.entries[1].chunks?.first?.frameOffset == 41_472 && decoded.entries[1].chunks?.first?.frameSize == 100_000)
        let cases: [(String, Data)] = [
            ("outside its frame", try index { chunk(&$0, file: 1) { $0["frameOffset"] = 50_001 } }),
            ("outside its frame", try index { chunk(&$0, file: 0) { $0["frameOffset"] = -1 } }),
            ("outside 1…", try index { chunk(&$0, file: 0) { $0["frameSize"] = 0 } }),
            ("outside 1…", try index { chunk(&$0, file: 0) { $0["frameSize"] = (64 << 20) + 1 } }),
            ("outside its frame", try index { chunk(&$0, file: 0) { $0["frameSize"] = 30_000 } }),
            ("without its frame's", try index { chunk(&$0, file: 0) { $0.removeValue(forKey: "frameSize") } }),
            ("with a frame slice's fields", try index { chunk(&$0, file: 0) { $0["storage"] = "zstd-frame" } }),
            // The same range as two frames of different sizes, a frame and a slice, or slices of ranges that cross.
            ("overlapping", try index { chunk(&$0, file: 1) { $0["frameSize"] = 100_001 } }),
            (
                "overlapping",
                try index {
                    chunk(&$0, file: 1) {
                        $0["storage"] = "zstd-frame"
                        $0.removeValue(forKey: "frameSize")
                        $0.removeValue(forKey: "frameOffset")
                    }
                }
            ),
            ("overlapping", try index { chunk(&$0, file: 1) { $0["offset"] = 2_000 } }),
            ("overlapping", try index { chunk(&$0, file: 1) { $0["length"] = 2_999 } }),
            ("cannot hold", try index(format: 2)),
            ("outside the pack", try index { chunk(&$0, file: 1) { $0["length"] = 9_001 } }),
            ("not 1, 2 or 3", try index(format: 4)),
        ]
        for (reason, data) in cases {
            let message = PackIndexFormat2Tests.refusal(data)
            #expect(message?.contains(reason) == true, "\(reason): \(message ?? "accepted")")
        }
        // The fuzzer's oracle agrees: shared frames are no broken promise, crossing ones are.
        #expect(FuzzEntry.indexPromisesBroken(try index()) == [])
    }

    @Test("The plan fetches a shared frame once for all its slices, and counts its bytes once")
    func planFetchesASharedFrameOnce() throws {
        let digest = { (n: Int) in String(repeating: String(format: "%02x", n), count: 32) }
        let chunks = (0..<4).map { n in
            PackIndex.Chunk(
                sha256: digest(n + 1), size: 1_000, offset: n < 3 ? 500 : 5_000_000, length: n < 3 ? 2_000 : 800,
                frameSize: 10_000, frameOffset: Int64(n) * 1_000)
        }
        let ranges = ChunkPlan.coalesce(Array(chunks.indices).reversed(), in: chunks)
        #expect(ranges.map { [$0.start, $0.end] } == [[500, 2_500], [5_000_000, 5_000_800]])
        #expect(ranges.first?.chunks.sorted() == [0, 1, 2])
        let windows = ChunkPlan.windows(Array(chunks.indices), in: chunks, window: 1 << 20)
        #expect(windows.map { [$0.start, $0.end] } == [[500, 2_500], [5_000_000, 5_000_800]])
        #expect(ChunkPlan.storedLength([0, 1, 2, 3], in: chunks) == 2_800)
    }

    /// Version 1 of the grouped content, installed (a first install, written once from the shared frames).
    static func installed(_ label: String) async throws -> (site: URL, server: FaultServer, home: URL, content: URL) {
        let content = try Self.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try ChunkDeltaTests.publish(content, version: "1", site: site, format: Self.format)
        let server = try FaultServer(root: site)
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await ChunkDeltaTests.fetch(server.url("manifest.json"), home: home)
        #expect(first.state == .finished && first.delta == nil, "version 1 installs whole: \(first.error?.description ?? "")")
        let served = server.bodyBytesSent(Self.packName)
        #expect(served <= (try ChunkDeltaTests.packLength(site, Self.format)), "each shared frame fetched once: \(served)")
        let tree = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(tree) == (try ChunkDeltaTests.reference(site, Self.format, label + "-bsdtar1")), "bsdtar's tree")
        return (site, server, home, content)
    }

    @Test("Install, update and repair of a grouped pack: a changed small file costs its frame, fetched once")
    func installUpdateAndRepairByFrame() async throws {
        let (site, server, home, content) = try await Self.installed("grouped-update")
        defer { server.stop() }
        let old = try ChunkDeltaTests.index(site, Self.format)
        for file in [3, 17] {
            let url = content.appending(path: "Contents/small/s\(file).bin")
            let size = try Data(contentsOf: url).count
            try Data(chunkedPackBytes(size, seed: UInt64(900 + file))).write(to: url)
        }
        try ChunkDeltaTests.publish(content, version: "2", site: site, format: Self.format)
        let before = server.bodyBytesSent(Self.packName)
        let update = try await ChunkDeltaTests.fetch(server.url("manifest.json"), home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        let delta = try #require(update.delta, "a delta update: \(update.deltaFallback?.message ?? "")")
        let served = server.bodyBytesSent(Self.packName) - before
        let fresh = try Self.newFrameBytes(site, since: old)
        print("grouped update, 2 small files changed: \(served) bytes served, \(fresh.bytes) in \(fresh.frames) new frames (\(delta))")
        #expect(served == Int(delta.bytesToFetch) && Int(delta.bytesFetched) == served, "the server sent the ranges planned: \(delta)")
        #expect(
            served >= fresh.bytes && served <= fresh.bytes + fresh.frames * Int(DeltaPlan.coalesceGap),
            "each new frame once: \(served), frames \(fresh.bytes)")
        let installed = try #require(update.contentURL)
        #expect(try treeContents(installed) == (try ChunkDeltaTests.reference(site, Self.format, "grouped-update-bsdtar2")))
        #expect(FileManager.default.isExecutableFile(atPath: installed.appending(path: "Contents/run.sh").path), "modes kept")

        // Repair: one flipped byte of a small file costs its frame.
        flipByteKeepingTimes(installed.appending(path: "Contents/small/s5.bin").path, at: 100)
        let queue = try DownloadQueue(
            home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        #expect(try await queue.verify().contains { !$0.isIntact }, "verify sees the damage")
        let start = server.bodyBytesSent(Self.packName)
        let id = try #require(try await queue.repair().first?.downloads.first?.id, "a download repairs the pack")
        let done = try #require(await waitFor(queue, id) { $0.state.isSettled }, "the repair settles")
        #expect(done.state == .finished && done.delta != nil, "\(done.error?.description ?? "") \(done.deltaFallback?.message ?? "")")
        let repaired = server.bodyBytesSent(Self.packName) - start
        let frame = try #require(
            try ChunkDeltaTests.index(site, Self.format).entries.first { $0.path == "Contents/small/s5.bin" }?.chunks?.first)
        print("grouped repair, one flipped byte of a small file: \(repaired) bytes served (its frame: \(frame.length))")
        #expect(frame.storage == .zstdFrameSlice && repaired <= Int(frame.length), "its frame only: \(repaired)")
        #expect(try treeContents(installed) == (try ChunkDeltaTests.reference(site, Self.format, "grouped-update-bsdtar3")))
        #expect(try await queue.verify().allSatisfy(\.isIntact))
        // The repair's folder goes once the download has settled.
        #expect(leftoversAfterCleanup(home).isEmpty, "nothing of the updates left: \(leftovers(home))")
    }

    /// Version 2 published with two changed small files of one shared frame, then its index changed by `change`
    /// (given the frame's slices of the changed files) and sealed into the manifest.
    static func hostileUpdate(
        _ label: String, _ change: (inout PackIndex, _ changed: [(entry: Int, chunk: Int)]) throws -> Void
    ) async throws -> (download: Download, old: [String: Data], home: URL, served: Int, frame: Int) {
        let (site, server, home, content) = try await Self.installed(label)
        defer { server.stop() }
        let old = try treeContents(home.appending(path: "Caches/\(Self.product)"))
        let v1 = try ChunkDeltaTests.index(site, Self.format)
        // Two neighbours of one frame.
        let frames = Dictionary(grouping: v1.entries.filter { $0.path.hasPrefix("Contents/small/s") }) { $0.chunks?.first?.offset ?? -1 }
        let pair = try #require(frames.values.first { $0.count >= 2 }?.prefix(2).map(\.path))
        for (number, path) in pair.enumerated() {
            let url = content.appending(path: path)
            try Data(chunkedPackBytes(try Data(contentsOf: url).count, seed: UInt64(7_777 + number))).write(to: url)
        }
        try ChunkDeltaTests.publish(content, version: "2", site: site, format: Self.format)
        var index = try ChunkDeltaTests.index(site, Self.format)
        let changed = try pair.map { path in (try #require(index.entries.firstIndex { $0.path == path }), 0) }
        #expect(Set(changed.map { index.entries[$0.0].chunks?[0].offset }).count == 1, "still one frame")
        let frame = Int(index.entries[changed[0].0].chunks?[0].length ?? 0)
        try change(&index, changed)
        try PackIndexer.write(index, to: PackWriter.indexURL(for: site.appending(path: Self.packName)))
        try ManifestBuilder.write(folder: site)
        let before = server.bodyBytesSent(Self.packName)
        let download = try await ChunkDeltaTests.fetch(server.url("manifest.json"), home: home)
        return (download, old, home, server.bodyBytesSent(Self.packName) - before, frame)
    }

    @Test(
        "A frame that does not decompress to the index's size, or a slice whose bytes differ while its neighbour's match: fetched twice, then checksumMismatch naming the file, and the old version stays",
        arguments: ["frame size", "neighbour differs"])
    func hostileFramesKeepTheOldVersion(change: String) async throws {
        let label = "grouped-hostile-\(change.replacingOccurrences(of: " ", with: "-"))"
        let (download, old, home, served, frame) = try await Self.hostileUpdate(label) { index, changed in
            if change == "frame size" {
                // Every slice of the frame says it is one byte larger than it is.
                let offset = index.entries[changed[0].entry].chunks?[0].offset
                for entry in index.entries.indices {
                    for chunk in (index.entries[entry].chunks ?? []).indices where index.entries[entry].chunks?[chunk].offset == offset {
                        index.entries[entry].chunks?[chunk].frameSize! += 1
                    }
                }
            } else {
                // The second file's slice: one byte later in the frame (its bytes differ); the first file's still matches.
                index.entries[changed[1].entry].chunks?[0].frameOffset! -= 1
            }
        }
        let subject = download.error?.subject ?? ""
        #expect(download.state == .failed && download.error?.code == .checksumMismatch, "\(download.error?.description ?? "")")
        #expect(subject.hasPrefix("Contents/small/s"), "names a file of the frame: \(subject)")
        print("grouped hostile \(change): \(served) bytes served (frame \(frame))")
        #expect(served >= 2 * frame && served < 4 * frame, "the frame was fetched once more, and no more: \(served)")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")) == old, "version 1 untouched")
        let verify = try await DownloadQueue(home: Home(folder: home)).verify()
        #expect(verify.count == 1 && verify.allSatisfy { $0.isIntact } && verify.first?.content.contentVersion == "1")
    }

    /// Killed mid-install of a pack of 400 small files (SIGKILL, nginx at a rate limit), then resumed: the slices
    /// recorded before the kill are not fetched again (no completed range is asked for twice), at most the two ranges
    /// in flight are sent twice, and the tree is `bsdtar -xf` of the pack.
    @Test func killedMidInstallOfAGroupedPackThenResumedFetchesNoVerifiedFrameTwice() throws {
        let content = try Fixtures.temporaryDirectory("grouped-kill-content")
        for file in 0..<400 {
            let url = content.appending(path: "Contents/d\(file % 20)/f\(file).bin")
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try Data(chunkedPackBytes(4096 + (file * 7_919 % 97) * 1_024, seed: UInt64(5_000 + file))).write(to: url)
        }
        let site = try Fixtures.temporaryDirectory("grouped-kill-site")
        try WriteOnceTests.publish(content, site: site, format: Self.format)
        let name = WriteOnceTests.packName(Self.format)
        let packLength = try WriteOnceTests.length(site.appending(path: name))
        let index = try ChunkDeltaTests.index(site, Self.format)
        #expect(
            index.format == 3
                && index.entries.allSatisfy {
                    $0.path == "ContentInfo.plist" || $0.chunks?.allSatisfy { $0.storage == .zstdFrameSlice } ?? true
                })
        let nginx = try NginxServer(root: site, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("grouped-kill-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let killed = try runAndKill(home: home, ["fetch", manifestURL, WriteOnceTests.product]) { event in
            guard let received = (event["bytesReceived"] as? NSNumber)?.int64Value else { return false }
            return received > Int64(packLength) / 2
        }
        #expect(killed, "killed mid-install")
        usleep(300_000)
        let early = nginx.requests().filter { $0.uri.hasSuffix(name) && $0.range != nil }
        let completed = early.dropLast(2).compactMap { $0.range.flatMap(WriteOnceTests.bounds) }
        let beforeKill = nginx.bodyBytesSent(path: "/" + name)
        #expect(completed.count >= 2, "ranges completed before the kill: \(early)")
        #expect(beforeKill < packLength, "killed before the end: \(beforeKill) of \(packLength)")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        nginx.waitForRequests(early.count + 1)
        let late = nginx.requests().filter { $0.uri.hasSuffix(name) && $0.range != nil }.dropFirst(early.count)
            .compactMap { $0.range.flatMap(WriteOnceTests.bounds) }
        #expect(!late.isEmpty, "the resume fetched the rest")
        for range in late {
            #expect(!completed.contains { $0.overlaps(range) }, "\(range) asks again for bytes completed before the kill: \(completed)")
        }
        let total = nginx.bodyBytesSent(path: "/" + name)
        let window = Int(ChunkPlan.window(packLength: Int64(packLength)))
        print("grouped pack killed and resumed: \(beforeKill) bytes before the kill, \(total) in all, pack \(packLength)")
        #expect(total <= packLength + 2 * window, "at most the two ranges in flight again: \(total) of \(packLength)")
        let installed = home.appending(path: "Caches/\(WriteOnceTests.product)")
        #expect(try treeContents(installed) == (try WriteOnceTests.reference(site, Self.format, "grouped-kill-bsdtar")), "byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }
}
