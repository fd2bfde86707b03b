import Foundation
import PackTestSupport
import Synchronization
import Testing

@testable import PackDelivery

/// One write a `DirectFile` made, as its writer saw it.
struct RecordedWrite: Sendable {
    /// Whether the descriptor had `O_DIRECT` set (read from the descriptor with `fcntl`, not from the type).
    let direct: Bool
    let offset: Int64
    let count: Int
    /// Whether the memory written from was 4096-aligned.
    let alignedMemory: Bool
}

/// Writes with `pwrite(2)` and records each write; can refuse direct writes with EINVAL, or fill up after `limit`
/// bytes (a short write up to the limit when `short`, else -1 with ENOSPC).
final class RecordingWriter: FileWriting {
    let refuseDirect: Bool
    /// The bytes it writes in all before the disk is full (`Int.max`: never); a test may raise it (space freed).
    let limit: Atomic<Int>
    let short: Bool
    let writes = Mutex<[RecordedWrite]>([])
    let written = Atomic<Int>(0)

    init(refuseDirect: Bool = false, limit: Int? = nil, short: Bool = false) {
        self.refuseDirect = refuseDirect
        self.limit = Atomic(limit ?? Int.max)
        self.short = short
    }

    func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) -> Int {
        let direct = fcntl(fd, F_GETFL) & DirectFile.openFlag != 0
        self.writes.withLock {
            $0.append(
                .init(
                    direct: direct, offset: offset, count: count,
                    alignedMemory: Int(bitPattern: buffer) % DirectFile.alignment == 0))
        }
        if direct, self.refuseDirect {
            errno = EINVAL
            return -1
        }
        var count = count
        if case let limit = self.limit.load(ordering: .relaxed), limit < Int.max {
            let room = max(0, limit - self.written.load(ordering: .relaxed))
            if count > room {
                // A direct write can only be cut at a block boundary.
                let cut = direct ? room - room % DirectFile.alignment : room
                guard self.short, cut > 0 else {
                    errno = ENOSPC
                    return -1
                }
                count = cut
            }
        }
        let result = Glibc.pwrite(fd, buffer, count, off_t(offset))
        if result > 0 { self.written.add(result, ordering: .relaxed) }
        return result
    }

    var recorded: [RecordedWrite] { self.writes.withLock { $0 } }
    /// Bytes given to the `O_DIRECT` descriptor, and to the ordinary one.
    var directBytes: Int { self.recorded.filter(\.direct).reduce(0) { $0 + $1.count } }
    var plainBytes: Int { self.recorded.filter { !$0.direct }.reduce(0) { $0 + $1.count } }
}

/// A fast seeded generator, so a failing pattern can be replayed from its seed.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A file under test, its expected content kept in memory, and 4 MiB of random bytes (4096-aligned) to write from.
final class DirectFileFixture {
    let url: URL
    let file: DirectFile
    let writer: RecordingWriter
    private(set) var expected: [UInt8] = []
    let pool: UnsafeMutableRawBufferPointer

    init(folder: URL, writer: RecordingWriter = RecordingWriter(), stagingBytes: Int = 1 << 20, seed: UInt64 = 1) throws {
        self.url = folder.appending(path: "file-\(UUID().uuidString.prefix(8))")
        let fd = open(self.url.path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw FixtureError("open \(self.url.path): errno \(errno)") }
        self.writer = writer
        self.file = DirectFile(fd: fd, file: self.url, writer: writer, stagingBytes: stagingBytes)
        self.pool = .allocate(byteCount: 4 << 20, alignment: DirectFile.alignment)
        var generator = SplitMix(state: seed)
        for word in 0..<(self.pool.count / 8) { self.pool.storeBytes(of: generator.next(), toByteOffset: word * 8, as: UInt64.self) }
    }

    deinit { self.pool.deallocate() }

