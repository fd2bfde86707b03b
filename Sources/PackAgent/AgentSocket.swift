import Foundation
import NIOCore
import PackDelivery

/// Why the agent could not start listening: its code says which, its message what to do.
public struct AgentStartError: Error, Sendable {
    public enum Code: String, Sendable {
        /// The socket's folder belongs to another uid or is open to others (group or world bits set).
        case unsafeSocketFolder
        /// No socket path: `$XDG_RUNTIME_DIR` is unset and no `--socket` was given.
        case noRuntimeDirectory
        /// The socket could not be created, bound or listened on.
        case listenFailed
    }

    public let code: Code
    public let message: String
}

/// Where and how the agent listens: the Unix socket folder's checks, systemd's socket activation
/// (`LISTEN_FDS`, `sd_listen_fds(3)`), readiness (`NOTIFY_SOCKET`, `sd_notify(3)`), and the peer's uid.
public enum AgentSocket {
    /// `$XDG_RUNTIME_DIR/packs/agent.sock`, the one place clients look for the agent.
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) throws(AgentStartError)
        -> String
    {
        // The library's path, so that a queue and the agent always meet on the same socket.
        guard let path = AgentUse.defaultSocket(environment: environment) else {
            throw AgentStartError(
                code: .noRuntimeDirectory,
                message:
                    "XDG_RUNTIME_DIR is not set, so the agent has no socket path; log in with a session that sets it, or pass --socket PATH."
            )
        }
        return path
    }

    /// Creates the socket's folder 0700 when missing, and refuses one that another uid owns or that others may open.
    public static func prepareFolder(of socketPath: String) throws(AgentStartError) {
        let folder = URL(filePath: socketPath).deletingLastPathComponent().path
        if mkdir(folder, 0o700) == 0 {
            // The umask may have taken bits off, never added any; set exactly 0700.
            _ = chmod(folder, 0o700)
        }
        var info = stat()
        guard lstat(folder, &info) == 0 else {
            throw AgentStartError(
                code: .listenFailed, message: "Cannot create the agent's socket folder \(folder): \(String(cString: strerror(errno))).")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw AgentStartError(code: .unsafeSocketFolder, message: "The agent's socket folder \(folder) is not a folder.")
        }
        guard info.st_uid == getuid() else {
            throw AgentStartError(
                code: .unsafeSocketFolder,
                message:
                    "The agent's socket folder \(folder) belongs to uid \(info.st_uid), not to this user (uid \(getuid())); remove it or pass --socket PATH."
            )
        }
        guard info.st_mode & 0o077 == 0 else {
            throw AgentStartError(
                code: .unsafeSocketFolder,
                message:
                    "The agent's socket folder \(folder) is open to other users (mode \(String(info.st_mode & 0o777, radix: 8))); run chmod 700 \(folder)."
            )
        }
    }

    /// Whether something accepts connections on the socket at `path` now.
    public static func answers(_ path: String) -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { target in
            for (index, byte) in bytes.enumerated() { target[index] = byte }
        }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }

    /// The listening socket systemd passed (fd 3), when `LISTEN_PID` is this process and `LISTEN_FDS` ≥ 1. The
    /// variables are removed so that no child process takes the socket for its own.
    public static func activatedDescriptor() -> Int32? {
        let environment = ProcessInfo.processInfo.environment
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        guard let pid = environment["LISTEN_PID"].flatMap(Int32.init), pid == getpid(),
            let count = environment["LISTEN_FDS"].flatMap(Int.init), count >= 1
        else { return nil }
        let descriptor: Int32 = 3
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        return descriptor
    }

    /// Says `READY=1` on `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket); nothing without it.
    public static func notifyReady() {
        guard let target = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"], !target.isEmpty else { return }
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(target.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { return }
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            for (index, byte) in bytes.enumerated() { path[index] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (bytes.first == 0 ? 0 : 1))
        let message = Array("READY=1".utf8)
        _ = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                message.withUnsafeBytes { sendto(descriptor, $0.baseAddress, $0.count, 0, socketAddress, length) }
            }
        }
    }

    /// The uid of the process at the other end of a Unix socket connection (`SO_PEERCRED`), or nil when the
    /// channel cannot say.
    static func peerUID(_ channel: any Channel) -> EventLoopFuture<uid_t?> {
        guard PeerCredentials.layoutMatches, let provider = channel as? any SocketOptionProvider else {
            return channel.eventLoop.makeSucceededFuture(nil)
        }
        let credentials: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.map { credentials -> uid_t? in credentials.uid }.recover { _ -> uid_t? in nil }
    }

    /// Linux's `struct ucred` (pid, uid, gid: three 32-bit integers, 12 bytes), which Swift's Glibc module does not
    /// import (it needs `_GNU_SOURCE`). A Swift struct of three 32-bit fields has that layout; the size is checked
    /// where it is read.
    struct PeerCredentials: Sendable {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0

        static let layoutMatches = MemoryLayout<PeerCredentials>.size == 12 && MemoryLayout<PeerCredentials>.offset(of: \.uid) == 4
    }
}
