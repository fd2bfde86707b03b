import NIOCore
import Synchronization

/// Counts open connections and keeps room for new ones: at the limit, a new connection is let in by
/// closing the connection that has been idle longest (waiting for a request, or draining after a
/// refused one). Only when none is idle — every connection is busy sending a response — is the new
/// one refused (closed at once). nginx does the same with its reusable connections.
///
/// One for the server, shared by every connection's ``ConnectionLimitHandler``; each connection's
/// ``IdleMark`` is kept by its ``RequestTimeoutHandler``.
final class ConnectionLimiter: Sendable {
    enum Admission {
        case admitted
        case admittedByClosing(any Channel)
        case refused
    }

    private struct Entry {
        var channel: any Channel
        var mark: IdleMark
    }

    /// The most connections open at once.
    let maximum: Int
    private let entries = Mutex<[ObjectIdentifier: Entry]>([:])
    /// Connections refused, all others busy; and idle connections closed to let a new one in. Counted
    /// since the server started, read by ``ServerMetrics`` at scrape time.
    let refusals = Atomic<Int>(0)
    let idleClosures = Atomic<Int>(0)

    init(maximum: Int) {
        self.maximum = max(1, maximum)
    }

    /// How many connections are open.
    var count: Int {
        self.entries.withLock { $0.count }
    }

    func admit(_ channel: any Channel, mark: IdleMark) -> Admission {
        self.entries.withLock { entries in
            var admission = Admission.admitted
            if entries.count >= self.maximum {
                var idlest: (key: ObjectIdentifier, since: Int64)?
                for (key, entry) in entries {
                    if let since = entry.mark.idleSince, since < idlest?.since ?? .max {
                        idlest = (key, since)
                    }
                }
                guard let idlest, let victim = entries.removeValue(forKey: idlest.key) else {
                    self.refusals.add(1, ordering: .relaxed)
                    return .refused
                }
                self.idleClosures.add(1, ordering: .relaxed)
                admission = .admittedByClosing(victim.channel)
            }
            entries[ObjectIdentifier(channel)] = Entry(channel: channel, mark: mark)
            return admission
        }
    }

    func remove(_ channel: any Channel) {
        _ = self.entries.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }
}

/// Whether a connection is idle (waiting for a request, or lingering), and since when: an atomic, so
/// that marking it costs no lock on every request.
final class IdleMark: Sendable {
    /// Nanoseconds of `NIODeadline.now()` when it became idle, or 0 while busy.
    private let since = Atomic<Int64>(0)

    init() {
        self.set(idle: true)
    }

    func set(idle: Bool) {
        if idle {
            // Keep the first moment it became idle.
            _ = self.since.compareExchange(
                expected: 0, desired: max(1, Int64(NIODeadline.now().uptimeNanoseconds & UInt64(Int64.max))), ordering: .relaxed)
        } else if self.since.load(ordering: .relaxed) != 0 {
            self.since.store(0, ordering: .relaxed)
        }
    }

    /// When it became idle (uptime nanoseconds), or `nil` while busy.
    var idleSince: Int64? {
        let value = self.since.load(ordering: .relaxed)
        return value == 0 ? nil : value
    }
}
