import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// The `packs` binary built beside the tests, run as a user would.
enum CLI {
    static let binary: String = {
        if let path = ProcessInfo.processInfo.environment["PACKS_BINARY"] { return path }
        let beside = URL(filePath: CommandLine.arguments[0]).deletingLastPathComponent().appending(path: "packs")
        if FileManager.default.isExecutableFile(atPath: beside.path) { return beside.path }
        return packageRoot.appending(path: ".build/debug/packs").path
    }()

    static let packageRoot = URL(filePath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
        /// The `--json` event lines of stdout.
        var events: [[String: Any]] {
            self.stdout.split(separator: "\n").compactMap { line in
                (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
            }
        }
    }

    /// Runs `packs --home HOME ARGS…`.
    static func run(home: URL, _ arguments: [String], timeout: TimeInterval = 120, environment: [String: String] = [:]) throws -> Result {
        let result = try Fixtures.run(
            self.binary, ["--home", home.path] + arguments,
            environment: environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 }, timeout: timeout)
        return Result(status: result.status, stdout: result.stdout, stderr: result.stderr)
    }

    /// Starts `packs --home HOME ARGS…` without waiting (for kill tests).
    static func start(home: URL, _ arguments: [String]) throws -> Process {
        let process = Process()
        process.executableURL = URL(filePath: self.binary)
        process.arguments = ["--home", home.path] + arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }
}

/// A folder of packs and their manifest, as a content pipeline publishes it.
struct TestSite {
    let folder: URL
    /// For a random site: the SHA-256 of `Contents/data.bin`.
    var dataSHA256: String?

    /// Packs every SampleContent folder (formats rotate through zip, tar.gz, tar.xz, tar.zst) and writes manifest.json.
    static func samples(_ label: String) throws -> TestSite {
        let folder = try Fixtures.temporaryDirectory(label)
        let samples = CLI.packageRoot.appending(path: "SampleContent")
        let formats: [PackFormat] = [.zip, .tarGzip, .tarXz, .tarZstd]
        for (index, name) in try FileManager.default.contentsOfDirectory(atPath: samples.path).sorted().enumerated() {
            try PackWriter.write(
                folder: samples.appending(path: name), to: folder.appending(path: "\(name).\(formats[index % 4].rawValue)"),
                format: formats[index % 4])
        }
        try ManifestBuilder.write(folder: folder)
        return TestSite(folder: folder)
    }

    /// A site with one pack of random bytes, `big.tar` (uncompressed, so its size is about `size`), or
    /// `big.zip` with `format: .zip`.
    static func random(
        _ label: String, product: String = "com.example.big", version: String = "1.0", size: Int,
        format: PackFormat = .tar
    ) throws -> TestSite {
        let folder = try Fixtures.temporaryDirectory(label)
        let content = try Fixtures.temporaryDirectory(label + "-content")
        // Only the pack is kept: the folder it was made from would outlive the test.
        defer { try? FileManager.default.removeItem(at: content) }
        try FileManager.default.createDirectory(at: content.appending(path: "Contents"), withIntermediateDirectories: true)
        try Fixtures.randomFile(at: content.appending(path: "Contents/data.bin"), size: size)
        try PackWriter.write(
            folder: content, to: folder.appending(path: format == .zip ? "big.zip" : "big.tar"), format: format,
            contentInfo: (productIdentifier: product, contentVersion: version))
        try ManifestBuilder.write(folder: folder)
        return TestSite(folder: folder, dataSHA256: try Fixtures.sha256Hex(of: content.appending(path: "Contents/data.bin")))
    }

    var manifestURL: URL { self.folder.appending(path: "manifest.json") }

    func manifest() throws -> Manifest {
        try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: self.manifestURL))
    }

    /// Rewrites the manifest (for bad-data tests).
    func editManifest(_ change: (inout Manifest) -> Void) throws {
        var manifest = try self.manifest()
        change(&manifest)
        try JSONEncoder().encode(manifest).write(to: self.manifestURL)
    }
}

/// Every regular file under a folder, by relative path, with its bytes.
func treeContents(_ folder: URL) throws -> [String: Data] {
    var result: [String: Data] = [:]
    let enumerator = FileManager.default.enumerator(atPath: folder.path)
    while let path = enumerator?.nextObject() as? String {
        let url = folder.appending(path: path)
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory), !isDirectory.boolValue {
            result[path] = try Data(contentsOf: url)
        }
    }
    return result
}

/// Files and folders left in the home's staging and downloads folders (should be none once settled).
func leftovers(_ home: URL) -> [String] {
    ["Caches", "Documents"].flatMap { root in
        ["staging", "downloads"].flatMap { folder in
            ((try? FileManager.default.contentsOfDirectory(atPath: home.appending(path: "\(root)/.packdelivery/\(folder)").path)) ?? [])
                .map { "\(root)/.packdelivery/\(folder)/\($0)" }
        }
    }
}

/// ``leftovers(_:)`` once they are gone, or as they are after `timeout` seconds: an install removes what it left (the
/// old version after a swap, the downloads folder's work) on a janitor queue after its record is committed, so a test
/// that has just seen a download settle may look before that queue ran.
func leftoversAfterCleanup(_ home: URL, timeout: TimeInterval = 10) -> [String] {
    let deadline = Date().addingTimeInterval(timeout)
    while !leftovers(home).isEmpty, Date() < deadline { usleep(20_000) }
    return leftovers(home)
}

/// Flips one bit of the byte at `offset` of the file at `path` and puts its access and modification times back: damage
/// that a file's size and time do not show (bit rot, a careless tool), which only hashing finds.
func flipByteKeepingTimes(_ path: String, at offset: off_t) {
    var info = stat()
    #expect(stat(path, &info) == 0, "\(path) exists")
    let fd = open(path, O_RDWR)
    var byte: UInt8 = 0
    #expect(pread(fd, &byte, 1, offset) == 1)
    byte ^= 0x01
    #expect(pwrite(fd, &byte, 1, offset) == 1)
    close(fd)
    var times = [info.st_atim, info.st_mtim]
    #expect(utimensat(AT_FDCWD, path, &times, 0) == 0)
}
