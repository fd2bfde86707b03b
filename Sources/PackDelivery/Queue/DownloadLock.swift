import Foundation

/// An advisory lock (flock) on a file per download: held by the one process that runs the download.
///
/// The kernel releases it when that process dies, even by SIGKILL, so a lock that can be taken means
/// nobody is running the download.
enum DownloadLock {
    /// Takes the lock without waiting. - Returns: the open descriptor holding it, or nil when another process holds it.
    static func tryLock(_ url: URL) throws(PackDeliveryError) -> Int32? {
        let fd = open(url.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw Installer.fileError("open the lock", url.path, errno) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 { return fd }
        close(fd)
        return nil
    }

    /// Whether another process holds the lock right now.
    static func isHeldElsewhere(_ url: URL) -> Bool {
        guard let fd = try? Self.tryLock(url) else { return FileManager.default.fileExists(atPath: url.path) }
        close(fd)
        return false
    }

    static func unlock(_ fd: Int32) { close(fd) }
}
