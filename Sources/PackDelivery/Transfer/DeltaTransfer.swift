import CLinux
import Foundation
import Synchronization

/// A delta update: builds the new version of an installed pack from the installed files that did not change and
/// the changed entries of the new pack, fetched with HTTP range requests through the transfer engine (so retries,
/// Retry-After, the stall watchdog and the checks of ``ResponseDecision`` apply to them as to any transfer).
///
/// It reports in the transfer engine's vocabulary (`TransferEvent`), so the download's machine treats it as one
/// more kind of transfer:
/// - `.deltaPlanned` first, with what it fetches and reuses;
/// - `.progress` with the bytes fetched so far (kept ones included);
/// - `.finished` with `.assembled` (the tree is in ``tree``), `.deltaRefused` (fetch the whole pack, and why),
///   `.stopped` or `.failed`.
///
/// Before anything else it reads the pack's central directory (its last bytes, with range requests) and
/// requires that the index describes the pack as the directory does, and that each installed file it reuses has
/// the CRC-32 the directory gives its entry: a delta installs the pack's bytes or nothing, so the same manifest
/// installs the same tree with or without it. Any disagreement is the publisher's, and the whole pack is fetched
/// instead (`indexUnusable`), which then installs or fails as it would have anyway.
///
/// Each range is fetched, one after another, into a file of its own in `downloads/<id>.delta/` (a range cut short
/// resumes where it stopped), then split into one small zip per entry by ``DeltaAssembly``, which checks each
/// entry with the unpacker's checks and against the index's SHA-256, and assembles the new version. An entry that
/// does not match is fetched once more, then the download fails naming it, and the installed version is untouched.
/// The ranges carry the validator of the first response: a pack that changed on the server is never mixed.
final class DeltaTransfer: Sendable {
    struct Request: Sendable {
        var id: TransferID
        var download: Download
        var index: Manifest.IndexReference
        /// The installed version; nil for a first install of a chunked tar or tar.zst pack, whose chunks are all
        /// fetched and written straight into the new version's files as they arrive (``ChunkSink``).
        var install: InstallRecord?
        var installedFiles: [InstalledFileRecord]
        /// `downloads/<id>.delta`.
        var folder: URL
        var options: TransferOptions
        var writer: any FileWriting
        var maxEntries: Int
        /// Where the ranges are fetched.
        var engine: TransferEngine
        /// The smallest window from which a first install's consecutive windows share one request (``joinedWindow``).
        var joinedWindow: Int64 = DeltaTransfer.joinedWindow
    }

    /// The windows from which consecutive windows of a first install share one request: windows of 4 MiB or more
    /// (``ChunkPlan/window(packLength:)`` of a pack of 256 MiB or more). One request has no round trip, no empty pipe
    /// and no wait for the sink to drain between windows (measured, case 10's tar.zst of 515 MiB in windows of 8 MiB:
    /// 1.27 s joined against 1.44 s a request a window), but the server may send the next windows' bytes into the
    /// socket's buffers (a few MiB) ahead of the sink, and a pause or a kill loses them: past windows of 4 MiB that is
    /// about a window. Smaller windows keep a request each, so that a pause loses at most the windows in flight.
    static let joinedWindow: Int64 = 4 << 20

    let request: Request
    private let stopped = Atomic<Bool>(false)
    /// The range request in flight, if any, and the number of the last one made.
    private let ranges = Mutex<(current: TransferID?, made: Int)>((nil, 0))
    private let done = DispatchSemaphore(value: 0)
    /// The tree built, once `.assembled` was reported.
    let tree = Mutex<DeltaTree?>(nil)

    init(_ request: Request) { self.request = request }

    /// Starts the update on a worker; events arrive in order.
    func start(onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        DispatchQueue.global().async { [self] in
            let outcome = DeltaRun(self, onEvent: onEvent).run()
            if case .assembled = outcome.0 { self.tree.withLock { $0 = outcome.1 } }
            onEvent(.finished(id: self.request.id, outcome: outcome.0))
            self.done.signal()
        }
    }

