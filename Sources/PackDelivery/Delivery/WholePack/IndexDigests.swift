import Foundation

/// The SHA-256 of a pack's files as its index gives them: what an install records for `verify` instead of hashing
/// every file it unpacks, so that a streamed install of an indexed pack hashes only the pack.
///
/// The index is covered by the manifest's SHA-256 and length, the pack by its own SHA-256; but the two are the
/// publisher's word about each other, so the unpack holds the index to what it found in the pack:
/// ``apply(to:pack:)`` requires the same files and symlinks, at the same paths, of the same kinds and sizes,
/// and every folder the index lists, or refuses the install (`indexMismatch`). What the index cannot be held to
/// without hashing, a file's bytes, is what `verify` then compares with what the publisher built.
struct IndexDigests: Sendable {
    /// What is kept of an entry (not its chunks: an index of a 1 GiB pack lists about 16,000).
    private struct Entry: Sendable {
        var path: String
        var kind: PackIndex.Entry.Kind
        var size: Int64
        var sha256: String?
    }

    /// The index's entries, by path.
    private let entries: [String: Entry]

    /// Packs smaller than this hash their files as they unpack: hashing 16 MiB costs about 10 ms of CPU, less than a
    /// second request (for the index) costs the client, the server and a CDN that bills by request; most packs of a
    /// catalog are small.
    static let minimumPackLength: Int64 = 16 << 20

    /// The digests of `index`, or nil when it does not name the pack the manifest gives (its `pack` length or
    /// SHA-256 differ): the files are then hashed as they unpack.
    ///
    /// - Parameters:
    ///   - index: the decoded index (``PackIndex/decode(_:maxEntries:containers:)`` checked its numbers and paths).
    ///   - download: the download of the pack, with the manifest's length and SHA-256.
    init?(index: PackIndex, for download: Download) {
        if let pack = index.pack, pack.length != download.contentLength || pack.sha256.lowercased() != download.sha256.lowercased() {
            return nil
        }
        // Paths are unique in a format 2 index (checked when decoded); in format 1, the first one is kept.
        self.entries = Dictionary(
            index.entries.map { ($0.path, Entry(path: $0.path, kind: $0.kind, size: $0.size, sha256: $0.sha256)) },
            uniquingKeysWith: { first, _ in first })
    }

    /// The unpacked files with the SHA-256 the index gives each.
    ///
    /// - Parameters:
    ///   - summary: what the unpack wrote (its files' sizes and kinds; their digests are not used).
    ///   - pack: the pack's content identifier, for the message.
    /// - Returns: `summary.files`, each with the index's SHA-256 (a hard link's: its target's).
    /// - Throws: `indexMismatch` naming the first path where the index and the pack disagree.
    func apply(to summary: UnpackSummary, pack: String) throws(PackDeliveryError) -> [InstalledFile] {
        var listed = Set(self.entries.values.lazy.filter { $0.kind != .directory }.map(\.path))
        var files: [InstalledFile] = []
        files.reserveCapacity(summary.files.count)
        for file in summary.files {
            let kind: PackIndex.Entry.Kind = file.kind == .file ? .file : .symlink
            guard let entry = self.entries[file.path] else {
                throw Self.mismatch(file.path, "is in the pack but not in its index", pack: pack)
            }
            guard entry.kind == kind else {
                throw Self.mismatch(file.path, "is a \(kind.rawValue) in the pack but a \(entry.kind.rawValue) in its index", pack: pack)
            }
            var source = entry
            if let target = summary.hardLinks[file.path] {
                // A tar's hard link has no bytes of its own (its index entry says 0 or its target's size): its
                // content is its target's.
                guard let linked = self.entries[target], linked.kind == .file, entry.size == 0 || entry.size == linked.size else {
                    throw Self.mismatch(file.path, "is a hard link in the pack to a file its index does not give", pack: pack)
                }
                source = linked
            }
            guard source.size == file.size, let sha256 = source.sha256 else {
                throw Self.mismatch(file.path, "is \(file.size) bytes in the pack but \(source.size) in its index", pack: pack)
            }
            listed.remove(file.path)
            files.append(InstalledFile(path: file.path, kind: file.kind, size: file.size, sha256: sha256.lowercased(), crc32: file.crc32))
        }
        if let missing = listed.min() {
            throw Self.mismatch(missing, "is in the pack's index but not in the pack", pack: pack)
        }
        let folders = Set(summary.directories)
        if let missing = self.entries.values.filter({ $0.kind == .directory && !folders.contains($0.path) }).map(\.path).min() {
            throw Self.mismatch(missing, "is a folder in the pack's index but not in the pack", pack: pack)
        }
        return files
    }

    /// The files, each regular file hashed from `root` (symlinks keep the digest the unpack made of their target):
    /// for an unpack that left the digests to an index that then could not be used.
    ///
    /// - Parameters:
    ///   - files: the unpacked files.
    ///   - root: the folder they were unpacked into.
    ///   - isCancelled: polled between files.
    /// - Throws: `io` when a file cannot be read; `cancelled`.
    static func hashed(_ files: [InstalledFile], in root: URL, isCancelled: () -> Bool) throws(PackDeliveryError) -> [InstalledFile] {
        var hashed = files
        for number in hashed.indices where hashed[number].kind == .file {
            if isCancelled() { throw PackDeliveryError.stopped("The install was stopped.") }
            hashed[number].sha256 = try SHA256Hasher.hexDigest(ofFile: root.appending(path: hashed[number].path))
        }
        return hashed
    }

    private static func mismatch(_ path: String, _ problem: String, pack: String) -> PackDeliveryError {
        PackDeliveryError(
            .indexMismatch,
            message:
                "The index of the pack \(PackDeliveryError.printable(pack)) does not describe the pack: \(PackDeliveryError.printable(path)) \(problem).",
            hint:
                "Nothing was installed and the installed version is untouched; the publisher must publish an index made from this very pack.",
            subject: path)
    }
}
