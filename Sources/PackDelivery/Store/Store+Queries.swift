import Foundation
import GRDB

extension Store {
    // MARK: Transactions and downloads

    /// Records new transactions with their downloads in one durable write, owned by `owner` where `owned` says so.
    /// `manifestURL` and `receipt`, when given, are recorded for each transaction (``TransactionAccessRecord``).
    ///
    /// With `joining`, a transaction that would deliver what an open one already delivers
    /// (``openDelivery(like:adoptingRestores:in:)``, read under the write lock, so two processes adding it at once record
    /// it once) is not recorded.
    /// - Returns: the transactions not recorded, by id, with the id of the open one each joins.
    @discardableResult
    func insert(
        _ transactions: [Transaction], owner: QueueOwner, manifestURL: URL? = nil, receipt: String? = nil, joining: Bool = false,
        adoptingRestores: Bool = false, partialPath: (Download) -> String
    ) throws(PackDeliveryError) -> [String: String] {
        try self.write(durable: true) { db in
            var joined: [String: String] = [:]
            // The products with an open transaction, read once: a product with none (recorded before, or earlier in
            // this write) has no open delivery to join, and is not looked for one by one (each look reads every open
            // transaction: one per product of a whole catalog made recording it quadratic).
            var openProducts: Set<String> = []
            if joining, transactions.contains(where: { $0.downloads.contains(where: \.state.isRunning) }) {
                openProducts = Set(
                    try String.fetchAll(db, sql: "SELECT DISTINCT productIdentifier FROM transactions WHERE finishedAt IS NULL"))
            }
            for transaction in transactions {
                if joining, transaction.downloads.contains(where: \.state.isRunning),
                    openProducts.contains(transaction.productIdentifier),
                    let open = try Self.openDelivery(like: transaction, adoptingRestores: adoptingRestores, in: db)
                {
                    joined[transaction.id] = open
                    continue
                }
                openProducts.insert(transaction.productIdentifier)
                try TransactionRecord(
                    id: transaction.id, productIdentifier: transaction.productIdentifier, kind: transaction.kind,
                    createdAt: transaction.createdAt, finishedAt: nil, autoFinish: transaction.autoFinish
                ).insert(db)
                if manifestURL != nil || receipt != nil {
                    try TransactionAccessRecord(transactionID: transaction.id, manifestURL: manifestURL?.absoluteString, receipt: receipt)
                        .insert(db)
                }
                for (position, download) in transaction.downloads.enumerated() {
                    var record = DownloadRecord(
                        download, position: position, validator: nil, partialPath: partialPath(download),
                        stagingInode: nil, retriedFromZero: false, verified: false)
                    // Only what this queue runs now is owned; a download not started waits for whoever starts it.
                    if download.state.isRunning {
                        (record.ownerPID, record.ownerStart, record.ownerQueue) = (owner.pid, owner.start, owner.queue)
                    }
                    try record.insert(db)
                }
            }
            return joined
        }
    }

