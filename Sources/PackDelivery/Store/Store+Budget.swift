import Foundation
import GRDB

/// A row of `leases`: a product, or one pack of it, held in use by a process (see ``DownloadQueue/beginAccessing(productIDs:contentIdentifiers:)``).
struct LeaseRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "leases"
    var token: String
    var productIdentifier: String
    /// "" for a lease of packs by content identifier alone.
    /// Nil: every pack of the product.
    var contentIdentifier: String?
    var ownerPID: Int32
    var ownerStart: Int64
    var createdAt: Date

    /// Whether the process that took the lease still runs (the same check as a download's owner, ``QueueOwner``).
    var isAlive: Bool { QueueOwner.processIsAlive(pid: self.ownerPID, start: self.ownerStart) }

    func covers(_ install: InstallRecord) -> Bool {
        (self.productIdentifier.isEmpty || self.productIdentifier == install.productIdentifier)
            && (self.contentIdentifier == nil || self.contentIdentifier == install.contentIdentifier)
    }
}

/// A row of `evictions`: a pack evicted from the caches, known until installed again.
struct EvictionRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "evictions"
    var destination: Destination
    var contentIdentifier: String
    var productIdentifier: String
    var contentVersion: String
    var byteCount: Int64
    var evictedAt: Date
    var downloadID: String

    var content: EvictedContent {
        EvictedContent(
            productIdentifier: self.productIdentifier, contentIdentifier: self.contentIdentifier, contentVersion: self.contentVersion,
            destination: self.destination, byteCount: self.byteCount, evictedAt: self.evictedAt)
    }
}

/// An installed pack that may be evicted, with what orders it.
struct EvictionCandidate: Sendable, Hashable {
    var install: InstallRecord
    var priority: Int
    var lastUsed: Date
}

extension Store {
    // MARK: Use

    /// Records that content was used now: its `lastUsedAt`, which orders evictions (least recently used first).
    ///
    /// The one place use is recorded: leases, ``DownloadQueue/contentURL(forProductID:)``, `packs content`, and
    /// whatever else hands content to a user call it.
    /// - Parameters:
    ///   - productIdentifier: the product whose packs were used.
    ///   - contentIdentifiers: only these packs of it; nil for all of them.
    ///   - date: when.
    func recordUse(productIdentifier: String, contentIdentifiers: [String]? = nil, at date: Date = Date()) throws(PackDeliveryError) {
        try self.write { db in
            if let contentIdentifiers {
                for identifier in contentIdentifiers {
                    try db.cachedStatement(sql: "UPDATE installs SET lastUsedAt = ? WHERE productIdentifier = ? AND contentIdentifier = ?")
                        .execute(arguments: [date, productIdentifier, identifier])
                }
            } else {
                try db.cachedStatement(sql: "UPDATE installs SET lastUsedAt = ? WHERE productIdentifier = ?")
                    .execute(arguments: [date, productIdentifier])
            }
        }
    }

    /// Records a use of packs, by content identifier (unique in a home), as ``recordUse(productIdentifier:contentIdentifiers:at:)``.
    func recordUse(contentIdentifiers: [String], at date: Date = Date()) throws(PackDeliveryError) {
        try self.write { db in
            let statement = try db.cachedStatement(sql: "UPDATE installs SET lastUsedAt = ? WHERE contentIdentifier = ?")
            for identifier in contentIdentifiers { try statement.execute(arguments: [date, identifier]) }
        }
    }

    // MARK: Leases

    func addLease(_ rows: [LeaseRecord]) throws(PackDeliveryError) {
        try self.write { db in
            for row in rows {
                try row.insert(db)
                try Self.markUsed(row, at: row.createdAt, in: db)
            }
        }
    }

    /// Ends a lease: its rows go, and its content counts as used now.
    /// - Returns: whether the lease was held.
    func endLease(_ token: String, at date: Date = Date()) throws(PackDeliveryError) -> Bool {
        try self.write { db in
            let rows = try LeaseRecord.filter(Column("token") == token).fetchAll(db)
            for row in rows { try Self.markUsed(row, at: date, in: db) }
            try db.execute(sql: "DELETE FROM leases WHERE token = ?", arguments: [token])
            return !rows.isEmpty
        }
    }

