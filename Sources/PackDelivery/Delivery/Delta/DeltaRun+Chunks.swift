import CLinux
import Foundation
import Synchronization

// A chunked tar or tar.zst updated chunk by chunk (``ChunkPlan``, ``ChunkAssembly``).
extension DeltaRun {
    /// A chunked tar pack's update, chunk by chunk: each range fetched is split into its chunks, each decoded and
    /// checked against its SHA-256 and kept; a chunk that does not match is fetched once more, then the download fails
    /// naming a file that holds it.
    func run(_ plan: ChunkPlan) throws -> (TransferOutcome, DeltaTree?) {
        try self.prepareFolder()
        let assembly = ChunkAssembly(
            folder: self.folder, index: self.index, installed: self.installedRoot,
            writer: self.request.writer, isCancelled: { [transfer] in transfer.isStopped }, seeds: self.request.seeds)
        let exists = { (number: Int) in FileManager.default.fileExists(atPath: assembly.chunkFile(plan.fetch[number].sha256).path) }
        var missing = plan.fetch.indices.filter { !exists($0) }
        func partial(_ missing: [Int]) -> Int64 {
            ChunkPlan.coalesce(missing, in: plan.fetch).reduce(Int64(0)) {
                $0 + min(Self.size(self.rangeFile($1.start, $1.end)), $1.end - $1.start)
            }
        }
        let kept = ChunkPlan.storedLength(plan.fetch.indices.filter(exists), in: plan.fetch) + partial(missing)
        self.total = plan.bytesToFetch
        self.fetched = min(kept, self.total)
        self.onEvent(
            .deltaPlanned(
                id: self.request.id,
                delta: Download.Delta(
                    bytesToFetch: self.total, bytesReused: plan.bytesReused, entriesToFetch: plan.build.count,
                    filesReused: plan.reuse.count, bytesKept: kept, chunksFetched: plan.fetch.count,
                    chunksReused: plan.chunksReused + plan.chunksInFilesReused, bytesFetched: self.fetched)))
        try self.awaitGoAhead()
        self.report(self.fetched, force: true)
        var refetched = Set<Int>()
        while !missing.isEmpty {
            // Bytes of partial range files are counted in `fetched` already; each range adds what it fetches.
            self.fetched -= partial(missing)
            var bad: [Int] = []
            for range in ChunkPlan.coalesce(missing, in: plan.fetch) {
                try self.fetch(DeltaPlan.Range(start: range.start, end: range.end, entries: []))
                bad += try assembly.keep(range, chunks: plan.fetch, from: self.rangeFile(range.start, range.end))
                if !bad.isEmpty, let failure = self.wrongChunks(bad.count) { throw failure }
            }
            if let twice = bad.first(where: { refetched.contains($0) }) {
                let number = plan.build.first { $0.pieces.contains { $0.source == .fetched(twice) } }?.number
                let path = number.map { self.index.entries[$0].path } ?? ""
                throw PackDeliveryError(
                    .checksumMismatch,
                    message:
                        "A chunk of \(PackDeliveryError.printable(path)) in the pack \(self.request.download.contentIdentifier) does not match the SHA-256 its index gives, twice.",
                    hint: "Nothing was installed and the installed version is untouched; the pack on the server does not match its index.",
                    subject: path)
            }
            refetched.formUnion(bad)
            missing = bad
            // Fetched again: the progress total grows by what is fetched twice.
            self.total += ChunkPlan.storedLength(bad, in: plan.fetch)
        }
        if self.stopped { throw Stop() }
        let tree = try assembly.assemble(plan)
        return (.assembled(fetched: self.fetched), tree)
    }

    /// For a pack with several sources: the source in use served chunks that do not match the index. The chunks
    /// verified so far stay kept; the download marks the source bad and fetches the rest, these chunks first, from
    /// another. Nil for a pack with one source (the chunks are fetched once more from it).
    ///
    /// - Parameters:
    ///   - bytes: Where the chunk that did not match lies in the pack, when one is known.
    ///   - past: How many bytes after that chunk had been received (handed to the sink) when the transfer ended.
    func wrongChunks(_ count: Int, bytes: Range<Int64>? = nil, past: Int64? = nil) -> TransferFailure? {
        let download = self.request.download
        guard download.sources != nil else { return nil }
        var place = ""
        if let bytes {
            place = " (pack bytes \(bytes.lowerBound)..<\(bytes.upperBound)"
            if let past { place += "; \(past) bytes after it received, unused" }
            place += ")"
        }
        return TransferFailure(
            error: PackDeliveryError(
                .checksumMismatch,
                message:
                    "\(count == 1 ? "A chunk" : "\(count) chunks") of the pack \(download.contentIdentifier) from \(download.source)\(place) \(count == 1 ? "does" : "do") not match the SHA-256 its index gives.",
                hint: "The chunks already checked are kept; the rest comes from another source.", subject: download.source),
            retryable: true, countsAlways: true)
    }

    /// The pack formats whose first install writes each byte once.
    static let firstInstallContainers: Set<PackIndex.Container> = [.tar, .tarZstd]
}
