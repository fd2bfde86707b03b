import CLinux
import Foundation
import GRDB
import Synchronization

/// A flag another thread sets to stop an unpack between blocks.
final class CancelFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    func cancel() { self.flag.store(true, ordering: .relaxed) }
    var isCancelled: Bool { self.flag.load(ordering: .relaxed) }
}

/// A step of an install, for test-only pause points (the power-cut tests stop a process there).
@_spi(Testing) public enum InstallStep: String, Sendable {
    /// The first megabyte of the pack is unpacked.
    case unpacking = "mid-unpack"
    /// The unpacked tree is durable and the move is journaled; the rename is next.
    case beforeRename = "before-rename"
    /// The content is in place; the install record is next.
    case afterRename = "after-rename"
    /// An evicted pack's folder was moved to the trash (and synced); the record of the eviction is next.
    case evictionMoved = "eviction-moved"
    /// A preload's install found no key and noted the download as waiting for it; its pause is next.
    case awaitingKey = "awaiting-key"
}

/// What an install put in place: the rows that record it, which the queue's driver commits with the download's
/// final row (``Store/commitInstall(_:files:download:)``), and what it left behind, cleared once they are
/// committed (``Installer/clearAway(_:)``).
struct InstalledPack: Sendable, Hashable {
    var install: InstallRecord
    var files: [InstalledFileRecord]
    /// The staging folder (the old version, after a swap), the archive and the delta update's folder.
    var leftovers: [URL]

    /// The installed folder.
    var contentURL: URL { URL(filePath: self.install.contentURL) }
}

/// Unpacks a verified archive into a private staging folder, makes it durable and moves it into place with
/// one rename — or leaves everything as it was.
///
/// The order (after the ALICE study): unpack; sync the files and folders; journal the move (the staging
/// folder's inode, durably); rename; sync the parent folder. The installer then returns what it installed,
/// and the queue's driver records the install, its files and the finished download in one durable commit;
/// only then is the download reported finished. After a crash, ``recover(_:stagingInode:)`` uses the
/// journal to tell whether the rename happened.
struct Installer: Sendable {
    var home: Home
    var store: Store
    var limits: UnpackLimitsPolicy
    var writer: any FileWriting
    var hook: (@Sendable (InstallStep) -> Void)?
    /// Deletes what an install leaves behind (the archive, an old version) off the critical path.
    var janitor: DispatchQueue
    /// The home's reserved paths (``Home/reservedPaths``), standardized once: every install is checked against them.
    let reservedPaths: [String]
    /// The preload keys held for installs, in memory only.
    let keyring = PreloadKeyring()

    init(
        home: Home, store: Store, limits: UnpackLimitsPolicy, writer: any FileWriting, hook: (@Sendable (InstallStep) -> Void)?,
        janitor: DispatchQueue
    ) {
        (self.home, self.store, self.limits, self.writer, self.hook, self.janitor) = (home, store, limits, writer, hook, janitor)
        self.reservedPaths = home.reservedPaths.map(\.standardizedFileURL.path)
    }

    /// How big a pack may unpack to.
    struct UnpackLimitsPolicy: Sendable, Hashable {
        /// Without a manifest `unpackedLength`, at most this many times the pack's size.
        var maxExpansionRatio: Int64 = 100
        var maxEntries = 100_000

        /// The most bytes a pack of `packLength` may unpack to: the manifest's `unpackedLength`, else the ratio.
        func maxBytes(packLength: Int64, unpackedLength: Int64?) -> Int64 {
            let (maxBytes, overflow) = max(packLength, 1).multipliedReportingOverflow(by: max(1, self.maxExpansionRatio))
            return unpackedLength ?? (overflow ? Int64.max : maxBytes)
        }
    }

    /// Extended attributes that name the product an install folder belongs to.
    static let productAttribute = "user.packdelivery.product"

    /// What a download's transfer left for its install.
    enum Source {
        /// The new version's tree, built by a delta update or a first install written chunk by chunk (each entry
        /// already checked): moved into place as it is.
        case built(DeltaTree)
        /// The verified archive. `recheck`: hash it first (its verification was recorded by an earlier process, and a
        /// crash may have damaged it since). `streamed`: the unpack that ran while it downloaded, when one did: its
        /// folder is taken instead of unpacking again (unless `recheck`, or it failed for a reason that is not the
        /// pack's). `index`: the fetch of the pack's index that ran beside its transfer, when one did: the files are
        /// recorded with the SHA-256 it gives (``IndexDigests``), once their paths, kinds and sizes are held to it.
        case archive(recheck: Bool, streamed: StreamedUnpack?, index: IndexFetch?)
    }

