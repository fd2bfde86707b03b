import Foundation

/// How transfers run: rate, timeouts, extra headers, TLS.
public struct TransferOptions: Sendable, Hashable {
    /// Bytes per second per download; nil for no limit.
    public var maxBytesPerSecond: Int64?
    /// Seconds to wait for a connection.
    public var connectTimeout: TimeInterval
    /// Seconds without a single byte before a transfer counts as stalled and is retried; also the longest window
    /// over which ``lowSpeedLimit`` is measured. Pack, manifest and index requests all honour it.
    public var stallTimeout: TimeInterval
    /// Bytes per second below which a transfer counts as too slow (averaged over ``lowSpeedTime``, or over
    /// ``stallTimeout`` when that is shorter) and is retried; such retries always count against the limit, and the
    /// last one fails with `tooSlow`, naming the rate measured. 0 turns the speed check off (a transfer that
    /// receives nothing for the stall timeout still ends). Kept below half of ``maxBytesPerSecond`` when that is set.
    public var lowSpeedLimit: Int64
    /// Seconds over which ``lowSpeedLimit`` is measured; ``stallTimeout`` when that is shorter.
    public var lowSpeedTime: TimeInterval
    /// Extra request headers, as `Name: value` lines (for example `Authorization: Bearer …`).
    public var headers: [String]
    /// Whether TLS certificates are verified (on by default; turn off only for tests).
    public var verifyTLS: Bool
    /// Names of ``headers`` that carry credentials besides `Authorization`, `Cookie` and `Proxy-Authorization`
    /// (compared without case), for example `X-Api-Key`. Like a receipt, a credential header goes only to the sources
    /// of the manifest's origin, never to a mirror elsewhere (unless the manifest says `credentialsToAllSources`).
    public var secretHeaderNames: Set<String> = []
    /// The priority of the download these options are for: its share of the machine's rate cap (``RateBoard``).
    var ratePriority: DownloadPriority = .essential

    /// Creates transfer options; the defaults suit production use.
    ///
    /// - Parameters:
    ///   - maxBytesPerSecond: bytes per second per download; nil for no limit.
    ///   - connectTimeout: seconds to wait for a connection.
    ///   - stallTimeout: seconds without a byte before a transfer is retried, and the longest low-speed window.
    ///   - headers: extra request headers, as `Name: value` lines.
    ///   - verifyTLS: whether to verify TLS certificates.
    ///   - lowSpeedLimit: bytes per second below which a transfer is too slow; 0 for no limit.
    ///   - lowSpeedTime: seconds over which the low-speed limit is measured (at most `stallTimeout`).
    public init(
        maxBytesPerSecond: Int64? = nil, connectTimeout: TimeInterval = 30, stallTimeout: TimeInterval = 30,
        lowSpeedLimit: Int64 = 1024, lowSpeedTime: TimeInterval = 60,
        headers: [String] = [], verifyTLS: Bool = true
    ) {
        self.maxBytesPerSecond = maxBytesPerSecond
        self.connectTimeout = connectTimeout
        self.stallTimeout = stallTimeout
        self.lowSpeedLimit = max(0, lowSpeedLimit)
        self.lowSpeedTime = max(1, lowSpeedTime)
        self.headers = headers
        self.verifyTLS = verifyTLS
    }
}

extension TransferOptions {
    /// The header names that always carry credentials.
    static let credentialHeaderNames: Set<String> = ["authorization", "cookie", "proxy-authorization"]

    /// Whether a `Name: value` line of ``headers`` carries a credential (its name is one of
    /// ``credentialHeaderNames`` or ``secretHeaderNames``).
    func carriesCredential(_ line: String) -> Bool {
        let name = line.prefix { $0 != ":" }.trimmingCharacters(in: .whitespaces).lowercased()
        return Self.credentialHeaderNames.contains(name) || self.secretHeaderNames.contains { $0.lowercased() == name }
    }

    /// These options without the headers that carry credentials: for a source of another origin than the manifest's.
    var withoutCredentials: TransferOptions {
        var options = self
        options.headers = self.headers.filter { !self.carriesCredential($0) }
        return options
    }

    /// The low-speed limit in force: below half of the rate limit, so a throttled transfer never trips it.
    var effectiveLowSpeedLimit: Int64 {
        guard let rate = self.maxBytesPerSecond else { return self.lowSpeedLimit }
        return min(self.lowSpeedLimit, rate / 2)
    }

    /// The whole seconds over which the low-speed limit is measured: ``lowSpeedTime``, or ``stallTimeout`` when that
    /// is shorter, so that a trickle is caught as soon as a silence would be.
    var lowSpeedWindow: Int {
        let seconds = min(self.lowSpeedTime, self.stallTimeout)
        return seconds.isNaN ? 60 : Int(min(max(1, seconds), 86_400).rounded(.up))
    }
}

/// What the credential provider is asked for: the headers that authorize one request.
public struct CredentialRequest: Sendable, Hashable {
    /// The pack URL about to be requested, query string included (it is never logged or shown).
    public var url: URL
    /// The product the pack belongs to.
    public var productIdentifier: String?
    /// The pack's content identifier.
    public var contentIdentifier: String?
    /// The server refused the credentials last given for this download (401, 403): give fresh ones.
    public var refused: Bool

    /// Creates a request (the queue makes them; this is for tests of a provider).
    ///
    /// - Parameters:
    ///   - url: the URL about to be requested.
    ///   - productIdentifier: the product, for a pack.
    ///   - contentIdentifier: the pack, for a pack.
    ///   - refused: whether the last credentials were refused.
    public init(url: URL, productIdentifier: String? = nil, contentIdentifier: String? = nil, refused: Bool = false) {
        self.url = url
        self.productIdentifier = productIdentifier
        self.contentIdentifier = contentIdentifier
        self.refused = refused
    }
}

