import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Bytes from a fixed seed (xorshift), so a failure reproduces.
func chunkedPackBytes(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed | 1
    var bytes = [UInt8](repeating: 0, count: count)
    for index in 0..<count {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        bytes[index] = UInt8(truncatingIfNeeded: state >> 32)
    }
    return bytes
}

/// The SHA-256 of each chunk of `bytes`.
func chunkedPackDigests(_ bytes: [UInt8], _ chunker: Chunker = .standard) -> [String] {
    let hasher = SHA256Hasher()
    return bytes.withUnsafeBytes { buffer in
        var start = 0
        return chunker.lengths(buffer).map { length in
            hasher.reset()
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[start..<start + length]))
            start += length
            return hasher.hexDigest()
        }
    }
}

@Suite("Chunker", .timeLimit(.minutes(2)))
struct ChunkerTests {
    @Test("The same bytes give the same boundaries, and the sizes stay within minimum and maximum")
    func deterministicAndBounded() {
        let bytes = chunkedPackBytes(8 << 20, seed: 42)
        let chunker = Chunker.standard
        let first = bytes.withUnsafeBytes { chunker.lengths($0) }
        let second = bytes.withUnsafeBytes { chunker.lengths($0) }
        #expect(first == second)
        #expect(first.reduce(0, +) == bytes.count)
        #expect(first.dropLast().allSatisfy { (chunker.minimum...chunker.maximum).contains($0) }, "\(first.min() ?? 0)…\(first.max() ?? 0)")
        // Normalized chunking gathers sizes near the average: 8 MiB in 64 KiB chunks is about 128 of them.
        #expect((64...256).contains(first.count), "\(first.count) chunks")
        // A stream given in odd pieces cuts where the whole buffer does.
        let stream = ChunkStream(chunker: chunker)
        var streamed: [Int] = []
        bytes.withUnsafeBytes { buffer in
            var start = 0
            var piece = 1
            while start < buffer.count {
                let end = min(buffer.count, start + piece)
                stream.add(UnsafeRawBufferPointer(rebasing: buffer[start..<end])) { streamed.append($0.count) }
                start = end
                piece = piece * 7 % 300_007 + 1
            }
            stream.finish { streamed.append($0.count) }
        }
        #expect(streamed == first)
    }

    @Test("A 4 KiB insertion near the start changes only the chunks around it")
    func insertionShiftsLittle() {
        let original = chunkedPackBytes(16 << 20, seed: 7)
        var changed = original
        changed.insert(contentsOf: chunkedPackBytes(4096, seed: 99), at: 100_000)
        let before = chunkedPackDigests(original)
        let after = chunkedPackDigests(changed)
        let kept = Set(before).intersection(after).count
        #expect(kept >= before.count - 3, "\(kept) of \(before.count) chunks unchanged")
        // And a fixed-size cut would have kept none after the insertion.
        #expect(before.count > 100)
    }

    @Test("Each normalization level cuts the same bytes differently, so an index records its level; levels 0…3")
    func normalizationLevels() throws {
        let bytes = chunkedPackBytes(8 << 20, seed: 11)
        let sizes = (minimum: 16 << 10, average: 32 << 10, maximum: 256 << 10)
        let one = try #require(Chunker(minimum: sizes.minimum, average: sizes.average, maximum: sizes.maximum, normalization: 1))
        let two = try #require(Chunker(minimum: sizes.minimum, average: sizes.average, maximum: sizes.maximum, normalization: 2))
        let (cutOne, cutTwo) = (bytes.withUnsafeBytes { one.lengths($0) }, bytes.withUnsafeBytes { two.lengths($0) })
        #expect(cutOne != cutTwo, "the levels cut differently")
        for lengths in [cutOne, cutTwo] {
            #expect(lengths.reduce(0, +) == bytes.count)
            #expect(lengths.dropLast().allSatisfy { (sizes.minimum...sizes.maximum).contains($0) })
        }
        #expect(Chunker.standard == one, "the default is level 1, 16/32/256 KiB")
        #expect(Chunker(minimum: 16 << 10, average: 32 << 10, maximum: 256 << 10) == one, "the default level")
        #expect(Chunker(minimum: 16 << 10, average: 32 << 10, maximum: 256 << 10, normalization: 4) == nil, "levels 0…3")
        #expect(Chunker(minimum: 16 << 10, average: 32 << 10, maximum: 256 << 10, normalization: -1) == nil)
        // An index says its level; one that does not was cut at level 2, as every index before it said.
        var chunking = PackIndex.Chunking(one)
        #expect(chunking.normalization == 1 && chunking.chunker == one)
        chunking.normalization = nil
        #expect(chunking.chunker == two)
        chunking.normalization = 7
        #expect(chunking.chunker == nil)
    }

