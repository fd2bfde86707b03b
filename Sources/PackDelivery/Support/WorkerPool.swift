import Foundation

/// Threads for the library's blocking work (a pack's transfer and install, a chunk check, a store commit), as many as
/// the work needs at once: a job never waits for a thread because other jobs block.
///
/// libdispatch's global queues, and the concurrent queues made on them, run as many jobs at once as the machine has
/// cores on Linux, and add a thread only after their jobs were blocked for a while (up to a second). Long jobs that
/// wait for shorter ones there starve them: each running pack install waits for its chunk checks, so a fifth download
/// starting beside four took every thread, and every download of the agent stopped for 0.4–0.9 s until libdispatch
/// added one (issue 44, case 18's rate-cap dip). Here a job goes to an idle thread, or to a new one; a thread idle for
/// ``idleSeconds`` ends.
final class WorkerPool: @unchecked Sendable {
    // @unchecked Sendable: every stored property but the constants is read and written only while `condition` is
    // locked (`jobs`, `idle`, `threads`), and jobs are `@Sendable` closures.
    static let shared = WorkerPool()

    /// How long a thread waits for a job before it ends.
    static let idleSeconds: TimeInterval = 5

    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []
    private var head = 0
    private var idle = 0
    private var threads = 0

    /// Runs `job` on a worker thread, now: on an idle one, else on a new one.
    func run(_ job: @escaping @Sendable () -> Void) {
        self.condition.lock()
        self.jobs.append(job)
        let spawn = self.idle < self.jobs.count - self.head
        if spawn { self.threads += 1 } else { self.condition.signal() }
        self.condition.unlock()
        if spawn {
            let thread = Thread { [self] in self.work() }
            thread.name = "PackDelivery.worker"
            thread.start()
        }
    }

    /// The threads alive now (for tests).
    var threadCount: Int {
        self.condition.lock()
        defer { self.condition.unlock() }
        return self.threads
    }

    private func work() {
        self.condition.lock()
        while true {
            if self.head < self.jobs.count {
                let job = self.jobs[self.head]
                self.head += 1
                if self.head == self.jobs.count {
                    self.jobs.removeAll(keepingCapacity: true)
                    self.head = 0
                }
                self.condition.unlock()
                job()
                self.condition.lock()
                continue
            }
            self.idle += 1
            let woken = self.condition.wait(until: Date(timeIntervalSinceNow: Self.idleSeconds))
            self.idle -= 1
            if !woken, self.head == self.jobs.count {
                self.threads -= 1
                self.condition.unlock()
                return
            }
        }
    }
}
