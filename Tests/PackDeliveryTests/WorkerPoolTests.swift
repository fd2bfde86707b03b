import Foundation
import Synchronization
import Testing

@testable import PackDelivery

/// The library's threads for blocking work: a job that waits for a job given after it never waits for a thread.
@Suite(.timeLimit(.minutes(1)))
struct WorkerPoolTests {
    /// 24 jobs each wait for a job given after them (as a pack's install waits for its chunk checks): all run at once,
    /// on as many threads. On libdispatch's global queue, whose threads are as many as the cores, the last job waited
    /// until libdispatch added a thread after each blocked one for a while (0.4–0.9 s each; a second apart here).
    @Test func jobsThatWaitForLaterJobsNeverWaitForAThread() {
        let pool = WorkerPool()
        let waiting = 24
        let released = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let started = ContinuousClock.now
        for _ in 0..<waiting {
            pool.run {
                released.wait()
                finished.signal()
            }
        }
        pool.run {
            for _ in 0..<waiting { released.signal() }
        }
        for index in 0..<waiting {
            let result = finished.wait(timeout: .now() + 5)
            #expect(result == .success, "job \(index + 1) of \(waiting) did not finish within 5 s of the one releasing them")
            if result != .success { return }
        }
        let elapsed = ContinuousClock.now - started
        #expect(elapsed < .seconds(2), "the jobs took \(elapsed): some waited for a thread")
        #expect(pool.threadCount == waiting + 1)
    }

    /// A thread left idle ends after ``WorkerPool/idleSeconds``, and a job given later gets a thread again.
    @Test func idleThreadsEndAndTheNextJobStillRuns() async throws {
        let pool = WorkerPool()
        let ran = Atomic<Int>(0)
        pool.run { ran.add(1, ordering: .relaxed) }
        let deadline = ContinuousClock.now + .seconds(WorkerPool.idleSeconds + 5)
        while pool.threadCount > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(100)) }
        #expect(pool.threadCount == 0, "the idle thread was still alive \(WorkerPool.idleSeconds + 5) s after its job")
        let done = DispatchSemaphore(value: 0)
        pool.run {
            ran.add(1, ordering: .relaxed)
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 5) == .success, "the job given after the pool emptied did not run within 5 s")
        #expect(ran.load(ordering: .relaxed) == 2)
    }
}
