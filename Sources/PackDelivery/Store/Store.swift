import Foundation
import GRDB

/// The persistent record: transactions, downloads and installed content, in SQLite (WAL) through GRDB.
///
/// Several processes may open the same store; SQLite serialises their writes and each logical change
/// is one write transaction.
final class Store: Sendable {
    let pool: DatabasePool
    /// Space set aside beside the database (`state.reserve`), given back when the disk is full so that
    /// the state change that reports it (paused, insufficientStorage) can still be written.
    let reserveURL: URL
    static let reserveSize: Int64 = 2 << 20

    init(url: URL) throws(PackDeliveryError) {
        self.reserveURL = url.deletingLastPathComponent().appending(path: "state.reserve")
        Self.makeReserve(self.reserveURL)
        var configuration = Configuration()
        configuration.busyMode = .timeout(15)
        configuration.label = "PackDelivery"
        // Processes opening a new store at the same moment would race to switch it to WAL and to
        // migrate it (SQLITE_BUSY, "table already exists"): opening is serialised by a file lock.
        let lock = open(url.path + ".open-lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        if lock >= 0 { flock(lock, LOCK_EX) }
        defer { if lock >= 0 { close(lock) } }
        do {
            self.pool = try DatabasePool(path: url.path, configuration: configuration)
            try Self.migrator.migrate(self.pool)
        } catch {
            throw Self.map(error, url.path)
        }
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: transactions, downloads, installed content") { db in
            try db.create(table: "transactions") { t in
                t.primaryKey("id", .text)
                t.column("productIdentifier", .text).notNull()
                t.column("kind", .text).notNull()
                t.column("createdAt", .datetime).notNull()
                t.column("finishedAt", .datetime)
                t.column("autoFinish", .boolean).notNull().defaults(to: false)
            }
            try db.create(table: "downloads") { t in
                t.primaryKey("id", .text)
                t.column("transactionID", .text).notNull().indexed().references("transactions", onDelete: .cascade)
                t.column("position", .integer).notNull()
                t.column("productIdentifier", .text).notNull()
                t.column("contentIdentifier", .text).notNull()
                t.column("contentVersion", .text).notNull()
                t.column("contentLength", .integer).notNull()
                t.column("state", .text).notNull()
                t.column("phase", .text)
                t.column("progress", .double).notNull()
                t.column("pauseReason", .text)
                t.column("contentURL", .text)
                t.column("error", .text)
                t.column("url", .text).notNull()
                t.column("sha256", .text).notNull()
                t.column("unpackedLength", .integer)
                t.column("destination", .text).notNull()
                t.column("bytesReceived", .integer).notNull()
                t.column("validator", .text)
                t.column("partialPath", .text)
                t.column("stagingInode", .integer)
                t.column("retriedFromZero", .boolean).notNull().defaults(to: false)
                t.column("verified", .boolean).notNull().defaults(to: false)
                t.column("request", .text)
            }
            try db.create(table: "installedContent") { t in
                t.primaryKey("contentIdentifier", .text)
                t.column("productIdentifier", .text).notNull().indexed()
                t.column("contentVersion", .text).notNull()
                t.column("contentURL", .text).notNull()
                t.column("destination", .text).notNull()
                t.column("installedAt", .datetime).notNull()
                t.column("downloadID", .text).notNull()
            }
        }
        return migrator
    }

    func read<T>(_ body: (Database) throws -> T) throws(PackDeliveryError) -> T {
        do { return try self.pool.read(body) } catch { throw Self.map(error, self.pool.path) }
    }

    func write<T>(_ body: (Database) throws -> T) throws(PackDeliveryError) -> T {
        do { return try self.pool.write(body) } catch let error as DatabaseError where error.resultCode == .SQLITE_FULL {
            // Give back the reserve and try once more; the failed write changed nothing.
            guard unlink(self.reserveURL.path) == 0 else { throw Self.map(error, self.pool.path) }
            do { return try self.pool.write(body) } catch { throw Self.map(error, self.pool.path) }
        } catch {
            throw Self.map(error, self.pool.path)
        }
    }

