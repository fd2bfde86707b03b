import Foundation
import PackDelivery

// The JSON shapes of `packs status --json` and of `--json` event lines, shared by the CLI and the agent's API
// (`GET /v1/downloads` answers what `packs status --json` prints; `GET /v1/events` carries the event lines). Each is
// Codable: the agent and the CLI write them, and the CLI reads them back (`AgentJSON.decoder`), with no second copy
// of their fields.

/// A value, or `null` when there is none (a synthesized `Encodable` leaves an optional's key out instead).
public struct Nullable<Value: Codable>: Codable {
    public let value: Value?

    public init(_ value: Value?) { self.value = value }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        self.value = container.decodeNil() ? nil : try container.decode(Value.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        if let value = self.value { try container.encode(value) } else { try container.encodeNil() }
    }
}

/// A download, in `status` and in events (`"download"`, and `"priorityChanged"` when a waiting one was given
/// another priority): `"phase"`, `"pauseReason"`, `"contentURL"`, `"retryDate"` and
/// `"error"` are null when unset; `"delta"` and `"deltaFallback"` are there only for a delta update.
public struct DownloadJSON: Codable {
    /// `"download"` on an event line; no key in `status`.
    public var event: String?
    public let id: String
    public let transactionID: String
    public let productIdentifier: String
    public let contentIdentifier: String
    public let contentVersion: String
    public let contentLength: Int64
    public let destination: Destination
    /// How soon it starts while it waits.
    public let priority: DownloadPriority
    /// When the pack is delivered: essential, prefetch or onDemand.
    public let delivery: DeliveryPolicy
    /// The pack's URL without credentials.
    public let url: String
    public let state: DownloadState
    public let phase: Nullable<DownloadPhase>
    public let progress: Double
    public let phaseProgress: Double
    public let timeRemaining: Double
    public let bytesReceived: Int64
    public let pauseReason: Nullable<PauseReason>
    /// The installed folder's path.
    public let contentURL: Nullable<String>
    public let retryDate: Nullable<Date>
    public let error: Nullable<PackDeliveryError>
    public let delta: Download.Delta?
    public let deltaFallback: Download.DeltaFallback?

    public init(_ download: Download, event: String? = nil) {
        self.event = event
        self.id = download.id
        self.transactionID = download.transactionID
        self.productIdentifier = download.productIdentifier
        self.contentIdentifier = download.contentIdentifier
        self.contentVersion = download.contentVersion
        self.contentLength = download.contentLength
        self.destination = download.destination
        self.priority = download.priority
        self.delivery = download.delivery
        self.url = download.redactedURL
        self.state = download.state
        self.phase = Nullable(download.phase)
        self.progress = download.progress
        self.phaseProgress = download.phaseProgress
        self.timeRemaining = download.timeRemaining
        self.bytesReceived = download.bytesReceived
        self.pauseReason = Nullable(download.pauseReason)
        self.contentURL = Nullable(download.contentURL?.path)
        self.retryDate = Nullable(download.retryDate)
        self.error = Nullable(download.error)
        self.delta = download.delta
        self.deltaFallback = download.deltaFallback
    }
}

/// A transaction, in `status` and in events; `"state"` is `"finished"` once finished, else its kind.
public struct TransactionJSON: Codable {
    /// `"transaction"` on an event line; no key in `status`.
    public var event: String?
    public let id: String
    public let productIdentifier: String
    public let state: String
    public let kind: TransactionKind
    public let finishable: Bool
    public let downloads: [DownloadJSON]

    public init(_ transaction: Transaction, event: String? = nil) {
        self.event = event
        self.id = transaction.id
        self.productIdentifier = transaction.productIdentifier
        self.state = transaction.state.rawValue
        self.kind = transaction.kind
        self.finishable = transaction.isFinishable
        self.downloads = transaction.downloads.map { DownloadJSON($0) }
    }
}

/// The event line of a restore: `"transactions"` (their ids) when it completed, `"error"` when it failed.
public struct RestoreEventJSON: Encodable {
    public let event: String
    public var transactions: [String]?
    public var error: PackDeliveryError?

    public init(event: String, transactions: [String]? = nil, error: PackDeliveryError? = nil) {
        self.event = event
        self.transactions = transactions
        self.error = error
    }
}

/// `status`: every unfinished transaction.
public struct StatusJSON: Codable {
    public let transactions: [TransactionJSON]
    /// Packs evicted from the caches (known, not installed; fetch them again); no key when there are none.
    public var evicted: [EvictedJSON]? = nil

    public init(transactions: [TransactionJSON], evicted: [EvictedJSON]? = nil) {
        self.transactions = transactions
        self.evicted = evicted
    }
}

/// An evicted pack: an `"evicted"` event line (fetch, gc), an element of `status`'s `"evicted"`, a line of `content`
/// with `"evicted": true`, and a line of `gc --dry-run` (`"event": "wouldEvict"`).
public struct EvictedJSON: Codable {
    public var event: String?
    public let productIdentifier: String
    public let contentIdentifier: String
    public let contentVersion: String
    public let destination: Destination
    public let byteCount: Int64
    public let evictedAt: Date
    public var evicted: Bool?

    public init(_ content: EvictedContent, event: String? = nil) {
        self.event = event
        self.productIdentifier = content.productIdentifier
        self.contentIdentifier = content.contentIdentifier
        self.contentVersion = content.contentVersion
        self.destination = content.destination
        self.byteCount = content.byteCount
        self.evictedAt = content.evictedAt
    }
}
