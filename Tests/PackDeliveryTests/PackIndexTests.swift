import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs manifest` indexes each zip pack (where each entry lies, its size and the
/// SHA-256 of its bytes) in a sidecar the manifest names with its SHA-256 and length. Checked against the pack's
/// own bytes and `unzip -p`, for packs made by `packs pack` and by `zip -r`.
@Suite(.serialized, .timeLimit(.minutes(2))) struct PackIndexTests {
    /// An index file's JSON: `zstd -dc` of it (indexes are written compressed).
    static func json(_ file: URL) throws -> Data {
        let run = try Fixtures.run("zstd", ["-dc", file.path])
        #expect(run.status == 0, "zstd -dc \(file.path): \(run.stderr)")
        return Data(run.stdout.utf8)
    }

    @Test func anIndexRoundTripsForPacksFromPacksPackAndFromZip() throws {
        let content = try Fixtures.temporaryDirectory("index-content")
        let contents = content.appending(path: "Contents")
        try FileManager.default.createDirectory(at: contents.appending(path: "dir/empty"), withIntermediateDirectories: true)
        try Fixtures.randomFile(at: contents.appending(path: "a.bin"), size: 300_000)
        try Data(String(repeating: "compressible text\n", count: 4000).utf8).write(to: contents.appending(path: "dir/b.txt"))
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "dir/link").path, withDestinationPath: "b.txt")
        try Data(
            #"<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>ContentVersion</key><string>1</string><key>IAPProductIdentifier</key><string>com.example.zipped</string></dict></plist>"#
                .utf8
        )
        .write(to: content.appending(path: "ContentInfo.plist"))
        let site = try Fixtures.temporaryDirectory("index-site")
        let packed = try Fixtures.run(
            CLI.binary,
            [
                "pack", content.path, "--product", "com.example.packed", "--version", "1", "--output",
                site.appending(path: "packed.zip").path,
            ])
        #expect(packed.status == 0, "\(packed.stderr)")
        let zipped = try Fixtures.run(
            "/bin/sh", ["-c", "cd '\(content.path)' && zip -q -r -y '\(site.appending(path: "zipped.zip").path)' ."])
        #expect(zipped.status == 0, "\(zipped.stderr)")
        let tar = try Fixtures.run(
            CLI.binary,
            ["pack", content.path, "--product", "com.example.tar", "--version", "1", "--output", site.appending(path: "tar.tar.gz").path])
        #expect(tar.status == 0, "\(tar.stderr)")
        let made = try Fixtures.run(CLI.binary, ["manifest", site.path])
        #expect(made.status == 0, "\(made.stderr)")

        let manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: site.appending(path: "manifest.json")))
        let packs = Dictionary(uniqueKeysWithValues: manifest.products.map { ($0.productIdentifier, $0.contents[0]) })
        #expect(packs["com.example.tar"]?.index != nil, "a tar pack is indexed too")
        for product in ["com.example.packed", "com.example.zipped"] {
            let pack = try #require(packs[product])
            let reference = try #require(pack.index, "\(product) is indexed")
            let sidecar = site.appending(path: reference.url)
            #expect(try Fixtures.sha256Hex(of: sidecar) == reference.sha256)
            let sidecarLength = try FileManager.default.attributesOfItem(atPath: sidecar.path)[.size] as? Int64
            #expect(sidecarLength == reference.length)
            let index = try JSONDecoder().decode(PackIndex.self, from: Self.json(sidecar))
            let archive = site.appending(path: pack.url)
            let bytes = try Data(contentsOf: archive)

            // The ranges tile the pack from its first byte to its central directory, each starting at a local
            // header that names the entry.
            let sorted = index.entries.sorted { $0.offset < $1.offset }
            #expect(sorted.first?.offset == 0)
            for (entry, next) in zip(sorted, sorted.dropFirst()) { #expect(entry.offset + entry.length == next.offset, "\(entry.path)") }
            for entry in index.entries {
                let start = Int(entry.offset)
                #expect(Array(bytes[start..<(start + 4)]) == [0x50, 0x4B, 0x03, 0x04], "\(product) \(entry.path): a local header")
                let nameLength = Int(bytes[start + 26]) | Int(bytes[start + 27]) << 8
                let localName = String(decoding: bytes[(start + 30)..<(start + 30 + nameLength)], as: UTF8.self)
                #expect([entry.path, entry.path + "/", "./" + entry.path].contains(localName), "\(product): \(localName) vs \(entry.path)")
            }

            let byPath = Dictionary(uniqueKeysWithValues: index.entries.map { ($0.path, $0) })
            for file in ["Contents/a.bin", "Contents/dir/b.txt", "ContentInfo.plist"] {
                let entry = try #require(byPath[file], "\(product) lists \(file): \(index.entries.map(\.path))")
                let extracted = try Fixtures.temporaryDirectory("index-unzip").appending(path: "file")
                let unzip = try Fixtures.run("/bin/sh", ["-c", "unzip -p '\(archive.path)' '\(file)' > '\(extracted.path)'"])
                #expect(unzip.status == 0, "\(unzip.stderr)")
                let digest = try Fixtures.sha256Hex(of: extracted)
                let size = try FileManager.default.attributesOfItem(atPath: extracted.path)[.size] as? Int64
                #expect(entry.kind == .file && entry.sha256 == digest, "\(product) \(file)")
                #expect(entry.size == size)
            }
            #expect(byPath["Contents/dir/b.txt"]?.method == 8, "compressible text is deflated")
            #expect(byPath["Contents/dir/empty"]?.kind == .directory)
            let link = try #require(byPath["Contents/dir/link"])
            #expect(link.kind == .symlink && link.size == 5)
        }
    }
}
