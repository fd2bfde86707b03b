import Foundation

/// Where a pack's content is installed.
public enum Destination: String, Sendable, Hashable, Codable, CaseIterable {
    /// May be purged by the system and fetched again.
    case caches
    /// Kept; marked as not for backup, since it can be downloaded again.
    case documents
}

/// The state of one download, in StoreKit's vocabulary.
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum DownloadState: String, Sendable, Hashable, Codable, CaseIterable {
    /// `waiting`: queued for a slot; `active`: transferring, verifying, unpacking or installing (see ``Download/phase``);
    /// `paused`: stopped with its bytes kept (see ``Download/pauseReason``); `finished`: installed at ``Download/contentURL``;
    /// `failed`: gave up (see ``Download/error``), can be resumed; `cancelled`: stopped and its partial data deleted.
    case waiting, active, paused, finished, failed, cancelled

    /// Whether the download can still change without a caller asking (waiting or active).
    public var isRunning: Bool { self == .waiting || self == .active }
    /// Whether the download needs nothing more to let its transaction finish.
    public var isSettled: Bool { self == .finished || self == .cancelled }
}

/// What an `active` download is doing right now (StoreKit hid this; Play Asset Delivery calls it TRANSFERRING).
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum DownloadPhase: String, Sendable, Hashable, Codable, CaseIterable {
    /// `downloading`: bytes are arriving; `verifying`: the SHA-256 is being checked; `unpacking`: the archive is being
    /// extracted into staging; `installing`: the unpacked folder is being moved into place.
    ///
    /// A pack is unpacked while it downloads (``DownloadQueue/Configuration/streamingUnpack``): the phase stays
    /// `downloading` while both run, with ``Download/progress`` for the bytes and ``Download/phaseProgress`` for
    /// the unpack; then `verifying` (the digest comparison), `unpacking` (while the unpack catches up with the
    /// last bytes, and for a zip while its central directory's types and modes are applied) and `installing`.
    case downloading, verifying, unpacking, installing
}

/// How soon a waiting download starts: the queue admits downloads by priority, then in the order they were added.
///
/// From first to last: ``userInitiated``, ``essential``, ``restore``, ``prefetch``, ``background``. A purchase's
/// downloads start `essential` and a restore's `restore`; ``DownloadQueue/setPriority(_:_:)`` changes it while a
/// download waits. Priority decides which waiting download takes a free slot next, and a running download is never
/// stopped for another; but a ``userInitiated`` download does not wait for ``restore``, ``prefetch`` or
/// ``background`` work that holds every slot: each such running download lends its slot to one, which starts beside
/// it (in the agent, across every home it serves).
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum DownloadPriority: String, Sendable, Hashable, Codable, CaseIterable, Comparable {
    /// Content the user asked for and waits for now: ahead of everything.
    case userInitiated
    /// A purchase's content: the default.
    case essential
    /// Content delivered again by a restore.
    case restore
    /// Content fetched ahead of need.
    case prefetch
    /// Whenever nothing else waits.
    case background

    /// Admission order: 0 starts first.
    var rank: Int { Self.allCases.firstIndex(of: self)! }

    /// Whether `a` starts before `b`.
    public static func < (a: Self, b: Self) -> Bool { a.rank < b.rank }
}

/// When a pack is delivered, from the manifest's `"delivery"` (Background Assets' download policies, Play Asset
/// Delivery's install-time, fast-follow and on-demand packs).
///
/// A transaction is finishable once its ``essential`` packs are installed; ``prefetch`` packs follow at
/// ``DownloadPriority/prefetch`` and are reported as they land; ``onDemand`` packs are recorded (paused,
/// ``PauseReason/onDemand``) and nothing is fetched until ``DownloadQueue/ensureAvailable(contentIDs:from:priority:)``
/// or a resume asks for them.
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum DeliveryPolicy: String, Sendable, Hashable, Codable, CaseIterable {
    /// Needed before the content can be used: the transaction waits for it (the default, and every pack of a
    /// manifest that says nothing).
    case essential
    /// Fetched after the essential packs, at a lower priority; the transaction does not wait for it.
    case prefetch
    /// Fetched only when asked for.
    case onDemand
}

