import Foundation

/// What a chunked delta update (a tar, tar.zst or tar.gz pack whose index gives each file's chunks) fetches and
/// what it takes from the installed version, decided with no I/O from the new pack's index, the files the installed
/// version recorded, and the chunks found in the installed files (``ChunkAssembly/inventory(of:root:chunker:wanted:isCancelled:)``).
///
/// A file of the new version whose SHA-256 and size match an installed regular file is reused whole, as
/// ``DeltaPlan`` does. Every other file is written from its chunks in order: a chunk whose SHA-256 was found in an
/// installed file is read from there, any other is fetched from the pack, once however many files hold it.
/// Fetched chunks that lie close together are fetched as one range. Folders and symlinks are made as the index
/// gives them (a symlink's target from the index, or from an installed symlink with the same SHA-256).
struct ChunkPlan: Sendable, Hashable {
    /// Where a chunk found on this machine lies: bytes `offset..<offset + size` of the file `path`, in the installed
    /// version's folder, or in the seed folder number `seed` (``SeedFolders``).
    struct LocalChunk: Sendable, Hashable {
        var path: String
        var offset: Int64
        var size: Int64
        /// The seed folder (its number in ``DeltaTransfer/Request/seeds``) that holds the file; nil: the installed version.
        var seed: Int? = nil
    }

    /// Where one piece of a new file comes from.
    enum Source: Sendable, Hashable {
        /// Bytes of an installed file.
        case local(LocalChunk)
        /// A fetched chunk: its number in ``ChunkPlan/fetch``.
        case fetched(Int)
    }

    /// One chunk of a file written from chunks.
    struct Piece: Sendable, Hashable {
        var sha256: String
        var size: Int64
        var source: Source
    }

    /// A file of the new version written from its chunks: entry `number` of the index.
    struct Build: Sendable, Hashable {
        var number: Int
        var pieces: [Piece]
    }

    /// A symlink of the new version: entry `number`, with its target from the index, or read from the installed
    /// symlink `from` (whose target has the SHA-256 the index gives).
    struct Link: Sendable, Hashable {
        var number: Int
        var target: String?
        var from: String?
    }

    /// Bytes `start..<end` of the pack, holding the fetched chunks `chunks` (numbers in ``fetch``).
    struct Range: Sendable, Hashable {
        var start: Int64
        var end: Int64
        var chunks: [Int]
    }

    var reuse: [DeltaPlan.Reuse] = []
    var build: [Build] = []
    var links: [Link] = []
    var directories: [String] = []
    /// The chunks fetched, each SHA-256 once.
    var fetch: [PackIndex.Chunk] = []
    var ranges: [Range] = []

    var bytesToFetch: Int64 { self.ranges.reduce(0) { $0 + $1.end - $1.start } }
    /// Bytes of the new version taken from installed files: files reused whole, and chunks read from installed files.
    var bytesReused: Int64 {
        self.reuse.reduce(0) { $0 + $1.size }
            + self.build.reduce(0) { total, build in
                total + build.pieces.reduce(0) { if case .local = $1.source { $0 + $1.size } else { $0 } }
            }
    }
    /// Chunks of the files reused whole, as the index gives them.
    var chunksInFilesReused = 0
    /// Chunks read from installed files.
    var chunksReused: Int {
        self.build.reduce(0) { total, build in total + build.pieces.filter { if case .local = $0.source { true } else { false } }.count }
    }

    /// The pack formats whose chunks this reads.
    static let containers: Set<PackIndex.Container> = [.tar, .tarZstd, .tarGzip]

    /// The installed regular files worth chunking for reusable chunks: those no file of the new version reuses whole
    /// (in a repair, damaged files too: each chunk found is hashed as it is read).
    ///
    /// - Parameters:
    ///   - index: the new pack's index.
    ///   - installed: the installed files that may be reused whole (damaged ones left out).
    ///   - all: every installed file recorded.
    static func seeds(index: PackIndex, installed: [InstalledFileRecord], all: [InstalledFileRecord]) -> [InstalledFileRecord] {
        let wanted = Set(index.entries.compactMap { $0.kind == .file ? $0.sha256?.lowercased() : nil })
        let whole = Set(installed.filter { $0.kind == .file && wanted.contains($0.sha256.lowercased()) }.map(\.path))
        return all.filter { $0.kind == .file && !whole.contains($0.path) }
    }

    /// The SHA-256s of the chunks of the new version's files that are not reused whole: the chunks worth finding.
    static func wantedChunks(index: PackIndex, installed: [InstalledFileRecord]) -> Set<String> {
        let whole = Set(installed.filter { $0.kind == .file }.map { $0.sha256.lowercased() })
        var wanted = Set<String>()
        for entry in index.entries where entry.kind == .file && !whole.contains(entry.sha256?.lowercased() ?? "") {
            for chunk in entry.chunks ?? [] { wanted.insert(chunk.sha256.lowercased()) }
        }
        return wanted
    }