    @Test("Empty and tiny inputs; a run of zeros is cut at the maximum")
    func edges() {
        let chunker = Chunker.standard
        #expect([UInt8]().withUnsafeBytes { chunker.lengths($0) } == [])
        #expect([UInt8](repeating: 1, count: 1).withUnsafeBytes { chunker.lengths($0) } == [1])
        #expect([UInt8](repeating: 1, count: chunker.minimum).withUnsafeBytes { chunker.lengths($0) } == [chunker.minimum])
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        #expect(zeros.withUnsafeBytes { chunker.lengths($0) } == [Int](repeating: chunker.maximum, count: 4))
        let stream = ChunkStream(chunker: chunker)
        var count = 0
        stream.finish { _ in count += 1 }
        #expect(count == 0)
        #expect(Chunker(minimum: 16, average: 64 << 10, maximum: 256 << 10) == nil, "below the hash's window")
        #expect(Chunker(minimum: 16 << 10, average: 60_000, maximum: 256 << 10) == nil, "not a power of two")
        #expect(Chunker(minimum: 16 << 10, average: 64 << 10, maximum: 32 << 10) == nil, "maximum below the average")
    }
}

/// Packs written chunk by chunk, read back by real tools (bsdtar, zstd, gzip, tar, unzip) and by `packs fetch`;
/// their indexes checked against their bytes; hostile indexes refused.
@Suite("Chunked packs", .serialized, .timeLimit(.minutes(5)))
struct ChunkedPackTests {
    /// A content folder: random and compressible files (some larger than a chunk), an empty file, folders and a
    /// relative symlink.
    static func content(_ label: String) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "levels/deep"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: contents.appending(path: "empty folder"), withIntermediateDirectories: true)
        try Data(chunkedPackBytes(1_500_000, seed: 1)).write(to: contents.appending(path: "a.bin"))
        let text = (0..<40_000).map { "line \($0): the forest level, with trees and \($0 % 97) rocks\n" }.joined()
        try Data(text.utf8).write(to: contents.appending(path: "levels/deep/map.txt"))
        try Data("hello\n".utf8).write(to: contents.appending(path: "levels/b.txt"))
        try Data().write(to: contents.appending(path: "levels/empty"))
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "levels/link").path, withDestinationPath: "b.txt")
        return content
    }

    /// The pack of `content` in `format`, in a fresh site folder, and its index as a client reads it.
    static func pack(_ content: URL, _ format: PackFormat, label: String) throws -> (pack: URL, index: PackIndex) {
        let site = try Fixtures.temporaryDirectory(label)
        let pack = site.appending(path: "big.\(format.rawValue)")
        let written = try Fixtures.run(
            CLI.binary, ["pack", content.path, "--product", "com.example.big", "--version", "1.0", "--output", pack.path])
        #expect(written.status == 0, "\(written.stderr)")
        let data = try Data(contentsOf: PackWriter.indexURL(for: pack))
        let index = try PackIndex.decode(data, maxEntries: 100, containers: Set(PackIndex.Container.allCases))
        return (pack, index)
    }

    /// The bytes of `range` of `file`, decompressed as `storage` says, by the standard tools.
    static func stored(_ file: URL, offset: Int64, length: Int64, storage: PackIndex.Storage) throws -> Data {
        let handle = try FileHandle(forReadingFrom: file)
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        let bytes = try #require(try handle.read(upToCount: Int(length)))
        guard storage != .raw else { return bytes }
        let piece = try Fixtures.temporaryDirectory("chunk").appending(path: "piece")
        try bytes.write(to: piece)
        let command =
            switch storage {
            case .zstdFrame, .zstdFrameSlice: "zstd -dc '\(piece.path)'"
            case .gzipMember: "gzip -dc '\(piece.path)'"
            case .deflatedZipEntry:
                "python3 -c 'import sys, zlib; sys.stdout.buffer.write(zlib.decompress(open(sys.argv[1], \"rb\").read(), -15))' '\(piece.path)'"
            case .raw: "cat '\(piece.path)'"
            }
        let out = piece.deletingLastPathComponent().appending(path: "out")
        let run = try Fixtures.run("/bin/sh", ["-c", "\(command) > '\(out.path)'"])
        #expect(run.status == 0, "\(storage.rawValue) at \(offset)+\(length): \(run.stderr)")
        return try Data(contentsOf: out)
    }

    static func sha256(_ data: Data) -> String {
        let hasher = SHA256Hasher()
        data.withUnsafeBytes { hasher.update($0) }
        return hasher.hexDigest()
    }

    @Test(
        "bsdtar unpacks each format to the folder, and every chunk's range, read from the pack and decompressed, has the index's SHA-256",
        arguments: [PackFormat.tar, .tarZstd, .tarGzip, .zip])
    func everyFormat(format: PackFormat) throws {
        let content = try Self.content("chunked-content")
        let (pack, index) = try Self.pack(content, format, label: "chunked-site")
        let unpacked = try Fixtures.temporaryDirectory("chunked-bsdtar")
        let bsdtar = try Fixtures.run("bsdtar", ["-xf", pack.path, "-C", unpacked.path])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        #expect(try treeContents(unpacked.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))))

        // A tar.zst's small files share frames (format 3); every other format keeps format 2.
        #expect(index.format == (format == .tarZstd ? 3 : 2) && index.container.rawValue == format.rawValue)
        #expect(index.pack?.sha256 == (try Fixtures.sha256Hex(of: pack)))
        #expect(index.pack?.length == (try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int64))
        let files = try treeContents(content)
        var chunks = 0
        for entry in index.entries where entry.kind == .file {
            let file = try #require(
                files[entry.path] ?? (entry.path == "ContentInfo.plist" ? Data() : nil), "\(entry.path) is in the folder")
            if entry.path != "ContentInfo.plist" {
                #expect(entry.sha256 == Self.sha256(file) && entry.size == Int64(file.count), "\(entry.path)")
            }
            let list = try #require(entry.chunks, "\(entry.path) has chunks")
            var joined = Data()
            for chunk in list {
                let bytes = try GroupedFramesTests.chunkBytes(pack, chunk)
                #expect(Self.sha256(bytes) == chunk.sha256 && Int64(bytes.count) == chunk.size, "\(entry.path) at \(chunk.offset)")
                joined.append(bytes)
                chunks += 1
            }
            #expect(Self.sha256(joined) == entry.sha256, "\(entry.path): its chunks make the file")
        }
        // a.bin (1.5 MB) is cut into many chunks, except in a zip, where libarchive deflates it: one chunk.
        #expect(chunks >= (format == .zip ? 4 : 20), "\(chunks) chunks")
        let modes = Dictionary(uniqueKeysWithValues: index.entries.map { ($0.path, $0.mode ?? 0) })
        #expect(modes["Contents/levels/link"] == 0o120777 && modes["Contents/levels"] == 0o040755)
        #expect(modes["Contents/a.bin"] == 0o100644)
    }

    @Test("A chunked tar.zst is one zstd stream to zstd -d and tar, ends with a seek table, and packs fetch installs it")
    func tarZstdReadsEverywhere() throws {
        let content = try Self.content("chunked-zst-content")
        let (pack, index) = try Self.pack(content, .tarZstd, label: "chunked-zst-site")
        let unpacked = try Fixtures.temporaryDirectory("chunked-zst-tar")
        let pipeline = try Fixtures.run("/bin/sh", ["-c", "zstd -dc '\(pack.path)' | tar -x -C '\(unpacked.path)'"])
        #expect(pipeline.status == 0, "\(pipeline.stderr)")
        #expect(try treeContents(unpacked.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))))

        // The seek table: a skippable frame whose entries add up to the frames before it and to the tar.
        let bytes = try Data(contentsOf: pack)
        func u32(_ at: Int) -> Int { (0..<4).reduce(0) { $0 | Int(bytes[at + $1]) << (8 * $1) } }
        #expect(u32(bytes.count - 4) == 0x8F92_EAB1 && bytes[bytes.count - 5] == 0)
        let frames = u32(bytes.count - 9)
        let tableStart = bytes.count - 9 - 8 * frames - 8
        #expect(u32(tableStart) == 0x184D_2A5E && u32(tableStart + 4) == 8 * frames + 9)
        let compressed = (0..<frames).reduce(0) { $0 + u32(tableStart + 8 + 8 * $1) }
        let decompressed = (0..<frames).reduce(0) { $0 + u32(tableStart + 12 + 8 * $1) }
        #expect(compressed == tableStart, "the frames tile the pack up to the seek table")
        let tar = try Fixtures.run("/bin/sh", ["-c", "zstd -dc '\(pack.path)' | wc -c"])
        #expect(Int(tar.stdout.trimmingCharacters(in: .whitespacesAndNewlines)) == decompressed)
        let chunkCount = index.entries.reduce(0) { $0 + ($1.chunks?.count ?? 0) }
        #expect(frames > chunkCount, "one frame per chunk, and frames of headers between them")

        // packs fetch, streamed from nginx, installs exactly the folder.
        let built = try Fixtures.run(CLI.binary, ["manifest", pack.deletingLastPathComponent().path])
        #expect(built.status == 0, "\(built.stderr)")
        let manifest = try JSONDecoder().decode(
            Manifest.self, from: Data(contentsOf: pack.deletingLastPathComponent().appending(path: "manifest.json")))
        let reference = try #require(manifest.products.first?.contents.first?.index, "the manifest names the index")
        #expect(reference.url == "big.tar.zst.index.json")
        #expect(reference.sha256 == (try Fixtures.sha256Hex(of: PackWriter.indexURL(for: pack))))
        let nginx = try NginxServer(root: pack.deletingLastPathComponent())
        defer { nginx.stop() }
        let home = try Fixtures.temporaryDirectory("chunked-zst-home")
        let fetch = try CLI.run(home: home, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.big"])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        let installed = home.appending(path: "Caches/com.example.big")
        #expect(try treeContents(installed.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))))
    }

    @Test("A chunked tar.gz is one gzip stream to gzip -d and tar")
    func tarGzipReadsEverywhere() throws {
        let content = try Self.content("chunked-gz-content")
        let (pack, _) = try Self.pack(content, .tarGzip, label: "chunked-gz-site")
        let unpacked = try Fixtures.temporaryDirectory("chunked-gz-tar")
        let pipeline = try Fixtures.run("/bin/sh", ["-c", "gzip -dc '\(pack.path)' | tar -x -C '\(unpacked.path)'"])
        #expect(pipeline.status == 0, "\(pipeline.stderr)")
        #expect(try treeContents(unpacked.appending(path: "Contents")) == (try treeContents(content.appending(path: "Contents"))))
    }

    @Test("A chunked tar.zst stays near bsdtar --zstd's size at the same level")
    func sizeAgainstBsdtar() throws {
        let content = try Self.content("chunked-size-content")
        let (pack, _) = try Self.pack(content, .tarZstd, label: "chunked-size-site")
        let plain = pack.deletingLastPathComponent().appending(path: "plain.tar.zst")
        let bsdtar = try Fixtures.run(
            "/bin/sh", ["-c", "cd '\(content.path)' && bsdtar --zstd --options zstd:compression-level=3 -cf '\(plain.path)' ."])
        #expect(bsdtar.status == 0, "\(bsdtar.stderr)")
        let ours = try #require(try FileManager.default.attributesOfItem(atPath: pack.path)[.size] as? Int)
        let theirs = try #require(try FileManager.default.attributesOfItem(atPath: plain.path)[.size] as? Int)
        let ratio = Double(ours) / Double(theirs)
        print("chunked tar.zst \(ours) bytes, bsdtar --zstd \(theirs) bytes: ratio \(ratio)")
        #expect(ratio <= 1.10, "chunked \(ours) vs bsdtar \(theirs): \(ratio)")
    }
}

