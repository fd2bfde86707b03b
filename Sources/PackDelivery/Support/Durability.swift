import CLinux
import Foundation

/// Making files and folders durable, in the order SQLite, LevelDB and git use since the ALICE study
/// (OSDI 2014): write the data, sync the files, sync their folders, rename, sync the parent folder,
/// and only then commit the record that points at the result.
enum Durability {
    /// Above this many files, one `syncfs` of the filesystem beats an `fsync` per file.
    ///
    /// Measured on ext4 (virtio disk, 2 cores): 10,000 files of 4 KB took 20.5 s with an `fsync` per file
    /// and folder, 3.1 s with eight threads doing it, and 0.27 s with one `syncfs` (1.3 s with 512 MiB of
    /// other dirty data on the filesystem, which `syncfs` writes too). One file of 256 MiB took 0.50 s with
    /// `fsync` and 1.08 s with `syncfs`, which also flushed the 512 MiB archive beside it. So: `fsync` for
    /// few files, `syncfs` for many. See Benchmarks/RESULTS.md.
    static let syncfsAbove = 64

    /// How a tree was made durable.
    enum Method: String, Sendable { case fsync, syncfs }

    /// Makes an unpacked tree durable: its files' data and its folders' entries.
    ///
    /// - Parameters:
    ///   - root: the tree's root folder.
    ///   - files: the regular files in it (relative paths); symlinks need no sync of their own.
    ///   - directories: every folder in it, relative (`""` is the root).
    /// - Returns: the method used.
    @discardableResult
    static func syncTree(_ root: URL, files: [InstalledFile], directories: [String]) throws(PackDeliveryError) -> Method {
        let regular = files.filter { $0.kind == .file }
        if regular.count > Self.syncfsAbove {
            let fd = open(root.path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw .io("open", path: root.path, errno: errno) }
            defer { close(fd) }
            if clinux_syncfs(fd) != 0 { throw .io("sync the filesystem of", path: root.path, errno: errno) }
            return .syncfs
        }
        for file in regular { try Self.sync(root.appending(path: file.path).path, directory: false) }
        for directory in directories.reversed() {
            try Self.sync(directory.isEmpty ? root.path : root.appending(path: directory).path, directory: true)
        }
        return .fsync
    }

    /// `fsync` of a folder, so that the entries created, renamed or removed in it are durable.
    static func syncFolder(_ url: URL) throws(PackDeliveryError) {
        try Self.sync(url.path, directory: true)
    }

    /// `fsync` of a file, so that its data is durable (a preload's ciphertext, kept until its release).
    static func syncFile(_ url: URL) throws(PackDeliveryError) {
        try Self.sync(url.path, directory: false)
    }

    /// `fdatasync` of a file's data (not its times), for the partial download.
    static func syncData(_ fd: Int32) -> Int32 {
        fdatasync(fd) == 0 ? 0 : errno
    }

    private static func sync(_ path: String, directory: Bool) throws(PackDeliveryError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (directory ? O_DIRECTORY : 0))
        guard fd >= 0 else { throw .io("open", path: path, errno: errno) }
        defer { close(fd) }
        // EINVAL: a filesystem that cannot sync folders (some FUSE ones); their entries are as durable as they get.
        if fsync(fd) != 0, errno != EINVAL { throw .io("sync", path: path, errno: errno) }
    }

    /// The files of an installed tree, hashed by reading them (recovery after a crash, when the
    /// hashes made while unpacking were lost with the process).
    static func scan(_ root: URL) throws(PackDeliveryError) -> [InstalledFile] {
        var files: [InstalledFile] = []
        let enumerator = FileManager.default.enumerator(atPath: root.path)
        while let relative = enumerator?.nextObject() as? String {
            let path = root.appending(path: relative).path
            var info = stat()
            guard lstat(path, &info) == 0 else { throw .io("inspect", path: path, errno: errno) }
            switch info.st_mode & S_IFMT {
            case S_IFREG:
                files.append(
                    InstalledFile(
                        path: relative, kind: .file, size: Int64(info.st_size),
                        sha256: try SHA256Hasher.hexDigest(ofFile: URL(filePath: path))))
            case S_IFLNK:
                let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? ""
                let hasher = SHA256Hasher()
                Array(target.utf8).withUnsafeBytes { hasher.update($0) }
                files.append(InstalledFile(path: relative, kind: .symlink, size: Int64(target.utf8.count), sha256: hasher.hexDigest()))
            default:
                continue
            }
        }
        return files.sorted { $0.path < $1.path }
    }
}
