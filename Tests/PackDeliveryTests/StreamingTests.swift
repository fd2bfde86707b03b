import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A pack is unpacked while it downloads, into a staging folder of its own that is moved into
/// place only once the whole pack's SHA-256 matched. Real libcurl, libarchive and a throttled server (so the
/// unpack really overlaps the download); trees compared with `bsdtar -xf`.
@Suite(.serialized, .timeLimit(.minutes(3))) struct StreamingTests {
    /// A content folder of a few files (3 MiB of random bytes in all, so every compression keeps the size),
    /// nested folders and a relative symlink.
    static func content(_ label: String) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "levels/deep"), withIntermediateDirectories: true)
        try Fixtures.randomFile(at: contents.appending(path: "a.bin"), size: 2 << 20)
        try Fixtures.randomFile(at: contents.appending(path: "levels/deep/c.bin"), size: 1 << 20)
        try Data("hello\n".utf8).write(to: contents.appending(path: "levels/b.txt"))
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "levels/link").path, withDestinationPath: "b.txt")
        return content
    }

    /// A site serving `pack` (named `big.<format>`) with a manifest for com.example.big.
    static func site(_ label: String, content: URL, format: PackFormat) throws -> URL {
        let folder = try Fixtures.temporaryDirectory(label)
        try PackWriter.write(
            folder: content, to: folder.appending(path: "big.\(format.rawValue)"), format: format,
            contentInfo: (productIdentifier: "com.example.big", contentVersion: "1.0"))
        try ManifestBuilder.write(folder: folder)
        return folder
    }

    /// Runs one download through a queue, recording whether an update showed the unpack going on during the download.
    static func fetch(_ manifest: LoadedManifest, home: Home) async throws -> (download: Download, streamed: Bool) {
        let queue = try DownloadQueue(
            home: home, configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        let streamed = Mutex(false)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try #require(
            await waitFor(queue, id) { download in
                if download.phase == .downloading, download.phaseProgress > 0 { streamed.withLock { $0 = true } }
                return !download.state.isRunning
            }, "the download settles")
        return (download, streamed.withLock { $0 })
    }

    /// A manifest of com.example.big whose one pack is `pack` (made by hand, in the server's root), served with `fault`.
    static func manifest(of pack: URL, server: FaultServer, fault: Fault = .none) throws -> LoadedManifest {
        let size = try #require(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int)
        let manifest = Manifest(products: [
            Manifest.Product(
                productIdentifier: "com.example.big",
                contents: [
                    Manifest.Content(
                        contentIdentifier: "com.example.big", contentVersion: "1.0",
                        url: server.url(pack.lastPathComponent, fault: fault).absoluteString,
                        contentLength: Int64(size), sha256: try Fixtures.sha256Hex(of: pack))
                ])
        ])
        return try LoadedManifest(manifest: manifest, baseURL: server.baseURL)
    }

    /// Writes the zip `pack` with python's zipfile: `lines` run once `plist` (com.example.big's ContentInfo.plist) is defined.
    /// Serves `pack` from its folder and fetches it into a new home named `label`; the caller stops the server.
    static func serveAndFetch(_ pack: URL, home label: String, fault: Fault = .none) async throws -> (
        download: Download, server: FaultServer, home: URL
    ) {
        let server = try FaultServer(root: pack.deletingLastPathComponent())
        do {
            let home = try Fixtures.temporaryDirectory(label)
            let (download, _) = try await Self.fetch(try Self.manifest(of: pack, server: server, fault: fault), home: Home(folder: home))
            return (download, server, home)
        } catch {
            server.stop()
            throw error
        }
    }

    static func pythonZip(_ pack: URL, _ lines: [String]) throws {
        let script =
            [
                "import io, os, zipfile, sys",
                "plist = b'<?xml version=\"1.0\" encoding=\"UTF-8\"?><plist version=\"1.0\"><dict><key>ContentVersion</key><string>1.0</string><key>IAPProductIdentifier</key><string>com.example.big</string></dict></plist>'",
            ] + lines
        let made = try Fixtures.run("python3", ["-c", script.joined(separator: "\n"), pack.path])
        #expect(made.status == 0, "\(made.stderr)")
    }

    @Test(arguments: [PackFormat.tar, .tarGzip, .tarBzip2, .tarXz, .tarZstd, .zip])
    func eachFormatUnpacksWhileDownloadingToTheTreeBsdtarMakes(format: PackFormat) async throws {
        let label = "stream-\(format.rawValue)"
        let folder = try Self.site(label + "-site", content: try Self.content(label + "-content"), format: format)
        let server = try FaultServer(root: folder)
        defer { server.stop() }
        let pack = "big.\(format.rawValue)"
        // About a second for the 3 MiB pack: bzip2 gives its first bytes only once a whole block (900 KB) came, and the
        // unpack's progress must still be seen while the transfer runs on a loaded machine (at 6 MiB/s it was not, at times).
        let packURL = server.url(pack, fault: .slow(bytesPerSecond: 3 << 20))
        let manifest = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        var edited = manifest.manifest
        edited.products[0].contents[0].url = packURL.absoluteString
        let homeFolder = try Fixtures.temporaryDirectory(label + "-home")
        let (download, streamed) = try await Self.fetch(
            try LoadedManifest(manifest: edited, baseURL: manifest.baseURL), home: Home(folder: homeFolder))
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(streamed, "unpacked while downloading")

        let reference = try Fixtures.temporaryDirectory(label + "-bsdtar")
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", folder.appending(path: pack).path, "-C", reference.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        let installed = try #require(download.contentURL)
        #expect(try treeContents(installed) == (try treeContents(reference)), "the same files, byte for byte")
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: installed.appending(path: "Contents/levels/link").path) == "b.txt")
        #expect(
            server.bodyBytesSent(pack)
                == (try FileManager.default.attributesOfItem(atPath: folder.appending(path: pack).path)[.size] as? Int))
        #expect(leftovers(homeFolder) == [], "no staging or archive left")
    }

    @Test(arguments: ["big.tar.gz", "big.zip"])
    func aHostileEntryLateInTheStreamStopsTheDownloadAndInstallsNothing(name: String) async throws {
        let content = try Self.content("stream-hostile-content")
        let folder = try Fixtures.temporaryDirectory("stream-hostile-site")
        let pack = folder.appending(path: name)
        // 3 MiB of good files, then "../escaped", then 8 MiB more that should never be fetched.
        let script = """
            import io, os, sys, tarfile, zipfile
            src, out = sys.argv[1], sys.argv[2]
            data, tail = b"owned\\n", os.urandom(8 << 20)
            if out.endswith(".zip"):
                with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
                    for root, dirs, files in sorted(os.walk(src)):
                        for f in sorted(files):
                            path = os.path.join(root, f)
                            if not os.path.islink(path): z.write(path, os.path.relpath(path, src))
                    z.writestr("../escaped", data)
                    z.writestr("Contents/tail.bin", tail)
            else:
                with tarfile.open(out, "w:gz", compresslevel=1) as tar:
                    tar.add(src, arcname=".")
                    info = tarfile.TarInfo("../escaped"); info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                    info = tarfile.TarInfo("Contents/tail.bin"); info.size = len(tail)
                    tar.addfile(info, io.BytesIO(tail))
            """
        let made = try Fixtures.run("python3", ["-c", script, content.path, pack.path])
        #expect(made.status == 0, "\(made.stderr)")
        let size = try #require(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int)
        let (download, server, home) = try await Self.serveAndFetch(
            pack, home: "stream-hostile-home", fault: .slow(bytesPerSecond: 4 << 20))
        defer { server.stop() }
        #expect(download.state == .failed && download.error?.code == .unsafeEntry, "\(download.error?.description ?? "")")
        #expect(download.error?.subject?.contains("escaped") == true, "the entry is named: \(download.error?.description ?? "")")
        #expect(server.bodyBytesSent(name) < size - (4 << 20), "the download stopped early: \(server.bodyBytesSent(name)) of \(size)")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.big").path), "nothing installed")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/escaped").path))
        #expect(leftoversAfterCleanup(home) == [], "staging and archive discarded")
    }

    @Test func aChecksumMismatchOfAPackWhoseEntriesWereAllSafeInstallsNothing() async throws {
        let content = try Self.content("stream-mismatch-content")
        let folder = try Self.site("stream-mismatch-site", content: content, format: .tarGzip)
        let server = try FaultServer(root: folder)
        defer { server.stop() }
        let loaded = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        var manifest = loaded.manifest
        manifest.products[0].contents[0].url = server.url("big.tar.gz", fault: .slow(bytesPerSecond: 6 << 20)).absoluteString
        manifest.products[0].contents[0].sha256 = String(repeating: "0", count: 64)
        let home = try Fixtures.temporaryDirectory("stream-mismatch-home")
        let (download, streamed) = try await Self.fetch(
            try LoadedManifest(manifest: manifest, baseURL: loaded.baseURL), home: Home(folder: home))
        #expect(streamed, "the pack was unpacked while downloading")
        #expect(download.state == .failed && download.error?.code == .checksumMismatch, "\(download.error?.description ?? "")")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.big").path), "nothing installed")
        #expect(leftoversAfterCleanup(home) == [], "the unpacked staging was discarded")
    }

    @Test(arguments: [PackFormat.tarZstd, .zip])
    func killedMidStreamThenResumedTheResultIsByteExactAndNoByteIsFetchedTwice(format: PackFormat) throws {
        let content = try Self.content("stream-kill-content")
        try Fixtures.randomFile(at: content.appending(path: "Contents/more.bin"), size: 5 << 20)
        let folder = try Self.site("stream-kill-site", content: content, format: format)
        let server = try FaultServer(root: folder)
        defer { server.stop() }
        let packURL = server.url("big.\(format.rawValue)", fault: .slow(bytesPerSecond: 3 << 20))
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: folder.appending(path: "manifest.json")))
        manifest.products[0].contents[0].url = packURL.absoluteString
        try JSONEncoder().encode(manifest).write(to: folder.appending(path: "manifest.json"))
        let home = try Fixtures.temporaryDirectory("stream-kill-home")
        let killed = try runAndKill(home: home, ["fetch", server.url("manifest.json").absoluteString, "com.example.big"]) { event in
            event["phase"] as? String == "downloading" && (event["phaseProgress"] as? Double ?? 0) > 0.2
        }
        #expect(killed, "killed while unpacking during the download")
        let partial = try #require(
            try FileManager.default.contentsOfDirectory(atPath: home.appending(path: "Caches/.packdelivery/downloads").path).first)
        let kept = try #require(
            try FileManager.default.attributesOfItem(atPath: home.appending(path: "Caches/.packdelivery/downloads/\(partial)").path)[.size]
                as? Int)
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "\(resume.stderr)")
        let requests = server.requests().filter { $0.file == "big.\(format.rawValue)" }
        #expect(requests.count == 2 && requests.last?.range == "bytes=\(kept)-", "resumed from the \(kept) bytes kept: \(requests)")
        let installed = home.appending(path: "Caches/com.example.big")
        #expect(
            try treeContents(installed.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))), "byte-exact"
        )
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: installed.appending(path: "Contents/levels/link").path) == "b.txt")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// libarchive (bsdtar) reads a zip's file names from its local headers, `unzip` from its central directory:
    /// a zip whose two disagree is refused before anything is unpacked.
    @Test func aZipWhoseCentralDirectoryDisagreesWithItsLocalHeadersIsRefused() async throws {
        let folder = try Fixtures.temporaryDirectory("zipdirs-site")
        let pack = folder.appending(path: "big.zip")
        try Self.pythonZip(
            pack,
            [
                "raw = io.BytesIO()",
                "with zipfile.ZipFile(raw, 'w', zipfile.ZIP_DEFLATED) as z:",
                "    z.writestr('ContentInfo.plist', plist)",
                "    z.writestr('Contents/a.txt', b'hello')",
                "    z.writestr('Contents/big.bin', os.urandom(1 << 20))",
                "data = bytearray(raw.getvalue())",
                "i = data.find(b'Contents/a.txt')",
                "data[i:i + 14] = b'Contents/b.txt'",
                "open(sys.argv[1], 'wb').write(data)",
            ])
        let listed = try Fixtures.run("bsdtar", ["-tf", pack.path])
        #expect(listed.stdout.contains("Contents/b.txt"), "libarchive follows the local header: \(listed.stdout)")
        let (download, server, home) = try await Self.serveAndFetch(pack, home: "zipdirs-home")
        defer { server.stop() }
        #expect(download.state == .failed && download.error?.code == .unsafeEntry, "\(download.error?.description ?? "")")
        #expect(
            download.error?.subject == "Contents/a.txt" && download.error?.message.contains("Contents/b.txt") == true,
            "\(download.error?.description ?? "")")
        #expect(!FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.big").path), "nothing installed")
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// A zip read while it downloads is read by its local headers; one whose local headers hold an entry that its
    /// central directory does not list installs what an unpack by the central directory gives (`bsdtar -xf`).
    @Test func aZipEntryHiddenFromTheCentralDirectoryIsNotInstalled() async throws {
        let folder = try Fixtures.temporaryDirectory("zip-hidden-site")
        let pack = folder.appending(path: "big.zip")
        try Self.pythonZip(
            pack,
            [
                "z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED)",
                "z.writestr('ContentInfo.plist', plist)",
                "z.writestr('Contents/big.bin', os.urandom(2 << 20))",
                "z.writestr('Contents/hidden.txt', b'not listed')",
                "z.writestr('Contents/a.txt', b'hello')",
                "z.filelist = [i for i in z.filelist if i.filename != 'Contents/hidden.txt']",
                "z.close()",
            ])
        let (download, server, home) = try await Self.serveAndFetch(pack, home: "zip-hidden-home", fault: .slow(bytesPerSecond: 4 << 20))
        defer { server.stop() }
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        let reference = try Fixtures.temporaryDirectory("zip-hidden-bsdtar")
        #expect(try Fixtures.run("bsdtar", ["-xf", pack.path, "-C", reference.path]).status == 0)
        let installed = try #require(download.contentURL)
        #expect(try treeContents(installed) == (try treeContents(reference)), "the same files, byte for byte")
        #expect(
            !FileManager.default.fileExists(atPath: installed.appending(path: "Contents/hidden.txt").path),
            "the hidden entry is not installed")
        #expect(leftoversAfterCleanup(home) == [])
    }
}
