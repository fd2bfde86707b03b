import CCurl
import CLinux
import Foundation
import Synchronization

/// The new version built by a delta update, ready to be moved into place as an unpacked pack is.
struct DeltaTree: Sendable {
    var folder: URL
    var summary: UnpackSummary
}

/// A delta update: builds the new version of an installed pack from the installed files that did
/// not change and the changed entries of the new pack, fetched with HTTP range requests on one connection.
///
/// It runs on a thread of its own and reports in the transfer engine's vocabulary (`TransferEvent`), so the
/// download's machine treats it as one more kind of transfer:
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
/// Entries fetched are kept in `downloads/<id>.delta/` (each made durable once complete), with the directory,
/// so a pause, a kill or a failed attempt fetches again only the entry that was in flight. Each entry's local
/// header must match the directory; it is unpacked with the unpacker's checks and compared with the index's
/// SHA-256 before it is used; one that does not match is fetched once more, then the download fails naming it,
/// and the installed version is untouched.
final class DeltaTransfer: Sendable {
    struct Request: Sendable {
        /// The transfer id, `<download>#<token>`.
        var id: TransferID
        var download: Download
        var index: Manifest.IndexReference
        var install: InstallRecord
        var installedFiles: [InstalledFileRecord]
        /// `downloads/<id>.delta`.
        var folder: URL
        var options: TransferOptions
        var writer: any FileWriting
        var maxEntries: Int
    }

    let request: Request
    private let stopped = Atomic<Bool>(false)
    private let done = DispatchSemaphore(value: 0)
    /// The tree built, once `.assembled` was reported.
    let tree = Mutex<DeltaTree?>(nil)

    init(_ request: Request) { self.request = request }

    /// Starts the thread; events arrive on it, in order.
    func start(onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        let thread = Thread { [self] in
            let outcome = DeltaRun(self.request, stopped: { self.stopped.load(ordering: .relaxed) }, onEvent: onEvent).run()
            if case .assembled = outcome.0 { self.tree.withLock { $0 = outcome.1 } }
            onEvent(.finished(id: self.request.id, outcome: outcome.0))
            self.done.signal()
        }
        thread.name = "PackDelivery.delta"
        thread.start()
    }

    /// Asks the transfer to stop; it reports `.stopped` (or its outcome, when it was ending anyway).
    func stop() { self.stopped.store(true, ordering: .relaxed) }

    /// Stops and waits for the thread to end (at close).
    func stopAndWait() {
        self.stop()
        self.done.wait()
        self.done.signal()
    }
}

/// One run of a delta transfer, on its thread. Not Sendable: it lives there.
private final class DeltaRun {
    private let request: DeltaTransfer.Request
    private let stopped: () -> Bool
    private let onEvent: @Sendable (TransferEvent) -> Void
    private var index = PackIndex(entries: [])
    /// The pack's central directory.
    private var directory = ZipDirectories.Directory(entries: [], offset: 0, size: 0)
    /// The connection that every range is fetched on, and what receives its bytes.
    private var connection: (easy: CurlEasy, sink: RangeSink)?
    /// Bytes fetched and kept, for progress.
    private var fetched: Int64 = 0
    private var total: Int64 = 0
    private var lastReport = Date.distantPast
    private var validator: String?

    init(_ request: DeltaTransfer.Request, stopped: @escaping () -> Bool, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        self.request = request
        self.stopped = stopped
        self.onEvent = onEvent
    }

    private var folder: URL { self.request.folder }
    private func entryFile(_ number: Int) -> URL { self.folder.appending(path: "e\(number).zip") }

