import CCompression
import Foundation

/// A large chunk of a first install (or the slices of a large shared frame), decoded, hashed and written as its stored
/// bytes arrive, in pieces, rather than gathered and decoded whole (issue 43: an index may declare chunks and frames of
/// up to 64 MiB, and a tar.zst whose twelve 64 MiB chunks were each a 2 KiB frame held 818 MiB). It holds a piece of
/// the stored bytes at a time, zstd's window (at most ``maxWindowLog``) and ``outputBytes`` of decoded bytes.
///
/// Its bytes go into the tree's files before they are checked: they count (are recorded) only once every byte arrived
/// and matched the chunk's SHA-256, and a chunk that does not match is fetched again and written over, as the record
/// has not named it.
///
/// Threads: used on one serial queue (a ``ChunkSink``'s `writes`) after it was made.
final class StreamedChunk: @unchecked Sendable {
    // Safe: made on the transfer thread and handed to the sink's serial `writes` queue (its `async` orders the two),
    // which alone uses it from then on.
    /// A chunk larger than this (stored or decoded), or a slice of a frame that decompresses to more, is streamed.
    static let threshold: Int64 = 1 << 20
    /// The decoded bytes written at a time.
    static let outputBytes = 256 << 10
    /// The largest zstd window accepted (8 MiB): `packs pack` compresses with level 3 (a window of 2 MiB at most), and up
    /// to level 19 a window is at most 8 MiB. A frame that asks for more does not decode, as a chunk that does not match.
    static let maxWindowLog: Int32 = 23

    /// One chunk taken from the decoded bytes: its number, and its bytes `start ..< end` of them.
    private struct Target {
        var number: Int
        var start: Int64
        var end: Int64
        var sha256: String
        let hasher = SHA256Hasher()
    }

    private var targets: [Target]
    /// The decoded length the stored bytes must give: the chunk's size, or its frame's.
    private let total: Int64
    private let isZstd: Bool
    private var stream: OpaquePointer?
    private var output: [UInt8]
    private var decoded: Int64 = 0
    /// Whether the last zstd call ended a frame (and nothing followed it yet).
    private var frameEnded = false
    private var broken = false

    /// Whether `chunk` is streamed rather than gathered whole.
    static func isLarge(_ chunk: PackIndex.Chunk) -> Bool {
        max(chunk.length, chunk.size, chunk.frameSize ?? 0) > Self.threshold
    }

    /// Whether a chunk stored as `storage` can be streamed (what a tar or tar.zst holds).
    static func canStream(_ storage: PackIndex.Storage) -> Bool {
        storage == .raw || storage == .zstdFrame || storage == .zstdFrameSlice
    }

    /// - Parameter numbers: one chunk, or the slices of one shared frame (the same stored bytes), in `chunks`.
    init(_ numbers: [Int], chunks: [PackIndex.Chunk]) {
        let first = chunks[numbers[0]]
        let total = first.storage == .zstdFrameSlice ? (first.frameSize ?? 0) : first.size
        self.isZstd = first.storage != .raw
        self.total = total
        self.targets = numbers.map { number in
            let chunk = chunks[number]
            let start = chunk.storage == .zstdFrameSlice ? (chunk.frameOffset ?? -1) : 0
            return Target(number: number, start: start, end: start + chunk.size, sha256: ChunkPlan.lowercase(chunk.sha256))
        }
        // A slice outside its frame (the index was checked, so only in theory) matches nothing.
        if self.targets.contains(where: { $0.start < 0 || $0.end > total }) { self.broken = true }
        self.output = self.isZstd ? [UInt8](repeating: 0, count: Self.outputBytes) : []
        if self.isZstd {
            self.stream = ZSTD_createDStream()
            if let stream = self.stream {
                ZSTD_DCtx_setParameter(stream, ZSTD_d_windowLogMax, Self.maxWindowLog)
            } else {
                self.broken = true
            }
        }
    }

    deinit { if let stream { ZSTD_freeDStream(stream) } }

    /// Decodes a piece of the stored bytes, in order, and hands each chunk's part of what it decodes to `write`, with
    /// where that part starts in the chunk. After the stored bytes fail to decode (or decode to more than they
    /// should), nothing more is written.
    func feed(_ stored: [UInt8], write: (UnsafeRawBufferPointer, _ number: Int, _ at: Int64) throws -> Void) rethrows {
        guard !self.broken else { return }
        guard self.isZstd else { return try stored.withUnsafeBytes { try self.take($0, write: write) } }
        guard let stream = self.stream else { return }
        try stored.withUnsafeBytes { source in
            var input = ZSTD_inBuffer(src: source.baseAddress, size: source.count, pos: 0)
            while !self.broken, input.pos < input.size || !self.frameEnded {
                let (result, produced) = self.output.withUnsafeMutableBytes { out in
                    var buffer = ZSTD_outBuffer(dst: out.baseAddress, size: out.count, pos: 0)
                    let result = ZSTD_decompressStream(stream, &buffer, &input)
                    return (result, buffer.pos)
                }
                if ZSTD_isError(result) != 0 {
                    self.broken = true
                    return
                }
                self.frameEnded = result == 0
                if produced > 0 {
                    try self.output.withUnsafeBytes { try self.take(UnsafeRawBufferPointer(rebasing: $0[..<produced]), write: write) }
                }
                // All input taken and the output not full: zstd needs more input (or the frame ended).
                if input.pos == input.size, produced < self.output.count { break }
            }
        }
    }

    /// The chunks, each with whether it matched: every stored byte decoded to exactly the decoded length, the last
    /// frame ended, and the chunk's bytes have its SHA-256.
    func finish() -> [(number: Int, matched: Bool)] {
        let whole = !self.broken && self.decoded == self.total && (!self.isZstd || self.frameEnded)
        return self.targets.map { ($0.number, whole && $0.hasher.hexDigest() == $0.sha256) }
    }

    /// Hashes decoded bytes into the chunks that hold them, and writes them.
    private func take(_ bytes: UnsafeRawBufferPointer, write: (UnsafeRawBufferPointer, Int, Int64) throws -> Void) rethrows {
        let start = self.decoded
        self.decoded += Int64(bytes.count)
        guard self.decoded <= self.total else {
            self.broken = true
            return
        }
        for target in self.targets where target.start < self.decoded && start < target.end {
            let from = max(start, target.start)
            let to = min(self.decoded, target.end)
            let part = UnsafeRawBufferPointer(rebasing: bytes[Int(from - start)..<Int(to - start)])
            target.hasher.update(part)
            try write(part, target.number, from - target.start)
        }
    }
}