/// Why a download is `paused`.
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum PauseReason: String, Sendable, Hashable, Codable {
    /// Someone asked for it (`pause`, Ctrl-C).
    case user
    /// Not enough free space; see the download's error for needed and available bytes.
    case insufficientStorage
    /// The process stopped while it was running; it resumes on the next launch.
    case interrupted
    /// Added with `start: false`: it waits for ``DownloadQueue/start(_:)-17zz2``, like a StoreKit download before `start`.
    case notStarted
    /// The server refused the credentials (401, 403), even fresh ones from the credential provider; see the
    /// download's error for what the server said. Renew them, then resume: the bytes kept are kept.
    case unauthorized
    /// An on-demand pack (``DeliveryPolicy/onDemand``): recorded as available, fetched only when asked for
    /// (``DownloadQueue/ensureAvailable(contentIDs:from:priority:)``, or its id resumed).
    case onDemand
    /// The connection is metered (``NetworkPolicy``) and the pack is larger than the queue's limit
    /// (``DownloadQueue/Configuration/meteredLimit``): it waits, its bytes kept, until the connection is not metered,
    /// or ``DownloadQueue/allowMetered(_:)``.
    case waitingForUnmeteredNetwork
    /// Restore, prefetch or background work outside the machine's window for background work (``MachineSettings/schedule``,
    /// `packs config schedule`): it waits, its bytes kept, and goes on by itself once the window opens.
    case outsideWindow
    /// Prefetch or background work while someone holds quiet (``DownloadQueue/holdQuiet(reason:)``, `packs quiet`): it
    /// waits, its bytes kept, and goes on by itself once every hold is released.
    case quiet
    /// A preload pack (``Manifest/Content/preload``) whose bytes are in and checked, kept encrypted: it waits for its key.
    /// From ``Download/releaseDate`` on (never before), the queue asks the key server for it, with backoff (1 s doubling
    /// to 5 min, never sooner than the server's `Retry-After`), then decrypts and installs it without fetching its bytes
    /// again. A refusal for good (a credential that does not cover the product, a key the server does not hand out)
    /// keeps it paused here, its bytes kept, with ``Download/error`` set (``PackDeliveryError/Code/preloadKeyRefused``):
    /// show it and offer to renew the purchase; the key is asked for again when the download is resumed.
    case awaitingRelease

    /// Held by the machine's policy (the network, the window, quiet), not by anyone's action: it goes on by itself.
    var isPolicyHold: Bool { self == .waitingForUnmeteredNetwork || self == .outsideWindow || self == .quiet }
}

/// One pack of one transaction — PackDelivery's `SKDownload`.
public struct Download: Sendable, Hashable, Codable, Identifiable {
    /// The download's unique id, as ``DownloadQueue/pause(_:)``, ``DownloadQueue/cancel(_:)`` and ``DownloadQueue/resume(_:)`` take it.
    public var id: String
    /// The id of the ``Transaction`` this download belongs to.
    public var transactionID: String
    /// The product the pack belongs to.
    public var productIdentifier: String
    /// The pack's identifier from the manifest, also the name of the folder it installs into.
    public var contentIdentifier: String
    /// The pack's version from the manifest.
    public var contentVersion: String
    /// The pack's size in bytes, from the manifest.
    public var contentLength: Int64
    /// Where the download is in its life: waiting, active, paused, finished, failed or cancelled.
    public var state: DownloadState
    /// What an active download is doing; `nil` in other states.
    public var phase: DownloadPhase?
    /// Bytes known good ÷ `contentLength`, 0…1; exactly 1 when finished.
    public var progress: Double
    /// 0…1 within the current phase: moves during a long unpack, while `progress` stays at 1; while `downloading`,
    /// how far the unpack that runs beside the download has got (0 when none runs).
    public var phaseProgress: Double = 0
    /// Estimated seconds left to download, or -1 while unknown (and outside the `downloading` phase); 0 once finished.
    public var timeRemaining: Double
    /// The download's current rate in bytes per second (smoothed over a few seconds), while downloading; nil otherwise.
    public var bytesPerSecond: Double? = nil
    /// Why the download is paused, when it is.
    public var pauseReason: PauseReason?
    /// The installed folder, once finished.
    public var contentURL: URL?
    /// Why the download failed or paused, or the error an active download is retrying after; nil otherwise.
    public var error: PackDeliveryError?
    /// While an active download waits to try again after ``error``: when the next attempt starts (for example
    /// after a server's `503` with `Retry-After`). Nil otherwise.
    public var retryDate: Date? = nil
    /// The pack's URL on the content server: the source the download fetches from now (or last did), one of
    /// ``sources`` when the manifest names several.
    public var url: URL
    /// ``url`` without credentials (user info dropped, a query shown as `?…`), for display and logs.
    public var redactedURL: String { self.url.redacted }
    /// The source in use, as host and path only (no scheme, credentials, port or query): `cdn.example.com/packs/forest.zip`.
    public var source: String { Self.sourceName(self.url) }
    /// Every place the pack is fetched from, in the order the manifest gives them (its `url` and `urls` resolved
    /// against its mirrors); nil when the manifest names one only (``url``).
    public var sources: [URL]? = nil
    /// Whether credentials go to every source; otherwise only to those of the same origin as the manifest.
    var credentialsToAllSources = false
    /// Hex SHA-256 of the pack, from the manifest.
    public var sha256: String
    /// Unpacked size in bytes, when the manifest gives it.
    public var unpackedLength: Int64?
    /// Where the pack is installed: caches or documents.
    public var destination: Destination
    /// Bytes of the pack on disk and known good; during a delta update, bytes of the changed entries fetched
    /// and checked so far, out of ``Delta/bytesToFetch``.
    public var bytesReceived: Int64
    /// While this download is a delta update: what it fetches and what it reuses; nil for a whole pack.
    public var delta: Delta? = nil
    /// Why a delta update was not used for this new version, when one was tried (the whole pack is fetched instead).
    public var deltaFallback: DeltaFallback? = nil
    /// How soon it starts while it waits (``DownloadPriority``).
    public var priority: DownloadPriority = .essential
    /// When the pack is delivered (the manifest's `"delivery"`): ``DeliveryPolicy/essential`` unless it says otherwise.
    public var delivery: DeliveryPolicy = .essential
    /// The pack's index (absolute URL), when the manifest names one.
    var index: Manifest.IndexReference? = nil
    /// For a preload pack (``Manifest/Content/preload``): when its key is released, from the manifest; nil for any other
    /// pack. Until then the download is `paused` (``PauseReason/awaitingRelease``) once its encrypted bytes are in, and
    /// no key is asked for; from then on the queue asks for it.
    public var releaseDate: Date? = nil