    /// Writes `count` bytes of the pool, from `source`, at `offset`, and the same into the expected content.
    func write(_ count: Int, from source: Int, at offset: Int64, aside: Bool = false) throws {
        let bytes = UnsafeRawBufferPointer(rebasing: self.pool[source..<source + count])
        let end = Int(offset) + count
        if self.expected.count < end { self.expected += [UInt8](repeating: 0, count: end - self.expected.count) }
        self.expected.withUnsafeMutableBytes {
            $0.baseAddress!.advanced(by: Int(offset)).copyMemory(from: bytes.baseAddress!, byteCount: count)
        }
        if aside { try self.file.writeAside(bytes, at: offset) } else { try self.file.write(bytes, at: offset) }
    }

    /// The file's bytes on disk, read back through its path.
    func onDisk() throws -> [UInt8] { [UInt8](try Data(contentsOf: self.url)) }
}

private let tmpfsSkipped: Comment = "mounting a tmpfs needs root; the same patterns run on the temporary folder's filesystem"

/// `DirectFile`: whatever the pattern of writes, the file holds exactly the bytes written, large runs go through
/// `O_DIRECT` in aligned blocks, a refused direct write falls back, and a full disk is reported as one.
@Suite(.timeLimit(.minutes(5)))
struct DirectFileTests {
    /// Random patterns: contiguous runs of 1 B..3 MiB from random offsets, gaps, rewrites, flushes in between.
    static func runPatterns(in folder: URL, seeds: Range<UInt64>) throws -> [RecordedWrite] {
        var all: [RecordedWrite] = []
        for seed in seeds {
            let staging = [1 << 20, 64 << 10, 4096][Int(seed % 3)]
            let fixture = try DirectFileFixture(folder: folder, stagingBytes: staging, seed: seed)
            var random = SplitMix(state: seed &* 7919)
            var previous: [(count: Int, source: Int, offset: Int64)] = []
            var end: Int64 = 0
            while end < 24 << 20, previous.count < 60 {
                let bucket = Int.random(in: 0..<4, using: &random)
                let limit = [16, 4096, 65536, 3 << 20][bucket]
                let count = Int.random(in: 1...limit, using: &random)
                let aligned = Bool.random(using: &random)
                var source = Int.random(in: 0...(fixture.pool.count - count), using: &random)
                if aligned { source -= source % DirectFile.alignment }
                let choice = Int.random(in: 0..<100, using: &random)
                let offset: Int64 =
                    switch choice {
                    case 0..<55: previous.last.map { $0.offset + Int64($0.count) } ?? Int64.random(in: 0..<10_000, using: &random)
                    case 55..<85: end + Int64.random(in: 0..<300_000, using: &random)
                    default: Int64.random(in: 0...end, using: &random)
                    }
                if choice >= 70, choice < 85, let again = previous.randomElement(using: &random) {
                    // The same bytes again at the same place (a chunk that occurs twice).
                    try fixture.write(again.count, from: again.source, at: again.offset)
                } else {
                    try fixture.write(count, from: source, at: offset)
                    previous.append((count, source, offset))
                    end = max(end, offset + Int64(count))
                }
                if Int.random(in: 0..<10, using: &random) == 0 { try fixture.file.flush() }
            }
            try fixture.file.flush()
            let disk = try fixture.onDisk()
            #expect(disk.count == fixture.expected.count, "seed \(seed): the file's size is the end of the furthest write")
            #expect(disk == fixture.expected, "seed \(seed): the file holds exactly the bytes written")
            all += fixture.writer.recorded
        }
        return all
    }

    /// Every direct write is whole aligned blocks from aligned memory.
    static func expectAligned(_ writes: [RecordedWrite]) {
        let bad = writes.filter {
            $0.direct && ($0.offset % Int64(DirectFile.alignment) != 0 || $0.count % DirectFile.alignment != 0 || !$0.alignedMemory)
        }
        #expect(bad.isEmpty, "direct writes not aligned: \(bad.prefix(5))")
    }

    @Test func randomPatternsOnTheTemporaryFolderLeaveExactlyTheBytesWritten() throws {
        let folder = try Fixtures.temporaryDirectory("directfile")
        defer { try? FileManager.default.removeItem(at: folder) }
        let writes = try Self.runPatterns(in: folder, seeds: 1..<10)
        Self.expectAligned(writes)
        let direct = writes.filter(\.direct).reduce(0) { $0 + $1.count }
        #expect(direct > 0, "some runs went through O_DIRECT")
    }

