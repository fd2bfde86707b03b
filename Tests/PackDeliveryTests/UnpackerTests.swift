import CArchive
import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// Hostile and ordinary archives are built by real tools (python3's tarfile/zipfile, bsdtar, zip) in a
// fresh temporary folder per test; every rejection checks the error a user sees and that nothing
// changed outside the staging folder.

@Suite("Unpacker", .timeLimit(.minutes(5)))
struct UnpackerTests {
    // MARK: Path escapes

    @Test("'../evil' is rejected and nothing is written outside staging")
    func dotDotEscape() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"f("../evil", b"pwned")"#)
        try fixture.expectRejected(pack, naming: "../evil", because: "'..'")
    }

    @Test("'a/../../evil' is rejected")
    func nestedDotDotEscape() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"f("ok.txt"); f("a/../../evil", b"pwned")"#)
        try fixture.expectRejected(pack, naming: "a/../../evil", because: "'..'")
    }

    @Test("An absolute path, also behind './', is rejected")
    func absolutePath() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let target = fixture.absoluteTarget + "/evil"
        for name in [target, "./" + target, "././/" + String(target.dropFirst())] {
            let pack = try fixture.tar(#"f(sys.argv[2], b"pwned")"#, arguments: [name])
            try fixture.expectRejected(pack, naming: name, because: "absolute")
        }
    }

    @Test("A zip entry named '../evil' is rejected")
    func zipDotDot() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.zip(#"z.writestr("fine.txt", b"ok"); z.writestr("../evil", b"pwned")"#)
        try fixture.expectRejected(pack, naming: "../evil", because: "'..'")
    }

    // MARK: Symlinks

    @Test("A symlink with an absolute target is rejected")
    func absoluteSymlink() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"l("link", sys.argv[2])"#, arguments: [fixture.absoluteTarget])
        try fixture.expectRejected(pack, naming: "link", because: "absolute")
    }

    @Test("A symlink that escapes through '..' is rejected")
    func escapingSymlink() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"d("sub"); l("sub/link", "../../canary.txt")"#)
        try fixture.expectRejected(pack, naming: "sub/link", because: "outside")
    }

    @Test("A zip symlink with an absolute target is rejected")
    func zipAbsoluteSymlink() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.zip(#"zl("link", sys.argv[2])"#, arguments: [fixture.absoluteTarget])
        try fixture.expectRejected(pack, naming: "link", because: "absolute")
    }

    @Test("Relative symlinks that stay inside are kept and resolve")
    func insideSymlinksKept() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(
            #"""
            f("sub/data.txt", b"hello"); l("link", "sub/data.txt"); l("sub/self", "../sub/data.txt")
            l("dirlink", "sub"); l("sub/root", "..")
            """#)
        let summary = try fixture.unpack(pack)
        #expect(summary.entries == 5)
        let staging = fixture.staging.path
        #expect(try String(contentsOfFile: staging + "/link", encoding: .utf8) == "hello")
        #expect(try String(contentsOfFile: staging + "/sub/self", encoding: .utf8) == "hello")
        #expect(try String(contentsOfFile: staging + "/dirlink/data.txt", encoding: .utf8) == "hello")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: staging + "/sub/root") == "..")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: staging + "/link") == "sub/data.txt")
    }

    @Test("A symlink whose target passes through another symlink is rejected, in either order")
    func symlinkThroughSymlink() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        // "s -> ." is inside and "s2 -> s/.." looks inside lexically, but the kernel would resolve
        // s2 to the staging folder's parent.
        let forward = try fixture.tar(#"l("s", "."); l("s2", "s/..")"#)
        try fixture.expectRejected(forward, naming: "s2", because: "symlink 's'")
        let backward = try fixture.tar(#"l("s2", "s/.."); l("s", ".")"#, name: "backward.tar")
        try fixture.expectRejected(backward, naming: "s", because: "passes through")
    }

    @Test("Writing through a symlink is rejected: to '..', to an absolute folder, and to a folder inside")
    func writeThroughSymlink() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        try FileManager.default.createDirectory(atPath: fixture.absoluteTarget, withIntermediateDirectories: true)
        let cases: [(body: String, arguments: [String], entry: String, why: String)] = [
            (#"l("d", ".."); f("d/evil", b"pwned")"#, [], "d", "outside"),  // the symlink itself is refused
            (#"l("d", sys.argv[2]); f("d/evil", b"pwned")"#, [fixture.absoluteTarget], "d", "absolute"),
            (#"d("sub"); l("d", "sub"); f("d/f", b"x")"#, [], "d/f", "written through the symlink 'd'"),
            (#"f("sub/x"); l("d", "sub"); d("d/inner")"#, [], "d/inner/", "written through the symlink 'd'"),
            (#"f("target.txt", b"keep"); l("d", "target.txt"); f("d", b"overwrite")"#, [], "d", "symlink"),
        ]
        for (index, test) in cases.enumerated() {
            let pack = try fixture.tar(test.body, arguments: test.arguments, name: "case\(index).tar")
            try fixture.expectRejected(pack, naming: test.entry, because: test.why)
            #expect(try FileManager.default.contentsOfDirectory(atPath: fixture.absoluteTarget).isEmpty)
        }
        #expect(try String(contentsOfFile: fixture.stagingParent.path + "/canary.txt", encoding: .utf8) == "canary")
    }

    // MARK: Hard links

    @Test("Hard links outside staging or to files not extracted earlier are rejected")
    func badHardLinks() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let cases: [(String, String, String)] = [
            (#"h("x", "../canary.txt")"#, "x", "outside"),
            (#"h("x", "/etc/passwd")"#, "x", "outside"),
            (#"h("x", "nothere")"#, "x", "not a file extracted earlier"),
            (#"h("x", "later"); f("later")"#, "x", "not a file extracted earlier"),
            (#"d("dir"); h("x", "dir")"#, "x", "not a file extracted earlier"),
        ]
        for (index, (body, naming, why)) in cases.enumerated() {
            let pack = try fixture.tar(body, name: "case\(index).tar")
            try fixture.expectRejected(pack, naming: naming, because: why)
        }
    }

    @Test("A hard link to a file extracted earlier is kept")
    func insideHardLinkKept() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"f("dir/a.txt", b"shared"); h("b.txt", "dir/a.txt")"#)
        let summary = try fixture.unpack(pack)
        #expect(summary.bytes == 6 && summary.entries == 2)
        // Both names are recorded with the content's SHA-256 (of "shared"), computed while unpacking.
        #expect(summary.files.map(\.path) == ["b.txt", "dir/a.txt"])
        #expect(Set(summary.files.map(\.sha256)).count == 1 && summary.files.allSatisfy { $0.size == 6 && $0.kind == .file })
        #expect(summary.files[0].sha256 == (try Fixtures.sha256Hex(of: fixture.staging.appending(path: "dir/a.txt"))))
        let a = try unpackStat(fixture.staging.path + "/dir/a.txt")
        let b = try unpackStat(fixture.staging.path + "/b.txt")
        #expect(a.st_ino == b.st_ino)
        #expect(b.st_nlink == 2)
        #expect(try String(contentsOfFile: fixture.staging.path + "/b.txt", encoding: .utf8) == "shared")
    }

    // MARK: Special files and type changes

    @Test("Character and block devices, FIFOs are rejected")
    func specialFiles() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let cases: [(String, String)] = [
            (#"special("null", tarfile.CHRTYPE)"#, "character device"),
            (#"special("disk", tarfile.BLKTYPE)"#, "block device"),
            (#"special("pipe", tarfile.FIFOTYPE)"#, "FIFO"),
        ]
        for (index, (body, why)) in cases.enumerated() {
            let pack = try fixture.tar(body, name: "case\(index).tar")
            let naming = ["null", "disk", "pipe"][index]
            try fixture.expectRejected(pack, naming: naming, because: why)
        }
    }

    @Test("An entry that changes the type of an earlier one, or duplicates a file, is rejected")
    func typeChanges() throws {
        // Errors name entries as the archive spells them: tarfile writes folders as "x/".
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let cases: [(String, String, String)] = [
            (#"d("x"); l("x", "y")"#, "x", "earlier folder"),
            (#"d("x"); f("x")"#, "x", "earlier folder"),
            (#"f("x/inner"); f("x")"#, "x", "earlier folder"),
            (#"f("x"); d("x")"#, "x/", "earlier file into a folder"),
            (#"f("x"); f("x/inner")"#, "x/inner", "is a file"),
            (#"l("x", "y"); d("x")"#, "x/", "earlier symlink"),
            (#"f("x", b"one"); f("x", b"two")"#, "x", "duplicates"),
            (#"f("x"); l("x", "y")"#, "x", "duplicates"),
            (#"f("x"); f("y"); h("x", "y")"#, "x", "duplicates"),
            (#"l("x", "y"); f("x")"#, "x", "symlink"),
        ]
        for (index, (body, naming, why)) in cases.enumerated() {
            let pack = try fixture.tar(body, name: "case\(index).tar")
            try fixture.expectRejected(pack, naming: naming, because: why)
        }
    }

    @Test("A repeated folder entry and './' entries are accepted")
    func repeatedFolders() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"d("."); d("./"); f("./a//b/c.txt", b"c"); d("a"); d("a/b/")"#)
        let summary = try fixture.unpack(pack)
        #expect(summary.bytes == 1 && summary.entries == 5)
        #expect(summary.directories == ["", "a", "a/b"] && summary.files.map(\.path) == ["a/b/c.txt"])
        #expect(try String(contentsOfFile: fixture.staging.path + "/a/b/c.txt", encoding: .utf8) == "c")
    }

    // MARK: Names

    @Test("A name component over 255 bytes is rejected with a clear error")
    func longComponent() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let name = "dir/" + String(repeating: "n", count: 300)
        let pack = try fixture.tar(#"f(sys.argv[2])"#, arguments: [name])
        try fixture.expectRejected(pack, naming: name, because: "NAME_MAX")
    }

    @Test("A path over PATH_MAX is rejected with a clear error")
    func longPath() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let name = Array(repeating: String(repeating: "p", count: 250), count: 17).joined(separator: "/")
        let pack = try fixture.tar(#"f(sys.argv[2])"#, arguments: [name])
        try fixture.expectRejected(pack, naming: name, because: "PATH_MAX")
    }

    @Test("UTF-8 names in pax and zip headers are extracted as UTF-8")
    func utf8Names() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        for (index, pack) in [
            try fixture.tar(#"f("é/ü.txt", b"hi")"#),
            try fixture.zip(#"z.writestr("é/ü.txt", b"hi")"#),
        ].enumerated() {
            let staging = try fixture.freshStaging("utf8-\(index)")
            _ = try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 20))
            #expect(try String(contentsOfFile: staging.path + "/é/ü.txt", encoding: .utf8) == "hi")
        }
    }

    // MARK: Corrupt input

    @Test("A truncated tar.gz, tar and zip are rejected")
    func truncated() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 600_000)
        for (index, arguments) in [["-czf"], ["-cf"], ["--format", "zip", "-cf"]].enumerated() {
            let pack = fixture.packs.appendingPathComponent("pack\(index)")
            try unpackRunTool(["bsdtar"] + arguments + [pack.path, "-C", source.path, "."])
            let data = try Data(contentsOf: pack)
            try data.prefix(data.count / 2).write(to: pack)
            let staging = try fixture.freshStaging("trunc\(index)")
            do {
                _ = try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
                Issue.record("a truncated archive (\(arguments)) was accepted")
            } catch {
                #expect(error.kind == .badData, "\(arguments): \(error)")
            }
        }
    }

    @Test("A zip entry whose CRC does not match is rejected")
    func badCRC() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.zip(#"z.writestr(zipfile.ZipInfo("a.txt"), b"hello world hello world")"#)
        var data = try Data(contentsOf: pack)
        let range = try #require(data.range(of: Data("hello world".utf8)))
        data[range.lowerBound] = UInt8(ascii: "j")
        try data.write(to: pack)
        try fixture.expectRejected(pack, naming: "a.txt", because: "CRC")
    }

    @Test("A text file and an empty file are not archives")
    func notArchives() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let text = fixture.packs.appendingPathComponent("readme.txt")
        try Data(String(repeating: "This is not an archive.\n", count: 100).utf8).write(to: text)
        let empty = fixture.packs.appendingPathComponent("empty.zip")
        try Data().write(to: empty)
        let gzippedText = fixture.packs.appendingPathComponent("text.gz")
        try unpackRunTool([
            "python3", "-c", "import gzip,sys; open(sys.argv[1],'wb').write(gzip.compress(b'plain text\\n'*50))", gzippedText.path,
        ])
        for file in [text, empty, gzippedText] {
            let staging = try fixture.freshStaging(file.lastPathComponent)
            do {
                _ = try Unpacker.unpack(archive: file, into: staging, limits: UnpackLimits(maxBytes: 1 << 20))
                Issue.record("\(file.lastPathComponent) was accepted as an archive")
            } catch {
                #expect(error.kind == .badData)
                #expect(error.message.contains("not a readable archive"), "\(error.message)")
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: staging.path).isEmpty)
        }
    }

    @Test("A missing pack is an I/O error and a non-empty staging folder is refused")
    func badArguments() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        do {
            _ = try fixture.unpack(fixture.packs.appendingPathComponent("missing.tar"))
            Issue.record("a missing pack was accepted")
        } catch {
            #expect(error.code == .fileSystem)
            #expect(error.underlying == .init(.errno, Int(ENOENT)))
        }
        let pack = try fixture.tar(#"f("a")"#)
        try Data("x".utf8).write(to: fixture.staging.appendingPathComponent("already-here"))
        do {
            _ = try fixture.unpack(pack)
            Issue.record("a non-empty staging folder was accepted")
        } catch {
            #expect(error.kind == .usage)
        }
    }

    // MARK: Modes

    @Test("setuid, setgid, sticky and group/other write bits are stripped; owner access is ensured")
    func modesStripped() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(
            #"""
            f("suid", b"x", 0o4777); f("sgid", b"x", 0o2666); f("ro", b"x", 0o444); f("exec", b"x", 0o750)
            d("sticky", 0o1777); d("locked", 0o555); f("implicit/file", b"x", 0o600)
            """#)
        _ = try fixture.unpack(pack)
        let expected: [String: mode_t] = [
            "suid": 0o755, "sgid": 0o644, "ro": 0o644, "exec": 0o750, "sticky": 0o755, "locked": 0o755,
            "implicit": 0o755, "implicit/file": 0o600,
        ]
        for (name, mode) in expected {
            let info = try unpackStat(fixture.staging.path + "/" + name)
            #expect(info.st_mode & 0o7777 == mode, "\(name): \(String(info.st_mode & 0o7777, radix: 8))")
        }
    }

    @Test("File modification times come from the headers")
    func modificationTimes() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"f("old.txt", b"x", 0o644, 1_000_000_000)"#)
        _ = try fixture.unpack(pack)
        #expect(try unpackStat(fixture.staging.path + "/old.txt").st_mtim.tv_sec == 1_000_000_000)
    }

    // MARK: Limits

    @Test("A decompression bomb stops at the byte limit")
    func decompressionBomb() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = fixture.packs.appendingPathComponent("bomb.tar.gz")
        try unpackRunTool([
            "python3", "-c",
            """
            import io, sys, tarfile
            with tarfile.open(sys.argv[1], "w:gz", compresslevel=1) as t:
                info = tarfile.TarInfo("zeros.bin"); info.size = 50 << 20
                t.addfile(info, io.BytesIO(bytes(info.size)))
            """, pack.path,
        ])
        let limit: Int64 = 10 << 20
        do {
            _ = try fixture.unpack(pack, limits: UnpackLimits(maxBytes: limit))
            Issue.record("the bomb was accepted")
        } catch {
            #expect(error.kind == .badData)
            #expect(error.subject == "zeros.bin")
            #expect(error.message.contains("bytes"))
        }
        let written = try unpackStat(fixture.staging.path + "/zeros.bin").st_size
        #expect(written <= limit + (1 << 20), "wrote \(written) bytes past a \(limit) byte limit")
        try fixture.expectOutsideUnchanged()
    }

    @Test("Holes of sparse files count toward the byte limit and are restored")
    func sparseFiles() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = fixture.sources.appendingPathComponent("sparse")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        try unpackRunTool(["truncate", "-s", "1G", source.appendingPathComponent("huge").path])
        let small = source.appendingPathComponent("small")
        try unpackRunTool(["truncate", "-s", "4M", small.path])
        try unpackRunTool([
            "python3", "-c", "import sys; f=open(sys.argv[1],'r+b'); f.seek(1<<20); f.write(b'middle'); f.close()", small.path,
        ])

        let smallPack = fixture.packs.appendingPathComponent("small.tar")
        try unpackRunTool(["tar", "--sparse", "-cf", smallPack.path, "-C", source.path, "small"])
        let summary = try fixture.unpack(smallPack)
        #expect(summary.bytes == 4 << 20)
        let restored = try Data(contentsOf: fixture.staging.appendingPathComponent("small"))
        #expect(restored == (try Data(contentsOf: small)))

        let hugePack = fixture.packs.appendingPathComponent("huge.tar")
        try unpackRunTool(["tar", "--sparse", "-cf", hugePack.path, "-C", source.path, "huge"])
        let staging = try fixture.freshStaging("huge")
        do {
            _ = try Unpacker.unpack(archive: hugePack, into: staging, limits: UnpackLimits(maxBytes: 10 << 20))
            Issue.record("a 1 GiB sparse file passed a 10 MiB limit")
        } catch {
            #expect(error.kind == .badData)
            #expect(error.subject == "huge")
        }
    }

    @Test("An entry-count bomb stops at the entry limit")
    func entryBomb() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let pack = try fixture.tar(#"[f("many/%d" % i, b"") for i in range(2000)]"#)
        do {
            _ = try fixture.unpack(pack, limits: UnpackLimits(maxBytes: 1 << 20, maxEntries: 1000))
            Issue.record("2000 entries passed a limit of 1000")
        } catch {
            #expect(error.kind == .badData)
            #expect(error.subject == "many/1000")
            #expect(error.message.contains("entries"))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: fixture.staging.path + "/many").count == 1000)
    }

    @Test("Progress is reported about every MiB, and cancellation stops the unpack")
    func progressAndCancellation() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 3 << 20)
        let pack = fixture.packs.appendingPathComponent("p.tar")
        try unpackRunTool(["bsdtar", "-cf", pack.path, "-C", source.path, "."])
        var reports: [Int64] = []
        let summary = try fixture.unpack(pack, progress: { reports.append($0) })
        #expect(reports.count >= 3)
        #expect(reports == reports.sorted())
        #expect(reports.last == summary.bytes)

        var polls = 0
        let staging = try fixture.freshStaging("cancel")
        do {
            _ = try Unpacker.unpack(
                archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30),
                isCancelled: {
                    polls += 1
                    return polls > 3
                })
            Issue.record("the unpack was not cancelled")
        } catch {
            #expect(error.kind == .cancelled)
        }
    }

    @Test("A full filesystem is reported as insufficient storage", .enabled(if: getuid() == 0))
    func fullFilesystem() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let mountPoint = fixture.sources.appendingPathComponent("small-fs")
        try FileManager.default.createDirectory(at: mountPoint, withIntermediateDirectories: true)
        guard (try? unpackRunTool(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mountPoint.path])) != nil else {
            return  // no mount permission here (a container without CAP_SYS_ADMIN)
        }
        defer { try? unpackRunTool(["umount", mountPoint.path]) }
        let pack = fixture.packs.appendingPathComponent("big.tar")
        try unpackRunTool([
            "python3", "-c",
            """
            import io, os, sys, tarfile
            with tarfile.open(sys.argv[1], "w") as t:
                info = tarfile.TarInfo("big.bin"); info.size = 3 << 20
                t.addfile(info, io.BytesIO(os.urandom(info.size)))
            """, pack.path,
        ])
        let staging = mountPoint.appendingPathComponent("staging")
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
        do {
            _ = try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
            Issue.record("3 MiB fit into a 1 MiB filesystem")
        } catch {
            #expect(error.code == .insufficientStorage)
            #expect(error.underlying == .init(.errno, Int(ENOSPC)))
            #expect(error.subject == staging.path)
        }
    }

    // MARK: Formats

    // MARK: Zips unpacked while downloading

    @Test("A zip read by its local headers and finished by its central directory is the tree of the whole zip's unpack")
    func streamedZipAdopted() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 3 << 20)
        try FileManager.default.createDirectory(at: source.appendingPathComponent("private"), withIntermediateDirectories: true)
        try Data("secret".utf8).write(to: source.appendingPathComponent("private/key"))
        try FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: source.appendingPathComponent("private").path)
        let pack = fixture.packs.appendingPathComponent("tree.zip")
        let zipped = try Fixtures.run("sh", ["-c", "cd \"$1\" && zip -qry \"$2\" .", "sh", source.path, pack.path])
        #expect(zipped.status == 0, "\(zipped.stderr)")
        let limits = UnpackLimits(maxBytes: 1 << 30)

        // As the download's unpack reads it: from the start, by its local headers.
        let (streamedFolder, streamed) = try fixture.streamedUnpack(pack, limits: limits)
        #expect(streamed.zipEntries?.isEmpty == false)
        // The local headers alone cannot tell the symlink or the modes: that is why the central directory has the last word.
        #expect(streamed.files.first { $0.path == "link" }?.kind == .file)

        let (adopted, summary) = try fixture.adopt(pack, (streamedFolder, streamed), limits: limits)
        let whole = try fixture.freshStaging("whole")
        let reference = try Unpacker.unpack(archive: pack, into: whole, limits: limits)

        #expect(try modesAndContents(adopted) == (try modesAndContents(whole)), "types, modes and bytes as the whole zip's unpack")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: adopted.path + "/link") == "nested/deeper/data.bin")
        #expect(try modesAndContents(adopted)["nested/deeper/tool.sh"]?.hasPrefix("file 755") == true)
        #expect(try modesAndContents(adopted)["private"] == "dir 700")
        #expect(summary.files == reference.files, "the same sizes and SHA-256s are recorded")
        #expect(summary.directories == reference.directories && summary.entries == reference.entries && summary.bytes == reference.bytes)
        // Files were moved, not unpacked again: only the symlink's stand-in is left behind.
        let left = try FileManager.default.subpathsOfDirectory(atPath: streamedFolder.path).filter { path in
            (try? FileManager.default.attributesOfItem(atPath: streamedFolder.path + "/" + path)[.type] as? FileAttributeType)
                == .typeRegular
        }
        #expect(left == ["link"], "\(left)")
    }

    @Test("A zip whose local headers hold an entry its central directory does not list is not adopted")
    func streamedZipWithHiddenEntryNotAdopted() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        // python's zipfile writes the central directory from `filelist` at close: the hidden entry keeps its local header only.
        let pack = try fixture.zip(
            #"""
            z.writestr("a.txt", b"a"); z.writestr("hidden.txt", b"not listed"); z.writestr("b.txt", b"b")
            z.filelist = [i for i in z.filelist if i.filename != "hidden.txt"]
            """#)
        let limits = UnpackLimits(maxBytes: 1 << 20)
        let (streamedFolder, streamed) = try fixture.streamedUnpack(pack, limits: limits)
        #expect(streamed.files.map(\.path) == ["a.txt", "b.txt", "hidden.txt"])
        #expect(throws: PackDeliveryError.self) { try fixture.adopt(pack, (streamedFolder, streamed), limits: limits) }
        let whole = try fixture.freshStaging("whole")
        #expect(try Unpacker.unpack(archive: pack, into: whole, limits: limits).files.map(\.path) == ["a.txt", "b.txt"])
    }

    @Test("A zip whose central directory has another CRC-32 than the data descriptor is not adopted, and a whole unpack refuses it")
    func streamedZipWithOtherDirectoryCRCNotAdopted() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        // Written to a stream that cannot seek, python puts each CRC in a data descriptor; the directory's first one is then changed.
        let pack = fixture.packs.appendingPathComponent("crc.zip")
        let script = """
            import io, struct, sys, zipfile
            class Stream(io.RawIOBase):
                def __init__(self): self.data = bytearray()
                def writable(self): return True
                def write(self, b): self.data += b; return len(b)
            out = Stream()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("a.txt", b"hello " * 100); z.writestr("b.txt", b"world " * 100)
            raw = out.data
            directory = raw.index(b"PK\\x01\\x02")
            assert struct.unpack_from("<H", raw, directory + 8)[0] & 8, "a data descriptor"
            struct.pack_into("<I", raw, directory + 16, struct.unpack_from("<I", raw, directory + 16)[0] ^ 1)
            open(sys.argv[1], "wb").write(raw)
            """
        try unpackRunTool(["python3", "-c", script, pack.path])
        let limits = UnpackLimits(maxBytes: 1 << 20)
        let listing = try #require(try ZipDirectories.listing(pack))
        #expect(listing.entries.map { $0.localCRC == $0.crc } == [false, true], "the descriptors' CRCs are found")
        let (streamedFolder, streamed) = try fixture.streamedUnpack(pack, limits: limits)
        #expect(streamed.files.map(\.path) == ["a.txt", "b.txt"], "the stream checks the descriptor's CRC only")
        #expect(throws: PackDeliveryError.self, "not adopted") { try fixture.adopt(pack, (streamedFolder, streamed), limits: limits) }
        #expect(throws: PackDeliveryError.self, "the whole unpack (what the installer falls back to) refuses it") {
            try Unpacker.unpack(archive: pack, into: try fixture.freshStaging("whole"), limits: limits)
        }
    }

    @Test(
        "Zips written by bsdtar, Info-ZIP and python, to files and to pipes, stored, deflated and ZIP64, are adopted: every CRC-32 is found"
    )
    func zipsOfCommonWritersAreAdopted() throws {
        let pythonPipe =
            "python3 -c 'import io,os,sys,zipfile\nif os.environ.get(\"ZIP64\"): zipfile.ZIP64_LIMIT = 100\nclass S(io.RawIOBase):\n  def writable(self): return True\n  def write(self, b): sys.stdout.buffer.write(b); return len(b)\nwith zipfile.ZipFile(S(), \"w\", zipfile.ZIP_DEFLATED) as z:\n  for f in (\"dir/big.txt\", \"mixed.bin\", \"empty\"): z.write(f)' > \"$1\""
        let writers = [
            // A pipe leaves the writer no way back to the local header: the CRC goes into a data descriptor.
            "bsdtar": "bsdtar --format zip -cf - . | cat > \"$1\"",
            "bsdtar-stored": "bsdtar --format zip --options zip:compression=store -cf \"$1\" .",
            "zip": "zip -qr \"$1\" .",
            "zip-pipe": "zip -qr - . | cat > \"$1\"",
            "python-pipe": pythonPipe,
            // ZIP64_LIMIT lowered: sizes and offsets over 100 bytes are saturated, their values in ZIP64 extra fields.
            "python-pipe-zip64": "ZIP64=1 " + pythonPipe,
        ]
        let limits = UnpackLimits(maxBytes: 1 << 20)
        for (name, command) in writers.sorted(by: { $0.key < $1.key }) {
            let fixture = try UnpackFixture()
            defer { fixture.remove() }
            let tree = fixture.sources.appendingPathComponent("tree")
            try FileManager.default.createDirectory(at: tree.appendingPathComponent("dir"), withIntermediateDirectories: true)
            try Data(repeating: 0x61, count: 300_000).write(to: tree.appendingPathComponent("dir/big.txt"))
            try Data((0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 7919 >> 3) }).write(to: tree.appendingPathComponent("mixed.bin"))
            try Data().write(to: tree.appendingPathComponent("empty"))
            let pack = fixture.packs.appendingPathComponent("\(name).zip")
            try unpackRunTool(["sh", "-c", "cd \"$2\" && " + command, "sh", pack.path, tree.path])
            let listing = try #require(try ZipDirectories.listing(pack), "\(name): the central directory can be followed")
            #expect(listing.entries.allSatisfy { $0.localCRC == $0.crc }, "\(name): \(listing.entries.map { ($0.crc, $0.localCRC) })")
            let adopted = try fixture.adopt(pack, try fixture.streamedUnpack(pack, limits: limits), limits: limits)
            let whole = try Unpacker.unpack(archive: pack, into: try fixture.freshStaging("whole"), limits: limits)
            #expect(adopted.summary.files == whole.files, "\(name): adopted as the whole unpack would install it")
        }
    }

    @Test("A zip whose stream stops at a fake central directory, before the entry the real one points at, is not adopted")
    func streamedZipStoppedEarlyNotAdopted() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        // [local header "a", data A]["PK\1\2" and junk][local header "a", data B][central directory → the second "a"].
        let pack = fixture.packs.appendingPathComponent("decoy.zip")
        let script = """
            import io, sys, zipfile
            first = io.BytesIO()
            with zipfile.ZipFile(first, "w") as z: z.writestr("a", b"A" * 1000)
            raw = first.getvalue()
            prefix = raw[:raw.index(b"PK\\x01\\x02")] + b"PK\\x01\\x02" + b"\\0" * 60
            open(sys.argv[1], "wb").write(prefix)
            with zipfile.ZipFile(sys.argv[1], "a") as z: z.writestr("a", b"B" * 1000)
            """
        try unpackRunTool(["python3", "-c", script, pack.path])
        let limits = UnpackLimits(maxBytes: 1 << 20)
        let whole = try fixture.freshStaging("whole")
        _ = try Unpacker.unpack(archive: pack, into: whole, limits: limits)
        #expect(
            try String(contentsOfFile: whole.path + "/a", encoding: .utf8) == String(repeating: "B", count: 1000),
            "an unpack by the central directory gives B")
        let (streamedFolder, streamed) = try fixture.streamedUnpack(pack, limits: limits)
        #expect(streamed.files.map(\.path) == ["a"], "the stream read the decoy only")
        #expect(throws: PackDeliveryError.self, "the decoy's bytes are never adopted") {
            try fixture.adopt(pack, (streamedFolder, streamed), limits: limits)
        }
    }

    @Test("zip, tar, tar.gz, tar.bz2, tar.xz and tar.zst unpack to identical bytes")
    func allFormats() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 200_000)
        let expected = try unpackTreeListing(source)
        let commands: [(String, [String])] = [
            ("p.zip", ["bsdtar", "--format", "zip", "-cf"]),
            ("p.tar", ["bsdtar", "-cf"]),
            ("p.tar.gz", ["bsdtar", "-czf"]),
            ("p.tar.bz2", ["bsdtar", "-cjf"]),
            ("p.tar.xz", ["bsdtar", "-cJf"]),
            ("p.tar.zst", ["bsdtar", "--zstd", "-cf"]),
        ]
        for (name, command) in commands {
            let pack = fixture.packs.appendingPathComponent(name)
            try unpackRunTool(command + [pack.path, "-C", source.path, "."])
            let staging = try fixture.freshStaging(name)
            let summary = try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
            #expect(try unpackTreeListing(staging) == expected, "\(name)")
            #expect(summary.bytes == expected.values.reduce(0) { $0 + $1.bytes }, "\(name)")
        }
        // Info-ZIP's zip, which stores symlinks its own way (-y) and writes no "./" entry.
        let infoZip = fixture.packs.appendingPathComponent("info.zip")
        try unpackRunTool(["sh", "-c", "cd \"$1\" && zip -qry \"$2\" .", "sh", source.path, infoZip.path])
        let staging = try fixture.freshStaging("info.zip")
        _ = try Unpacker.unpack(archive: infoZip, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
        #expect(try unpackTreeListing(staging) == expected)
    }

    @Test("Several unpacks on different threads at once do not disturb each other")
    func concurrentUnpacks() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 500_000)
        let expected = try unpackTreeListing(source)
        let packs = try ["a.tar.gz", "b.zip", "c.tar.zst", "d.tar"].map { name in
            let pack = fixture.packs.appendingPathComponent(name)
            let flags = name.hasSuffix(".zip") ? ["--format", "zip", "-caf"] : ["-caf"]
            try unpackRunTool(["bsdtar"] + flags + [pack.path, "-C", source.path, "."])
            return (pack, try fixture.freshStaging(name))
        }
        let results = UnpackConcurrentResults(count: packs.count)
        DispatchQueue.concurrentPerform(iterations: packs.count) { index in
            let (pack, staging) = packs[index]
            results.set(
                index,
                Result { () throws(PackDeliveryError) in
                    try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
                })
        }
        for (index, (pack, staging)) in packs.enumerated() {
            #expect(throws: Never.self, "\(pack.lastPathComponent)") { try results.get(index)?.get() }
            #expect(try unpackTreeListing(staging) == expected, "\(pack.lastPathComponent)")
        }
    }

    @Test("The same pack extracted by bsdtar and by Unpacker gives the same files and bytes")
    func matchesBsdtar() throws {
        let fixture = try UnpackFixture()
        defer { fixture.remove() }
        let source = try fixture.tree(random: 300_000)
        for (index, flags) in [["-czf"], ["--format", "zip", "-cf"]].enumerated() {
            let pack = fixture.packs.appendingPathComponent("pack\(index)")
            try unpackRunTool(["bsdtar"] + flags + [pack.path, "-C", source.path, "."])
            let byBsdtar = try fixture.freshStaging("bsdtar\(index)")
            try unpackRunTool(["bsdtar", "-xf", pack.path, "-C", byBsdtar.path])
            let byUnpacker = try fixture.freshStaging("unpacker\(index)")
            _ = try Unpacker.unpack(archive: pack, into: byUnpacker, limits: UnpackLimits(maxBytes: 1 << 30))
            let listing = try unpackTreeListing(byUnpacker)
            #expect(listing == (try unpackTreeListing(byBsdtar)))
            #expect(listing["nested/deeper/tool.sh"]?.mode == 0o755)
            #expect(listing["empty"]?.kind == "dir")
            #expect(listing["link"]?.kind == "symlink -> nested/deeper/data.bin")
        }
    }
}

// MARK: - Fixture

/// A fresh temporary folder per test: `root/outer/inner/staging` is the staging folder, with canary
/// files in `root` and `root/outer/inner` (where `..` escapes would land), and `absoluteTarget` an
/// absolute path under /tmp that must never be created.
private final class UnpackFixture {
    let root: URL
    let stagingParent: URL
    let staging: URL
    let absoluteTarget: String
    /// Where tests put the packs they build and the trees they pack (not checked for changes).
    let packs: URL
    let sources: URL
    private let before: [String: String]

    init() throws {
        let id = UUID().uuidString
        self.root = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("unpack-tests-\(id)")
        self.stagingParent = self.root.appendingPathComponent("outer/inner")
        self.staging = self.stagingParent.appendingPathComponent("staging")
        self.absoluteTarget = "/tmp/unpack-tests-absolute-\(id)"
        self.packs = self.root.appendingPathComponent("packs")
        self.sources = self.root.appendingPathComponent("sources")
        for folder in [self.staging, self.packs, self.sources] {
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        }
        try Data("canary".utf8).write(to: self.root.appendingPathComponent("canary.txt"))
        try Data("canary".utf8).write(to: self.stagingParent.appendingPathComponent("canary.txt"))
        self.before = try unpackSnapshot(self.root)
    }

    /// Removes everything the test made (called from a `defer`, which also keeps the fixture alive).
    func remove() {
        try? FileManager.default.removeItem(at: self.root)
        try? FileManager.default.removeItem(atPath: self.absoluteTarget)
    }

    /// Writes a tar with python's tarfile (pax format). `body` is Python using `f(name, data, mode,
    /// mtime)`, `d(name, mode)`, `l(name, target)`, `h(name, target)` and `special(name, type)`.
    func tar(_ body: String, arguments: [String] = [], name: String = "pack.tar") throws -> URL {
        let pack = self.packs.appendingPathComponent(name)
        let script = """
            import io, sys, tarfile
            t = tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT)
            def add(info, data=None):
                info.uid = info.gid = 0
                t.addfile(info, io.BytesIO(data) if data is not None else None)
            def f(name, data=b"x", mode=0o644, mtime=1700000000):
                info = tarfile.TarInfo(name); info.size = len(data); info.mode = mode; info.mtime = mtime; add(info, data)
            def d(name, mode=0o755):
                info = tarfile.TarInfo(name); info.type = tarfile.DIRTYPE; info.mode = mode; add(info)
            def l(name, target):
                info = tarfile.TarInfo(name); info.type = tarfile.SYMTYPE; info.linkname = target; add(info)
            def h(name, target):
                info = tarfile.TarInfo(name); info.type = tarfile.LNKTYPE; info.linkname = target; add(info)
            def special(name, kind):
                info = tarfile.TarInfo(name); info.type = kind; info.devmajor = 1; info.devminor = 3; add(info)
            \(body)
            t.close()
            """
        try unpackRunTool(["python3", "-c", script, pack.path] + arguments)
        return pack
    }

    /// Writes a zip with python's zipfile; `body` uses `z` and `zl(name, target)` for a symlink.
    func zip(_ body: String, arguments: [String] = [], name: String = "pack.zip") throws -> URL {
        let pack = self.packs.appendingPathComponent(name)
        let script = """
            import sys, zipfile
            z = zipfile.ZipFile(sys.argv[1], "w")
            def zl(name, target):
                info = zipfile.ZipInfo(name); info.create_system = 3; info.external_attr = 0o120777 << 16
                z.writestr(info, target)
            \(body)
            z.close()
            """
        try unpackRunTool(["python3", "-c", script, pack.path] + arguments)
        return pack
    }

    /// A source tree: nested folders, an empty folder, an executable, a relative symlink, random data.
    func tree(random size: Int) throws -> URL {
        let source = self.sources.appendingPathComponent(UUID().uuidString)
        let manager = FileManager.default
        try manager.createDirectory(at: source.appendingPathComponent("nested/deeper"), withIntermediateDirectories: true)
        try manager.createDirectory(at: source.appendingPathComponent("empty"), withIntermediateDirectories: true)
        try unpackRandomData(size).write(to: source.appendingPathComponent("nested/deeper/data.bin"))
        try Data("top\n".utf8).write(to: source.appendingPathComponent("top.txt"))
        try Data().write(to: source.appendingPathComponent("nested/zero-length"))
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: source.appendingPathComponent("nested/deeper/tool.sh"))
        try manager.setAttributes([.posixPermissions: 0o755], ofItemAtPath: source.appendingPathComponent("nested/deeper/tool.sh").path)
        try manager.createSymbolicLink(atPath: source.appendingPathComponent("link").path, withDestinationPath: "nested/deeper/data.bin")
        return source
    }

    /// A new empty staging folder beside the default one (for tests that unpack several packs).
    func freshStaging(_ name: String) throws -> URL {
        let staging = self.stagingParent.appendingPathComponent("staging-\(name)")
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
        return staging
    }

    /// Unpacks `pack` into a fresh staging folder as a download's unpack reads it: from the start, by a zip's local headers.
    func streamedUnpack(_ pack: URL, limits: UnpackLimits) throws -> (folder: URL, summary: UnpackSummary) {
        let size = try #require(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int64)
        let growth = PartialFileGrowth(length: size)
        growth.finish(length: size)
        let folder = try self.freshStaging("streamed")
        return (
            folder,
            try Unpacker.unpack(
                archive: pack, into: folder, limits: limits, growing: GrowingFile(growth: growth, generation: growth.generation))
        )
    }

    /// Finishes a streamed unpack of the zip `pack` by its central directory, into a fresh staging folder.
    func adopt(_ pack: URL, _ streamed: (folder: URL, summary: UnpackSummary), limits: UnpackLimits) throws -> (
        folder: URL, summary: UnpackSummary
    ) {
        let listing = try #require(try ZipDirectories.listing(pack), "the central directory can be followed")
        let folder = try self.freshStaging("adopted")
        return (folder, try Unpacker.adopt(archive: pack, listing: listing, streamed: streamed, into: folder, limits: limits))
    }

    func unpack(
        _ pack: URL, limits: UnpackLimits = UnpackLimits(maxBytes: 1 << 30), progress: (Int64) -> Void = { _ in }
    ) throws(PackDeliveryError) -> UnpackSummary {
        try Unpacker.unpack(archive: pack, into: self.staging, limits: limits, progress: progress)
    }

    /// Unpacks `pack` into a fresh staging folder and expects the whole pack rejected as bad data,
    /// with the entry named in the message and subject, and nothing changed outside staging.
    func expectRejected(
        _ pack: URL, naming entry: String, because reason: String, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let staging = try self.freshStaging(UUID().uuidString)
        do {
            let summary = try Unpacker.unpack(archive: pack, into: staging, limits: UnpackLimits(maxBytes: 1 << 30))
            Issue.record("the pack was accepted (\(summary)); expected a rejection of '\(entry)'", sourceLocation: sourceLocation)
        } catch {
            #expect(error.kind == .badData, "\(error)", sourceLocation: sourceLocation)
            #expect(error.subject == entry, "subject \(error.subject ?? "nil") in: \(error.message)", sourceLocation: sourceLocation)
            #expect(error.message.contains("'\(entry)'"), "\(error.message)", sourceLocation: sourceLocation)
            #expect(error.message.contains(reason), "\(error.message)", sourceLocation: sourceLocation)
        }
        try self.expectOutsideUnchanged(sourceLocation: sourceLocation)
    }

    /// Everything outside the staging folders is as it was, and the absolute target was not created.
    func expectOutsideUnchanged(sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(try unpackSnapshot(self.root) == self.before, sourceLocation: sourceLocation)
        #expect(!FileManager.default.fileExists(atPath: self.absoluteTarget + "/evil"), sourceLocation: sourceLocation)
        #expect(try String(contentsOfFile: self.root.path + "/canary.txt", encoding: .utf8) == "canary", sourceLocation: sourceLocation)
    }
}

/// Every path under `root` (relative, not following symlinks) with its type and contents, except
/// the packs, the sources and the staging folders.
/// Every item under `folder`: its type, permission bits and bytes or target.
private func modesAndContents(_ folder: URL) throws -> [String: String] {
    var result: [String: String] = [:]
    for relative in try FileManager.default.subpathsOfDirectory(atPath: folder.path) {
        var info = stat()
        guard lstat(folder.path + "/" + relative, &info) == 0 else { continue }
        let mode = String(info.st_mode & 0o7777, radix: 8)
        switch info.st_mode & S_IFMT {
        case S_IFDIR: result[relative] = "dir \(mode)"
        case S_IFLNK:
            result[relative] = "symlink -> " + (try FileManager.default.destinationOfSymbolicLink(atPath: folder.path + "/" + relative))
        default: result[relative] = "file \(mode) " + (try Data(contentsOf: folder.appending(path: relative)).base64EncodedString())
        }
    }
    return result
}

private func unpackSnapshot(_ root: URL) throws -> [String: String] {
    let prefixes = ["packs", "sources", "outer/inner/staging"]
    var result: [String: String] = [:]
    let manager = FileManager.default
    guard let enumerator = manager.enumerator(atPath: root.path) else { return result }
    while let relative = enumerator.nextObject() as? String {
        if prefixes.contains(where: { relative.hasPrefix($0) }) { continue }
        let path = root.path + "/" + relative
        let attributes = try manager.attributesOfItem(atPath: path)
        switch attributes[.type] as? FileAttributeType {
        case .typeDirectory?: result[relative] = "dir"
        case .typeSymbolicLink?: result[relative] = "symlink -> " + (try manager.destinationOfSymbolicLink(atPath: path))
        default: result[relative] = "file " + ((try? Data(contentsOf: URL(fileURLWithPath: path)).base64EncodedString()) ?? "?")
        }
    }
    return result
}

/// Results written from several threads.
private final class UnpackConcurrentResults: Sendable {
    private let results: Mutex<[Result<UnpackSummary, PackDeliveryError>?]>

    init(count: Int) { self.results = Mutex(Array(repeating: nil, count: count)) }

    func set(_ index: Int, _ result: Result<UnpackSummary, PackDeliveryError>) {
        self.results.withLock { $0[index] = result }
    }

    func get(_ index: Int) -> Result<UnpackSummary, PackDeliveryError>? {
        self.results.withLock { $0[index] }
    }
}

/// What a user would compare between two extracted trees.
struct UnpackListingEntry: Equatable, CustomStringConvertible {
    var kind: String
    var mode: mode_t
    var bytes: Int64
    var contents: Data

    var description: String { "\(self.kind) \(String(self.mode, radix: 8)) \(self.bytes)" }
}

/// Type, permission bits and contents of every path under `root`, not following symlinks.
func unpackTreeListing(_ root: URL) throws -> [String: UnpackListingEntry] {
    var result: [String: UnpackListingEntry] = [:]
    let manager = FileManager.default
    guard let enumerator = manager.enumerator(atPath: root.path) else { return result }
    while let relative = enumerator.nextObject() as? String {
        let path = root.path + "/" + relative
        let info = try unpackStat(path)
        switch info.st_mode & S_IFMT {
        case S_IFDIR:
            result[relative] = UnpackListingEntry(kind: "dir", mode: info.st_mode & 0o7777, bytes: 0, contents: Data())
        case S_IFLNK:
            let target = try manager.destinationOfSymbolicLink(atPath: path)
            result[relative] = UnpackListingEntry(kind: "symlink -> " + target, mode: 0, bytes: 0, contents: Data())
        default:
            let data = try Data(contentsOf: URL(fileURLWithPath: path))
            result[relative] = UnpackListingEntry(kind: "file", mode: info.st_mode & 0o7777, bytes: Int64(data.count), contents: data)
        }
    }
    return result
}

func unpackRandomData(_ count: Int) -> Data {
    FileHandle(forReadingAtPath: "/dev/urandom")?.readData(ofLength: count) ?? Data(repeating: 7, count: count)
}

func unpackStat(_ path: String) throws -> stat {
    var info = stat()
    guard lstat(path, &info) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    return info
}

/// Runs a tool (found on PATH) and throws when it exits non-zero, with its standard error.
func unpackRunTool(_ arguments: [String]) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = arguments
    let errors = Pipe()
    process.standardError = errors
    process.standardOutput = FileHandle.nullDevice
    try process.run()
    let message = errors.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw UnpackToolError(
            command: arguments.prefix(3).joined(separator: " "), status: process.terminationStatus,
            message: String(decoding: message, as: UTF8.self))
    }
}

struct UnpackToolError: Error, CustomStringConvertible {
    var command: String
    var status: Int32
    var message: String
    var description: String { "\(self.command) exited with \(self.status): \(self.message)" }
}

/// Libarchive's reading is bounded and cancellable inside one call.
@Suite(.timeLimit(.minutes(5))) struct ArchiveReaderBoundsTests {
    /// A tar.gz whose first file holds 32 MiB of a repeating pattern (a few hundred KiB compressed), then a second file.
    static func pack() throws -> URL {
        let folder = try Fixtures.temporaryDirectory("archive-bounds")
        let url = folder.appending(path: "pack.tar.gz")
        let result = try Fixtures.run(
            "python3",
            [
                "-c",
                """
                import gzip, io, sys, tarfile
                raw = io.BytesIO()
                with tarfile.open(fileobj=raw, mode="w") as tar:
                    data = b"abcdefgh" * (4 << 20)
                    info = tarfile.TarInfo("big.bin"); info.size = len(data); tar.addfile(info, io.BytesIO(data))
                    info = tarfile.TarInfo("small.txt"); info.size = 1; tar.addfile(info, io.BytesIO(b"x"))
                open(sys.argv[1], "wb").write(gzip.compress(raw.getvalue(), 9))
                """, url.path,
            ])
        guard result.status == 0 else { throw FixtureError("python3: \(result.stderr)") }
        return url
    }

    @Test func decompressedBytesThatLibarchiveSkipsAreBoundedToo() throws {
        let reader = try ArchiveReader(try Self.pack(), maxDecompressed: 1000)
        var entry: OpaquePointer?
        #expect(archive_read_next_header(reader.reader, &entry) == ARCHIVE_OK)
        // Moving to the next header skips 32 MiB of data inside one libarchive call; the refills stop it.
        #expect(archive_read_next_header(reader.reader, &entry) == ARCHIVE_FATAL)
        let error = reader.error(nil)
        #expect(error.code == .unpackLimitExceeded && error.message.contains("decompressed"), "\(error)")
    }

    @Test func cancellingStopsInsideOneLibarchiveCall() throws {
        final class Flag: @unchecked Sendable { var set = false }  // one thread: the test's own
        let flag = Flag()
        let reader = try ArchiveReader(try Self.pack(), maxDecompressed: .max, isCancelled: { flag.set })
        var entry: OpaquePointer?
        #expect(archive_read_next_header(reader.reader, &entry) == ARCHIVE_OK)
        flag.set = true
        #expect(archive_read_next_header(reader.reader, &entry) == ARCHIVE_FATAL)
        #expect(reader.error(nil).code == .cancelled)
    }

    @Test func theFilterIsChosenFromTheMagicBytesOnly() {
        #expect(ArchiveReader.filter(forMagic: [0x1F, 0x8B, 8, 0])?.name == "gzip")
        #expect(ArchiveReader.filter(forMagic: Array("BZh9".utf8))?.name == "bzip2")
        #expect(ArchiveReader.filter(forMagic: [0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00])?.name == "xz")
        #expect(ArchiveReader.filter(forMagic: [0x28, 0xB5, 0x2F, 0xFD])?.name == "zstd")
        #expect(ArchiveReader.filter(forMagic: Array("PK\u{3}\u{4}".utf8)) == nil)
        #expect(ArchiveReader.filter(forMagic: []) == nil)
    }
}
