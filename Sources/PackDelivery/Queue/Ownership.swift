import Foundation
import Synchronization

/// Who runs a download: a process (its pid and start time, so a reused pid is not mistaken for it) and a
/// queue in it. Recorded in the download's row while the queue owns it.
///
/// This replaces a lock file per download: ownership costs no descriptor, so a queue of 10,000 downloads
/// holds only the descriptors of the work that runs. A row whose owner is no longer alive is free to take.
/// Processes that share a home must share a pid namespace (one machine, one container).
struct QueueOwner: Sendable, Hashable {
    var pid: Int32
    /// The process's start time in clock ticks since boot (`/proc/PID/stat`, field 22).
    var start: Int64
    /// The queue instance in that process.
    var queue: String

    /// This process's identity, with a new queue id.
    static func new() -> QueueOwner {
        QueueOwner(pid: getpid(), start: Self.currentStart, queue: UUID().uuidString)
    }

    static let currentStart: Int64 = Self.startTime(of: getpid()) ?? 0

    /// Queues of this process that are open (a closed or released queue no longer owns its rows).
    private static let liveQueues = Mutex<Set<String>>([])

    static func register(_ owner: QueueOwner) { _ = Self.liveQueues.withLock { $0.insert(owner.queue) } }
    static func unregister(_ owner: QueueOwner) { _ = Self.liveQueues.withLock { $0.remove(owner.queue) } }

    /// Whether the owner still runs: its process is alive with the same start time, and, in this process, its queue is open.
    var isAlive: Bool {
        if self.pid == getpid(), self.start == Self.currentStart {
            return Self.liveQueues.withLock { $0.contains(self.queue) }
        }
        return Self.processIsAlive(pid: self.pid, start: self.start)
    }

    /// Whether a process runs with this pid and start time: how a download's owner and a lease's holder
    /// (``LeaseRecord``) are known to be gone.
    static func processIsAlive(pid: Int32, start: Int64) -> Bool {
        if pid == getpid() { return start == Self.currentStart }
        return Self.startTime(of: pid) == start
    }

    /// Field 22 of `/proc/PID/stat`, or nil when there is no such process.
    static func startTime(of pid: Int32) -> Int64? {
        guard pid > 0 else { return nil }
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        // "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ')'.
        guard let close = buffer[0..<count].lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = buffer[(close + 1)..<count].split(separator: UInt8(ascii: " "))
        // fields[0] is field 3 (state); field 22 is fields[19].
        guard fields.count > 19 else { return nil }
        return Int64(String(decoding: fields[19], as: UTF8.self))
    }
}
