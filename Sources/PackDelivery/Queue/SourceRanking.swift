import Foundation

/// What a home measured of one source (an origin: scheme, host and port): its throughput and failures, decayed with
/// time. `packs sources` shows them; ``DownloadQueue/sourceRanking()`` returns them, best first.
public struct SourceStats: Sendable, Hashable, Codable {
    /// The source's origin, `https://cdn.example.com:443`.
    public var origin: String
    /// The throughput measured lately, in bytes per second (an average weighted towards the latest transfers); nil
    /// while no transfer from it has finished with bytes.
    public var bytesPerSecond: Double?
    /// Failures lately: each adds 1, and the count halves every `SourceRanking.failureHalfLife` seconds.
    public var failures: Double
    /// When it was last measured.
    public var updatedAt: Date

    /// Creates a source's stats.
    ///
    /// - Parameters:
    ///   - origin: the source's origin.
    ///   - bytesPerSecond: the throughput measured, if any.
    ///   - failures: the decayed count of failures.
    ///   - updatedAt: when it was last measured.
    public init(origin: String, bytesPerSecond: Double?, failures: Double, updatedAt: Date) {
        self.origin = origin
        self.bytesPerSecond = bytesPerSecond
        self.failures = failures
        self.updatedAt = updatedAt
    }
}

/// The order in which a pack's sources are tried, from what the home measured (aria2's `--uri-selector=feedback`):
/// a source never measured is tried first (so each gets measured once), then the fastest, each source's throughput
/// divided by one plus its recent failures. A new transfer starts where ``pick(_:inFlight:now:)`` says: at
/// most one transfer at a time probes a source never measured. Pure: the driver records and the store keeps the stats.
struct SourceRanking: Sendable, Hashable {
    /// Seconds for a failure to count half as much.
    static let failureHalfLife: TimeInterval = 3_600
    /// The weight of the newest transfer in a source's throughput.
    static let newWeight = 0.5
    /// A running transfer is moved to another source only after running this many seconds (its rate is then known)…
    static let moveAfter: TimeInterval = 2
    /// …when the other measured this many times its rate now…
    static let moveFactor = 4.0
    /// …and the move saves at least this many seconds of the time left.
    static let moveSaves: TimeInterval = 2

    private(set) var stats: [String: SourceStats] = [:]

    init(_ stats: [SourceStats] = []) {
        for entry in stats { self.stats[entry.origin] = entry }
    }

    /// Records a transfer from `origin`: `bytes` in `seconds` (a throughput when both are positive), and whether it failed.
    /// - Returns: the source's stats after it.
    @discardableResult
    mutating func record(origin: String, bytes: Int64, seconds: TimeInterval, failed: Bool, now: Date) -> SourceStats {
        var entry = self.stats[origin] ?? SourceStats(origin: origin, bytesPerSecond: nil, failures: 0, updatedAt: now)
        entry.failures = Self.decayed(entry, now: now) + (failed ? 1 : 0)
        if bytes > 0, seconds > 0 {
            let sample = Double(bytes) / seconds
            entry.bytesPerSecond = entry.bytesPerSecond.map { $0 + Self.newWeight * (sample - $0) } ?? sample
        }
        entry.updatedAt = now
        self.stats[origin] = entry
        return entry
    }

    /// Failures as they count at `now`.
    static func decayed(_ entry: SourceStats, now: Date) -> Double {
        let elapsed = max(0, now.timeIntervalSince(entry.updatedAt))
        return entry.failures * pow(0.5, elapsed / Self.failureHalfLife)
    }

    /// How good a source is: its throughput over one plus its failures; nil when never measured.
    func score(_ origin: String, now: Date) -> Double? {
        guard let entry = self.stats[origin] else { return nil }
        return (entry.bytesPerSecond ?? 0) / (1 + Self.decayed(entry, now: now))
    }

    /// `sources` in the order to try them: those never measured first (in the manifest's order), then by score,
    /// best first (ties in the manifest's order).
    func order(_ sources: [URL], now: Date) -> [URL] {
        let scored = sources.enumerated().map {
            (offset: $0.offset, url: $0.element, score: self.score(Download.origin($0.element), now: now))
        }
        return scored.sorted { a, b in
            switch (a.score, b.score) {
            case (nil, nil): a.offset < b.offset
            case (nil, _): true
            case (_, nil): false
            case (let x?, let y?): x != y ? x > y : a.offset < b.offset
            }
        }.map(\.url)
    }

    /// The source a new transfer starts at, given how many transfers each origin has in flight (`inFlight`). One
    /// mechanism, so that several downloads starting at once on a fresh home do not all go to an unknown source:
    /// 1. a source never measured, with no transfer in flight, is probed (the first such in the manifest's order): one
    ///    transfer measures it, the others do not wait on it;
    /// 2. otherwise the best source measured (score above zero);
    /// 3. otherwise (every source is being probed, or none measured brought bytes) the one with the fewest transfers
    ///    in flight, ties in ``order(_:now:)``.
    func pick(_ sources: [URL], inFlight: [String: Int], now: Date) -> URL? {
        let origins = sources.map { (url: $0, origin: Download.origin($0)) }
        if let probe = origins.first(where: { self.stats[$0.origin] == nil && inFlight[$0.origin, default: 0] == 0 }) {
            return probe.url
        }
        let ordered = self.order(sources, now: now)
        if let best = ordered.first(where: { (self.score(Download.origin($0), now: now) ?? 0) > 0 }) { return best }
        return ordered.enumerated().min { a, b in
            let (x, y) = (inFlight[Download.origin(a.element), default: 0], inFlight[Download.origin(b.element), default: 0])
            return x != y ? x < y : a.offset < b.offset
        }?.element
    }

    /// Every source measured, best first.
    func ranked(now: Date) -> [SourceStats] {
        self.stats.values.sorted { (self.score($0.origin, now: now) ?? 0, $1.origin) > (self.score($1.origin, now: now) ?? 0, $0.origin) }
    }
}
