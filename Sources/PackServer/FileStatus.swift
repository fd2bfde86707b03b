import Foundation

/// What `stat` says about a requested file, and the validators derived from it.
struct FileStatus: Sendable {
    let isRegularFile: Bool
    let size: Int
    let inode: UInt64
    let modifiedSeconds: Int
    let modifiedNanoseconds: Int

    /// What `fstat` said about an open file.
    init(_ info: stat) {
        self.isRegularFile = (info.st_mode & S_IFMT) == S_IFREG
        self.size = Int(info.st_size)
        self.inode = UInt64(info.st_ino)
        self.modifiedSeconds = Int(info.st_mtim.tv_sec)
        self.modifiedNanoseconds = Int(info.st_mtim.tv_nsec)
    }

    /// A strong entity tag: changes whenever the file is replaced (inode), rewritten (mtime in ns) or
    /// resized. Same idea as nginx's and Apache's tags, with nanoseconds.
    var strongETag: String {
        let nanoseconds = self.modifiedSeconds &* 1_000_000_000 &+ self.modifiedNanoseconds
        return "\"\(String(self.inode, radix: 16))-\(String(nanoseconds, radix: 16))-\(String(self.size, radix: 16))\""
    }

    /// `Last-Modified` as FileMiddleware sends it (IMF-fixdate, whole seconds).
    var lastModifiedHeader: String {
        HTTPDate.format(seconds: self.modifiedSeconds)
    }

    /// `If-Range` (RFC 9110 §13.1.5): a strong tag must equal ours exactly (a weak tag never matches);
    /// a date must equal the modification time to the second.
    func matchesIfRange(_ value: String) -> Bool {
        let value = value.trimmingCharacters(in: .whitespaces)
        if value.hasPrefix("W/") { return false }
        if value.hasPrefix("\"") { return value == self.strongETag }
        guard let seconds = HTTPDate.parse(value) else { return false }
        return seconds == self.modifiedSeconds
    }
}
