import Foundation

/// A smoothed transfer rate (an exponentially weighted moving average over ≈5 s) and the time left.
struct RateEstimator: Sendable, Hashable {
    private var lastBytes: Int64?
    private var lastTime: Date?
    private(set) var bytesPerSecond: Double?
    var halfLife: TimeInterval = 2.5

    mutating func add(bytes: Int64, at time: Date) {
        defer {
            self.lastBytes = bytes
            self.lastTime = time
        }
        guard let lastBytes, let lastTime, bytes >= lastBytes else { return }
        let elapsed = time.timeIntervalSince(lastTime)
        guard elapsed > 0.02 else { return }
        let sample = Double(bytes - lastBytes) / elapsed
        let weight = 1 - pow(0.5, elapsed / self.halfLife)
        self.bytesPerSecond = self.bytesPerSecond.map { $0 + weight * (sample - $0) } ?? sample
    }

    /// Seconds left for `remaining` bytes, or -1 while the rate is unknown or zero.
    func timeRemaining(remaining: Int64) -> Double {
        guard let rate = self.bytesPerSecond, rate > 1 else { return -1 }
        return Double(max(0, remaining)) / rate
    }
}
