import Foundation
import GRDB
import Synchronization

/// The persistent record: transactions, downloads and installed content, in SQLite (WAL) through GRDB.
///
/// Several processes may open the same store; SQLite serialises their writes and each logical change
/// is one write transaction.
///
/// Durability: the connection runs with `synchronous = NORMAL`, so routine commits (progress
/// checkpoints, state changes) are atomic and survive a crash of the process, but a power cut may undo
/// the last ones. The commits that report something as done — a new transaction, an install, a
/// finished transaction — go through ``write(durable:_:)`` with `durable: true`, which runs them with
/// `synchronous = FULL`: SQLite syncs the WAL before the commit returns, and with it every earlier commit.
final class Store: Sendable {
    let pool: DatabasePool
    /// Set by ``close()``: every later read or write throws `queueClosed` (the store closes with its queue).
    private let closed = Atomic<Bool>(false)
    /// Space set aside beside the database (`state.reserve`), given back when the disk is full so that
    /// the state change that reports it (paused, insufficientStorage) can still be written.
    let reserveURL: URL
    static let reserveSize: Int64 = 2 << 20

    /// Opens (or creates) the store and checks it.
    ///
    /// - Parameters:
    ///   - url: the database file.
    ///   - busyTimeout: how long to wait for another process's write lock before failing with `databaseBusy`.
    /// - Throws: `databaseCorrupt` when the file is damaged (see ``quarantine(_:)``); other database or file errors.
    init(url: URL, busyTimeout: TimeInterval = 15) throws(PackDeliveryError) {
        Self.loadDateFormatting
        self.reserveURL = url.deletingLastPathComponent().appending(path: "state.reserve")
        Self.makeReserve(self.reserveURL)
        var configuration = Configuration()
        configuration.busyMode = .timeout(busyTimeout)
        configuration.label = "PackDelivery"
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // SQLite's default page cache is 2 MiB for each connection, and a pool has a writer and up to 5 readers:
            // an agent serving 10 homes held 31 MiB of them (case 19 of the benchmark). The writer keeps 1 MiB for the
            // large transactions of a catalog; a reader's scans read through the kernel's page cache.
            try db.execute(sql: "PRAGMA cache_size = \(db.configuration.readonly ? -128 : -1024)")
        }
        // Processes opening a new store at the same moment would race to switch it to WAL and to
        // migrate it (SQLITE_BUSY, "table already exists"): opening is serialised by a file lock.
        let lock = open(url.path + ".open-lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard lock >= 0 else { throw .io("open", path: url.path + ".open-lock", errno: errno) }
        flock(lock, LOCK_EX)
        defer { Glibc.close(lock) }
        do {
            self.pool = try DatabasePool(path: url.path, configuration: configuration)
            // A damaged file (garbage, truncated) may open and fail only on a later read: check it now.
            let check = try self.pool.read { db in try String.fetchOne(db, sql: "PRAGMA quick_check(1)") }
            if let check, check != "ok" {
                throw DatabaseError(resultCode: .SQLITE_CORRUPT, message: check)
            }
            try Self.migrator.migrate(self.pool)
        } catch {
            throw Self.map(error, url.path)
        }
    }

    /// Closes the database: the WAL is checkpointed and removed when no other process has it open. Later calls fail.
    func close() {
        self.closed.store(true, ordering: .sequentiallyConsistent)
        // Readers first: GRDB closes the writer first, and the writer folds the WAL back and deletes it only when
        // no other connection holds the file (GRDB issue #739). releaseMemory closes every reader connection.
        self.pool.releaseMemory()
        try? self.pool.close()
    }

    /// Moves a damaged database (and its WAL and shared-memory files) aside, so a new one can be made.
    ///
    /// - Parameter url: the database file.
    /// - Returns: where the damaged file now is.
    /// - Throws: `fileSystem` when it cannot be moved.
    static func quarantine(_ url: URL) throws(PackDeliveryError) -> URL {
        let stamp = Int(Date().timeIntervalSince1970)
        let aside = url.deletingLastPathComponent().appending(path: "\(url.lastPathComponent).damaged-\(stamp)")
        for suffix in ["", "-wal", "-shm"] {
            let from = url.path + suffix
            guard access(from, F_OK) == 0 else { continue }
            if rename(from, aside.path + suffix) != 0 { throw .io("move the damaged state database aside", path: from, errno: errno) }
        }
        try? Durability.syncFolder(url.deletingLastPathComponent())
        return aside
    }

