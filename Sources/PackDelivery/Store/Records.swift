import Foundation
import GRDB

extension DownloadState: DatabaseValueConvertible {}
extension DownloadPhase: DatabaseValueConvertible {}
extension PauseReason: DatabaseValueConvertible {}
extension Destination: DatabaseValueConvertible {}
extension TransactionKind: DatabaseValueConvertible {}
extension DeliveryPolicy: DatabaseValueConvertible {}

/// A row of `transactions`.
struct TransactionRecord: Codable, FetchableRecord, PersistableRecord, Sendable {
    static let databaseTableName = "transactions"
    var id: String
    var productIdentifier: String
    var kind: TransactionKind
    var createdAt: Date
    var finishedAt: Date?
    var autoFinish: Bool

    /// Every column of the table, for the queries that name one (`StoreTests` checks they match the table).
    enum Columns: String, ColumnExpression, CaseIterable {
        case id, productIdentifier, kind, createdAt, finishedAt, autoFinish
    }
}

/// A row of `downloads`: every ``Download`` field plus what resuming needs.
struct DownloadRecord: Codable, FetchableRecord, PersistableRecord, Sendable {
    static let databaseTableName = "downloads"
    var id: String
    var transactionID: String
    var position: Int
    var productIdentifier: String
    var contentIdentifier: String
    var contentVersion: String
    var contentLength: Int64
    var state: DownloadState
    var phase: DownloadPhase?
    var progress: Double
    var pauseReason: PauseReason?
    var contentURL: String?
    /// The download's last error, as JSON.
    var error: JSONColumn<PackDeliveryError>?
    var url: String
    var sha256: String
    var unpackedLength: Int64?
    var destination: Destination
    var bytesReceived: Int64
    /// Strong ETag or Last-Modified of the response the partial file came from.
    var validator: String?
    /// The archive on disk while downloading and until installed.
    var partialPath: String?
    /// The inode of the unpacked staging folder once unpacking completed; tells, after a crash, whether the move into place happened.
    var stagingInode: Int64?
    /// Whether a resumed download that failed its checksum was already fetched again from zero.
    var retriedFromZero: Bool
    /// Whether the archive on disk is complete and matched its SHA-256 (so resuming only unpacks).
    var verified: Bool
    /// A ``ControlRequest`` of another process, for the process running the download, as its stored text: read
    /// as text so that a request this version does not know leaves the row readable (``Store/takeRequests(owner:)``
    /// decodes and reports it).
    var request: String?
    /// The process (and queue in it) that runs the download; nil when none does. See ``QueueOwner``.
    var ownerPID: Int32?
    var ownerStart: Int64?
    var ownerQueue: String?
    /// The pack's index reference, as JSON, for a delta update.
    var indexReference: JSONColumn<Manifest.IndexReference>?
    /// How soon it starts while it waits; NULL (rows from before priorities) is `essential`.
    var priority: DownloadPriority?
    /// Every source of the pack, as JSON; NULL when it has one (its url).
    var sources: JSONColumn<StoredSources>?

    /// The `sources` column: the pack's sources in manifest order, and whether credentials go to all of them.
    struct StoredSources: Codable, Sendable {
        var urls: [URL]
        var credentialsToAllSources: Bool
    }
    /// When the pack is delivered; NULL (rows from before delivery policies) is `essential`.
    var delivery: DeliveryPolicy?
    /// A preload's release date (``Download/releaseDate``); NULL for any other pack.
    var releaseDate: Date?

    /// Every column of the table, for the queries that name one (`StoreTests` checks they match the table).
    enum Columns: String, ColumnExpression, CaseIterable {
        case id, transactionID, position, productIdentifier, contentIdentifier, contentVersion, contentLength, state
        case phase, progress, pauseReason, contentURL, error, url, sha256, unpackedLength, destination, bytesReceived
        case validator, partialPath, stagingInode, retriedFromZero, verified, request, ownerPID, ownerStart
        case ownerQueue, indexReference, priority, sources, delivery, releaseDate
    }