    /// Asks the update to stop; it reports `.stopped` (or its outcome, when it was ending anyway).
    func stop() {
        let current = self.ranges.withLock { ranges in
            self.stopped.store(true, ordering: .relaxed)
            return ranges.current
        }
        if let current { self.request.engine.stop(current) }
    }

    /// Stops and waits for the update to end (at close).
    func stopAndWait() {
        self.stop()
        self.done.wait()
        self.done.signal()
    }

    fileprivate var isStopped: Bool { self.stopped.load(ordering: .relaxed) }

    /// Fetches `bytes` of the pack into `file` (resuming from what it holds) through the engine, and waits.
    /// - Parameter progress: the bytes the file holds, as they arrive, and the response's validator.
    /// - Throws: `TransferFailure` as the engine reports it, or `DeltaRun.Stop`.
    /// - Parameter sink: takes the bytes instead of `file`, which is then not made.
    fileprivate func fetch(
        _ bytes: Range<Int64>, into file: URL, sink: (any TransferSink)? = nil, validator: String?,
        progress: @escaping @Sendable (Int64, String?) -> Void
    ) throws {
        let download = self.request.download
        try self.fetch(
            download.url, length: bytes.upperBound - bytes.lowerBound,
            range: ByteRange(bytes: bytes, fileLength: download.contentLength), into: file, sink: sink, validator: validator,
            progress: progress)
    }

    /// Fetches the pack's index (`length` bytes, the manifest says) into `file`, from its first byte, through the
    /// engine, and waits: the same transfer path as the pack and its ranges.
    /// - Throws: `TransferFailure` as the engine reports it, or `DeltaRun.Stop`.
    fileprivate func fetchIndex(_ url: URL, length: Int64, into file: URL) throws {
        unlink(file.path)
        try self.fetch(url, length: length, range: nil, into: file, validator: nil) { _, _ in }
    }

    /// One transfer through the engine (a range of the pack, or the whole index), as the delta's next part; waits.
    private func fetch(
        _ url: URL, length: Int64, range: ByteRange?, into file: URL, sink: (any TransferSink)? = nil, validator: String?,
        progress: @escaping @Sendable (Int64, String?) -> Void
    ) throws {
        let finished = Mutex<TransferOutcome?>(nil)
        let ended = DispatchSemaphore(value: 0)
        let id = self.ranges.withLock { ranges -> TransferID? in
            guard !self.isStopped else { return nil }
            ranges.made += 1
            ranges.current = TransferID(download: self.request.id.download, token: self.request.id.token, part: ranges.made)
            return ranges.current
        }
        guard let id else { throw DeltaRun.Stop() }
        self.request.engine.start(
            TransferRequest(
                id: id, url: url, file: file, expectedLength: length, validator: validator,
                fromZero: false, options: self.request.options, writer: self.request.writer, range: range,
                report: { event in
                    switch event {
                    case .progress(_, let bytes, let validator): progress(bytes, validator)
                    case .finished(_, let outcome):
                        finished.withLock { $0 = outcome }
                        ended.signal()
                    case .durable, .deltaPlanned: break
                    }
                }, sink: sink))
        ended.wait()
        self.ranges.withLock { $0.current = nil }
        switch finished.withLock({ $0 }) {
        case .completed?, .assembled?: return
        case .failed(let failure, _)?: throw failure
        case .stopped?, .deltaRefused?, nil: throw DeltaRun.Stop()
        }
    }
}

/// One run of a delta update, on its worker. Not Sendable: it lives there.
private final class DeltaRun {
    private let transfer: DeltaTransfer
    private let request: DeltaTransfer.Request
    private let onEvent: @Sendable (TransferEvent) -> Void
    private var index = PackIndex(entries: [])
    /// The pack's central directory.
    private var directory = ZipDirectories.Directory(entries: [], offset: 0, size: 0)
    /// Bytes fetched and kept before the range in flight, for progress; and the total to fetch.
    private var fetched: Int64 = 0
    private var total: Int64 = 0 {
        didSet { self.reporter.total.withLock { [total] in $0 = total } }
    }
    private let reporter: Reporter
    /// The ETag or Last-Modified of the first response, kept in the folder: every range must come with it.
    private var validator: String?

