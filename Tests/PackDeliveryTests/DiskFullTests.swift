import Foundation
@_spi(Testing) import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A small real filesystem (tmpfs) as the home folder; mounting needs root.
final class Tmpfs: Sendable {
    let folder: URL

    /// Whether this process may mount (root, and mount allowed here).
    static let available: Bool = {
        guard geteuid() == 0, let probe = try? Tmpfs(megabytes: 1) else { return false }
        probe.unmount()
        return true
    }()

    init(megabytes: Int) throws {
        self.folder = try Fixtures.temporaryDirectory("tmpfs")
        let mount = try Fixtures.run("mount", ["-t", "tmpfs", "-o", "size=\(megabytes)m", "tmpfs", self.folder.path])
        guard mount.status == 0 else { throw FixtureError("mount failed: \(mount.stderr)") }
    }

    deinit { self.unmount() }

    func unmount() { _ = try? Fixtures.run("umount", ["-l", self.folder.path]) }

    var available: Int64 {
        var info = statvfs()
        statvfs(self.folder.path, &info)
        return Int64(info.f_bavail) * Int64(info.f_frsize)
    }

    /// Takes all the free space but `leaving` bytes: one preallocated file, then (when leaving nothing)
    /// zeros until the filesystem says ENOSPC, since a download may be taking space at the same time.
    func fill(leaving: Int64 = 0) {
        let size = max(0, self.available - leaving - (leaving == 0 ? 1 << 20 : 0))
        _ = try? Fixtures.run("fallocate", ["-l", "\(size)", self.folder.appending(path: "filler").path])
        if leaving == 0 {
            _ = try? Fixtures.run("dd", ["if=/dev/zero", "of=\(self.folder.appending(path: "filler2").path)", "bs=64k"])
        }
    }

    func unfill() {
        try? FileManager.default.removeItem(at: self.folder.appending(path: "filler"))
        try? FileManager.default.removeItem(at: self.folder.appending(path: "filler2"))
    }
}

private let diskFullSkipped: Comment =
    "mounting a tmpfs needs root; QueueTests and FaultTests cover the same logic with an injectable writer"

/// Disk full on a real filesystem: paused with a reason, bytes kept, `status` still readable,
/// resume fetching only what is missing, cancel freeing the space.
@Suite(.timeLimit(.minutes(5)), .enabled(if: Tmpfs.available, diskFullSkipped))
struct DiskFullTests {
    static func downloadID(_ home: URL) throws -> String {
        let status = try CLI.run(home: home, ["--json", "status"])
        let document = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let downloads = try #require((document["transactions"] as? [[String: Any]])?.first?["downloads"] as? [[String: Any]])
        return try #require(downloads.first?["id"] as? String)
    }