    init(
        _ download: Download, position: Int, validator: String?, partialPath: String?, stagingInode: Int64?, retriedFromZero: Bool,
        verified: Bool
    ) {
        self.id = download.id
        self.transactionID = download.transactionID
        self.position = position
        self.productIdentifier = download.productIdentifier
        self.contentIdentifier = download.contentIdentifier
        self.contentVersion = download.contentVersion
        self.contentLength = download.contentLength
        self.state = download.state
        self.phase = download.phase
        self.progress = download.progress
        self.pauseReason = download.pauseReason
        self.contentURL = download.contentURL?.path
        self.error = download.error.map { .value($0) }
        self.url = download.url.absoluteString
        self.sha256 = download.sha256
        self.unpackedLength = download.unpackedLength
        self.destination = download.destination
        self.bytesReceived = download.bytesReceived
        self.validator = validator
        self.partialPath = partialPath
        self.indexReference = download.index.map { .value($0) }
        self.priority = download.priority
        self.sources = download.sources.map { .value(StoredSources(urls: $0, credentialsToAllSources: download.credentialsToAllSources)) }
        self.delivery = download.delivery
        self.releaseDate = download.releaseDate
        self.stagingInode = stagingInode
        self.retriedFromZero = retriedFromZero
        self.verified = verified
        self.request = nil
    }

    var owner: QueueOwner? {
        guard let ownerPID, let ownerStart, let ownerQueue else { return nil }
        return QueueOwner(pid: ownerPID, start: ownerStart, queue: ownerQueue)
    }

    var download: Download {
        var download = Download(
            id: self.id, transactionID: self.transactionID, productIdentifier: self.productIdentifier,
            contentIdentifier: self.contentIdentifier, contentVersion: self.contentVersion, contentLength: self.contentLength,
            state: self.state, phase: self.phase, progress: self.progress, phaseProgress: self.state == .finished ? 1 : 0,
            timeRemaining: self.state == .finished ? 0 : -1,
            pauseReason: self.pauseReason,
            contentURL: self.contentURL.map { URL(filePath: $0) },
            error: self.error.map { column in
                switch column {
                case .value(let error): error
                case .unreadable(_, let reason):
                    PackDeliveryError(
                        .internalError,
                        message: "The error recorded for download \(self.id) cannot be read (column downloads.error: \(reason)).",
                        hint: "The download's state is kept; resume it to try again, or cancel it.", subject: "downloads.error")
                }
            },
            url: URL(string: self.url) ?? URL(filePath: "/"), sha256: self.sha256, unpackedLength: self.unpackedLength,
            destination: self.destination, bytesReceived: self.bytesReceived, priority: self.priority ?? .essential,
            delivery: self.delivery ?? .essential, index: self.indexReference?.value, releaseDate: self.releaseDate)
        if let stored = self.sources?.value {
            download.sources = stored.urls
            download.credentialsToAllSources = stored.credentialsToAllSources
        }
        return download
    }

    /// Why the recorded index reference cannot be read, when it cannot: the download then has none (see ``download``).
    var unreadableIndexReference: String? {
        guard case .unreadable(_, let reason)? = self.indexReference else { return nil }
        return reason
    }
}

/// A value kept as JSON in one column. GRDB reads and writes it as a ``DatabaseValueConvertible`` whose
/// text is its JSON (GRDB's JSON encoder and decoder for such values). A text that cannot be decoded is
/// never read as no value: it stays `unreadable`, with the decoder's reason, for the reader to report, and
/// is written back as it was.
enum JSONColumn<Value: Codable & Sendable>: Sendable {
    case value(Value)
    /// The column's text, and why it cannot be decoded.
    case unreadable(text: String, reason: String)

    var value: Value? {
        guard case .value(let value) = self else { return nil }
        return value
    }
}

extension JSONColumn: Codable {
    init(from decoder: any Decoder) throws { self = .value(try Value(from: decoder)) }

    func encode(to encoder: any Encoder) throws {
        switch self {
        case .value(let value): try value.encode(to: encoder)
        case .unreadable(let text, _):
            var container = encoder.singleValueContainer()
            try container.encode(text)
        }
    }
}

extension JSONColumn: DatabaseValueConvertible {
    var databaseValue: DatabaseValue {
        switch self {
        case .value(let value):
            // The values kept this way hold only strings and integers, which JSON always encodes.
            guard let data = try? Self.databaseJSONEncoder().encode(value) else { return .null }
            return String(decoding: data, as: UTF8.self).databaseValue
        case .unreadable(let text, _):
            return text.databaseValue
        }
    }