/// Format 2 indexes from hostile servers are refused with a reason, and `packs manifest` indexes third-party packs
/// as far as their format allows.
@Suite("Pack index format 2", .timeLimit(.minutes(3)))
struct PackIndexFormat2Tests {
    static let digest = String(repeating: "ab", count: 32)

    /// A tar.zst index of one file of two chunks, with `change` applied to its JSON object.
    static func index(packLength: Int64 = 10_000, _ change: (inout [String: Any]) -> Void = { _ in }) throws -> Data {
        var chunk1: [String: Any] = ["sha256": Self.digest, "size": 70_000, "offset": 1_000, "length": 3_000, "storage": "zstd-frame"]
        let chunk2: [String: Any] = ["sha256": Self.digest, "size": 30_000, "offset": 4_100, "length": 2_000, "storage": "zstd-frame"]
        chunk1["size"] = 70_000
        var root: [String: Any] = [
            "format": 2, "container": "tar.zst", "pack": ["length": packLength, "sha256": Self.digest],
            "chunking": ["algorithm": "fastcdc", "minimum": 16_384, "average": 65_536, "maximum": 262_144],
            "entries": [
                ["path": "Contents", "kind": "directory", "size": 0, "mode": 0o040755],
                [
                    "path": "Contents/a.bin", "kind": "file", "size": 100_000, "sha256": Self.digest, "mode": 0o100644,
                    "chunks": [chunk1, chunk2],
                ],
            ],
        ]
        change(&root)
        return try JSONSerialization.data(withJSONObject: root)
    }

