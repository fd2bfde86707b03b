import Foundation
import Testing

@testable import PackDelivery

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// Packs written by PackWriter are read back by bsdtar and by Unpacker and compared with the folder.
// Helpers shared with UnpackerTests.swift: unpackTreeListing, unpackRunTool, unpackRandomData, unpackStat.

@Suite("PackWriter", .timeLimit(.minutes(5)))
struct PackWriterTests {
    @Test("Every format round-trips through bsdtar and Unpacker", arguments: PackFormat.allCases)
    func roundTrip(format: PackFormat) throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.sampleFolder()
        let output = fixture.root.appendingPathComponent("pack." + format.rawValue)
        let length = try PackWriter.write(folder: folder, to: output, format: format)

        let expected = try unpackTreeListing(folder)
        #expect(length == expected.values.reduce(0) { $0 + $1.bytes })
        let byBsdtar = try fixture.folder("bsdtar")
        try unpackRunTool(["bsdtar", "-xf", output.path, "-C", byBsdtar.path])
        #expect(try unpackTreeListing(byBsdtar) == expected)
        let byUnpacker = try fixture.folder("unpacker")
        let summary = try Unpacker.unpack(archive: output, into: byUnpacker, limits: UnpackLimits(maxBytes: length))
        #expect(try unpackTreeListing(byUnpacker) == expected)
        #expect(summary.bytes == length)
        #expect(try fixture.leftovers().isEmpty)
    }

    @Test("Entries are sorted, owned by root, with normalised modes")
    func entryOrderAndMetadata() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.sampleFolder()
        try FileManager.default.setAttributes([.posixPermissions: 0o666], ofItemAtPath: folder.appendingPathComponent("b.txt").path)
        let output = fixture.root.appendingPathComponent("pack.tar")
        try PackWriter.write(folder: folder, to: output, format: .tar)
        let listing = try fixture.capture(["bsdtar", "-tvf", output.path])
        let lines = listing.split(separator: "\n").map(String.init)
        let names = lines.map { $0.split(separator: " ", omittingEmptySubsequences: true)[8...].joined(separator: " ") }
        #expect(
            names == [
                "a.txt", "b.txt", "empty/", "link -> nested/deep/data.bin", "nested/", "nested/deep/", "nested/deep/data.bin",
                "nested/deep/run.sh", "nested/z.txt", "space name.txt", "é.txt",
            ])
        for line in lines {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            #expect(fields[2] == "0" && fields[3] == "0", "\(line)")
        }
        #expect(lines.first { $0.hasSuffix(" b.txt") }?.hasPrefix("-rw-r--r--") == true)
        #expect(lines.first { $0.hasSuffix(" nested/deep/run.sh") }?.hasPrefix("-rwxr-xr-x") == true)
    }

    @Test("The same folder gives the same bytes; gzip headers carry no timestamp")
    func reproducible() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.sampleFolder()
        for format in [PackFormat.tarGzip, .zip, .tarZstd] {
            let first = fixture.root.appendingPathComponent("first." + format.rawValue)
            let second = fixture.root.appendingPathComponent("second." + format.rawValue)
            try PackWriter.write(folder: folder, to: first, format: format)
            try PackWriter.write(folder: folder, to: second, format: format)
            #expect(try Data(contentsOf: first) == (try Data(contentsOf: second)), "\(format)")
            if format == .tarGzip {
                let header = try Data(contentsOf: first).prefix(8)
                #expect(Array(header.prefix(2)) == [0x1F, 0x8B])
                #expect(Array(header.suffix(4)) == [0, 0, 0, 0], "gzip MTIME must be zero")
            }
        }
    }

    @Test("With contentInfo, ContentInfo.plist is at the root and the payload under Contents/")
    func contentInfoWrapsPayload() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.sampleFolder()
        try Data("stale".utf8).write(to: folder.appendingPathComponent("ContentInfo.plist"))
        let output = fixture.root.appendingPathComponent("pack.zip")
        let length = try PackWriter.write(
            folder: folder, to: output, format: .zip,
            contentInfo: (productIdentifier: "com.example.levels", contentVersion: "1.2"))

        let unpacked = try fixture.folder("unpacked")
        let summary = try Unpacker.unpack(archive: output, into: unpacked, limits: UnpackLimits(maxBytes: 1 << 30))
        #expect(summary.bytes == length)
        let names = try FileManager.default.contentsOfDirectory(atPath: unpacked.path).sorted()
        #expect(names == ["ContentInfo.plist", "Contents"])
        let info = try PropertyListDecoder().decode(
            [String: String].self, from: Data(contentsOf: unpacked.appendingPathComponent("ContentInfo.plist")))
        #expect(info == ["ContentVersion": "1.2", "IAPProductIdentifier": "com.example.levels"])
        let plistText = try String(contentsOf: unpacked.appendingPathComponent("ContentInfo.plist"), encoding: .utf8)
        #expect(plistText.hasPrefix("<?xml"))

        var expected = try unpackTreeListing(folder)
        expected["ContentInfo.plist"] = nil  // the folder's own one is replaced, not moved under Contents/
        #expect(try unpackTreeListing(unpacked.appendingPathComponent("Contents")) == expected)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: unpacked.path + "/Contents/link") == "nested/deep/data.bin")
    }

    @Test("With contentInfo, a folder that already has Contents/ keeps its layout")
    func contentInfoKeepsLayout() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.folder("source")
        try FileManager.default.createDirectory(at: folder.appendingPathComponent("Contents/levels"), withIntermediateDirectories: true)
        try Data("level one".utf8).write(to: folder.appendingPathComponent("Contents/levels/1.json"))
        try Data("read me".utf8).write(to: folder.appendingPathComponent("README"))
        try Data("old".utf8).write(to: folder.appendingPathComponent("ContentInfo.plist"))
        let output = fixture.root.appendingPathComponent("pack.tar.xz")
        try PackWriter.write(
            folder: folder, to: output, format: .tarXz,
            contentInfo: (productIdentifier: "com.example.sounds", contentVersion: "7"))

        let unpacked = try fixture.folder("unpacked")
        try unpackRunTool(["bsdtar", "-xf", output.path, "-C", unpacked.path])
        let listing = try unpackTreeListing(unpacked)
        #expect(listing.keys.sorted() == ["ContentInfo.plist", "Contents", "Contents/levels", "Contents/levels/1.json", "README"])
        let info = try PropertyListDecoder().decode(
            ContentInfo.self, from: Data(contentsOf: unpacked.appendingPathComponent("ContentInfo.plist")))
        #expect(info == ContentInfo(contentVersion: "7", productIdentifier: "com.example.sounds"))
    }

    @Test("A folder the unpacker would refuse is refused, and no pack or temporary file is left")
    func refusedFolders() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let cases: [(String, (URL) throws -> Void, String)] = [
            (
                "absolute symlink",
                { try FileManager.default.createSymbolicLink(atPath: $0.path + "/abs", withDestinationPath: "/etc/passwd") }, "abs"
            ),
            (
                "escaping symlink",
                { try FileManager.default.createSymbolicLink(atPath: $0.path + "/up", withDestinationPath: "../outside") }, "up"
            ),
            (
                "symlink through a symlink",
                {
                    try FileManager.default.createSymbolicLink(atPath: $0.path + "/s", withDestinationPath: ".")
                    try FileManager.default.createSymbolicLink(atPath: $0.path + "/s2", withDestinationPath: "s/a.txt")
                }, "s2"
            ),
            ("FIFO", { _ = mkfifo($0.path + "/pipe", 0o644) }, "pipe"),
        ]
        for (name, make, entry) in cases {
            let folder = try fixture.folder(name)
            try Data("a".utf8).write(to: folder.appendingPathComponent("a.txt"))
            try make(folder)
            let output = fixture.root.appendingPathComponent("out-\(entry).tar.gz")
            do {
                try PackWriter.write(folder: folder, to: output, format: .tarGzip)
                Issue.record("\(name) was packed")
            } catch {
                #expect(error.kind == .usage, "\(name): \(error)")
                #expect(error.message.contains("/\(entry)'"), "\(name): \(error.message)")
                #expect(error.subject == folder.path + "/" + entry, "\(name): \(error.subject ?? "nil")")
            }
            #expect(!FileManager.default.fileExists(atPath: output.path), "\(name)")
        }
        #expect(try fixture.leftovers().isEmpty)
    }

    @Test("A failed write leaves an existing pack untouched")
    func failureKeepsExistingPack() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let output = fixture.root.appendingPathComponent("pack.zip")
        try Data("previous pack".utf8).write(to: output)
        let folder = try fixture.folder("source")
        _ = mkfifo(folder.path + "/pipe", 0o644)
        #expect(throws: PackDeliveryError.self) { try PackWriter.write(folder: folder, to: output, format: .zip) }
        #expect(try Data(contentsOf: output) == Data("previous pack".utf8))
        #expect(try fixture.leftovers().isEmpty)

        let missing = fixture.root.appendingPathComponent("no-such-folder/pack.zip")
        let sample = try fixture.sampleFolder()
        do {
            try PackWriter.write(folder: sample, to: missing, format: .zip)
            Issue.record("wrote into a missing folder")
        } catch {
            #expect(error.kind == .io)
        }
    }

    @Test("A pack written inside the folder it packs does not contain itself")
    func outputInsideFolder() throws {
        let fixture = try PackWriterFixture()
        defer { fixture.remove() }
        let folder = try fixture.sampleFolder()
        let output = folder.appendingPathComponent("self.tar")
        try PackWriter.write(folder: folder, to: output, format: .tar)
        let expected = try unpackTreeListing(folder).filter { $0.key != "self.tar" }
        try PackWriter.write(folder: folder, to: output, format: .tar)  // again, now that self.tar exists
        let unpacked = try fixture.folder("unpacked")
        _ = try Unpacker.unpack(archive: output, into: unpacked, limits: UnpackLimits(maxBytes: 1 << 30))
        #expect(try unpackTreeListing(unpacked) == expected)
    }

    @Test("PackFormat is chosen from the output file name")
    func formatFromFileName() {
        let cases: [(String, PackFormat?)] = [
            ("level.zip", .zip), ("a/b/level.tar", .tar), ("level.tar.gz", .tarGzip), ("level.tgz", .tarGzip),
            ("level.tar.bz2", .tarBzip2), ("level.tar.xz", .tarXz), ("level.tar.zst", .tarZstd), ("LEVEL.ZIP", .zip),
            ("level.gz", nil), ("level.txt", nil), ("level", nil), ("level.zst", nil),
        ]
        for (name, format) in cases {
            #expect(PackFormat(fileName: name) == format, "\(name)")
        }
        #expect(PackFormat.allCases.map(\.rawValue) == ["zip", "tar", "tar.gz", "tar.bz2", "tar.xz", "tar.zst"])
    }
}

