import CLinux
import Foundation
import Synchronization

// The first install of an indexed tar or tar.zst: every chunk fetched once and written once into the new
// version's files (``ChunkAssembly+FirstInstall``, ``ChunkSink``), no archive kept.
extension DeltaRun {
    /// A first install of a chunked tar or tar.zst pack, writing each byte once: the chunks are fetched in ranges of
    /// at most ``ChunkPlan/window(packLength:)`` bytes, each range's body going straight into a ``ChunkSink`` (no range
    /// file), which decodes each chunk, checks it against its SHA-256 and writes it into the new version's files; each
    /// range's chunks are recorded once synced, on a worker, while the next range downloads. A resume fetches only the
    /// chunks not recorded. A chunk that does not match is fetched once more, then the download fails naming a file
    /// that holds it. Progress counts against the pack's length, as a whole-pack fetch does (no `.deltaPlanned`: it is
    /// not an update).
    func runFirstInstall(_ plan: ChunkPlan) throws -> (TransferOutcome, DeltaTree?) {
        // The plan holds the chunks: the index's own arrays of them are let go (1.2 MB for a 1 GiB pack), and the
        // memory the index's decoding left free in the heap is given back, so that the install's peak RSS is not the
        // decoding's and its own added up.
        for number in self.index.entries.indices { self.index.entries[number].chunks = nil }
        _ = clinux_malloc_trim(0)
        try self.prepareFolder()
        let assembly = ChunkAssembly(
            folder: self.folder, index: self.index, installed: self.installedRoot, writer: self.request.writer,
            isCancelled: { [transfer] in transfer.isStopped }, seeds: self.request.seeds)
        let destinations = ChunkAssembly.destinations(plan)
        let verified = try assembly.prepareTree(plan, destinations: destinations)
        // With several sources, windows of 1 MiB: a source that serves wrong bytes is caught within two windows of the
        // bad one (a window is checked while the next downloads), and one that dies leaves at most a window in flight.
        let window =
            self.request.download.sources == nil
            ? ChunkPlan.window(packLength: self.request.download.contentLength)
            : min(1 << 20, ChunkPlan.window(packLength: self.request.download.contentLength))
        var missing = plan.fetch.indices.filter { !verified.contains($0) }
        let kept = ChunkPlan.storedLength(verified, in: plan.fetch)
        // The bytes between chunks (tar headers) are fetched with them: the total is what the ranges fetch (the whole
        // pack, unless chunks come from seed folders).
        self.total = plan.chunksReused > 0 ? plan.bytesToFetch : max(self.request.download.contentLength, plan.bytesToFetch)
        self.fetched = min(kept, self.total)
        self.report(self.fetched, force: true)
        var refetched = Set<Int>()
        let state = FirstInstallState()
        let committer = SinkCommitter(assembly)
        // Never return while a batch is being committed: a cancel removes the tree right after.
        defer { committer.waitQuietly() }
        // One request for consecutive windows (with one source, and windows of ``DeltaTransfer/joinedWindow``).
        let joined = self.request.download.sources == nil && window >= self.request.joinedWindow
        while !missing.isEmpty {
            var bad: [Int] = []
            for request in Self.requests(ChunkPlan.windows(missing, in: plan.fetch, window: window), joined: joined) {
                // With several sources, the first chunk that does not match ends the range: the rest comes from another.
                let sink = ChunkSink(
                    request, assembly: assembly, chunks: plan.fetch, destinations: destinations, state: state,
                    committer: committer, endAtFirstBad: self.wrongChunks(1))
                do {
                    try self.fetch(request, into: sink, chunks: plan.fetch)
                } catch {
                    // What was checked and written before the end still counts: a resume does not fetch it again.
                    sink.handOverRest()
                    if sink.error != nil {
                        try? committer.wait()
                        throw error
                    }
                    try committer.wait()
                    throw error
                }
                // The next request downloads while this one's last window is synced and recorded.
                sink.handOverRest()
                bad += sink.bad
            }
            try committer.wait()
            if let twice = bad.first(where: { refetched.contains($0) }) {
                let number = destinations.first(twice)?.entry
                let path = number.map { self.index.entries[$0].path } ?? ""
                throw PackDeliveryError(
                    .checksumMismatch,
                    message:
                        "A chunk of \(PackDeliveryError.printable(path)) in the pack \(self.request.download.contentIdentifier) does not match the SHA-256 its index gives, twice.",
                    hint: "Nothing was installed; the pack on the server does not match its index.", subject: path)
            }
            refetched.formUnion(bad)
            missing = bad
            self.total += ChunkPlan.storedLength(bad, in: plan.fetch)
        }
        if self.stopped { throw Stop() }
        if plan.chunksReused > 0 { try assembly.writeSeeded(plan) }
        let tree = try assembly.finish(plan)
        return (.assembled(fetched: self.fetched), tree)
    }
}