    /// Runs check, unpack, sync and move for one download.
    /// - Parameter source: what its transfer left: a tree it built, or the archive.
    /// - Returns: what was installed, for the driver to record.
    func install(
        _ download: Download, from source: Source, progress: @escaping (DownloadPhase, Double) -> Void, cancel: CancelFlag
    ) throws(PackDeliveryError) -> InstalledPack {
        let archive = self.home.archiveURL(for: download)
        let staging = self.home.stagingURL(for: download)
        try self.checkOwnership(download)
        try Self.removeTree(staging)
        if case .archive(true, let streamed?, _) = source { streamed.discard() }
        do throws(PackDeliveryError) {
            var summary: UnpackSummary
            switch source {
            case .built(let tree):
                if rename(tree.folder.path, staging.path) != 0 { throw Self.fileError("move the updated pack to", staging.path, errno) }
                summary = tree.summary
                progress(.unpacking, 0)
            case .archive(let recheck, let streamed, let index):
                let preload = try self.preload(download, archive: archive, recheck: recheck)
                // A preload's unpack while it downloaded saw only ciphertext.
                if preload != nil { streamed?.discard() }
                switch preload {
                case nil:
                    summary = try self.unpacked(
                        download, archive: archive, staging: staging, recheck: recheck, streamed: streamed, index: index,
                        progress: progress, cancel: cancel)
                case .decrypting(let decryption)?:
                    summary = try self.unpacked(
                        download, archive: archive, staging: staging, recheck: false, streamed: nil, index: index, progress: progress,
                        cancel: cancel, decryption: decryption)
                case .decrypted(let plain)?:
                    defer { unlink(plain.path) }
                    summary = try self.unpacked(
                        download, archive: plain, staging: staging, recheck: false, streamed: nil, index: index, progress: progress,
                        cancel: cancel)
                }
            }
            if !summary.filesHashed {
                var index: IndexFetch?
                if case .archive(_, _, let fetched) = source { index = fetched }
                summary.files = try Self.digests(of: summary, in: staging, index: index, pack: download.contentIdentifier, cancel: cancel)
            }
            return try self.place(download, summary: summary, staging: staging, progress: progress, cancel: cancel)
        } catch {
            try? Self.removeTree(staging)
            if case .archive = source,
                error.code == .corruptArchive || error.code == .unsafeEntry || error.code == .emptyPack || error.code == .indexMismatch,
                (try? SHA256Hasher.hexDigest(ofFile: archive)) != download.sha256.lowercased()
            {
                // The archive no longer matches what was verified: something changed it on disk since. Not the pack's fault.
                throw PackDeliveryError(
                    .checksumMismatch, message: "The downloaded pack \(download.contentIdentifier) changed on disk after it was verified.",
                    hint: "It is fetched again.", subject: archive.path)
            }
            if error.code == .insufficientStorage, error.neededBytes == nil {
                // Say how much the unpack needs and how much is free now that staging is gone.
                let needed = (download.unpackedLength ?? download.contentLength) + SpaceCheck.margin
                throw .insufficientStorage(
                    path: staging.deletingLastPathComponent().path, needed: needed,
                    available: SpaceCheck.available(at: staging.deletingLastPathComponent()),
                    errno: error.underlying.map { Int32($0.value) })
            }
            throw error
        }
    }

