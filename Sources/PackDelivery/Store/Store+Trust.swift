import Foundation
import GRDB

/// What a home trusts, kept twice: in the state database, and in `trust.json` beside it, written in the same write
/// transaction as every change of it. A damaged database is rebuilt from the installed folders, which say nothing
/// about trust: the rebuild reads it back from `trust.json` (``restoreTrust(from:)``), so the home neither forgets its
/// publishers (and reads unsigned manifests) nor their rollback marks and pinned scopes.
struct TrustSnapshot: Codable, Sendable, Hashable {
    struct Publisher: Codable, Sendable, Hashable {
        var id: String
        var pem: String
    }
    struct Mark: Codable, Sendable, Hashable {
        var keyID: String
        var scope: String
        var version: Int
        var sha256: String?
    }
    struct Pin: Codable, Sendable, Hashable {
        var url: String
        var keyID: String
        var scope: String
    }
    var publishers: [Publisher]
    var marks: [Mark]
    var scopes: [Pin]

    /// The id of the record that stands for trust that could not be read back after a rebuild: unreadable as a key,
    /// so every manifest is refused until it is removed (``DownloadQueue/untrust(id:)``).
    static let unknownTrustID = TrustedPublisherRecord.lostTrustID
}

/// How a rebuild dealt with the home's trust.
enum TrustRestore: Sendable, Hashable {
    /// `trust.json` was read back: this many publisher keys.
    case restored(publishers: Int)
    /// It was missing or unreadable: a record that reads as no key was written, so every manifest is refused.
    case unknown
}

extension Store {
    /// `trust.json`, beside the database.
    var trustFileURL: URL { URL(filePath: self.pool.path).deletingLastPathComponent().appending(path: "trust.json") }

    /// The trust recorded in the database, read in `db` (inside a write, it sees the write's changes).
    static func trustSnapshot(_ db: Database) throws -> TrustSnapshot {
        TrustSnapshot(
            publishers: try Row.fetchAll(db, sql: "SELECT id, pem FROM trustedPublishers ORDER BY id").map {
                .init(id: $0["id"], pem: $0["pem"])
            },
            marks: try Row.fetchAll(db, sql: "SELECT keyID, scope, version, sha256 FROM manifestMarks ORDER BY keyID, scope").map {
                .init(keyID: $0["keyID"], scope: $0["scope"], version: $0["version"], sha256: $0["sha256"])
            },
            scopes: try Row.fetchAll(db, sql: "SELECT url, keyID, scope FROM manifestScopes ORDER BY url, keyID").map {
                .init(url: $0["url"], keyID: $0["keyID"], scope: $0["scope"])
            })
    }

    /// Writes `trust.json` from the database as `db` sees it: a new file synced, renamed over the old one, the folder
    /// synced. Called inside the write transaction that changed the trust, so writers of other processes wait.
    func saveTrustFile(_ db: Database) throws {
        let data = try JSONEncoder().encode(try Self.trustSnapshot(db))
        let url = self.trustFileURL
        let temporary = url.path + ".new"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw PackDeliveryError.io("create", path: temporary, errno: errno) }
        let written = data.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        let code = written == data.count ? (fsync(fd) == 0 ? 0 : errno) : (written < 0 ? errno : EIO)
        Glibc.close(fd)
        guard code == 0 else {
            unlink(temporary)
            throw PackDeliveryError.io("write", path: temporary, errno: code)
        }
        guard rename(temporary, url.path) == 0 else { throw PackDeliveryError.io("rename", path: temporary, errno: errno) }
        try Durability.syncFolder(url.deletingLastPathComponent())
    }

    /// Writes `trust.json` when it is missing (a new home, or one made before it was kept). Best effort: a home that
    /// cannot write it works on, and a rebuild then refuses manifests until its trust is set again.
    func ensureTrustFile() {
        guard access(self.trustFileURL.path, F_OK) != 0 else { return }
        try? self.write(durable: true) { db in try self.saveTrustFile(db) }
    }

    /// After a rebuild (this store is new and empty): the trust read back from `trust.json`; when it is missing or
    /// unreadable, a record that reads as no key, so that every manifest is refused until trust is set again.
    ///
    /// - Parameter file: the `trust.json` of the damaged database.
    func restoreTrust(from file: URL) throws(PackDeliveryError) -> TrustRestore {
        let snapshot = (try? Data(contentsOf: file)).flatMap { try? JSONDecoder().decode(TrustSnapshot.self, from: $0) }
        try self.write(durable: true) { db in
            guard let snapshot else {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO trustedPublishers (id, pem) VALUES (?, '')", arguments: [TrustSnapshot.unknownTrustID])
                return
            }
            for publisher in snapshot.publishers {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO trustedPublishers (id, pem) VALUES (?, ?)", arguments: [publisher.id, publisher.pem])
            }
            for mark in snapshot.marks {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO manifestMarks (keyID, scope, version, sha256) VALUES (?, ?, ?, ?)",
                    arguments: [mark.keyID, mark.scope, mark.version, mark.sha256])
            }
            for pin in snapshot.scopes {
                try db.execute(
                    sql: "INSERT OR REPLACE INTO manifestScopes (url, keyID, scope) VALUES (?, ?, ?)",
                    arguments: [pin.url, pin.keyID, pin.scope])
            }
            // The restored file stays as it was read only when it was read; otherwise it now says what the database does.
            try self.saveTrustFile(db)
        }
        return snapshot.map { .restored(publishers: $0.publishers.count) } ?? .unknown
    }

    /// The trusted keys as recorded: their ids and PEM text, readable or not.
    func trustedPublisherRows() throws(PackDeliveryError) -> [(id: String, pem: String)] {
        try self.read { db in
            try Row.fetchAll(db, sql: "SELECT id, pem FROM trustedPublishers ORDER BY id").map { (id: $0["id"], pem: $0["pem"]) }
        }
    }

    /// Removes a trusted key by its recorded id.
    /// - Returns: whether there was one.
    func untrust(id: String) throws(PackDeliveryError) -> Bool {
        try self.write(durable: true) { db in
            try db.execute(sql: "DELETE FROM trustedPublishers WHERE id = ?", arguments: [id])
            let removed = db.changesCount > 0
            if removed { try self.saveTrustFile(db) }
            return removed
        }
    }

    /// The scope pinned for signed manifests of `keyID` read from `url`: the one given, on first use; else the one
    /// pinned before. A manifest without a scope (signed before scopes existed, pinned as "") gives way once to the
    /// first scoped one there, as a publisher moves to scopes; never the other way.
    ///
    /// - Returns: nil when `scope` is (now) the pinned one; else the scope pinned before.
    func pinScope(_ scope: String, url: String, keyID: String, in db: Database) throws -> String? {
        let pinned = try String.fetchOne(db, sql: "SELECT scope FROM manifestScopes WHERE url = ? AND keyID = ?", arguments: [url, keyID])
        if let pinned, pinned == scope || !pinned.isEmpty { return pinned == scope ? nil : pinned }
        try db.execute(
            sql: "INSERT OR REPLACE INTO manifestScopes (url, keyID, scope) VALUES (?, ?, ?)", arguments: [url, keyID, scope])
        return nil
    }
}