    /// Why no update can be planned from `index` at all: installed files that changed since the install, an index
    /// that does not describe a chunked tar of `packLength` bytes, or files larger in all than the manifest allows.
    private static func refusal(index: PackIndex, packLength: Int64, unpackedLength: Int64?, damaged: [String]) -> DeltaRefusal? {
        if let first = damaged.first {
            return DeltaRefusal(
                .installedFilesChanged,
                "the installed file \(PackDeliveryError.printable(first)) does not verify (\(damaged.count) file\(damaged.count == 1 ? "" : "s") changed since the install)"
            )
        }
        guard index.format >= 2, Self.containers.contains(index.container), let pack = index.pack, pack.length == packLength else {
            return DeltaRefusal(.indexUnusable, "the pack's index does not describe a chunked tar pack of \(packLength) bytes")
        }
        var files: Int64 = 0
        for entry in index.entries where entry.kind == .file {
            // Each size is at most 2^50 (checked when decoded) and the sum stops past 2^50: it cannot overflow.
            files += entry.size
            if files > min(LoadedManifest.maxSize, unpackedLength ?? LoadedManifest.maxSize) {
                return DeltaRefusal(
                    .indexUnusable,
                    "the pack's index gives its files more than \(unpackedLength.map { "the \($0) bytes the manifest allows" } ?? "2^50 bytes")"
                )
            }
        }
        return nil
    }

    /// The plan, or why the whole pack is fetched instead.
    ///
    /// - Parameters:
    ///   - index: the new pack's index (format 2), checked by ``PackIndex/decode(_:maxEntries:containers:)``.
    ///   - packLength: the new pack's length, from the manifest.
    ///   - unpackedLength: the most the pack may unpack to, from the manifest, if it says.
    ///   - installed: the installed version's files that may be reused whole, as recorded.
    ///   - damaged: the installed files that do not look as recorded (an update is then refused, as ``DeltaPlan`` does).
    ///   - local: the chunks found in installed files, by SHA-256 (lowercase hex).
    static func make(
        index: PackIndex, packLength: Int64, unpackedLength: Int64? = nil, installed: [InstalledFileRecord], damaged: [String],
        local: [String: LocalChunk]
    ) -> Result<ChunkPlan, DeltaRefusal> {
        if let refusal = Self.refusal(index: index, packLength: packLength, unpackedLength: unpackedLength, damaged: damaged) {
            return .failure(refusal)
        }
        var byDigest: [String: InstalledFileRecord] = [:]
        var linksByDigest: [String: InstalledFileRecord] = [:]
        for file in installed {
            let digest = file.sha256.lowercased()
            switch file.kind {
            case .file: byDigest[digest] = byDigest[digest] ?? file
            case .symlink: linksByDigest[digest] = linksByDigest[digest] ?? file
            }
        }
        var plan = ChunkPlan()
        // Sized once for every chunk of the index (25,000 for a 1 GiB pack), rather than grown and rehashed.
        let chunkCount = index.entries.reduce(0) { $0 + ($1.chunks?.count ?? 0) }
        var fetched: [String: Int] = [:]
        fetched.reserveCapacity(chunkCount)
        plan.fetch.reserveCapacity(chunkCount)
        for (number, entry) in index.entries.enumerated() {
            let sha256 = entry.sha256?.lowercased() ?? ""
            switch entry.kind {
            case .directory:
                plan.directories.append(entry.path)
            case .symlink:
                if let target = entry.target {
                    plan.links.append(Link(number: number, target: target, from: nil))
                } else if let old = linksByDigest[sha256], old.size == entry.size {
                    plan.links.append(Link(number: number, target: nil, from: old.path))
                } else {
                    return .failure(
                        DeltaRefusal(
                            .indexUnusable,
                            "the pack's index does not give the target of the symlink \(PackDeliveryError.printable(entry.path)), and no installed symlink has it"
                        ))
                }
            case .file:
                if let old = byDigest[sha256], old.size == entry.size {
                    plan.reuse.append(DeltaPlan.Reuse(path: entry.path, from: old.path, size: entry.size, sha256: sha256))
                    plan.chunksInFilesReused += entry.chunks?.count ?? 0
                    continue
                }
                guard let chunks = entry.chunks else {
                    return .failure(
                        DeltaRefusal(
                            .indexUnusable,
                            "the pack's index gives \(PackDeliveryError.printable(entry.path)) no chunks, so it cannot be fetched apart"))
                }
                if let chunk = chunks.first(where: { $0.length > Self.maxStoredLength($0.frameSize ?? $0.size) }) {
                    return .failure(
                        DeltaRefusal(
                            .indexUnusable,
                            "the pack's index gives \(PackDeliveryError.printable(entry.path)) a chunk of \(chunk.frameSize ?? chunk.size) bytes stored in \(chunk.length), more than any compressor makes of it"
                        ))
                }
                var pieces: [Piece] = []
                pieces.reserveCapacity(chunks.count)
                for chunk in chunks {
                    let digest = Self.lowercase(chunk.sha256)
                    if !local.isEmpty, let found = local[digest], found.size == chunk.size {
                        pieces.append(Piece(sha256: digest, size: chunk.size, source: .local(found)))
                        continue
                    }
                    // One lookup of the digest: its number when fetched already with this size, else the next one.
                    let next = plan.fetch.count
                    let number = Self.claim(&fetched[digest, default: next], next: next, size: chunk.size, in: plan.fetch)
                    pieces.append(Piece(sha256: digest, size: chunk.size, source: .fetched(number)))
                    if number == next { plan.fetch.append(chunk) }
                }
                plan.build.append(Build(number: number, pieces: pieces))
            }
        }
        plan.ranges = Self.coalesce(Array(plan.fetch.indices), in: plan.fetch)
        return .success(plan)
    }