    static func file(_ root: inout [String: Any], _ change: (inout [String: Any]) -> Void) {
        var entries = root["entries"] as! [[String: Any]]
        change(&entries[1])
        root["entries"] = entries
    }

    static func chunk(_ root: inout [String: Any], _ number: Int, _ change: (inout [String: Any]) -> Void) {
        Self.file(&root) { file in
            var chunks = file["chunks"] as! [[String: Any]]
            change(&chunks[number])
            file["chunks"] = chunks
        }
    }

    /// The refusal's message, or nil when the index is accepted.
    static func refusal(_ data: Data) -> String? {
        do {
            _ = try PackIndex.decode(data, maxEntries: 100_000, containers: Set(PackIndex.Container.allCases))
            return nil
        } catch {
            #expect(error.fallback.reason == .indexUnusable)
            return error.fallback.message
        }
    }

    @Test("A well-formed index is read, and the zip delta reader refuses a tar's index")
    func wellFormed() throws {
        let data = try Self.index()
        #expect(Self.refusal(data) == nil)
        #expect(throws: DeltaRefusal.self) { try PackIndex.decode(data, maxEntries: 100) }
    }

    @Test(
        "Hostile indexes are refused with what is wrong",
        arguments: [
            ("../escape", "leaves the pack"), ("/etc/passwd", "leaves the pack"), ("Contents/./a", "empty or `.`"),
            ("Contents//a", "empty or `.`"), ("a\u{0}b", "no zip entry can have"),
        ])
    func hostilePaths(path: String, reason: String) throws {
        let message = Self.refusal(try Self.index { Self.file(&$0) { $0["path"] = path } })
        #expect(message?.contains(reason) == true, "\(message ?? "accepted")")
    }

