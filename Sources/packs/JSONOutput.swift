import Foundation
import PackDelivery

/// What `--json` prints: one `Encodable` type per object, with the library's field names.
///
/// The library's own Codable types are printed as they encode themselves (``PackDeliveryError``, the state,
/// phase, reason and kind enums, ``Download/Delta``, ``Download/DeltaFallback``). A download, a transaction
/// and an installed pack have a shape of their own here: paths rather than file URLs, the pack's URL without
/// credentials, only what a reader needs, and `null` for a field that is unset rather than no key.
enum JSONOutput {
    /// One line of compact JSON: keys sorted, `/` not escaped, dates in ISO 8601 (`2025-03-01T12:00:00Z`).
    static func line(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        // Encoding fails only for a progress or time that is not a finite number.
        guard let data = try? encoder.encode(value) else { return "{}" }
        return Self.asciiControls(String(decoding: data, as: UTF8.self))
    }

    /// JSON with every character ``PackDeliveryError/printable(_:)`` escapes written as a `\uXXXX` escape: the
    /// encoder escapes C0 controls, but leaves DEL, C1 controls (a raw U+009B is a CSI), bidirectional controls and
    /// U+2028/U+2029 raw, and `--json` lines reach terminals too. Outside strings JSON is ASCII, so only strings
    /// change, and they decode to the same text.
    static func asciiControls(_ json: String) -> String {
        guard json.unicodeScalars.contains(where: PackDeliveryError.needsEscape) else { return json }
        var result = ""
        for scalar in json.unicodeScalars {
            if PackDeliveryError.needsEscape(scalar) {
                let hex = String(scalar.value, radix: 16, uppercase: true)
                result += "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}

/// Prints a value as one line of JSON on stdout.
func printJSON(_ value: some Encodable) {
    printLine(JSONOutput.line(value))
}

/// A value, or `null` when there is none (a synthesized `Encodable` leaves an optional's key out instead).
struct Nullable<Value: Encodable>: Encodable {
    let value: Value?

    init(_ value: Value?) { self.value = value }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        if let value = self.value { try container.encode(value) } else { try container.encodeNil() }
    }
}

/// A download, in `status` and in events (`"download"`, and `"priorityChanged"` when a waiting one was given
/// another priority): `"phase"`, `"pauseReason"`, `"contentURL"`, `"retryDate"` and
/// `"error"` are null when unset; `"delta"` and `"deltaFallback"` are there only for a delta update.
struct DownloadJSON: Encodable {
    /// `"download"` on an event line; no key in `status`.
    var event: String?
    let id: String
    let transactionID: String
    let productIdentifier: String
    let contentIdentifier: String
    let contentVersion: String
    let contentLength: Int64
    let destination: Destination
    /// How soon it starts while it waits.
    let priority: DownloadPriority
    /// When the pack is delivered: essential, prefetch or onDemand.
    let delivery: DeliveryPolicy
    /// The pack's URL without credentials.
    let url: String
    let state: DownloadState
    let phase: Nullable<DownloadPhase>
    let progress: Double
    let phaseProgress: Double
    let timeRemaining: Double
    let bytesReceived: Int64
    let pauseReason: Nullable<PauseReason>
    /// The installed folder's path.
    let contentURL: Nullable<String>
    let retryDate: Nullable<Date>
    let error: Nullable<PackDeliveryError>
    let delta: Download.Delta?
    let deltaFallback: Download.DeltaFallback?

    init(_ download: Download, event: String? = nil) {
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
struct TransactionJSON: Encodable {
    /// `"transaction"` on an event line; no key in `status`.
    var event: String?
    let id: String
    let productIdentifier: String
    let state: String
    let kind: TransactionKind
    let finishable: Bool
    let downloads: [DownloadJSON]

    init(_ transaction: Transaction, event: String? = nil) {
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
struct RestoreEventJSON: Encodable {
    let event: String
    var transactions: [String]?
    var error: PackDeliveryError?
}

/// `status`: every unfinished transaction.
struct StatusJSON: Encodable {
    let transactions: [TransactionJSON]
    /// Packs evicted from the caches (known, not installed; fetch them again); no key when there are none.
    var evicted: [EvictedJSON]? = nil
}

/// An installed pack: a line of `content`, with `"missing"`; an element of `verify`'s `"contents"`, with
/// `"intact"`, `"folderMissing"`, `"filesRecorded"` and `"damage"`.
struct InstalledJSON: Encodable {
    struct Damage: Encodable {
        let path: String
        let problem: VerifyResult.Damage.Problem
    }

    let productIdentifier: String
    let contentIdentifier: String
    let contentVersion: String
    /// The installed folder's path.
    let contentURL: String
    let destination: Destination
    var missing: Bool?
    var intact: Bool?
    var folderMissing: Bool?
    var filesRecorded: Bool?
    var damage: [Damage]?

    init(_ content: InstalledContent) {
        self.productIdentifier = content.productIdentifier
        self.contentIdentifier = content.contentIdentifier
        self.contentVersion = content.contentVersion
        self.contentURL = content.contentURL.path
        self.destination = content.destination
    }

    init(_ result: VerifyResult) {
        self.init(result.content)
        self.intact = result.isIntact
        self.folderMissing = result.folderMissing
        self.filesRecorded = result.filesRecorded
        self.damage = result.damage.map { Damage(path: $0.path, problem: $0.problem) }
    }
}

/// `verify`: whether everything is intact, and each pack checked.
struct VerifyJSON: Encodable {
    let intact: Bool
    let contents: [InstalledJSON]
}

/// An evicted pack: an `"evicted"` event line (fetch, gc), an element of `status`'s `"evicted"`, a line of `content`
/// with `"evicted": true`, and a line of `gc --dry-run` (`"event": "wouldEvict"`).
struct EvictedJSON: Encodable {
    var event: String?
    let productIdentifier: String
    let contentIdentifier: String
    let contentVersion: String
    let destination: Destination
    let byteCount: Int64
    let evictedAt: Date
    var evicted: Bool?

    init(_ content: EvictedContent, event: String? = nil) {
        self.event = event
        self.productIdentifier = content.productIdentifier
        self.contentIdentifier = content.contentIdentifier
        self.contentVersion = content.contentVersion
        self.destination = content.destination
        self.byteCount = content.byteCount
        self.evictedAt = content.evictedAt
    }
}
