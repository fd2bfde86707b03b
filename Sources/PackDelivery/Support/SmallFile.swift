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
