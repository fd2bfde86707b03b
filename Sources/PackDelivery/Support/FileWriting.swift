import Foundation

/// Writes downloaded and unpacked bytes into files.
///
/// The queue uses ``SystemFileWriter``. Tests hand the queue a writer that fails the way a full disk
/// does (ENOSPC after N bytes), so disk-full handling is covered without mounting a filesystem.
public protocol FileWriting: Sendable {
    /// Writes bytes at an offset, like `pwrite(2)`.
    ///
    /// - Parameters:
    ///   - fd: an open file descriptor.
    ///   - buffer: the bytes to write.
    ///   - count: how many bytes of `buffer` to write.
    ///   - offset: where in the file to write them.
    /// - Returns: the number of bytes written, or -1 with `errno` set.
    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int
}

/// `pwrite(2)`, as is.
public struct SystemFileWriter: FileWriting {
    /// Creates the writer.
    public init() {}

    /// Calls `pwrite(2)`.
    ///
    /// - Parameters:
    ///   - fd: an open file descriptor.
    ///   - buffer: the bytes to write.
    ///   - count: how many bytes of `buffer` to write.
    ///   - offset: where in the file to write them.
    /// - Returns: the number of bytes written, or -1 with `errno` set.
    public func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        Glibc.pwrite(fd, buffer, count, off_t(offset))
    }
}