    /// The verified archive's tree in `staging`: the unpack that ran while it downloaded, taken when it can be (a zip's
    /// held to its central directory), else the archive unpacked now.
    /// - Parameter decryption: the archive is a preload pack's ciphertext, decrypted as it is unpacked.
    private func unpacked(
        _ download: Download, archive: URL, staging: URL, recheck: Bool, streamed: StreamedUnpack?, index: IndexFetch?,
        progress: @escaping (DownloadPhase, Double) -> Void, cancel: CancelFlag, decryption: PreloadPack.Decryption? = nil
    ) throws(PackDeliveryError) -> UnpackSummary {
        var info = stat()
        guard stat(archive.path, &info) == 0 else { throw Self.fileError("open the pack", archive.path, errno) }
        let packLength = decryption?.layout.plainLength ?? Int64(info.st_size)
        let expected = Double(download.unpackedLength ?? max(packLength, 1))
        progress(.unpacking, 0)
        switch recheck ? nil : streamed?.take(cancel: cancel, progress: { progress(.unpacking, min(0.99, Double($0) / expected)) }) {
        case .unpacked(let unpacked, let folder)? where unpacked.zipEntries == nil:
            // Unpacked while downloading, from the bytes whose SHA-256 has just matched.
            if rename(folder.path, staging.path) != 0 { throw Self.fileError("move the unpacked pack to", staging.path, errno) }
            return unpacked
        case .unpacked(let unpacked, let folder)?:
            // A zip, unpacked while downloading by its local headers: its central directory has the last word.
            defer { try? Self.removeTree(folder) }
            // A directory that cannot be followed: the unpack of the whole archive below settles it.
            guard let listing = try ZipDirectories.listing(archive) else { break }
            try ZipDirectories.check(listing)
            if mkdir(staging.path, 0o700) != 0 { throw Self.fileError("create the staging folder", staging.path, errno) }
            do throws(PackDeliveryError) {
                let limit = self.limits.maxBytes(packLength: packLength, unpackedLength: download.unpackedLength)
                return try Unpacker.adopt(
                    archive: archive, listing: listing, streamed: (folder, unpacked), into: staging,
                    limits: UnpackLimits(maxBytes: limit, maxEntries: self.limits.maxEntries), isCancelled: { cancel.isCancelled })
            } catch {
                // Whatever it was, the unpack of the whole archive below settles it (and reports it, if it is the pack's).
                if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
            }
        case .failed(let error)? where StreamedUnpack.isHostile(error):
            throw error
        case .failed, nil:
            if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
        }
        // The index was fetched with the pack: its digests spare hashing the files here too.
        var indexed = false
        if !recheck, case .digests? = index?.wait(cancel: cancel) { indexed = true }
        return try self.unpack(
            download, archive: archive, staging: staging, length: packLength, recheck: recheck, progress: progress, cancel: cancel,
            hashFiles: !indexed, decryption: decryption)
    }

    /// Checks the tree in `staging`, makes it durable, journals the move and moves it into place.
    private func place(
        _ download: Download, summary: UnpackSummary, staging: URL, progress: @escaping (DownloadPhase, Double) -> Void,
        cancel: CancelFlag
    ) throws(PackDeliveryError) -> InstalledPack {
        if summary.entries == 0, download.unpackedLength != 0 {
            throw PackDeliveryError(
                .emptyPack,
                message: "The pack \(download.contentIdentifier) holds no files at all, and the manifest does not say it is empty.",
                hint: "Nothing was installed; ask the content provider for a fixed pack.", subject: download.redactedURL)
        }
        try Self.checkContentInfo(in: staging, for: download)
        if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
        progress(.installing, 0)
        Self.setAttribute(Self.productAttribute, download.productIdentifier, on: staging)
        try Durability.syncTree(staging, files: summary.files, directories: summary.directories)
        // The journal of the move: after a crash, the inode tells whether the rename below happened.
        var info = stat()
        guard stat(staging.path, &info) == 0 else { throw Self.fileError("inspect", staging.path, errno) }
        try self.store.journalMove(downloadID: download.id, stagingInode: Int64(info.st_ino))
        self.hook?(.beforeRename)
        return try self.moveIntoPlace(download, staging: staging, target: self.home.contentURL(for: download), files: summary.files)
    }

    /// The unpacked files with their SHA-256, for an unpack that did not hash them: from the pack's index, held to
    /// what was unpacked; or, when the index could not be used after all, hashed from the staging folder.
    /// - Throws: `indexMismatch` when the index does not describe the pack; `cancelled`; `io`.
    private static func digests(of summary: UnpackSummary, in staging: URL, index: IndexFetch?, pack: String, cancel: CancelFlag)
        throws(PackDeliveryError) -> [InstalledFile]
    {
        switch index?.wait(cancel: cancel) {
        case .digests(let digests)?:
            return try digests.apply(to: summary, pack: pack)
        case .unusable?, .stopped?, nil:
            if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
            return try IndexDigests.hashed(summary.files, in: staging, isCancelled: { cancel.isCancelled })
        }
    }