    /// The open transaction delivering the packs `transaction` would (its product, the same content identifiers and
    /// versions, into the same destination, none cancelled), with a download not yet settled that a live queue runs;
    /// with `adoptingRestores`, also a restore nobody runs (its unsettled downloads left running by a dead process or
    /// paused `interrupted`, as a launch's repair leaves them in a process that does not resume), to take over; and a
    /// preload nobody runs that waits for its key (``PauseReason/awaitingRelease``), to take over and ask for the key.
    static func openDelivery(like transaction: Transaction, adoptingRestores: Bool, in db: Database) throws -> String? {
        let wanted = Set(transaction.downloads.map { "\($0.contentIdentifier)\u{0}\($0.contentVersion)" })
        let destinations = Set(transaction.downloads.map(\.destination))
        let rows = try Row.fetchAll(
            db, sql: "SELECT id, kind FROM transactions WHERE productIdentifier = ? AND finishedAt IS NULL ORDER BY createdAt, id",
            arguments: [transaction.productIdentifier])
        for row in rows {
            let id: String = row["id"]
            let downloads = try DownloadRecord.fetchAll(db, sql: "SELECT * FROM downloads WHERE transactionID = ?", arguments: [id])
            guard downloads.allSatisfy({ destinations == [$0.destination] && $0.state != .cancelled }),
                Set(downloads.map { "\($0.contentIdentifier)\u{0}\($0.contentVersion)" }) == wanted
            else { continue }
            let unsettled = downloads.filter { !$0.state.isSettled }
            if unsettled.contains(where: { $0.owner?.isAlive ?? false }) { return id }
            let idle = unsettled.allSatisfy {
                ($0.owner.map { !$0.isAlive } ?? true)
                    && ($0.state.isRunning || $0.pauseReason == .interrupted || $0.pauseReason == .awaitingRelease)
            }
            // A preload whose bytes are in, waiting for its key: joined and taken over, to ask for the key.
            if idle, unsettled.contains(where: { $0.pauseReason == .awaitingRelease }) { return id }
            if adoptingRestores, (row["kind"] as String?) == TransactionKind.restored.rawValue, !unsettled.isEmpty, idle { return id }
        }
        return nil
    }

    /// Transactions with their downloads, oldest first, in two queries whatever their number.
    func transactions(unfinishedOnly: Bool = true, ids: [String]? = nil) throws(PackDeliveryError) -> [Transaction] {
        try self.read { db in
            let records: [TransactionRecord]
            if let ids, ids.count == 1 {
                // One transaction: asked each time a download settles, so a cached statement.
                let sql = "SELECT * FROM transactions WHERE id = ?" + (unfinishedOnly ? " AND finishedAt IS NULL" : "")
                records = try TransactionRecord.fetchAll(db.cachedStatement(sql: sql), arguments: [ids[0]])
            } else {
                var request = TransactionRecord.order(TransactionRecord.Columns.createdAt, TransactionRecord.Columns.id)
                if unfinishedOnly { request = request.filter(TransactionRecord.Columns.finishedAt == nil) }
                if let ids { request = request.filter(ids.contains(TransactionRecord.Columns.id)) }
                records = try request.fetchAll(db)
            }
            guard !records.isEmpty else { return [] }
            let downloads: [DownloadRecord]
            if let ids, ids.count == 1 {
                downloads = try DownloadRecord.fetchAll(
                    db.cachedStatement(sql: "SELECT * FROM downloads WHERE transactionID = ?"), arguments: [ids[0]])
            } else if let ids {
                downloads = try DownloadRecord.filter(ids.contains(DownloadRecord.Columns.transactionID)).fetchAll(db)
            } else if unfinishedOnly {
                downloads = try DownloadRecord.fetchAll(
                    db,
                    sql: """
                        SELECT downloads.* FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                        WHERE transactions.finishedAt IS NULL
                        """)
            } else {
                downloads = try DownloadRecord.fetchAll(db)
            }
            var byTransaction: [String: [DownloadRecord]] = [:]
            for download in downloads { byTransaction[download.transactionID, default: []].append(download) }
            return records.map { record in
                Transaction(
                    id: record.id, productIdentifier: record.productIdentifier, kind: record.kind,
                    createdAt: record.createdAt, finishedAt: record.finishedAt, autoFinish: record.autoFinish,
                    downloads: (byTransaction[record.id] ?? []).sorted { $0.position < $1.position }.map(\.download))
            }
        }
    }

    /// The downloads of these transactions, with their owners.
    func downloadRecords(transactionIDs: [String]) throws(PackDeliveryError) -> [DownloadRecord] {
        try self.read { db in try DownloadRecord.filter(transactionIDs.contains(DownloadRecord.Columns.transactionID)).fetchAll(db) }
    }

