import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

/// A first install of an indexed tar or tar.zst pack writes each byte once (issue 29): each chunk, checked against its
/// SHA-256 as it arrives, goes straight into the new version's files; no archive is kept, and a resume fetches no
/// verified chunk again. Real libcurl, libarchive and nginx (or the test server); trees compared with `bsdtar -xf`.
@Suite(.serialized, .timeLimit(.minutes(6))) struct WriteOnceTests {
    static let product = "com.example.writeonce"

    /// About 32 MiB of random content (with `big` MiB in one file): a large file, 40 files of 200 KiB, an executable
    /// script, an empty file, nested folders and a symlink.
    static func content(_ label: String, big: Int = 24) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "deep/a/b"), withIntermediateDirectories: true)
        try Data(chunkedPackBytes(big << 20, seed: 29)).write(to: contents.appending(path: "big.bin"))
        for file in 0..<40 {
            try Fixtures.randomFile(at: contents.appending(path: "small/f\(file).bin"), size: 200 << 10)
        }
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: contents.appending(path: "run.sh"))
        chmod(contents.appending(path: "run.sh").path, 0o755)
        try Data().write(to: contents.appending(path: "deep/a/b/empty.txt"))
        try Data("deep\n".utf8).write(to: contents.appending(path: "deep/a/b/c.txt"))
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "small/link").path, withDestinationPath: "../run.sh")
        return content
    }

    static func packName(_ format: PackFormat) -> String { "pack.\(format.rawValue)" }

    static func publish(_ content: URL, site: URL, format: PackFormat) throws {
        try PackWriter.write(
            folder: content, to: site.appending(path: Self.packName(format)), format: format,
            contentInfo: (productIdentifier: Self.product, contentVersion: "1"))
        try ManifestBuilder.write(folder: site)
    }

    static func reference(_ site: URL, _ format: PackFormat, _ label: String) throws -> [String: Data] {
        let folder = try Fixtures.temporaryDirectory(label)
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", site.appending(path: Self.packName(format)).path, "-C", folder.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        return try treeContents(folder)
    }

    static func length(_ url: URL) throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int)
    }

    static func queue(_ home: URL) throws -> DownloadQueue {
        try DownloadQueue(
            home: Home(folder: home), configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
    }

    /// Bytes allocated to every file under `folder` (symlinks not followed), and whether a downloads folder holds a
    /// pack's archive (`*.pack`).
    static func usage(_ folder: URL) -> (bytes: Int64, archive: Bool) {
        var bytes: Int64 = 0
        var archive = false
        let enumerator = FileManager.default.enumerator(atPath: folder.path)
        while let path = enumerator?.nextObject() as? String {
            var info = stat()
            guard lstat(folder.appending(path: path).path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { continue }
            bytes += Int64(info.st_blocks) * 512
            if path.contains(".packdelivery/downloads/"), path.hasSuffix(".pack") { archive = true }
        }
        return (bytes, archive)
    }

    /// `bsdtar -xf` of the pack equals the installed tree; while it installs, no archive exists in the downloads folder,
    /// and the home never holds more than 1.1 × the unpacked size beyond what it held before. Served by nginx at a rate
    /// limit, every request for the pack a range, and the pack's bytes sent at most once.
    @Test(arguments: [PackFormat.tar, .tarZstd])
    func aFirstInstallWritesEachByteOnceAndEqualsBsdtar(format: PackFormat) async throws {
        let label = "writeonce-\(format.rawValue)"
        let content = try Self.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, site: site, format: format)
        let reference = try Self.reference(site, format, label + "-bsdtar")
        let unpacked = reference.values.reduce(0) { $0 + $1.count }
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let nginx = try NginxServer(root: site, limitRate: 16 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let baseline = Self.usage(home).bytes

        // Samples the home while the install runs.
        let watching = Atomic<Bool>(true)
        let seen = Mutex<(peak: Int64, archive: Bool, samples: Int)>((0, false, 0))
        let watcher = Thread {
            while watching.load(ordering: .relaxed) {
                let now = Self.usage(home)
                seen.withLock { seen in
                    seen.peak = max(seen.peak, now.bytes - baseline)
                    seen.archive = seen.archive || now.archive
                    seen.samples += 1
                }
                usleep(2000)
            }
        }
        watcher.start()
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        watching.store(false, ordering: .relaxed)
        while !watcher.isFinished { usleep(1000) }

        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.delta == nil && download.deltaFallback == nil, "a first install, not an update nor a fallback")
        let installed = try #require(download.contentURL)
        #expect(try treeContents(installed) == reference, "bsdtar -xf of the pack equals the installed tree")
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: installed.appending(path: "Contents/small/link").path) == "../run.sh")
        #expect(FileManager.default.isExecutableFile(atPath: installed.appending(path: "Contents/run.sh").path), "modes kept")
        let (peak, archive, samples) = seen.withLock { ($0.peak, $0.archive, $0.samples) }
        print(
            "write once \(format.rawValue): pack \(packLength) bytes, unpacked \(unpacked), peak extra disk \(peak) (\(Double(peak) / Double(unpacked)) ×), \(samples) samples"
        )
        #expect(!archive, "no archive in the downloads folder during the install")
        #expect(samples > 20, "the home was sampled during the install: \(samples)")
        #expect(Double(peak) <= 1.1 * Double(unpacked), "peak extra disk \(peak) ≤ 1.1 × the unpacked \(unpacked)")
        nginx.waitForRequests(3)
        let requests = nginx.requests().filter { $0.uri.hasSuffix(Self.packName(format)) }
        #expect(requests.allSatisfy { $0.range != nil && $0.status == 206 }, "only ranges of the pack: \(requests)")
        let served = nginx.bodyBytesSent(path: "/" + Self.packName(format))
        #expect(served <= packLength, "each byte of the pack sent at most once: \(served) of \(packLength)")
        #expect(leftoversAfterCleanup(home) == [], "no delta folder, staging or archive left")
        let verify = try await queue.verify()
        #expect(verify.count == 1 && verify.allSatisfy { $0.isIntact }, "verify finds the install as the index gives it")
    }

    /// The bytes `a-b` of a `Range: bytes=a-b` header.
    static func bounds(_ range: String) -> ClosedRange<Int>? {
        let parts = range.replacingOccurrences(of: "bytes=", with: "").split(separator: "-").compactMap { Int($0) }
        return parts.count == 2 && parts[0] <= parts[1] ? parts[0]...parts[1] : nil
    }

    /// Killed mid-install (SIGKILL, nginx at a rate limit), then resumed: no range recorded before the kill is asked
    /// for again, at most the two ranges in flight (one downloading, one being placed) are sent twice, and the
    /// installed tree is `bsdtar -xf` of the pack.
    @Test func killedMidInstallThenResumedFetchesNoVerifiedChunkTwice() throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("writeonce-kill-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-kill-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let nginx = try NginxServer(root: site, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("writeonce-kill-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let archiveSeen = Atomic<Bool>(false)
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product]) { event in
            if Self.usage(home).archive { archiveSeen.store(true, ordering: .relaxed) }
            guard let received = (event["bytesReceived"] as? NSNumber)?.int64Value else { return false }
            return received > Int64(packLength) / 2
        }
        #expect(killed, "killed mid-install")
        let archiveExisted = archiveSeen.load(ordering: .relaxed)
        #expect(!archiveExisted, "no archive during the install")
        usleep(300_000)
        let early = nginx.requests().filter { $0.uri.hasSuffix(Self.packName(format)) && $0.range != nil }
        // The last two: the range downloading at the kill, and the one being placed (downloaded, not yet recorded).
        let completed = early.dropLast(2).compactMap { $0.range.flatMap(Self.bounds) }
        let beforeKill = nginx.bodyBytesSent(path: "/" + Self.packName(format))
        #expect(completed.count >= 2, "ranges completed before the kill: \(early)")
        #expect(beforeKill < packLength, "killed before the end: \(beforeKill) of \(packLength)")

        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        nginx.waitForRequests(early.count + 1)
        let late = nginx.requests().filter { $0.uri.hasSuffix(Self.packName(format)) && $0.range != nil }.dropFirst(early.count)
            .compactMap { $0.range.flatMap(Self.bounds) }
        #expect(!late.isEmpty, "the resume fetched the rest")
        for range in late {
            #expect(!completed.contains { $0.overlaps(range) }, "\(range) asks again for bytes completed before the kill: \(completed)")
        }
        let total = nginx.bodyBytesSent(path: "/" + Self.packName(format))
        let window = Int(ChunkPlan.window(packLength: Int64(packLength)))
        print("write once killed and resumed: \(beforeKill) bytes before the kill, \(total) in all, pack \(packLength)")
        #expect(total <= packLength + 2 * window, "at most the two ranges in flight again: \(total) of \(packLength)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, format, "writeonce-kill-bsdtar")), "byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// As above on the path of a pack of 1 GiB or more, whose windows share one request (`PACKS_TEST_JOINED_WINDOW=0`
    /// makes this small pack's take it): one request before the kill, each window committed while the next arrives;
    /// after the kill, `resume` asks for none of the chunks the record held at the kill, and the tree is `bsdtar -xf`
    /// of the pack.
    @Test(arguments: [PackFormat.tar, .tarZstd])
    func killedMidInstallInOneRequestThenResumedFetchesNoVerifiedChunkTwice(format: PackFormat) throws {
        let label = "writeonce-joined-\(format.rawValue)"
        let content = try Self.content(label + "-content", big: 10)
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let nginx = try NginxServer(root: site, limitRate: 4 << 20)
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let joined = ["PACKS_TEST_JOINED_WINDOW": "0"]
        let killed = try runAndKill(home: home, ["fetch", manifestURL, Self.product], environment: joined) { event in
            guard let received = (event["bytesReceived"] as? NSNumber)?.int64Value else { return false }
            return received > Int64(packLength) / 2
        }
        #expect(killed, "killed mid-install")
        let early = nginx.requests().filter { $0.uri.hasSuffix(Self.packName(format)) }
        #expect(early.count == 1 && early.first?.range != nil, "one range request for every window: \(early)")
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        let folder = try #require(
            try FileManager.default.contentsOfDirectory(atPath: downloads.path).first { $0.hasSuffix(".delta") }, "the install's folder")
        let verified = Self.verifiedChunks(home, String(folder.dropLast(".delta".count)))
        #expect(!verified.isEmpty, "windows committed while the request ran")

        let resume = try CLI.run(home: home, ["resume"], environment: joined)
        #expect(resume.status == 0, "\(resume.stderr)")
        let late = nginx.requests().filter { $0.uri.hasSuffix(Self.packName(format)) }.dropFirst(early.count)
        #expect(late.count == 1, "the resume fetched the rest in one request: \(late)")
        let again = try Self.verifiedChunksAskedAgain(verified, site: site, format: format, ranges: late.map(\.range))
        #expect(again.isEmpty, "verified chunks asked for again after the resume: \(again.prefix(5)) of \(verified.count)")
        let total = nginx.bodyBytesSent(path: "/" + Self.packName(format))
        print("write once in one request, killed and resumed: \(total) bytes in all, pack \(packLength)")
        #expect(total <= packLength + packLength / 4, "the pack sent about once: \(total) of \(packLength)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, format, label + "-bsdtar")), "byte for byte")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// A power cut mid-install (ext4 shut down without flushing its log), then a reboot and `packs resume`: the store
    /// opens, the install completes byte for byte, and it continues from the chunks recorded before the cut rather than
    /// from the pack's start.
    @Test(.enabled(if: PowerCutDisk.unavailableReason == nil, "needs root to mount a disk image"))
    func aPowerCutMidInstallThenResumeContinuesFromTheRecordedChunks() throws {
        let format = PackFormat.tar
        let content = try Self.content("writeonce-cut-content")
        let site = try Fixtures.temporaryDirectory("writeonce-cut-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 8 << 20)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let disk = try PowerCutDisk("writeonce-cut")
        let home = disk.mountPoint.appending(path: "home")
        let fetch = try WatchedProcess(
            CLI.binary, ["--home", home.path, "fetch", server.url("manifest.json").absoluteString, Self.product])
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        func recorded() -> Int {
            let folders = (try? FileManager.default.contentsOfDirectory(atPath: downloads.path))?.filter { $0.hasSuffix(".delta") } ?? []
            return folders.compactMap { try? Self.length(downloads.appending(path: "\($0)/verified")) }.max() ?? 0
        }
        // A third of the pack's chunks or so recorded (about 64 KiB each, 4 bytes each in the record).
        let reached = waitUntil(timeout: 30) { recorded() > 4 * packLength / (64 << 10) / 3 }
        #expect(reached, "the install recorded chunks before the cut: \(fetch.stderr)")
        try disk.cut()
        fetch.kill()
        try disk.remount()
        let before = server.requests().filter { $0.file == Self.packName(format) }.count

        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.status == 0, "the store opens after the cut: \(status.stderr)")
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "resume after the cut: \(resume.stderr)")
        let installed = home.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, format, "writeonce-cut-bsdtar")), "byte for byte")
        let after = server.requests().filter { $0.file == Self.packName(format) }.dropFirst(before).compactMap {
            $0.range.flatMap(Self.bounds)
        }
        #expect((after.map(\.lowerBound).min() ?? 0) > 0, "the resume continued from the recorded chunks: \(after)")
        let served = server.bodyBytesSent(Self.packName(format))
        let window = Int(ChunkPlan.window(packLength: Int64(packLength)))
        #expect(served <= packLength + 2 * window, "at most the ranges in flight again: \(served) of \(packLength)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The disk fills mid-install (a tmpfs): the download pauses for space (exit 75), `status` still works; once
    /// space returns, `resume` completes it byte for byte without starting the pack over.
    @Test(.enabled(if: Tmpfs.available, "mounting a tmpfs needs root"))
    func theDiskFillsMidInstallThenResumeCompletesIt() throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("writeonce-full-content")
        let site = try Fixtures.temporaryDirectory("writeonce-full-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 8 << 20)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        // Room for the unpacked content and the margin, not for the pack as well.
        let disk = try Tmpfs(megabytes: 48)
        let fetch = try runWatching(
            home: disk.folder, ["fetch", server.url("manifest.json").absoluteString, Self.product],
            when: { ($0["progress"] as? Double ?? 0) > 0.25 }
        ) { _ in disk.fill() }
        #expect(fetch.matched && fetch.status == 75, "paused for space: \(fetch.status)")
        let status = try CLI.run(home: disk.folder, ["status"])
        #expect(status.status == 0 && status.stdout.contains("insufficientStorage"), "\(status.stdout) \(status.stderr)")
        let before = server.requests().filter { $0.file == Self.packName(format) }.count

        disk.unfill()
        let resume = try CLI.run(home: disk.folder, ["resume"])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let installed = disk.folder.appending(path: "Caches/\(Self.product)")
        #expect(try treeContents(installed) == (try Self.reference(site, format, "writeonce-full-bsdtar")), "byte for byte")
        let after = server.requests().filter { $0.file == Self.packName(format) }.dropFirst(before).compactMap {
            $0.range.flatMap(Self.bounds)
        }
        #expect((after.map(\.lowerBound).min() ?? 0) > 0, "the resume continued from the recorded chunks: \(after)")
        #expect(server.bodyBytesSent(Self.packName(format)) < 2 * packLength, "the pack was not fetched over")
        #expect(leftovers(disk.folder) == [])
    }

    /// A chunk whose served bytes differ from the index is fetched once more, then the download fails as a checksum
    /// error naming the file that holds it; nothing is installed and nothing is left behind.
    @Test func aTamperedChunkFailsNamingItsFileAndNothingIsInstalled() async throws {
        let format = PackFormat.tar
        let content = try Self.content("writeonce-tampered-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-tampered-site")
        try Self.publish(content, site: site, format: format)
        // Indexes are written zstd-compressed: read their JSON as the client does.
        let index = try JSONDecoder().decode(
            PackIndex.self, from: PackIndexTests.json(PackWriter.indexURL(for: site.appending(path: Self.packName(format)))))
        let chunk = try #require(index.entries.first { $0.path == "Contents/small/f7.bin" }?.chunks?.first)
        var pack = try Data(contentsOf: site.appending(path: Self.packName(format)))
        let middle = Int(chunk.offset + chunk.length / 2)
        for at in middle..<(middle + 16) { pack[at] ^= 0xFF }
        try pack.write(to: site.appending(path: Self.packName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("writeonce-tampered-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        #expect(download.state == .failed)
        #expect(
            download.error?.code == .checksumMismatch && download.error?.subject == "Contents/small/f7.bin",
            "\(download.error?.description ?? "")")
        let served = server.bodyBytesSent(Self.packName(format))
        #expect(served < 2 * (try Self.length(site.appending(path: Self.packName(format)))), "no whole pack fetched after: \(served)")
        let asked = server.requests().filter { $0.file == Self.packName(format) }.compactMap { $0.range.flatMap(Self.bounds) }
        let bad = Int(chunk.offset)...Int(chunk.offset + chunk.length - 1)
        #expect(asked.filter { $0.overlaps(bad) }.count == 2, "the tampered chunk was fetched once more, then no more: \(asked)")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(Self.product)").path), "nothing installed")
        #expect(leftoversAfterCleanup(home) == [], "nothing left behind")
    }

    /// A first install records each file's SHA-256 from the index without hashing the file (each chunk is checked as
    /// it arrives): a publisher's index whose file SHA-256 is not that of its own, valid, chunks installs the file's
    /// bytes, records the index's digest, and `verify` then reports the file changed, as for a pack installed whole.
    @Test func anIndexWhoseFileDigestIsNotItsChunksInstallsAndVerifyReportsTheFile() async throws {
        let format = PackFormat.tar
        let content = try Self.content("writeonce-word-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-word-site")
        try Self.publish(content, site: site, format: format)
        let reference = try Self.reference(site, format, "writeonce-word-bsdtar")
        let path = "Contents/small/f3.bin"
        let other = String(repeating: "ab", count: 32)
        let indexURL = PackWriter.indexURL(for: site.appending(path: Self.packName(format)))
        var index = try JSONDecoder().decode(PackIndex.self, from: PackIndexTests.json(indexURL))
        let number = try #require(index.entries.firstIndex { $0.path == path })
        index.entries[number].sha256 = other
        try PackIndexer.write(index, to: indexURL)
        try ManifestBuilder.write(folder: site)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("writeonce-word-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(download.delta == nil && download.deltaFallback == nil, "a first install written once, not a fallback")
        #expect(
            server.requests().filter { $0.file == Self.packName(format) }.allSatisfy { $0.range != nil },
            "the pack fetched by ranges (written once): \(server.requests())")
        let installed = try #require(download.contentURL)
        #expect(try treeContents(installed) == reference, "the file holds its chunks' bytes, as bsdtar -xf gives them")
        let install = try #require(try queue.store.installs().first { $0.productIdentifier == Self.product }, "an install")
        #expect(try queue.store.files(of: install).first { $0.path == path }?.sha256 == other, "the index's digest is recorded")
        let damage = try await queue.verify().flatMap(\.damage)
        #expect(damage.map(\.path) == [path] && damage.first?.problem == .changed, "verify reports the file: \(damage)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// A cancel mid-install removes the new version's files and the record of verified chunks.
    @Test func aCancelMidInstallRemovesTheStaging() async throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("writeonce-cancel-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-cancel-site")
        try Self.publish(content, site: site, format: format)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 2 << 20)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory("writeonce-cancel-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let loaded = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: loaded).downloads.first?.id, "a download")
        let moving = await waitFor(queue, id) { $0.bytesReceived > 1 << 20 || !$0.state.isRunning }
        #expect(moving?.state == .active, "the install is under way: \(moving?.error?.description ?? "")")
        let tree = home.appending(path: "Caches/.packdelivery/downloads/\(id).delta/tree")
        #expect(FileManager.default.fileExists(atPath: tree.path), "the new version's files are written as chunks arrive")
        try queue.cancel([id])
        let cancelled = try #require(await waitFor(queue, id) { $0.state == .cancelled }, "the download is cancelled")
        #expect(cancelled.contentURL == nil)
        usleep(200_000)
        #expect(leftoversAfterCleanup(home) == [], "the staging is gone")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/\(Self.product)").path))
    }

    /// The ranges of a first install: every chunk once, in the pack's order, none longer than the window unless one
    /// chunk is; chunks far apart are never joined.
    @Test func theRangesCoverEachChunkOnceWithinTheWindow() {
        var chunks: [PackIndex.Chunk] = []
        var offset: Int64 = 512
        for number in 0..<200 {
            let size = Int64(10_000 + (number * 7919) % 90_000)
            chunks.append(PackIndex.Chunk(sha256: "\(number)", size: size, offset: offset, length: size, storage: .raw))
            // A tar header between files, now and then; a gap wider than the coalescing one once.
            offset += size + (number % 17 == 0 ? 512 : 0) + (number == 100 ? DeltaPlan.coalesceGap + 1 : 0)
        }
        chunks.append(PackIndex.Chunk(sha256: "big", size: 3 << 20, offset: offset, length: 3 << 20, storage: .raw))
        let window: Int64 = 1 << 20
        let ranges = ChunkPlan.windows(Array(chunks.indices).reversed(), in: chunks, window: window)
        #expect(ranges.flatMap(\.chunks) == Array(chunks.indices), "each chunk once, in order")
        #expect(ranges.allSatisfy { $0.end - $0.start <= window || $0.chunks.count == 1 }, "within the window")
        #expect(!ranges.contains { $0.chunks.contains(100) && $0.chunks.contains(101) }, "a wide gap is not fetched")
        #expect(ChunkPlan.window(packLength: 32 << 20) == 1 << 20 && ChunkPlan.window(packLength: 1 << 30) == 16 << 20)
    }

    /// A pause mid-install keeps the new version's files and the record; the resume fetches only what is missing (the
    /// bytes the server sends add up to the pack's at most once, with the range in flight at the pause continued).
    @Test func aPauseMidInstallThenResumeFetchesNothingTwice() async throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("writeonce-pause-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-pause-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 4 << 20)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory("writeonce-pause-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let loaded = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: loaded).downloads.first?.id, "a download")
        let moving = await waitFor(queue, id) { $0.bytesReceived > Int64(packLength) / 3 || !$0.state.isRunning }
        #expect(moving?.state == .active, "under way: \(moving?.error?.description ?? "")")
        try queue.pause([id])
        let paused = try #require(await waitFor(queue, id) { $0.state == .paused }, "paused")
        #expect(paused.bytesReceived > 0 && !Self.usage(home).archive, "bytes kept, in the new version's files")
        let verified = Self.verifiedChunks(home, id)
        let askedBefore = server.requests().count
        #expect(!verified.isEmpty, "chunks verified and recorded before the pause")
        try queue.resume([id])
        let done = try #require(await waitFor(queue, id) { !$0.state.isRunning && $0.state != .paused }, "the download settles")
        #expect(done.state == .finished, "\(done.error?.description ?? "")")
        #expect(try treeContents(try #require(done.contentURL)) == (try Self.reference(site, format, "writeonce-pause-bsdtar")))
        // Sent again: the chunks that were arriving when it paused and not yet checked and written (the sink's queue,
        // and a chunk not whole), and what the server had written to the socket but the client had not read, which
        // grows with how far a busy machine's sink fell behind. Never a verified chunk: the resume's requests are
        // checked against the record as it was at the pause, and the total against a quarter of the pack.
        let again = try Self.verifiedChunksAskedAgain(
            verified, site: site, format: format, requests: Array(server.requests().dropFirst(askedBefore)))
        #expect(again.isEmpty, "verified chunks asked for again after the resume: \(again.prefix(5)) of \(verified.count)")
        let served = server.bodyBytesSent(Self.packName(format))
        #expect(served <= packLength + packLength / 4, "the pack sent about once: \(served) of \(packLength)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The chunks a download's folder records as verified (`verified`: their numbers in the plan, 4 bytes each).
    static func verifiedChunks(_ home: URL, _ id: String) -> Set<Int> {
        let record = home.appending(path: "Caches/.packdelivery/downloads/\(id).delta/verified")
        return (try? Data(contentsOf: record)).map(ChunkAssembly.recordedChunks) ?? []
    }

    /// Which of `verified` (numbers in the plan of a first install of the site's pack, as the client makes it) a request
    /// of the pack in `requests` asked for again: a range that overlaps the chunk's stored bytes, or the whole pack.
    static func verifiedChunksAskedAgain(_ verified: Set<Int>, site: URL, format: PackFormat, requests: [FaultServer.Request]) throws
        -> [Int]
    {
        try Self.verifiedChunksAskedAgain(
            verified, site: site, format: format,
            ranges: requests.filter { $0.file == Self.packName(format) && $0.method == "GET" }.map(\.range))
    }

    /// As above, from the `Range` headers of the requests for the pack (nil: the whole pack).
    static func verifiedChunksAskedAgain(_ verified: Set<Int>, site: URL, format: PackFormat, ranges: [String?]) throws -> [Int] {
        let pack = site.appending(path: Self.packName(format))
        let index = try PackIndex.decode(
            Data(contentsOf: PackWriter.indexURL(for: pack)), maxEntries: 1 << 20, containers: Set(PackIndex.Container.allCases))
        let plan = try ChunkPlan.make(
            index: index, packLength: Int64(try Self.length(pack)), installed: [], damaged: [], local: [:]
        ).get()
        let asked: [ClosedRange<Int64>] = ranges.map { range in
            guard let range, range.hasPrefix("bytes=") else { return 0...Int64.max }
            let bounds = range.dropFirst(6).split(separator: "-", omittingEmptySubsequences: false)
            let start = bounds.count == 2 ? Int64(bounds[0]) ?? 0 : 0
            return start...(bounds.count == 2 ? Int64(bounds[1]) ?? Int64.max : Int64.max)
        }
        return verified.sorted().filter { number in
            guard number < plan.fetch.count else { return true }
            let chunk = plan.fetch[number]
            return asked.contains { $0.overlaps(chunk.offset...(chunk.offset + chunk.length - 1)) }
        }
    }

    /// The names of the files under `folder` that hold a fetched range (`r<start>-<end>.part`).
    static func rangeFiles(_ folder: URL) -> [String] {
        var found: [String] = []
        let enumerator = FileManager.default.enumerator(atPath: folder.path)
        while let path = enumerator?.nextObject() as? String {
            let name = (path as NSString).lastPathComponent
            if name.hasPrefix("r"), name.hasSuffix(".part"), name.contains("-") { found.append(path) }
        }
        return found
    }

    /// A first install's ranges go from the transfer straight into the new version's files: no range file
    /// (`r*.part`) ever appears in the download's folder, through a pause and a resume, and the tree is `bsdtar -xf`
    /// of the pack with no byte of it sent twice beyond the chunk in flight at the pause.
    @Test func aFirstInstallKeepsNoRangeFileThroughAPauseAndAResume() async throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("writeonce-norange-content", big: 10)
        let site = try Fixtures.temporaryDirectory("writeonce-norange-site")
        try Self.publish(content, site: site, format: format)
        let packLength = try Self.length(site.appending(path: Self.packName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = server.url(Self.packName(format), fault: .slow(bytesPerSecond: 8 << 20)).absoluteString
        try JSONEncoder().encode(manifest).write(to: site.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory("writeonce-norange-home")
        let queue = try Self.queue(home)
        defer { queue.close() }
        let downloads = home.appending(path: "Caches/.packdelivery/downloads")
        let watching = Atomic<Bool>(true)
        let seen = Mutex<(files: Set<String>, samples: Int)>(([], 0))
        let watcher = Thread {
            while watching.load(ordering: .relaxed) {
                let now = Self.rangeFiles(downloads)
                seen.withLock {
                    $0.files.formUnion(now)
                    $0.samples += 1
                }
                usleep(1000)
            }
        }
        watcher.start()
        let loaded = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: loaded).downloads.first?.id, "a download")
        let moving = await waitFor(queue, id) { $0.bytesReceived > Int64(packLength) / 3 || !$0.state.isRunning }
        #expect(moving?.state == .active, "under way: \(moving?.error?.description ?? "")")
        try queue.pause([id])
        _ = try #require(await waitFor(queue, id) { $0.state == .paused }, "paused")
        let verified = Self.verifiedChunks(home, id)
        let askedBefore = server.requests().count
        #expect(!verified.isEmpty, "chunks verified and recorded before the pause")
        try queue.resume([id])
        let done = try #require(await waitFor(queue, id) { !$0.state.isRunning && $0.state != .paused }, "the download settles")
        watching.store(false, ordering: .relaxed)
        while !watcher.isFinished { usleep(1000) }
        #expect(done.state == .finished, "\(done.error?.description ?? "")")
        let (files, samples) = seen.withLock { ($0.files, $0.samples) }
        #expect(samples > 100, "the downloads folder was sampled during the install: \(samples)")
        #expect(files.isEmpty, "no range file during the install: \(files.sorted())")
        #expect(try treeContents(try #require(done.contentURL)) == (try Self.reference(site, format, "writeonce-norange-bsdtar")))
        let again = try Self.verifiedChunksAskedAgain(
            verified, site: site, format: format, requests: Array(server.requests().dropFirst(askedBefore)))
        #expect(again.isEmpty, "verified chunks asked for again after the resume: \(again.prefix(5)) of \(verified.count)")
        let served = server.bodyBytesSent(Self.packName(format))
        #expect(served <= packLength + packLength / 4, "the pack sent about once: \(served) of \(packLength)")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The space asked for before a first install that writes each byte once is its unpacked size and the margin; the
    /// same pack with delta updates off (so fetched whole) asks for the pack and its content.
    @Test func theSpaceAskedForIsTheUnpackedSizeAndTheMargin() {
        let packLength: Int64 = 16 << 20
        for writesOnce in [false, true] {
            var queue = QueueMachine(concurrency: 1, spaceMargin: 100)
            var download = Download(
                id: "d-0", transactionID: "t-0", productIdentifier: "p", contentIdentifier: "p", contentVersion: "1",
                contentLength: packLength, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
                contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/p.tar")!, sha256: String(repeating: "ab", count: 32),
                unpackedLength: 5000, destination: .caches, bytesReceived: 0)
            download.index = Manifest.IndexReference(
                url: "http://127.0.0.1/p.tar.index", sha256: String(repeating: "cd", count: 32), length: 10)
            _ = queue.own(DownloadMachine(download: download), position: 0)
            let facts = DeliveryFacts(deltaUpdates: writesOnce)
            let actions = queue.admit("d-0", facts: facts, available: 5100, path: "/home")
            if writesOnce {
                let started = actions.compactMap { action -> TransferOrder? in
                    if case .run("d-0", .startTransfer(let order)) = action { return order }
                    return nil
                }
                #expect(started.map(\.plan) == [.writeOnce], "5000 + 100 fit: \(actions)")
            } else {
                #expect(queue.download("d-0")?.error?.neededBytes == packLength + 5100, "the pack and its content")
            }
        }
    }
}