    @Test func aPackThatCannotFitIsPausedBeforeFetchingAnything() throws {
        let disk = try Tmpfs(megabytes: 16)
        let site = try TestSite.random("nofit-site", size: 12 << 20)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let fetch = try CLI.run(
            home: disk.folder, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"])
        #expect(fetch.status == 75)
        let id = try Self.downloadID(disk.folder)
        #expect(fetch.stderr.contains("bytes needed") && fetch.stderr.contains("available"), "stderr: \(fetch.stderr)")
        #expect(fetch.stderr.contains("packs resume \(id)") && fetch.stderr.contains("packs cancel \(id)"), "stderr: \(fetch.stderr)")
        #expect(nginx.requests().filter { $0.uri == "/big.tar" }.isEmpty, "nothing was fetched")
        let status = try CLI.run(home: disk.folder, ["--json", "status"])
        #expect(
            status.stdout.contains(#""pauseReason":"insufficientStorage""#) && status.stdout.contains("neededBytes")
                && status.stdout.contains("availableBytes"))
    }

    @Test func theDiskFillsMidDownloadThenResumeFetchesOnlyTheMissingBytes() throws {
        let disk = try Tmpfs(megabytes: 48)
        let site = try TestSite.random("midfill-site", size: 16 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        let fetch = try runWatching(
            // --no-delta: the whole-pack path (its partial archive); a first install that writes each byte once is WriteOnceTests'.
            home: disk.folder, ["fetch", manifestURL, "com.example.big", "--no-delta"], when: { ($0["progress"] as? Double ?? 0) > 0.25 }
        ) { _ in
            disk.fill()
        }
        #expect(fetch.matched && fetch.status == 75)
        let id = try Self.downloadID(disk.folder)
        let partial = disk.folder.appending(path: "Caches/.packdelivery/downloads/\(id).pack")
        let kept = try #require(try FileManager.default.attributesOfItem(atPath: partial.path)[.size] as? Int64)
        #expect(kept >= 4 << 20, "the bytes written before the disk filled are kept")

        // The state store is on the full filesystem too: status still works.
        let status = try CLI.run(home: disk.folder, ["status"])
        #expect(status.status == 0 && status.stdout.contains("insufficientStorage"), "\(status.stdout) \(status.stderr)")

        disk.unfill()
        let resume = try CLI.run(home: disk.folder, ["resume", id])
        #expect(resume.status == 0, "stderr: \(resume.stderr)")
        let requests = nginx.requests().filter { $0.uri == "/big.tar" }
        #expect(requests.count == 2 && requests.last?.range == "bytes=\(kept)-" && requests.last?.status == 206, "\(requests)")
        let content = try CLI.run(home: disk.folder, ["content", "com.example.big"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: content).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }

    @Test func cancelAfterTheDiskFilledFreesTheSpace() throws {
        let disk = try Tmpfs(megabytes: 48)
        let site = try TestSite.random("cancelfill-site", size: 16 << 20)
        let nginx = try NginxServer(root: site.folder, limitRate: 4 << 20)
        defer { nginx.stop() }
        let fetch = try runWatching(
            home: disk.folder, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big", "--no-delta"],
            when: { ($0["progress"] as? Double ?? 0) > 0.25 }
        ) { _ in disk.fill() }
        #expect(fetch.status == 75)
        let id = try Self.downloadID(disk.folder)
        let partial = disk.folder.appending(path: "Caches/.packdelivery/downloads/\(id).pack")
        let kept = try #require(try FileManager.default.attributesOfItem(atPath: partial.path)[.size] as? Int64)
        let before = disk.available
        let cancel = try CLI.run(home: disk.folder, ["cancel", id])
        #expect(cancel.status == 0, "stderr: \(cancel.stderr)")
        #expect(disk.available - before >= kept - (64 << 10), "the partial download's \(kept) bytes are free again")
        #expect(!FileManager.default.fileExists(atPath: disk.folder.appending(path: "Caches/.packdelivery/downloads/\(id).pack").path))
    }

    /// The unpack after the download (what runs when a pack was not unpacked while it downloaded: streaming
    /// turned off here, the library's option) fills the real disk: the archive is kept, and resume only unpacks.
    @Test func theDiskFillsWhileUnpackingThenResumeOnlyUnpacks() async throws {
        let disk = try Tmpfs(megabytes: 48)
        let site = try TestSite.random("unpackfill-site", size: 16 << 20, format: .zip)
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        final class Once: Sendable { let done = Atomic<Bool>(false) }
        let filled = Once()
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1)
        configuration.streamingUnpack = false
        // The first MiB is unpacked: take all the space that is left.
        configuration.installHook = { step in if step == .unpacking, !filled.done.exchange(true, ordering: .relaxed) { disk.fill() } }
        let queue = try DownloadQueue(home: Home(folder: disk.folder), configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(nginx.baseURL.appending(path: "manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)

        let paused = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        let reached = filled.done.load(ordering: .relaxed)
        #expect(reached, "the unpack reached its first MiB")
        #expect(paused.state == .paused && paused.pauseReason == .insufficientStorage, "\(paused)")
        let archive = disk.folder.appending(path: "Caches/.packdelivery/downloads/\(id).pack")
        #expect(FileManager.default.fileExists(atPath: archive.path), "the downloaded archive is kept")
        #expect(leftovers(disk.folder) == ["Caches/.packdelivery/downloads/\(id).pack"], "no staging left")
        disk.unfill()
        try queue.resume([id])
        let finished = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the resumed download settles")
        #expect(finished.state == .finished, "\(finished.error?.description ?? "")")
        #expect(nginx.requests().filter { $0.uri == "/big.zip" }.count == 1, "nothing downloaded again")
        #expect(try Fixtures.sha256Hex(of: try #require(finished.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }
}
