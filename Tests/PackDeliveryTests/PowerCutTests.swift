import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

let powerCutSkipped = Comment(
    rawValue: "\(PowerCutDisk.unavailableReason ?? ""); the durable order is still exercised by every other install test")

/// Power cuts: the home lives on an ext4 filesystem whose power is cut (EXT4_IOC_SHUTDOWN with
/// NOLOGFLUSH, then unmount and mount), at moments from mid-download to just after `packs fetch` exits 0.
/// After every cut the state store opens, and either the content is installed byte for byte with its
/// transaction finished, or an open transaction remains that `packs resume` completes byte for byte.
@Suite(.timeLimit(.minutes(5)), .serialized, .enabled(if: PowerCutDisk.unavailableReason == nil, powerCutSkipped))
struct PowerCutTests {
    /// The two packs of the issue: one large file, and many small ones.
    enum Shape: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case oneLargeFile, manySmallFiles
        var testDescription: String { self.rawValue }
    }

    /// Where the power is cut.
    enum Moment: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case midDownload
        case midUnpack = "mid-unpack"
        case beforeRename = "before-rename"
        case afterRename = "after-rename"
        var testDescription: String { self.rawValue }
    }

    /// A site serving one pack of the shape, and the folder the pack was made from (what must be installed).
    struct Source {
        let site: URL
        let content: URL
        let product = "com.example.cut"
    }

    static func source(_ shape: Shape, _ label: String) throws -> Source {
        let site = try Fixtures.temporaryDirectory(label + "-site")
        let content = try Fixtures.temporaryDirectory(label + "-content")
        switch shape {
        case .oneLargeFile:
            try Fixtures.randomFile(at: content.appending(path: "Contents/level.bin"), size: 48 << 20)
        case .manySmallFiles:
            for index in 0..<1_500 {
                try Fixtures.randomFile(
                    at: content.appending(path: "Contents/part\(index / 100)/file\(index).dat"), size: 512 + (index * 37) % 6_000)
            }
        }
        try PackWriter.write(
            folder: content, to: site.appending(path: "cut.tar"), format: .tar,
            contentInfo: (productIdentifier: "com.example.cut", contentVersion: "1.0"))
        try ManifestBuilder.write(folder: site)
        return Source(site: site, content: content)
    }

    /// Checks that the product is installed byte for byte, verified, and its transaction finished.
    static func expectDelivered(_ source: Source, home: URL, _ context: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let content = try CLI.run(home: home, ["content", source.product])
        try #require(content.status == 0, "\(context): content: \(content.stderr)", sourceLocation: sourceLocation)
        let folder = URL(filePath: content.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        try #require(
            folder.path.hasPrefix(home.path), "\(context): installed under the home: \(folder.path)", sourceLocation: sourceLocation)
        var installed = try treeContents(folder)
        // The pack holds the folder plus the ContentInfo.plist the writer added.
        #expect(
            installed.removeValue(forKey: "ContentInfo.plist") != nil, "\(context): ContentInfo.plist installed",
            sourceLocation: sourceLocation)
        let expected = try treeContents(source.content)
        #expect(installed.keys.sorted() == expected.keys.sorted(), "\(context): the same files", sourceLocation: sourceLocation)
        let different = expected.filter { installed[$0.key] != $0.value }.map(\.key)
        #expect(
            different.isEmpty, "\(context): byte-exact, but \(different.count) files differ, e.g. \(different.prefix(3))",
            sourceLocation: sourceLocation)
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(
            status.stdout.contains(#"{"transactions":[]}"#), "\(context): no open transaction: \(status.stdout)",
            sourceLocation: sourceLocation)
        let verify = try CLI.run(home: home, ["verify", source.product])
        #expect(verify.status == 0, "\(context): verify: \(verify.stdout) \(verify.stderr)", sourceLocation: sourceLocation)
    }

    @Test(arguments: Shape.allCases)
    func whatAFetchThatExitedZeroInstalledSurvivesACutRightAfter(shape: Shape) throws {
        let source = try Self.source(shape, "cut-after-\(shape.rawValue)")
        let nginx = try NginxServer(root: source.site)
        defer { nginx.stop() }
        let disk = try PowerCutDisk("cut-after-\(shape.rawValue)")
        let home = disk.mountPoint.appending(path: "home")
        let fetch = try CLI.run(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, source.product])
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        try disk.cut()
        try disk.remount()
        try Self.expectDelivered(source, home: home, "cut right after exit 0")
    }

    @Test(arguments: Shape.allCases, Moment.allCases)
    func aCutAtAnyMomentLeavesWhatResumeCompletesByteForByte(shape: Shape, moment: Moment) throws {
        let label = "cut-\(moment.rawValue)-\(shape.rawValue)"
        let source = try Self.source(shape, label)
        let packLength = Int64(
            try #require(try FileManager.default.attributesOfItem(atPath: source.site.appending(path: "cut.tar").path)[.size] as? Int))
        let nginx = try NginxServer(root: source.site, limitRate: moment == .midDownload ? Int(packLength / 8) : nil)
        defer { nginx.stop() }
        let disk = try PowerCutDisk(label)
        let home = disk.mountPoint.appending(path: "home")
        var environment = ProcessInfo.processInfo.environment
        if moment != .midDownload { environment["PACKS_TEST_PAUSE_AT"] = moment.rawValue }
        let fetch = try WatchedProcess(
            // --no-delta: the whole-pack path (its partial archive and streamed unpack), which these moments cut.
            CLI.binary,
            ["--home", home.path, "fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, source.product, "--no-delta"],
            environment: environment)
        if moment == .midDownload {
            // Past half the pack, and over 3 s in, so that the periodic sync of the partial file (every 2 s) has run.
            let started = Date()
            let reached = waitUntil(timeout: 30) {
                (partialArchive(home).flatMap { Self.size($0) } ?? 0) > packLength / 2 && Date().timeIntervalSince(started) > 3
            }
            #expect(reached, "the fetch got past half of the pack")
        } else {
            #expect(
                fetch.waitForStderr("paused at \(moment.rawValue)", timeout: 60), "the fetch reached \(moment.rawValue): \(fetch.stderr)")
        }
        let kept = partialArchive(home).flatMap { Self.size($0) } ?? 0
        try disk.cut()
        fetch.kill()
        try disk.remount()

        // The store opens; the purchase is either delivered or open, never lost.
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(status.status == 0, "the store opens after the cut: \(status.stderr)")
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "resume after a cut \(moment.rawValue): \(resume.stderr)")
        try Self.expectDelivered(source, home: home, "cut \(moment.rawValue), then resume")
        if moment == .midDownload {
            // Bytes made durable before the cut were not fetched again.
            let ranges = nginx.requests().filter { $0.uri == "/cut.tar" }.map(\.range)
            let resumedFrom = ranges.last??.split(separator: "=").last.flatMap { Int64($0.dropLast()) } ?? 0
            #expect(resumedFrom > 0 && resumedFrom <= kept, "resumed from the durable bytes (\(kept) were on disk at the cut): \(ranges)")
        }
    }

    static func size(_ url: URL) -> Int64? {
        (try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int).map(Int64.init)
    }
}

