import NIOCore

/// Runs a handler's check no later than a deadline that moves often, with at most one scheduled task:
/// moving the deadline later schedules nothing, the task finds it not yet due and the check asks
/// again for what is left. Rescheduling a timer for every request and every write cost 12 % of the
/// CPU of a small request under load.
///
/// A value kept in its handler (not an object of its own, which each request would touch), used on
/// its channel's event loop only.
struct DeadlineTimer {
    private var scheduled: Scheduled<Void>?
    /// When the scheduled task runs (past once it ran).
    private var scheduledAt = NIODeadline.distantPast

    /// Makes sure `check` runs no later than `deadline` (a check still to come by then is kept).
    mutating func schedule(by deadline: NIODeadline, on eventLoop: any EventLoop, _ check: @escaping () -> Void) {
        if self.scheduledAt <= deadline, self.scheduledAt > .now() { return }
        self.scheduled?.cancel()
        self.scheduledAt = deadline
        self.scheduled = eventLoop.assumeIsolated().scheduleTask(deadline: deadline, check)
    }

    mutating func cancel() {
        self.scheduled?.cancel()
        self.scheduled = nil
        self.scheduledAt = .distantPast
    }
}

extension TimeAmount {
    /// A `Duration` as NIO's `TimeAmount` (nanoseconds, saturating).
    init(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        self = .nanoseconds(overflow ? Int64.max : scaled &+ attoseconds / 1_000_000_000)
    }
}
