import Foundation
import PackTestSupport
import Testing

@_spi(Fuzzing) @testable import PackDelivery

/// Index format 3: small files share zstd frames, and each of their chunks is a slice of its frame
/// (`zstd-frame-slice`). Hostile slices are refused; the plan fetches a shared frame once.
@Suite("Grouped frames", .serialized, .timeLimit(.minutes(6)))
struct GroupedFramesTests {
    static let product = ChunkDeltaTests.product
    static let format = PackFormat.tarZstd
    static var packName: String { ChunkDeltaTests.packName(Self.format) }

    /// A chunk's bytes as the standard tools read them: its range of the pack through `zstd -dc`, and for a slice,
    /// its bytes of the frame decompressed (whose length must be the frame's size).
    static func chunkBytes(_ pack: URL, _ chunk: PackIndex.Chunk) throws -> Data {
        let stored = try ChunkedPackTests.stored(pack, offset: chunk.offset, length: chunk.length, storage: chunk.storage)
        guard chunk.storage == .zstdFrameSlice else { return stored }
        let (size, offset) = (try #require(chunk.frameSize), try #require(chunk.frameOffset))
        #expect(Int64(stored.count) == size, "the frame at \(chunk.offset) decompresses to the size the index gives")
        return stored.subdata(in: Int(offset)..<Int(offset + chunk.size))
    }

    @Test("Hostile slices are refused with what is wrong; slices sharing one frame are read")
    func hostileSlices() throws {
        let digest = PackIndexFormat2Tests.digest
        func slice(_ offset: Int, _ length: Int, size: Int, frameSize: Int, frameOffset: Int) -> [String: Any] {
            [
                "sha256": digest, "size": size, "offset": offset, "length": length, "storage": "zstd-frame-slice",
                "frameSize": frameSize, "frameOffset": frameOffset,
            ]
        }
        /// Two files of one slice each, in the frame at 1000+3000 of 100,000 bytes, with `change` applied to the root.
        func index(format: Int = 3, _ change: (inout [String: Any]) -> Void = { _ in }) throws -> Data {
            var root: [String: Any] = [
                "format": format, "container": "tar.zst", "pack": ["length": 10_000, "sha256": digest],
                "chunking": ["algorithm": "fastcdc", "minimum": 16_384, "average": 32_768, "maximum": 262_144, "normalization": 1],
                "entries": [
                    [
                        "path": "a", "kind": "file", "size": 40_000, "sha256": digest, "mode": 0o100644,
                        "chunks": [slice(1_000, 3_000, size: 40_000, frameSize: 100_000, frameOffset: 512)],
                    ],
                    [
                        "path": "b", "kind": "file", "size": 50_000, "sha256": digest, "mode": 0o100644,
                        "chunks": [slice(1_000, 3_000, size: 50_000, frameSize: 100_000, frameOffset: 41_472)],
                    ],
                ],
            ]
            change(&root)
            return try JSONSerialization.data(withJSONObject: root)
        }
        func chunk(_ root: inout [String: Any], file: Int, _ change: (inout [String: Any]) -> Void) {
            var entries = root["entries"] as! [[String: Any]]
            var chunks = entries[file]["chunks"] as! [[String: Any]]
            change(&chunks[0])
            entries[file]["chunks"] = chunks
            root["entries"] = entries
        }
        #expect(PackIndexFormat2Tests.refusal(try index()) == nil, "two slices of one frame")
        let decoded = try PackIndex.decode(try index(), maxEntries: 10, containers: [.tarZstd])
        #expect(decoded.entries[1].chunks?.first?.frameOffset == 41_472 && decoded.entries[1].chunks?.first?.frameSize == 100_000)
        let cases: [(String, Data)] = [
            ("outside its frame", try index { chunk(&$0, file: 1) { $0["frameOffset"] = 50_001 } }),
            ("outside its frame", try index { chunk(&$0, file: 0) { $0["frameOffset"] = -1 } }),
            ("outside 1…", try index { chunk(&$0, file: 0) { $0["frameSize"] = 0 } }),
            ("outside 1…", try index { chunk(&$0, file: 0) { $0["frameSize"] = (64 << 20) + 1 } }),
            ("outside its frame", try index { chunk(&$0, file: 0) { $0["frameSize"] = 30_000 } }),
            ("without its frame's", try index { chunk(&$0, file: 0) { $0.removeValue(forKey: "frameSize") } }),
            ("with a frame slice's fields", try index { chunk(&$0, file: 0) { $0["storage"] = "zstd-frame" } }),
            // The same range as two frames of different sizes, a frame and a slice, or slices of ranges that cross.
            ("overlapping", try index { chunk(&$0, file: 1) { $0["frameSize"] = 100_001 } }),
            (
                "overlapping",
                try index {
                    chunk(&$0, file: 1) {
                        $0["storage"] = "zstd-frame"
                        $0.removeValue(forKey: "frameSize")
                        $0.removeValue(forKey: "frameOffset")
                    }
                }
            ),
            ("overlapping", try index { chunk(&$0, file: 1) { $0["offset"] = 2_000 } }),
            ("overlapping", try index { chunk(&$0, file: 1) { $0["length"] = 2_999 } }),
            ("cannot hold", try index(format: 2)),
            ("outside the pack", try index { chunk(&$0, file: 1) { $0["length"] = 9_001 } }),
            ("not 1, 2 or 3", try index(format: 4)),
        ]
        for (reason, data) in cases {
            let message = PackIndexFormat2Tests.refusal(data)
            #expect(message?.contains(reason) == true, "\(reason): \(message ?? "accepted")")
        }
        // The fuzzer's oracle agrees: shared frames are no broken promise, crossing ones are.
        #expect(FuzzEntry.indexPromisesBroken(try index()) == [])
    }

    @Test("The plan fetches a shared frame once for all its slices, and counts its bytes once")
    func planFetchesASharedFrameOnce() throws {
        let digest = { (n: Int) in String(repeating: String(format: "%02x", n), count: 32) }
        let chunks = (0..<4).map { n in
            PackIndex.Chunk(
                sha256: digest(n + 1), size: 1_000, offset: n < 3 ? 500 : 5_000_000, length: n < 3 ? 2_000 : 800,
                frameSize: 10_000, frameOffset: Int64(n) * 1_000)
        }
        let ranges = ChunkPlan.coalesce(Array(chunks.indices).reversed(), in: chunks)
        #expect(ranges.map { [$0.start, $0.end] } == [[500, 2_500], [5_000_000, 5_000_800]])
        #expect(ranges.first?.chunks.sorted() == [0, 1, 2])
        let windows = ChunkPlan.windows(Array(chunks.indices), in: chunks, window: 1 << 20)
        #expect(windows.map { [$0.start, $0.end] } == [[500, 2_500], [5_000_000, 5_000_800]])
        #expect(ChunkPlan.storedLength([0, 1, 2, 3], in: chunks) == 2_800)
    }
}
