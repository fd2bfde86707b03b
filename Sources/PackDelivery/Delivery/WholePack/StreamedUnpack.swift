import Foundation
import Synchronization

/// Unpacks a pack while it downloads: a thread follows the partial file as the transfer writes it
/// and unpacks it into a staging folder of its own, with every check of ``Unpacker``. Nothing leaves that
/// folder here: the installer takes it (``take(cancel:progress:)``) only once the whole pack's SHA-256
/// matched, then moves it into place as it would a folder it unpacked itself.
///
/// - A restart from byte 0 unpacks again from the start; a stop (pause, failure, cancel, disk full) ends it
///   and deletes its folder. The next transfer starts a new one, which reads the kept bytes again from the
///   page cache: no byte is downloaded twice.
/// - A hostile entry (unsafe, over the limits, encrypted) is reported at once (``hostile``), so the transfer
///   stops instead of downloading the rest of a pack that will never be installed.
/// - A zip is read by its local headers as it arrives; its files' types and modes are in the central directory
///   at the end, which the installer applies once the pack is verified (``Unpacker/adopt(archive:listing:streamed:into:limits:isCancelled:)``).
/// - Any other failure (a corrupt stream, a full disk, a zip whose local headers are not its central
///   directory's entries) only means the installer unpacks from the archive after the download, as it always did.
final class StreamedUnpack: PartialFileFollower {
    enum Outcome: Sendable {
        case unpacked(UnpackSummary, folder: URL)
        case failed(PackDeliveryError)
    }

    private struct State {
        var outcome: Outcome?
        var taken = false
        var discarded = false
        var unpacked: Int64 = 0
        var hostile: PackDeliveryError?
    }

    let growth: PartialFileGrowth
    /// The folder it unpacks into: `staging/<download>.s<token>`, its own, so that a stopped unpack still
    /// winding down never shares a folder with the next one.
    let folder: URL
    private let state = Mutex(State())
    private let done = DispatchSemaphore(value: 0)

    /// Errors that mean the pack itself is refused, whatever its remaining bytes.
    static func isHostile(_ error: PackDeliveryError) -> Bool {
        [.unsafeEntry, .unpackLimitExceeded, .encryptedArchive].contains(error.code)
    }

    /// Starts following `archive` on a new thread.
    ///
    /// - Parameters:
    ///   - archive: the partial file.
    ///   - folder: the staging folder to create and unpack into.
    ///   - length: the pack's length, from the manifest.
    ///   - limits: as for ``Unpacker/unpack(archive:into:limits:progress:isCancelled:writer:growing:)``.
    ///   - writer: writes the files' bytes.
    ///   - hashFiles: hash each file as it is written; false when the pack's index gives the digests (``IndexFetch``).
    ///   - onProgress: bytes unpacked so far, about every MiB (on the unpack's thread).
    init(
        archive: URL, folder: URL, length: Int64, limits: UnpackLimits, writer: any FileWriting, hashFiles: Bool = true,
        onProgress: @escaping @Sendable (Int64) -> Void
    ) {
        self.growth = PartialFileGrowth(length: length)
        self.folder = folder
        let thread = Thread { [self] in
            let outcome = self.run(archive: archive, limits: limits, writer: writer, hashFiles: hashFiles, onProgress: onProgress)
            let remove = self.state.withLock { state -> Bool in
                state.outcome = outcome
                if case .failed(let error) = outcome, Self.isHostile(error) { state.hostile = error }
                if case .unpacked = outcome { return state.discarded }
                return true
            }
            if remove { try? Installer.removeTree(self.folder) }
            self.done.signal()
        }
        thread.name = "PackDelivery.unpack"
        thread.start()
    }

    private func run(
        archive: URL, limits: UnpackLimits, writer: any FileWriting, hashFiles: Bool, onProgress: @escaping @Sendable (Int64) -> Void
    ) -> Outcome {
        while true {
            let generation = self.growth.generation
            let file = GrowingFile(growth: self.growth, generation: generation)
            do throws(PackDeliveryError) {
                try Installer.removeTree(self.folder)
                if mkdir(self.folder.path, 0o700) != 0 {
                    throw PackDeliveryError.io("create the staging folder", path: self.folder.path, errno: errno)
                }
                let summary = try Unpacker.unpack(
                    archive: archive, into: self.folder, limits: limits,
                    progress: { bytes in
                        self.state.withLock { $0.unpacked = bytes }
                        onProgress(bytes)
                    },
                    isCancelled: { self.growth.isStopped(generation) }, writer: writer, growing: file, hashFiles: hashFiles)
                return .unpacked(summary, folder: self.folder)
            } catch {
                // A restart from byte 0 while unpacking: start over with the new bytes.
                if self.growth.generation != generation, !self.growth.isStopped(self.growth.generation) { continue }
                return .failed(error)
            }
        }
    }

    /// The hostile entry that ended the unpack, once it did: the transfer stops.
    var hostile: PackDeliveryError? { self.state.withLock { $0.hostile } }

    /// Bytes unpacked so far.
    var unpacked: Int64 { self.state.withLock { $0.unpacked } }

    /// For the installer, once the archive is verified: waits for the unpack to end, then hands over its folder.
    ///
    /// - Parameters:
    ///   - cancel: polled while waiting; when it is set, the unpack is stopped and nil returned.
    ///   - progress: bytes unpacked so far, while waiting.
    /// - Returns: the summary and folder, or the failure; nil when cancelled or already discarded.
    func take(cancel: CancelFlag, progress: (Int64) -> Void) -> Outcome? {
        while self.done.wait(timeout: .now() + 0.1) == .timedOut {
            if cancel.isCancelled {
                self.discard()
                return nil
            }
            progress(self.unpacked)
        }
        self.done.signal()  // later waiters (discard) see it done too
        return self.state.withLock { state -> Outcome? in
            guard !state.discarded, !state.taken else { return nil }
            state.taken = true
            return state.outcome
        }
    }

    /// Waits (at most `timeout` seconds) until the unpack's thread has ended, and with it the removal of a
    /// discarded folder. - Returns: whether it ended.
    @discardableResult
    func waitUntilEnded(timeout: TimeInterval) -> Bool {
        guard self.done.wait(timeout: .now() + timeout) == .success else { return false }
        self.done.signal()
        return true
    }

    /// Stops the unpack if it runs and deletes its folder, unless the installer took it.
    func discard() {
        self.growth.stop(PackDeliveryError.stopped("The download stopped."))
        let remove = self.state.withLock { state -> Bool in
            guard !state.taken, !state.discarded else { return false }
            state.discarded = true
            // Still running: the thread removes the folder when it ends.
            if case .unpacked? = state.outcome { return true }
            return false
        }
        if remove { try? Installer.removeTree(self.folder) }
    }
}