    @Test("Hostile chunk ranges and sizes are refused with what is wrong")
    func hostileChunks() throws {
        let cases: [(String, Data)] = [
            ("overlapping", try Self.index { Self.chunk(&$0, 1) { $0["offset"] = 3_999 } }),
            ("overlapping", try Self.index { Self.chunk(&$0, 1) { $0["offset"] = 1_000 } }),
            ("outside the pack", try Self.index { Self.chunk(&$0, 1) { $0["offset"] = 9_000 } }),
            ("outside the pack", try Self.index(packLength: 5_000)),
            ("outside the pack", try Self.index { Self.chunk(&$0, 0) { $0["offset"] = -1 } }),
            ("outside 1…", try Self.index { Self.chunk(&$0, 0) { $0["size"] = 0 } }),
            ("fewer bytes", try Self.index { Self.file(&$0) { $0["size"] = 200_000 } }),
            ("more bytes", try Self.index { Self.file(&$0) { $0["size"] = 50_000 } }),
            ("cannot hold", try Self.index { Self.chunk(&$0, 0) { $0["storage"] = "gzip-member" } }),
            ("cannot be read", try Self.index { Self.chunk(&$0, 0) { $0["storage"] = "lz4" } }),
            ("not a file's", try Self.index { Self.file(&$0) { $0["mode"] = 0o120777 } }),
            ("no mode", try Self.index { Self.file(&$0) { $0.removeValue(forKey: "mode") } }),
            ("twice", try Self.index { root in root["entries"] = (root["entries"] as! [Any]) + [(root["entries"] as! [Any])[0]] }),
            ("2^50", try Self.index { Self.file(&$0) { $0["size"] = Int64.max - 807 } }),
            ("cannot be read", try Self.index { Self.file(&$0) { $0["size"] = UInt64(Int64.max) + 1 } }),
            ("outside the pack", try Self.index { Self.chunk(&$0, 1) { $0["offset"] = Int64.max - 807 } }),
            ("length of", try Self.index { $0["pack"] = ["length": Int64.max - 7, "sha256": Self.digest] }),
            ("does not give the pack", try Self.index { $0.removeValue(forKey: "pack") }),
            ("chunk sizes", try Self.index { $0["chunking"] = ["algorithm": "fastcdc", "minimum": 1, "average": 3, "maximum": 2] }),
            (
                "normalization 9",
                try Self.index {
                    $0["chunking"] = ["algorithm": "fastcdc", "minimum": 16_384, "average": 65_536, "maximum": 262_144, "normalization": 9]
                }
            ),
            ("format 4", try Self.index { $0["format"] = 4 }),
            ("zip entry's range", try Self.index { Self.file(&$0) { $0["length"] = 100 } }),
        ]
        for (reason, data) in cases {
            let message = Self.refusal(data)
            #expect(message?.contains(reason) == true, "\(reason): \(message ?? "accepted")")
        }
    }

