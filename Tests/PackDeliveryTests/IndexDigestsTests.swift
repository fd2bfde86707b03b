import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// A first install of an indexed pack records each file's SHA-256 from the pack's index (fetched beside the pack
/// through the transfer engine) instead of hashing the files as they unpack; the index is held to what the unpack
/// found (paths, kinds, sizes), and an index that disagrees with its pack is refused. Real libcurl, libarchive and a
/// loopback server that counts the bytes it sends.
@Suite(.serialized, .timeLimit(.minutes(5))) struct IndexDigestsTests {
    static let product = "com.example.indexed"

    /// A 20 MiB file (above ``IndexDigests/minimumPackLength``), three small files, an empty one, a script, a
    /// symlink and an empty folder.
    static func content(_ label: String) throws -> URL {
        let content = try Fixtures.temporaryDirectory(label)
        let contents = content.appending(path: "Contents")
        try Fixtures.randomFile(at: contents.appending(path: "big.bin"), size: 20 << 20)
        for file in 0..<3 { try Fixtures.randomFile(at: contents.appending(path: "small/f\(file).bin"), size: 100 << 10) }
        try Data().write(to: contents.appending(path: "small/empty.txt"))
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: contents.appending(path: "run.sh"))
        chmod(contents.appending(path: "run.sh").path, 0o755)
        try FileManager.default.createSymbolicLink(atPath: contents.appending(path: "small/link").path, withDestinationPath: "../run.sh")
        try FileManager.default.createDirectory(at: contents.appending(path: "empty"), withIntermediateDirectories: true)
        return content
    }

    static func packName(_ format: PackFormat) -> String { "pack.\(format.rawValue)" }
    static func indexName(_ format: PackFormat) -> String { Self.packName(format) + ".index.json" }

    /// Publishes `content` as version `version`: the pack, its index and `manifest.json`.
    static func publish(_ content: URL, version: String, site: URL, format: PackFormat) throws {
        try PackWriter.write(
            folder: content, to: site.appending(path: Self.packName(format)), format: format,
            contentInfo: (productIdentifier: Self.product, contentVersion: version))
        try ManifestBuilder.write(folder: site)
    }

    static func index(_ site: URL, _ format: PackFormat) throws -> PackIndex {
        // Indexes are written zstd-compressed: read their JSON as the client does.
        try JSONDecoder().decode(PackIndex.self, from: PackIndexTests.json(site.appending(path: Self.indexName(format))))
    }

    /// Replaces the site's index with `change` of it, and the manifest with one naming the new index.
    static func editIndex(_ site: URL, _ format: PackFormat, _ change: (inout PackIndex) throws -> Void) throws {
        var index = try Self.index(site, format)
        try change(&index)
        try PackIndexer.write(index, to: site.appending(path: Self.indexName(format)))
        try ManifestBuilder.write(folder: site)
    }

    static func fetch(_ manifestURL: URL, home: URL, deltaUpdates: Bool = true) async throws -> Download {
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1)
        configuration.deltaUpdates = deltaUpdates
        let queue = try DownloadQueue(home: Home(folder: home), configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifestURL.absoluteString)
        let id = try #require(try await queue.add(product: Self.product, from: manifest).downloads.first?.id, "a download")
        return try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
    }

    /// The files recorded for the installed pack.
    static func recorded(_ home: URL) throws -> [InstalledFileRecord] {
        let queue = try DownloadQueue(home: Home(folder: home))
        defer { queue.close() }
        let install = try #require(try queue.store.installs().first { $0.productIdentifier == Self.product }, "an install")
        return try queue.store.files(of: install)
    }

    /// The SHA-256 of each installed file and symlink (of its target text), by path.
    static func digests(_ installed: URL) throws -> [String: String] {
        var digests: [String: String] = [:]
        let enumerator = FileManager.default.enumerator(atPath: installed.path)
        while let path = enumerator?.nextObject() as? String {
            let url = installed.appending(path: path)
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: url.path) {
                let hasher = SHA256Hasher()
                Array(target.utf8).withUnsafeBytes { hasher.update($0) }
                digests[path] = hasher.hexDigest()
            } else if (try? url.resourceValues(forKeys: [.isRegularFileKey]))?.isRegularFile == true {
                digests[path] = try SHA256Hasher.hexDigest(ofFile: url)
            }
        }
        return digests
    }

    static func verify(_ home: URL) async throws -> [VerifyResult] {
        let queue = try DownloadQueue(home: Home(folder: home))
        defer { queue.close() }
        return try await queue.verify()
    }

    @Test(arguments: [PackFormat.tar, .tarZstd, .zip])
    func aFirstInstallOfAnIndexedPackRecordsTheDigestsOfItsFilesAndVerifyFindsAFlippedByte(format: PackFormat) async throws {
        let label = "index-digests-\(format.rawValue)"
        let content = try Self.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        let indexLength = try #require(
            try FileManager.default.attributesOfItem(atPath: site.appending(path: Self.indexName(format)).path)[.size] as? Int)
        #expect(server.bodyBytesSent(Self.indexName(format)) == indexLength, "the index was fetched once, whole: \(server.requests())")
        #expect(leftoversAfterCleanup(home) == [], "no archive, staging or index left")

        let installed = try #require(download.contentURL)
        let actual = try Self.digests(installed)
        let recorded = try Self.recorded(home)
        #expect(Set(recorded.map(\.path)) == Set(actual.keys), "every file and symlink is recorded, and nothing else")
        for file in recorded {
            #expect(file.sha256 == actual[file.path], "the recorded SHA-256 of \(file.path) is its bytes'")
        }
        let index = try Self.index(site, format)
        #expect(
            recorded.allSatisfy { file in index.entries.first { $0.path == file.path }?.sha256 == file.sha256 },
            "and the index's")
        #expect(try await Self.verify(home).allSatisfy(\.isIntact), "verify finds the install intact")

        flipByteKeepingTimes(installed.appending(path: "Contents/big.bin").path, at: 12_345_678)
        let damage = try await Self.verify(home).flatMap(\.damage)
        #expect(damage.map(\.path) == ["Contents/big.bin"] && damage.first?.problem == .changed, "verify finds the flipped byte: \(damage)")
    }

    /// The index's word is what is recorded: a publisher's index that gives a file other bytes' SHA-256 (of the right
    /// size, so nothing else shows it) installs, and `verify` then says the file is not what the publisher built.
    @Test func theIndexsDigestIsWhatVerifyComparesWith() async throws {
        let format = PackFormat.tar
        let content = try Self.content("index-word-content")
        let site = try Fixtures.temporaryDirectory("index-word-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let other = String(repeating: "ab", count: 32)
        try Self.editIndex(site, format) { index in
            let number = try #require(index.entries.firstIndex { $0.path == "Contents/small/f1.bin" })
            index.entries[number].sha256 = other
        }
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("index-word-home")
        // The whole-pack path, which records the index's word; a first install that writes each byte once records it
        // too (WriteOnceTests.anIndexWhoseFileDigestIsNotItsChunksInstallsAndVerifyReportsTheFile).
        let download = try await Self.fetch(server.url("manifest.json"), home: home, deltaUpdates: false)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try Self.recorded(home).first { $0.path == "Contents/small/f1.bin" }?.sha256 == other, "the index's digest is recorded")
        let damage = try await Self.verify(home).flatMap(\.damage)
        #expect(damage.map(\.path) == ["Contents/small/f1.bin"] && damage.first?.problem == .changed, "\(damage)")
    }

    /// An index whose files are not the pack's (another size, a file it lacks, a file the pack lacks) fails the
    /// install with `indexMismatch` naming the file; nothing is left behind and the installed version stays.
    @Test(arguments: ["another size", "a file missing from the index", "a file missing from the pack"])
    func anIndexThatDisagreesWithItsPackIsRefusedAndTheOldVersionStays(change: String) async throws {
        let format = PackFormat.tarZstd
        let label = "index-mismatch-\(change.split(separator: " ").joined(separator: "-"))"
        let content = try Self.content(label + "-content")
        let site = try Fixtures.temporaryDirectory(label + "-site")
        try Self.publish(content, version: "1", site: site, format: format)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory(label + "-home")
        let first = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(first.state == .finished, "version 1: \(first.error?.description ?? "")")
        let installed = home.appending(path: "Caches/\(Self.product)")
        let old = try treeContents(installed)

        try Fixtures.randomFile(at: content.appending(path: "Contents/small/f0.bin"), size: 100 << 10)
        try Self.publish(content, version: "2", site: site, format: format)
        let path: String
        switch change {
        case "another size":
            path = "Contents/small/f2.bin"
            try Self.editIndex(site, format) { index in
                let number = try #require(index.entries.firstIndex { $0.path == path })
                index.entries[number].size += 1
                let last = try #require(index.entries[number].chunks?.indices.last)
                index.entries[number].chunks?[last].size += 1
            }
        case "a file missing from the index":
            path = "Contents/small/f1.bin"
            try Self.editIndex(site, format) { index in index.entries.removeAll { $0.path == path } }
        default:
            path = "Contents/small/ghost.bin"
            try Self.editIndex(site, format) { index in
                index.entries.append(
                    PackIndex.Entry(
                        path: path, kind: .file, size: 5, sha256: String(repeating: "0", count: 64), method: 0, offset: 0, length: 0,
                        mode: 0o100644))
            }
        }
        // The whole pack, as a first install fetches it.
        let download = try await Self.fetch(server.url("manifest.json"), home: home, deltaUpdates: false)
        #expect(download.state == .failed, "\(download.state)")
        #expect(download.error?.code == .indexMismatch && download.error?.subject == path, "\(download.error?.description ?? "")")
        #expect(download.error?.description.contains(path) == true, "the message names the file: \(download.error?.description ?? "")")
        #expect(try treeContents(installed) == old, "version 1 untouched")
        #expect(leftoversAfterCleanup(home) == [], "nothing of the refused install left: \(leftovers(home))")
        let verify = try await Self.verify(home)
        #expect(verify.count == 1 && verify.allSatisfy(\.isIntact) && verify.first?.content.contentVersion == "1", "\(verify)")
    }

    /// A pack the manifest gives no index hashes its files as it unpacks, as before: no index is asked for, the
    /// digests recorded are the files', and verify finds a flipped byte.
    @Test func aPackWithoutAnIndexHashesItsFiles() async throws {
        let format = PackFormat.tarZstd
        let content = try Self.content("index-none-content")
        let site = try Fixtures.temporaryDirectory("index-none-site")
        try Self.publish(content, version: "1", site: site, format: format)
        try FileManager.default.removeItem(at: site.appending(path: Self.indexName(format)))
        let manifestFile = site.appending(path: "manifest.json")
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: manifestFile))
        manifest.products[0].contents[0].index = nil
        try JSONEncoder().encode(manifest).write(to: manifestFile)
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("index-none-home")
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(!server.requests().contains { $0.path.hasSuffix(".index.json") }, "no index asked for: \(server.requests())")
        let installed = try #require(download.contentURL)
        let actual = try Self.digests(installed)
        #expect(Dictionary(uniqueKeysWithValues: try Self.recorded(home).map { ($0.path, $0.sha256) }) == actual)
        flipByteKeepingTimes(installed.appending(path: "Contents/big.bin").path, at: 1_000)
        #expect(try await Self.verify(home).flatMap(\.damage).map(\.path) == ["Contents/big.bin"])
    }

    /// An index that does not match the manifest's SHA-256 (replaced on the server) is not used: the files are hashed
    /// after the unpack instead, and the install is as it would be without an index.
    @Test func anIndexThatDoesNotMatchTheManifestIsNotUsedAndTheFilesAreHashed() async throws {
        let format = PackFormat.tar
        let content = try Self.content("index-unusable-content")
        let site = try Fixtures.temporaryDirectory("index-unusable-site")
        try Self.publish(content, version: "1", site: site, format: format)
        // Other bytes, saying the same: the manifest's SHA-256 no longer matches, and one of its digests is wrong.
        var index = try Self.index(site, format)
        let number = try #require(index.entries.firstIndex { $0.path == "Contents/small/f1.bin" })
        index.entries[number].sha256 = String(repeating: "ab", count: 32)
        try JSONEncoder().encode(index).write(to: site.appending(path: Self.indexName(format)))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let home = try Fixtures.temporaryDirectory("index-unusable-home")
        let download = try await Self.fetch(server.url("manifest.json"), home: home)
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(server.bodyBytesSent(Self.indexName(format)) > 0, "the index was fetched")
        let installed = try #require(download.contentURL)
        #expect(Dictionary(uniqueKeysWithValues: try Self.recorded(home).map { ($0.path, $0.sha256) }) == (try Self.digests(installed)))
        #expect(try await Self.verify(home).allSatisfy(\.isIntact))
        #expect(leftoversAfterCleanup(home) == [])
    }

    /// The rule itself, with no I/O: a hard link takes its target's digest; a folder the index lists must be there.
    @Test func aHardLinkTakesItsTargetsDigestAndAMissingFolderIsAMismatch() throws {
        let digest = String(repeating: "1", count: 64)
        let empty = String(repeating: "2", count: 64)
        let index = PackIndex(entries: [
            PackIndex.Entry(path: "d", kind: .directory, size: 0, sha256: nil, method: 0, offset: 30, length: 30),
            PackIndex.Entry(path: "d/a", kind: .file, size: 10, sha256: digest, method: 0, offset: 60, length: 40),
            PackIndex.Entry(path: "d/b", kind: .file, size: 0, sha256: empty, method: 0, offset: 100, length: 30),
        ])
        let digests = try #require(IndexDigests(index: index, for: DownloadMachineTests.download(length: 200)))
        var summary = UnpackSummary(bytes: 20, entries: 3)
        summary.files = [
            InstalledFile(path: "d/a", kind: .file, size: 10, sha256: ""), InstalledFile(path: "d/b", kind: .file, size: 10, sha256: ""),
        ]
        summary.directories = ["", "d"]
        summary.hardLinks = ["d/b": "d/a"]
        summary.filesHashed = false
        #expect(try digests.apply(to: summary, pack: "c").map(\.sha256) == [digest, digest], "the link's content is its target's")
        summary.directories = [""]
        #expect(throws: PackDeliveryError.self) { try digests.apply(to: summary, pack: "c") }
        var noLink = summary
        noLink.directories = ["", "d"]
        noLink.hardLinks = [:]
        let error = #expect(throws: PackDeliveryError.self) { try digests.apply(to: noLink, pack: "c") }
        #expect(error?.code == .indexMismatch && error?.subject == "d/b", "d/b is 10 bytes, not 0: \(String(describing: error))")
    }
}
