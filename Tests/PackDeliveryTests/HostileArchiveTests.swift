import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Archives that crashed, hung or installed nothing are refused with one line and exit 65,
/// by `packs fetch` and by `packs manifest`.
@Suite(.timeLimit(.minutes(5))) struct HostileArchiveTests {
    /// A folder with one pack (`pack.<ext>`) and a hand-written manifest for it (product `com.example.bad`).
    static func site(_ label: String, ext: String, unpackedLength: Int64? = nil, _ make: (URL) throws -> Void) throws -> URL {
        let folder = try Fixtures.temporaryDirectory(label)
        let pack = folder.appending(path: "pack.\(ext)")
        try make(pack)
        let length = try #require(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int)
        var content: [String: Any] = [
            "contentIdentifier": "com.example.bad", "contentVersion": "1.0", "url": "pack.\(ext)",
            "contentLength": length, "sha256": try Fixtures.sha256Hex(of: pack),
        ]
        if let unpackedLength { content["unpackedLength"] = unpackedLength }
        let manifest: [String: Any] = ["products": [["productIdentifier": "com.example.bad", "contents": [content]]]]
        try JSONSerialization.data(withJSONObject: manifest).write(to: folder.appending(path: "manifest.json"))
        return folder
    }

    static func python(_ script: String, _ arguments: [String]) throws {
        let result = try Fixtures.run("python3", ["-c", script] + arguments)
        guard result.status == 0 else { throw FixtureError("python3 failed: \(result.stderr)") }
    }

    /// A small valid pack (tar) for the product, as bytes.
    static func tarPack(_ url: URL) throws {
        let content = try Fixtures.temporaryDirectory("hostile-archive-content")
        try Data("level".utf8).write(to: content.appending(path: "level.txt"))
        try PackWriter.write(
            folder: content, to: url, format: .tar, contentInfo: (productIdentifier: "com.example.bad", contentVersion: "1.0"))
    }

    static func fetch(_ site: URL, _ label: String) throws -> CLI.Result {
        try CLI.run(
            home: try Fixtures.temporaryDirectory(label + "-home"),
            ["fetch", site.appending(path: "manifest.json").path, "com.example.bad"], timeout: 60)
    }

    static func manifest(_ folder: URL) throws -> CLI.Result {
        let result = try Fixtures.run(CLI.binary, ["manifest", folder.path], timeout: 60)
        return CLI.Result(status: result.status, stdout: result.stdout, stderr: result.stderr)
    }

    static func expectRefused(_ result: CLI.Result, saying text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 65, "exit 65: \(result.status) \(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.lowercased().contains(text.lowercased()), "says '\(text)': \(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.split(separator: "\n").count == 1, "one line: \(result.stderr)", sourceLocation: sourceLocation)
        #expect(!result.stderr.contains("packs resume"), "resuming cannot fix a bad pack: \(result.stderr)", sourceLocation: sourceLocation)
    }

    /// Item 14: libarchive is given one decompression filter, chosen from the magic bytes, so a gzip inside a gzip
    /// (the mechanism of a gzip quine, which libarchive unwrapped without end) is not unwrapped again.
    @Test func aGzipInsideAGzipIsNotUnwrappedAgain() throws {
        let site = try Self.site("gzip-in-gzip", ext: "tar.gz") { url in
            let tar = url.deletingLastPathComponent().appending(path: "inner.tar")
            try Self.tarPack(tar)
            try Self.python(
                "import gzip,sys; d=open(sys.argv[1],'rb').read(); [d:=gzip.compress(d) for _ in range(40)]; open(sys.argv[2],'wb').write(d)",
                [tar.path, url.path])
            try FileManager.default.removeItem(at: tar)
        }
        let started = Date()
        Self.expectRefused(try Self.fetch(site, "gzip-in-gzip"), saying: "not a readable archive")
        let manifest = try Self.manifest(site)
        #expect(manifest.status == 65, "packs manifest refuses it too: \(manifest.stderr)")
        #expect(Date().timeIntervalSince(started) < 30, "and neither hangs")
    }

    /// Item 14: a pax header of 64 MiB (libarchive would hold it in memory) is refused at once.
    @Test func anOversizedHeaderIsRefusedAtOnce() throws {
        // 64 MiB of zeros after a huge pax header: libarchive would read it all inside one call.
        let site = try Self.site("pax-bomb", ext: "tar.gz", unpackedLength: 1000) { url in
            try Self.python(
                """
                import gzip, io, sys, tarfile
                raw = io.BytesIO()
                with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    info = tarfile.TarInfo("ContentInfo.plist"); info.pax_headers = {"comment": "x" * (64 << 20)}
                    data = b"<plist/>"; info.size = len(data); tar.addfile(info, io.BytesIO(data))
                open(sys.argv[1], "wb").write(gzip.compress(raw.getvalue(), 9))
                """, [url.path])
        }
        let started = Date()
        Self.expectRefused(try Self.fetch(site, "pax-bomb"), saying: "header too large")
        #expect(Date().timeIntervalSince(started) < 30)
    }

    /// Item 15: `packs manifest` does not trap on names with no valid encoding or on an encrypted zip; `fetch` refuses both.
    @Test func namesWithoutAnEncodingAndEncryptedZipsNeverTrap() throws {
        let badNames = try Self.site("bad-names", ext: "zip") { url in
            try Self.python(
                """
                import sys, zipfile
                with zipfile.ZipFile(sys.argv[1], "w") as z:
                    info = zipfile.ZipInfo("QQQQQQ.txt"); info.flag_bits |= 0x800; z.writestr(info, b"x")
                    z.writestr("ContentInfo.plist", b"<plist/>")
                data = open(sys.argv[1], "rb").read().replace(b"QQQQQQ", b"\\xff\\xfe\\xc0\\xaf\\xed\\xa0")
                open(sys.argv[1], "wb").write(data)
                """, [url.path])
        }
        let manifest = try Self.manifest(badNames)
        #expect(manifest.status == 0 || manifest.status == 65, "no trap (exit 132): \(manifest.status) \(manifest.stderr)")
        let fetched = try Self.fetch(badNames, "bad-names")
        #expect(fetched.status == 65 && fetched.stderr.split(separator: "\n").count == 1, "\(fetched.status) \(fetched.stderr)")

        let encrypted = try Self.site("encrypted", ext: "zip") { url in
            let content = try Fixtures.temporaryDirectory("encrypted-content")
            try Data("<plist/>".utf8).write(to: content.appending(path: "ContentInfo.plist"))
            try Data("level".utf8).write(to: content.appending(path: "level.txt"))
            let result = try Fixtures.run("zip", ["-q", "-P", "secret", "-r", url.path, "."], currentDirectory: content)
            guard result.status == 0 else { throw FixtureError("zip failed: \(result.stderr)") }
        }
        let inspected = try Self.manifest(encrypted)
        #expect(
            inspected.status == 65 && inspected.stderr.contains("encrypted"),
            "no trap, and says why: \(inspected.status) \(inspected.stderr)")
        Self.expectRefused(try Self.fetch(encrypted, "encrypted"), saying: "encrypted packs are not supported")
    }

    /// Item 16: a "pack" of zeros (an empty tar to libarchive) installs nothing and says so.
    @Test(arguments: [Data(count: 1024), Data(count: 1024) + Data("trailing text\n".utf8)])
    func aPackWithNoEntryIsRefused(bytes: Data) throws {
        let site = try Self.site("zeros", ext: "tar") { url in try bytes.write(to: url) }
        Self.expectRefused(try Self.fetch(site, "zeros"), saying: "holds no files")
    }

    /// Item 17: an entry with an empty name is corruption, not "unsafe"; a limit names the way to raise it.
    @Test func corruptionIsCalledCorruptionAndLimitsNameTheirFlag() throws {
        let emptyName = try Self.site("empty-name", ext: "tar") { url in
            try Self.python(
                """
                import io, sys, tarfile
                with tarfile.open(sys.argv[1], "w", format=tarfile.USTAR_FORMAT) as tar:
                    info = tarfile.TarInfo("x"); info.size = 1; tar.addfile(info, io.BytesIO(b"x"))
                data = bytearray(open(sys.argv[1], "rb").read()); data[0] = 0
                header = data[:512]; header[148:156] = b" " * 8
                checksum = sum(header); data[148:156] = b"%06o\\0 " % checksum
                open(sys.argv[1], "wb").write(bytes(data))
                """, [url.path])
        }
        let corrupt = try Self.fetch(emptyName, "empty-name")
        #expect(corrupt.status == 65 && !corrupt.stderr.contains("unsafe"), "\(corrupt.stderr)")

        let big = try Self.site("ratio", ext: "tar.gz") { url in
            try Self.python(
                "import gzip,io,sys,tarfile\nraw=io.BytesIO()\nwith tarfile.open(fileobj=raw,mode='w') as t:\n i=tarfile.TarInfo('zeros.bin'); i.size=8<<20; t.addfile(i, io.BytesIO(bytes(8<<20)))\nopen(sys.argv[1],'wb').write(gzip.compress(raw.getvalue(),9))",
                [url.path])
        }
        let limited = try Self.fetch(big, "ratio")
        #expect(limited.status == 65 && limited.stderr.contains("--max-expansion-ratio"), "names the flag: \(limited.stderr)")
    }
}
