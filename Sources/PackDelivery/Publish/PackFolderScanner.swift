import CArchive
import Foundation

/// One entry to write: its path in the archive and where its bytes come from.
struct PackItem {
    enum Kind: Equatable {
        case directory
        case file
        case symlink([UInt8])
        case generated(Data)
    }

    /// The path inside the archive, `/`-separated, no trailing slash.
    var path: [UInt8]
    /// The path relative to the folder, for items read from it.
    var source: [UInt8]?
    var kind: Kind
    var mode: mode_t
    var size: Int64
    var mtime: (Int, Int)

    var isRegularFile: Bool {
        switch self.kind {
        case .file, .generated: true
        case .directory, .symlink: false
        }
    }
}

/// Lists a folder with `openat`/`fdopendir`/`fstatat`, keeping names as raw bytes.
struct PackFolderScanner {
    let root: String
    let skip: (dev_t, ino_t)?
    private var items: [PackItem] = []

    init(root: String, skip: (dev_t, ino_t)?) {
        self.root = root
        self.skip = skip
    }

    mutating func scan(omittingTopLevel omitted: [UInt8]?) throws(PackDeliveryError) -> [PackItem] {
        let fd = open(self.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw PackWriterErrors.file("open the folder", path: self.root, errno: errno) }
        self.items = []
        try self.scan(directory: fd, relative: [], omitting: omitted)  // closes fd
        return self.items
    }

    /// Scans the open folder `fd` (closed on return) whose path relative to the root is `relative`.
    private mutating func scan(directory fd: Int32, relative: [UInt8], omitting omitted: [UInt8]?) throws(PackDeliveryError) {
        guard let stream = fdopendir(fd) else {
            let code = errno
            close(fd)
            throw PackWriterErrors.file("list the folder", path: self.shown(relative), errno: code)
        }
        defer { closedir(stream) }
        var names: [[UInt8]] = []
        while true {
            errno = 0
            guard let item = readdir(stream) else {
                if errno != 0 { throw PackWriterErrors.file("list the folder", path: self.shown(relative), errno: errno) }
                break
            }
            let name = withUnsafeBytes(of: item.pointee.d_name) { Array($0.prefix(while: { $0 != 0 })) }
            if name == [UInt8(ascii: ".")] || name == [UInt8(ascii: "."), UInt8(ascii: ".")] { continue }
            if let omitted, name == omitted { continue }
            names.append(name)
        }
        names.sort { $0.lexicographicallyPrecedes($1) }
        for name in names {
            let path = relative.isEmpty ? name : relative + [UInt8(ascii: "/")] + name
            var info = stat()
            let status = Self.withCName(name) { fstatat(fd, $0, &info, AT_SYMLINK_NOFOLLOW) }
            if status != 0 { throw PackWriterErrors.file("read the attributes of", path: self.shown(path), errno: errno) }
            if let skip, skip.0 == info.st_dev, skip.1 == info.st_ino { continue }
            let mtime = (Int(info.st_mtim.tv_sec), Int(info.st_mtim.tv_nsec))
            switch info.st_mode & S_IFMT {
            case S_IFDIR:
                self.items.append(PackItem(path: path, source: path, kind: .directory, mode: 0o755, size: 0, mtime: mtime))
                let child = Self.withCName(name) { openat(fd, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
                guard child >= 0 else { throw PackWriterErrors.file("open the folder", path: self.shown(path), errno: errno) }
                try self.scan(directory: child, relative: path, omitting: nil)
            case S_IFREG:
                let mode: mode_t = info.st_mode & 0o100 != 0 ? 0o755 : 0o644
                self.items.append(PackItem(path: path, source: path, kind: .file, mode: mode, size: Int64(info.st_size), mtime: mtime))
            case S_IFLNK:
                var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
                let count = Self.withCName(name) { cName in
                    buffer.withUnsafeMutableBytes { readlinkat(fd, cName, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
                }
                guard count >= 0 else { throw PackWriterErrors.file("read the symlink", path: self.shown(path), errno: errno) }
                self.items.append(
                    PackItem(path: path, source: path, kind: .symlink(Array(buffer[..<count])), mode: 0o777, size: 0, mtime: mtime))
            default:
                throw PackDeliveryError(
                    .invalidArgument, message: "'\(self.shown(path))' is not a file, folder or symlink, so it cannot go into a pack.",
                    hint: "Remove it from the folder, then pack again.", subject: self.shown(path))
            }
        }
    }

    /// Refuses symlinks the unpacker would refuse: absolute, leaving the folder, or passing through
    /// another symlink.
    static func checkSymlinks(_ items: [PackItem], root: String) throws(PackDeliveryError) {
        var symlinks: Set<[UInt8]> = []
        for item in items { if case .symlink = item.kind { symlinks.insert(item.path) } }
        let slash = UInt8(ascii: "/")
        for item in items {
            guard case .symlink(let target) = item.kind else { continue }
            let shown = root + "/" + String(decoding: item.path, as: UTF8.self)
            let shownTarget = String(decoding: target, as: UTF8.self)
            func refuse(_ why: String) -> PackDeliveryError {
                PackDeliveryError(
                    .invalidArgument, message: "The symlink '\(shown)' points to '\(shownTarget)', \(why), so it cannot go into a pack.",
                    hint: "Make it a relative link that stays inside the folder, or replace it with the file.",
                    subject: shown)
            }
            if target.isEmpty || target.first == slash { throw refuse("an absolute path") }
            var state = Array(item.path.split(separator: slash).dropLast().map { Array($0) })
            for part in target.split(separator: slash, omittingEmptySubsequences: true) {
                if part.elementsEqual([UInt8(ascii: ".")]) { continue }
                if symlinks.contains(state.joined(separator: [slash]).map { $0 }) {
                    throw refuse("through another symlink")
                }
                if part.elementsEqual([UInt8(ascii: "."), UInt8(ascii: ".")]) {
                    if state.isEmpty { throw refuse("outside the folder") }
                    state.removeLast()
                } else {
                    state.append(Array(part))
                }
            }
        }
    }

    private func shown(_ relative: [UInt8]) -> String {
        relative.isEmpty ? self.root : self.root + "/" + String(decoding: relative, as: UTF8.self)
    }

    static func withCName<R>(_ bytes: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        var terminated = bytes
        terminated.append(0)
        return terminated.withUnsafeBytes { body($0.baseAddress!.assumingMemoryBound(to: CChar.self)) }
    }
}

enum PackWriterErrors {
    static func file(_ operation: String, path: String, errno code: Int32) -> PackDeliveryError {
        PackDeliveryError.io(operation, path: path, errno: code)
    }
}

// MARK: - Writing the archive