    /// A delta update: the new version built from the installed files that did not change and the changed
    /// entries of the new pack, fetched with range requests.
    ///
    /// While it runs, ``Download/progress``, ``Download/timeRemaining`` and ``Download/bytesReceived`` count
    /// the bytes to fetch, whose total is ``bytesToFetch``; ``Download/contentLength`` stays the whole pack's.
    public struct Delta: Sendable, Hashable, Codable {
        /// Bytes of the pack fetched with range requests (the changed entries, and the gaps between close ones).
        public var bytesToFetch: Int64
        /// Bytes of installed files reused: linked, or copied, into the new version.
        public var bytesReused: Int64
        /// Entries fetched.
        public var entriesToFetch: Int
        /// Installed files reused.
        public var filesReused: Int
        /// Bytes of ``bytesToFetch`` already kept from an earlier attempt (a pause, a kill).
        public var bytesKept: Int64
        /// Chunks fetched from the pack, for a chunked pack (tar, tar.zst, tar.gz) updated chunk by chunk: each
        /// chunk once, however many files hold it (one fetched again after a mismatch still counts once); 0 for a
        /// pack updated entry by entry (a zip).
        public var chunksFetched: Int = 0
        /// Chunks of the new version's files taken from the installed version instead of fetched: the chunks of
        /// files reused whole, and chunks read from other installed files; 0 for a pack updated entry by entry.
        public var chunksReused: Int = 0
        /// Bytes of the pack fetched with range requests so far for this update: bytes kept from an earlier attempt
        /// included, a range fetched again after a mismatch counted again. Once the update has fetched everything,
        /// what the server sent for its ranges (``bytesToFetch`` when nothing was fetched twice).
        public var bytesFetched: Int64 = 0
    }

    /// Why a delta update was not used: the whole pack is fetched instead.
    public struct DeltaFallback: Sendable, Hashable, Codable, CustomStringConvertible {
        /// Match on this, never on ``message``.
        ///
        /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
        public enum Reason: String, Sendable, Hashable, Codable {
            /// The server answered a range request with the whole file (200), with 416, or with another range.
            case rangesNotSupported
            /// An installed file is missing, or changed since the install.
            case installedFilesChanged
            /// The delta would fetch more than 60% of the pack.
            case tooMuchChanged
            /// The pack's index could not be fetched, does not match the manifest, or does not describe the pack.
            case indexUnusable
            /// The pack is not served over http(s).
            case notServedOverHTTP
        }

