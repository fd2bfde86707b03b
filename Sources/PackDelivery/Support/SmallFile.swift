import Foundation

/// Reading a small file whole, with the errno of a failure kept: running out of descriptors, a disk error and
/// a missing file are three different answers, and `Data(contentsOf:)` makes them one.
enum SmallFile {
    /// The bytes of the file at `path`, or nil when there is none.
    ///
    /// - Parameters:
    ///   - path: the file.
    ///   - limit: the most bytes read; `tooLarge` is called with the path when the file holds more.
    /// - Throws: ``PackDeliveryError/io(_:path:errno:)`` when it cannot be opened or read (so EMFILE is
    ///   `tooManyOpenFiles`), or what `tooLarge` throws.
    static func read(
        _ path: String, limit: Int, tooLarge: (String) -> PackDeliveryError
    ) throws(PackDeliveryError) -> Data? {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw .io("open", path: path, errno: errno)
        }
        defer { close(fd) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw .io("read", path: path, errno: errno)
            }
            if count == 0 { return data }
            data.append(contentsOf: buffer[0..<count])
            if data.count > limit { throw tooLarge(path) }
        }
    }

    /// Writes `data` to `url` atomically and durably: a new file beside it (named for this process, so that two
    /// processes never write the same one), written whole and synced, renamed over the old one, the folder synced. A
    /// power cut leaves the old file or the new one, never a mix.
    /// - Throws: ``PackDeliveryError/io(_:path:errno:)`` when it cannot be written (the old file is then unchanged,
    ///   and the new one removed).
    static func write(_ data: Data, to url: URL) throws(PackDeliveryError) {
        let temporary = url.path + ".\(getpid()).new"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw .io("create", path: temporary, errno: errno) }
        var written = 0
        var code: Int32 = 0
        while written < data.count {
            let count = data.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + written, $0.count - written) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else {
                code = count < 0 ? errno : EIO
                break
            }
            written += count
        }
        if code == 0, fsync(fd) != 0 { code = errno }
        close(fd)
        guard code == 0 else {
            unlink(temporary)
            throw .io("write", path: temporary, errno: code)
        }
        guard rename(temporary, url.path) == 0 else {
            let failure = errno
            unlink(temporary)
            throw .io("rename", path: temporary, errno: failure)
        }
        try Durability.syncFolder(url.deletingLastPathComponent())
    }
}

/// Whether the process has run out of file descriptors, for failures that do not keep their errno (SQLite's "unable
/// to open database file", a libcurl connect whose OS errno is 0): one descriptor is opened now to see.
enum Descriptors {
    static var exhausted: Bool {
        let probe = open("/dev/null", O_RDONLY | O_CLOEXEC)
        if probe < 0 { return errno == EMFILE || errno == ENFILE }
        close(probe)
        return false
    }
}