    @Test("An index of 10^6 entries is refused before it is decoded")
    func millionEntries() throws {
        let entry = #"{"path":"a","kind":"directory","size":0,"mode":16877},"#
        var text = #"{"format":2,"container":"tar","pack":{"length":0,"sha256":"\#(Self.digest)"},"entries":["#
        text += String(repeating: entry, count: 1_000_000)
        text += #"{"path":"b","kind":"directory","size":0,"mode":16877}]}"#
        let start = ContinuousClock.now
        let message = Self.refusal(Data(text.utf8))
        #expect(message?.contains("more than 100000 entries") == true, "\(message ?? "accepted")")
        #expect(ContinuousClock.now - start < .seconds(10), "counted, not decoded")
    }

    /// A content folder with a ContentInfo.plist, as third-party tools pack it.
    static func thirdPartyContent() throws -> URL {
        let content = try ChunkedPackTests.content("third-party-content")
        try Data(
            #"<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>ContentVersion</key><string>1</string><key>IAPProductIdentifier</key><string>com.example.third</string></dict></plist>"#
                .utf8
        ).write(to: content.appending(path: "ContentInfo.plist"))
        return content
    }

    @Test("packs manifest indexes a third-party tar by chunk, and a third-party tar.zst by entry, saying so")
    func thirdPartyPacks() throws {
        let content = try Self.thirdPartyContent()
        for (name, flag, chunked) in [("gnu.tar", "", true), ("one-frame.tar.zst", "--zstd", false)] {
            let site = try Fixtures.temporaryDirectory("third-party-site")
            let pack = site.appending(path: name)
            let tar = try Fixtures.run("/bin/sh", ["-c", "cd '\(content.path)' && tar \(flag) -cf '\(pack.path)' ."])
            #expect(tar.status == 0, "\(tar.stderr)")
            // A stale index beside it (of another pack) is not trusted: the pack is indexed again.
            try Data(try PackIndexFormat2Tests.index()).write(to: PackWriter.indexURL(for: pack))
            let made = try Fixtures.run(CLI.binary, ["manifest", site.path])
            #expect(made.status == 0, "\(made.stderr)")
            #expect(made.stderr.contains("indexed by entry only") == !chunked, "\(name): \(made.stderr)")
            // The library's note says what happened; the hint that names a command is the CLI's own line.
            let notes = made.stderr.split(separator: "\n").filter { $0.hasPrefix("packs: note:") }
            #expect(!notes.contains { $0.dropFirst("packs: note:".count).contains("packs ") }, "\(notes)")
            #expect(made.stderr.contains("packs: hint: packs pack") == !chunked, "\(made.stderr)")
            let data = try Data(contentsOf: PackWriter.indexURL(for: pack))
            let index = try PackIndex.decode(data, maxEntries: 100, containers: Set(PackIndex.Container.allCases))
            #expect(index.pack?.sha256 == (try Fixtures.sha256Hex(of: pack)))
            let manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
            #expect(manifest.products.first?.contents.first?.index?.sha256 == (try Fixtures.sha256Hex(of: PackWriter.indexURL(for: pack))))
            let files = try treeContents(content)
            for entry in index.entries where entry.kind == .file {
                let file = try #require(files[entry.path], "\(name): \(entry.path)")
                #expect(entry.sha256 == ChunkedPackTests.sha256(file), "\(name): \(entry.path)")
                #expect((entry.chunks != nil) == chunked, "\(name): \(entry.path)")
                for chunk in entry.chunks ?? [] {
                    let bytes = try ChunkedPackTests.stored(pack, offset: chunk.offset, length: chunk.length, storage: chunk.storage)
                    #expect(ChunkedPackTests.sha256(bytes) == chunk.sha256, "\(name): \(entry.path) at \(chunk.offset)")
                }
            }
        }
    }
}

