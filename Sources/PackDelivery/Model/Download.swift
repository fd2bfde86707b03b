import Foundation

/// Where a pack's content is installed.
public enum Destination: String, Sendable, Hashable, Codable, CaseIterable {
    /// May be purged by the system and fetched again.
    case caches
    /// Kept; marked as not for backup, since it can be downloaded again.
    case documents
}

/// The state of one download, in StoreKit's vocabulary.
public enum DownloadState: String, Sendable, Hashable, Codable, CaseIterable {
    case waiting, active, paused, finished, failed, cancelled

    /// Whether the download can still change without a caller asking (waiting or active).
    public var isRunning: Bool { self == .waiting || self == .active }
    /// Whether the download needs nothing more to let its transaction finish.
    public var isSettled: Bool { self == .finished || self == .cancelled }
}

/// What an `active` download is doing right now (StoreKit hid this; Play Asset Delivery calls it TRANSFERRING).
public enum DownloadPhase: String, Sendable, Hashable, Codable, CaseIterable {
    case downloading, verifying, unpacking, installing
}

/// Why a download is `paused`.
public enum PauseReason: String, Sendable, Hashable, Codable {
    /// Someone asked for it (`pause`, Ctrl-C).
    case user
    /// Not enough free space; see the download's error for needed and available bytes.
    case insufficientStorage
    /// The process stopped while it was running; it resumes on the next launch.
    case interrupted
}

/// One pack of one transaction — PackDelivery's `SKDownload`.
public struct Download: Sendable, Hashable, Codable, Identifiable {
    public var id: String
    public var transactionID: String
    public var productIdentifier: String
    public var contentIdentifier: String
    public var contentVersion: String
    /// The pack's size in bytes, from the manifest.
    public var contentLength: Int64
    public var state: DownloadState
    /// What an active download is doing; `nil` in other states.
    public var phase: DownloadPhase?
    /// Bytes known good ÷ `contentLength`, 0…1; exactly 1 when finished.
    public var progress: Double
    /// 0…1 within the current phase: moves during a long unpack, while `progress` stays at 1.
    public var phaseProgress: Double = 0
    /// Seconds left, or -1 while unknown.
    public var timeRemaining: Double
    /// Why the download is paused, when it is.
    public var pauseReason: PauseReason?
    /// The installed folder, once finished.
    public var contentURL: URL?
    /// Why the download failed or paused, when it did.
    public var error: PackDeliveryError?
    /// The pack's URL on the content server.
    public var url: URL
    /// Hex SHA-256 of the pack, from the manifest.
    public var sha256: String
    /// Unpacked size in bytes, when the manifest gives it.
    public var unpackedLength: Int64?
    public var destination: Destination
    /// Bytes of the pack on disk and known good.
    public var bytesReceived: Int64
}

/// Whether a transaction is a purchase or a restore of an earlier purchase.
public enum TransactionKind: String, Sendable, Hashable, Codable {
    case purchased, restored
}

/// A purchase or restore of one product, holding its downloads; unfinished until ``DownloadQueue/finish(_:)``.
public struct Transaction: Sendable, Hashable, Codable, Identifiable {
    public var id: String
    public var productIdentifier: String
    public var kind: TransactionKind
    public var createdAt: Date
    public var finishedAt: Date?
    /// Whether the CLI (or host) should finish it on its own once every download is settled.
    public var autoFinish: Bool
    public var downloads: [Download]

    /// Every download is finished or cancelled, so ``DownloadQueue/finish(_:)`` is allowed.
    public var isFinishable: Bool { self.downloads.allSatisfy { $0.state.isSettled } }
    public var isFinished: Bool { self.finishedAt != nil }
}

/// Content installed for a product, findable until removed.
public struct InstalledContent: Sendable, Hashable, Codable {
    public var productIdentifier: String
    public var contentIdentifier: String
    public var contentVersion: String
    public var contentURL: URL
    public var destination: Destination
    public var installedAt: Date
}

/// A change the queue reports, in order, to observers and to ``DownloadQueue/events()``.
public enum DownloadQueueEvent: Sendable, Hashable {
    /// A transaction was added, delivered again on launch, or finished.
    case transactionUpdated(Transaction)
    /// A download changed state, phase or progress.
    case downloadUpdated(Download)
}