/// Polls a condition every 10 ms; false after `timeout` seconds.
func waitUntil(timeout: TimeInterval, _ condition: () -> Bool) -> Bool {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}

/// A program started without waiting, whose standard error is collected as it arrives.
final class WatchedProcess: Sendable {
    private final class Output: Sendable { let data = Mutex<Data>(Data()) }
    private let process: Process
    private let output = Output()

    /// Starts `executable`; its standard input is `input` when given (the end of input is closing its writing end).
    init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil, input: Pipe? = nil) throws {
        let process = Process()
        process.executableURL = URL(filePath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        process.standardOutput = FileHandle.nullDevice
        process.standardInput = input ?? FileHandle.nullDevice
        let pipe = Pipe()
        process.standardError = pipe
        self.process = process
        try process.run()
        let output = self.output
        let reader = Thread {
            let handle = pipe.fileHandleForReading
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { return }
                output.data.withLock { $0.append(chunk) }
            }
        }
        reader.start()
    }

    var stderr: String { self.output.data.withLock { String(decoding: $0, as: UTF8.self) } }

    /// Waits until standard error holds `text`; false after `timeout` seconds or when the program exited first.
    func waitForStderr(_ text: String, timeout: TimeInterval) -> Bool {
        waitUntil(timeout: timeout) { self.stderr.contains(text) || !self.process.isRunning } && self.stderr.contains(text)
    }

    /// Waits for the exit; its status, or nil (and a SIGKILL) when it is still running after `timeout` seconds.
    func waitForExit(timeout: TimeInterval) -> Int32? {
        guard waitUntil(timeout: timeout, { !self.process.isRunning }) else {
            self.kill()
            return nil
        }
        self.process.waitUntilExit()
        return self.process.terminationStatus
    }

    /// SIGKILL, and waits for the exit.
    func kill() {
        if self.process.isRunning { Glibc.kill(self.process.processIdentifier, SIGKILL) }
        self.process.waitUntilExit()
    }
}