        public var reason: Reason
        /// A sentence for people (logs, `--verbose`), naming the file or the numbers involved.
        public var message: String
        public var description: String { self.message }

        public init(_ reason: Reason, _ message: String) {
            self.reason = reason
            self.message = message
        }
    }
}

extension Download {
    /// Decodes a download; ``priority`` and ``delivery``, added later, are `essential` when absent.
    ///
    /// - Parameter decoder: the decoder to read from.
    /// - Throws: `DecodingError` when a field is missing or has another type.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.id = try c.decode(String.self, forKey: .id)
        self.transactionID = try c.decode(String.self, forKey: .transactionID)
        self.productIdentifier = try c.decode(String.self, forKey: .productIdentifier)
        self.contentIdentifier = try c.decode(String.self, forKey: .contentIdentifier)
        self.contentVersion = try c.decode(String.self, forKey: .contentVersion)
        self.contentLength = try c.decode(Int64.self, forKey: .contentLength)
        self.state = try c.decode(DownloadState.self, forKey: .state)
        self.phase = try c.decodeIfPresent(DownloadPhase.self, forKey: .phase)
        self.progress = try c.decode(Double.self, forKey: .progress)
        self.phaseProgress = try c.decode(Double.self, forKey: .phaseProgress)
        self.timeRemaining = try c.decode(Double.self, forKey: .timeRemaining)
        self.bytesPerSecond = try c.decodeIfPresent(Double.self, forKey: .bytesPerSecond)
        self.pauseReason = try c.decodeIfPresent(PauseReason.self, forKey: .pauseReason)
        self.contentURL = try c.decodeIfPresent(URL.self, forKey: .contentURL)
        self.error = try c.decodeIfPresent(PackDeliveryError.self, forKey: .error)
        self.retryDate = try c.decodeIfPresent(Date.self, forKey: .retryDate)
        self.url = try c.decode(URL.self, forKey: .url)
        self.sha256 = try c.decode(String.self, forKey: .sha256)
        self.unpackedLength = try c.decodeIfPresent(Int64.self, forKey: .unpackedLength)
        self.destination = try c.decode(Destination.self, forKey: .destination)
        self.bytesReceived = try c.decode(Int64.self, forKey: .bytesReceived)
        self.delta = try c.decodeIfPresent(Delta.self, forKey: .delta)
        self.deltaFallback = try c.decodeIfPresent(DeltaFallback.self, forKey: .deltaFallback)
        self.priority = try c.decodeIfPresent(DownloadPriority.self, forKey: .priority) ?? .essential
        self.delivery = try c.decodeIfPresent(DeliveryPolicy.self, forKey: .delivery) ?? .essential
        self.index = try c.decodeIfPresent(Manifest.IndexReference.self, forKey: .index)
        self.sources = try c.decodeIfPresent([URL].self, forKey: .sources)
        self.credentialsToAllSources = try c.decodeIfPresent(Bool.self, forKey: .credentialsToAllSources) ?? false
    }

    /// The pack's index at the source in use: a relative index URL was resolved against the first source's folder,
    /// so an index in that folder is fetched from the same folder of the source in use.
    var indexAtSource: Manifest.IndexReference? {
        guard var index = self.index, let first = self.sources?.first, first != self.url else { return self.index }
        let firstFolder = first.deletingLastPathComponent().absoluteString
        let folder = self.url.deletingLastPathComponent().absoluteString
        guard index.url.hasPrefix(firstFolder) else { return index }
        index.url = folder + index.url.dropFirst(firstFolder.count)
        return index
    }

    /// Whether the credentials of the download's transaction may go to the source in use: always for a pack with one
    /// source; for one with several, only to a source of the same origin (scheme, host, port) as the manifest (or, for a
    /// manifest built in memory or read from a file, as the first source), unless the manifest says they go to all.
    func mayCarryCredentials(manifestURL: String?) -> Bool {
        guard let sources = self.sources, !self.credentialsToAllSources else { return true }
        let manifest = manifestURL.flatMap { URL(string: $0) }.flatMap {
            ["http", "https"].contains($0.scheme?.lowercased() ?? "") ? $0 : nil
        }
        guard let reference = manifest ?? sources.first else { return true }
        return Self.origin(reference) == Self.origin(self.url)
    }

    /// Scheme, host and port: what a credential is bound to, and what measured throughput is kept for.
    static func origin(_ url: URL) -> String {
        let scheme = url.scheme?.lowercased() ?? ""
        if url.isFileURL { return "file://" }
        let port = url.port ?? (scheme == "https" ? 443 : scheme == "http" ? 80 : 0)
        return "\(scheme)://\(url.host?.lowercased() ?? ""):\(port)"
    }

    /// A source as host and path only, for events, errors and `packs sources`: never credentials or a query.
    static func sourceName(_ url: URL) -> String {
        if url.isFileURL { return url.path }
        return (url.host ?? "") + (url.path.isEmpty ? "/" : url.path)
    }
}