    /// The downloads of unfinished transactions that another queue than `owner` runs (its process may be gone).
    /// Not those nobody runs: a download released once settled, of this queue or another, stays out.
    func openDownloads(ownedByOtherThan owner: QueueOwner) throws(PackDeliveryError) -> [DownloadRecord] {
        try self.read { db in
            let sql = """
                SELECT downloads.* FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                WHERE transactions.finishedAt IS NULL AND downloads.ownerQueue IS NOT NULL AND downloads.ownerQueue != ?
                """
            return try DownloadRecord.fetchAll(db.cachedStatement(sql: sql), arguments: [owner.queue])
        }
    }

    /// Where a transaction's manifest came from and its receipt, when either was recorded.
    func transactionAccess(_ transactionID: String) throws(PackDeliveryError) -> TransactionAccessRecord? {
        try self.read { db in try TransactionAccessRecord.fetchOne(db, key: transactionID) }
    }

    /// Replaces the receipt of these transactions (a renewed one); returns the ids that exist.
    func setReceipt(_ receipt: String, transactionIDs: [String]) throws(PackDeliveryError) -> [String] {
        try self.write(durable: true) { db in
            let known = try String.fetchAll(
                db, TransactionRecord.select(TransactionRecord.Columns.id).filter(transactionIDs.contains(TransactionRecord.Columns.id)))
            for id in known {
                if var access = try TransactionAccessRecord.fetchOne(db, key: id) {
                    access.receipt = receipt
                    try access.update(db)
                } else {
                    try TransactionAccessRecord(transactionID: id, manifestURL: nil, receipt: receipt).insert(db)
                }
            }
            return known
        }
    }

    func downloadRecord(_ id: String) throws(PackDeliveryError) -> DownloadRecord? {
        try self.read { db in try DownloadRecord.fetchOne(db, key: id) }
    }

    /// Takes over the downloads among `ids` (or, with nil, every download of an open transaction that
    /// `wanted` accepts) that no live queue owns, in one write; returns their rows as they are now.
    func claim(_ ids: [String]?, owner: QueueOwner, wanted: (DownloadRecord) -> Bool = { _ in true }) throws(PackDeliveryError)
        -> [DownloadRecord]
    {
        try self.write { db in
            let candidates: [DownloadRecord]
            if let ids {
                candidates = try DownloadRecord.filter(keys: ids).fetchAll(db)
            } else {
                candidates = try DownloadRecord.fetchAll(
                    db,
                    sql: """
                        SELECT downloads.* FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                        WHERE (transactions.finishedAt IS NULL OR downloads.delivery = \(DeliveryPolicy.prefetch.sqlLiteral))
                        AND downloads.\(DownloadRecord.unsettled)
                        """)
            }
            var claimed: [DownloadRecord] = []
            for var record in candidates where wanted(record) {
                if let current = record.owner, current.queue == owner.queue || current.isAlive { continue }
                (record.ownerPID, record.ownerStart, record.ownerQueue) = (owner.pid, owner.start, owner.queue)
                try db.execute(
                    sql: "UPDATE downloads SET ownerPID = ?, ownerStart = ?, ownerQueue = ? WHERE id = ?",
                    arguments: [owner.pid, owner.start, owner.queue, record.id])
                claimed.append(record)
            }
            return claimed
        }
    }

    /// Gives up ownership of downloads (closing, finishing).
    func release(_ ids: [String], owner: QueueOwner) throws(PackDeliveryError) {
        guard !ids.isEmpty else { return }
        try self.write { db in
            for chunk in ids.chunked(500) {
                try db.execute(
                    sql:
                        "UPDATE downloads SET ownerPID = NULL, ownerStart = NULL, ownerQueue = NULL WHERE ownerQueue = ? AND id IN (\(databaseQuestionMarks(count: chunk.count)))",
                    arguments: StatementArguments([owner.queue] + chunk))
            }
        }
    }