    init(_ transfer: DeltaTransfer, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        self.transfer = transfer
        self.request = transfer.request
        self.onEvent = onEvent
        self.reporter = Reporter(id: transfer.request.id, onEvent: onEvent)
    }

    struct Stop: Error {}

    /// The CRC-32 recorded for each installed file, by path (zip installs record them).
    private lazy var recordedCRCs: [String: UInt32] = Dictionary(
        self.request.installedFiles.compactMap { file in file.crc32.map { (file.path, $0) } }, uniquingKeysWith: { a, _ in a })

    private var folder: URL { self.request.folder }
    /// The installed version's folder (the delta's own folder for a first install, which reads nothing installed).
    private var installedRoot: URL { self.request.install.map { URL(filePath: $0.contentURL) } ?? self.request.folder }
    private var stopped: Bool { self.transfer.isStopped }

    private func assembly() -> DeltaAssembly {
        DeltaAssembly(
            folder: self.folder, index: self.index, directory: self.directory, installed: self.installedRoot,
            writer: self.request.writer, isCancelled: { [transfer] in transfer.isStopped })
    }

    /// The file a range is fetched into.
    private func rangeFile(_ range: DeltaPlan.Range) -> URL { self.rangeFile(range.start, range.end) }
    private func rangeFile(_ start: Int64, _ end: Int64) -> URL { self.folder.appending(path: "r\(start)-\(end).part") }

    func run() -> (TransferOutcome, DeltaTree?) {
        do {
            switch try self.plan() {
            case .entries(let plan): return try self.run(plan)
            case .chunks(let plan): return try self.run(plan)
            case .firstInstall(let plan): return try self.runFirstInstall(plan)
            }
        } catch let refusal as DeltaRefusal {
            return (.deltaRefused(refusal.fallback), nil)
        } catch is Stop {
            return (.stopped(bytesOnDisk: self.fetched), nil)
        } catch is DeltaAssembly.Stopped {
            return (.stopped(bytesOnDisk: self.fetched), nil)
        } catch let failure as TransferFailure {
            return (.failed(failure, bytesOnDisk: self.fetched), nil)
        } catch let error as PackDeliveryError {
            let retryable = [.network, .io, .insufficientStorage, .unauthorized].contains(error.kind)
            let hostile = error.code == .unsafeEntry || error.code == .checksumMismatch
            if hostile { try? Installer.removeTree(self.folder) }
            return (
                .failed(
                    TransferFailure(
                        error: error, retryable: retryable && !hostile, countsAlways: hostile || error.code == .tooSlow),
                    bytesOnDisk: self.fetched),
                nil
            )
        } catch {
            return (
                .failed(
                    TransferFailure(
                        error: PackDeliveryError(.internalError, message: "The delta update failed: \(error)."), retryable: false),
                    bytesOnDisk: self.fetched), nil
            )
        }
    }

