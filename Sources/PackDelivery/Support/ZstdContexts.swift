import CCompression
import Synchronization

/// zstd decompression contexts, kept for the next frame. `ZSTD_decompress` makes a context for each frame and frees it
/// after: about 100 KiB allocated and its tables set up each time, which for the frames of a chunked tar.zst (one per
/// chunk of 32 KiB or so, about 25,000 a GiB) cost more than a third of the decoding (issue 48; RESULTS.md, case 10).
/// A context decodes one frame at a time, so each decode takes one from the pool, or makes one, and gives it back.
enum ZstdContexts {
    /// A context in the pool or held by one decode.
    private final class Context: @unchecked Sendable {
        // Safe: a context is either in `pool` (under its mutex) or held by the one decode that took it out, which alone
        // uses it until it puts it back.
        let pointer: OpaquePointer
        init?() {
            guard let pointer = ZSTD_createDCtx() else { return nil }
            self.pointer = pointer
        }
        deinit { ZSTD_freeDCtx(self.pointer) }
    }

    /// The contexts kept, at most: one a check in flight (``ChunkSink/checksInFlight``); any beyond are freed.
    static let kept = 4
    private static let pool = Mutex<[Context]>([])

    /// Decodes the whole zstd frame(s) in `input` into `output`: the bytes written, or a zstd error code (see
    /// `ZSTD_isError`), as `ZSTD_decompress` gives.
    static func decompress(into output: UnsafeMutableRawBufferPointer, from input: UnsafeRawBufferPointer) -> Int {
        guard let context = Self.pool.withLock({ $0.popLast() }) ?? Context() else {
            return ZSTD_decompress(output.baseAddress, output.count, input.baseAddress, input.count)
        }
        defer { Self.pool.withLock { if $0.count < Self.kept { $0.append(context) } } }
        return ZSTD_decompressDCtx(context.pointer, output.baseAddress, output.count, input.baseAddress, input.count)
    }
}
