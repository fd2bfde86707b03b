import Foundation
import GRDB
import PackTestSupport
import Testing

@testable import PackDelivery

/// The state database's rows as the queue writes them: one writer per download row, and an install recorded in
/// the same commit as its download's final row.
@Suite(.timeLimit(.minutes(2))) struct StoreTests {
    static let sha = String(repeating: "ab", count: 32)

    /// A store with one open transaction of one download, and that download's machine at the start of its install.
    static func installing(_ label: String) throws -> (store: Store, machine: DownloadMachine) {
        let folder = try Fixtures.temporaryDirectory(label)
        let store = try Store(url: folder.appending(path: "state.sqlite"))
        let download = Download(
            id: "d-1", transactionID: "t-1", productIdentifier: "p", contentIdentifier: "p", contentVersion: "1",
            contentLength: 1000, state: .waiting, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
            contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1/p.zip")!, sha256: Self.sha,
            unpackedLength: nil, destination: .caches, bytesReceived: 0)
        let transaction = Transaction(
            id: "t-1", productIdentifier: "p", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false,
            downloads: [download])
        try store.insert([transaction], owner: QueueOwner.new()) { _ in "/work/downloads/d-1.pack" }
        var machine = DownloadMachine(download: download)
        _ = machine.start()
        _ = machine.transferFinished(token: 1, outcome: .completed(sha256: Self.sha, length: 1000, resumedFrom: 0))
        #expect(machine.state == .active && machine.download.phase == .verifying)
        return (store, machine)
    }

    static func row(_ machine: DownloadMachine) -> DownloadRecord {
        DownloadRecord(
            machine.download, position: 0, validator: machine.validator,
            partialPath: machine.state == .finished ? nil : "/work/downloads/d-1.pack", stagingInode: machine.stagingInode,
            retriedFromZero: machine.retriedFromZero, verified: machine.verified)
    }

    static func installed(at path: String) -> (install: InstallRecord, files: [InstalledFileRecord]) {
        (
            InstallRecord(
                destination: .caches, contentIdentifier: "p", productIdentifier: "p", contentVersion: "1", contentURL: path,
                installedAt: Date(), downloadID: "d-1", fileCount: 1, byteCount: 5),
            [InstalledFileRecord(destination: .caches, contentIdentifier: "p", path: "a.txt", kind: .file, size: 5, sha256: Self.sha)]
        )
    }

    @Test func aFinishedDownloadIsNeverWrittenOverByAnOlderRecordOfIt() throws {
        let (store, installing) = try Self.installing("store-stale")
        defer { store.close() }
        let stale = Self.row(installing)
        var finished = installing
        _ = finished.installFinished(token: 1, result: .success(URL(filePath: "/c/p")))
        let (install, files) = Self.installed(at: "/c/p")
        try store.commitInstall(install, files: files, download: Self.row(finished))
        // A queue that still held the download as installing saves it after the commit.
        try store.save([stale])
        let row = try #require(try store.downloadRecord("d-1"))
        #expect(row.state == .finished && row.progress == 1 && row.contentURL == "/c/p" && row.phase == nil, "\(row)")
        #expect(try store.transactions().first?.downloads.first?.state == .finished)
    }

    @Test func anInstallIsRecordedOnlyInTheCommitThatFinishesItsDownload() throws {
        let (store, installing) = try Self.installing("store-one-commit")
        defer { store.close() }
        var finished = installing
        _ = finished.installFinished(token: 1, result: .success(URL(filePath: "/c/p")))
        let (install, files) = Self.installed(at: "/c/p")
        // The download's row cannot be written: the install's rows must not be either.
        try store.pool.write { db in
            try db.execute(sql: "CREATE TRIGGER refuse BEFORE UPDATE ON downloads BEGIN SELECT RAISE(ABORT, 'refused'); END")
        }
        #expect { try store.commitInstall(install, files: files, download: Self.row(finished)) } throws: {
            ($0 as? PackDeliveryError)?.code == .database
        }
        #expect(try store.installs(contentIdentifier: "p").isEmpty, "no install without its finished download")
        #expect(try store.files(of: install).isEmpty, "no installed files without their install")
        #expect(try store.downloadRecord("d-1")?.state != .finished)
        // Once the row can be written, both are recorded.
        try store.pool.write { db in try db.execute(sql: "DROP TRIGGER refuse") }
        try store.commitInstall(install, files: files, download: Self.row(finished))
        #expect(try store.installs(contentIdentifier: "p").map(\.contentURL) == ["/c/p"])
        #expect(try store.files(of: install).map(\.path) == ["a.txt"])
        #expect(try store.downloadRecord("d-1")?.state == .finished)
    }

    @Test func aRecordedValueThatCannotBeReadIsSaidNotDropped() throws {
        let folder = try Fixtures.temporaryDirectory("store-unreadable")
        let home = Home(folder: folder)
        try FileManager.default.createDirectory(at: home.databaseURL.deletingLastPathComponent(), withIntermediateDirectories: true)
        func download(_ id: String, _ state: DownloadState) -> Download {
            var download = Download(
                id: id, transactionID: "t-1", productIdentifier: "p", contentIdentifier: id, contentVersion: "1",
                contentLength: 1000, state: state, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil,
                contentURL: nil, error: nil, url: URL(string: "http://127.0.0.1:9/\(id).zip")!, sha256: Self.sha,
                unpackedLength: nil, destination: .caches, bytesReceived: 0)
            if state == .failed { download.error = PackDeliveryError(.httpStatus, message: "The server said 404.", httpStatus: 404) }
            download.index = Manifest.IndexReference(url: "\(id).index", sha256: Self.sha, length: 10)
            return download
        }
        do {
            let store = try Store(url: home.databaseURL)
            defer { store.close() }
            let transaction = Transaction(
                id: "t-1", productIdentifier: "p", kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false,
                downloads: [download("failed", .failed), download("running", .active), download("intact", .failed)])
            // Owned by a queue of this process that is not open: the next queue takes the running one over.
            try store.insert([transaction], owner: QueueOwner.new()) { "\($0.id).pack" }
            // What the columns hold: the values as JSON.
            let stored = try store.read { db in
                try Row.fetchOne(db, sql: "SELECT error, indexReference FROM downloads WHERE id = 'intact'")
            }
            let error: String? = stored?["error"]
            let index: String? = stored?["indexReference"]
            #expect(error?.contains(#""httpStatus":404"#) == true && error?.contains(#""code":"httpStatus""#) == true, "\(error ?? "")")
            #expect(index == #"{"length":10,"sha256":"\#(Self.sha)","url":"intact.index"}"#)
            try store.write { db in
                try db.execute(sql: "UPDATE downloads SET error = '{\"code\": \"httpSt' WHERE id = 'failed'")
                try db.execute(sql: "UPDATE downloads SET indexReference = '{\"url\": 5}' WHERE id = 'running'")
            }
        }
        let lines = LogLines()
        let queue = try DownloadQueue(
            home: home, configuration: DownloadQueue.Configuration(resumeInterruptedDownloads: false), logger: lines.logger())
        defer { queue.close() }
        let downloads = Dictionary(uniqueKeysWithValues: try queue.transactions().flatMap(\.downloads).map { ($0.id, $0) })
        // The error that cannot be read is said as such, naming the column; the download stays failed.
        let failed = try #require(downloads["failed"])
        #expect(failed.state == .failed && failed.error?.code == .internalError && failed.error?.subject == "downloads.error")
        #expect(failed.error?.message.contains("cannot be read (column downloads.error") == true, "\(failed.error?.message ?? "")")
        // The index that cannot be read is dropped, with a warning, when the download is taken over to run.
        let running = try #require(downloads["running"])
        #expect(running.state == .paused && running.index == nil)
        let warned = lines.all.filter { $0.contains("pack index recorded for a download cannot be read") }
        #expect(warned.count == 1, "\(lines.all)")
        // The other values read back as they were written.
        let intact = try #require(downloads["intact"])
        #expect(intact.error == PackDeliveryError(.httpStatus, message: "The server said 404.", httpStatus: 404))
        #expect(intact.index == Manifest.IndexReference(url: "intact.index", sha256: Self.sha, length: 10))
    }
}