    private static func markUsed(_ row: LeaseRecord, at date: Date, in db: Database) throws {
        try db.execute(
            sql: """
                UPDATE installs SET lastUsedAt = ?
                WHERE (? = '' OR productIdentifier = ?) AND (? IS NULL OR contentIdentifier = ?)
                """, arguments: [date, row.productIdentifier, row.productIdentifier, row.contentIdentifier, row.contentIdentifier])
    }

    /// The leases whose process still runs; the rows of processes that are gone are deleted.
    func liveLeases(in db: Database) throws -> [LeaseRecord] {
        let all = try LeaseRecord.fetchAll(db)
        let dead = all.filter { !$0.isAlive }
        for token in Set(dead.map(\.token)) { try db.execute(sql: "DELETE FROM leases WHERE token = ?", arguments: [token]) }
        return all.filter(\.isAlive)
    }

    func liveLeases() throws(PackDeliveryError) -> [LeaseRecord] {
        try self.write { db in try self.liveLeases(in: db) }
    }

    // MARK: Settings and priorities

    func setting(_ key: String) throws(PackDeliveryError) -> String? {
        try self.read { db in try String.fetchOne(db, sql: "SELECT value FROM settings WHERE key = ?", arguments: [key]) }
    }

    func setSetting(_ key: String, _ value: String?) throws(PackDeliveryError) {
        try self.write { db in
            if let value {
                try db.execute(sql: "INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)", arguments: [key, value])
            } else {
                try db.execute(sql: "DELETE FROM settings WHERE key = ?", arguments: [key])
            }
        }
    }

    /// Records packs' preservation priorities (nil removes one: 0).
    func setPreservationPriorities(_ priorities: [String: Int?]) throws(PackDeliveryError) {
        guard !priorities.isEmpty else { return }
        try self.write { db in
            for (identifier, priority) in priorities {
                if let priority {
                    try db.execute(
                        sql: "INSERT OR REPLACE INTO preservationPriorities (contentIdentifier, priority) VALUES (?, ?)",
                        arguments: [identifier, priority])
                } else {
                    try db.execute(sql: "DELETE FROM preservationPriorities WHERE contentIdentifier = ?", arguments: [identifier])
                }
            }
        }
    }

    // MARK: Eviction

    /// Bytes of installed content in a destination (the files' sizes as recorded at install).
    func installedBytes(_ destination: Destination, excluding contentIdentifier: String? = nil) throws(PackDeliveryError) -> Int64 {
        try self.read { db in
            try Int64.fetchOne(
                db, sql: "SELECT COALESCE(SUM(MAX(byteCount, 0)), 0) FROM installs WHERE destination = ? AND contentIdentifier IS NOT ?",
                arguments: [destination, contentIdentifier]) ?? 0
        }
    }

    /// The cached packs that may be evicted, in the order they go: lowest preservation priority first, then least
    /// recently used. Leased packs (by a live process), essential packs of unfinished transactions and `protected` ones are
    /// left out.
    func evictionCandidates(protecting protected: Set<String>) throws(PackDeliveryError) -> [EvictionCandidate] {
        try self.write { db in
            let leases = try self.liveLeases(in: db)
            // Essential packs an unfinished transaction delivers, or delivered (its prefetch and on-demand ones may go).
            let busy = Set(
                try String.fetchAll(
                    db,
                    sql: """
                        SELECT DISTINCT downloads.contentIdentifier FROM downloads JOIN transactions ON transactions.id = downloads.transactionID
                        WHERE transactions.finishedAt IS NULL AND downloads.state <> \(DownloadState.cancelled.sqlLiteral)
                        AND \(DownloadRecord.holdsTransaction)
                        """))
            let priorities = Dictionary(
                try Row.fetchAll(db, sql: "SELECT contentIdentifier, priority FROM preservationPriorities").map {
                    ($0["contentIdentifier"] as String, $0["priority"] as Int)
                }, uniquingKeysWith: { a, _ in a })
            let installs = try InstallRecord.filter(InstallRecord.Columns.destination == Destination.caches).fetchAll(db)
            return
                installs
                .filter { install in
                    !protected.contains(install.contentIdentifier) && !busy.contains(install.contentIdentifier)
                        && !leases.contains { $0.covers(install) }
                }
                .map {
                    EvictionCandidate(
                        install: $0, priority: priorities[$0.contentIdentifier] ?? 0, lastUsed: $0.lastUsedAt ?? $0.installedAt)
                }
                .sorted {
                    ($0.priority, $0.lastUsed, $0.install.contentIdentifier) < ($1.priority, $1.lastUsed, $1.install.contentIdentifier)
                }
        }
    }