    func run() -> (TransferOutcome, DeltaTree?) {
        do {
            let plan = try self.plan()
            try self.prepareFolder()
            let tail = try self.readDirectory()
            try DeltaPlan.check(self.index, against: self.directory)
            if let refusal = try DeltaPlan.reusedMismatch(
                plan, index: self.index, directory: self.directory, crcOfInstalled: self.installedCRC)
            {
                throw refusal
            }
            var missing = plan.fetch.filter { !FileManager.default.fileExists(atPath: self.entryFile($0).path) }
            let kept = plan.fetch.filter { !missing.contains($0) }.reduce(Int64(0)) { $0 + self.index.entries[$1].length }
            // The directory's bytes count as fetched: they were, in this attempt or an earlier one.
            self.total = plan.bytesToFetch + tail.bytes
            self.fetched = min(kept + tail.bytes, self.total)
            self.onEvent(
                .deltaPlanned(
                    id: self.request.id,
                    delta: Download.Delta(
                        bytesToFetch: self.total, bytesReused: plan.bytesReused, entriesToFetch: plan.fetch.count,
                        filesReused: plan.reuse.count, bytesKept: kept + (tail.kept ? tail.bytes : 0))))
            self.report(force: true)
            var refetched = Set<Int>()
            var verified: [Int: InstalledFile] = [:]
            while true {
                let ranges = Self.coalesce(missing, in: self.index)
                if !ranges.isEmpty { try self.fetch(ranges) }
                var bad: [Int] = []
                for number in plan.fetch where verified[number] == nil {
                    if self.stopped() { throw Stop() }
                    if let file = try self.verify(number) { verified[number] = file } else { bad.append(number) }
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
            if self.stopped() { throw Stop() }
            let tree = try self.assemble(plan, fetched: verified)
            return (.assembled(fetched: self.fetched), tree)
        } catch let refusal as DeltaRefusal {
            return (.deltaRefused(refusal.fallback), nil)
        } catch is Stop {
            return (.stopped(bytesOnDisk: self.fetched), nil)
        } catch let error as PackDeliveryError {
            let retryable =
                [.network, .io, .insufficientStorage, .unauthorized].contains(error.kind) && error.code != .tooManyOpenFiles
                || error.code == .tooManyOpenFiles
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

    private struct Stop: Error {}

    // MARK: Plan

    private func plan() throws -> DeltaPlan {
        let download = self.request.download
        guard let indexURL = URL(string: self.request.index.url), !download.url.isFileURL else {
            throw DeltaRefusal(.notServedOverHTTP, "the pack is not served over http(s)")
        }
        guard self.request.install.fileCount >= 0 else {
            throw DeltaRefusal(.installedFilesChanged, "the installed version has no record of its files")
        }
        let damaged = DownloadQueue.damagedFiles(self.request.install, files: self.request.installedFiles, modifiedSinceInstall: true)
        // The manifest's length is between 0 and 2^50 (checked when it was read); the fetch stops one byte past it.
        guard self.request.index.length <= PackIndex.maxBytes else {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index is \(self.request.index.length) bytes, more than the \(PackIndex.maxBytes) an index may have")
        }
        let data: Data
        do {
            data = try Curl.fetch(indexURL, options: self.request.options, maxBytes: Int(self.request.index.length) + 1)
        } catch {
            if error.kind == .network || error.code == .unauthorized || error.kind == .badData {
                throw DeltaRefusal(.indexUnusable, "the pack's index could not be fetched (\(error.message))")
            }
            throw error
        }
        let hasher = SHA256Hasher()
        data.withUnsafeBytes { hasher.update($0) }
        guard Int64(data.count) == self.request.index.length, hasher.hexDigest() == self.request.index.sha256.lowercased() else {
            throw DeltaRefusal(.indexUnusable, "the pack's index does not match the SHA-256 and length the manifest gives")
        }
        let index = try PackIndex.decode(data, maxEntries: self.request.maxEntries)
        self.index = index
        return try DeltaPlan.make(
            index: index, packLength: download.contentLength, unpackedLength: download.unpackedLength,
            installed: self.request.installedFiles, damaged: damaged
        ).get()
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
            try Self.writeDurably(Data(wanted.utf8), to: marker)
            try Durability.syncFolder(self.folder)
        }
        self.validator = try? String(contentsOf: self.folder.appending(path: "validator"), encoding: .utf8)
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
        if !kept, length >= 22 {
            // Offsets and lengths are at most 2^50 each (checked when the index was decoded): their sums fit.
            let after = self.index.entries.map { $0.offset + $0.length }.max() ?? 0
            tail = try self.fetchBytes(max(0, length - Self.maxTail, min(after, length - 22))..<length)
        }
        var start = length - Int64(tail.count)
        var grown = false
        let directory = try ZipDirectories.directory(size: length) { offset, count throws -> [UInt8]? in
            guard offset >= 0, count >= 0, offset <= length - Int64(count), length - offset <= Self.maxTail else { return nil }
            if offset < start {
                tail = try self.fetchBytes(offset..<start) + tail
                start = offset
                grown = true
            }
            let from = Int(offset - start)
            return Array(tail[from..<(from + count)])
        }
        guard let directory else { throw DeltaRefusal(.indexUnusable, "the pack's central directory cannot be read") }
        self.directory = directory
        if !kept || grown {
            try Self.writeDurably(Data(tail), to: file)
            try Durability.syncFolder(self.folder)
        }
        return (Int64(tail.count), kept && !grown)
    }

    /// The CRC-32 of an installed file, by its path in the installed version.
    private func installedCRC(_ path: String) throws -> UInt32? {
        let file = URL(filePath: self.request.install.contentURL).appending(path: path).path
        let result: (crc: UInt32, count: Int64)?
        do { result = try CRC32.ofFile(file, isCancelled: self.stopped) } catch {
            throw DeltaRefusal(.installedFilesChanged, "the installed file \(PackDeliveryError.printable(path)) cannot be read")
        }
        guard let result else { throw Stop() }
        return result.crc
    }

    static func coalesce(_ numbers: [Int], in index: PackIndex) -> [DeltaPlan.Range] {
        var ranges: [DeltaPlan.Range] = []
        for number in numbers.sorted(by: { index.entries[$0].offset < index.entries[$1].offset }) {
            let entry = index.entries[number]
            if var last = ranges.last, entry.offset >= last.end, entry.offset - last.end <= DeltaPlan.coalesceGap {
                last.end = max(last.end, entry.offset + entry.length)
                last.entries.append(number)
                ranges[ranges.count - 1] = last
            } else {
                ranges.append(DeltaPlan.Range(start: entry.offset, end: entry.offset + entry.length, entries: [number]))
            }
        }
        return ranges
    }

    // MARK: Fetch

    /// Fetches the ranges one after another on one connection (libcurl keeps it open between requests).
    private func fetch(_ ranges: [DeltaPlan.Range]) throws {
        for range in ranges { try self.perform(range, collecting: false) }
    }

    /// Fetches bytes of the pack into memory, on the same connection.
    private func fetchBytes(_ bytes: Range<Int64>) throws -> [UInt8] {
        guard !bytes.isEmpty else { return [] }
        return try self.perform(DeltaPlan.Range(start: bytes.lowerBound, end: bytes.upperBound, entries: []), collecting: true)
    }

    /// One range request: its entries written to their files, or (`collecting`) its bytes returned.
    @discardableResult
    private func perform(_ range: DeltaPlan.Range, collecting: Bool) throws -> [UInt8] {
        let download = self.request.download
        let (easy, sink) = try self.openConnection()
        if self.stopped() { throw Stop() }
        try easy.set(CURLOPT_RANGE, string: "\(range.start)-\(range.end - 1)")
        sink.begin(range, collecting: collecting)
        let code = withExtendedLifetime(sink) { curl_easy_perform(easy.handle) }
        sink.closeOpenEntry()
        if let failure = sink.failure { throw failure }
        if self.stopped() { throw Stop() }
        guard code == CURLE_OK else {
            let hint = "It is tried again; the entries fetched are kept."
            if let slow = easy.speedFailure(code, url: download.url.redacted, hint: hint) { throw slow }
            throw PackDeliveryError(
                Curl.errorCode(for: code),
                message:
                    "The transfer of \(download.contentIdentifier) from \(download.url.redacted) failed: \(PackDeliveryError.printable(easy.errorMessage(code))).",
                hint: "It is tried again; the entries fetched are kept.", subject: download.url.redacted,
                underlying: .init(.curl, Int(code.rawValue)))
        }
        if sink.position < range.end {
            throw PackDeliveryError(
                .networkFailure,
                message: "The server ended the range of \(download.contentIdentifier) at byte \(sink.position) of \(range.end).",
                hint: "It is tried again; the entries fetched are kept.", subject: download.url.redacted)
        }
        return sink.collected ?? []
    }

    /// The connection, made on first use.
    private func openConnection() throws -> (easy: CurlEasy, sink: RangeSink) {
        if let connection = self.connection { return connection }
        let easy = try CurlEasy(url: self.request.download.url)
        try easy.apply(self.request.options)
        try easy.restrictProtocols(for: self.request.download.url, allowingFile: false)
        try easy.set(CURLOPT_BUFFERSIZE, long: 256 << 10)
        let sink = RangeSink(run: self)
        let user = Unmanaged.passUnretained(sink).toOpaque()
        try easy.set(CURLOPT_WRITEDATA, pointer: user)
        try easy.set(CURLOPT_HEADERDATA, pointer: user)
        try easy.set(
            CURLOPT_WRITEFUNCTION,
            callback: { pointer, size, count, user in
                Unmanaged<RangeSink>.fromOpaque(user!).takeUnretainedValue().body(
                    UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
        try easy.set(
            CURLOPT_HEADERFUNCTION,
            callback: { pointer, size, count, user in
                Unmanaged<RangeSink>.fromOpaque(user!).takeUnretainedValue().header(
                    UnsafeRawBufferPointer(start: pointer, count: size * count))
            })
        self.connection = (easy, sink)
        return (easy, sink)
    }

    /// Checks the response of a range before its first byte is used.
    fileprivate func accept(status: Int, headers: [String: String], range: DeltaPlan.Range) throws {
        let download = self.request.download
        switch status {
        case 206: break
        case 200, 416:
            throw DeltaRefusal(.rangesNotSupported, "the server does not answer range requests (it answered \(status))")
        case 401, 403:
            throw PackDeliveryError(
                .unauthorized, message: "The server answered \(status) for \(download.url.redacted).",
                hint: "Renew the credentials, then resume.",
                subject: download.url.redacted, underlying: .init(.http, status), httpStatus: status)
        default:
            throw PackDeliveryError(
                .httpStatus, message: "The server answered \(status) for a range of \(download.url.redacted).",
                hint: "It is tried again; the entries fetched are kept.", subject: download.url.redacted, underlying: .init(.http, status),
                httpStatus: status)
        }
        guard let contentRange = headers["content-range"], contentRange.lowercased().hasPrefix("bytes \(range.start)-") else {
            throw DeltaRefusal(.rangesNotSupported, "the server answered a range request with another range")
        }
        let validator = CurlTransfer.validator(from: headers)
        if let kept = self.validator, validator != kept {
            // The pack changed on the server since the kept entries were fetched: never mix two versions.
            try? Installer.removeTree(self.folder)
            throw PackDeliveryError(
                .networkFailure,
                message:
                    "The pack \(download.contentIdentifier) changed on the server during its delta update (its ETag or Last-Modified changed).",
                hint: "The update starts again from the pack's index.", subject: download.url.redacted)
        }
        if self.validator == nil, let validator {
            self.validator = validator
            try Self.writeDurably(Data(validator.utf8), to: self.folder.appending(path: "validator"))
        }
    }

    fileprivate func entry(_ number: Int) -> PackIndex.Entry { self.index.entries[number] }

    fileprivate func received(_ count: Int) {
        self.fetched = min(self.total, self.fetched + Int64(count))
        self.report(force: false)
    }

    private func report(force: Bool) {
        let now = Date()
        guard force || now.timeIntervalSince(self.lastReport) >= 0.1 else { return }
        self.lastReport = now
        self.onEvent(.progress(id: self.request.id, bytesOnDisk: self.fetched, validator: nil))
    }

    fileprivate var writer: any FileWriting { self.request.writer }
    fileprivate var isStopped: Bool { self.stopped() }

    /// A complete entry: made a zip of its own, synced, and renamed into place (so a kept `e<N>.zip` is whole).
    fileprivate func complete(_ number: Int, fd: Int32, part: URL) throws {
        let entry = self.index.entries[number]
        try DeltaZip.close(fd, entry: entry, central: self.directory.entries[number])
        guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync the fetched entry", path: part.path, errno: errno) }
        guard rename(part.path, self.entryFile(number).path) == 0 else {
            throw PackDeliveryError.io("keep the fetched entry", path: part.path, errno: errno)
        }
    }

    // MARK: Verify and assemble

    /// Unpacks a fetched entry with the unpacker's checks and compares it with the index.
    /// - Returns: the file, or nil when it does not match (its kept bytes are deleted).
    private func verify(_ number: Int) throws -> InstalledFile? {
        let entry = self.index.entries[number]
        let out = self.folder.appending(path: "u\(number)")
        try Installer.removeTree(out)
        if mkdir(out.path, 0o700) != 0 { throw Installer.fileError("create a folder in", out.path, errno) }
        guard
            let file = try DeltaZip.unpack(
                self.entryFile(number), entry: entry, into: out, isCancelled: self.stopped, writer: self.request.writer)
        else {
            // Bytes that are not the entry the index describes: fetched once more.
            unlink(self.entryFile(number).path)
            return nil
        }
        return file
    }

    /// The new version's tree: folders made, fetched entries moved in, unchanged files linked (or copied) from the
    /// installed version, each path checked so that nothing passes through a symlink.
    private func assemble(_ plan: DeltaPlan, fetched: [Int: InstalledFile]) throws -> DeltaTree {
        let tree = self.folder.appending(path: "tree")
        try Installer.removeTree(tree)
        if mkdir(tree.path, 0o755) != 0 { throw Installer.fileError("create the new version's folder", tree.path, errno) }
        var directories: Set<String> = [""]
        var files: [InstalledFile] = []
        let reuse = Dictionary(plan.reuse.map { ($0.path, $0) }, uniquingKeysWith: { a, _ in a })
        var bytes: Int64 = 0
        for (number, entry) in self.index.entries.enumerated() {
            if self.stopped() { throw Stop() }
            let components = try Self.components(entry.path)
            switch entry.kind {
            case .directory:
                try Self.makeDirectories(components, in: tree, made: &directories)
            case .file, .symlink:
                try Self.makeDirectories(Array(components.dropLast()), in: tree, made: &directories)
                let target = tree.appending(path: entry.path)
                if let file = fetched[number] {
                    let from = self.folder.appending(path: "u\(number)").appending(path: entry.path)
                    if rename(from.path, target.path) != 0 { throw Installer.fileError("move a fetched entry to", target.path, errno) }
                    files.append(file)
                } else if let reused = reuse[entry.path] {
                    try self.place(
                        URL(filePath: self.request.install.contentURL).appending(path: reused.from), at: target, size: reused.size)
                    files.append(InstalledFile(path: entry.path, kind: .file, size: reused.size, sha256: reused.sha256))
                } else {
                    throw PackDeliveryError(
                        .internalError, message: "The delta update has no source for \(PackDeliveryError.printable(entry.path)).")
                }
                bytes += entry.size
            }
        }
        return DeltaTree(
            folder: tree,
            summary: UnpackSummary(
                bytes: bytes, entries: self.index.entries.count, files: files,
                directories: directories.sorted()))
    }

    /// A reflink where the filesystem has them, else a hard link, else a copy; the source must still look as installed.
    private func place(_ source: URL, at target: URL, size: Int64) throws(PackDeliveryError) {
        var info = stat()
        guard lstat(source.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, Int64(info.st_size) == size else {
            throw PackDeliveryError(
                .contentDamaged, message: "The installed file \(source.path) changed during the delta update.",
                hint: "It is tried again.", subject: source.path)
        }
        let input = open(source.path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard input >= 0 else { throw Installer.fileError("read", source.path, errno) }
        defer { close(input) }
        let output = open(target.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, info.st_mode & 0o777)
        guard output >= 0 else { throw Installer.fileError("create", target.path, errno) }
        // FICLONE: the two files share their blocks until one is written (btrfs, xfs); ext4 refuses it.
        let cloned = clinux_reflink(output, input) == 0
        close(output)
        if cloned { return }
        unlink(target.path)
        if link(source.path, target.path) == 0 { return }
        let copy = open(target.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, info.st_mode & 0o777)
        guard copy >= 0 else { throw Installer.fileError("create", target.path, errno) }
        defer { close(copy) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var offset: Int64 = 0
        while true {
            let count = read(input, &buffer, buffer.count)
            if count < 0 { throw Installer.fileError("read", source.path, errno) }
            if count == 0 { break }
            let written = buffer.withUnsafeBytes { self.request.writer.pwrite(copy, $0.baseAddress!, count, offset) }
            if written != count { throw Self.writeFailure(written, file: target, needed: size) }
            offset += Int64(count)
        }
        var times = [info.st_atim, info.st_mtim]
        futimens(copy, &times)
    }

    private static func components(_ path: String) throws(PackDeliveryError) -> [String] {
        let components = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard !path.isEmpty, !components.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." || $0.utf8.contains(0) }) else {
            throw PackDeliveryError(
                .unsafeEntry, message: "The pack's index names the unsafe path '\(PackDeliveryError.printable(path))'.",
                hint: "Nothing was installed; the pack's index is wrong.", subject: path)
        }
        return components
    }

    /// `mkdir -p` inside `root`, refusing any component that exists and is not a folder (a symlink above all).
    private static func makeDirectories(_ components: [String], in root: URL, made: inout Set<String>) throws(PackDeliveryError) {
        var relative = ""
        for component in components {
            relative = relative.isEmpty ? component : relative + "/" + component
            if made.contains(relative) { continue }
            let path = root.appending(path: relative).path
            var info = stat()
            if lstat(path, &info) == 0 {
                guard (info.st_mode & S_IFMT) == S_IFDIR else {
                    throw PackDeliveryError(
                        .unsafeEntry,
                        message: "The pack places a file inside '\(PackDeliveryError.printable(relative))', which is not a folder.",
                        hint: "Nothing was installed; the pack is not safe to unpack.", subject: relative)
                }
            } else if mkdir(path, 0o755) != 0 {
                throw Installer.fileError("create the folder", path, errno)
            }
            made.insert(relative)
        }
    }

    /// A write that wrote `written` bytes, not all: a full disk (with the space its folder has left) or another error.
    static func writeFailure(_ written: Int, file: URL, needed: Int64) -> PackDeliveryError {
        let code = written < 0 ? errno : ENOSPC
        guard code == ENOSPC || code == EDQUOT else { return Installer.fileError("write", file.path, code) }
        let folder = file.deletingLastPathComponent()
        return .insufficientStorage(path: folder.path, needed: needed, available: SpaceCheck.available(at: folder), errno: code)
    }

    static func writeDurably(_ data: Data, to url: URL) throws(PackDeliveryError) {
        let temporary = url.path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Installer.fileError("create", temporary, errno) }
        defer { close(fd) }
        let written = data.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard written == data.count, Durability.syncData(fd) == 0, rename(temporary, url.path) == 0 else {
            throw Installer.fileError("write", url.path, errno)
        }
    }
}

/// Receives one range's body and writes each wanted entry's bytes into its own file.
private final class RangeSink {
    unowned let run: DeltaRun
    private var range = DeltaPlan.Range(start: 0, end: 0, entries: [])
    private var status = 0
    private var headers: [String: String] = [:]
    private var accepted = false
    /// The pack offset of the next byte.
    private(set) var position: Int64 = 0
    private(set) var failure: Error?
    /// The entry being written: its number, file and path.
    private var open: (number: Int, fd: Int32, part: URL)?
    /// The range's bytes, when they are collected rather than written to entries.
    private(set) var collected: [UInt8]?

    init(run: DeltaRun) { self.run = run }

    func begin(_ range: DeltaPlan.Range, collecting: Bool) {
        self.range = range
        self.collected = collecting ? [] : nil
        self.status = 0
        self.headers = [:]
        self.accepted = false
        self.position = range.start
        self.failure = nil
    }

    func header(_ bytes: UnsafeRawBufferPointer) -> Int {
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if line.hasPrefix("HTTP/") {
            let fields = line.split(separator: " ")
            self.status = fields.count > 1 ? Int(fields[1]) ?? 0 : 0
            self.headers = [:]
        } else if let colon = line.firstIndex(of: ":") {
            self.headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return bytes.count
    }

    func body(_ bytes: UnsafeRawBufferPointer) -> Int {
        do {
            if self.run.isStopped { return 0 }
            if !self.accepted {
                try self.run.accept(status: self.status, headers: self.headers, range: self.range)
                self.accepted = true
            }
            if self.collected != nil {
                let count = Int(min(Int64(bytes.count), max(0, self.range.end - self.position)))
                self.collected?.append(contentsOf: bytes[0..<count])
                self.position += Int64(count)
                return bytes.count
            }
            var taken = 0
            while taken < bytes.count {
                let remaining = bytes.count - taken
                guard self.position < self.range.end else { break }
                // The entry that holds `position`, if it is wanted; else the bytes up to the next wanted one are skipped.
                let holder = self.range.entries.first { number in
                    let entry = self.run.entry(number)
                    return entry.offset <= self.position && self.position < entry.offset + entry.length
                }
                guard let number = holder else {
                    let next = self.range.entries.map { self.run.entry($0).offset }.filter { $0 > self.position }.min() ?? self.range.end
                    let skip = Int(min(Int64(remaining), next - self.position))
                    taken += skip
                    self.position += Int64(skip)
                    continue
                }
                let entry = self.run.entry(number)
                if self.open?.number != number {
                    self.closeOpenEntry()
                    let part = self.run.partFile(number)
                    let fd = Glibc.open(part.path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
                    guard fd >= 0 else { throw Installer.fileError("create", part.path, errno) }
                    self.open = (number, fd, part)
                }
                guard let current = self.open else { break }
                let count = Int(min(Int64(remaining), entry.offset + entry.length - self.position))
                let written = self.run.writer.pwrite(current.fd, bytes.baseAddress! + taken, count, self.position - entry.offset)
                if written != count { throw DeltaRun.writeFailure(written, file: current.part, needed: entry.length) }
                taken += count
                self.position += Int64(count)
                if self.position == entry.offset + entry.length {
                    try self.run.complete(number, fd: current.fd, part: current.part)
                    close(current.fd)
                    self.open = nil
                }
            }
            self.run.received(bytes.count)
            return bytes.count
        } catch {
            self.failure = error
            return 0
        }
    }

    /// An entry cut short (a failure, a stop): its part file is dropped; it is fetched again.
    func closeOpenEntry() {
        guard let open = self.open else { return }
        close(open.fd)
        unlink(open.part.path)
        self.open = nil
    }
}

extension DeltaRun {
    fileprivate func partFile(_ number: Int) -> URL { self.request.folder.appending(path: "e\(number).part") }
}
