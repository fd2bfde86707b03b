import Foundation
import Synchronization

/// What follows a whole-pack transfer's partial file as it grows (the streamed unpack, ``StreamedUnpack``): the
/// transfer tells it how far the file grew through ``growth``, and stops early when what it read so far is
/// ``hostile``. Declared here, so that the transfer names no type of the install.
protocol PartialFileFollower: Sendable {
    /// How far the partial file has grown, which the transfer advances.
    var growth: PartialFileGrowth { get }
    /// An entry read so far that is never installed (unsafe, over the limits, encrypted): the rest is not worth fetching.
    var hostile: PackDeliveryError? { get }
    /// Stops following, and deletes what it made.
    func discard()
}

/// How far a download has written its partial file, for readers that follow it.
///
/// The transfer reports what it wrote (``advance(to:)``), a restart from byte 0 (``restart()``), the end
/// (``finish(length:)``) or that it stopped (``stop(_:)``); a reader waits in ``GrowingFile/wait(beyond:)``.
/// Wake-ups come per MiB written (and at the end), never per piece.
final class PartialFileGrowth: Sendable {
    private struct State {
        var written: Int64 = 0
        /// The length of the finished file, once the transfer completed.
        var finished: Int64?
        /// Bumped by restart(): readers of an earlier generation stop.
        var generation = 0
        var stopped: PackDeliveryError?
        var signalled: Int64 = 0
    }

    /// The pack's length, from the manifest.
    let length: Int64
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)

    init(length: Int64) {
        self.length = length
    }

    /// The writer has written the file up to `offset`.
    func advance(to offset: Int64) {
        let signal = self.state.withLock { state -> Bool in
            state.written = max(state.written, offset)
            guard state.written - state.signalled >= HashFollower.wakeEvery else { return false }
            state.signalled = state.written
            return true
        }
        if signal { self.wake.signal() }
    }

    /// The writer truncated the file and writes it again from byte 0.
    func restart() {
        self.state.withLock { state in
            state.generation += 1
            state.written = 0
            state.signalled = 0
        }
        self.wake.signal()
    }

    /// The file is complete at `length` bytes.
    func finish(length: Int64) {
        self.state.withLock { state in
            state.written = length
            state.finished = length
        }
        self.wake.signal()
    }

    /// The transfer stopped (paused, failed, cancelled): readers stop with `why`.
    func stop(_ why: PackDeliveryError) {
        self.state.withLock { state in
            if state.stopped == nil { state.stopped = why }
        }
        self.wake.signal()
    }

    var generation: Int { self.state.withLock { $0.generation } }

    /// Whether a reader of `generation` must stop.
    func isStopped(_ generation: Int) -> Bool {
        self.state.withLock { $0.stopped != nil || $0.generation != generation }
    }

    fileprivate func wait(beyond position: Int64, generation: Int) -> GrowingFile.Wait {
        while true {
            let answer = self.state.withLock { state -> GrowingFile.Wait? in
                if let stopped = state.stopped { return .stop(stopped) }
                if state.generation != generation { return .stop(PackDeliveryError.stopped("The download restarted from byte 0.")) }
                if state.written > position { return .available(state.written) }
                if let finished = state.finished, position >= finished { return .ended }
                return nil
            }
            if let answer { return answer }
            // A missed wake-up costs at most this long.
            _ = self.wake.wait(timeout: .now() + 0.05)
        }
    }
}

/// One generation of a ``PartialFileGrowth``, as an ``ArchiveReader`` reads it.
struct GrowingFile: Sendable {
    enum Wait: Sendable {
        /// Bytes are written up to this offset.
        case available(Int64)
        /// The file ends here.
        case ended
        /// Stop reading: the download stopped or restarted.
        case stop(PackDeliveryError)
    }

    let growth: PartialFileGrowth
    let generation: Int

    var length: Int64 { self.growth.length }

    /// Waits until the file holds more than `position` bytes, ends, or the download stops.
    func wait(beyond position: Int64) -> Wait {
        self.growth.wait(beyond: position, generation: self.generation)
    }
}