extension Download.Delta {
    private enum CodingKeys: String, CodingKey {
        case bytesToFetch, bytesReused, entriesToFetch, filesReused, bytesKept, chunksFetched, chunksReused, bytesFetched
    }

    /// Decodes a delta; the chunk counts and ``bytesFetched``, added later, are 0 when absent.
    ///
    /// - Parameter decoder: the decoder to read from.
    /// - Throws: `DecodingError` when a field is missing or has another type.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.bytesToFetch = try container.decode(Int64.self, forKey: .bytesToFetch)
        self.bytesReused = try container.decode(Int64.self, forKey: .bytesReused)
        self.entriesToFetch = try container.decode(Int.self, forKey: .entriesToFetch)
        self.filesReused = try container.decode(Int.self, forKey: .filesReused)
        self.bytesKept = try container.decode(Int64.self, forKey: .bytesKept)
        self.chunksFetched = try container.decodeIfPresent(Int.self, forKey: .chunksFetched) ?? 0
        self.chunksReused = try container.decodeIfPresent(Int.self, forKey: .chunksReused) ?? 0
        self.bytesFetched = try container.decodeIfPresent(Int64.self, forKey: .bytesFetched) ?? 0
    }
}

/// Whether a transaction is a purchase or a restore of an earlier purchase.
public enum TransactionKind: String, Sendable, Hashable, Codable {
    /// `purchased`: a new purchase; `restored`: content for an earlier purchase, delivered again.
    case purchased, restored
}

/// A purchase or restore of one product, holding its downloads; unfinished until ``DownloadQueue/finish(_:)-v92q``.
public struct Transaction: Sendable, Hashable, Codable, Identifiable {
    /// The transaction's unique id, as ``DownloadQueue/finish(_:)-v92q`` takes it.
    public var id: String
    /// The product bought or restored.
    public var productIdentifier: String
    /// Whether it is a purchase or a restore.
    public var kind: TransactionKind
    /// When the transaction was added to the queue.
    public var createdAt: Date
    /// When the transaction was finished; nil while it is open.
    public var finishedAt: Date?
    /// A flag for hosts that finish transactions themselves: the `packs` CLI finishes those that have it once they are finishable.
    ///
    /// The queue only records it and never acts on it.
    public var autoFinish: Bool
    /// One download per pack of the product, in the manifest's order.
    public var downloads: [Download]

    /// Every essential download is finished or cancelled, so ``DownloadQueue/finish(_:)-v92q`` is allowed: prefetch and
    /// on-demand packs (``DeliveryPolicy``) need not be installed yet.
    public var isFinishable: Bool { self.downloads.allSatisfy { $0.delivery != .essential || $0.state.isSettled } }
    /// Whether the transaction has been finished (``finishedAt`` is set).
    public var isFinished: Bool { self.finishedAt != nil }
    /// `finished` once finished, else what it is (`purchased` or `restored`), as `SKPaymentTransaction`'s
    /// `transactionState` says it; the `packs` CLI's JSON shows the same value.
    public var state: TransactionState {
        if self.isFinished { return .finished }
        switch self.kind {
        case .purchased: return .purchased
        case .restored: return .restored
        }
    }
}

/// Where a transaction is: open (`purchased` or `restored`), or `finished`.
public enum TransactionState: String, Sendable, Hashable, Codable {
    case purchased, restored, finished
}

/// Content installed for a product, findable until removed.
public struct InstalledContent: Sendable, Hashable, Codable {
    /// The product the pack belongs to.
    public var productIdentifier: String
    /// The pack's identifier from the manifest, also the name of its folder.
    public var contentIdentifier: String
    /// The installed version of the pack.
    public var contentVersion: String
    /// The folder holding the pack's unpacked content.
    public var contentURL: URL
    /// Whether the folder is under caches or documents.
    public var destination: Destination
    /// When the pack was moved into place.
    public var installedAt: Date
}