/// Indexes are written as zstd-compressed JSON; every reader takes them compressed or plain (as they were written
/// before), and decompresses at most the 64 MiB an index may have.
@Suite("Compressed pack indexes", .serialized, .timeLimit(.minutes(3)))
struct CompressedIndexTests {
    static let all = Set(PackIndex.Container.allCases)

    /// The refusal's message, or nil when the index is accepted.
    static func refusal(_ data: Data) -> String? {
        do {
            _ = try PackIndex.decode(data, maxEntries: 100_000, containers: Self.all)
            return nil
        } catch {
            #expect(error.fallback.reason == .indexUnusable)
            return error.fallback.message
        }
    }

    /// The output of `zstd` given `script` (a shell pipeline that writes to `$out`).
    static func zstd(_ script: String) throws -> Data {
        let out = try Fixtures.temporaryDirectory("zstd").appending(path: "out.zst")
        let run = try Fixtures.run("/bin/sh", ["-c", "out='\(out.path)'; \(script)"])
        #expect(run.status == 0, "\(script): \(run.stderr)")
        return try Data(contentsOf: out)
    }

    @Test("packs pack writes its index compressed: zstd -dc reads it, it is the same index, and the manifest names its bytes")
    func packWritesItCompressed() throws {
        let content = try ChunkedPackTests.content("compressed-index-content")
        let (pack, index) = try ChunkedPackTests.pack(content, .tarZstd, label: "compressed-index-site")
        let url = PackWriter.indexURL(for: pack)
        let file = try Data(contentsOf: url)
        #expect(file.starts(with: [0x28, 0xB5, 0x2F, 0xFD]), "a zstd frame")
        let plain = try Self.zstd("zstd -dc '\(url.path)' > \"$out\"")
        #expect(try PackIndex.decode(plain, maxEntries: 100, containers: Self.all) == index, "the same index as its JSON")
        #expect(file.count * 2 < plain.count, "\(file.count) bytes compressed, \(plain.count) as JSON")
        #expect(index.chunking?.normalization == Chunker.standard.normalization, "the index says how its files were cut")

        let built = try Fixtures.run(CLI.binary, ["manifest", pack.deletingLastPathComponent().path])
        #expect(built.status == 0, "\(built.stderr)")
        let manifest = try JSONDecoder().decode(
            Manifest.self, from: Data(contentsOf: pack.deletingLastPathComponent().appending(path: "manifest.json")))
        let reference = try #require(manifest.products.first?.contents.first?.index)
        #expect(reference.sha256 == (try Fixtures.sha256Hex(of: url)) && reference.length == Int64(file.count), "the bytes served")
        #expect(try Data(contentsOf: url) == file, "a compressed index is kept as it is")
    }

