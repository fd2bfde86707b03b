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

/// Unpacks a verified archive into a private staging folder, checks it, moves it into place with one
/// rename and records the install — or leaves everything as it was.
///
/// The move is journaled through the staging folder's inode: it is written to the store before the
/// rename, so after a crash ``recover(_:home:store:)`` can tell whether the rename happened.
struct Installer: Sendable {
    var home: Home
    var store: Store
    var limits: UnpackLimitsPolicy
    var writer: any FileWriting

    /// How big a pack may unpack to.
    struct UnpackLimitsPolicy: Sendable, Hashable {
        /// Without a manifest `unpackedLength`, at most this many times the pack's size.
        var maxExpansionRatio: Int64 = 100
        var maxEntries = 100_000
    }

    /// Runs unpack, check, move and record for one download.
    /// - Returns: the installed folder (the download's `contentURL`).
    func install(_ download: Download, progress: @escaping (DownloadPhase, Double) -> Void, cancel: CancelFlag) throws(PackDeliveryError) -> URL {
        let archive = self.home.archiveURL(for: download)
        let staging = self.home.stagingURL(for: download)
        let target = self.home.contentURL(for: download)
        try Self.removeTree(staging)
        if mkdir(staging.path, 0o700) != 0 { throw Self.fileError("create the staging folder", staging.path, errno) }
        do throws(PackDeliveryError) {
            let packLength = (try? FileManager.default.attributesOfItem(atPath: archive.path)[.size] as? Int64) ?? download.contentLength
            try SpaceCheck.require(unpacked: download.unpackedLength ?? packLength, at: staging.deletingLastPathComponent())
            let maxBytes = download.unpackedLength ?? max(packLength, 1) * self.limits.maxExpansionRatio
            let expected = Double(download.unpackedLength ?? max(packLength, 1))
            progress(.unpacking, 0)
            _ = try Unpacker.unpack(archive: archive, into: staging,
                                    limits: UnpackLimits(maxBytes: maxBytes, maxEntries: self.limits.maxEntries),
                                    progress: { bytes in progress(.unpacking, min(0.99, Double(bytes) / expected)) },
                                    isCancelled: { cancel.isCancelled }, writer: self.writer)
            try Self.checkContentInfo(in: staging, for: download)
            if cancel.isCancelled { throw PackDeliveryError.stopped("The install was stopped.") }
            progress(.installing, 0)
            var info = stat()
            guard stat(staging.path, &info) == 0 else { throw Self.fileError("inspect", staging.path, errno) }
            let inode = Int64(info.st_ino)
            try self.store.write { db in
                try db.execute(sql: "UPDATE downloads SET phase = ?, stagingInode = ? WHERE id = ?",
                               arguments: [DownloadPhase.installing, inode, download.id])
            }
            return try self.moveIntoPlace(download, staging: staging, target: target)
        } catch {
            try? Self.removeTree(staging)
            if error.kind == .insufficientStorage, error.neededBytes == nil {
                // Say how much the unpack needs and how much is free now that staging is gone.
                let needed = (download.unpackedLength ?? download.contentLength) + SpaceCheck.margin
                throw .insufficientStorage(path: staging.deletingLastPathComponent().path, needed: needed,
                                           available: SpaceCheck.available(at: staging.deletingLastPathComponent()), errno: error.underlying.map { Int32($0.value) })
            }
            throw error
        }
    }

    /// The rename and the record, shared by a fresh install and crash recovery.
    private func moveIntoPlace(_ download: Download, staging: URL, target: URL) throws(PackDeliveryError) -> URL {
        if FileManager.default.fileExists(atPath: target.path) {
            // The old version stays usable until this single atomic swap.
            if clinux_rename_exchange(staging.path, target.path) != 0 { throw Self.fileError("move the content into place at", target.path, errno) }
        } else if rename(staging.path, target.path) != 0 {
            throw Self.fileError("move the content into place at", target.path, errno)
        }
        try self.record(download, contentURL: target)
        if download.destination == .documents { BackupExclusion.mark(folder: target, tag: false) }
        try? Self.removeTree(staging)  // the old version, after a swap
        try? FileManager.default.removeItem(at: self.home.archiveURL(for: download))
        return target
    }

    /// Records the installed content and the finished download in one write.
    private func record(_ download: Download, contentURL: URL) throws(PackDeliveryError) {
        try self.store.write { db in
            try InstalledContentRecord(contentIdentifier: download.contentIdentifier, productIdentifier: download.productIdentifier,
                                       contentVersion: download.contentVersion, contentURL: contentURL.path,
                                       destination: download.destination, installedAt: Date(), downloadID: download.id).save(db)
            try db.execute(sql: """
                UPDATE downloads SET state = ?, phase = NULL, progress = 1, contentURL = ?, stagingInode = NULL,
                       verified = 0, partialPath = NULL, error = NULL, pauseReason = NULL, bytesReceived = contentLength
                WHERE id = ?
                """, arguments: [DownloadState.finished, contentURL.path, download.id])
        }
    }

    /// After a crash: finish or roll back an install that had reached the move.
    /// - Returns: the content URL when the install is now complete; nil when it must run again from the archive.
    func recover(_ download: Download, stagingInode: Int64?) throws(PackDeliveryError) -> URL? {
        let staging = self.home.stagingURL(for: download)
        let target = self.home.contentURL(for: download)
        if let stagingInode {
            var info = stat()
            if stat(target.path, &info) == 0, Int64(info.st_ino) == stagingInode {
                // The rename happened; only the record is missing.
                try self.record(download, contentURL: target)
                try? Self.removeTree(staging)
                try? FileManager.default.removeItem(at: self.home.archiveURL(for: download))
                return target
            }
            if stat(staging.path, &info) == 0, Int64(info.st_ino) == stagingInode {
                // Unpacked and checked, not yet moved: move it now.
                return try self.moveIntoPlace(download, staging: staging, target: target)
            }
        }
        try? Self.removeTree(staging)
        return nil
    }

    static func checkContentInfo(in staging: URL, for download: Download) throws(PackDeliveryError) {
        let url = staging.appending(path: "ContentInfo.plist")
        guard FileManager.default.fileExists(atPath: url.path) else { return }
        let info: ContentInfo
        do {
            info = try PropertyListDecoder().decode(ContentInfo.self, from: Data(contentsOf: url))
        } catch {
            throw PackDeliveryError(.contentInfoMismatch, message: "The pack's ContentInfo.plist cannot be read (it needs the string keys ContentVersion and IAPProductIdentifier).",
                                    hint: "Nothing was installed; ask the content provider for a fixed pack.", subject: "ContentInfo.plist")
        }
        guard info.productIdentifier == download.productIdentifier, info.contentVersion == download.contentVersion else {
            throw PackDeliveryError(.contentInfoMismatch,
                                    message: "The pack's ContentInfo.plist says \(info.productIdentifier) \(info.contentVersion), but the manifest says \(download.productIdentifier) \(download.contentVersion).",
                                    hint: "Nothing was installed; the manifest and the pack disagree — republish one of them.", subject: "ContentInfo.plist")
        }
    }

    static func fileError(_ operation: String, _ path: String, _ code: Int32) -> PackDeliveryError {
        .io(operation, path: path, errno: code)
    }

    /// Removes a folder tree (no-op when missing), making read-only folders writable first.
    static func removeTree(_ url: URL) throws(PackDeliveryError) {
        guard FileManager.default.fileExists(atPath: url.path) || (try? FileManager.default.destinationOfSymbolicLink(atPath: url.path)) != nil else { return }
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
