import Foundation
import Testing

@testable import PackDelivery

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Bytes from a fixed seed (xorshift), so a failure reproduces.
func chunkedPackBytes(_ count: Int, seed: UInt64) -> [UInt8] {
    var state = seed | 1
    var bytes = [UInt8](repeating: 0, count: count)
    for index in 0..<count {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        bytes[index] = UInt8(truncatingIfNeeded: state >> 32)
    }
    return bytes
}

/// The SHA-256 of each chunk of `bytes`.
func chunkedPackDigests(_ bytes: [UInt8], _ chunker: Chunker = .standard) -> [String] {
    let hasher = SHA256Hasher()
    return bytes.withUnsafeBytes { buffer in
        var start = 0
        return chunker.lengths(buffer).map { length in
            hasher.reset()
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[start..<start + length]))
            start += length
            return hasher.hexDigest()
        }
    }
}

@Suite("Chunker", .timeLimit(.minutes(2)))
struct ChunkerTests {
    @Test("The same bytes give the same boundaries, and the sizes stay within minimum and maximum")
    func deterministicAndBounded() {
        let bytes = chunkedPackBytes(8 << 20, seed: 42)
        let chunker = Chunker.standard
        let first = bytes.withUnsafeBytes { chunker.lengths($0) }
        let second = bytes.withUnsafeBytes { chunker.lengths($0) }
        #expect(first == second)
        #expect(first.reduce(0, +) == bytes.count)
        #expect(first.dropLast().allSatisfy { (chunker.minimum...chunker.maximum).contains($0) }, "\(first.min() ?? 0)…\(first.max() ?? 0)")
        // Normalized chunking gathers sizes near the average: 8 MiB in 64 KiB chunks is about 128 of them.
        #expect((64...256).contains(first.count), "\(first.count) chunks")
        // A stream given in odd pieces cuts where the whole buffer does.
        let stream = ChunkStream(chunker: chunker)
        var streamed: [Int] = []
        bytes.withUnsafeBytes { buffer in
            var start = 0
            var piece = 1
            while start < buffer.count {
                let end = min(buffer.count, start + piece)
                stream.add(UnsafeRawBufferPointer(rebasing: buffer[start..<end])) { streamed.append($0.count) }
                start = end
                piece = piece * 7 % 300_007 + 1
            }
            stream.finish { streamed.append($0.count) }
        }
        #expect(streamed == first)
    }

    @Test("A 4 KiB insertion near the start changes only the chunks around it")
    func insertionShiftsLittle() {
        let original = chunkedPackBytes(16 << 20, seed: 7)
        var changed = original
        changed.insert(contentsOf: chunkedPackBytes(4096, seed: 99), at: 100_000)
        let before = chunkedPackDigests(original)
        let after = chunkedPackDigests(changed)
        let kept = Set(before).intersection(after).count
        #expect(kept >= before.count - 3, "\(kept) of \(before.count) chunks unchanged")
        // And a fixed-size cut would have kept none after the insertion.
        #expect(before.count > 100)
    }

    @Test("Empty and tiny inputs; a run of zeros is cut at the maximum")
    func edges() {
        let chunker = Chunker.standard
        #expect([UInt8]().withUnsafeBytes { chunker.lengths($0) } == [])
        #expect([UInt8](repeating: 1, count: 1).withUnsafeBytes { chunker.lengths($0) } == [1])
        #expect([UInt8](repeating: 1, count: chunker.minimum).withUnsafeBytes { chunker.lengths($0) } == [chunker.minimum])
        let zeros = [UInt8](repeating: 0, count: 1 << 20)
        #expect(zeros.withUnsafeBytes { chunker.lengths($0) } == [Int](repeating: chunker.maximum, count: 4))
        let stream = ChunkStream(chunker: chunker)
        var count = 0
        stream.finish { _ in count += 1 }
        #expect(count == 0)
        #expect(Chunker(minimum: 16, average: 64 << 10, maximum: 256 << 10) == nil, "below the hash's window")
        #expect(Chunker(minimum: 16 << 10, average: 60_000, maximum: 256 << 10) == nil, "not a power of two")
        #expect(Chunker(minimum: 16 << 10, average: 64 << 10, maximum: 32 << 10) == nil, "maximum below the average")
    }
}