    /// Sets the reserve aside when it is missing and there is room; best effort.
    static func makeReserve(_ url: URL) {
        guard access(url.path, F_OK) != 0 else { return }
        let fd = open(url.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let result = posix_fallocate(fd, 0, off_t(Self.reserveSize))
        close(fd)
        if result != 0 { unlink(url.path) }
    }

    /// SQLite's disk-full becomes `insufficientStorage`; committed state is untouched by a failed write.
    static func map(_ error: any Error, _ path: String) -> PackDeliveryError {
        if let error = error as? PackDeliveryError { return error }
        if let error = error as? DatabaseError {
            if error.resultCode == .SQLITE_FULL {
                return .insufficientStorage(path: path, needed: nil, available: nil, errno: ENOSPC)
            }
            let code: PackDeliveryError.Code = switch error.resultCode {
            case .SQLITE_BUSY, .SQLITE_LOCKED: .databaseBusy
            case .SQLITE_CORRUPT, .SQLITE_NOTADB: .databaseCorrupt
            default: .database
            }
            return PackDeliveryError(code, message: "The state database \(path) failed: \(error.message ?? "\(error.resultCode)").",
                                     hint: code == .databaseBusy ? "Another process held it locked for too long; try again." : "Check the home folder's permissions and free space.",
                                     subject: path, underlying: .init(.sqlite, Int(error.extendedResultCode.rawValue)))
        }
        return PackDeliveryError(.database, message: "The state database \(path) failed: \(error).", subject: path)
    }

    // MARK: Queries

    func transactions(unfinishedOnly: Bool = true, ids: [String]? = nil) throws(PackDeliveryError) -> [Transaction] {
        try self.read { db in
            var request = TransactionRecord.order(TransactionRecord.Columns.createdAt, TransactionRecord.Columns.id)
            if unfinishedOnly { request = request.filter(TransactionRecord.Columns.finishedAt == nil) }
            if let ids { request = request.filter(ids.contains(TransactionRecord.Columns.id)) }
            return try request.fetchAll(db).map { record in
                let downloads = try DownloadRecord.filter(DownloadRecord.Columns.transactionID == record.id)
                    .order(DownloadRecord.Columns.position).fetchAll(db).map(\.download)
                return Transaction(id: record.id, productIdentifier: record.productIdentifier, kind: record.kind,
                                   createdAt: record.createdAt, finishedAt: record.finishedAt, autoFinish: record.autoFinish,
                                   downloads: downloads)
            }
        }
    }

    func downloadRecord(_ id: String) throws(PackDeliveryError) -> DownloadRecord? {
        try self.read { db in try DownloadRecord.fetchOne(db, key: id) }
    }

    func installed(productIdentifier: String? = nil) throws(PackDeliveryError) -> [InstalledContentRecord] {
        try self.read { db in
            var request = InstalledContentRecord.order(InstalledContentRecord.Columns.productIdentifier, InstalledContentRecord.Columns.contentIdentifier)
            if let productIdentifier { request = request.filter(InstalledContentRecord.Columns.productIdentifier == productIdentifier) }
            return try request.fetchAll(db)
        }
    }

    /// Pause or cancel requests other processes left for these downloads.
    func requests(for ids: [String]) throws(PackDeliveryError) -> [String: String] {
        guard !ids.isEmpty else { return [:] }
        return try self.read { db in
            let rows = try DownloadRecord.filter(ids.contains(DownloadRecord.Columns.id) && DownloadRecord.Columns.request != nil).fetchAll(db)
            return Dictionary(uniqueKeysWithValues: rows.compactMap { row in row.request.map { (row.id, $0) } })
        }
    }

    func setRequest(_ request: String?, for id: String) throws(PackDeliveryError) {
        try self.write { db in
            try db.execute(sql: "UPDATE downloads SET request = ? WHERE id = ?", arguments: [request, id])
        }
    }
}

extension DownloadRecord {
    /// Every column but `request`, which other processes write.
    static let ownColumns: [String] = [
        "state", "phase", "progress", "pauseReason", "contentURL", "error", "bytesReceived",
        "validator", "partialPath", "stagingInode", "retriedFromZero", "verified", "url", "sha256", "contentLength", "unpackedLength",
    ]
}
