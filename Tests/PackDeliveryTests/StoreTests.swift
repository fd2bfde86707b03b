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
    /// A new store holding one open transaction ("t-1") of one waiting download ("d-1"), owned by `owner`.
    static func oneDownload(_ label: String, owner: QueueOwner = .new()) throws -> (store: Store, download: Download) {
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
        try store.insert([transaction], owner: owner) { _ in "/work/downloads/d-1.pack" }
        return (store, download)
    }

    static func installing(_ label: String) throws -> (store: Store, machine: DownloadMachine) {
        let (store, download) = try Self.oneDownload(label)
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

    /// zlib's CRC-32 of every file and symlink (of its target text) under `folder`, by relative path.
    static func zlibCRCs(_ folder: URL) throws -> [String: UInt32] {
        let run = try Fixtures.run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import json, os, sys, zlib
                root, crcs = sys.argv[1], {}
                for folder, _, names in os.walk(root):
                    for name in names:
                        path = os.path.join(folder, name)
                        data = os.readlink(path).encode() if os.path.islink(path) else open(path, "rb").read()
                        crcs[os.path.relpath(path, root)] = zlib.crc32(data)
                print(json.dumps(crcs))
                """, folder.path,
            ], timeout: 60)
        guard run.status == 0 else { throw FixtureError("python3: \(run.stderr)") }
        return try JSONDecoder().decode([String: UInt32].self, from: Data(run.stdout.utf8))
    }

    /// What the store records of each installed product's files, by product.
    static func recordedFiles(_ home: Home) throws -> [String: [InstalledFileRecord]] {
        let store = try Store(url: home.databaseURL)
        defer { store.close() }
        var files: [String: [InstalledFileRecord]] = [:]
        for install in try store.installs() { files[install.productIdentifier] = try store.files(of: install) }
        return files
    }

    /// Each recorded file of the zip pack has zlib's CRC-32 of its bytes; the tar packs' files have none.
    static func expectCRCs(_ home: Home, products: [String], zip: String) throws {
        let recorded = try Self.recordedFiles(home)
        #expect(Set(recorded.keys) == Set(products))
        for (product, files) in recorded {
            #expect(!files.isEmpty, "\(product) has recorded files")
            if product == zip {
                let crcs = try Self.zlibCRCs(home.cachesFolder.appending(path: product))
                for file in files {
                    #expect(file.crc32 != nil && file.crc32 == crcs[file.path], "\(product) \(file.path): \(file.crc32 ?? 0)")
                }
            } else {
                #expect(files.allSatisfy { $0.crc32 == nil }, "\(product) is a tar: \(files.map(\.crc32))")
            }
        }
    }

    static let sampleProducts = ["com.example.atlas", "com.example.forest", "com.example.ocean"]

    @Test func aZipPacksFilesAreRecordedWithTheirCRC32AndATarPacksWithout() async throws {
        // atlas is a zip, forest a tar.gz, ocean a tar.xz.
        let site = try TestSite.samples("crc-site")
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString
        // packs fetch: the zip is unpacked while it downloads, then adopted by its central directory.
        let streamed = try Fixtures.temporaryDirectory("crc-streamed-home")
        let fetch = try CLI.run(home: streamed, ["fetch", manifestURL] + Self.sampleProducts)
        #expect(fetch.status == 0, "\(fetch.stderr)")
        try Self.expectCRCs(Home(folder: streamed), products: Self.sampleProducts, zip: "com.example.atlas")
        // Without streaming, the whole pack is unpacked after the download.
        let home = Home(folder: try Fixtures.temporaryDirectory("crc-whole-home"))
        var configuration = DownloadQueue.Configuration()
        configuration.streamingUnpack = false
        let queue = try DownloadQueue(home: home, configuration: configuration)
        let manifest = try await LoadedManifest.load(manifestURL)
        let id = try await #require(try queue.add(product: "com.example.atlas", from: manifest).downloads.first?.id)
        let finished = try #require(await waitFor(queue, id) { !$0.state.isRunning })
        await queue.close()
        #expect(finished.state == .finished, "\(finished)")
        try Self.expectCRCs(home, products: ["com.example.atlas"], zip: "com.example.atlas")
    }

    @Test func aHomeFromBeforeCRCsKeepsItsRecordsReadable() throws {
        let site = try TestSite.samples("crc-migrate-site")
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let folder = try Fixtures.temporaryDirectory("crc-migrate-home")
        let fetch = try CLI.run(
            home: folder, ["fetch", nginx.baseURL.appending(path: "manifest.json").absoluteString, "com.example.atlas"])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        // The home as the release before CRC-32s left it: no crc32 column, and an error kept as its encoder wrote it.
        let legacy = try Fixtures.run(
            "/usr/bin/python3",
            [
                "-c",
                """
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("ALTER TABLE installedFiles DROP COLUMN crc32")
                db.execute("DELETE FROM grdb_migrations WHERE identifier LIKE 'v7:%'")
                db.execute(\"\"\"UPDATE downloads SET error = '{"message":"The server said 404.","kind":"network","code":"httpStatus","httpStatus":404}'\"\"\")
                db.commit()
                """, folder.appending(path: "state.sqlite").path,
            ], timeout: 30)
        #expect(legacy.status == 0, "\(legacy.stderr)")
        let verify = try CLI.run(home: folder, ["verify"])
        #expect(verify.status == 0 && verify.stdout.contains("intact com.example.atlas"), "\(verify.stdout) \(verify.stderr)")
        let files = try #require(try Self.recordedFiles(Home(folder: folder))["com.example.atlas"])
        #expect(!files.isEmpty && files.allSatisfy { $0.crc32 == nil }, "installed before CRC-32s were recorded")
        let store = try Store(url: Home(folder: folder).databaseURL)
        defer { store.close() }
        let row = try #require(try store.read { db in try DownloadRecord.fetchOne(db) })
        #expect(row.error?.value == PackDeliveryError(.httpStatus, message: "The server said 404.", httpStatus: 404))
    }

    /// Requests between processes are typed: each one written is read back as itself, the texts earlier versions
    /// wrote are read as before, and a text this version does not know comes back as an error (the owner logs it)
    /// instead of being dropped; either way the request is taken once.
    @Test func requestsOfOtherProcessesAreReadBackTypedAndAnUnknownOneIsAnError() throws {
        let owner = QueueOwner.new()
        let (store, _) = try Self.oneDownload("store-requests", owner: owner)
        defer { store.close() }
        let all: [ControlRequest] = [.pause, .cancel, .resume, .allowMetered] + DownloadPriority.allCases.map { .priority($0) }
        for request in all {
            try store.setRequest(request, for: "d-1")
            let taken = try store.takeRequests(owner: owner)
            #expect(taken.count == 1 && taken.first?.id == "d-1")
            #expect(try taken.first?.request.get() == request)
            #expect(try store.takeRequests(owner: owner).isEmpty, "a request is taken once")
        }
        // The texts earlier versions wrote.
        #expect(try ControlRequest(stored: "priority:prefetch") == .priority(.prefetch))
        #expect(try ControlRequest(stored: "allowMetered") == .allowMetered)
        // One a newer version might write.
        try store.write { db in try db.execute(sql: "UPDATE downloads SET request = 'throttle:5' WHERE id = 'd-1'") }
        let taken = try store.takeRequests(owner: owner)
        #expect(taken.count == 1)
        #expect(throws: PackDeliveryError.self) { try taken.first?.request.get() }
        if case .failure(let error) = taken.first?.request { #expect(error.code == .database && error.message.contains("throttle:5")) }
        #expect(try store.takeRequests(owner: owner).isEmpty)
        // As JSON (Codable), a request is its stored text.
        let json = try JSONEncoder().encode([ControlRequest.priority(.userInitiated)])
        #expect(String(decoding: json, as: UTF8.self) == #"["priority:userInitiated"]"#)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode([ControlRequest].self, from: Data(#"["nope"]"#.utf8)) }
    }

    /// Each record's `Columns` names every column of its table, so a query never spells a column by hand.
    @Test func columnsNameEveryColumnOfTheirTable() throws {
        let folder = try Fixtures.temporaryDirectory("store-columns")
        let store = try Store(url: folder.appending(path: "state.sqlite"))
        defer { store.close() }
        let tables = try store.read { db in
            try ["transactions", "downloads", "installs", "installedFiles"].map { table in Set(try db.columns(in: table).map(\.name)) }
        }
        #expect(tables[0] == Set(TransactionRecord.Columns.allCases.map(\.name)))
        #expect(tables[1] == Set(DownloadRecord.Columns.allCases.map(\.name)))
        #expect(tables[2] == Set(InstallRecord.Columns.allCases.map(\.name)))
        #expect(tables[3] == Set(InstalledFileRecord.Columns.allCases.map(\.name)))
    }

    /// The enum values the queries write into SQL are the ones the schema's partial index names, so SQLite still
    /// uses the index for the downloads not settled (a catalog of 10,000 finished downloads is not scanned).
    @Test func unsettledDownloadsAreFoundThroughThePartialIndex() throws {
        let folder = try Fixtures.temporaryDirectory("store-unsettled")
        let store = try Store(url: folder.appending(path: "state.sqlite"))
        defer { store.close() }
        let plan = try store.read { db in
            try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN SELECT id FROM downloads WHERE \(DownloadRecord.unsettled)").map {
                $0["detail"] as String
            }
        }
        #expect(plan.contains { $0.contains("downloads_unsettled") }, "\(plan)")
        #expect(DownloadRecord.unsettled == "state NOT IN ('finished', 'cancelled')")
    }

    /// Recording with `joining`: a transaction of a product already delivered joins the open delivery, whether that
    /// was recorded before or earlier in the same write; transactions of other products are recorded. (The open
    /// products are read once per write, not once per transaction: a whole catalog is recorded in linear time.)
    @Test func aDeliveryRecordedBeforeOrEarlierInTheSameWriteIsJoined() throws {
        // A live queue's owner: what it runs is a delivery others join.
        let owner = QueueOwner.new()
        QueueOwner.register(owner)
        defer { QueueOwner.unregister(owner) }
        let (store, first) = try Self.oneDownload("store-join", owner: owner)
        defer { store.close() }
        func transaction(_ id: String, product: String) -> Transaction {
            var download = first
            (download.id, download.transactionID, download.productIdentifier, download.contentIdentifier) = ("d\(id)", id, product, product)
            return Transaction(
                id: id, productIdentifier: product, kind: .purchased, createdAt: Date(), finishedAt: nil, autoFinish: false,
                downloads: [download])
        }
        let batch = [
            transaction("t-2", product: "p"), transaction("t-3", product: "q"), transaction("t-4", product: "q"),
            transaction("t-5", product: "r"),
        ]
        let joined = try store.insert(batch, owner: owner, joining: true) { "/work/downloads/\($0.id).pack" }
        #expect(joined == ["t-2": "t-1", "t-4": "t-3"])
        #expect(Set(try store.transactions().map(\.id)) == ["t-1", "t-3", "t-5"])
        let unjoined = try store.insert([transaction("t-6", product: "q")], owner: owner) { "/work/downloads/\($0.id).pack" }
        #expect(unjoined.isEmpty)
        #expect(Set(try store.transactions().map(\.id)) == ["t-1", "t-3", "t-5", "t-6"])
    }
}