    @Test("packs manifest compresses a plain JSON index that still describes its pack, its JSON unchanged")
    func manifestCompressesAPlainIndex() throws {
        let content = try ChunkedPackTests.content("plain-index-content")
        let (pack, index) = try ChunkedPackTests.pack(content, .tarZstd, label: "plain-index-site")
        let url = PackWriter.indexURL(for: pack)
        let plain = try PackIndex.json(Data(contentsOf: url))
        try plain.write(to: url)
        #expect(try PackIndex.decode(Data(contentsOf: url), maxEntries: 100, containers: Self.all) == index, "plain JSON is read")
        let built = try Fixtures.run(CLI.binary, ["manifest", pack.deletingLastPathComponent().path])
        #expect(built.status == 0, "\(built.stderr)")
        let file = try Data(contentsOf: url)
        #expect(file.starts(with: [0x28, 0xB5, 0x2F, 0xFD]), "compressed in place")
        #expect(try PackIndex.json(file) == plain, "the same JSON")
        let manifest = try JSONDecoder().decode(
            Manifest.self, from: Data(contentsOf: pack.deletingLastPathComponent().appending(path: "manifest.json")))
        let reference = try #require(manifest.products.first?.contents.first?.index)
        #expect(reference.sha256 == (try Fixtures.sha256Hex(of: url)) && reference.length == Int64(file.count))
    }

    @Test("A zstd frame that claims or produces more than 64 MiB is refused; so are broken frames; several frames are read")
    func zstdBombsAndBrokenFrames() throws {
        let json = try PackIndexFormat2Tests.index()
        let compressed = try #require(PackIndex.compressed(json))
        #expect(Self.refusal(compressed) == nil)
        #expect(try PackIndex.json(compressed) == json)

        // 80 MiB of spaces (valid JSON whitespace) compressed from a file: the frame says its size.
        let claims = try Self.zstd("head -c 80M /dev/zero | tr '\\0' ' ' > \"$out.in\" && zstd -q -1 -c \"$out.in\" > \"$out\"")
        let claimed = Self.refusal(claims)
        #expect(claimed?.contains("claims to decompress to 83886080 bytes") == true, "\(claimed ?? "accepted")")
        // The same streamed from a pipe: the frame does not say, and is stopped once it passes 64 MiB.
        let streamed = try Self.zstd("head -c 80M /dev/zero | tr '\\0' ' ' | zstd -q -1 -c > \"$out\"")
        let produced = Self.refusal(streamed)
        #expect(produced?.contains("decompresses to more than the 67108864 bytes") == true, "\(produced ?? "accepted")")
        // Exactly 64 MiB decompressed is as much as a plain index may be: read (and refused as JSON, not as size).
        let cap = try Self.zstd("head -c 64M /dev/zero | tr '\\0' ' ' | zstd -q -1 -c > \"$out\"")
        #expect(Self.refusal(cap)?.contains("cannot be read") == true)

        let broken: [(String, Data)] = [
            ("truncated", compressed.dropLast(5)),
            ("followed by bytes", compressed + Data("{}".utf8)),
            ("only the magic", Data([0x28, 0xB5, 0x2F, 0xFD])),
        ]
        for (what, data) in broken {
            #expect(Self.refusal(Data(data)) != nil, "\(what)")
        }
        // Two frames, one after the other, are one index.
        let half = json.count / 2
        let two = try #require(PackIndex.compressed(json.prefix(half))) + (try #require(PackIndex.compressed(json.dropFirst(half))))
        #expect(Self.refusal(two) == nil)
        #expect(try PackIndex.json(two) == json)
    }
}