    /// Saves downloads' own columns in one write. A finished row is never written over: it was committed with
    /// its install (``commitInstall(_:files:download:)``), and a record of the download that a queue still
    /// holds in memory is older than that.
    func save(_ records: [DownloadRecord]) throws(PackDeliveryError) {
        guard !records.isEmpty else { return }
        try self.write { db in
            // One cached statement for every row: this runs for each change of every download (a catalog's
            // thousands), where building the query for each row doubled the cost of a save.
            let statement = try db.cachedStatement(sql: DownloadRecord.saveSQL)
            for record in records {
                let values = try record.databaseDictionary
                var arguments = StatementArguments(DownloadRecord.ownColumns.map { values[$0.name] ?? .null })
                arguments += [record.id, DownloadState.finished.rawValue]
                try statement.execute(arguments: arguments)
            }
        }
    }

    /// Requests that other processes left for this owner's downloads; taken (cleared) as they are read. Each is
    /// decoded here: a text this version does not know comes back as the error that names it.
    func takeRequests(owner: QueueOwner) throws(PackDeliveryError) -> [(id: String, request: Result<ControlRequest, PackDeliveryError>)] {
        // A read first: almost always there is nothing, and a read takes no write lock.
        let pending = try self.read { db in
            try Row.fetchAll(
                db, sql: "SELECT id, request FROM downloads WHERE request IS NOT NULL AND ownerQueue = ?", arguments: [owner.queue]
            )
            .map { (id: $0["id"] as String, request: $0["request"] as String) }
        }
        guard !pending.isEmpty else { return [] }
        try self.write { db in
            for item in pending { try db.execute(sql: "UPDATE downloads SET request = NULL WHERE id = ?", arguments: [item.id]) }
        }
        return pending.map { item in
            (item.id, Result { () throws(PackDeliveryError) in try ControlRequest(stored: item.request) })
        }
    }

    /// Records a download's priority; false when there is no such download.
    func setPriority(_ priority: DownloadPriority, for id: String) throws(PackDeliveryError) -> Bool {
        try self.write { db in
            try db.execute(sql: "UPDATE downloads SET priority = ? WHERE id = ?", arguments: [priority.rawValue, id])
            return db.changesCount > 0
        }
    }

    func setRequest(_ request: ControlRequest?, for id: String) throws(PackDeliveryError) {
        try self.write { db in
            try db.execute(sql: "UPDATE downloads SET request = ? WHERE id = ?", arguments: [request, id])
        }
    }

    /// Marks transactions finished in one durable write; returns those that were open. Their prefetch and on-demand
    /// downloads not yet settled stay owned: they go on after the transaction.
    func finish(_ ids: [String], at date: Date) throws(PackDeliveryError) {
        try self.write(durable: true) { db in
            for chunk in ids.chunked(500) {
                try db.execute(
                    sql:
                        "UPDATE transactions SET finishedAt = ? WHERE finishedAt IS NULL AND id IN (\(databaseQuestionMarks(count: chunk.count)))",
                    arguments: StatementArguments([date as any DatabaseValueConvertible] + chunk.map { $0 as any DatabaseValueConvertible })
                )
                try db.execute(
                    sql:
                        "UPDATE downloads SET ownerPID = NULL, ownerStart = NULL, ownerQueue = NULL WHERE transactionID IN (\(databaseQuestionMarks(count: chunk.count))) AND (\(DownloadRecord.holdsTransaction) OR NOT (\(DownloadRecord.unsettled)))",
                    arguments: StatementArguments(chunk))
            }
        }
    }

    // MARK: Installs

    /// The journal of a move into place, committed durably before the rename: after a crash, the staging folder's
    /// inode tells recovery whether the rename happened.
    func journalMove(downloadID: String, stagingInode: Int64) throws(PackDeliveryError) {
        try self.write(durable: true) { db in
            try db.execute(
                sql: "UPDATE downloads SET phase = ?, stagingInode = ? WHERE id = ?",
                arguments: [DownloadPhase.installing, stagingInode, downloadID])
        }
    }

    func installs(productIdentifier: String? = nil) throws(PackDeliveryError) -> [InstallRecord] {
        try self.read { db in
            var request = InstallRecord.order(
                InstallRecord.Columns.productIdentifier, InstallRecord.Columns.installedAt, InstallRecord.Columns.contentIdentifier)
            if let productIdentifier { request = request.filter(InstallRecord.Columns.productIdentifier == productIdentifier) }
            return try request.fetchAll(db)
        }
    }