    /// GRDB stores dates through a Foundation `DateFormatter`, which loads ICU's data at its first use, and
    /// Foundation traps (SIGILL) when that load fails for want of a descriptor — as it did when a catalog's
    /// transfers had taken every descriptor before the first transaction was recorded (`ulimit -n 16`). So the
    /// formatter is used once when the first store opens, while descriptors are free.
    private static let loadDateFormatting: Void = {
        _ = Date.fromDatabaseValue(Date().databaseValue)
    }()

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
        migrator.registerMigration("v2: owners instead of lock files, installs by path, installed files") { db in
            try db.alter(table: "downloads") { t in
                t.add(column: "ownerPID", .integer)
                t.add(column: "ownerStart", .integer)
                t.add(column: "ownerQueue", .text)
            }
            // Pause and cancel requests from other processes, found without scanning every download.
            try db.execute(sql: "CREATE INDEX downloads_request ON downloads(request) WHERE request IS NOT NULL")
            // Downloads that may need a runner at launch.
            try db.execute(sql: "CREATE INDEX downloads_unsettled ON downloads(state) WHERE state NOT IN ('finished', 'cancelled')")
            try db.create(index: "transactions_open", on: "transactions", columns: ["finishedAt"])
            try db.create(table: "installs") { t in
                t.column("destination", .text).notNull()
                t.column("contentIdentifier", .text).notNull()
                t.column("productIdentifier", .text).notNull().indexed()
                t.column("contentVersion", .text).notNull()
                t.column("contentURL", .text).notNull()
                t.column("installedAt", .datetime).notNull().indexed()
                t.column("downloadID", .text).notNull()
                t.column("fileCount", .integer).notNull()
                t.column("byteCount", .integer).notNull()
                t.primaryKey(["destination", "contentIdentifier"])
            }
            // Who owns a content identifier, in any destination: asked at every install.
            try db.create(index: "installs_contentIdentifier", on: "installs", columns: ["contentIdentifier"])
            try db.execute(
                sql: """
                    INSERT INTO installs (destination, contentIdentifier, productIdentifier, contentVersion, contentURL, installedAt, downloadID, fileCount, byteCount)
                    SELECT destination, contentIdentifier, productIdentifier, contentVersion, contentURL, installedAt, downloadID, -1, 0 FROM installedContent
                    """)
            try db.drop(table: "installedContent")
            try db.create(table: "installedFiles", options: .withoutRowID) { t in
                t.column("destination", .text).notNull()
                t.column("contentIdentifier", .text).notNull()
                t.column("path", .text).notNull()
                t.column("kind", .text).notNull()
                t.column("size", .integer).notNull()
                t.column("sha256", .text).notNull()
                t.primaryKey(["destination", "contentIdentifier", "path"])
            }
        }
        migrator.registerMigration("v3: trusted manifest publishers and the last version accepted from each") { db in
            try db.create(table: "trustedPublishers") { t in
                t.primaryKey("id", .text)
                t.column("pem", .text).notNull()
            }
            try db.create(table: "manifestVersions") { t in
                t.primaryKey("keyID", .text)
                t.column("version", .integer).notNull()
            }
        }
        migrator.registerMigration("v4: where a transaction's manifest came from, and the receipt it was bought with") { db in
            try db.create(table: "transactionAccess") { t in
                t.primaryKey("transactionID", .text).references("transactions", onDelete: .cascade)
                t.column("manifestURL", .text)
                t.column("receipt", .text)
            }
        }
        migrator.registerMigration("v5: the pack index a download may update from (delta updates)") { db in
            try db.alter(table: "downloads") { t in t.add(column: "indexReference", .text) }
        }
        migrator.registerMigration("v6: rollback marks per publisher and scope, with the SHA-256 of the manifest accepted") { db in
            try db.create(table: "manifestMarks") { t in
                t.column("keyID", .text).notNull()
                // The manifest's scope; "" for manifests without one, which share one mark per publisher.
                t.column("scope", .text).notNull()
                t.column("version", .integer).notNull()
                // Of the accepted manifest's bytes; NULL for a mark kept before, whose bytes were not.
                t.column("sha256", .text)
                t.primaryKey(["keyID", "scope"])
            }
            // Before scopes every manifest of a publisher counted against one mark: those manifests had no scope.
            try db.execute(
                sql: "INSERT INTO manifestMarks (keyID, scope, version, sha256) SELECT keyID, '', version, NULL FROM manifestVersions")
            try db.drop(table: "manifestVersions")
        }
        migrator.registerMigration("v7: the CRC-32 of installed files") { db in
            // NULL for the files of installs recorded before, and for those of packs that are not zips.
            try db.alter(table: "installedFiles") { t in t.add(column: "crc32", .integer) }
        }
        migrator.registerMigration("v8: download priorities") { db in
            // NULL for the downloads recorded before: essential, as every download was.
            try db.alter(table: "downloads") { t in t.add(column: "priority", .text) }
        }
        migrator.registerMigration("v9: delivery policies and metered pauses") { db in
            // NULL for the downloads recorded before: essential, as every pack was.
            try db.alter(table: "downloads") { t in t.add(column: "delivery", .text) }
            // ensureAvailable finds a pack's download by its content identifier, and a product's packs by product.
            try db.create(index: "downloads_contentIdentifier", on: "downloads", columns: ["contentIdentifier"])
            try db.create(index: "downloads_productIdentifier", on: "downloads", columns: ["productIdentifier"])
        }
        migrator.registerMigration("v10: leases, last use and evictions") { db in
            // NULL until the content is first used: its install time counts.
            try db.alter(table: "installs") { t in t.add(column: "lastUsedAt", .datetime) }
            // One row per product (or pack of it) a lease covers; the owner is a process (pid and start time).
            try db.create(table: "leases") { t in
                t.column("token", .text).notNull().indexed()
                t.column("productIdentifier", .text).notNull()
                // NULL: every pack of the product.
                t.column("contentIdentifier", .text)
                t.column("ownerPID", .integer).notNull()
                t.column("ownerStart", .integer).notNull()
                t.column("createdAt", .datetime).notNull()
            }
            // Packs evicted from the caches: known, not installed; removed when the pack is installed again.
            try db.create(table: "evictions") { t in
                t.column("destination", .text).notNull()
                t.column("contentIdentifier", .text).notNull()
                t.column("productIdentifier", .text).notNull().indexed()
                t.column("contentVersion", .text).notNull()
                t.column("byteCount", .integer).notNull()
                t.column("evictedAt", .datetime).notNull()
                t.column("downloadID", .text).notNull()
                t.primaryKey(["destination", "contentIdentifier"])
            }
            // A pack's preservation priority, from its manifest or the API: lower goes first.
            try db.create(table: "preservationPriorities") { t in
                t.primaryKey("contentIdentifier", .text)
                t.column("priority", .integer).notNull()
            }
            // The home's settings (cache budget).
            try db.create(table: "settings") { t in
                t.primaryKey("key", .text)
                t.column("value", .text).notNull()
            }
        }
        migrator.registerMigration("v11: sources and their measured throughput per home") { db in
            // NULL for a pack with one source (its url), as every download recorded before had.
            try db.alter(table: "downloads") { t in t.add(column: "sources", .text) }
            // What each source (scheme, host and port) delivered lately, decayed with time: the fastest is tried first.
            try db.create(table: "sourceStats") { t in
                t.primaryKey("origin", .text)
                t.column("bytesPerSecond", .double)
                t.column("failures", .double).notNull().defaults(to: 0)
                t.column("updatedAt", .datetime).notNull()
            }
        }
        migrator.registerMigration("v12: the scope pinned for a publisher's signed manifests at each URL") { db in
            // A replayed older manifest signed for another scope would count against another mark: the scope of a
            // publisher's manifests at a URL is the one first accepted there.
            try db.create(table: "manifestScopes") { t in
                t.column("url", .text).notNull()
                t.column("keyID", .text).notNull()
                t.column("scope", .text).notNull()
                t.primaryKey(["url", "keyID"])
            }
        }
        migrator.registerMigration("v13: preload release dates") { db in
            // NULL for the downloads recorded before, and for every pack that is not a preload.
            try db.alter(table: "downloads") { t in t.add(column: "releaseDate", .datetime) }
        }
        return migrator
    }

    /// Throws `queueClosed` once the store was closed, rather than the database's "connection is closed".
    func requireOpen() throws(PackDeliveryError) {
        if self.closed.load(ordering: .sequentiallyConsistent) {
            throw PackDeliveryError(
                .queueClosed, message: "The download queue was closed.", hint: "Open a new DownloadQueue on the same home.")
        }
    }

    func read<T>(_ body: (Database) throws -> T) throws(PackDeliveryError) -> T {
        try self.requireOpen()
        do { return try self.pool.read(body) } catch { throw Self.map(error, self.pool.path) }
    }

    /// One write transaction.
    ///
    /// - Parameters:
    ///   - durable: sync the WAL before returning (`synchronous = FULL` for this commit), for commits that report something as done.
    ///   - body: the changes.
    func write<T>(durable: Bool = false, _ body: (Database) throws -> T) throws(PackDeliveryError) -> T {
        try self.requireOpen()
        func attempt() throws -> T {
            guard durable else { return try self.pool.write(body) }
            return try self.pool.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA synchronous = FULL")
                defer { try? db.execute(sql: "PRAGMA synchronous = NORMAL") }
                var result: T?
                try db.inTransaction(.immediate) {
                    result = try body(db)
                    return .commit
                }
                return result!
            }
        }
        do { return try attempt() } catch let error as DatabaseError where error.resultCode == .SQLITE_FULL {
            // Give back the reserve and try once more; the failed write changed nothing.
            guard unlink(self.reserveURL.path) == 0 else { throw Self.map(error, self.pool.path) }
            do { return try attempt() } catch { throw Self.map(error, self.pool.path) }
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
        Glibc.close(fd)
        if result != 0 { unlink(url.path) }
    }

    /// SQLite's disk-full becomes `insufficientStorage`; committed state is untouched by a failed write.
    static func map(_ error: any Error, _ path: String) -> PackDeliveryError {
        if let error = error as? PackDeliveryError { return error }
        if let error = error as? DatabaseError {
            if error.resultCode == .SQLITE_FULL {
                return .insufficientStorage(path: path, needed: nil, available: nil, errno: ENOSPC)
            }
            if error.resultCode == .SQLITE_CANTOPEN, Descriptors.exhausted {
                return .io("open the state database", path: path, errno: EMFILE)
            }
            let code: PackDeliveryError.Code =
                switch error.resultCode {
                case .SQLITE_BUSY, .SQLITE_LOCKED: .databaseBusy
                case .SQLITE_CORRUPT, .SQLITE_NOTADB: .databaseCorrupt
                default: .database
                }
            return PackDeliveryError(
                code, message: "The state database \(path) failed: \(error.message ?? "\(error.resultCode)").",
                hint: code == .databaseBusy
                    ? "Another process held it locked for too long; try again." : "Check the home folder's permissions and free space.",
                subject: path, underlying: .init(.sqlite, Int(error.extendedResultCode.rawValue)))
        }
        return PackDeliveryError(.database, message: "The state database \(path) failed: \(error).", subject: path)
    }

}

extension DownloadRecord {
    /// The columns the queue's driver saves: not `request` (other processes write it), not the owner, and not
    /// `stagingInode`, the journal of a move into place, which only the installer writes.
    static let ownColumns: [Columns] = [
        .state, .phase, .progress, .pauseReason, .contentURL, .error, .bytesReceived, .validator, .partialPath, .retriedFromZero,
        .verified, .url, .sha256, .contentLength, .unpackedLength, .priority,
    ]

    /// Saves ``ownColumns`` of one row (arguments: those columns, then the id and the finished state), unless the
    /// row is finished: a finished row is written once, with its install (``Store/commitInstall(_:files:download:)``).
    static let saveSQL =
        "UPDATE downloads SET " + ownColumns.map { "\"\($0.name)\" = ?" }.joined(separator: ", ") + " WHERE id = ? AND state <> ?"
}
