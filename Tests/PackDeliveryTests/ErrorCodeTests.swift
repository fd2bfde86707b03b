import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// Every error an app may handle is matched by its code (the message is for people). Each is
/// provoked for real here, or in the suite named beside it: insufficientStorage (QueueTests), lengthMismatch,
/// timedOut, unsupportedURL after a redirect (HostileInputTests), tooSlow (SlowServerTests), httpStatus (FaultTests), unauthorized,
/// queueClosed, cancelled (LibraryAPITests), stalled, databaseBusy (StallTests), contentIdentifierTaken
/// (QueueDecisionTests), unpackLimitExceeded (ArchiveReaderBoundsTests), tooManyOpenFiles (CatalogTests).
@Suite(.timeLimit(.minutes(5))) struct ErrorCodeTests {
    /// A one-pack site served by the fault server, and a queue on a fresh home.
    static func setup(_ label: String, edit: (inout Manifest) -> Void = { _ in }) throws -> (
        FaultServer, DownloadQueue, LoadedManifest, TestSite
    ) {
        let site = try TestSite.random(label, size: 50_000)
        let server = try FaultServer(root: site.folder)
        var manifest = try site.manifest()
        manifest.products[0].contents[0].url = server.url("big.tar").absoluteString
        edit(&manifest)
        let loaded = try LoadedManifest(manifest: manifest, baseURL: server.baseURL.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory(label + "-home")),
            configuration: .init(resumeWhenSpaceReturns: false, maxAttempts: 1))
        return (server, queue, loaded, site)
    }

    static func code(_ body: () throws -> Void) -> PackDeliveryError.Code? {
        do {
            try body()
            return nil
        } catch let error as PackDeliveryError { return error.code } catch { return nil }
    }

    @Test func usageErrorsHaveCodesAndFields() async throws {
        let (server, queue, manifest, _) = try Self.setup("codes-usage")
        defer {
            queue.close()
            server.stop()
        }
        #expect(Self.code { try queue.finish("t-nothing") } == .unknownTransaction)
        #expect(Self.code { try queue.pause(["d-nothing"]) } == .unknownDownload)
        #expect(Self.code { try queue.add(product: "com.example.nothing", from: manifest) } == .unknownProduct)
        let transaction = try await queue.add(product: "com.example.big", from: manifest, start: false)
        do throws(PackDeliveryError) {
            try await queue.finish([transaction.id])
            Issue.record("finish must be refused while a download is pending")
        } catch {
            switch error.code {
            case .finishRefused: #expect(error.pendingDownloadIDs == transaction.downloads.map(\.id))
            default: Issue.record("wrong code \(error.code)")
            }
        }
    }

    @Test func manifestErrorsHaveCodes() {
        #expect(Self.code { _ = try LoadedManifest.decode(Data("{".utf8), from: URL(string: "https://h/m.json")!) } == .invalidManifest)
        let manifest = Manifest(products: [
            .init(
                productIdentifier: "p",
                contents: [
                    .init(
                        contentIdentifier: "p", contentVersion: "1", url: "ftp://h/p.zip", contentLength: 1,
                        sha256: String(repeating: "a", count: 64))
                ])
        ])
        #expect(
            Self.code {
                let loaded = try LoadedManifest(manifest: manifest, baseURL: URL(string: "https://h/m.json")!)
                _ = try loaded.packURL(for: manifest.products[0].contents[0])
            } == .unsupportedURL)
    }

    @Test func deliveryErrorsHaveCodes() async throws {
        // A pack whose SHA-256 differs from the manifest's.
        let (server, queue, manifest, _) = try Self.setup("codes-checksum") {
            $0.products[0].contents[0].sha256 = String(repeating: "0", count: 64)
        }
        let id = try await #require(try queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        #expect(try await queue.settled(downloadID: id).error?.code == .checksumMismatch)
        await queue.close()
        server.stop()

        // A server nobody listens on.
        let (server2, queue2, manifest2, _) = try Self.setup("codes-unreachable") {
            $0.products[0].contents[0].url = "http://127.0.0.1:1/big.tar"
        }
        let id2 = try await #require(try queue2.add(product: "com.example.big", from: manifest2).downloads.first?.id)
        let unreachable = try await queue2.settled(downloadID: id2)
        #expect(
            unreachable.error?.code == .networkUnreachable && unreachable.error?.underlying?.domain == .curl,
            "\(String(describing: unreachable.error))")
        await queue2.close()
        server2.stop()
    }

    @Test func packErrorsHaveCodes() async throws {
        // A pack whose ContentInfo.plist names another product.
        let other = try Fixtures.temporaryDirectory("codes-contentinfo")
        let content = try Fixtures.temporaryDirectory("codes-contentinfo-content")
        try Data("x".utf8).write(to: content.appending(path: "x.txt"))
        try PackWriter.write(
            folder: content, to: other.appending(path: "pack.tar"), format: .tar,
            contentInfo: (productIdentifier: "com.example.other", contentVersion: "1"))
        let packURL = other.appending(path: "pack.tar")
        let pack = Manifest.Content(
            contentIdentifier: "com.example.mine", contentVersion: "1", url: "pack.tar",
            contentLength: Int64(try Data(contentsOf: packURL).count), sha256: try Fixtures.sha256Hex(of: packURL))
        let zeros = other.appending(path: "zeros.tar")
        try Data(count: 1024).write(to: zeros)
        let empty = Manifest.Content(
            contentIdentifier: "com.example.empty", contentVersion: "1", url: "zeros.tar", contentLength: 1024,
            sha256: try Fixtures.sha256Hex(of: zeros))
        let manifest = try LoadedManifest(
            manifest: Manifest(products: [
                .init(productIdentifier: "com.example.mine", contents: [pack]),
                .init(productIdentifier: "com.example.empty", contents: [empty]),
            ]),
            baseURL: other.appending(path: "manifest.json"))
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("codes-pack-home")), configuration: .init(maxAttempts: 1))
        defer { queue.close() }
        for (product, expected) in [("com.example.mine", PackDeliveryError.Code.contentInfoMismatch), ("com.example.empty", .emptyPack)] {
            let id = try await #require(try queue.add(product: product, from: manifest).downloads.first?.id)
            let ended = try await queue.settled(downloadID: id)
            #expect(ended.error?.code == expected, "\(product): \(String(describing: ended.error))")
        }
    }

    @Test func archiveErrorsHaveCodes() throws {
        let folder = try Fixtures.temporaryDirectory("codes-archive")
        func unpack(_ name: String) -> PackDeliveryError.Code? {
            let staging = folder.appending(path: "staging-\(name)")
            try? FileManager.default.createDirectory(at: staging, withIntermediateDirectories: true)
            return Self.code {
                _ = try Unpacker.unpack(archive: folder.appending(path: name), into: staging, limits: UnpackLimits(maxBytes: 1 << 20))
            }
        }
        try Data("this is not an archive at all, just text".utf8).write(to: folder.appending(path: "text.tar"))
        #expect(unpack("text.tar") == .corruptArchive)
        let traversal = try Fixtures.run(
            "python3",
            [
                "-c",
                """
                import io, sys, tarfile
                with tarfile.open(sys.argv[1], "w") as t:
                    i = tarfile.TarInfo("../escape.txt"); i.size = 1; t.addfile(i, io.BytesIO(b"x"))
                """, folder.appending(path: "traversal.tar").path,
            ])
        #expect(traversal.status == 0)
        #expect(unpack("traversal.tar") == .unsafeEntry)
        let content = try Fixtures.temporaryDirectory("codes-archive-content")
        try Data("x".utf8).write(to: content.appending(path: "x.txt"))
        let zip = try Fixtures.run(
            "zip", ["-q", "-P", "secret", "-r", folder.appending(path: "encrypted.zip").path, "."], currentDirectory: content)
        #expect(zip.status == 0)
        #expect(unpack("encrypted.zip") == .encryptedArchive)
    }

    @Test func aDamagedStateDatabaseIsSaidByItsCode() throws {
        let folder = try Fixtures.temporaryDirectory("codes-database")
        let database = folder.appending(path: "state.sqlite")
        try Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31) }).write(to: database)
        #expect(Self.code { _ = try Store(url: database) } == .databaseCorrupt)
        #expect(PackDeliveryError.io("open", path: "/x", errno: EMFILE).code == .tooManyOpenFiles)
        #expect(PackDeliveryError.io("write", path: "/x", errno: ENOSPC).code == .insufficientStorage)
    }
}