/// A regular file or symlink of installed content, as it was unpacked: what ``DownloadQueue/verify(productIDs:)-aepa`` compares against.
public struct InstalledFile: Sendable, Hashable, Codable {
    /// What the entry is.
    public enum Kind: String, Sendable, Hashable, Codable {
        /// `file`: a regular file; `symlink`: a symbolic link (its size and SHA-256 are those of its target text).
        case file, symlink
    }
    /// The path inside the install folder, `/`-separated.
    public var path: String
    /// A regular file or a symlink.
    public var kind: Kind
    /// Bytes of the file, or of the symlink's target text.
    public var size: Int64
    /// Hex SHA-256 of the file's bytes, or of the symlink's target text.
    public var sha256: String
    /// The CRC-32 of the same bytes, as the zip's central directory gives it (checked while unpacking); nil for
    /// a pack that is not a zip, and for files recorded again from the folder (after a crash, or a damaged
    /// state database).
    public var crc32: UInt32?

    /// Creates a file record.
    ///
    /// - Parameters:
    ///   - path: the path inside the install folder.
    ///   - kind: a regular file or a symlink.
    ///   - size: bytes of the file or of the link's target text.
    ///   - sha256: hex SHA-256 of the same bytes.
    public init(path: String, kind: Kind, size: Int64, sha256: String) {
        self.path = path
        self.kind = kind
        self.size = size
        self.sha256 = sha256
    }

    /// Creates a file record with the CRC-32 of its bytes.
    ///
    /// - Parameters:
    ///   - path: the path inside the install folder.
    ///   - kind: a regular file or a symlink.
    ///   - size: bytes of the file or of the link's target text.
    ///   - sha256: hex SHA-256 of the same bytes.
    ///   - crc32: their CRC-32 (zip's), nil when not known.
    public init(path: String, kind: Kind, size: Int64, sha256: String, crc32: UInt32?) {
        self.init(path: path, kind: kind, size: size, sha256: sha256)
        self.crc32 = crc32
    }
}

/// What ``DownloadQueue/verify(productIDs:)-aepa`` found in one installed pack.
public struct VerifyResult: Sendable, Hashable {
    /// One difference between the folder and the record made at install.
    public struct Damage: Sendable, Hashable {
        /// How a file differs.
        ///
        /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
        public enum Problem: String, Sendable, Hashable, Codable {
            /// `missing`: recorded but gone; `truncated`: shorter than recorded; `changed`: same size or longer but
            /// other bytes, or another kind of file; `extra`: present but not recorded.
            case missing, truncated, changed, extra
        }
        /// The path inside the install folder.
        public var path: String
        /// How it differs.
        public var problem: Problem
    }

    /// The installed pack.
    public var content: InstalledContent
    /// Every difference found, by path; empty when intact.
    public var damage: [Damage]
    /// Whether the install folder itself is missing.
    public var folderMissing: Bool
    /// Whether the files were recorded at install (installs made by versions before 0.2 only get a presence check).
    public var filesRecorded: Bool

    /// Whether the content is exactly as installed.
    public var isIntact: Bool { self.damage.isEmpty && !self.folderMissing }
}

/// The library's version, as sent in the `User-Agent` header.
public enum PackDeliveryVersion {
    /// `MAJOR.MINOR.PATCH`.
    public static let current = "0.2.0"
}

extension Download {
    /// Whether a first install of this download writes each byte once (fetching the pack's chunks into the new
    /// version's files, no archive kept): the manifest indexes the pack, it is served over http(s) as a `.tar` or
    /// `.tar.zst` of 16 MiB or more (``IndexDigests/minimumPackLength``: below it, a whole pack costs less than the
    /// index's request and the range requests, and keeps at most 16 MiB more on disk), and no fallback to the whole
    /// pack was decided. The index has the last word (a pack it does not describe as a chunked tar or tar.zst is
    /// fetched whole).
    var writesOnce: Bool {
        guard self.deltaFallback == nil, self.contentLength >= IndexDigests.minimumPackLength, let index = self.index,
            index.length <= PackIndex.maxBytes,
            ["http", "https"].contains(self.url.scheme?.lowercased() ?? "")
        else { return false }
        let path = self.url.path.lowercased()
        return path.hasSuffix(".tar") || path.hasSuffix(".tar.zst")
    }
}