    @Test(.enabled(if: Tmpfs.available, tmpfsSkipped)) func randomPatternsOnATmpfsLeaveExactlyTheBytesWritten() throws {
        let disk = try Tmpfs(megabytes: 256)
        defer {
            disk.unmount()
            try? FileManager.default.removeItem(at: disk.folder)
        }
        let writes = try Self.runPatterns(in: disk.folder, seeds: 100..<106)
        Self.expectAligned(writes)
    }

    @Test func anEmptyFileStaysEmpty() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-empty")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder)
        try fixture.file.write(UnsafeRawBufferPointer(start: nil, count: 0), at: 1 << 20)
        try fixture.file.flush()
        #expect(try fixture.onDisk().isEmpty)
        #expect(fixture.writer.recorded.isEmpty, "nothing was written")
    }

    /// One long run that starts unaligned and ends unaligned, in pieces of 64 KiB..4 MiB like the install's chunks:
    /// all but the partial blocks at its ends go through O_DIRECT, in whole staging buffers.
    @Test func aLongRunGoesThroughODirectInAlignedBlocks() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-run")
        defer { try? FileManager.default.removeItem(at: folder) }
        let probe = open(folder.appending(path: "probe").path, O_WRONLY | O_CREAT | O_CLOEXEC | DirectFile.openFlag, 0o600)
        try #require(
            probe >= 0, "the temporary folder's filesystem accepts O_DIRECT (errno \(errno)), as ext4, xfs, btrfs and tmpfs ≥ 6.6 do")
        close(probe)
        let fixture = try DirectFileFixture(folder: folder)
        var random = SplitMix(state: 42)
        var offset: Int64 = 1000
        while offset < 40 << 20 {
            let count = Int.random(in: (64 << 10)...(4 << 20) - 16, using: &random)
            try fixture.write(count, from: Int.random(in: 1..<16, using: &random), at: offset)
            offset += Int64(count)
        }
        try fixture.write(777, from: 3, at: offset)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected)
        let writes = fixture.writer.recorded
        Self.expectAligned(writes)
        let plain = writes.filter { !$0.direct }
        #expect(
            plain.count == 2 && fixture.writer.plainBytes < 2 * DirectFile.alignment,
            "only the two ends went through the page cache: \(plain)")
        let sizes = writes.filter(\.direct).dropLast().map(\.count)
        #expect(sizes == sizes.sorted() && sizes.last == 1 << 20, "a growing staging buffer, then 1 MiB ones: \(sizes)")
        #expect(fixture.writer.directBytes > fixture.expected.count - (2 << 20), "all but the last buffer's tail and the head")
    }

    /// As the first install writes: ranges of one file, their ends unaligned, each through its own `DirectFile`,
    /// written, flushed and synced at the same time on several threads.
    @Test func rangesOfOneFileWrittenAtOnceLeaveExactlyTheBytesWritten() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-ranges")
        defer { try? FileManager.default.removeItem(at: folder) }
        let url = folder.appending(path: "file")
        close(open(url.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600))
        let size = 24 << 20 + 777
        var random = SplitMix(state: 99)
        let content = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            let raw = UnsafeMutableRawBufferPointer(buffer)
            for word in 0..<(size / 8) { raw.storeBytes(of: random.next(), toByteOffset: word * 8, as: UInt64.self) }
            for byte in (size / 8 * 8)..<size { raw[byte] = 0x5a }
            count = size
        }
        let bounds = [0, 5_000_001, 11_111_111, 17_000_003, size]
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: bounds.count - 1) { range in
            do {
                let fd = open(url.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
                guard fd >= 0 else { throw FixtureError("open: errno \(errno)") }
                let file = DirectFile(fd: fd, file: url, writer: SystemFileWriter())
                defer { file.close() }
                var pieces = SplitMix(state: UInt64(range))
                var offset = bounds[range]
                while offset < bounds[range + 1] {
                    let count = min(bounds[range + 1] - offset, Int.random(in: (64 << 10)...(1 << 20), using: &pieces))
                    try content.withUnsafeBytes {
                        try file.write(UnsafeRawBufferPointer(rebasing: $0[offset..<offset + count]), at: Int64(offset))
                    }
                    offset += count
                }
                try file.flush()
                guard fdatasync(file.fd) == 0 else { throw FixtureError("fdatasync: errno \(errno)") }
            } catch {
                failures.withLock { $0.append("range \(range): \(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        #expect(try Data(contentsOf: url) == Data(content))
    }

    /// A small file holds a staging buffer about its size, not 1 MiB: the sink may hold many files open at once.
    @Test func aSmallFileHoldsASmallBuffer() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-small")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder)
        try fixture.write(10_000, from: 1, at: 0)
        #expect(fixture.file.stagingCapacity == 12_288)
        try fixture.write(30_000, from: 2, at: 10_000)
        // The first buffer filled (12,288 bytes written out); the next fits the other 27,712 bytes, rounded to a block.
        #expect(fixture.file.stagingCapacity == 28_672)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected)
    }

    /// Memory already 4096-aligned, at an aligned offset, is written without going through the staging buffer.
    @Test func alignedMemoryIsWrittenWithoutACopy() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-aligned")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder)
        try fixture.write(3 << 20, from: 0, at: 0)
        try fixture.write(4096 + 5, from: 8192, at: 3 << 20)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected)
        let writes = fixture.writer.recorded
        #expect(writes.first.map { $0.direct && $0.count == 3 << 20 } == true, "one direct write of the whole 3 MiB: \(writes)")
        #expect(fixture.writer.plainBytes == 5, "\(writes)")
    }

    /// Copies of a chunk written aside, between the pieces of a run and around them (as a first install writes a chunk
    /// that repeats): the run goes on through `O_DIRECT` in whole staging buffers as if they were not there, the copies
    /// go through the page cache, and the file holds every byte, including where a copy shares a block with the run's
    /// edge or lands on the bytes staged (which then go through the run).
    @Test func copiesWrittenAsideLeaveTheRunWhole() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-aside")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder, stagingBytes: 64 << 10)
        // The run: 2 MiB + 100 in pieces of 70,001 bytes, from offset 0; copies of 30,000 bytes after its end (the holes
        // the run then skips), and one at the file's far end.
        let runEnd: Int64 = 2 << 20 + 100
        var copies: [Int64] = [runEnd + 5, runEnd + 40_000, runEnd + 200_001, 9 << 20 + 3]
        var offset: Int64 = 0
        while offset < runEnd {
            let count = Int(min(70_001, runEnd - offset))
            try fixture.write(count, from: Int(offset % (1 << 20)) + 1, at: offset)
            offset += Int64(count)
            if let copy = copies.popLast() { try fixture.write(30_000, from: 123, at: copy, aside: true) }
        }
        let runWrites = fixture.writer.recorded.filter(\.direct)
        #expect(runWrites.count == Int(runEnd) / (64 << 10), "the run's direct writes are whole buffers: \(runWrites)")
        #expect(runWrites.allSatisfy { $0.count == 64 << 10 && $0.offset % Int64(64 << 10) == 0 }, "\(runWrites)")
        // Bytes given aside over the staged ones (a rewrite) go through the run, and stay.
        try fixture.write(2000, from: 77, at: runEnd - 3000, aside: true)
        // The file's bytes go on in the gaps between the copies.
        try fixture.write(5, from: 5, at: runEnd)
        try fixture.write(9995, from: 9, at: runEnd + 30_005)
        try fixture.write(130_001, from: 11, at: runEnd + 70_000)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected)
        #expect(fixture.writer.plainBytes >= 4 * 30_000, "the copies went through the page cache")
    }

    @Test func flushingInTheMiddleOfARunThenContinuingKeepsEveryByte() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-flush")
        defer { try? FileManager.default.removeItem(at: folder) }
        for staging in [1 << 20, 8192] {
            let fixture = try DirectFileFixture(folder: folder, stagingBytes: staging)
            var offset: Int64 = 0
            for (index, count) in [10_000, 100_000, 1, 4095, 4096, 1 << 20, 3 << 20, 12_345, 70_000].enumerated() {
                try fixture.write(count, from: index * 17, at: offset)
                offset += Int64(count)
                try fixture.file.flush()
                #expect(try fixture.onDisk() == fixture.expected, "after flush \(index), staging \(staging)")
            }
            #expect(fixture.writer.directBytes > fixture.writer.plainBytes, "staging \(staging)")
        }
    }

    /// A device that refuses the direct writes: the first refusal sends that write and every later one through the
    /// ordinary descriptor.
    @Test func aRefusedDirectWriteFallsBackToTheOrdinaryDescriptor() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-einval")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder, writer: RecordingWriter(refuseDirect: true))
        try fixture.write(100, from: 0, at: 0)
        try fixture.write(3 << 20, from: 100, at: 100)
        try fixture.write(5000, from: 7, at: 8 << 20)
        try fixture.write(2 << 20, from: 9, at: 8 << 20 + 5000)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected)
        #expect(fixture.writer.recorded.filter(\.direct).count == 1, "one direct write tried, none after its refusal")
        #expect(fixture.file.directFD == -1)
    }

    @Test(arguments: [false, true]) func aWriterThatFillsUpReportsInsufficientStorage(short: Bool) throws {
        let folder = try Fixtures.temporaryDirectory("directfile-full")
        defer { try? FileManager.default.removeItem(at: folder) }
        // Through the direct descriptor (the 1 MiB buffers), and through the ordinary one (a small write at a gap).
        for (limit, plainLast) in [(3 << 20 + 9000, false), (8 << 20 + 50, true)] {
            let fixture = try DirectFileFixture(folder: folder, writer: RecordingWriter(limit: limit, short: short))
            let error = #expect(throws: PackDeliveryError.self) {
                for piece in 0..<8 { try fixture.write(1 << 20, from: piece, at: Int64(piece) << 20) }
                if plainLast { try fixture.write(100, from: 0, at: 9 << 20 + 1) }
                try fixture.file.flush()
            }
            #expect(error?.code == .insufficientStorage, "limit \(limit), short \(short): \(String(describing: error))")
            #expect(fixture.writer.recorded.last?.direct == !plainLast)
        }
    }

    /// A write that failed leaves what was given before it staged: once there is room, `flush()` puts it in the file.
    @Test func afterAFailedWriteFlushPutsTheStagedBytesInTheFile() throws {
        let folder = try Fixtures.temporaryDirectory("directfile-retry")
        defer { try? FileManager.default.removeItem(at: folder) }
        let fixture = try DirectFileFixture(folder: folder, writer: RecordingWriter(limit: 2 << 20))
        try fixture.write(1 << 20, from: 1, at: 0)
        try fixture.write(1 << 20, from: 2, at: 1 << 20)
        // Fills the staging buffer (1 MiB, from offset 2 MiB) and fails to write it out: the disk is full.
        let error = #expect(throws: PackDeliveryError.self) { try fixture.write(1 << 20, from: 3, at: 2 << 20) }
        #expect(error?.code == .insufficientStorage)
        #expect(try fixture.onDisk() == Array(fixture.expected[..<(2 << 20)]), "the first 2 MiB are in the file")
        fixture.writer.limit.store(Int.max, ordering: .relaxed)
        try fixture.file.flush()
        #expect(try fixture.onDisk() == fixture.expected, "the staged MiB too, once there is room")
    }

    @Test(.enabled(if: Tmpfs.available, tmpfsSkipped)) func aFullTmpfsReportsInsufficientStorage() throws {
        let disk = try Tmpfs(megabytes: 4)
        defer {
            disk.unmount()
            try? FileManager.default.removeItem(at: disk.folder)
        }
        let fixture = try DirectFileFixture(folder: disk.folder, writer: RecordingWriter())
        let error = #expect(throws: PackDeliveryError.self) {
            for piece in 0..<8 { try fixture.write(1 << 20, from: 5 + piece, at: Int64(piece) << 20) }
            try fixture.file.flush()
        }
        #expect(error?.code == .insufficientStorage, "\(String(describing: error))")
    }
}