    /// The number in `fetch` of a chunk whose digest's entry in the table of fetched chunks is `slot` (`next` when it
    /// has none): the chunk fetched already when it has this size; else `next`, which `slot` then records.
    private static func claim(_ slot: inout Int, next: Int, size: Int64, in fetch: [PackIndex.Chunk]) -> Int {
        if slot != next, fetch[slot].size == size { return slot }
        slot = next
        return next
    }

    /// `digest` in lowercase: the same string, not a copy, when it is already (as `packs pack` writes digests), so
    /// that a plan of 25,000 chunks does not hold a second copy of each chunk's SHA-256 (2.8 MB for a 1 GiB pack).
    static func lowercase(_ digest: String) -> String {
        // Over the string's bytes in place when it has them (a native string does): through the UTF-8 view, the 25,000
        // digests of a 1 GiB pack's plan took 55 million instructions.
        let isUpper = { (byte: UInt8) in byte &- UInt8(ascii: "A") < 26 }
        let hasUpper = digest.utf8.withContiguousStorageIfAvailable { $0.contains(where: isUpper) } ?? digest.utf8.contains(where: isUpper)
        return hasUpper ? digest.lowercased() : digest
    }

    /// The most bytes a chunk of `size` bytes may be stored in: more than zstd or deflate ever make of it, so that a
    /// chunk is never read into memory larger than that.
    static func maxStoredLength(_ size: Int64) -> Int64 { size + size / 64 + (64 << 10) }

    /// The ranges that fetch the chunks `numbers` of `fetch`: chunks less than ``DeltaPlan/coalesceGap`` apart share one,
    /// and slices of one shared frame (which give the same bytes) are fetched once.
    static func coalesce(_ numbers: [Int], in fetch: [PackIndex.Chunk]) -> [Range] {
        Self.windows(numbers, in: fetch, window: .max)
    }

    /// The bytes of the pack that hold the chunks `numbers` of `fetch`: a shared frame counted once for its slices.
    static func storedLength(_ numbers: some Sequence<Int>, in fetch: [PackIndex.Chunk]) -> Int64 {
        var frames = Set<Int64>()
        return numbers.reduce(Int64(0)) { total, number in
            let chunk = fetch[number]
            guard chunk.storage != .zstdFrameSlice || frames.insert(chunk.offset).inserted else { return total }
            return total + chunk.length
        }
    }

    /// Whether a chunk's stored bytes lie inside a range already planned: a slice of a frame the range fetches.
    private static func within(_ chunk: PackIndex.Chunk, _ range: Range) -> Bool {
        chunk.storage == .zstdFrameSlice && chunk.offset >= range.start && chunk.offset + chunk.length <= range.end
    }

    /// The most bytes of the pack fetched by one range of a first install: the chunks a kill may lose (its range and
    /// the one being synced), and the granularity of the syncs of the new version's files.
    static func window(packLength: Int64) -> Int64 { min(16 << 20, max(1 << 20, packLength / 64)) }

    /// The ranges that fetch the chunks `numbers`, none longer than `window` (unless one chunk is).
    /// ``coalesce(_:in:)`` is this without a limit.
    static func windows(_ numbers: [Int], in fetch: [PackIndex.Chunk], window: Int64) -> [Range] {
        var windows: [Range] = []
        for number in numbers.sorted(by: { fetch[$0].offset < fetch[$1].offset }) {
            let chunk = fetch[number]
            // The last window is changed in place: a copy of it would copy its list of chunks at each append (25,000
            // times for a 1 GiB pack fetched whole, 25 ms of a first install's start).
            let last = windows.indices.last
            if let last, Self.within(chunk, windows[last]) {
                windows[last].chunks.append(number)
            } else if let last, chunk.offset >= windows[last].end, chunk.offset - windows[last].end <= DeltaPlan.coalesceGap,
                chunk.offset + chunk.length - windows[last].start <= window
            {
                windows[last].end = max(windows[last].end, chunk.offset + chunk.length)
                windows[last].chunks.append(number)
            } else {
                windows.append(Range(start: chunk.offset, end: chunk.offset + chunk.length, chunks: [number]))
            }
        }
        return windows
    }

}
