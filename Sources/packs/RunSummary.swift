import Foundation
import PackAgent
import PackDelivery

/// What one run of `fetch`, `resume`, `verify --repair` or `demo` did, for pipelines: the last line of its `--json`
/// output (`"event": "summary"`). Built from the same events the run prints, so it adds no query.
struct RunSummary: Encodable {
    let event = "summary"
    /// Downloads the run followed, and how each ended.
    var downloads = 0
    var finished = 0
    var failed = 0
    var paused = 0
    var cancelled = 0
    /// Downloads that were already installed when the run began (nothing fetched), and their packs' bytes.
    var alreadyInstalled = 0
    var bytesAlreadyInstalled: Int64 = 0
    /// Bytes received from servers in this run: pack bytes, or for a delta update the bytes of its ranges.
    var bytesFetched: Int64 = 0
    /// Bytes a delta update took from installed files instead of fetching them.
    var bytesReused: Int64 = 0
    /// Bytes of partial downloads kept by an earlier run and resumed, not fetched again.
    var bytesResumed: Int64 = 0
    /// Times a download waited to try again after an error.
    var retries = 0
    /// Wall time of the run, and the time downloads spent in each phase, summed over downloads (several run at
    /// once, so the phases may add up to more than the run).
    var seconds = Seconds()
    /// The servers the packs came from (scheme, host and port: never credentials or a query).
    var sources: [String] = []

    struct Seconds: Encodable {
        var elapsed = 0.0
        var downloading = 0.0
        var verifying = 0.0
        var unpacking = 0.0
        var installing = 0.0
    }

    /// What the summary keeps of one download between its events.
    private struct Track {
        var phase: DownloadPhase?
        var since: ContinuousClock.Instant
        var bytes: Int64
        /// Bytes received in this run, from its progress.
        var fetched: Int64 = 0
        var retrying: Bool
        var delta: Download.Delta?
        var state: DownloadState
    }

    private var tracks: [String: Track] = [:]
    private var origins = Set<String>()
    private let start = ContinuousClock.now

    private enum CodingKeys: String, CodingKey {
        case event, downloads, finished, failed, paused, cancelled, alreadyInstalled, bytesAlreadyInstalled, bytesFetched
        case bytesReused, bytesResumed, retries, seconds, sources
    }

    /// What the summary reads of a download: of a ``Download`` in this process, or of the agent's ``DownloadJSON``.
    struct Seen {
        var id: String
        var state: DownloadState
        var phase: DownloadPhase?
        var bytesReceived: Int64
        var contentLength: Int64
        var retryDate: Date?
        var delta: Download.Delta?
        var url: URL?

        init(_ download: Download) {
            self.id = download.id
            self.state = download.state
            self.phase = download.phase
            self.bytesReceived = download.bytesReceived
            self.contentLength = download.contentLength
            self.retryDate = download.retryDate
            self.delta = download.delta
            self.url = download.url
        }

        init(_ download: DownloadJSON) {
            self.id = download.id
            self.state = download.state
            self.phase = download.phase.value
            self.bytesReceived = download.bytesReceived
            self.contentLength = download.contentLength
            self.retryDate = download.retryDate.value
            self.delta = download.delta
            self.url = URL(string: download.url)
        }
    }

    mutating func begin(_ download: Download) { self.begin(Seen(download)) }
    mutating func update(_ download: Download) { self.update(Seen(download)) }

    /// A download as the run found it.
    mutating func begin(_ download: Seen) {
        self.downloads += 1
        if download.state == .finished {
            self.alreadyInstalled += 1
            self.bytesAlreadyInstalled += download.contentLength
        } else {
            self.bytesResumed += download.bytesReceived
        }
        self.tracks[download.id] = Track(
            phase: download.state == .active ? download.phase : nil, since: .now, bytes: download.bytesReceived,
            retrying: download.retryDate != nil, delta: download.delta, state: download.state)
        if let url = download.url, let origin = Self.origin(of: url) { self.origins.insert(origin) }
    }

    /// A download changed.
    mutating func update(_ download: Seen) {
        guard var track = self.tracks[download.id] else { return }
        let now = ContinuousClock.now
        if let phase = track.phase { self.add(now - track.since, to: phase) }
        track.phase = download.state == .active ? download.phase : nil
        track.since = now
        if download.bytesReceived > track.bytes { track.fetched += download.bytesReceived - track.bytes }
        track.bytes = download.bytesReceived
        if download.retryDate != nil, !track.retrying { self.retries += 1 }
        track.retrying = download.retryDate != nil
        if let delta = download.delta { track.delta = delta }
        track.state = download.state
        self.tracks[download.id] = track
    }

    /// The summary once the run ended.
    mutating func end() -> RunSummary {
        let now = ContinuousClock.now
        for track in self.tracks.values {
            if let phase = track.phase { self.add(now - track.since, to: phase) }
            switch track.state {
            case .finished: self.finished += 1
            case .failed: self.failed += 1
            case .paused: self.paused += 1
            case .cancelled: self.cancelled += 1
            default: break
            }
            if let delta = track.delta {
                // A delta's progress counts the bytes it planned; what the server sent for its ranges is its own count.
                self.bytesFetched += delta.bytesFetched
                self.bytesReused += delta.bytesReused
            } else {
                self.bytesFetched += track.fetched
            }
        }
        self.seconds.elapsed = Self.seconds(now - self.start)
        self.sources = self.origins.sorted()
        return self
    }

    private mutating func add(_ duration: Duration, to phase: DownloadPhase) {
        let seconds = Self.seconds(duration)
        switch phase {
        case .downloading: self.seconds.downloading += seconds
        case .verifying: self.seconds.verifying += seconds
        case .unpacking: self.seconds.unpacking += seconds
        case .installing: self.seconds.installing += seconds
        }
    }

    private static func seconds(_ duration: Duration) -> Double {
        let (whole, fraction) = duration.components
        return ((Double(whole) + Double(fraction) / 1e18) * 1000).rounded() / 1000
    }

    /// `scheme://host[:port]` of a pack URL, without user, password, path or query.
    static func origin(of url: URL) -> String? {
        guard let scheme = url.scheme, let host = url.host(percentEncoded: false), !host.isEmpty else {
            return url.isFileURL ? "file://" : nil
        }
        return "\(scheme)://\(host)" + (url.port.map { ":\($0)" } ?? "")
    }
}
