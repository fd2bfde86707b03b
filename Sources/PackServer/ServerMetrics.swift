import Atomics
import CoreMetrics
import Foundation
import HTTPTypes
import NIOCore
import PackDelivery
import Prometheus
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// What `packs serve --metrics-address` counts, through swift-metrics into a Prometheus registry of
/// this server's own (never the process-wide `MetricsSystem`, which can be bootstrapped once: a
/// process may run several servers, as the tests do).
///
/// Counted where each fact is known, once per request:
/// - ``FileFastPathHandler``: the plain 200/206 answers it sends itself, when their last byte is written;
/// - ``RequestMetricsMiddleware``: everything the router answers (errors, refusals, 304, `/healthz`…);
/// - ``LingeringCloseHandler``: the 400 and 431 answers to requests that could not be parsed;
/// - ``AuthorizationMiddleware`` and ``AuthGateMiddleware``: refusals by reason, and requests let through on a
///   receipt by its environment (those answered by ``FileFastPath``, there);
/// - at scrape time: active connections, connections refused and idle ones closed at the limit
///   (``ConnectionLimiter``), and open descriptors (`/proc/self/fd`).
///
/// The hot path takes no lock of its own: each (route, status) pair's counter is made once, on its
/// first request, and kept in a slot read with one atomic load (``LazyMetric``); a counter's increment
/// is swift-prometheus's relaxed atomic add. Only the duration histogram locks (swift-prometheus keeps its
/// buckets under a lock, uncontended but for two event loops finishing a request at once).
final class ServerMetrics: Sendable {
    /// What a request asked for: the `route` label. A fixed set, so the number of series is bounded
    /// whatever clients ask for.
    enum Route: Int, CaseIterable, Sendable {
        /// `/manifest.json` and its signature.
        case catalog
        /// Any other path of the served folder (packs, their indexes; also 404s).
        case file
        /// `/healthz`.
        case healthz
        /// An `--auth-only` subrequest.
        case authGate
        /// A request that could not be parsed (400, 431), answered before any route is known.
        case malformed

        var label: String {
            switch self {
            case .catalog: "catalog"
            case .file: "file"
            case .healthz: "healthz"
            case .authGate: "auth_gate"
            case .malformed: "malformed"
            }
        }

        /// The route of a request path (without its query) in a server of `mode`.
        static func of(path: String, mode: PackServerConfiguration.Mode) -> Route {
            if HealthMiddleware<PackRequestContext>.isHealthPath(path) { return .healthz }
            if mode == .authOnly { return .authGate }
            return path == "/manifest.json" || path == "/manifest.json.sig" ? .catalog : .file
        }
    }

    /// The statuses this server answers with, each with a slot of its own; others (rare) go through a
    /// locked dictionary.
    static let knownStatuses: [Int] = [200, 204, 206, 301, 304, 400, 401, 403, 404, 405, 408, 412, 416, 431, 500, 503]
    private static let statusSlot: [Int] = {
        var slots = [Int](repeating: -1, count: 600)
        for (index, status) in knownStatuses.enumerated() { slots[status] = index }
        return slots
    }()

    /// Metric names, as documented in the README.
    enum Name {
        static let requests = "packs_http_requests_total"
        static let sentBytes = "packs_http_sent_bytes_total"
        static let rangeRequests = "packs_http_range_requests_total"
        static let duration = "packs_http_request_duration_seconds"
        static let refusals = "packs_auth_refusals_total"
        static let receipts = "packs_auth_receipts_total"
        static let activeConnections = "packs_http_connections_active"
        static let refusedConnections = "packs_http_connections_refused_total"
        static let idleClosedConnections = "packs_http_connections_closed_idle_total"
        static let openDescriptors = "process_open_fds"
        static let maxDescriptors = "process_max_fds"
    }