    static func fromDatabaseValue(_ dbValue: DatabaseValue) -> Self? {
        // NULL is no value: GRDB decodes an optional column through here, and nil makes it nil.
        if dbValue.isNull { return nil }
        guard case .string(let text) = dbValue.storage else {
            return .unreadable(text: "\(dbValue)", reason: "it is not text")
        }
        do {
            return .value(try Self.databaseJSONDecoder().decode(Value.self, from: Data(text.utf8)))
        } catch let error as DecodingError {
            let reason =
                switch error {
                case .dataCorrupted(let context): context.debugDescription
                case .keyNotFound(let key, _): "the key \(key.stringValue) is missing"
                case .typeMismatch(_, let context), .valueNotFound(_, let context):
                    "\(context.codingPath.map(\.stringValue).joined(separator: ".")): \(context.debugDescription)"
                @unknown default: "\(error)"
                }
            return .unreadable(text: text, reason: reason)
        } catch {
            return .unreadable(text: text, reason: "\(error)")
        }
    }
}

/// A row of `installs`: a pack installed at `<root of destination>/<contentIdentifier>`, found by product until removed.
///
/// One row per install path: a content identifier belongs to one product at a time.
struct InstallRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "installs"
    var destination: Destination
    var contentIdentifier: String
    var productIdentifier: String
    var contentVersion: String
    var contentURL: String
    var installedAt: Date
    var downloadID: String
    /// Regular files and symlinks recorded in `installedFiles`; -1 for installs made before files were recorded.
    var fileCount: Int
    var byteCount: Int64
    /// When the content was last used (a lease, ``DownloadQueue/contentURL(forProductID:)``, `packs content`); nil
    /// until then, when its install time counts.
    var lastUsedAt: Date? = nil

    /// Every column of the table, for the queries that name one (`StoreTests` checks they match the table).
    enum Columns: String, ColumnExpression, CaseIterable {
        case destination, contentIdentifier, productIdentifier, contentVersion, contentURL, installedAt, downloadID
        case fileCount, byteCount, lastUsedAt
    }

    var content: InstalledContent {
        InstalledContent(
            productIdentifier: self.productIdentifier, contentIdentifier: self.contentIdentifier,
            contentVersion: self.contentVersion, contentURL: URL(filePath: self.contentURL),
            destination: self.destination, installedAt: self.installedAt)
    }
}

/// A row of `installedFiles`: one regular file or symlink of an install, as unpacked.
struct InstalledFileRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "installedFiles"
    var destination: Destination
    var contentIdentifier: String
    /// Relative to the install folder, `/`-separated.
    var path: String
    var kind: InstalledFile.Kind
    /// Bytes of a regular file (holes included); bytes of a symlink's target text.
    var size: Int64
    /// Hex SHA-256 of a regular file's bytes, or of a symlink's target text.
    var sha256: String
    /// The CRC-32 of the same bytes, for a zip pack's files (see ``InstalledFile/crc32``); nil when not known.
    var crc32: UInt32? = nil

    /// Every column of the table, for the queries that name one (`StoreTests` checks they match the table).
    enum Columns: String, ColumnExpression, CaseIterable {
        case destination, contentIdentifier, path, kind, size, sha256, crc32
    }
}

extension InstalledFile.Kind: DatabaseValueConvertible {}

/// A row of `transactionAccess`: what a transaction needs to reach its packs again — the manifest it came
/// from (read again when a pack's URL stops working) and the receipt it presents. Both are credentials
/// (a URL's query, a bearer token): they are stored, sent, and never shown.
struct TransactionAccessRecord: Codable, FetchableRecord, PersistableRecord, Sendable, Hashable {
    static let databaseTableName = "transactionAccess"
    var transactionID: String
    var manifestURL: String?
    var receipt: String?
}

/// An enum stored as its raw value, written into SQL text as a literal by the queries that must say a value as the
/// schema does: SQLite uses the partial index `downloads_unsettled` only for a query whose WHERE says
/// `state NOT IN ('finished', 'cancelled')` in so many words, which a bound argument does not.
protocol SQLLiteral: RawRepresentable<String> {}

extension SQLLiteral {
    /// The raw value as a quoted SQL string literal.
    var sqlLiteral: String { "'" + self.rawValue.replacingOccurrences(of: "'", with: "''") + "'" }
}

extension DownloadState: SQLLiteral {}
extension DeliveryPolicy: SQLLiteral {}

extension DownloadRecord {
    /// SQL: the download is neither finished nor cancelled (the condition of the partial index `downloads_unsettled`).
    static let unsettled = "state NOT IN (\(DownloadState.finished.sqlLiteral), \(DownloadState.cancelled.sqlLiteral))"
    /// SQL: the download is essential (NULL, from before delivery policies, is), so its transaction waits for it.
    static let holdsTransaction = "(downloads.delivery IS NULL OR downloads.delivery = \(DeliveryPolicy.essential.sqlLiteral))"
}
