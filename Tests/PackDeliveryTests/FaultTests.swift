import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// Every misbehaviour of the fault server ends with installed content whose SHA-256 matches.
@Suite(.timeLimit(.minutes(5))) struct FaultTests {
    static let size = 1 << 20

    /// A queue and a one-pack manifest whose URL goes through `fault`.
    struct Setup {
        let site: TestSite
        let server: FaultServer
        let queue: DownloadQueue
        let home: Home
        let manifest: LoadedManifest
        let writer: DiskFullWriter

        init(
            _ label: String, fault: Fault, size: Int = FaultTests.size, stallTimeout: TimeInterval = 30, maxAttempts: Int = 6,
            space: Int64 = .max
        ) throws {
            self.site = try TestSite.random(label, size: size)
            self.server = try FaultServer(root: self.site.folder)
            self.home = Home(folder: try Fixtures.temporaryDirectory(label + "-home"))
            self.writer = DiskFullWriter(space: space)
            var configuration = DownloadQueue.Configuration(
                transfer: TransferOptions(connectTimeout: 5, stallTimeout: stallTimeout), resumeWhenSpaceReturns: false,
                maxAttempts: maxAttempts, maxRetryDelay: 2, writer: self.writer)
            configuration.concurrency = 2
            self.queue = try DownloadQueue(home: self.home, configuration: configuration)
            var manifest = try self.site.manifest()
            manifest.products[0].contents[0].url = self.server.url("big.tar", fault: fault).absoluteString
            self.manifest = try LoadedManifest.decode(
                try JSONEncoder().encode(manifest), from: self.server.baseURL.appending(path: "manifest.json"))
        }

        /// Adds the transaction and waits until its download settles.
        func run() async throws -> Download {
            let id = try await #require(try self.queue.add(product: "com.example.big", from: self.manifest).downloads.first?.id)
            return try #require(await waitFor(self.queue, id) { !$0.state.isRunning })
        }

        func expectInstalled(_ download: Download) throws {
            #expect(download.state == .finished, "\(download.error?.description ?? "")")
            #expect(download.progress == 1.0)
            let url = try #require(download.contentURL)
            #expect(try Fixtures.sha256Hex(of: url.appending(path: "Contents/data.bin")) == self.site.dataSHA256)
        }

        /// Runs until the disk "fills" after `space` bytes, then frees it and resumes.
        /// - Returns: the download when paused for space, and when settled after the resume.
        func runThroughDiskFull() async throws -> (paused: Download, final: Download) {
            let id = try await #require(try self.queue.add(product: "com.example.big", from: self.manifest).downloads.first?.id)
            let paused = try #require(await waitFor(self.queue, id) { !$0.state.isRunning })
            #expect(paused.state == .paused && paused.bytesReceived > 0)
            self.writer.setSpace(.max)
            try self.queue.resume([id])
            return (paused, try #require(await waitFor(self.queue, id) { !$0.state.isRunning }))
        }
    }

    @Test func aResetConnectionIsResumedFromWhereItStopped() async throws {
        let setup = try Setup("fault-reset", fault: .resetOnce(afterBytes: 300_000))
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        try setup.expectInstalled(try await setup.run())
        let requests = setup.server.requests()
        #expect(requests.count == 2)
        #expect(
            requests.last?.range?.hasPrefix("bytes=") == true && requests.last?.range != "bytes=0-" && requests.last?.status == 206,
            "\(requests)")
        #expect(setup.server.bodyBytesSent() <= Self.size + 400_000)
    }

    @Test func aTruncatedBodyIsResumed() async throws {
        let setup = try Setup("fault-truncate", fault: .truncateOnce(afterBytes: 500_000))
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        try setup.expectInstalled(try await setup.run())
        #expect(setup.server.requests().last?.range == "bytes=500000-")
    }

    @Test func aStalledServerIsRetriedAfterTheStallTimeout() async throws {
        let setup = try Setup("fault-stall", fault: .stallOnce(afterBytes: 200_000), stallTimeout: 1)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        let started = Date()
        try setup.expectInstalled(try await setup.run())
        #expect(Date().timeIntervalSince(started) >= 1)
        #expect(setup.server.requests().last?.range == "bytes=200000-")
    }

    @Test(arguments: [503, 429, 408])
    func retryableStatusesAreRetriedHonouringRetryAfter(status: Int) async throws {
        let setup = try Setup("fault-\(status)", fault: .status(status, times: 2, retryAfter: 1))
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        let started = Date()
        try setup.expectInstalled(try await setup.run())
        #expect(Date().timeIntervalSince(started) >= 2, "two Retry-After: 1 waits")
        #expect(setup.server.requests().map(\.status) == [status, status, 200])
    }

    @Test func otherClientErrorsFailAtOnceWithTheStatus() async throws {
        let setup = try Setup("fault-404", fault: .status(404, times: 5, retryAfter: nil))
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        let download = try await setup.run()
        #expect(download.state == .failed)
        #expect(download.error?.code == .httpStatus && download.error?.httpStatus == 404 && download.error?.message.contains("404") == true)
        #expect(setup.server.requests().count == 1, "no retries for a 404")
    }

    @Test func theRetryBudgetStartsAgainWheneverBytesArrive() async throws {
        // Every response is cut after 256 KiB; with 3 attempts allowed, only progress resetting the budget finishes it.
        let setup = try Setup("fault-budget", fault: .resetAfter(bytes: 256 << 10), maxAttempts: 3)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        try setup.expectInstalled(try await setup.run())
        #expect(setup.server.requests().count >= 4)
        #expect(setup.server.bodyBytesSent() <= Self.size + 64 << 10, "no byte fetched twice")
    }

    @Test func aServerIgnoringRangeRestartsFromZeroWithoutAppending() async throws {
        let setup = try Setup("fault-ignore-range", fault: .ignoreRange, space: 300_000)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        try setup.expectInstalled(try await setup.runThroughDiskFull().final)
        #expect(setup.server.requests().last?.status == 200)
    }

    @Test func aChangedETagRestartsFromZero() async throws {
        let setup = try Setup("fault-etag", fault: .changeETag, space: 300_000)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        try setup.expectInstalled(try await setup.runThroughDiskFull().final)
        let last = try #require(setup.server.requests().last)
        #expect(last.ifRange != nil && last.range != nil && last.status == 200, "\(last)")
    }

    @Test func aCorrectServerResumesWithIfRange() async throws {
        let setup = try Setup("fault-none", fault: Fault.none, space: 300_000)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        let (paused, final) = try await setup.runThroughDiskFull()
        try setup.expectInstalled(final)
        let last = try #require(setup.server.requests().last)
        // The resume asks for exactly the bytes not on disk, with the strong ETag.
        #expect(last.range == "bytes=\(paused.bytesReceived)-" && last.ifRange?.hasPrefix("\"") == true && last.status == 206, "\(last)")
        #expect(last.bodyBytesSent == Int(final.contentLength - paused.bytesReceived))
    }

    @Test func pauseAndResumeOfASlowTransferKeepProgressMonotonic() async throws {
        // 3 MiB at 1 MiB/s: long enough that the pause lands mid-transfer even on a loaded machine.
        let setup = try Setup("fault-slow", fault: .slow(bytesPerSecond: 1 << 20), size: 3 << 20)
        defer {
            setup.queue.close()
            setup.server.stop()
        }
        // Subscribed before the transaction exists, so no event can be missed however late the task starts.
        let stream = setup.queue.events()
        let id = try await #require(try setup.queue.add(product: "com.example.big", from: setup.manifest).downloads.first?.id)
        let seen = Task { () -> [Download] in
            var downloads: [Download] = []
            for await event in stream {
                if case .downloadUpdated(let download) = event, download.id == id {
                    downloads.append(download)
                    if !download.state.isRunning && download.state != .paused { break }
                }
            }
            return downloads
        }
        #expect(await waitFor(setup.queue, id) { $0.progress > 0.1 } != nil)
        try setup.queue.pause([id])
        #expect(await waitFor(setup.queue, id) { $0.state == .paused } != nil)
        try setup.queue.resume([id])
        let done = try #require(await waitFor(setup.queue, id) { !$0.state.isRunning && $0.state != .paused })
        try setup.expectInstalled(done)
        let events = await seen.value
        let downloading = events.filter { $0.state == .active && $0.phase == .downloading }.map(\.progress)
        #expect(downloading == downloading.sorted(), "progress never goes backwards")
        #expect(events.contains { $0.timeRemaining > 0 }, "a rate became known")
        #expect(events.last?.state == .finished && events.last?.progress == 1.0)
        #expect(setup.server.bodyBytesSent() <= (3 << 20) + 256 << 10)
    }
}
