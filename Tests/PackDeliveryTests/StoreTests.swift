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
}