    /// A zip pack's update, entry by entry.
    private func run(_ plan: DeltaPlan) throws -> (TransferOutcome, DeltaTree?) {
        do {
            try self.prepareFolder()
            let tail = try self.readDirectory()
            try DeltaPlan.check(self.index, against: self.directory)
            if let refusal = try DeltaPlan.reusedMismatch(
                plan, index: self.index, directory: self.directory, crcOfInstalled: self.installedCRC)
            {
                throw refusal
            }
            let assembly = self.assembly()
            var missing = plan.fetch.filter { !FileManager.default.fileExists(atPath: assembly.entryFile($0).path) }
            let kept =
                plan.fetch.filter { !missing.contains($0) }.reduce(Int64(0)) { $0 + self.index.entries[$1].length }
                + DeltaPlan.coalesce(missing, in: self.index).reduce(Int64(0)) {
                    $0 + min(Self.size(self.rangeFile($1)), $1.end - $1.start)
                }
            // The directory's bytes count as fetched: they were, in this attempt or an earlier one.
            self.total = plan.bytesToFetch + tail.bytes
            self.fetched = min(kept + tail.bytes, self.total)
            self.onEvent(
                .deltaPlanned(
                    id: self.request.id,
                    delta: Download.Delta(
                        bytesToFetch: self.total, bytesReused: plan.bytesReused, entriesToFetch: plan.fetch.count,
                        filesReused: plan.reuse.count, bytesKept: kept + (tail.kept ? tail.bytes : 0),
                        bytesFetched: self.fetched)))
            self.report(self.fetched, force: true)
            var refetched = Set<Int>()
            var verified: [Int: InstalledFile] = [:]
            while true {
                // Bytes of partial range files are counted in `fetched` already; each range adds what it fetches.
                self.fetched -= DeltaPlan.coalesce(missing, in: self.index).reduce(Int64(0)) {
                    $0 + min(Self.size(self.rangeFile($1)), $1.end - $1.start)
                }
                for range in DeltaPlan.coalesce(missing, in: self.index) {
                    try self.fetch(range)
                    try assembly.keep(range, from: self.rangeFile(range))
                }
                var bad: [Int] = []
                for number in plan.fetch where verified[number] == nil {
                    if self.stopped { throw Stop() }
                    if let file = try assembly.verify(number) { verified[number] = file } else { bad.append(number) }
                }
                if bad.isEmpty { break }
                if let twice = bad.first(where: { refetched.contains($0) }) {
                    let entry = self.index.entries[twice]
                    throw PackDeliveryError(
                        .checksumMismatch,
                        message:
                            "The entry \(PackDeliveryError.printable(entry.path)) of the pack \(self.request.download.contentIdentifier) does not match the SHA-256 its index gives, twice.",
                        hint:
                            "Nothing was installed and the installed version is untouched; the pack on the server does not match its index.",
                        subject: entry.path)
                }
                refetched.formUnion(bad)
                missing = bad
                // Fetched again: the progress total grows by what is fetched twice.
                self.total += bad.reduce(0) { $0 + self.index.entries[$1].length }
            }
            if self.stopped { throw Stop() }
            let tree = try assembly.assemble(plan, fetched: verified)
            return (.assembled(fetched: self.fetched), tree)
        }
    }