    /// Upper bounds of the duration histogram's buckets: from a cached range on loopback to a whole pack
    /// over a slow link.
    static let durationBuckets: [Duration] = [
        .microseconds(500), .milliseconds(1), .milliseconds(5), .milliseconds(25), .milliseconds(100), .milliseconds(250),
        .seconds(1), .milliseconds(2500), .seconds(10), .seconds(30), .seconds(120), .seconds(600),
    ]

    let registry: PrometheusCollectorRegistry
    private let factory: PrometheusMetricsFactory
    private let requests: [LazyMetric<CoreMetrics.Counter>]
    private let ranges: [LazyMetric<CoreMetrics.Counter>]
    private let durations: [LazyMetric<CoreMetrics.Timer>]
    private let sentBytes: CoreMetrics.Counter
    private let refusals: Mutex<[String: CoreMetrics.Counter]>
    /// Requests let through on a receipt: production's slot, then sandbox's.
    private let receipts: [LazyMetric<CoreMetrics.Counter>]
    private let unusualStatuses = Mutex<[String: CoreMetrics.Counter]>([:])
    private let activeConnections: CoreMetrics.Gauge
    /// The limiter's refusals and idle closures, as counters: what each scrape adds is what the limiter
    /// counted since the last one (``exported`` keeps what was added so far).
    private let refusedConnections: CoreMetrics.Counter
    private let idleClosedConnections: CoreMetrics.Counter
    private let exported = Mutex<(refused: Int, idleClosed: Int)>((0, 0))
    private let openDescriptors: CoreMetrics.Gauge
    private let maxDescriptors: CoreMetrics.Gauge
    /// Read at scrape time; set once the server's limiter exists.
    let limiter: ConnectionLimiter

    init(limiter: ConnectionLimiter) {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.durationHistogramBuckets[Name.duration] = Self.durationBuckets
        self.registry = registry
        self.factory = factory
        self.limiter = limiter
        let slots = Route.allCases.count * Self.knownStatuses.count
        self.requests = (0..<slots).map { _ in LazyMetric() }
        self.ranges = Self.knownStatuses.map { _ in LazyMetric() }
        self.durations = Route.allCases.map { _ in LazyMetric() }
        self.sentBytes = CoreMetrics.Counter(label: Name.sentBytes, factory: factory)
        self.refusals = Mutex([:])
        self.receipts = [LazyMetric(), LazyMetric()]
        self.activeConnections = CoreMetrics.Gauge(label: Name.activeConnections, factory: factory)
        self.refusedConnections = CoreMetrics.Counter(label: Name.refusedConnections, factory: factory)
        self.idleClosedConnections = CoreMetrics.Counter(label: Name.idleClosedConnections, factory: factory)
        self.openDescriptors = CoreMetrics.Gauge(label: Name.openDescriptors, factory: factory)
        self.maxDescriptors = CoreMetrics.Gauge(label: Name.maxDescriptors, factory: factory)
    }

    /// Counts one answered request.
    ///
    /// - Parameters:
    ///   - route: What it asked for.
    ///   - status: The status answered.
    ///   - hadRange: Whether it carried a `Range` header.
    ///   - bytes: Body bytes sent.
    ///   - started: When its head was read (`NIODeadline.now()`), or `nil` not to time it.
    func request(_ route: Route, status: Int, hadRange: Bool, bytes: Int, started: NIODeadline?) {
        let slot = status >= 0 && status < 600 ? Self.statusSlot[status] : -1
        let factory = self.factory
        if slot >= 0 {
            self.requests[route.rawValue * Self.knownStatuses.count + slot].get {
                CoreMetrics.Counter(
                    label: Name.requests, dimensions: [("route", route.label), ("status", String(status))], factory: factory)
            }.increment()
            if hadRange {
                self.ranges[slot].get {
                    CoreMetrics.Counter(label: Name.rangeRequests, dimensions: [("status", String(status))], factory: factory)
                }
                .increment()
            }
        } else {
            self.unusual(Name.requests, [("route", route.label), ("status", String(status))]).increment()
            if hadRange { self.unusual(Name.rangeRequests, [("status", String(status))]).increment() }
        }
        if bytes > 0 { self.sentBytes.increment(by: bytes) }
        if let started {
            self.durations[route.rawValue].get {
                CoreMetrics.Timer(label: Name.duration, dimensions: [("route", route.label)], factory: factory)
            }
            .recordNanoseconds((NIODeadline.now() - started).nanoseconds)
        }
    }

