import Foundation
import PackDelivery
import PackTestSupport
import Synchronization
import Testing

/// A receipt that expires mid-download is renewed through the credential provider,
/// a presigned URL that stops working is replaced by reading the manifest again, and the receipt given to
/// `fetch` is stored so that `resume` needs no flag. Bytes are counted at the server: none is fetched twice.
@Suite(.serialized, .timeLimit(.minutes(2))) struct RenewalTests {
    static let size = 1 << 20

    /// A fault server that checks receipts (signed by `key`, no clock leeway) on every request.
    static func receiptServer(_ site: TestSite, key: PublisherSigningKey) throws -> FaultServer {
        let keys = [key.publicKey]
        return try FaultServer(root: site.folder) { header in
            guard let header, header.hasPrefix("Bearer "),
                case .success = Receipt.verify(header.dropFirst("Bearer ".count), keys: keys, leeway: 0)
            else { return 401 }
            return nil
        }
    }

    @Test func aReceiptThatExpiresMidDownloadIsRenewedThroughTheProviderAndNoByteIsFetchedTwice() async throws {
        let site = try TestSite.random("renew-site", size: Self.size)
        let key = try PublisherSigningKey.generate()
        let server = try Self.receiptServer(site, key: key)
        defer { server.stop() }
        // The first answer stalls after 400,000 bytes; the client gives up on it after 3 s without data, and by
        // the time it asks for the rest, the receipt it started with (good for 1–2 s) has expired.
        try site.editManifest {
            $0.products[0].contents[0].url = server.url("big.tar", fault: .stallOnce(afterBytes: 400_000)).absoluteString
        }
        let asked = Mutex<[Bool]>([])
        // Like a store client's: the receipt it holds, until the server refuses it; then a fresh one from the backend.
        let held = Mutex(try Receipt.issue(products: ["com.example.big"], subject: "user-42", lifetime: 2, key: key))
        var configuration = DownloadQueue.Configuration(
            transfer: TransferOptions(connectTimeout: 5, stallTimeout: 3),
            resumeWhenSpaceReturns: false, maxRetryDelay: 1)
        configuration.credentials = { request in
            asked.withLock { $0.append(request.refused) }
            if request.refused, let fresh = try? Receipt.issue(products: ["com.example.big"], subject: "user-42", lifetime: 3600, key: key)
            {
                held.withLock { $0 = fresh }
            }
            return ["Authorization: Bearer \(held.withLock { $0 })"]
        }
        let home = Home(folder: try Fixtures.temporaryDirectory("renew-home"))
        let queue = try DownloadQueue(home: home, configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(
            server.url("manifest.json").absoluteString,
            options: TransferOptions(headers: [
                "Authorization: Bearer \(try Receipt.issue(products: ["com.example.big"], subject: "user-42", lifetime: 60, key: key))"
            ]))
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(download.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)

        let packRequests = server.requests().filter { $0.file == "big.tar" }
        #expect(packRequests.map(\.status) == [200, 401, 206], "\(packRequests)")
        #expect(packRequests.last?.range == "bytes=400000-", "the rest was asked for from where the first answer stopped")
        #expect(server.bodyBytesSent("big.tar") == (try site.packSize()), "no byte fetched twice: \(packRequests)")
        #expect(asked.withLock { $0 }.contains(true), "the provider was asked for a fresh receipt after the refusal")
    }

    /// Credentials that stay refused: the provider is asked for fresh ones once (as the docs say), the manifest is read
    /// again once, and the download pauses for credentials (the provider was asked 3 times).
    @Test func credentialsThatStayRefusedAreRenewedOnceBeforeThePause() async throws {
        let site = try TestSite.random("refused-once-site", size: 64 << 10)
        let packs = try FaultServer(root: site.folder) { _ in 401 }
        defer { packs.stop() }
        let manifests = try FaultServer(root: site.folder)
        defer { manifests.stop() }
        try site.editManifest { $0.products[0].contents[0].url = packs.url("big.tar").absoluteString }
        let asked = Mutex<[Bool]>([])
        var configuration = DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1)
        configuration.credentials = { request in
            asked.withLock { $0.append(request.refused) }
            return ["Authorization: Bearer nope"]
        }
        let queue = try DownloadQueue(
            home: Home(folder: try Fixtures.temporaryDirectory("refused-once-home")), configuration: configuration)
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(manifests.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let paused = try await queue.settled(downloadID: id)
        #expect(paused.state == .paused && paused.pauseReason == .unauthorized && paused.error?.httpStatus == 401)
        #expect(asked.withLock { $0.filter { $0 }.count } == 1, "asked with refused set: \(asked.withLock { $0 })")
        #expect(manifests.requests().filter { $0.file == "manifest.json" }.count == 2, "read to add, and once again")
        #expect(packs.requests().count == 3, "the first request, the one with fresh credentials, one after the reading")
    }

    @Test func aPresignedURLThatStopsWorkingContinuesFromTheKeptBytesAfterTheManifestIsReadAgain() async throws {
        let site = try TestSite.random("presigned-site", size: Self.size)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        // Each read of the manifest hands out a fresh token; each token is good for 400,000 bytes (S3's
        // "Request has expired" after that), so the pack needs three of them.
        try site.editManifest { $0.products[0].contents[0].url = "/f/presigned/400000/big.tar?token={{token}}" }
        let home = Home(folder: try Fixtures.temporaryDirectory("presigned-home"))
        let queue = try DownloadQueue(
            home: home,
            configuration: DownloadQueue.Configuration(
                transfer: TransferOptions(connectTimeout: 5), resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(server.url("manifest.json", fault: .mint).absoluteString)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        #expect(download.state == .finished, "\(download.error?.description ?? "")")
        #expect(try Fixtures.sha256Hex(of: try #require(download.contentURL).appending(path: "Contents/data.bin")) == site.dataSHA256)
        #expect(server.bodyBytesSent("big.tar") == (try site.packSize()), "no byte fetched twice: \(server.requests())")
        #expect(server.requests().filter { $0.file == "manifest.json" }.count == 3, "the manifest was read again for each expired token")
        #expect(!download.url.absoluteString.contains("token=1"), "the download continued at the renewed URL")
    }

    @Test func aPackThatIsGoneAndStaysGoneFailsNamingTheStatusAfterOneReload() async throws {
        let site = try TestSite.random("gone-site", size: 64 << 10)
        let server = try FaultServer(root: site.folder)
        defer { server.stop() }
        try site.editManifest {
            $0.products[0].contents[0].url = server.url("big.tar", fault: .status(410, times: 100, retryAfter: nil)).absoluteString
        }
        let home = Home(folder: try Fixtures.temporaryDirectory("gone-home"))
        let queue = try DownloadQueue(
            home: home, configuration: DownloadQueue.Configuration(resumeWhenSpaceReturns: false, maxRetryDelay: 1))
        defer { queue.close() }
        let manifest = try await LoadedManifest.load(server.url("manifest.json").absoluteString)
        let id = try #require(try await queue.add(product: "com.example.big", from: manifest).downloads.first?.id)
        let download = try #require(await waitFor(queue, id) { !$0.state.isRunning }, "the download settles")
        #expect(download.state == .failed)
        #expect(download.error?.httpStatus == 410, "\(download.error?.description ?? "")")
        #expect(server.requests().filter { $0.file == "manifest.json" }.count == 2, "read once to add, once again after the 410")
        #expect(server.requests().filter { $0.file == "big.tar" }.count == 2, "asked at the old URL, then once more after the reload")
    }

    @Test func theReceiptGivenToFetchIsStoredSoResumeNeedsNoFlag() throws {
        let site = try TestSite.random("stored-receipt-site", size: 2 << 20)
        let key = try PublisherSigningKey.generate()
        let server = try Self.receiptServer(site, key: key)
        defer { server.stop() }
        try site.editManifest {
            $0.products[0].contents[0].url = server.url("big.tar", fault: .slow(bytesPerSecond: 1 << 20)).absoluteString
        }
        let home = try Fixtures.temporaryDirectory("stored-receipt-home")
        let receipt = try Receipt.issue(products: ["com.example.big"], subject: "user-42", lifetime: 3600, key: key)
        let file = home.deletingLastPathComponent().appending(path: "stored-receipt.jws")
        try receipt.write(to: file, atomically: true, encoding: .utf8)
        let killed = try runAndKill(
            home: home, ["fetch", server.url("manifest.json").absoluteString, "com.example.big", "--receipt", file.path]
        ) { event in
            event["phase"] as? String == "downloading" && (event["progress"] as? Double ?? 0) > 0.2
        }
        #expect(killed, "the fetch was killed mid-download")
        try FileManager.default.removeItem(at: file)
        let resume = try CLI.run(home: home, ["resume"])
        #expect(resume.status == 0, "resume without --receipt: \(resume.stderr)")
        #expect(!server.requests().contains { $0.status == 401 }, "every request carried the receipt: \(server.requests())")
        let status = try CLI.run(home: home, ["--json", "status"])
        #expect(!(status.stdout + status.stderr + resume.stdout + resume.stderr).contains(receipt), "the receipt is never shown")
        let content = try CLI.run(home: home, ["--json", "content"])
        let path = try #require(content.events.first?["contentURL"] as? String)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: path).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }
}

extension TestSite {
    /// The size of the site's one pack, `big.tar`.
    func packSize() throws -> Int {
        try #require(try FileManager.default.attributesOfItem(atPath: self.folder.appending(path: "big.tar").path)[.size] as? Int)
    }
}
