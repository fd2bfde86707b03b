import CLinux
import Foundation
import Synchronization

/// One run of a delta update, on its worker. Not Sendable: it lives there.
final class DeltaRun {
    let transfer: DeltaTransfer
    let request: DeltaTransfer.Request
    let onEvent: @Sendable (TransferEvent) -> Void
    var index = PackIndex(entries: [])
    /// The pack's central directory.
    var directory = ZipDirectories.Directory(entries: [], offset: 0, size: 0)
    /// Bytes fetched and kept before the range in flight, for progress; and the total to fetch.
    var fetched: Int64 = 0
    var total: Int64 = 0 {
        didSet { self.reporter.total.withLock { [total] in $0 = total } }
    }
    let reporter: Reporter
    /// The ETag or Last-Modified of the first response, kept in the folder: every range must come with it.
    var validator: String?

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

    var folder: URL { self.request.folder }
    /// The installed version's folder (the delta's own folder for a first install, which reads nothing installed).
    var installedRoot: URL { self.request.install.map { URL(filePath: $0.contentURL) } ?? self.request.folder }
    var stopped: Bool { self.transfer.isStopped }

    func assembly() -> DeltaAssembly {
        DeltaAssembly(
            folder: self.folder, index: self.index, directory: self.directory, installed: self.installedRoot,
            writer: self.request.writer, isCancelled: { [transfer] in transfer.isStopped })
    }

    /// The file a range is fetched into.
    func rangeFile(_ range: DeltaPlan.Range) -> URL { self.rangeFile(range.start, range.end) }
    func rangeFile(_ start: Int64, _ end: Int64) -> URL { self.folder.appending(path: "r\(start)-\(end).part") }

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

    // MARK: Plan

    /// What an update fetches: a zip's entries, or a chunked tar's chunks.
    enum Plan {
        case entries(DeltaPlan)
        case chunks(ChunkPlan)
        /// A first install: every chunk fetched, none reused.
        case firstInstall(ChunkPlan)
    }

    func plan() throws -> Plan {
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
        let index = try self.fetchIndex(indexURL)
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
                    damaged: [], local: try self.localChunks(index: index, installed: nil)
                ).get())
        }
        if let first = damaged.first {
            throw DeltaRefusal(
                .installedFilesChanged,
                "the installed file \(PackDeliveryError.printable(first)) does not verify (\(damaged.count) file\(damaged.count == 1 ? "" : "s") changed since the install)"
            )
        }
        return .chunks(
            try ChunkPlan.make(
                index: index, packLength: download.contentLength, unpackedLength: download.unpackedLength, installed: installed,
                damaged: [], local: try self.localChunks(index: index, installed: installed)
            ).get())
    }

    /// The chunks of `index` found on this machine: in the installed version's files (`installed`, those that may be
    /// reused whole; nil for a first install), then in the seed folders' (``SeedFolders``). Every file is cut as the
    /// new version's files were (the index's sizes and level, not this version's defaults), so that the chunks they
    /// share have the same boundaries. A seed folder that cannot be read is dropped (``DeltaTransfer/Request/onSeedDropped``).
    func localChunks(index: PackIndex, installed: [InstalledFileRecord]?) throws -> [String: ChunkPlan.LocalChunk] {
        guard let chunker = index.chunking?.chunker else { return [:] }
        var folders: [ChunkAssembly.Candidates] = []
        if let installed {
            let files = ChunkPlan.seeds(index: index, installed: installed, all: self.request.installedFiles)
            folders.append(ChunkAssembly.Candidates(root: self.installedRoot, files: files.map(\.path), seed: nil))
        }
        for (number, seed) in self.request.seeds.enumerated() {
            if self.stopped { throw Stop() }
            do {
                let files = try SeedFolders.files(in: seed, index: index, limit: self.request.maxEntries)
                folders.append(ChunkAssembly.Candidates(root: seed, files: files, seed: number))
            } catch {
                self.request.onSeedDropped(seed, SeedFolders.dropped(seed, errno: error.errno))
            }
        }
        guard !folders.isEmpty else { return [:] }
        return try ChunkAssembly.inventory(
            of: folders, chunker: chunker, wanted: ChunkPlan.wantedChunks(index: index, installed: installed ?? []),
            isCancelled: { [transfer] in transfer.isStopped },
            dropped: { number, error in
                self.request.onSeedDropped(self.request.seeds[number], SeedFolders.dropped(self.request.seeds[number], errno: error))
            })
    }

    /// The pack's index, fetched beside the pack's other downloads and held to the length and SHA-256 the manifest
    /// gives. A network failure or a mismatch refuses the update (`indexUnusable`): the whole pack is fetched instead.
    func fetchIndex(_ indexURL: URL) throws -> PackIndex {
        let download = self.request.download
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
            guard
                let read = try SmallFile.read(
                    file.path, limit: Int(self.request.index.length), tooLarge: { .io("read the fetched index", path: $0, errno: EFBIG) })
            else { throw PackDeliveryError.io("read the fetched index", path: file.path, errno: ENOENT) }
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
        return index
    }

    /// The installed files (not in `excluding`) whose SHA-256 is no longer the one recorded at install.
    func changedContent(excluding: Set<String>) throws -> [String] {
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
    /// Waits for the queue's answer to the plan just reported: a refusal (too much of the pack changed, say) ends the
    /// update with its folder removed, and the whole pack is fetched instead. The rule is the machine's
    /// (``DeliveryPlan/refusal(of:packLength:)``), not the update's.
    func awaitGoAhead() throws {
        do {
            try self.transfer.awaitAnswer()
        } catch let refusal as DeltaRefusal {
            try? Installer.removeTree(self.folder)
            throw refusal
        }
    }

    func prepareFolder() throws(PackDeliveryError) {
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
    var validatorFile: URL {
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
    func readDirectory() throws -> (bytes: Int64, kept: Bool) {
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
    func installedCRC(_ path: String) throws -> UInt32? {
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
    func fetch(_ range: DeltaPlan.Range) throws {
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
    func fetch(_ request: [ChunkPlan.Range], into sink: ChunkSink, chunks: [PackIndex.Chunk]) throws {
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
    func sinkFailure(_ sink: ChunkSink, received: Int64, chunks: [PackIndex.Chunk]) -> (any Error)? {
        guard let error = sink.error else { return nil }
        guard (error as? TransferFailure)?.error.code == .checksumMismatch, let number = sink.bad.last else { return error }
        let chunk = chunks[number]
        let end = chunk.offset + chunk.length
        return self.wrongChunks(1, bytes: chunk.offset..<end, past: max(0, received - end)) ?? error
    }

    /// One range request through the engine. The first response's validator is kept, so that every later range (in
    /// this attempt or a later one) must come from the same version of the pack.
    func fetch(
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
    func fetchBytes(_ bytes: Range<Int64>) throws -> [UInt8] {
        guard !bytes.isEmpty else { return [] }
        let file = self.folder.appending(path: "bytes.part")
        unlink(file.path)
        defer { unlink(file.path) }
        try self.fetch(bytes, into: file) { _ in }
        let count = Int(bytes.count)
        guard let data = try SmallFile.read(file.path, limit: count, tooLarge: { .io("read the fetched bytes", path: $0, errno: EFBIG) }),
            data.count == count
        else { throw PackDeliveryError.io("read the fetched bytes", path: file.path, errno: EIO) }
        return [UInt8](data)
    }

    func report(_ bytes: Int64, force: Bool) { self.reporter.report(bytes, force: force) }
}