    /// A chunked tar pack's update, chunk by chunk: each range fetched is split into its chunks, each decoded and
    /// checked against its SHA-256 and kept; a chunk that does not match is fetched once more, then the download fails
    /// naming a file that holds it.
    private func run(_ plan: ChunkPlan) throws -> (TransferOutcome, DeltaTree?) {
        try self.prepareFolder()
        let assembly = ChunkAssembly(
            folder: self.folder, index: self.index, installed: self.installedRoot,
            writer: self.request.writer, isCancelled: { [transfer] in transfer.isStopped })
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
    private func wrongChunks(_ count: Int, bytes: Range<Int64>? = nil, past: Int64? = nil) -> TransferFailure? {
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

    /// A first install of a chunked tar or tar.zst pack, writing each byte once: the chunks are fetched in ranges of
    /// at most ``ChunkPlan/window(packLength:)`` bytes, each range's body going straight into a ``ChunkSink`` (no range
    /// file), which decodes each chunk, checks it against its SHA-256 and writes it into the new version's files; each
    /// range's chunks are recorded once synced, on a worker, while the next range downloads. A resume fetches only the
    /// chunks not recorded. A chunk that does not match is fetched once more, then the download fails naming a file
    /// that holds it. Progress counts against the pack's length, as a whole-pack fetch does (no `.deltaPlanned`: it is
    /// not an update).
    private func runFirstInstall(_ plan: ChunkPlan) throws -> (TransferOutcome, DeltaTree?) {
        // The plan holds the chunks: the index's own arrays of them are let go (1.2 MB for a 1 GiB pack), and the
        // memory the index's decoding left free in the heap is given back, so that the install's peak RSS is not the
        // decoding's and its own added up.
        for number in self.index.entries.indices { self.index.entries[number].chunks = nil }
        _ = clinux_malloc_trim(0)
        try self.prepareFolder()
        let assembly = ChunkAssembly(
            folder: self.folder, index: self.index, installed: self.installedRoot, writer: self.request.writer,
            isCancelled: { [transfer] in transfer.isStopped })
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
        // The bytes between chunks (tar headers) are fetched with them: the total is what the ranges fetch.
        self.total = max(self.request.download.contentLength, plan.bytesToFetch)
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
        let tree = try assembly.finish(plan)
        return (.assembled(fetched: self.fetched), tree)
    }

    // MARK: Plan

    /// What an update fetches: a zip's entries, or a chunked tar's chunks.
    enum Plan {
        case entries(DeltaPlan)
        case chunks(ChunkPlan)
        /// A first install: every chunk fetched, none reused.
        case firstInstall(ChunkPlan)
    }

    private func plan() throws -> Plan {
        let download = self.request.download
        guard let indexURL = URL(string: self.request.index.url), !download.url.isFileURL else {
            throw DeltaRefusal(.notServedOverHTTP, "the pack is not served over http(s)")
        }
        if let install = self.request.install, install.fileCount < 0 {
            throw DeltaRefusal(.installedFilesChanged, "the installed version has no record of its files")
        }
        var installed = self.request.installedFiles
        var damaged = self.request.install.map { DownloadQueue.damagedFiles($0, files: installed, modifiedSinceInstall: true) } ?? []
        if self.request.install?.contentVersion == download.contentVersion {
            // A repair: damaged files are what it fetches, not a reason to fetch everything. The damage may not show
            // in a file's size or time, so every other file is hashed, as verify does.
            let broken = Set(damaged + (try self.changedContent(excluding: Set(damaged))))
            installed.removeAll { broken.contains($0.path) }
            damaged = []
        }
        // The manifest's length is between 0 and 2^50 (checked when it was read); the fetch stops one byte past it.
        guard self.request.index.length <= PackIndex.maxBytes else {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index is \(self.request.index.length) bytes, more than the \(PackIndex.maxBytes) an index may have")
        }
        // Beside the pack's other downloads (a file per attempt, as for a whole pack's index), removed once read.
        let file = self.request.folder.deletingLastPathComponent().appending(path: "\(download.id).t\(self.request.id.token).index")
        defer { unlink(file.path) }
        let data: Data
        do {
            try self.transfer.fetchIndex(indexURL, length: self.request.index.length, into: file)
            guard let read = try? Data(contentsOf: file) else {
                throw PackDeliveryError.io("read the fetched index", path: file.path, errno: EIO)
            }
            data = read
        } catch let failure as TransferFailure {
            let error = failure.error
            if error.kind == .network || error.code == .unauthorized || error.kind == .badData {
                throw DeltaRefusal(.indexUnusable, "the pack's index could not be fetched (\(error.message))")
            }
            throw failure
        }
        let hasher = SHA256Hasher()
        data.withUnsafeBytes { hasher.update($0) }
        guard Int64(data.count) == self.request.index.length, hasher.hexDigest() == self.request.index.sha256.lowercased() else {
            throw DeltaRefusal(.indexUnusable, "the pack's index does not match the SHA-256 and length the manifest gives")
        }
        let index = try PackIndex.decode(consume data, maxEntries: self.request.maxEntries, containers: ChunkPlan.containers.union([.zip]))
        self.index = index
        guard index.container != .zip else {
            return .entries(
                try DeltaPlan.make(
                    index: index, packLength: download.contentLength, unpackedLength: download.unpackedLength,
                    installed: installed, damaged: damaged
                ).get())
        }
        // A tar has no directory to check the index against: the index must at least name this very pack.
        guard let pack = index.pack, pack.length == download.contentLength, pack.sha256.lowercased() == download.sha256.lowercased()
        else { throw DeltaRefusal(.indexUnusable, "the pack's index describes another pack than the manifest's (its length or SHA-256)") }
        if self.request.install == nil {
            guard Self.firstInstallContainers.contains(index.container) else {
                throw DeltaRefusal(.indexUnusable, "the pack is a \(index.container.rawValue), whose first install fetches the whole pack")
            }
            return .firstInstall(
                try ChunkPlan.make(
                    index: index, packLength: download.contentLength, unpackedLength: download.unpackedLength, installed: [],
                    damaged: [], local: [:], wholePack: true
                ).get())
        }
        if let first = damaged.first {
            throw DeltaRefusal(
                .installedFilesChanged,
                "the installed file \(PackDeliveryError.printable(first)) does not verify (\(damaged.count) file\(damaged.count == 1 ? "" : "s") changed since the install)"
            )
        }
        var local: [String: ChunkPlan.LocalChunk] = [:]
        // The installed files are cut as the new version's files were (the index's sizes and level, not this
        // version's defaults), so that the chunks they share have the same boundaries.
        if let chunker = index.chunking?.chunker {
            local = try ChunkAssembly.inventory(
                of: ChunkPlan.seeds(index: index, installed: installed, all: self.request.installedFiles),
                root: self.installedRoot, chunker: chunker,
                wanted: ChunkPlan.wantedChunks(index: index, installed: installed), isCancelled: { [transfer] in transfer.isStopped })
        }
        return .chunks(
            try ChunkPlan.make(
                index: index, packLength: download.contentLength, unpackedLength: download.unpackedLength, installed: installed,
                damaged: [], local: local
            ).get())
    }

    /// The installed files (not in `excluding`) whose SHA-256 is no longer the one recorded at install.
    private func changedContent(excluding: Set<String>) throws -> [String] {
        let root = self.installedRoot
        var changed: [String] = []
        for file in self.request.installedFiles where file.kind == .file && !excluding.contains(file.path) {
            if self.stopped { throw Stop() }
            if (try? SHA256Hasher.hexDigest(ofFile: root.appending(path: file.path))) != file.sha256.lowercased() {
                changed.append(file.path)
            }
        }
        return changed
    }

    /// Keeps the entries of an earlier attempt only when they came from the same index (the same new version).
    private func prepareFolder() throws(PackDeliveryError) {
        let marker = self.folder.appending(path: "index.sha256")
        let wanted = self.request.index.sha256.lowercased()
        if (try? String(contentsOf: marker, encoding: .utf8)) != wanted {
            try Installer.removeTree(self.folder)
        }
        try Home.makeDirectories(self.folder)
        if !FileManager.default.fileExists(atPath: marker.path) {
            try DeltaAssembly.writeDurably(Data(wanted.utf8), to: marker)
            try Durability.syncFolder(self.folder)
        }
        self.validator = try? String(contentsOf: self.validatorFile, encoding: .utf8)
    }

    /// Where the validator of the ranges' responses is kept: one per source, since mirrors give their own ETags (the
    /// index's chunk hashes decide across sources).
    private var validatorFile: URL {
        let download = self.request.download
        guard download.sources != nil else { return self.folder.appending(path: "validator") }
        let hasher = SHA256Hasher()
        Data(download.url.absoluteString.utf8).withUnsafeBytes { hasher.update($0) }
        return self.folder.appending(path: "validator-" + hasher.hexDigest().prefix(16))
    }

    /// The most of the pack's end that is read for its central directory: the directory, its end record and ZIP64 records.
    static let maxTail = Int64(ZipDirectories.maxDirectory) + (128 << 10)

    /// Reads the pack's central directory into ``directory``: from `directory` in the delta folder (the pack's last
    /// bytes, kept from an earlier attempt), else with range requests, then kept there. The first request asks for
    /// the bytes after the index's last entry, where the directory lies if the index describes the pack; what the
    /// directory needs before them is asked for next.
    /// - Returns: how many of the pack's last bytes it took, and whether they were kept from an earlier attempt.
    private func readDirectory() throws -> (bytes: Int64, kept: Bool) {
        let length = self.request.download.contentLength
        let file = self.folder.appending(path: "directory")
        var tail = (try? Data(contentsOf: file)).map { [UInt8]($0) } ?? []
        let kept = !tail.isEmpty && Int64(tail.count) <= min(length, Self.maxTail)
        if !kept {
            tail = []
            if length >= 22 {
                // Offsets and lengths are at most 2^50 each (checked when the index was decoded): their sums fit.
                let after = self.index.entries.map { $0.offset + $0.length }.max() ?? 0
                tail = try self.fetchBytes(max(0, length - Self.maxTail, min(after, length - 22))..<length)
            }
        }
        var grown = false
        while true {
            let start = length - Int64(tail.count)
            var wanted: Int64?
            let directory = ZipDirectories.directory(size: length) { offset, count -> [UInt8]? in
                guard offset >= 0, count >= 0, offset <= length - Int64(count), length - offset <= Self.maxTail else { return nil }
                if offset < start {
                    wanted = offset
                    return nil
                }
                let from = Int(offset - start)
                return Array(tail[from..<(from + count)])
            }
            if let directory {
                self.directory = directory
                break
            }
            // The directory needs bytes before those read: read them once, then ask again.
            guard let wanted, !grown else { throw DeltaRefusal(.indexUnusable, "the pack's central directory cannot be read") }
            tail = try self.fetchBytes(wanted..<start) + tail
            grown = true
        }
        if !kept || grown {
            try DeltaAssembly.writeDurably(Data(tail), to: file)
            try Durability.syncFolder(self.folder)
        }
        return (Int64(tail.count), kept && !grown)
    }

    /// The CRC-32 of an installed file, by its path in the installed version: as recorded at install (the file is
    /// as installed: its size and time were checked, and a repair hashed it), else read from the file.
    private func installedCRC(_ path: String) throws -> UInt32? {
        if let recorded = self.recordedCRCs[path] { return recorded }
        let file = self.installedRoot.appending(path: path).path
        let result: (crc: UInt32, count: Int64)?
        do { result = try CRC32.ofFile(file, isCancelled: { [transfer] in transfer.isStopped }) } catch {
            throw DeltaRefusal(.installedFilesChanged, "the installed file \(PackDeliveryError.printable(path)) cannot be read")
        }
        guard let result else { throw Stop() }
        return result.crc
    }

    // MARK: Fetch

    /// The size of a file; 0 when there is none.
    static func size(_ file: URL) -> Int64 {
        var info = stat()
        return stat(file.path, &info) == 0 ? Int64(info.st_size) : 0
    }

    /// Fetches a range into its file (unless an earlier attempt fetched it whole), counting its bytes as they come.
    private func fetch(_ range: DeltaPlan.Range) throws {
        let file = self.rangeFile(range)
        let base = self.fetched
        let length = range.end - range.start
        if Self.size(file) != length {
            let reporter = self.reporter
            try self.fetch(range.start..<range.end, into: file) { bytes in reporter.report(base + bytes, force: false) }
        }
        self.fetched = base + length
        self.report(self.fetched, force: true)
    }

    /// Fetches a first install's request (consecutive windows) into its sink, counting its bytes as they come (and those
    /// the sink took, so that the error of a chunk that does not match says how many bytes past it were received).
    private func fetch(_ request: [ChunkPlan.Range], into sink: ChunkSink, chunks: [PackIndex.Chunk]) throws {
        let base = self.fetched
        let reporter = self.reporter
        let feed = SinkFeed(sink)
        let (start, end) = (request[0].start, request[request.count - 1].end)
        do {
            try self.fetch(start..<end, into: self.rangeFile(start, end), sink: feed) { bytes in
                reporter.report(base + bytes, force: false)
            }
        } catch {
            sink.drain()
            throw self.sinkFailure(sink, received: start + feed.accepted, chunks: chunks) ?? error
        }
        sink.drain()
        if let error = self.sinkFailure(sink, received: start + feed.accepted, chunks: chunks) { throw error }
        self.fetched = base + end - start
        self.report(self.fetched, force: true)
    }

    /// The requests of a first install: consecutive windows (at most ``DeltaPlan/coalesceGap`` apart, as a first
    /// install's are) share one request when `joined`; otherwise each window is a request of its own.
    static func requests(_ windows: [ChunkPlan.Range], joined: Bool) -> [[ChunkPlan.Range]] {
        var requests: [[ChunkPlan.Range]] = []
        for window in windows {
            if joined, let last = requests.last?.last, window.start >= last.end, window.start - last.end <= DeltaPlan.coalesceGap {
                requests[requests.count - 1].append(window)
            } else {
                requests.append([window])
            }
        }
        return requests
    }

    /// Why the sink ended its range, if it did: for a chunk that did not match (several sources), the error says which
    /// bytes of the pack the chunk holds and how many bytes past its end the sink had taken when the transfer ended.
    private func sinkFailure(_ sink: ChunkSink, received: Int64, chunks: [PackIndex.Chunk]) -> (any Error)? {
        guard let error = sink.error else { return nil }
        guard (error as? TransferFailure)?.error.code == .checksumMismatch, let number = sink.bad.last else { return error }
        let chunk = chunks[number]
        let end = chunk.offset + chunk.length
        return self.wrongChunks(1, bytes: chunk.offset..<end, past: max(0, received - end)) ?? error
    }

    /// One range request through the engine. The first response's validator is kept, so that every later range (in
    /// this attempt or a later one) must come from the same version of the pack.
    private func fetch(
        _ bytes: Range<Int64>, into file: URL, sink: (any TransferSink)? = nil, progress: @escaping @Sendable (Int64) -> Void
    ) throws {
        let seen = Mutex<String?>(nil)
        do {
            try self.transfer.fetch(bytes, into: file, sink: sink, validator: self.validator) { bytes, validator in
                if let validator { seen.withLock { $0 = validator } }
                progress(bytes)
            }
        } catch let failure as TransferFailure {
            switch failure.rangeProblem {
            case .ignored?:
                throw DeltaRefusal(.rangesNotSupported, "the server does not answer range requests (\(failure.error.message))")
            case .fileChanged?:
                // The pack changed on the server since the kept entries were fetched: never mix two versions.
                try? Installer.removeTree(self.folder)
                throw TransferFailure(
                    error: PackDeliveryError(
                        .networkFailure,
                        message:
                            "The pack \(self.request.download.contentIdentifier) changed on the server during its delta update (its ETag or Last-Modified changed).",
                        hint: "The update starts again from the pack's index.", subject: self.request.download.url.redacted),
                    retryable: true, countsAlways: true)
            case nil:
                throw failure
            }
        }
        if self.validator == nil, let validator = seen.withLock({ $0 }) {
            self.validator = validator
            try DeltaAssembly.writeDurably(Data(validator.utf8), to: self.validatorFile)
        }
    }

    /// Fetches bytes of the pack into memory, through a file of the delta's folder.
    private func fetchBytes(_ bytes: Range<Int64>) throws -> [UInt8] {
        guard !bytes.isEmpty else { return [] }
        let file = self.folder.appending(path: "bytes.part")
        unlink(file.path)
        defer { unlink(file.path) }
        try self.fetch(bytes, into: file) { _ in }
        guard let data = try? Data(contentsOf: file), data.count == bytes.count else {
            throw PackDeliveryError.io("read the fetched bytes", path: file.path, errno: EIO)
        }
        return [UInt8](data)
    }

    private func report(_ bytes: Int64, force: Bool) { self.reporter.report(bytes, force: force) }
}

/// Hands a first install's range to its ``ChunkSink`` and counts the bytes the sink took.
///
/// It does not hold the transfer back further than the sink does (``ChunkSink/checksInFlight`` checks): measured with
/// case 16b (RESULTS.md), waiting for each write's check before taking the next changed neither the client's nor the
/// server's count past a bad chunk (the server had written the rest of the 1 MiB range to the socket by then).
private final class SinkFeed: TransferSink {
    let sink: ChunkSink
    private let taken = Atomic<Int64>(0)

    init(_ sink: ChunkSink) { self.sink = sink }

    /// The bytes the sink took so far.
    var accepted: Int64 { self.taken.load(ordering: .acquiring) }

    func consume(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard self.sink.consume(bytes) else { return false }
        self.taken.add(Int64(bytes.count), ordering: .releasing)
        return true
    }
}

/// Reports a delta's progress, about ten times a second, from the worker and the transfer thread.
private final class Reporter: Sendable {
    let id: TransferID
    let onEvent: @Sendable (TransferEvent) -> Void
    let total = Mutex<Int64>(0)
    private let last = Mutex<Date>(.distantPast)

    init(id: TransferID, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        self.id = id
        self.onEvent = onEvent
    }

    func report(_ bytes: Int64, force: Bool) {
        let send = self.last.withLock { last -> Bool in
            let now = Date()
            guard force || now.timeIntervalSince(last) >= 0.1 else { return false }
            last = now
            return true
        }
        if send { self.onEvent(.progress(id: self.id, bytesOnDisk: min(bytes, self.total.withLock { $0 }), validator: nil)) }
    }
}
