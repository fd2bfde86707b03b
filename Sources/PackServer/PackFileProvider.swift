import Foundation
import Hummingbird
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// The files `FileMiddleware` serves, read with backpressure: memory per response is one chunk,
/// not the file.
///
/// Why this exists: Hummingbird 2.28's `LocalFileSystem` reads through NIO's `FileChunks`, an
/// async sequence that reads ahead up to 8 chunks of 128 KiB (`highWatermark: 8`) on the thread
/// pool, independently of how fast the socket drains; and the response body writer's own
/// backpressure reacts late (see ``ConnectionFlow``), so writes queue up on the event loop too.
/// 1,000 clients of a 4 MiB file made 1.7–1.9 GB. Here a chunk is read (`pread`) only once the
/// connection's ``ConnectionFlow`` has room for it — at most two chunks between the file and the
/// socket — so memory is bounded by connections × 2 chunks.
///
/// The reads run on the calling task's thread, not on a thread pool: served packs are read from
/// the page cache, where a 64 KiB `pread` is a memory copy of a few microseconds, cheaper than a
/// hop to a pool thread and back (nginx, without `aio threads`, reads in its event loop too). A file
/// on a slow disk would hold one of Swift's cooperative threads for the length of one read.
///
/// Only files that ``FileValidatorsMiddleware`` resolved and opened are served: it hands the open
/// file over through the task-local ``resolved``, so that validators, length and bytes all come
/// from the same inode. A path that arrives without it is resolved again by ``ServedFolder``.
struct PackFileProvider: FileProvider {
    /// The file the current request resolved to, set by ``FileValidatorsMiddleware`` around the
    /// call into `FileMiddleware`.
    @TaskLocal static var resolved: ResolvedFile?

    struct FileAttributes: FileMiddlewareFileAttributes, Sendable {
        let isFolder: Bool
        let size: Int
        let modificationDate: Date
    }

    typealias FileIdentifier = ResolvedFile

    let folder: ServedFolder
    /// Bytes read and written at a time.
    let chunkSize: Int

    func getFileIdentifier(_ path: String) -> ResolvedFile? {
        if let resolved = Self.resolved {
            return resolved
        }
        guard case .file(let file) = self.folder.resolve(decodedPath: Array(path.utf8)) else { return nil }
        return file
    }

    func getAttributes(id: ResolvedFile) async throws -> FileAttributes? {
        FileAttributes(
            isFolder: false,
            size: id.status.size,
            modificationDate: Date(timeIntervalSince1970: TimeInterval(id.status.modifiedSeconds))
        )
    }

    func loadFile(id: ResolvedFile, context: some RequestContext) async throws -> ResponseBody {
        guard id.status.size > 0 else { return ResponseBody() }
        return self.body(id, range: 0...(id.status.size - 1), flow: (context as? PackRequestContext)?.flow)
    }

    func loadFile(id: ResolvedFile, range: ClosedRange<Int>, context: some RequestContext) async throws -> ResponseBody {
        guard id.status.size > 0 else { return ResponseBody() }
        return self.body(id, range: range.clamped(to: 0...(id.status.size - 1)), flow: (context as? PackRequestContext)?.flow)
    }

    /// A body that reads `range` one chunk at a time, each after the previous one was written.
    private func body(_ file: ResolvedFile, range: ClosedRange<Int>, flow: ConnectionFlow?) -> ResponseBody {
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
        self.errno == 0 ? "The file ended before its announced length." : "Reading the file failed: \(String(cString: strerror(self.errno)))."
    }
}