    /// Unpacks the archive into a new staging folder (after hashing it again, with `recheck`).
    /// - Parameters:
    ///   - hashFiles: hash the files as they are written; false when the pack's index gives their digests.
    ///   - decryption: the archive is a preload pack's ciphertext (never a zip), decrypted as it is unpacked.
    private func unpack(
        _ download: Download, archive: URL, staging: URL, length packLength: Int64, recheck: Bool,
        progress: @escaping (DownloadPhase, Double) -> Void, cancel: CancelFlag, hashFiles: Bool = true,
        decryption: PreloadPack.Decryption? = nil
    ) throws(PackDeliveryError) -> UnpackSummary {
        try Self.removeTree(staging)
        if mkdir(staging.path, 0o700) != 0 { throw Self.fileError("create the staging folder", staging.path, errno) }
        if recheck {
            progress(.verifying, 0)
            try self.recheck(download, archive: archive, length: packLength, progress: { progress(.verifying, $0) }, cancel: cancel)
        }
        // A zip's central directory: checked, and the CRC-32s its files are recorded with.
        let listing = decryption == nil ? try ZipDirectories.listing(archive) : nil
        if let listing { try ZipDirectories.check(listing) }
        try SpaceCheck.require(unpacked: download.unpackedLength ?? packLength, at: staging.deletingLastPathComponent())
        let limit = self.limits.maxBytes(packLength: packLength, unpackedLength: download.unpackedLength)
        let expected = Double(download.unpackedLength ?? max(packLength, 1))
        progress(.unpacking, 0)
        var hooked = false
        let summary = try Unpacker.unpack(
            archive: archive, into: staging,
            limits: UnpackLimits(maxBytes: limit, maxEntries: self.limits.maxEntries), listing: listing,
            progress: { bytes in
                progress(.unpacking, min(0.99, Double(bytes) / expected))
                if !hooked, bytes > 0 {
                    hooked = true
                    self.hook?(.unpacking)
                }
            },
            isCancelled: { cancel.isCancelled }, writer: self.writer, hashFiles: hashFiles, decryption: decryption)
        return summary
    }

    /// The rename and the sync of the parent, shared by a fresh install and crash recovery.
    private func moveIntoPlace(_ download: Download, staging: URL, target: URL, files: [InstalledFile]) throws(PackDeliveryError)
        -> InstalledPack
    {
        let exchanged = FileManager.default.fileExists(atPath: target.path)
        if exchanged {
            // The old version stays usable until this single atomic swap.
            if clinux_rename_exchange(staging.path, target.path) != 0 {
                throw Self.fileError("move the content into place at", target.path, errno)
            }
        } else if rename(staging.path, target.path) != 0 {
            throw Self.fileError("move the content into place at", target.path, errno)
        }
        try Durability.syncFolder(target.deletingLastPathComponent())
        if exchanged { try? Durability.syncFolder(staging.deletingLastPathComponent()) }
        self.hook?(.afterRename)
        if download.destination == .documents { BackupExclusion.mark(folder: target, tag: false) }
        return Self.installed(
            download, contentURL: target, files: files,
            leftovers: [staging, self.home.archiveURL(for: download), self.home.deltaURL(for: download)])
    }

    /// Removes what an install left behind (the old version after a swap, the archive), off the critical path:
    /// once its record is committed, so that until then a retry still finds the archive.
    func clearAway(_ installed: InstalledPack) {
        let leftovers = installed.leftovers
        self.janitor.async { for url in leftovers { try? Self.removeTree(url) } }
    }

    /// The rows that record the installed content and its files.
    private static func installed(_ download: Download, contentURL: URL, files: [InstalledFile], leftovers: [URL]) -> InstalledPack {
        let install = InstallRecord(
            destination: download.destination, contentIdentifier: download.contentIdentifier,
            productIdentifier: download.productIdentifier, contentVersion: download.contentVersion,
            contentURL: contentURL.path, installedAt: Date(), downloadID: download.id,
            fileCount: files.count, byteCount: files.reduce(0) { $0 + ($1.kind == .file ? $1.size : 0) })
        let records = files.map { file in
            InstalledFileRecord(
                destination: download.destination, contentIdentifier: download.contentIdentifier,
                path: file.path, kind: file.kind, size: file.size, sha256: file.sha256, crc32: file.crc32)
        }
        return InstalledPack(install: install, files: records, leftovers: leftovers)
    }

