import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

/// A new version of an indexed zip pack fetches only the entries that changed, with range requests,
/// and builds the new version from them and the installed files. Real libcurl, libarchive and a loopback server
/// that counts the bytes it sends; trees compared with `bsdtar -xf` of the new pack.
@Suite(.serialized, .timeLimit(.minutes(3))) struct DeltaTests {
    static let product = "com.example.delta"

    /// Version 1's content: 24 random files of 96 KiB in nested folders, a 1 MiB file, an executable script and a symlink.
    static func content(_ label: String) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        for folder in 0..<4 {
            try FileManager.default.createDirectory(at: contents.appending(path: "level\(folder)/deep"), withIntermediateDirectories: true)
            for file in 0..<6 {
                try Fixtures.randomFile(
                    at: contents.appending(path: "level\(folder)/\(file < 3 ? "deep/" : "")f\(file).bin"), size: 96 << 10)
            }
        }
        try Fixtures.randomFile(at: contents.appending(path: "big.bin"), size: 1 << 20)
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: contents.appending(path: "run.sh"))
        chmod(contents.appending(path: "run.sh").path, 0o755)
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "level0/link").path, withDestinationPath: "f3.bin")
        return content
    }

    /// Publishes `content` as version `version` of the product: `delta.zip`, its index and `manifest.json`.
    static func publish(_ content: URL, version: String, site: URL) throws {
        try PackWriter.write(
            folder: content, to: site.appending(path: "delta.zip"), format: .zip,
            contentInfo: (productIdentifier: Self.product, contentVersion: version))
        try ManifestBuilder.write(folder: site)
    }

    /// A queue over `home` that has started fetching the product from `manifestURL` (its pack URL replaced by
    /// `packURL`); the caller closes it.
    static func start(_ manifestURL: URL, home: URL, packURL: URL? = nil, writer: (any FileWriting)? = nil) async throws -> (
        queue: DownloadQueue, id: String
    ) {
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1)
        if let writer { configuration.writer = writer }
        let queue = try DownloadQueue(home: Home(folder: home), configuration: configuration)
        var manifest = try await LoadedManifest.load(manifestURL.absoluteString)
        if let packURL {
            var edited = manifest.manifest
            edited.products[0].contents[0].url = packURL.absoluteString
            manifest = try LoadedManifest(manifest: edited, baseURL: manifest.baseURL)
        }
        do {
            let id = try await queue.add(product: Self.product, from: manifest).downloads.first?.id
            return (queue, try #require(id, "a download"))
        } catch {
            await queue.close()
            throw error
        }
    }

    /// ``start(_:home:packURL:writer:)``, then waits for the download to settle.
    static func fetch(_ manifestURL: URL, home: URL, packURL: URL? = nil) async throws -> Download {
        let (queue, id) = try await Self.start(manifestURL, home: home, packURL: packURL)
        defer { queue.close() }
        return try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
    }

    static func packLength(_ site: URL) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: site.appending(path: "delta.zip").path)[.size] as? Int)
    }

    /// The tree bsdtar makes of the site's pack.
    static func reference(_ site: URL, _ label: String) throws -> [String: Data] {
        let folder = try Fixtures.temporaryDirectory(label)
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", site.appending(path: "delta.zip").path, "-C", folder.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        return try treeContents(folder)
    }

    /// Version 1 installed from a fresh site; returns the site, its server, the home and the content folder.
    static func installed(_ label: String) async throws -> (site: URL, server: FaultServer, home: URL, content: URL) {
        let content = try Self.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, version: "1", site: site)
        let server = try FaultServer(root: site)
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(first.state == .finished, "version 1 installs: \(first.error?.description ?? "")")
        #expect(first.delta == nil, "nothing to update from")
        #expect(server.requests().filter { $0.file == "delta.zip" }.count == 1, "version 1 is fetched once: \(server.requests())")
        return (site, server, home, content)
    }

    @Test func anUpdateWithOneChangedFileFetchesOnlyThatEntry() async throws {
        let (site, server, home, content) = try await Self.installed("delta-one")
        defer { server.stop() }
        let before = server.bodyBytesSent("delta.zip")
        try Fixtures.randomFile(at: content.appending(path: "Contents/level2/f4.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)

        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.deltaFallback == nil)
        let delta = try #require(download.delta, "a delta update")
        let served = server.bodyBytesSent("delta.zip") - before
        #expect(served == Int(delta.bytesToFetch), "the server sent exactly the ranges planned")
        let length = try Self.packLength(site)
        #expect(served < 400 << 10, "the changed file, ContentInfo.plist, the symlink and what lies between: \(served) of \(length)")
        #expect(delta.filesReused >= 24, "\(delta)")
        #expect(download.bytesReceived == delta.bytesToFetch && download.progress == 1)
        let installed = try #require(download.contentURL)
        #expect(try treeContents(installed) == (try Self.reference(site, "delta-one-bsdtar")), "the new version, byte for byte")
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: installed.appending(path: "Contents/level0/link").path) == "f3.bin")
        #expect(FileManager.default.isExecutableFile(atPath: installed.appending(path: "Contents/run.sh").path), "modes kept")
        // Every file of the new version, fetched or reused, is recorded with its CRC-32 (the next delta reads none).
        try StoreTests.expectCRCs(Home(folder: home), products: [Self.product], zip: Self.product)
        #expect(leftoversAfterCleanup(home) == [], "no delta folder, staging or archive left")
        let verify = try await DownloadQueue(home: Home(folder: home)).verify()
        #expect(verify.allSatisfy { $0.isIntact }, "what is recorded matches the files: \(verify)")
    }

    @Test func addedRemovedAndRenamedFilesAndAnEmptyDelta() async throws {
        let (site, server, home, content) = try await Self.installed("delta-moves")
        defer { server.stop() }
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "renamed"), withIntermediateDirectories: true)
        try FileManager.default.moveItem(at: contents.appending(path: "level1/f4.bin"), to: contents.appending(path: "renamed/f4.bin"))
        try FileManager.default.removeItem(at: contents.appending(path: "level3"))
        try Fixtures.randomFile(at: contents.appending(path: "added.bin"), size: 50_000)
        try Self.publish(content, version: "2", site: site)
        var before = server.bodyBytesSent("delta.zip")
        let update = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(update.state == .finished, "\(update.error?.description ?? "")")
        let delta = try #require(update.delta)
        #expect(server.bodyBytesSent("delta.zip") - before < 200 << 10, "the renamed file is reused, the added one fetched: \(delta)")
        let installed = try #require(update.contentURL)
        #expect(try treeContents(installed) == (try Self.reference(site, "delta-moves-bsdtar")))
        #expect(!FileManager.default.fileExists(atPath: installed.appending(path: "Contents/level3").path), "removed files are gone")

        // Same files, a new version number: only ContentInfo.plist (and the symlink) are fetched.
        try Self.publish(content, version: "3", site: site)
        before = server.bodyBytesSent("delta.zip")
        let empty = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(empty.state == .finished && empty.contentVersion == "3", "\(empty.error?.description ?? "")")
        #expect(try #require(empty.delta).entriesToFetch <= 2)
        #expect(server.bodyBytesSent("delta.zip") - before < 8 << 10)
        #expect(try treeContents(try #require(empty.contentURL)) == (try Self.reference(site, "delta-empty-bsdtar")))
    }

    @Test func aServerThatIgnoresRangeGetsTheWholePack() async throws {
        let (site, server, home, content) = try await Self.installed("delta-norange")
        defer { server.stop() }
        try Fixtures.randomFile(at: content.appending(path: "Contents/big.bin"), size: 1 << 20)
        try Self.publish(content, version: "2", site: site)
        let download = try await Self.fetch(server.url("manifest.json"), home: home, packURL: server.url("delta.zip", fault: .ignoreRange))
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.delta == nil)
        #expect(download.deltaFallback?.reason == .rangesNotSupported, "\(download.deltaFallback?.message ?? "no reason")")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-norange-bsdtar")))
    }

    @Test func pythonsHTTPServerFallsBackToTheWholePack() async throws {
        let (site, server, home, content) = try await Self.installed("delta-python")
        server.stop()
        try Fixtures.randomFile(at: content.appending(path: "Contents/level0/f5.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)
        let port = try Fixtures.freePort()
        let python = Process()
        python.executableURL = URL(filePath: "/usr/bin/env")
        python.arguments = ["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", site.path, "\(port)"]
        python.standardOutput = FileHandle.nullDevice
        python.standardError = FileHandle.nullDevice
        try python.run()
        defer { terminate(pid: python.processIdentifier, signal: SIGTERM, grace: 2) }
        let deadline = Date().addingTimeInterval(20)
        var listening = false
        while !listening, Date() < deadline {
            listening = (try Fixtures.run("curl", ["-sf", "-o", "/dev/null", "http://127.0.0.1:\(port)/manifest.json"])).status == 0
            if !listening { usleep(100_000) }
        }
        #expect(listening, "python3 -m http.server listens on \(port)")
        let download = try await Self.fetch(URL(string: "http://127.0.0.1:\(port)/manifest.json")!, home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(
            download.delta == nil && download.deltaFallback?.reason == .rangesNotSupported,
            "whole pack, saying why: \(download.deltaFallback?.message ?? "")")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-python-bsdtar")))
    }

    /// Most files changed: the delta reports what it would fetch and the queue's machine refuses it (more than 60% of
    /// the pack); the whole pack is fetched in one request, the update says why, and no delta folder is left.
    @Test func anUpdateThatChangedMostFilesFetchesTheWholePackInOneRequest() async throws {
        let (site, server, home, content) = try await Self.installed("delta-most")
        defer { server.stop() }
        let files = try #require(FileManager.default.enumerator(at: content, includingPropertiesForKeys: [.isRegularFileKey]))
        var rewritten = 0
        for case let file as URL in files where (try file.resourceValues(forKeys: [.isRegularFileKey])).isRegularFile == true {
            let size = try #require(try FileManager.default.attributesOfItem(atPath: file.path)[.size] as? Int)
            try Fixtures.randomFile(at: file, size: size)
            rewritten += 1
        }
        #expect(rewritten > 1)
        try Self.publish(content, version: "2", site: site)
        let before = server.requests().count
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(
            download.delta == nil && download.deltaFallback?.reason == .tooMuchChanged,
            "whole pack, saying why: \(download.deltaFallback?.message ?? "no fallback")")
        let packRequests = server.requests().dropFirst(before).filter { $0.file == "delta.zip" }
        // The zip's central directory is read to plan the update (one range at its end), then the whole pack once.
        #expect(packRequests.filter { $0.range == nil }.count == 1, "the whole pack in one request: \(packRequests)")
        #expect(packRequests.count <= 2, "no range of changed entries was fetched: \(packRequests)")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-most-bsdtar")))
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: downloads.path)) ?? []
        #expect(!left.contains { $0.hasSuffix(".delta") }, "no delta folder left: \(left)")
    }

    @Test func aFileModifiedByHandIsSeenAndTheWholePackIsFetched() async throws {
        let (site, server, home, content) = try await Self.installed("delta-modified")
        defer { server.stop() }
        let installedFile = home.appending(path: "Caches/\(Self.product)/Contents/level1/f4.bin")
        // Same size (the launch check, which looks at sizes, does not see it), new bytes and a new modification time.
        // File times come from the kernel's coarse clock, a few milliseconds behind the time the install recorded:
        // an edit is told apart from the install from one tick later on.
        usleep(50_000)
        let handle = try FileHandle(forWritingTo: installedFile)
        try handle.seek(toOffset: 1000)
        try handle.write(contentsOf: Data("edited by hand".utf8))
        try handle.close()
        try Fixtures.randomFile(at: content.appending(path: "Contents/level0/f5.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)
        let before = server.bodyBytesSent("delta.zip")
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.deltaFallback?.reason == .installedFilesChanged, "\(download.deltaFallback?.message ?? "no reason")")
        #expect(
            download.deltaFallback?.message.contains("level1/f4.bin") == true, "names the file: \(download.deltaFallback?.message ?? "")")
        let served = server.bodyBytesSent("delta.zip") - before
        let length = try Self.packLength(site)
        #expect(served == length, "the whole pack: \(served) of \(length) bytes: \(server.requests())")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-modified-bsdtar")))
    }

    @Test func aTamperedEntryIsFetchedTwiceThenFailsNamingItAndTheOldVersionStays() async throws {
        let (site, server, home, content) = try await Self.installed("delta-tampered")
        defer { server.stop() }
        let old = try treeContents(home.appending(path: "Caches/\(Self.product)"))
        try Fixtures.randomFile(at: content.appending(path: "Contents/level2/deep/f1.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)
        // Flip bytes in the middle of the changed entry's data, after the index was made.
        let index = try JSONDecoder().decode(
            PackIndex.self, from: PackIndex.json(Data(contentsOf: site.appending(path: "delta.zip.index.json"))))
        let entry = try #require(index.entries.first { $0.path == "Contents/level2/deep/f1.bin" })
        var pack = try Data(contentsOf: site.appending(path: "delta.zip"))
        let middle = Int(entry.offset + entry.length / 2)
        for at in middle..<(middle + 16) { pack[at] ^= 0xFF }
        try pack.write(to: site.appending(path: "delta.zip"))
        let before = server.bodyBytesSent("delta.zip")

        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .failed)
        #expect(download.error?.code == .checksumMismatch && download.error?.subject == entry.path, "\(download.error?.description ?? "")")
        let served = server.bodyBytesSent("delta.zip") - before
        #expect(served >= 2 * Int(entry.length), "the entry was fetched once more: \(served)")
        #expect(served < 3 * Int(entry.length) + (400 << 10), "and no more: \(served)")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")) == old, "version 1 untouched")
        let verify = try await DownloadQueue(home: Home(folder: home)).verify()
        #expect(verify.count == 1 && verify.allSatisfy { $0.isIntact } && verify.first?.content.contentVersion == "1")
    }

    @Test func pauseAndResumeMidDeltaKeepEveryEntryFetched() async throws {
        let (site, server, home, content) = try await Self.installed("delta-pause")
        defer { server.stop() }
        // Three changed files far apart (separate ranges), fetched slowly.
        for path in ["level0/f4.bin", "level2/deep/f0.bin", "big.bin"] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(path)"), size: path == "big.bin" ? 1 << 20 : 96 << 10)
        }
        try Self.publish(content, version: "2", site: site)
        let before = server.bodyBytesSent("delta.zip")
        let (queue, id) = try await Self.start(
            server.url("manifest.json"), home: home, packURL: server.url("delta.zip", fault: .slow(bytesPerSecond: 768 << 10)))
        defer { queue.close() }
        let midway = await waitFor(queue, id) { download in
            guard let delta = download.delta else { return !download.state.isRunning }
            return download.bytesReceived > delta.bytesToFetch / 2 || !download.state.isRunning
        }
        let delta = try #require(midway?.delta, "a delta update: \(String(describing: midway))")
        try queue.pause([id])
        let paused = await waitFor(queue, id) { $0.state == .paused }
        #expect(paused != nil, "paused mid-delta")
        usleep(300_000)
        let halfway = server.bodyBytesSent("delta.zip") - before
        #expect(halfway < Int(delta.bytesToFetch), "paused before the end: \(halfway) of \(delta.bytesToFetch)")
        try queue.resume([id])
        let done = await waitFor(queue, id) { !$0.state.isRunning }
        #expect(done?.state == .finished, "\(done?.error?.description ?? "")")
        #expect(done?.delta?.bytesKept ?? 0 > 0, "the entries fetched before the pause are kept: \(String(describing: done?.delta))")
        let total = server.bodyBytesSent("delta.zip") - before
        // Only the entry in flight at the pause is fetched again: at most the largest changed entry (big.bin, 1 MiB).
        #expect(
            total <= Int(delta.bytesToFetch) + (1 << 20) + (64 << 10),
            "\(halfway) before the pause, \(total) in all, of \(delta.bytesToFetch)")
        #expect(try treeContents(try #require(done?.contentURL)) == (try Self.reference(site, "delta-pause-bsdtar")))
    }

    /// `packs fetch` killed with SIGKILL mid-delta, then `packs resume`: the entries verified before the kill are
    /// kept, so the server sends at most the planned bytes plus the range that was in flight.
    @Test func killedMidDeltaThenResumedFetchesNoEntryTwiceBeyondTheOneInFlight() throws {
        let content = try Self.content("delta-kill-content")
        let site = try Fixtures.temporaryDirectory("delta-kill-site")
        try Self.publish(content, version: "1", site: site)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("delta-kill-home")
        let manifestURL = server.url("manifest.json").absoluteString
        let first = try CLI.run(home: home, ["fetch", manifestURL, Self.product])
        #expect(first.status == 0, "version 1: \(first.stderr)")

        // Four changed files of 192 KiB in separate ranges (unchanged files lie between them), served slowly.
        for path in ["level0/f4.bin", "level1/deep/f0.bin", "level2/f5.bin", "level3/f4.bin"] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(path)"), size: 192 << 10)
        }
        try Self.publish(content, version: "2", site: site)
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url("delta.zip", fault: .slow(bytesPerSecond: 384 << 10)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let before = server.bodyBytesSent("delta.zip")
        let planned = Mutex<Int64>(0)
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product]) { event in
            guard let delta = event["delta"] as? [String: Any], let toFetch = (delta["bytesToFetch"] as? NSNumber)?.int64Value,
                let received = (event["bytesReceived"] as? NSNumber)?.int64Value
            else { return false }
            planned.withLock { $0 = toFetch }
            return received > toFetch * 6 / 10
        }
        #expect(killed, "killed mid-delta")
        let bytesToFetch = planned.withLock { $0 }
        usleep(200_000)
        let beforeKill = server.bodyBytesSent("delta.zip") - before
        #expect(beforeKill < Int(bytesToFetch), "killed before the end: \(beforeKill) of \(bytesToFetch)")
        let early = server.requests().filter { $0.file == "delta.zip" && $0.range != nil }
        // Every range but the last was answered in full before the kill; the last was in flight.
        let completed = Set(early.dropLast().compactMap(\.range))
        #expect(completed.count >= 2, "ranges completed before the kill: \(early)")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let late = server.requests().filter { $0.file == "delta.zip" && $0.range != nil }.dropFirst(early.count).compactMap(\.range)
        #expect(completed.isDisjoint(with: late), "no range completed before the kill is asked for again: before \(early), after \(late)")
        let total = server.bodyBytesSent("delta.zip") - before
        #expect(
            total <= Int(bytesToFetch) + (192 << 10) + (64 << 10),
            "at most the range in flight again: \(beforeKill) before the kill, \(total) in all, of \(bytesToFetch)")
        #expect(server.requests().filter { $0.file == "delta.zip" && $0.range == nil }.count == 1, "the whole pack only for version 1")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, "delta-kill-bsdtar")), "the new version, byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The plan itself, with no I/O: what is reused, what is fetched in which ranges, and each reason to fall back.
    @Test func thePlanReusesByDigestCoalescesCloseEntriesAndSaysWhyItFallsBack() throws {
        func entry(_ path: String, _ digest: String, at offset: Int64, _ length: Int64) -> PackIndex.Entry {
            PackIndex.Entry(path: path, kind: .file, size: length - 60, sha256: digest, method: 0, offset: offset, length: length)
        }
        func record(_ path: String, _ digest: String, _ size: Int64) -> InstalledFileRecord {
            InstalledFileRecord(destination: .caches, contentIdentifier: "c", path: path, kind: .file, size: size, sha256: digest)
        }
        let digests = (0..<6).map { String(repeating: "\($0)", count: 64) }
        // Six 100 KB entries; a, b, d, f are installed (b under another name); c and e changed, 100 KB apart.
        let index = PackIndex(entries: (0..<6).map { entry("f\($0)", digests[$0], at: Int64($0) * 100_000, 100_000) })
        let installed = [
            record("f0", digests[0], 99_940), record("old-name", digests[1], 99_940), record("f3", digests[3], 99_940),
            record("f5", digests[5], 99_940),
        ]
        let plan = try DeltaPlan.make(index: index, packLength: 600_000, installed: installed, damaged: []).get()
        #expect(plan.fetch.sorted() == [2, 4])
        #expect(Set(plan.reuse.map(\.path)) == ["f0", "f1", "f3", "f5"] && plan.reuse.first { $0.path == "f1" }?.from == "old-name")
        #expect(plan.ranges.map { [$0.start, $0.end] } == [[200_000, 300_000], [400_000, 500_000]], "100 KB apart: two ranges")
        // Entries 60 KB apart come in one range, with the gap.
        let close = PackIndex(entries: [
            entry("a", digests[2], at: 0, 40_000), entry("b", digests[0], at: 40_000, 60_000),
            entry("c", digests[4], at: 100_000, 40_000), entry("d", digests[1], at: 140_000, 260_000),
        ])
        let coalesced = try DeltaPlan.make(
            index: close, packLength: 400_000,
            installed: [record("b", digests[0], 59_940), record("d", digests[1], 259_940)], damaged: []
        ).get()
        #expect(coalesced.ranges.map { [$0.start, $0.end] } == [[0, 140_000]] && coalesced.bytesToFetch == 140_000)

        func reason(_ result: Result<DeltaPlan, DeltaRefusal>) -> Download.DeltaFallback.Reason? {
            if case .failure(let refusal) = result { return refusal.fallback.reason } else { return nil }
        }
        #expect(reason(DeltaPlan.make(index: index, packLength: 600_000, installed: installed, damaged: ["f3"])) == .installedFilesChanged)
        // Five of six entries changed: the plan says so; whether that is too much is the machine's rule
        // (DeliveryPlanTests.aDeltaThatWouldFetchMoreThanSixtyPercentFetchesTheWholePack).
        let most = try DeltaPlan.make(index: index, packLength: 600_000, installed: [record("f0", digests[0], 99_940)], damaged: []).get()
        #expect(most.fetch.count == 5 && most.bytesToFetch == 500_000, "five of six entries changed: \(most.bytesToFetch)")
        #expect(
            reason(DeltaPlan.make(index: index, packLength: 550_000, installed: installed, damaged: [])) == .indexUnusable,
            "an entry past the pack's end")
    }

    /// A full disk mid-delta pauses the download for space, as for a whole pack; once there is room, resume finishes
    /// the delta, keeping the entries already fetched.
    @Test func aFullDiskMidDeltaPausesForSpaceAndResumeFinishesTheDelta() async throws {
        let (site, server, home, content) = try await Self.installed("delta-full")
        defer { server.stop() }
        for path in ["level0/f4.bin", "level1/deep/f0.bin", "level2/f5.bin"] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(path)"), size: 192 << 10)
        }
        try Self.publish(content, version: "2", site: site)
        let before = server.bodyBytesSent("delta.zip")
        // Room for a little more than one fetched entry and its check.
        let writer = DiskFullWriter(space: 450 << 10)
        let (queue, id) = try await Self.start(server.url("manifest.json"), home: home, writer: writer)
        defer { queue.close() }
        let paused = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download stops")
        #expect(paused.state == .paused && paused.pauseReason == .insufficientStorage, "\(paused.state) \(paused.error?.description ?? "")")
        #expect(paused.error?.code == .insufficientStorage)
        let delta = try #require(paused.delta, "still a delta: \(paused.deltaFallback?.message ?? "")")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")).count > 20, "version 1 still installed")

        writer.setSpace(.max)
        try queue.resume([id])
        let done = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        #expect(done.state == .finished, "\(done.error?.description ?? "")")
        #expect(
            done.deltaFallback == nil && done.delta?.bytesKept ?? 0 > 0,
            "the delta went on with what it had kept: \(String(describing: done.delta))")
        let served = server.bodyBytesSent("delta.zip") - before
        #expect(
            served <= Int(delta.bytesToFetch) + (192 << 10) + (64 << 10),
            "at most the entry cut short again: \(served) of \(delta.bytesToFetch)")
        #expect(try treeContents(try #require(done.contentURL)) == (try Self.reference(site, "delta-full-bsdtar")))
        // The old version and the delta's folder are deleted off the critical path; closing waits for that.
        await queue.close()
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// A repair of a pack with an index is a delta from the installed version to itself: only the entries of the
    /// damaged files are fetched, even for damage that leaves a file's size and time as installed.
    @Test func aRepairFetchesOnlyTheEntriesOfTheDamagedFiles() async throws {
        let (_, server, home, _) = try await Self.installed("delta-repair")
        defer { server.stop() }
        let installed = home.appending(path: "Caches/\(Self.product)")
        let reference = try treeContents(installed)
        // One byte of big.bin flipped, its size and modification time kept; one file deleted.
        let big = installed.appending(path: "Contents/big.bin").path
        flipByteKeepingTimes(big, at: 300_000)
        try FileManager.default.removeItem(at: installed.appending(path: "Contents/level2/f5.bin"))

        let queue = try DownloadQueue(
            home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        #expect(try await queue.verify().contains { !$0.isIntact }, "verify sees the damage")
        let before = server.bodyBytesSent("delta.zip")
        let transactions = try await queue.repair()
        let id = try #require(transactions.first?.downloads.first?.id, "a download repairs the pack")
        let done = try #require(await waitFor(queue, id) { $0.state.isSettled }, "the repair settles")
        #expect(done.state == .finished, "\(done.error?.description ?? "")")
        #expect(done.delta != nil && done.deltaFallback == nil, "by entries: \(done.deltaFallback?.message ?? "")")
        let served = server.bodyBytesSent("delta.zip") - before
        #expect(served < (1 << 20) + (96 << 10) + (256 << 10), "big.bin and f5.bin, with the directory: \(served) bytes")
        #expect(try treeContents(installed) == reference, "the installed tree is whole again")
        #expect(try await queue.verify().allSatisfy(\.isIntact))
    }

    /// A delta's ranges are ordinary transfers: a 503 with Retry-After on one is waited for as on a whole pack, and
    /// the delta goes on where it was (it is not given up for the whole pack).
    @Test func aRangeAnswered503WithRetryAfterIsWaitedForAndTheDeltaGoesOn() async throws {
        let (site, server, home, content) = try await Self.installed("delta-retry-after")
        defer { server.stop() }
        try Fixtures.randomFile(at: content.appending(path: "Contents/level1/deep/f0.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)
        let started = Date()
        let download = try await Self.fetch(
            server.url("manifest.json"), home: home, packURL: server.url("delta.zip", fault: .status(503, times: 1, retryAfter: 2)))
        let elapsed = Date().timeIntervalSince(started)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.deltaFallback == nil && download.delta != nil, "still a delta: \(download.deltaFallback?.message ?? "")")
        let requests = server.requests().filter { $0.file == "delta.zip" && $0.fault != .none }
        #expect(requests.first?.status == 503, "\(requests)")
        #expect(requests.dropFirst().allSatisfy { $0.range != nil && $0.status == 206 }, "only ranges after it: \(requests)")
        // The queue's own backoff here is at most 1 s (maxRetryDelay): only the server's Retry-After makes it 2.
        #expect(elapsed >= 1.9, "the server's Retry-After of 2 s was honoured: \(elapsed) s")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-retry-after-bsdtar")))
    }

    /// A server that answers a range with another range than the one asked for is not used for ranges: the whole pack
    /// is fetched instead, and installs.
    @Test func aServerThatAnswersAnotherRangeGetsTheWholePack() async throws {
        let (site, server, home, content) = try await Self.installed("delta-wrong-range")
        defer { server.stop() }
        try Fixtures.randomFile(at: content.appending(path: "Contents/level1/deep/f0.bin"), size: 96 << 10)
        try Self.publish(content, version: "2", site: site)
        let download = try await Self.fetch(
            server.url("manifest.json"), home: home, packURL: server.url("delta.zip", fault: .wrongRangeStart))
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.deltaFallback?.reason == .rangesNotSupported, "\(download.deltaFallback?.message ?? "no fallback")")
        #expect(try treeContents(try #require(download.contentURL)) == (try Self.reference(site, "delta-wrong-range-bsdtar")))
    }

    /// The pack changes on the server mid-delta (a new ETag): the entries kept are discarded and nothing of the two
    /// versions is mixed. The manifest in hand names the old pack, so the download ends failed, saying the pack
    /// does not match, and the installed version stays as it was (a fresh manifest is the store client's to load).
    @Test func aPackChangedOnTheServerMidDeltaIsNeverMixed() async throws {
        let (site, server, home, content) = try await Self.installed("delta-changed")
        defer { server.stop() }
        let old = try treeContents(home.appending(path: "Caches/\(Self.product)"))
        for path in ["level0/f4.bin", "level1/deep/f0.bin", "level2/f5.bin", "level3/f4.bin"] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(path)"), size: 192 << 10)
        }
        try Self.publish(content, version: "2", site: site)
        let (queue, id) = try await Self.start(
            server.url("manifest.json"), home: home, packURL: server.url("delta.zip", fault: .slow(bytesPerSecond: 384 << 10)))
        defer { queue.close() }
        let midway = await waitFor(queue, id) { download in
            guard let delta = download.delta else { return !download.state.isRunning }
            return download.bytesReceived > delta.bytesToFetch / 3 || !download.state.isRunning
        }
        #expect(midway?.delta != nil && midway?.state.isRunning == true, "mid-delta: \(String(describing: midway))")
        // Version 3 replaces the pack and its index on the server.
        for path in ["level0/f4.bin", "level1/deep/f0.bin", "level2/f5.bin", "level3/f4.bin"] {
            try Fixtures.randomFile(at: content.appending(path: "Contents/\(path)"), size: 192 << 10)
        }
        try Self.publish(content, version: "3", site: site)
        let done = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        // The retry reads the new index (it does not match the manifest) and falls back to the whole pack, which
        // does not match it either: its length (or, were it as long, its SHA-256).
        #expect(
            done.state == .failed && [.lengthMismatch, .checksumMismatch].contains(done.error?.code),
            "\(done.state) \(done.error?.description ?? "")")
        #expect(done.deltaFallback?.reason == .indexUnusable, "\(done.deltaFallback?.message ?? "no fallback")")
        #expect(try treeContents(home.appending(path: "Caches/\(Self.product)")) == old, "version 1 untouched")
        #expect(
            !FileManager.default.fileExists(atPath: home.appending(path: "Caches/.packdelivery/downloads/\(id).delta").path),
            "no kept entry of either version")
    }
}
