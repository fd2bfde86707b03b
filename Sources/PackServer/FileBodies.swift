import Foundation
import Hummingbird
import NIOCore

#if canImport(Glibc)
    import Glibc
#endif

/// Response bodies that send a range of an open file with backpressure: memory per response is
/// bounded by a fixed window, not by the file.
///
/// Why this exists: Hummingbird 2.28's `FileMiddleware` (through `LocalFileSystem` and `FileIO`) reads
/// with NIO's `FileChunks`, an async sequence that reads ahead up to 8 chunks of 128 KiB
/// (`highWatermark: 8`) on the thread pool, however slowly the socket drains; and the response body
/// writer's own backpressure reacts late (see ``ConnectionFlow``), so writes pile up on the event
/// loop too. 1,000 clients of a 4 MiB file made 1.7–1.9 GB, and glibc kept most of it afterwards.
///
/// On a real connection the range goes to the socket as one `FileRegion` (`sendfile(2)`, see
/// ``ConnectionFlow/sendFile(_:offset:count:)``): no copy into this process at all. Where there is
/// no connection (`app.test(.router)`), chunks are read with `pread` on the calling task's thread,
/// each once the connection's window has room: served packs come from the page cache, where a
/// `pread` is a memory copy of microseconds, cheaper than a hop to a thread pool and back.
struct FileBodies: Sendable {
    /// Bytes read and written at a time on the copying path.
    let chunkSize: Int

    /// A body that sends `range` of `file`.
    ///
    /// - Parameters:
    ///   - file: The open file.
    ///   - range: The bytes to send (not empty).
    ///   - flow: The connection's flow control, `nil` where there is no connection.
    /// - Returns: A body of `range.count` bytes.
    func body(_ file: ResolvedFile, range: Range<Int>, flow: ConnectionFlow?) -> ResponseBody {
        let chunkSize = self.chunkSize
        return ResponseBody(contentLength: range.count) { writer in
            // On a real connection: sendfile, straight from the page cache to the socket.
            if let flow, try await flow.sendFile(file.file.fd, offset: range.lowerBound, count: range.count) {
                withExtendedLifetime(file) {}
                try await writer.finish(nil)
                return
            }
            // Elsewhere (app.test(.router)): read and write one chunk at a time.
            let allocator = ByteBufferAllocator()
            var offset = range.lowerBound
            var remaining = range.count
            while remaining > 0 {
                let length = min(chunkSize, remaining)
                // Wait for the socket to take what is in flight (see ConnectionFlow).
                await flow?.reserve(length)
                var buffer = allocator.buffer(capacity: length)
                let count = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { bytes in
                    var read = 0
                    while read < length {
                        let result = pread(file.file.fd, bytes.baseAddress! + read, length - read, off_t(offset + read))
                        if result < 0, errno == EINTR { continue }
                        guard result > 0 else {
                            // The file shrank or failed under us: the promised length cannot be
                            // kept, so the connection is dropped rather than padded.
                            throw FileReadError(errno: result < 0 ? errno : 0)
                        }
                        read += result
                    }
                    return read
                }
                offset += count
                remaining -= count
                try await writer.write(buffer)
            }
            try await writer.finish(nil)
        }
    }
}

/// A file could not be read to the length announced in `Content-Length`.
struct FileReadError: Error, CustomStringConvertible {
    /// The `errno` of the failed read, or 0 when the file ended early.
    let errno: Int32

    var description: String {
        self.errno == 0
            ? "The file ended before its announced length." : "Reading the file failed: \(String(cString: strerror(self.errno)))."
    }
}