    /// After a crash: finish or roll back an install that had reached the move.
    /// - Returns: what is now installed, for the caller to record; nil when it must run again from the archive.
    func recover(_ download: Download, stagingInode: Int64?) throws(PackDeliveryError) -> InstalledPack? {
        let staging = self.home.stagingURL(for: download)
        let target = self.home.contentURL(for: download)
        if let stagingInode {
            var info = stat()
            if stat(target.path, &info) == 0, Int64(info.st_ino) == stagingInode {
                // The rename happened; only the record is missing. The hashes made while unpacking died with
                // the process: read the files once more. The parent is synced again, in case the rename was not.
                try Durability.syncFolder(target.deletingLastPathComponent())
                return Self.installed(
                    download, contentURL: target, files: try Durability.scan(target),
                    leftovers: [staging, self.home.archiveURL(for: download)])
            }
            if stat(staging.path, &info) == 0, Int64(info.st_ino) == stagingInode {
                // Unpacked, synced and checked, not yet moved: move it now.
                try self.checkOwnership(download)
                return try self.moveIntoPlace(download, staging: staging, target: target, files: try Durability.scan(staging))
            }
        }
        try? Self.removeTree(staging)
        return nil
    }

    /// Hashes the archive again and compares it with the manifest's SHA-256.
    private func recheck(_ download: Download, archive: URL, length: Int64, progress: (Double) -> Void, cancel: CancelFlag)
        throws(PackDeliveryError)
    {
        guard length == download.contentLength else {
            throw PackDeliveryError(
                .checksumMismatch,
                message:
                    "The downloaded pack \(download.contentIdentifier) is \(length) bytes, not \(download.contentLength): it was damaged since it was verified.",
                subject: archive.path)
        }
        let fd = open(archive.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw Self.fileError("open the pack", archive.path, errno) }
        defer { close(fd) }
        let hasher = SHA256Hasher()
        let chunk = 1 << 20
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while offset < length {
            if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
            let got = pread(fd, buffer.baseAddress, Int(min(Int64(chunk), length - offset)), off_t(offset))
            if got < 0, errno == EINTR { continue }
            guard got > 0 else { throw Self.fileError("read the pack", archive.path, got < 0 ? errno : EIO) }
            hasher.update(UnsafeRawBufferPointer(rebasing: buffer[0..<got]))
            offset += Int64(got)
            progress(Double(offset) / Double(max(1, length)))
        }
        let digest = hasher.hexDigest()
        guard digest == download.sha256.lowercased() else {
            throw PackDeliveryError(
                .checksumMismatch,
                message:
                    "The downloaded pack \(download.contentIdentifier) no longer matches its SHA-256: it was damaged since it was verified.",
                subject: archive.path)
        }
    }

    // MARK: Who owns an install path

    /// Refuses to install where another product's content is, where the home keeps its own files, or over a
    /// folder that PackDelivery did not install for this product.
    func checkOwnership(_ download: Download) throws(PackDeliveryError) {
        let target = self.home.contentURL(for: download)
        let product = PackDeliveryError.printable(download.productIdentifier)
        let content = PackDeliveryError.printable(download.contentIdentifier)
        let targetPath = target.standardizedFileURL.path
        if let used = self.reservedPaths.first(where: { Self.isSameOrInside($0, targetPath) }) {
            throw PackDeliveryError(
                .contentIdentifierTaken,
                message: "The content identifier \(content) of \(product) names \(used), which the home uses for its own files.",
                hint: "Nothing was installed; the manifest must give the pack another contentIdentifier.",
                subject: download.contentIdentifier)
        }
        let installs = try self.store.installs(contentIdentifier: download.contentIdentifier)
        if let other = installs.first(where: { $0.productIdentifier != download.productIdentifier }) {
            throw PackDeliveryError(
                .contentIdentifierTaken,
                message:
                    "The content identifier \(content) is installed for \(PackDeliveryError.printable(other.productIdentifier)), so \(product) cannot install into it.",
                hint:
                    "Nothing was installed and the installed content was left as it is; one of the two manifests must use another contentIdentifier.",
                subject: download.contentIdentifier)
        }
        if installs.contains(where: { $0.destination == download.destination }) { return }
        var info = stat()
        guard lstat(target.path, &info) == 0 else { return }
        // Something is at the path with no record: ours only if it says it belongs to this product.
        let owner =
            Self.attribute(Self.productAttribute, of: target)
            ?? (try? PropertyListDecoder().decode(ContentInfo.self, from: Data(contentsOf: target.appending(path: "ContentInfo.plist"))))?
            .productIdentifier
        if (info.st_mode & S_IFMT) == S_IFDIR, owner == download.productIdentifier { return }
        throw PackDeliveryError(
            .contentIdentifierTaken,
            message:
                "Something that PackDelivery did not install for \(product) is already at \(target.path)\(owner.map { " (it belongs to \(PackDeliveryError.printable($0)))" } ?? "").",
            hint: "Nothing was installed and it was left as it is; move it away, then try again.", subject: target.path)
    }