    /// Where each of `contentIdentifiers` is installed (its newest install), in one read: one indexed query a pack.
    func installedFolders(contentIdentifiers: [String]) throws(PackDeliveryError) -> [String: String] {
        try self.read { db in
            let statement = try db.cachedStatement(
                sql: "SELECT contentURL FROM installs WHERE contentIdentifier = ? ORDER BY installedAt DESC LIMIT 1")
            var found: [String: String] = [:]
            for identifier in contentIdentifiers {
                if let path = try String.fetchOne(statement, arguments: [identifier]) { found[identifier] = path }
            }
            return found
        }
    }

    /// The newest download of a pack that is not finished or cancelled (an on-demand pack not yet asked for, a
    /// prefetch on its way, a paused purchase), or nil.
    func openDownload(contentIdentifier: String) throws(PackDeliveryError) -> DownloadRecord? {
        try self.read { db in
            try DownloadRecord.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT * FROM downloads WHERE contentIdentifier = ? AND \(DownloadRecord.unsettled)
                        ORDER BY rowid DESC LIMIT 1
                        """), arguments: [contentIdentifier])
        }
    }

    /// The content identifiers a product's downloads were recorded with, newest transaction's first.
    func contentIdentifiers(productIdentifier: String) throws(PackDeliveryError) -> [String] {
        try self.read { db in
            let rows = try String.fetchAll(
                db,
                sql: """
                    SELECT downloads.contentIdentifier FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                    WHERE downloads.productIdentifier = ? ORDER BY transactions.createdAt DESC, transactions.id, downloads.position
                    """,
                arguments: [productIdentifier])
            let installed = try String.fetchAll(
                db, sql: "SELECT contentIdentifier FROM installs WHERE productIdentifier = ?", arguments: [productIdentifier])
            var seen = Set<String>()
            return (rows + installed).filter { seen.insert($0).inserted }
        }
    }

    /// Installs of a content identifier, in any destination.
    func installs(contentIdentifier: String) throws(PackDeliveryError) -> [InstallRecord] {
        // Asked before every install: a cached statement.
        try self.read { db in
            try InstallRecord.fetchAll(
                db.cachedStatement(sql: "SELECT * FROM installs WHERE contentIdentifier = ?"), arguments: [contentIdentifier])
        }
    }

    /// Installs recorded in the `window` before the newest one (all of them with nil), with their files, in two
    /// queries whatever their number.
    func recentInstalls(window: TimeInterval?) throws(PackDeliveryError) -> [(install: InstallRecord, files: [InstalledFileRecord])] {
        try self.read { db in
            guard let newest = try Date.fetchOne(db, sql: "SELECT MAX(installedAt) FROM installs") else { return [] }
            let since = window.map { newest.addingTimeInterval(-$0) } ?? Date(timeIntervalSince1970: 0)
            let installs = try InstallRecord.filter(InstallRecord.Columns.installedAt >= since).fetchAll(db)
            var files: [String: [InstalledFileRecord]] = [:]
            let rows = try InstalledFileRecord.fetchCursor(
                db,
                sql: """
                    SELECT installedFiles.* FROM installedFiles JOIN installs
                      ON installs.destination = installedFiles.destination AND installs.contentIdentifier = installedFiles.contentIdentifier
                    WHERE installs.installedAt >= ?
                    """, arguments: [since])
            while let file = try rows.next() { files["\(file.destination.rawValue)/\(file.contentIdentifier)", default: []].append(file) }
            return installs.map { ($0, files["\($0.destination.rawValue)/\($0.contentIdentifier)"] ?? []) }
        }
    }

    func files(of install: InstallRecord) throws(PackDeliveryError) -> [InstalledFileRecord] {
        try self.read { db in
            try InstalledFileRecord.filter(
                InstalledFileRecord.Columns.destination == install.destination
                    && InstalledFileRecord.Columns.contentIdentifier == install.contentIdentifier
            ).fetchAll(db)
        }
    }

    /// Records an install with its files, and the download's final row, in one durable write: once this
    /// returns, the install survives a power cut (its files and folders were synced before), and neither is
    /// ever recorded without the other.
    ///
    /// - Parameters:
    ///   - install: the installed content; it replaces an earlier install at the same path, with its files.
    ///   - files: its files.
    ///   - download: the row of the download that installed it, as it is once finished (its own columns and
    ///     the cleared journal of the move); nil for content recorded again from the folders alone.
    func commitInstall(_ install: InstallRecord, files: [InstalledFileRecord], download: DownloadRecord?) throws(PackDeliveryError) {
        try self.write(durable: true) { db in
            try db.cachedStatement(sql: "DELETE FROM installedFiles WHERE destination = ? AND contentIdentifier = ?")
                .execute(arguments: [install.destination, install.contentIdentifier])
            try install.save(db)
            // Installed again: no longer evicted.
            try db.cachedStatement(sql: "DELETE FROM evictions WHERE contentIdentifier = ?").execute(arguments: [install.contentIdentifier])
            for file in files { try file.insert(db) }
            try download?.update(db, columns: DownloadRecord.ownColumns + [.stagingInode])
        }
    }

    /// The last finished download of each pack (product and content identifier), newest first: what a restore delivers again.
    func lastFinishedDownloads(productIdentifiers: [String]?) throws(PackDeliveryError) -> [DownloadRecord] {
        try self.read { db in
            let all = try DownloadRecord.fetchAll(
                db,
                sql: """
                    SELECT downloads.* FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                    WHERE downloads.state = \(DownloadState.finished.sqlLiteral) ORDER BY transactions.createdAt DESC
                    """)
            let wanted = productIdentifiers.map(Set.init)
            var seen = Set<String>()
            return all.filter { record in
                (wanted?.contains(record.productIdentifier) ?? true)
                    && seen.insert("\(record.productIdentifier)\u{0}\(record.contentIdentifier)").inserted
            }
        }
    }

    func deleteInstall(_ install: InstallRecord) throws(PackDeliveryError) {
        try self.write { db in
            try db.execute(
                sql: "DELETE FROM installedFiles WHERE destination = ? AND contentIdentifier = ?",
                arguments: [install.destination, install.contentIdentifier])
            _ = try InstallRecord.deleteOne(
                db, key: ["destination": install.destination.rawValue, "contentIdentifier": install.contentIdentifier])
        }
    }
}

extension Array {
    /// Slices of at most `size` elements (SQLite limits the number of bound parameters).
    func chunked(_ size: Int) -> [ArraySlice<Element>] {
        stride(from: 0, to: self.count, by: size).map { self[$0..<Swift.min($0 + size, self.count)] }
    }
}

// Manifest publishers: the keys a home trusts, and the newest manifest accepted from each publisher and scope.
extension Store {
    func trustedPublishers() throws(PackDeliveryError) -> [String] {
        try self.read { db in try String.fetchAll(db, sql: "SELECT pem FROM trustedPublishers ORDER BY id") }
    }

    func trust(id: String, pem: String) throws(PackDeliveryError) {
        try self.write(durable: true) { db in
            try db.execute(sql: "INSERT OR REPLACE INTO trustedPublishers (id, pem) VALUES (?, ?)", arguments: [id, pem])
            try self.saveTrustFile(db)
        }
    }

    /// Why a signed manifest was not accepted.
    enum ManifestMarkConflict: Sendable, Hashable {
        /// A higher version of the same publisher and scope was accepted before.
        case rollback(last: Int)
        /// The same version was accepted before with other bytes.
        case otherBytes
        /// Manifests of this publisher at this URL were accepted before in another scope (pinned on first use).
        case otherScope(pinned: String)
    }

    /// Records a signed manifest as the newest of its publisher and scope, unless that would roll back: a lower
    /// version than the one accepted before, or the same version with other bytes. A mark kept without bytes (from
    /// before they were kept) takes the bytes of the first manifest of its version accepted after.
    ///
    /// - Parameters:
    ///   - version: the manifest's version.
    ///   - scope: its scope, "" for none.
    ///   - sha256: the SHA-256 of its bytes, nil when unknown (then an equal version is refused).
    ///   - keyID: the publisher that signed it.
    ///   - url: where it was read from, without credentials or query (``LoadedManifest/pinnedLocation``); its scope
    ///     is pinned there on first use, and a manifest of the same publisher there in another scope is refused.
    /// - Returns: nil when it was recorded, else why not.
    func acceptManifest(version: Int, scope: String, sha256: String?, keyID: String, url: String) throws(PackDeliveryError)
        -> ManifestMarkConflict?
    {
        try self.write(durable: true) { db -> ManifestMarkConflict? in
            let conflict = try self.markManifest(version: version, scope: scope, sha256: sha256, keyID: keyID, url: url, in: db)
            try self.saveTrustFile(db)
            return conflict
        }
    }

    private func markManifest(version: Int, scope: String, sha256: String?, keyID: String, url: String, in db: Database) throws
        -> ManifestMarkConflict?
    {
        if let pinned = try self.pinScope(scope, url: url, keyID: keyID, in: db) { return .otherScope(pinned: pinned) }
        let row = try Row.fetchOne(
            db, sql: "SELECT version, sha256 FROM manifestMarks WHERE keyID = ? AND scope = ?", arguments: [keyID, scope])
        if let row {
            let last: Int = row["version"]
            let kept: String? = row["sha256"]
            if last > version { return .rollback(last: last) }
            if last == version {
                guard let sha256, kept == nil || kept == sha256 else { return .otherBytes }
                if kept != nil { return nil }
            }
        }
        try db.execute(
            sql: "INSERT OR REPLACE INTO manifestMarks (keyID, scope, version, sha256) VALUES (?, ?, ?, ?)",
            arguments: [keyID, scope, version, sha256])
        return nil
    }

    /// What the home measured of every source (``SourceStats``), in no order.
    ///
    /// The rows are only measurements: one that does not read as one (a text where a number belongs, written by
    /// hand or by a damaged disk) is left out, and the source is measured again, instead of stopping every fetch.
    /// GRDB's `row["column"]` would stop the process on such a value, so each is converted with `fromDatabaseValue`.
    func sourceStats() throws(PackDeliveryError) -> [SourceStats] {
        try self.read { db in
            try Row.fetchAll(db, sql: "SELECT origin, bytesPerSecond, failures, updatedAt FROM sourceStats").compactMap { row in
                let rate: DatabaseValue = row["bytesPerSecond"]
                guard let origin = String.fromDatabaseValue(row["origin"]),
                    let failures = Double.fromDatabaseValue(row["failures"]), failures.isFinite, failures >= 0,
                    let updatedAt = Date.fromDatabaseValue(row["updatedAt"])
                else { return nil }
                if rate.isNull { return SourceStats(origin: origin, bytesPerSecond: nil, failures: failures, updatedAt: updatedAt) }
                guard let bytesPerSecond = Double.fromDatabaseValue(rate), bytesPerSecond.isFinite, bytesPerSecond >= 0 else { return nil }
                return SourceStats(origin: origin, bytesPerSecond: bytesPerSecond, failures: failures, updatedAt: updatedAt)
            }
        }
    }

    /// Records what was measured of one source (its row replaced).
    func saveSourceStats(_ stats: SourceStats) throws(PackDeliveryError) {
        try self.write { db in
            try db.execute(
                sql: "INSERT OR REPLACE INTO sourceStats (origin, bytesPerSecond, failures, updatedAt) VALUES (?, ?, ?, ?)",
                arguments: [stats.origin, stats.bytesPerSecond, stats.failures, stats.updatedAt])
        }
    }
}
