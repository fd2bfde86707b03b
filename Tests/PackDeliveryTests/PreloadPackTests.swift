import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// Preload packs (`packs pack --encrypt`): encrypted with AES-256-GCM segment by segment, they give back the plain
/// pack's exact bytes with their key, each chunk alone too, and refuse a wrong key or a changed byte, naming the pack
/// and keeping the encrypted bytes.
@Suite(.timeLimit(.minutes(5))) struct PreloadPackTests {
    static let releases = "2026-12-01T00:00:00Z"
    static let marker = "PLAINTEXT-MARKER-7f3a"

    /// A content folder (small text files with a marker, a 3 MB random file), a key file, and a site folder.
    struct Fixture {
        let root: URL
        let content: URL
        let site: URL
        let keyFile: URL
        let key: PreloadKey

        init(_ label: String) throws {
            self.root = try Fixtures.temporaryDirectory(label)
            self.content = self.root.appending(path: "content")
            self.site = self.root.appending(path: "site")
            let manager = FileManager.default
            try manager.createDirectory(at: self.content.appending(path: "Contents/levels"), withIntermediateDirectories: true)
            try manager.createDirectory(at: self.site, withIntermediateDirectories: true)
            for index in 0..<20 {
                try Data((0..<200).map { "\(PreloadPackTests.marker) line \($0) of \(index)\n" }.joined().utf8)
                    .write(to: self.content.appending(path: "Contents/levels/level\(index).txt"))
            }
            try Fixtures.randomFile(at: self.content.appending(path: "Contents/data.bin"), size: 3_000_000)
            let result = try Fixtures.run(CLI.binary, ["keygen", "--preload", self.root.appending(path: "launch").path])
            #expect(result.status == 0, "\(result.stderr)")
            self.keyFile = self.root.appending(path: "launch.preloadkey")
            self.key = try PreloadKey(contentsOf: self.keyFile)
            #expect(result.stdout.contains(self.key.keyID))
            #expect(!result.stdout.contains(SHA256Hasher.hex(Array(self.key.data))), "keygen prints the key id, never the key")
        }

        /// Writes the plain pack with PackWriter and the preload pack with `packs pack --encrypt`.
        func packs(_ format: PackFormat) throws -> (plain: URL, encrypted: URL) {
            let plainFolder = self.root.appending(path: "plain")
            try FileManager.default.createDirectory(at: plainFolder, withIntermediateDirectories: true)
            let plain = plainFolder.appending(path: "forest.\(format.rawValue)")
            try PackWriter.write(
                folder: self.content, to: plain, format: format,
                contentInfo: (productIdentifier: "com.example.forest", contentVersion: "1.0"))
            let encrypted = self.site.appending(path: "forest.\(format.rawValue)")
            let result = try Fixtures.run(
                CLI.binary,
                [
                    "pack", self.content.path, "--output", encrypted.path, "--product", "com.example.forest", "--version", "1.0",
                    "--encrypt", self.keyFile.path, "--releases", PreloadPackTests.releases,
                ], environment: nil, timeout: 120)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(!(result.stdout + result.stderr).contains(SHA256Hasher.hex(Array(self.key.data))))
            return (plain, encrypted)
        }

        func remove() { try? FileManager.default.removeItem(at: self.root) }
    }

    @Test("An encrypted pack of each format gives back the plain pack's bytes, whole and chunk by chunk", arguments: PackFormat.allCases)
    func roundTrip(format: PackFormat) throws {
        let fixture = try Fixture("preload-\(format.rawValue)")
        defer { fixture.remove() }
        let (plain, encrypted) = try fixture.packs(format)
        let plainBytes = try Data(contentsOf: plain)
        let encryptedBytes = try Data(contentsOf: encrypted)
        #expect(encryptedBytes.range(of: Data(Self.marker.utf8)) == nil, "no plaintext in the encrypted pack")
        #expect(encryptedBytes.range(of: Data("ContentInfo".utf8)) == nil)
        #expect(try Data(contentsOf: PackWriter.indexURL(for: encrypted)) == Data(contentsOf: PackWriter.indexURL(for: plain)))

        // Every range of the index lies where it lies in the plain pack, and decrypts alone.
        let layout = try PreloadPack.layout(of: encrypted, name: "com.example.forest")
        #expect(layout.keyID == fixture.key.keyID && layout.plainLength == Int64(plainBytes.count))
        let indexData = try Data(contentsOf: PackWriter.indexURL(for: plain))
        let index = try PackIndex.decode(indexData, maxEntries: 1 << 20, containers: Set(PackIndex.Container.allCases))
        let chunks = index.entries.flatMap { $0.chunks ?? [] }
        for chunk in chunks {
            let segment = try #require(layout.segment(at: chunk.offset), "a segment starts at chunk offset \(chunk.offset)")
            #expect(segment.length == chunk.length)
            let range = Int(chunk.offset)..<Int(chunk.offset + chunk.length)
            var bytes = Array(encryptedBytes[range])
            try PreloadPack.decrypt(&bytes, segment: segment, layout: layout, key: fixture.key, name: "com.example.forest")
            #expect(Data(bytes) == plainBytes[range])
        }
        if [.tar, .tarZstd, .tarGzip].contains(format) { #expect(chunks.count > 1) }

        let decrypted = fixture.root.appending(path: "decrypted.\(format.rawValue)")
        try PreloadPack.decrypt(encrypted, to: decrypted, key: fixture.key, name: "com.example.forest")
        #expect(try Data(contentsOf: decrypted) == plainBytes)
        let installed = fixture.root.appending(path: "installed")
        try FileManager.default.createDirectory(at: installed, withIntermediateDirectories: true)
        _ = try Unpacker.unpack(archive: decrypted, into: installed, limits: UnpackLimits(maxBytes: 1 << 30))
        #expect(
            try Fixtures.sha256Hex(of: installed.appending(path: "Contents/data.bin"))
                == Fixtures.sha256Hex(of: fixture.content.appending(path: "Contents/data.bin")))
        #expect(
            try Data(contentsOf: installed.appending(path: "Contents/levels/level7.txt"))
                == Data(contentsOf: fixture.content.appending(path: "Contents/levels/level7.txt")))
        if format != .zip {
            // Unpacked straight from the ciphertext, decrypted as it is read (an install's way): the same files.
            let streamed = fixture.root.appending(path: "streamed")
            try FileManager.default.createDirectory(at: streamed, withIntermediateDirectories: true)
            let decryption = try PreloadPack.Decryption(layout: layout, key: fixture.key, name: "com.example.forest")
            _ = try Unpacker.unpack(archive: encrypted, into: streamed, limits: UnpackLimits(maxBytes: 1 << 30), decryption: decryption)
            for file in ["Contents/data.bin", "Contents/levels/level7.txt"] {
                #expect(
                    try Fixtures.sha256Hex(of: streamed.appending(path: file))
                        == Fixtures.sha256Hex(of: fixture.content.appending(path: file)))
            }
            #expect(decryption.position > 3_000_000, "read through the ciphertext: \(decryption.position) of \(layout.plainLength)")
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: fixture.site.path).sorted()
        #expect(names == ["forest.\(format.rawValue)", "forest.\(format.rawValue).index.json", "forest.\(format.rawValue).preload.json"])
    }

    @Test("A wrong key or a changed byte fails naming the pack; the encrypted pack is kept and no plain pack written")
    func wrongKeyAndTampering() throws {
        let fixture = try Fixture("preload-refused")
        defer { fixture.remove() }
        let (_, encrypted) = try fixture.packs(.tarZstd)
        let output = fixture.root.appending(path: "out")
        try FileManager.default.createDirectory(at: output, withIntermediateDirectories: true)
        let plain = output.appending(path: "forest.tar.zst")
        func code(_ key: PreloadKey) -> PackDeliveryError? {
            do {
                try PreloadPack.decrypt(encrypted, to: plain, key: key, name: "com.example.forest")
                return nil
            } catch { return error }
        }
        let before = try Fixtures.sha256Hex(of: encrypted)
        let wrong = code(PreloadKey.generate())
        #expect(wrong?.code == .preloadKeyMismatch && wrong?.subject == "com.example.forest")
        #expect(try Fixtures.sha256Hex(of: encrypted) == before)

        // A byte in the middle of the ciphertext changed: the segment's tag fails.
        let handle = try FileHandle(forUpdating: encrypted)
        try handle.seek(toOffset: 1_500_000)
        let old = try #require(try handle.read(upToCount: 1))
        try handle.seek(toOffset: 1_500_000)
        try handle.write(contentsOf: Data([old[0] ^ 0x40]))
        try handle.close()
        let changed = try Fixtures.sha256Hex(of: encrypted)
        let tampered = code(fixture.key)
        #expect(tampered?.code == .preloadDecryptionFailed && tampered?.subject == "com.example.forest", "\(String(describing: tampered))")
        #expect(tampered?.kind == .badData)
        let shown = tampered.map { "\($0)" } ?? ""
        #expect(!shown.contains(SHA256Hasher.hex(Array(fixture.key.data))))
        #expect(try Fixtures.sha256Hex(of: encrypted) == changed, "the encrypted bytes are kept as they are")
        #expect(try FileManager.default.contentsOfDirectory(atPath: output.path).isEmpty, "no plain pack, no partial file")

        // Unpacked straight from the ciphertext, as an install does: the changed segment's tag stops the unpack.
        let staging = fixture.root.appending(path: "staging")
        try FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
        let layout = try PreloadPack.layout(of: encrypted, name: "com.example.forest")
        #expect(throws: PackDeliveryError.self) {
            do throws(PackDeliveryError) {
                _ = try Unpacker.unpack(
                    archive: encrypted, into: staging, limits: UnpackLimits(maxBytes: 1 << 30),
                    decryption: try PreloadPack.Decryption(layout: layout, key: fixture.key, name: "com.example.forest"))
            } catch {
                #expect(error.code == .preloadDecryptionFailed && error.subject == "com.example.forest", "\(error)")
                throw error
            }
        }
        #expect(
            (try? PreloadPack.Decryption(layout: layout, key: PreloadKey.generate(), name: "com.example.forest")) == nil,
            "a key that is not the pack's is refused before a byte is decrypted")
        #expect(!"\(fixture.key)".contains(SHA256Hasher.hex(Array(fixture.key.data))))
    }

    @Test("packs manifest marks a preload pack with its key id and release date, never the key")
    func manifestMarksPreload() throws {
        let fixture = try Fixture("preload-manifest")
        defer { fixture.remove() }
        let (_, encrypted) = try fixture.packs(.tarZstd)
        let result = try Fixtures.run(CLI.binary, ["manifest", fixture.site.path])
        #expect(result.status == 0, "\(result.stderr)")
        let data = try Data(contentsOf: fixture.site.appending(path: "manifest.json"))
        let manifest = try LoadedManifest.decode(data, from: fixture.site.appending(path: "manifest.json")).manifest
        let content = try #require(manifest.product("com.example.forest")?.contents.first)
        #expect(content.preload == Manifest.Content.Preload(keyID: fixture.key.keyID, releases: Self.releases))
        #expect(content.sha256 == (try Fixtures.sha256Hex(of: encrypted)))
        #expect(content.contentLength == (try FileManager.default.attributesOfItem(atPath: encrypted.path)[.size] as? Int64))
        #expect(content.contentVersion == "1.0" && content.index != nil && (content.unpackedLength ?? 0) > 3_000_000)
        #expect(String(decoding: data, as: UTF8.self).range(of: SHA256Hasher.hex(Array(fixture.key.data))) == nil)

        // A manifest whose key id cannot go into a URL path is refused.
        var bad = manifest
        bad.products[0].contents[0].preload?.keyID = "../keys"
        #expect(throws: PackDeliveryError.self) {
            _ = try LoadedManifest(manifest: bad, baseURL: fixture.site.appending(path: "manifest.json"))
        }
    }
}
