import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The folder `packs serve` serves, and the one rule for what inside it may be served.
///
/// Paths are handled as bytes from the request to the file system: the request path is
/// percent-decoded into bytes, the candidate is resolved with `realpath(3)`, and the result must
/// lie inside the root **component by component, byte for byte**. Swift's `String` comparison is
/// not used for this: it treats canonically equivalent Unicode as equal, so a root `café` (NFC)
/// would accept a file under a sibling `café` (NFD). What cannot be resolved (a symbolic link
/// chain whose real path is longer than `PATH_MAX`, a loop, a permission error) is refused, never
/// handed to someone else to open. Dotfiles and dot-folders (`.git/`, `.env`) are refused unless
/// ``allowsDotfiles`` is set, both in the request and in the resolved path (a link to one); a file `healthz` at the
/// root (the health check's path) never is.
struct ServedFolder: Sendable {
    /// The root as given to the file system (absolute, symbolic links resolved).
    let rootPath: String
    /// The root's components, as bytes.
    let rootComponents: [[UInt8]]
    /// Whether names starting with `.` may be served.
    let allowsDotfiles: Bool

    /// What a request path leads to.
    enum Resolution {
        /// A regular file inside the root, opened for reading.
        case file(ResolvedFile)
        /// A folder inside the root; `canonicalPath` is the request path rebuilt from its segments.
        case folder(canonicalPath: String)
        /// Nothing there (404).
        case missing
        /// Refused: outside the root, a dotfile, unresolvable, or not a regular file (404 too: the
        /// client learns nothing about what exists).
        case refused
        /// A malformed path: `..` or `.` segments, NUL, bad percent-encoding (400).
        case malformed
    }

    /// - Parameters:
    ///   - directory: The folder to serve.
    ///   - allowsDotfiles: Whether names starting with `.` may be served.
    /// - Throws: ``PackServerError/directoryNotFound(_:)`` when it does not exist or is not a folder.
    init(directory: URL, allowsDotfiles: Bool) throws {
        let path = directory.standardizedFileURL.path
        guard let resolved = Self.realPath(Array(path.utf8)) else {
            throw PackServerError.directoryNotFound(path)
        }
        var info = Glibc.stat()
        guard Self.statPath(resolved, &info), (info.st_mode & S_IFMT) == S_IFDIR else {
            throw PackServerError.directoryNotFound(path)
        }
        self.rootPath = String(decoding: resolved, as: UTF8.self)
        self.rootComponents = Self.components(resolved)
        self.allowsDotfiles = allowsDotfiles
    }

    /// Resolves a request path that is still percent-encoded (as in the request line).
    func resolve(encodedPath: String) -> Resolution {
        guard let decoded = Self.percentDecoded(encodedPath) else { return .malformed }
        return self.resolve(decodedPath: decoded)
    }

    /// Resolves a request path whose percent-encoding has already been removed.
    func resolve(decodedPath: [UInt8]) -> Resolution {
        guard decodedPath.first == UInt8(ascii: "/"), !decodedPath.contains(0) else { return .malformed }
        let segments = decodedPath.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true).map(Array.init)
        if segments.contains(where: { $0 == [UInt8(ascii: ".")] || $0 == [UInt8(ascii: "."), UInt8(ascii: ".")] }) {
            return .malformed
        }
        if !self.allowsDotfiles, segments.contains(where: { $0.first == UInt8(ascii: ".") }) {
            return .refused
        }
        var candidate = Array(self.rootPath.utf8)
        for segment in segments {
            candidate.append(UInt8(ascii: "/"))
            candidate.append(contentsOf: segment)
        }
        guard let resolved = Self.realPath(candidate) else {
            // ENOENT and ENOTDIR mean nothing is there; anything else (ENAMETOOLONG, ELOOP, EACCES)
            // means it cannot be checked, and what cannot be checked is not served.
            return errno == ENOENT || errno == ENOTDIR ? .missing : .refused
        }
        let components = Self.components(resolved)
        guard components.count >= self.rootComponents.count,
            zip(components, self.rootComponents).allSatisfy({ $0 == $1 })
        else { return .refused }
        if !self.allowsDotfiles, components.dropFirst(self.rootComponents.count).contains(where: { $0.first == UInt8(ascii: ".") }) {
            return .refused
        }
        // `/healthz` is the health check's, whatever leads to it (`/%68ealthz`, `//healthz`, a link to it).
        if components.count == self.rootComponents.count + 1, components.last == Self.healthz { return .refused }
        var info = Glibc.stat()
        guard Self.statPath(resolved, &info) else { return .refused }
        switch info.st_mode & S_IFMT {
        case S_IFDIR:
            let rebuilt = segments.map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
            return .folder(canonicalPath: "/" + rebuilt)
        case S_IFREG:
            // Opened without following a link swapped in since realpath (O_NOFOLLOW on the last
            // component), then checked to be the file that was resolved.
            let fd = (resolved + [0]).withUnsafeBufferPointer { bytes in
                bytes.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) }
            }
            guard fd >= 0 else { return .refused }
            var opened = Glibc.stat()
            guard fstat(fd, &opened) == 0, opened.st_ino == info.st_ino, opened.st_dev == info.st_dev,
                (opened.st_mode & S_IFMT) == S_IFREG
            else {
                close(fd)
                return .refused
            }
            return .file(ResolvedFile(file: OpenFile(fd: fd), status: FileStatus(opened)))
        default:
            // FIFOs, sockets and devices: opening a FIFO would block, a device could be anything.
            return .refused
        }
    }

    /// The root file never served: its name is the health check's path.
    private static let healthz = Array("healthz".utf8)

    // MARK: - Bytes

    /// The components of an absolute path, as bytes (`/a/b` → `[a, b]`).
    static func components(_ path: [UInt8]) -> [[UInt8]] {
        path.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true).map(Array.init)
    }

    /// `realpath(3)` on bytes; `nil` (with `errno` set) when it fails.
    static func realPath(_ path: [UInt8]) -> [UInt8]? {
        let resolved: UnsafeMutablePointer<CChar>? = (path + [0]).withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { realpath($0.baseAddress!, nil) }
        }
        guard let resolved else { return nil }
        defer { free(resolved) }
        return Array(UnsafeRawBufferPointer(start: resolved, count: strlen(resolved)))
    }

    private static func statPath(_ path: [UInt8], _ info: inout stat) -> Bool {
        (path + [0]).withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { fstatat(AT_FDCWD, $0.baseAddress!, &info, 0) == 0 }
        }
    }

    /// Percent-decodes into bytes; `nil` for a `%` not followed by two hex digits.
    static func percentDecoded(_ text: some StringProtocol) -> [UInt8]? {
        var output: [UInt8] = []
        output.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                output.append(byte)
                continue
            }
            guard let high = iterator.next().flatMap(Self.hexValue), let low = iterator.next().flatMap(Self.hexValue) else {
                return nil
            }
            output.append(high << 4 | low)
        }
        return output
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// A file descriptor open for reading, closed when the last reference goes away.
///
/// Sendable because the descriptor never changes and `pread` on one descriptor from several
/// threads is safe (it does not use the file offset).
final class OpenFile: Sendable {
    let fd: Int32

    init(fd: Int32) {
        self.fd = fd
    }

    deinit {
        close(self.fd)
    }
}

/// A regular file inside the served folder: its open descriptor and what `fstat` said about it,
/// so that validators, length and bytes all come from the same inode even if the file is replaced
/// while it is being served.
struct ResolvedFile: Sendable {
    let file: OpenFile
    let status: FileStatus
}
