import CLinux
import Foundation

/// The new version built by a delta update, ready to be moved into place as an unpacked pack is.
struct DeltaTree: Sendable {
    var folder: URL
    var summary: UnpackSummary
}

/// The installer's side of a delta update, in its folder (`downloads/<id>.delta`): the fetched ranges become one
/// small zip per entry (`e<N>.zip`, made durable before it counts as kept), each is unpacked with the unpacker's
/// checks and compared with the index, and the new version's tree is assembled from them and the installed files.
/// The fetching is ``DeltaTransfer``'s, through the transfer engine.
struct DeltaAssembly {
    /// `downloads/<id>.delta`.
    var folder: URL
    var index: PackIndex
    /// The pack's central directory.
    var directory: ZipDirectories.Directory
    /// The installed version's folder.
    var installed: URL
    var writer: any FileWriting
    var isCancelled: () -> Bool

    /// Thrown when ``isCancelled`` said stop.
    struct Stopped: Error {}

    func entryFile(_ number: Int) -> URL { self.folder.appending(path: "e\(number).zip") }

    /// A complete range's file (the pack's bytes `range.start..<range.end`) split into its entries' files, each made
    /// a zip of its own, synced and renamed into place; then the range's file is removed. A range of one entry
    /// becomes that entry's file without a copy.
    func keep(_ range: DeltaPlan.Range, from file: URL) throws {
        if range.entries.count == 1, let number = range.entries.first, self.index.entries[number].offset == range.start,
            self.index.entries[number].length == range.end - range.start
        {
            let fd = open(file.path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { throw Installer.fileError("open", file.path, errno) }
            defer { close(fd) }
            try self.seal(number, fd: fd, part: file)
            return
        }
        let input = open(file.path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw Installer.fileError("open", file.path, errno) }
        defer { close(input) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        for number in range.entries {
            let entry = self.index.entries[number]
            let part = self.folder.appending(path: "e\(number).part")
            let fd = open(part.path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw Installer.fileError("create", part.path, errno) }
            defer { close(fd) }
            var done: Int64 = 0
            while done < entry.length {
                let count = pread(
                    input, &buffer, Int(min(Int64(buffer.count), entry.length - done)), off_t(entry.offset - range.start + done))
                guard count > 0 else { throw Installer.fileError("read", file.path, count < 0 ? errno : EIO) }
                let written = buffer.withUnsafeBytes { self.writer.pwrite(fd, $0.baseAddress!, count, done) }
                if written != count { throw Self.writeFailure(written, file: part, needed: entry.length) }
                done += Int64(count)
            }
            try self.seal(number, fd: fd, part: part)
        }
        unlink(file.path)
    }

    /// An entry's bytes, in `part`: made a zip of its own, synced, and renamed into place (so a kept `e<N>.zip` is whole).
    private func seal(_ number: Int, fd: Int32, part: URL) throws {
        let entry = self.index.entries[number]
        try DeltaZip.close(fd, entry: entry, central: self.directory.entries[number])
        guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync the fetched entry", path: part.path, errno: errno) }
        guard rename(part.path, self.entryFile(number).path) == 0 else {
            throw PackDeliveryError.io("keep the fetched entry", path: part.path, errno: errno)
        }
    }

    /// Unpacks a fetched entry with the unpacker's checks and compares it with the index.
    /// - Returns: the file, or nil when it does not match (its kept bytes are deleted).
    func verify(_ number: Int) throws -> InstalledFile? {
        let entry = self.index.entries[number]
        let out = self.folder.appending(path: "u\(number)")
        try Installer.removeTree(out)
        if mkdir(out.path, 0o700) != 0 { throw Installer.fileError("create a folder in", out.path, errno) }
        guard
            let file = try DeltaZip.unpack(
                self.entryFile(number), entry: entry, into: out, isCancelled: self.isCancelled, writer: self.writer)
        else {
            // Bytes that are not the entry the index describes: fetched once more.
            unlink(self.entryFile(number).path)
            return nil
        }
        return file
    }

    /// The new version's tree: folders made, fetched entries moved in, unchanged files linked (or copied) from the
    /// installed version, each path checked so that nothing passes through a symlink.
    func assemble(_ plan: DeltaPlan, fetched: [Int: InstalledFile]) throws -> DeltaTree {
        let tree = self.folder.appending(path: "tree")
        try Installer.removeTree(tree)
        if mkdir(tree.path, 0o755) != 0 { throw Installer.fileError("create the new version's folder", tree.path, errno) }
        var directories: Set<String> = [""]
        var files: [InstalledFile] = []
        let reuse = Dictionary(plan.reuse.map { ($0.path, $0) }, uniquingKeysWith: { a, _ in a })
        var bytes: Int64 = 0
        for (number, entry) in self.index.entries.enumerated() {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            let components = try Self.components(entry.path)
            switch entry.kind {
            case .directory:
                try Self.makeDirectories(components, in: tree, made: &directories)
            case .file, .symlink:
                try Self.makeDirectories(Array(components.dropLast()), in: tree, made: &directories)
                let target = tree.appending(path: entry.path)
                // Each file's CRC-32 is the central directory's: a fetched entry was checked against it when it was
                // unpacked, a reused file before the plan was used.
                let crc = self.directory.entries[number].crc
                if var file = fetched[number] {
                    let from = self.folder.appending(path: "u\(number)").appending(path: entry.path)
                    if rename(from.path, target.path) != 0 { throw Installer.fileError("move a fetched entry to", target.path, errno) }
                    if file.kind == .file { file.crc32 = crc }
                    files.append(file)
                } else if let reused = reuse[entry.path] {
                    try self.place(self.installed.appending(path: reused.from), at: target, size: reused.size)
                    files.append(InstalledFile(path: entry.path, kind: .file, size: reused.size, sha256: reused.sha256, crc32: crc))
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
    func place(_ source: URL, at target: URL, size: Int64) throws(PackDeliveryError) {
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
            let written = buffer.withUnsafeBytes { self.writer.pwrite(copy, $0.baseAddress!, count, offset) }
            if written != count { throw Self.writeFailure(written, file: target, needed: size) }
            offset += Int64(count)
        }
        var times = [info.st_atim, info.st_mtim]
        futimens(copy, &times)
    }

    static func components(_ path: String) throws(PackDeliveryError) -> [String] {
        let components = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard !path.isEmpty, !components.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." || $0.utf8.contains(0) }) else {
            throw PackDeliveryError(
                .unsafeEntry, message: "The pack's index names the unsafe path '\(PackDeliveryError.printable(path))'.",
                hint: "Nothing was installed; the pack's index is wrong.", subject: path)
        }
        return components
    }

    /// `mkdir -p` inside `root`, refusing any component that exists and is not a folder (a symlink above all).
    static func makeDirectories(_ components: [String], in root: URL, made: inout Set<String>) throws(PackDeliveryError) {
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
