import Foundation
import Synchronization

/// A hold on quiet (a game running, a call, a presentation): while any is held, background and prefetch downloads of
/// every home wait, and the others share the quiet rate (``MachineSettings/quietRate``), as `systemd-inhibit` holds
/// off sleep.
///
/// Take one with ``DownloadQueue/holdQuiet(reason:)``; it ends with ``release()``, when the token is deinitialized,
/// or when its process exits however it exits: each hold is one file in the machine's quiet folder
/// (``QuietHolds/defaultFolder(environment:)``) naming its process by pid and start time, and a hold whose process
/// is gone is not counted, so a crashed holder never leaves quiet on.
public final class QuietHold: Sendable {
    /// The hold's file.
    public let url: URL
    /// Why quiet is held, as given.
    public let reason: String
    private let released = Mutex(false)

    /// Takes a hold.
    ///
    /// - Parameters:
    ///   - reason: why, for people (`packs quiet` lists it); at most 200 characters are kept.
    ///   - folder: the quiet folder (``QuietHolds/defaultFolder(environment:)`` by default).
    /// - Throws: `fileSystem` when the folder cannot be made (or belongs to another user) or the file written.
    public init(reason: String, folder: URL = QuietHolds.defaultFolder()) throws(PackDeliveryError) {
        try QuietHolds.prepare(folder)
        let record = QuietHolds.Record(pid: getpid(), start: QueueOwner.currentStart, reason: String(reason.prefix(200)))
        let url = folder.appending(path: "\(getpid())-\(UUID().uuidString).json")
        let data = (try? JSONEncoder().encode(record)) ?? Data()
        // Written beside and renamed, so a reader never sees half a hold.
        let temporary = url.path + ".new"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io("create", path: temporary, errno: errno) }
        let written = data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        guard written == data.count, rename(temporary, url.path) == 0 else {
            let failure = written < 0 ? errno : (written == data.count ? errno : EIO)
            unlink(temporary)
            throw .io("write", path: temporary, errno: failure)
        }
        self.url = url
        self.reason = record.reason
    }

    /// Ends the hold; calling it again does nothing.
    public func release() {
        let first = self.released.withLock { released in
            defer { released = true }
            return !released
        }
        if first { unlink(self.url.path) }
    }

    deinit { self.release() }
}

/// The quiet holds of the machine (of this user): where they are kept, and which are held now.
public enum QuietHolds {
    /// One hold now held.
    public struct Hold: Sendable, Hashable, Codable {
        /// The holding process.
        public var pid: Int32
        /// Why quiet is held.
        public var reason: String

        public init(pid: Int32, reason: String) {
            self.pid = pid
            self.reason = reason
        }
    }

    /// A hold's file.
    struct Record: Codable {
        var pid: Int32
        /// The holder's start time (``QueueOwner/startTime(of:)``), so a reused pid is not taken for it.
        var start: Int64
        var reason: String
    }

    /// The quiet folder: `$XDG_RUNTIME_DIR/packs/quiet`, else `/tmp/packs-UID/quiet` (a runtime folder is emptied at
    /// logout and boot; a hold's process is checked anyway).
    ///
    /// - Parameter environment: where to read `XDG_RUNTIME_DIR`.
    /// - Returns: the folder (it may not exist).
    public static func defaultFolder(environment: [String: String] = ProcessInfo.processInfo.environment) -> URL {
        if let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") {
            return URL(filePath: runtime).appending(path: "packs").appending(path: "quiet")
        }
        return URL(filePath: "/tmp/packs-\(getuid())").appending(path: "quiet")
    }

    /// The holds held now: those whose process still runs. Files of holders that are gone are removed on the way.
    ///
    /// - Parameter folder: the quiet folder (``defaultFolder(environment:)`` by default).
    /// - Returns: the holds, by pid; empty when the folder does not exist.
    public static func current(in folder: URL = Self.defaultFolder()) -> [Hold] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder.path) else { return [] }
        var holds: [Hold] = []
        for name in names where name.hasSuffix(".json") {
            let path = folder.appending(path: name).path
            guard let data = FileManager.default.contents(atPath: path),
                let record = try? JSONDecoder().decode(Record.self, from: data)
            else { continue }
            if Self.holderIsAlive(pid: record.pid, start: record.start) {
                holds.append(Hold(pid: record.pid, reason: record.reason))
            } else {
                unlink(path)
            }
        }
        return holds.sorted { ($0.pid, $0.reason) < ($1.pid, $1.reason) }
    }

    /// Whether a holder still runs: a process with its pid and start time that has not exited (a zombie, exited and not
    /// yet reaped by its parent, holds nothing).
    static func holderIsAlive(pid: Int32, start: Int64) -> Bool {
        guard QueueOwner.processIsAlive(pid: pid, start: start) else { return false }
        guard pid != getpid(), let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return true }
        // "pid (comm) state …": the state follows the last ')'.
        return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first != "Z"
    }

    /// Makes the folder (0700), refusing one that is not this user's own folder (a `/tmp` path another user made first).
    static func prepare(_ folder: URL) throws(PackDeliveryError) {
        try MachineSettings.makeFolders(folder)
        for path in [folder.deletingLastPathComponent().path, folder.path] {
            var info = stat()
            guard lstat(path, &info) == 0 else { throw .io("inspect", path: path, errno: errno) }
            guard (info.st_mode & S_IFMT) == S_IFDIR, info.st_uid == getuid() else {
                throw .io("use the quiet folder", path: path, errno: EACCES)
            }
        }
    }
}

extension DownloadQueue {
    /// Holds quiet until the token is released (or deinitialized, or the process exits): background and prefetch
    /// downloads of every home wait, and the others share the machine's quiet rate.
    ///
    /// - Parameter reason: why, for people (`packs quiet` lists it).
    /// - Returns: the hold; keep it as long as quiet is needed.
    /// - Throws: `fileSystem` when the hold cannot be recorded.
    public static func holdQuiet(reason: String) throws(PackDeliveryError) -> QuietHold {
        try QuietHold(reason: reason)
    }
}