    /// A counter for a status without a slot (rare: made or found under a lock).
    private func unusual(_ name: String, _ dimensions: [(String, String)]) -> CoreMetrics.Counter {
        let key = name + dimensions.map { "|\($0.1)" }.joined()
        let factory = self.factory
        return self.unusualStatuses.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = CoreMetrics.Counter(label: name, dimensions: dimensions, factory: factory)
            counters[key] = counter
            return counter
        }
    }

    /// Counts a request refused by the authorizer, by ``AccessGrant/refusal`` (or the decision when the
    /// authorizer gives no reason). Refusals are answered by the router, never on the fast path.
    func refusal(_ grant: AccessGrant) {
        let reason = grant.refusal ?? (grant.decision == .forbidden ? "forbidden" : "unauthorized")
        let factory = self.factory
        self.refusals.withLock { counters in
            if let counter = counters[reason] { return counter }
            let counter = CoreMetrics.Counter(label: Name.refusals, dimensions: [("reason", reason)], factory: factory)
            counters[reason] = counter
            return counter
        }.increment()
    }

    /// Counts a request let through on a receipt, under its environment (`packs_auth_receipts_total`); other
    /// credentials are not counted here. On the fast path too: one atomic load and one atomic add.
    func allowed(_ grant: AccessGrant) {
        guard let environment = grant.environment else { return }
        // A switch, not `allCases.firstIndex`: `allCases` makes an array on every call.
        let slot =
            switch environment {
            case .production: 0
            case .sandbox: 1
            }
        let factory = self.factory
        self.receipts[slot].get {
            CoreMetrics.Counter(label: Name.receipts, dimensions: [("environment", environment.label)], factory: factory)
        }
        .increment()
    }

    /// The Prometheus text of every metric, with the gauges read now.
    func scrape() -> [UInt8] {
        self.activeConnections.record(self.limiter.count)
        self.exported.withLock { exported in
            let refused = self.limiter.refusals.load(ordering: .relaxed)
            let idleClosed = self.limiter.idleClosures.load(ordering: .relaxed)
            if refused > exported.refused { self.refusedConnections.increment(by: refused - exported.refused) }
            if idleClosed > exported.idleClosed { self.idleClosedConnections.increment(by: idleClosed - exported.idleClosed) }
            exported = (refused, idleClosed)
        }
        self.openDescriptors.record(Self.countOpenDescriptors())
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max {
            self.maxDescriptors.record(Int(clamping: limit.rlim_cur))
        }
        return self.registry.emitToBuffer()
    }

    /// The entries of `/proc/self/fd`, less the one the listing itself opens.
    static func countOpenDescriptors() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return -1 }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let isDot = withUnsafeBytes(of: entry.pointee.d_name) { name in
                name[0] == UInt8(ascii: ".") && (name[1] == 0 || (name[1] == UInt8(ascii: ".") && name[2] == 0))
            }
            if !isDot { count += 1 }
        }
        return count - 1
    }
}

/// A metric made on first use and read afterwards with one atomic load, without a lock.
///
/// Two threads that both find it empty both make one; swift-prometheus returns the same series for the
/// same name and labels, and the first stored wins, so nothing is counted twice or lost.
final class LazyMetric<Metric: AnyObject & Sendable>: Sendable {
    private let slot = ManagedAtomicLazyReference<Metric>()

    func get(_ make: () -> Metric) -> Metric {
        if let metric = self.slot.load() { return metric }
        return self.slot.storeIfNilThenLoad(make())
    }
}
