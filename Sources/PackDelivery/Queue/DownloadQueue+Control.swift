import Foundation
import GRDB
import Logging
import Synchronization

// Pausing, cancelling, resuming and reprioritizing downloads, this queue's or another process's.
extension DownloadQueue {
    // MARK: Controlling downloads

    /// Pauses downloads, keeping their partial data. Works on downloads another process runs (through the store).
    ///
    /// - Parameter ids: download ids; finished or cancelled ones are left alone.
    /// - Throws: `unknownDownload` for an unknown id.
    public func pause(_ ids: [String]) throws(PackDeliveryError) {
        try self.control(ids, request: .pause)
    }

    /// Cancels downloads: stops them and deletes their partial data and staging.
    ///
    /// - Parameter ids: download ids; finished ones and a move into place in progress are left alone.
    /// - Throws: `unknownDownload` for an unknown id.
    public func cancel(_ ids: [String]) throws(PackDeliveryError) {
        try self.control(ids, request: .cancel)
    }

    /// Resumes paused or failed downloads (all of them when `ids` is nil); they continue from the bytes on disk.
    /// Like ``pause(_:)`` and ``cancel(_:)``, it reaches a download another process runs (through the store): that
    /// process resumes it within a second.
    ///
    /// - Parameter ids: download ids, or nil for every paused, failed or orphaned download of an open transaction,
    ///   except those added with `start: false` (``PauseReason/notStarted``), which only ``start(_:)-17zz2`` or their id starts.
    /// - Returns: the ids of the downloads this queue now runs (not those another process runs).
    /// - Throws: `unknownDownload` for an unknown id; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func resume(_ ids: [String]? = nil) throws(PackDeliveryError) -> [String] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in try self.resumeOnDriver(ids) }
    }

    /// Starts downloads added with `start: false` (or any paused or failed ones): they wait for a slot, like
    /// `SKPaymentQueue.start(_:)`.
    ///
    /// - Parameter ids: download ids.
    /// - Returns: the ids of the downloads this queue now runs.
    /// - Throws: `unknownDownload` for an unknown id; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func start(_ ids: [String]) throws(PackDeliveryError) -> [String] {
        try self.resume(ids)
    }

    /// Changes how soon waiting downloads start (``DownloadPriority``): the queue admits by priority, then in the
    /// order downloads were added. A running download keeps running.
    ///
    /// - Parameters:
    ///   - ids: download ids.
    ///   - priority: the new priority.
    /// - Returns: the ids whose priority this queue changed. A download another process runs is recorded with the new
    ///   priority, and that process takes it within a second.
    /// - Throws: `unknownDownload` for an unknown id; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func setPriority(_ ids: [String], _ priority: DownloadPriority) throws(PackDeliveryError) -> [String] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in
            var changed: [String] = []
            for id in ids {
                if self.driven({ $0.machine.machine(id) != nil }) {
                    self.change { $0.handle(id, .setPriority(priority)) }
                    changed.append(id)
                } else if try self.store.setPriority(priority, for: id) {
                    // Another process may run it: it takes the new priority within a second, as a pause.
                    try self.store.setRequest(.priority(priority), for: id)
                } else {
                    throw PackDeliveryError(
                        .unknownDownload, message: "There is no download '\(PackDeliveryError.printable(id))'.", subject: id)
                }
            }
            return changed
        }
    }

    /// Lets downloads run on a metered connection: those waiting for an unmetered one
    /// (``PauseReason/waitingForUnmeteredNetwork``) resume, and none of them waits for one again.
    ///
    /// - Parameter ids: download ids.
    /// - Returns: the ids this queue runs now (a download another process runs is asked, and resumes within a second).
    /// - Throws: `unknownDownload` for an unknown id; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func allowMetered(_ ids: [String]) throws(PackDeliveryError) -> [String] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in
            var allowed: [String] = []
            for id in ids {
                if self.driven({ $0.machine.machine(id) == nil }) {
                    guard let record = try self.store.downloadRecord(id) else {
                        throw PackDeliveryError(
                            .unknownDownload, message: "There is no download '\(PackDeliveryError.printable(id))'.", subject: id)
                    }
                    if record.state.isSettled { continue }
                    if try self.take([id]).isEmpty {
                        try self.store.setRequest(.allowMetered, for: id)
                        continue
                    }
                }
                self.change { $0.handle(id, .allowMetered) }
                allowed.append(id)
            }
            return allowed
        }
    }

    /// Pauses every running download of this queue (Ctrl-C, shutdown).
    ///
    /// - Parameter reason: `user` for a person's request, `interrupted` for a shutdown (resumed on the next launch).
    public func pauseAll(reason: PauseReason = .user) {
        self.runOnDriver { self.change { $0.pauseAll(reason, closing: false) } }
    }
}
