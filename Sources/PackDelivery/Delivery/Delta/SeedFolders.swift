import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Folders on this machine that may hold chunks of a pack (``DownloadQueue/Configuration/seeds``, `packs fetch --seed`):
/// an installed tree of an earlier or the same version, copied to a disk, a share or a backup. Their files are cut
/// for chunks as the installed version's are (``ChunkAssembly/inventory(of:chunker:wanted:isCancelled:dropped:)``):
/// every chunk whose SHA-256 the pack's index gives is copied from there instead of fetched, as casync's `--seed`.
enum SeedFolders {
    /// The regular files of `folder` (never through a symlink), as paths relative to it: first those at a path of a
    /// file of `index` (most likely that file's earlier version, as installed files are matched), then the others in
    /// order of their paths. At most `limit` files are listed.
    ///
    /// - Throws: the error of a folder that cannot be listed (gone, unreadable, a failing disk): the seed is dropped.
    static func files(in folder: URL, index: PackIndex, limit: Int) throws(SeedFailure) -> [String] {
        var files: [String] = []
        var pending: [String] = [""]
        while let relative = pending.popLast(), files.count < limit {
            let path = relative.isEmpty ? folder.path : folder.appending(path: relative).path
            guard let directory = opendir(path) else { throw SeedFailure(errno: errno) }
            defer { closedir(directory) }
            errno = 0
            while let entry = readdir(directory) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                guard name != ".", name != ".." else { continue }
                let child = relative.isEmpty ? name : relative + "/" + name
                var info = stat()
                guard lstat(folder.appending(path: child).path, &info) == 0 else {
                    if errno == ENOENT { continue }
                    throw SeedFailure(errno: errno)
                }
                switch info.st_mode & S_IFMT {
                case S_IFDIR: pending.append(child)
                case S_IFREG where info.st_size > 0: files.append(child)
                default: break
                }
            }
            if errno != 0 { throw SeedFailure(errno: errno) }
        }
        let named = Set(index.entries.lazy.filter { $0.kind == .file }.map(\.path))
        return files.prefix(limit).sorted { a, b in
            let (namedA, namedB) = (named.contains(a), named.contains(b))
            return namedA != namedB ? namedA : a < b
        }
    }

    /// A seed folder that could not be read: the `errno` of the failure.
    struct SeedFailure: Error {
        var errno: Int32
    }

    /// The error a dropped seed is reported with (``DownloadQueue/Configuration/onSeedDropped``): `fileSystem`, naming
    /// the folder; its chunks are fetched instead.
    static func dropped(_ folder: URL, errno: Int32) -> PackDeliveryError {
        PackDeliveryError.io("read the seed folder", path: folder.path, errno: errno)
    }
}
