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

    enum Columns {
        static let id = Column(CodingKeys.id)
        static let transactionID = Column(CodingKeys.transactionID)
        static let position = Column(CodingKeys.position)
        static let state = Column(CodingKeys.state)
        static let request = Column(CodingKeys.request)
    }

    init(_ download: Download, position: Int, validator: String?, partialPath: String?, stagingInode: Int64?, retriedFromZero: Bool, verified: Bool) {
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
        self.stagingInode = stagingInode
        self.retriedFromZero = retriedFromZero
        self.verified = verified
        self.request = nil
    }

    var download: Download {
        Download(id: self.id, transactionID: self.transactionID, productIdentifier: self.productIdentifier,
                 contentIdentifier: self.contentIdentifier, contentVersion: self.contentVersion, contentLength: self.contentLength,
                 state: self.state, phase: self.phase, progress: self.progress, phaseProgress: 0, timeRemaining: -1, pauseReason: self.pauseReason,
                 contentURL: self.contentURL.map { URL(filePath: $0) },
                 error: self.error.flatMap { try? JSONDecoder().decode(PackDeliveryError.self, from: Data($0.utf8)) },
                 url: URL(string: self.url) ?? URL(filePath: "/"), sha256: self.sha256, unpackedLength: self.unpackedLength,
                 destination: self.destination, bytesReceived: self.bytesReceived)
    }
}

/// A row of `installedContent`: what is installed, found by product until removed.
struct InstalledContentRecord: Codable, FetchableRecord, PersistableRecord, Sendable {
    static let databaseTableName = "installedContent"
    var contentIdentifier: String
    var productIdentifier: String
    var contentVersion: String
    var contentURL: String
    var destination: Destination
    var installedAt: Date
    var downloadID: String

    enum Columns {
        static let productIdentifier = Column(CodingKeys.productIdentifier)
        static let contentIdentifier = Column(CodingKeys.contentIdentifier)
    }

    var content: InstalledContent {
        InstalledContent(productIdentifier: self.productIdentifier, contentIdentifier: self.contentIdentifier,
                         contentVersion: self.contentVersion, contentURL: URL(filePath: self.contentURL),
                         destination: self.destination, installedAt: self.installedAt)
    }
}