    /// Evicts one install: under the write lock, checks it is still installed as it was and not leased, runs `move`
    /// (the rename of its folder out of place, synced), then records it evicted, all in one durable transaction.
    ///
    /// A lease taken by another process is a write too: it lands either before (the pack is kept) or after.
    /// - Returns: the eviction recorded, or nil when the pack changed or was leased meanwhile (nothing moved).
    ///   - undo: puts the folder back when recording fails, still under the lock (so no other process sees the folder
    ///     out of place with the install recorded, and takes it for a crashed eviction).
    func evict(_ install: InstallRecord, at date: Date, move: () throws -> Void, undo: () -> Void) throws(PackDeliveryError)
        -> EvictionRecord?
    {
        try self.write(durable: true) { db in
            guard
                let current = try InstallRecord.fetchOne(
                    db, key: ["destination": install.destination.rawValue, "contentIdentifier": install.contentIdentifier]),
                current.downloadID == install.downloadID, current.installedAt == install.installedAt
            else { return nil }
            if try self.liveLeases(in: db).contains(where: { $0.covers(current) }) { return nil }
            try move()
            do {
                return try Self.recordEviction(of: current, at: date, in: db)
            } catch {
                undo()
                throw error
            }
        }
    }

    private static func recordEviction(of current: InstallRecord, at date: Date, in db: Database) throws -> EvictionRecord {
        let record = EvictionRecord(
            destination: current.destination, contentIdentifier: current.contentIdentifier,
            productIdentifier: current.productIdentifier, contentVersion: current.contentVersion,
            byteCount: max(0, current.byteCount), evictedAt: date, downloadID: current.downloadID)
        try db.execute(
            sql: "DELETE FROM installedFiles WHERE destination = ? AND contentIdentifier = ?",
            arguments: [current.destination, current.contentIdentifier])
        _ = try InstallRecord.deleteOne(
            db, key: ["destination": current.destination.rawValue, "contentIdentifier": current.contentIdentifier])
        try record.save(db)
        return record
    }

    /// Records an eviction whose folder was moved out of place before a crash (see ``DownloadQueue/finishEvictions()``).
    func recordEviction(destination: Destination, contentIdentifier: String, at date: Date) throws(PackDeliveryError) -> EvictionRecord? {
        try self.write(durable: true) { db in
            guard
                let current = try InstallRecord.fetchOne(
                    db, key: ["destination": destination.rawValue, "contentIdentifier": contentIdentifier])
            else { return nil }
            // Checked under the lock: a folder in place (installed again since) is not evicted.
            guard access(current.contentURL, F_OK) != 0 else { return nil }
            return try Self.recordEviction(of: current, at: date, in: db)
        }
    }

    /// The downloads that installed these packs before they were evicted: what fetching them again needs (the pack's
    /// URLs, SHA-256, length and index; its transaction keeps the manifest URL and receipt). Packs with no eviction,
    /// or whose download is not recorded, are left out.
    func evictedDownloads(contentIdentifiers: [String]) throws(PackDeliveryError) -> [DownloadRecord] {
        try self.read { db in
            let statement = try db.cachedStatement(
                sql: """
                    SELECT downloads.* FROM evictions JOIN downloads ON downloads.id = evictions.downloadID
                    WHERE evictions.contentIdentifier = ? ORDER BY evictions.evictedAt DESC LIMIT 1
                    """)
            return try contentIdentifiers.compactMap { try DownloadRecord.fetchOne(statement, arguments: [$0]) }
        }
    }

    func evictions(productIdentifier: String? = nil) throws(PackDeliveryError) -> [EvictionRecord] {
        try self.read { db in
            var request = EvictionRecord.order(Column("productIdentifier"), Column("evictedAt"), Column("contentIdentifier"))
            if let productIdentifier { request = request.filter(Column("productIdentifier") == productIdentifier) }
            return try request.fetchAll(db)
        }
    }
}
