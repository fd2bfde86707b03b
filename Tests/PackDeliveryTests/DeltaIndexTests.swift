import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// A pack's index is the publisher's word about the pack, covered by the manifest's SHA-256 but not by the pack's
/// own bytes. An index whose numbers are out of range, one that does not describe its pack, and one too large to
/// hold must never crash `packs`, make a delta install other bytes than the pack holds, or take memory without
/// bound. The same manifest installs the same tree with and without delta updates (or fails the same way).
/// Everything runs through the `packs` binary, as a user runs it, against a loopback server.
@Suite(.serialized, .timeLimit(.minutes(6))) struct DeltaIndexTests {
    static let product = DeltaTests.product
    static let indexName = "delta.zip.index.json"
    /// The file that changes between version 1 and version 2.
    static let changed = "Contents/level1/f4.bin"

    /// Version 1 installed by `packs fetch` in `home` (and in `twin`, a second home for `--no-delta`), then
    /// version 2 (`changed` rewritten) published as `packs manifest` writes it.
    struct Update {
        let site: URL
        let server: FaultServer
        let home: URL
        let twin: URL
        /// The index of version 1.
        let old: PackIndex
        var manifestURL: String { self.server.url("manifest.json").absoluteString }
        var pack: URL { self.site.appending(path: "delta.zip") }
        var index: URL { self.site.appending(path: DeltaIndexTests.indexName) }
        var installed: URL { self.home.appending(path: "Caches/\(DeltaIndexTests.product)") }

        func newIndex() throws -> PackIndex { try JSONDecoder().decode(PackIndex.self, from: PackIndex.json(Data(contentsOf: self.index))) }
    }

    static func update(_ label: String) throws -> Update {
        let content = try DeltaTests.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try DeltaTests.publish(content, version: "1", site: site)
        let old = try JSONDecoder().decode(PackIndex.self, from: PackIndex.json(Data(contentsOf: site.appending(path: Self.indexName))))
        let server = try FaultServer(root: site)
        let update = Update(
            site: site, server: server, home: try Fixtures.temporaryDirectory(label + "-home"),
            twin: try Fixtures.temporaryDirectory(label + "-twin"), old: old)
        for home in [update.home, update.twin] {
            let first = try CLI.run(home: home, ["fetch", update.manifestURL, Self.product])
            #expect(first.status == 0, "version 1 installs: \(first.stderr)")
        }
        try Fixtures.randomFile(at: content.appending(path: Self.changed), size: 96 << 10)
        try DeltaTests.publish(content, version: "2", site: site)
        return update
    }

    /// Edits the site's manifest: `edit` gets the one pack's object.
    static func editManifest(_ site: URL, _ edit: (inout [String: Any]) throws -> Void) throws {
        let url = site.appending(path: "manifest.json")
        var object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        var products = try #require(object["products"] as? [[String: Any]])
        var contents = try #require(products[0]["contents"] as? [[String: Any]])
        try edit(&contents[0])
        products[0]["contents"] = contents
        object["products"] = products
        try JSONSerialization.data(withJSONObject: object).write(to: url)
    }

    /// Gives the manifest the SHA-256 and length of the index file as it now is: the index is the publisher's.
    static func sealIndex(_ update: Update) throws {
        let sha256 = try Fixtures.sha256Hex(of: update.index)
        let length = try #require(try FileManager.default.attributesOfItem(atPath: update.index.path)[.size] as? Int64)
        try Self.editManifest(update.site) { content in
            content["index"] = ["url": Self.indexName, "sha256": sha256, "length": length]
        }
    }

    /// Gives the manifest the SHA-256 and length of the pack as it now is.
    static func sealPack(_ update: Update) throws {
        let sha256 = try Fixtures.sha256Hex(of: update.pack)
        let length = try #require(try FileManager.default.attributesOfItem(atPath: update.pack.path)[.size] as? Int64)
        try Self.editManifest(update.site) { content in
            content["sha256"] = sha256
            content["contentLength"] = length
        }
    }

    static func writeIndex(_ index: PackIndex, _ update: Update) throws {
        try JSONEncoder().encode(index).write(to: update.index)
        try Self.sealIndex(update)
    }

    /// The `deltaFallback` reasons in `--json` events.
    static func fallbacks(_ result: CLI.Result) -> [String] {
        result.events.compactMap { ($0["deltaFallback"] as? [String: Any])?["reason"] as? String }
    }

    /// Runs `packs --home HOME ARGS…` under python3, which reports the child's peak resident set
    /// (`getrusage(RUSAGE_CHILDREN).ru_maxrss`, the kernel's high-water mark, as `/usr/bin/time -v` shows it).
    static func runMeasured(home: URL, _ arguments: [String]) throws -> (result: CLI.Result, peakMiB: Double) {
        let report = FileManager.default.temporaryDirectory.appending(path: "packs-rss-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: report) }
        let script = """
            import resource, subprocess, sys
            code = subprocess.run(sys.argv[2:]).returncode
            open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
            sys.exit(code if code >= 0 else 128 - code)
            """
        let run = try Fixtures.run("python3", ["-c", script, report.path, CLI.binary, "--home", home.path] + arguments, timeout: 300)
        let kib = try #require(Double(String(contentsOf: report, encoding: .utf8)), "python3 reported the peak")
        return (CLI.Result(status: run.status, stdout: run.stdout, stderr: run.stderr), kib / 1024)
    }

    // MARK: Numbers out of range

    /// A changed entry's mode or size that does not fit what it is used as trapped (exit 132) in the delta, and
    /// again at every `packs resume`. Now the index is refused where it is read and the whole pack is fetched.
    @Test(arguments: [("mode", Int64(-1)), ("mode", Int64(1) << 32), ("size", Int64.max)])
    func anOutOfRangeNumberInTheIndexFallsBackToTheWholePack(field: String, value: Int64) throws {
        let update = try Self.update("index-range-\(field)")
        defer { update.server.stop() }
        var index = try update.newIndex()
        let number = try #require(index.entries.firstIndex { $0.path == Self.changed })
        if field == "mode" { index.entries[number].mode = Int(value) } else { index.entries[number].size = value }
        try Self.writeIndex(index, update)

        let fetch = try CLI.run(home: update.home, ["--json", "fetch", update.manifestURL, Self.product])
        #expect(fetch.status == 0, "no crash, the whole pack instead: \(fetch.status) \(fetch.stderr)")
        #expect(Self.fallbacks(fetch).contains("indexUnusable"), "says why: \(fetch.stdout.suffix(600))")
        #expect(try treeContents(update.installed) == (try DeltaTests.reference(update.site, "index-range-bsdtar")))
        #expect(try CLI.run(home: update.home, ["resume"]).status == 0, "nothing left that traps at resume")
        #expect(try CLI.run(home: update.home, ["verify"]).status == 0)
    }

    /// The manifest's own numbers about the index are checked when the manifest is read, as its other sizes are.
    @Test func anIndexLengthOutOfRangeInTheManifestIsRefusedWhenTheManifestIsRead() throws {
        let update = try Self.update("index-length")
        defer { update.server.stop() }
        let before = try treeContents(update.installed)
        try Self.editManifest(update.site) { content in
            var index = try #require(content["index"] as? [String: Any])
            index["length"] = Int64.max
            content["index"] = index
        }
        let fetch = try CLI.run(home: update.home, ["fetch", update.manifestURL, Self.product])
        #expect(fetch.status == 65, "a manifest error, not a crash: \(fetch.status) \(fetch.stderr)")
        #expect(fetch.stderr.contains("index"), "names the index: \(fetch.stderr)")
        HostileInputTests.expectOneLine(fetch.stderr)
        #expect(try treeContents(update.installed) == before, "version 1 untouched")
        #expect(try CLI.run(home: update.home, ["resume"]).status == 0)
    }

    // MARK: The index must describe the pack

    /// The index gives the changed file the SHA-256 of version 1's file: a delta reused the old file while the pack
    /// (and `--no-delta`) holds new bytes. Now the pack's central directory (its CRC-32) shows that the index does
    /// not describe it, and the whole pack is fetched: both ways install the pack's bytes.
    @Test func anIndexThatGivesAChangedFileItsOldDigestInstallsThePacksBytes() throws {
        let update = try Self.update("index-samesha")
        defer { update.server.stop() }
        var index = try update.newIndex()
        let number = try #require(index.entries.firstIndex { $0.path == Self.changed })
        let old = try #require(update.old.entries.first { $0.path == Self.changed })
        #expect(index.entries[number].size == old.size && index.entries[number].sha256 != old.sha256)
        index.entries[number].sha256 = old.sha256
        try Self.writeIndex(index, update)

        let delta = try CLI.run(home: update.home, ["--json", "fetch", update.manifestURL, Self.product])
        let whole = try CLI.run(home: update.twin, ["fetch", update.manifestURL, Self.product, "--no-delta"])
        #expect(delta.status == 0 && whole.status == 0, "\(delta.stderr) \(whole.stderr)")
        let reference = try DeltaTests.reference(update.site, "index-samesha-bsdtar")
        #expect(try treeContents(update.installed) == reference, "the delta installed the pack's bytes")
        #expect(try treeContents(update.twin.appending(path: "Caches/\(Self.product)")) == reference, "as --no-delta did")
        #expect(Set(Self.fallbacks(delta)) == ["indexUnusable"], "\(delta.stdout.suffix(800))")
        let message = delta.events.compactMap { ($0["deltaFallback"] as? [String: Any])?["message"] as? String }.first ?? ""
        #expect(message.contains(Self.changed), "names the entry: \(message)")
        #expect(try CLI.run(home: update.home, ["verify"]).status == 0)
    }

    /// The index points the changed entry at a local header that its central directory does not list (an orphan
    /// placed before the directory, with other bytes of the same name). A delta installed the orphan's bytes,
    /// while `--no-delta` refuses the pack. Now both refuse it the same way, and version 1 stays.
    @Test func anIndexPointingAtAnOrphanLocalHeaderEndsAsTheWholePackDoes() throws {
        let update = try Self.update("index-orphan")
        defer { update.server.stop() }
        let before = try treeContents(update.installed)
        let orphanBytes = Data((0..<(96 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let orphan = try Self.insertOrphan(into: update.pack, path: Self.changed, bytes: orphanBytes)
        try Self.sealPack(update)
        var index = try update.newIndex()
        let number = try #require(index.entries.firstIndex { $0.path == Self.changed })
        index.entries[number].offset = orphan.offset
        index.entries[number].length = orphan.length
        index.entries[number].sha256 = try Self.sha256(orphanBytes)
        try Self.writeIndex(index, update)

        let delta = try CLI.run(home: update.home, ["--json", "fetch", update.manifestURL, Self.product])
        let whole = try CLI.run(home: update.twin, ["--json", "fetch", update.manifestURL, Self.product, "--no-delta"])
        #expect(whole.status == 65, "the pack itself is refused: \(whole.stderr)")
        #expect(delta.status == whole.status, "the delta ends as --no-delta does: \(delta.status) \(delta.stderr)")
        func code(_ result: CLI.Result) -> String? {
            result.events.compactMap { ($0["error"] as? [String: Any])?["code"] as? String }.last
        }
        #expect(code(delta) == code(whole), "the same error: \(delta.stderr) / \(whole.stderr)")
        #expect(try treeContents(update.installed) == before, "version 1 untouched, no orphan bytes installed")
        #expect(Self.fallbacks(delta).contains("indexUnusable"), "\(delta.stdout.suffix(800))")
    }

    // MARK: Size

    /// The real index and 1 GiB of padding, and an index of 1,000,000 entries (185 MiB), each with the right SHA-256
    /// and length in the manifest: read whole, they took 1,071 and 912 MiB. Indexes are bounded as manifests are
    /// (64 MiB), and refused before they are read; the whole pack is fetched, in at most 128 MiB.
    @Test(arguments: ["padding", "entries"])
    func aHugeIndexIsRefusedBeforeItIsRead(kind: String) throws {
        let update = try Self.update("index-huge-\(kind)")
        defer {
            update.server.stop()
            try? FileManager.default.removeItem(at: update.index)
        }
        let handle = try FileHandle(forWritingTo: update.index)
        if kind == "padding" {
            // `{"entries":[…],"format":1` + `,"padding":"xxx…"}`: valid JSON, an unknown key a decoder skips.
            let real = try Data(contentsOf: update.index)
            try handle.truncate(atOffset: 0)
            try handle.write(contentsOf: real.dropLast())
            try handle.write(contentsOf: Data(#","padding":""#.utf8))
            let chunk = Data(repeating: UInt8(ascii: "x"), count: 8 << 20)
            for _ in 0..<128 { try handle.write(contentsOf: chunk) }
            try handle.write(contentsOf: Data(#""}"#.utf8))
        } else {
            try handle.truncate(atOffset: 0)
            try handle.write(contentsOf: Data(#"{"format":1,"entries":["#.utf8))
            let digest = String(repeating: "ab", count: 32)
            var batch = ""
            for number in 0..<1_000_000 {
                batch +=
                    #"\#(number == 0 ? "" : ","){"kind":"file","length":100,"method":0,"offset":\#(number * 100),"path":"Contents/f\#(number).bin","sha256":"\#(digest)","size":10}"#
                if number % 10_000 == 9_999 {
                    try handle.write(contentsOf: Data(batch.utf8))
                    batch = ""
                }
            }
            try handle.write(contentsOf: Data("]}".utf8))
        }
        try handle.close()
        try Self.sealIndex(update)
        let size = try #require(try FileManager.default.attributesOfItem(atPath: update.index.path)[.size] as? Int64)
        #expect(size > 64 << 20)

        let (fetch, peak) = try Self.runMeasured(home: update.home, ["--json", "fetch", update.manifestURL, Self.product])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(peak <= 128, "peak RSS \(peak) MiB for a \(size >> 20) MiB index")
        #expect(Self.fallbacks(fetch).contains("indexUnusable"), "\(fetch.stdout.suffix(600))")
        #expect(try treeContents(update.installed) == (try DeltaTests.reference(update.site, "index-huge-bsdtar")))
        let sent = update.server.requests().filter { $0.file == Self.indexName }.count
        #expect(sent == 0, "the index was never asked for: \(sent) requests")
    }

    /// A zstd bomb as the index: 256 MiB of zeros streamed through `zstd` (about 8 KB, a frame that does not say how
    /// much it holds), with the right SHA-256 and length in the manifest. The client decodes at most the 64 MiB an
    /// index may have, refuses it, and fetches the whole pack.
    @Test func aZstdBombAsTheIndexIsRefusedAndTheWholePackIsFetched() throws {
        let update = try Self.update("index-zstd-bomb")
        defer { update.server.stop() }
        let made = try Fixtures.run("/bin/sh", ["-c", "head -c 256M /dev/zero | zstd -q -c > '\(update.index.path)'"])
        #expect(made.status == 0, "\(made.stderr)")
        let size = try #require(try FileManager.default.attributesOfItem(atPath: update.index.path)[.size] as? Int64)
        #expect(size < 1 << 20, "a small file: \(size) bytes")
        try Self.sealIndex(update)

        let (fetch, peak) = try Self.runMeasured(home: update.home, ["--json", "fetch", update.manifestURL, Self.product])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        #expect(peak <= 160, "peak RSS \(peak) MiB for an index that decompresses to 256 MiB")
        #expect(Self.fallbacks(fetch).contains("indexUnusable"), "\(fetch.stdout.suffix(600))")
        #expect(fetch.stdout.contains("decompresses to more than the 67108864 bytes"), "says why: \(fetch.stdout.suffix(600))")
        #expect(try treeContents(update.installed) == (try DeltaTests.reference(update.site, "index-zstd-bomb-bsdtar")))
    }

    /// The central directory check accepts what real tools write: a pack made by Info-ZIP's `zip -r -y` (no data
    /// descriptors, a folder entry per folder, a symlink) is updated by a delta, which installs the pack's tree.
    @Test func aPackFromZipIsStillUpdatedByADelta() throws {
        let content = try DeltaTests.content("index-infozip-content")
        let plist = """
            <?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>ContentVersion</key><string>VERSION</string>\
            <key>IAPProductIdentifier</key><string>\(Self.product)</string></dict></plist>
            """
        let site = try Fixtures.temporaryDirectory("index-infozip-site")
        func publish(_ version: String) throws {
            try Data(plist.replacing("VERSION", with: version).utf8).write(to: content.appending(path: "ContentInfo.plist"))
            try? FileManager.default.removeItem(at: site.appending(path: "delta.zip"))
            let zipped = try Fixtures.run(
                "/bin/sh", ["-c", "cd '\(content.path)' && zip -q -r -y '\(site.appending(path: "delta.zip").path)' ."])
            #expect(zipped.status == 0, "\(zipped.stderr)")
            try ManifestBuilder.write(folder: site)
        }
        try publish("1")
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("index-infozip-home")
        let manifestURL = server.url("manifest.json").absoluteString
        #expect(try CLI.run(home: home, ["fetch", manifestURL, Self.product]).status == 0)
        try Fixtures.randomFile(at: content.appending(path: Self.changed), size: 96 << 10)
        try publish("2")
        let before = server.bodyBytesSent("delta.zip")
        let update = try CLI.run(home: home, ["--json", "fetch", manifestURL, Self.product])
        #expect(update.status == 0, "\(update.stderr)")
        #expect(Self.fallbacks(update).isEmpty, "a delta: \(update.stdout.suffix(600))")
        let delta = try #require(update.events.compactMap { $0["delta"] as? [String: Any] }.last, "a delta")
        let toFetch = try #require((delta["bytesToFetch"] as? NSNumber)?.intValue)
        #expect(server.bodyBytesSent("delta.zip") - before == toFetch, "the directory and the changed entries, as planned")
        #expect(toFetch < 400 << 10, "\(delta)")
        #expect(
            try treeContents(home.appending(path: "Caches/\(Self.product)")) == (try DeltaTests.reference(site, "index-infozip-bsdtar")))
        #expect(try CLI.run(home: home, ["verify"]).status == 0)
    }

    /// Entries are counted before an index is decoded (braces inside strings are not objects), and every number of
    /// an entry is checked where it is decoded.
    @Test func anIndexIsCountedBeforeItIsDecodedAndItsNumbersAreRangeChecked() throws {
        func entry(_ path: String = "a", _ field: String? = nil, _ value: String = "") -> String {
            var fields = ["size": "1", "method": "0", "offset": "0", "length": "30"]
            if let field { fields[field] = value }
            let numbers = fields.sorted { $0.key < $1.key }.map { #""\#($0.key)":\#($0.value)"# }.joined(separator: ",")
            return #"{"path":"\#(path)","kind":"file","sha256":"\#(String(repeating: "a", count: 64))",\#(numbers)}"#
        }
        func decode(_ entries: [String], maxEntries: Int = 3) -> String? {
            do throws(DeltaRefusal) {
                _ = try PackIndex.decode(Data(#"{"format":1,"entries":[\#(entries.joined(separator: ","))]}"#.utf8), maxEntries: maxEntries)
                return nil
            } catch {
                return error.fallback.message
            }
        }
        #expect(decode([entry("a{{{{"), entry("b}{"), entry(#"c\"{"#)]) == nil, "three entries, braces in strings")
        #expect(decode([entry("a"), entry("b"), entry("c"), entry("d")])?.contains("more than 3 entries") == true)
        #expect(PackIndex.objectCount(Data(String(repeating: "{}", count: 1_000_000).utf8), stoppingAfter: 10) == 11, "stops early")
        let outOfRange = [
            ("mode", "-1"), ("mode", "65536"), ("method", "65536"), ("size", "-1"), ("size", "1125899906842625"), ("offset", "-1"),
            ("length", "29"), ("length", "9223372036854775807"),
        ]
        for (field, value) in outOfRange {
            let message = decode([entry("a", field, value)])
            #expect(message?.contains("\(field) of \(value)") == true, "\(field) \(value): \(message ?? "accepted")")
        }
    }

    // MARK: Zip surgery

    /// Inserts a stored local header for `path` holding `bytes` just before the zip's central directory, which does
    /// not list it, and moves the end record's directory offset past it.
    /// - Returns: where the orphan lies in the pack.
    static func insertOrphan(into pack: URL, path: String, bytes: Data) throws -> (offset: Int64, length: Int64) {
        var zip = [UInt8](try Data(contentsOf: pack))
        func u32(_ at: Int) -> Int { Int(zip[at]) | Int(zip[at + 1]) << 8 | Int(zip[at + 2]) << 16 | Int(zip[at + 3]) << 24 }
        let end = try #require((0...(zip.count - 22)).reversed().first { u32($0) == 0x0605_4B50 }, "an end record")
        let directory = u32(end + 16)
        #expect(directory != 0xFFFF_FFFF, "not a ZIP64 pack")
        var header: [UInt8] = []
        func put16(_ value: Int) { header += [UInt8(value & 0xFF), UInt8(value >> 8 & 0xFF)] }
        func put32(_ value: Int) {
            put16(value & 0xFFFF)
            put16(value >> 16 & 0xFFFF)
        }
        let name = Array(path.utf8)
        put32(0x0403_4B50)
        put16(20)
        put16(0)
        put16(0)  // stored
        put16(0)
        put16(0x21)  // 1980-01-01
        put32(Self.crc32(bytes))
        put32(bytes.count)
        put32(bytes.count)
        put16(name.count)
        put16(0)
        let orphan = header + name + [UInt8](bytes)
        zip.insert(contentsOf: orphan, at: directory)
        let moved = directory + orphan.count
        let newEnd = end + orphan.count
        for (shift, at) in [0, 8, 16, 24].enumerated() { zip[newEnd + 16 + shift] = UInt8(moved >> at & 0xFF) }
        try Data(zip).write(to: pack)
        return (Int64(directory), Int64(orphan.count))
    }

    static func crc32(_ data: Data) -> Int {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in data {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return Int(crc ^ 0xFFFF_FFFF)
    }

    static func sha256(_ data: Data) throws -> String {
        let file = FileManager.default.temporaryDirectory.appending(path: "packs-sha-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        try data.write(to: file)
        return try Fixtures.sha256Hex(of: file)
    }
}