/// A fresh temporary folder per test.
private final class PackWriterFixture {
    let root: URL

    init() throws {
        self.root = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("packwriter-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: self.root, withIntermediateDirectories: true)
    }

    func remove() {
        try? FileManager.default.removeItem(at: self.root)
    }

    func folder(_ name: String) throws -> URL {
        let folder = self.root.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        return folder
    }

    /// Nested folders, an empty folder, an executable, a relative symlink, odd names and random data.
    func sampleFolder() throws -> URL {
        let folder = try self.folder("sample-\(UUID().uuidString)")
        let manager = FileManager.default
        try manager.createDirectory(at: folder.appendingPathComponent("nested/deep"), withIntermediateDirectories: true)
        try manager.createDirectory(at: folder.appendingPathComponent("empty"), withIntermediateDirectories: true)
        try unpackRandomData(300_000).write(to: folder.appendingPathComponent("nested/deep/data.bin"))
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: folder.appendingPathComponent("nested/deep/run.sh"))
        try manager.setAttributes([.posixPermissions: 0o755], ofItemAtPath: folder.appendingPathComponent("nested/deep/run.sh").path)
        try Data("z".utf8).write(to: folder.appendingPathComponent("nested/z.txt"))
        try Data("a".utf8).write(to: folder.appendingPathComponent("a.txt"))
        try Data().write(to: folder.appendingPathComponent("b.txt"))
        try Data("space".utf8).write(to: folder.appendingPathComponent("space name.txt"))
        try Data("accent".utf8).write(to: folder.appendingPathComponent("é.txt"))
        try manager.createSymbolicLink(atPath: folder.appendingPathComponent("link").path, withDestinationPath: "nested/deep/data.bin")
        return folder
    }

    /// Temporary files PackWriter may have left beside its outputs.
    func leftovers() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: self.root.path).filter { $0.hasSuffix(".tmp") }
    }

    /// Runs a tool and returns its standard output.
    func capture(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.environment = ["LC_ALL": "C.UTF-8", "PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin", "TZ": "UTC"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }
}