    /// Whether standardized path `a` is `b` or inside it.
    private static func isSameOrInside(_ a: String, _ b: String) -> Bool {
        a == b || a.hasPrefix(b.hasSuffix("/") ? b : b + "/")
    }

    static func setAttribute(_ name: String, _ value: String, on url: URL) {
        _ = value.withCString { setxattr(url.path, name, $0, strlen($0), 0) }
    }

    static func attribute(_ name: String, of url: URL) -> String? {
        var buffer = [UInt8](repeating: 0, count: 1024)
        let count = buffer.withUnsafeMutableBytes { getxattr(url.path, name, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count], as: UTF8.self)
    }

    static func checkContentInfo(in staging: URL, for download: Download) throws(PackDeliveryError) {
        let unreadable = PackDeliveryError(
            .contentInfoMismatch,
            message: "The pack's ContentInfo.plist cannot be read (it needs the string keys ContentVersion and IAPProductIdentifier).",
            hint: "Nothing was installed; ask the content provider for a fixed pack.", subject: "ContentInfo.plist")
        // Reading and decoding fail apart: a process out of descriptors is not a broken pack.
        let path = staging.appending(path: "ContentInfo.plist").path
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT { return }
            throw .io("read", path: path, errno: errno)
        }
        guard (info.st_mode & S_IFMT) == S_IFREG, let data = try SmallFile.read(path, limit: 1 << 20, tooLarge: { _ in unreadable })
        else { throw unreadable }
        let contentInfo: ContentInfo
        do {
            contentInfo = try PropertyListDecoder().decode(ContentInfo.self, from: data)
        } catch {
            throw unreadable
        }
        guard contentInfo.productIdentifier == download.productIdentifier, contentInfo.contentVersion == download.contentVersion else {
            throw PackDeliveryError(
                .contentInfoMismatch,
                message:
                    "The pack's ContentInfo.plist says \(contentInfo.productIdentifier) \(contentInfo.contentVersion), but the manifest says \(download.productIdentifier) \(download.contentVersion).",
                hint: "Nothing was installed; the manifest and the pack disagree — republish one of them.", subject: "ContentInfo.plist")
        }
    }

    static func fileError(_ operation: String, _ path: String, _ code: Int32) -> PackDeliveryError {
        .io(operation, path: path, errno: code)
    }

    /// Removes a folder tree (no-op when missing), making read-only folders writable first.
    static func removeTree(_ url: URL) throws(PackDeliveryError) {
        guard
            FileManager.default.fileExists(atPath: url.path)
                || (try? FileManager.default.destinationOfSymbolicLink(atPath: url.path)) != nil
        else { return }
        do { try FileManager.default.removeItem(at: url) } catch {
            _ = try? Fixup.makeWritable(url)
            do { try FileManager.default.removeItem(at: url) } catch { throw .io("remove", path: url.path, errno: EIO) }
        }
    }

    private enum Fixup {
        static func makeWritable(_ url: URL) throws {
            let enumerator = FileManager.default.enumerator(atPath: url.path)
            chmod(url.path, 0o700)
            while let path = enumerator?.nextObject() as? String {
                let full = url.appending(path: path).path
                var info = stat()
                if lstat(full, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR { chmod(full, 0o700) }
            }
        }
    }
}

/// Free-space checks (statvfs) before a download starts and before unpacking.
enum SpaceCheck {
    /// Headroom kept free beyond what a pack needs.
    static let margin: Int64 = 4 << 20

    /// Bytes available to an unprivileged writer on the filesystem holding `path`.
    static func available(at path: URL) -> Int64? {
        var info = statvfs()
        guard statvfs(path.path, &info) == 0 else { return nil }
        return Int64(info.f_bavail) * Int64(info.f_frsize)
    }

    /// Throws `insufficientStorage` with needed and available bytes when `download + unpacked + margin` does not fit.
    static func require(download: Int64 = 0, unpacked: Int64, at path: URL) throws(PackDeliveryError) {
        guard let available = self.available(at: path) else { return }
        let needed = download + unpacked + self.margin
        if needed > available {
            throw .insufficientStorage(path: path.path, needed: needed, available: available)
        }
    }
}