/// Gives the request headers that authorize a request, as `Name: value` lines (`Authorization: Bearer …`).
///
/// Asked before every pack transfer (so a token that changes is always current) and again, with
/// ``CredentialRequest/refused``, after the server refused the last ones: once between a refusal and the pause
/// that follows when the fresh ones are refused too (a resume, or bytes that move, allow one more). It runs on the queue's own
/// thread: return headers you have, and renew slow credentials elsewhere. (A manifest is read with the
/// ``TransferOptions/headers`` given to ``LoadedManifest/load(_:options:)-79u4c``.)
///
/// Put credentials in `Authorization` (or `Cookie`): libcurl drops those when a redirect leads to another
/// host, while other headers follow redirects. A redirect from https may only lead to https.
public typealias CredentialProvider = @Sendable (CredentialRequest) -> [String]

/// Which piece of work a transfer is: the download it is for, and the machine's token for that attempt
/// (events of an attempt that was stopped carry an older token and change nothing).
struct TransferID: Sendable, Hashable, CustomStringConvertible {
    var download: String
    var token: Int
    /// Which request of the attempt: 0 for the whole pack, 1, 2, … for the ranges a delta update fetches.
    var part = 0
    var description: String { self.part == 0 ? "\(self.download)#\(self.token)" : "\(self.download)#\(self.token).\(self.part)" }
}

/// Some bytes of a file on the server: what a range request asks for.
struct ByteRange: Sendable, Hashable {
    /// The bytes wanted; the partial file holds them from its first byte.
    var bytes: Range<Int64>
    /// The length of the whole file on the server (the manifest's `contentLength`), which its Content-Range must give.
    var fileLength: Int64
}

/// One HTTP (or file) transfer into a partial file, resuming from what the file already holds.
struct TransferRequest: Sendable {
    var id: TransferID
    var url: URL
    var file: URL
    var expectedLength: Int64
    /// The strong ETag or Last-Modified of the response the partial file came from, for If-Range.
    var validator: String?
    /// Start from byte 0 even when the file holds bytes (after a checksum failure of a resumed file).
    var fromZero: Bool
    var options: TransferOptions
    var writer: any FileWriting
    /// Unpacks the pack while it downloads; told how far the file is written.
    var stream: (any PartialFileFollower)? = nil
    /// Only these bytes of the file on the server (a delta update's range), with `expectedLength` their count. The
    /// validator is then not sent as If-Range but compared with the response's: a range never mixes two versions.
    var range: ByteRange? = nil
    /// Where this transfer's events go; the engine's own handler when nil.
    var report: (@Sendable (TransferEvent) -> Void)? = nil
    /// Takes the body instead of `file` (which is then neither created nor read): a first install's range, whose
    /// chunks are checked and placed as they arrive.
    var sink: (any TransferSink)? = nil
    /// The share of the machine's rate cap that paces the body, when the caller holds one across several requests (a
    /// delta run's ranges); nil for one of the transfer's own.
    var ticket: RateBoard.Ticket? = nil
}

/// Takes a transfer's body as it arrives, in place of a partial file. Called on the transfer thread only, one call
/// at a time, while the transfer runs.
protocol TransferSink: AnyObject, Sendable {
    /// Takes the next bytes of the body, in order from its first byte.
    ///
    /// - Returns: false to end the transfer (the sink keeps why, for whoever started it).
    func consume(_ bytes: UnsafeRawBufferPointer) -> Bool
}

/// Why a transfer attempt ended without the whole pack.
struct TransferFailure: Sendable, Hashable {
    var error: PackDeliveryError
    /// Worth trying again (network trouble, 5xx, 408, 429, stall).
    var retryable: Bool
    /// The server's Retry-After, in seconds.
    var retryAfter: TimeInterval? = nil
    /// Counts against the retry limit even when bytes were kept (a stall, a server too slow, a length that disagrees with the manifest).
    var countsAlways = false
    /// What a range request learned about the server, beyond the error.
    var rangeProblem: RangeProblem? = nil

    enum RangeProblem: Sendable, Hashable {
        /// The server answered a range request with the whole file (200) or refused it (416).
        case ignored
        /// The file's ETag or Last-Modified is not the one the kept bytes came with: it changed on the server.
        case fileChanged
    }
}

extension TransferFailure: Error {}

/// How a transfer attempt ended.
enum TransferOutcome: Sendable, Hashable {
    /// The file holds `length` bytes whose SHA-256 is `sha256`.
    case completed(sha256: String, length: Int64, resumedFrom: Int64)
    case failed(TransferFailure, bytesOnDisk: Int64)
    /// Stopped on request (pause or cancel); the bytes kept were synced to disk.
    case stopped(bytesOnDisk: Int64)
    /// A delta update built the new version, from `fetched` bytes and the installed files (see ``DeltaTransfer``).
    case assembled(fetched: Int64)
    /// A delta update is not possible (the server ignores Range, the installed files do not verify, it would
    /// fetch too much): fetch the whole pack instead.
    case deltaRefused(Download.DeltaFallback)
}

/// What the engine reports, on its own thread, in order per transfer.
enum TransferEvent: Sendable {
    /// Bytes on disk and known good so far (throttled to about 10 a second), and the response's validator.
    case progress(id: TransferID, bytesOnDisk: Int64, validator: String?)
    /// The first `bytes` of the partial file were synced to disk (from the hash thread).
    case durable(id: TransferID, bytes: Int64)
    case finished(id: TransferID, outcome: TransferOutcome)
    /// A delta update knows what it fetches and what it reuses (before its first `.progress`).
    case deltaPlanned(id: TransferID, delta: Download.Delta)
}
