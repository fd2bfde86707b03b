import Foundation
import GRDB

extension DownloadState: DatabaseValueConvertible {}
extension DownloadPhase: DatabaseValueConvertible {}
extension PauseReason: DatabaseValueConvertible {}
extension Destination: DatabaseValueConvertible {}
extension TransactionKind: DatabaseValueConvertible {}

/// A row of `transactions`.
struct TransactionRecord: Codable, FetchableRecord, PersistableRecord, Sendable {
    static let databaseTableName = "transactions"
    var id: String
    var productIdentifier: String
    var kind: TransactionKind
    var createdAt: Date
    var finishedAt: Date?
    var autoFinish: Bool

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let finishedAt = Column(CodingKeys.finishedAt)
        static let createdAt = Column(CodingKeys.createdAt)
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
    var error: String?
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
    /// A pause or cancel asked for by another process, for the process running the download.
    var request: String?
    /// The process (and queue in it) that runs the download; nil when none does. See ``QueueOwner``.
    var ownerPID: Int32?
    var ownerStart: Int64?
    var ownerQueue: String?
    /// The pack's index reference (JSON), for a delta update.
    var indexReference: String?

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let transactionID = Column(CodingKeys.transactionID)
        static let position = Column(CodingKeys.position)
        static let state = Column(CodingKeys.state)
        static let request = Column(CodingKeys.request)
        static let ownerQueue = Column(CodingKeys.ownerQueue)
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
        self.error = download.error.flatMap { try? String(decoding: JSONEncoder().encode($0), as: UTF8.self) }
        self.url = download.url.absoluteString
        self.sha256 = download.sha256
        self.unpackedLength = download.unpackedLength
        self.destination = download.destination
        self.bytesReceived = download.bytesReceived
        self.validator = validator
        self.partialPath = partialPath
        self.indexReference = download.index.flatMap { try? String(decoding: JSONEncoder().encode($0), as: UTF8.self) }
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
        Download(
            id: self.id, transactionID: self.transactionID, productIdentifier: self.productIdentifier,
            contentIdentifier: self.contentIdentifier, contentVersion: self.contentVersion, contentLength: self.contentLength,
            state: self.state, phase: self.phase, progress: self.progress, phaseProgress: 0, timeRemaining: -1,
            pauseReason: self.pauseReason,
            contentURL: self.contentURL.map { URL(filePath: $0) },
            error: self.error.flatMap { try? JSONDecoder().decode(PackDeliveryError.self, from: Data($0.utf8)) },
            url: URL(string: self.url) ?? URL(filePath: "/"), sha256: self.sha256, unpackedLength: self.unpackedLength,
            destination: self.destination, bytesReceived: self.bytesReceived,
            index: self.indexReference.flatMap { try? JSONDecoder().decode(Manifest.IndexReference.self, from: Data($0.utf8)) })
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

    enum Columns {
        static let destination = Column(CodingKeys.destination)
        static let productIdentifier = Column(CodingKeys.productIdentifier)
        static let contentIdentifier = Column(CodingKeys.contentIdentifier)
        static let installedAt = Column(CodingKeys.installedAt)
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

    enum Columns {
        static let destination = Column(CodingKeys.destination)
        static let contentIdentifier = Column(CodingKeys.contentIdentifier)
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
