import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A small ext4 filesystem on a loop device whose power can be "cut": everything written to it that was
/// not yet durable is lost, as on a real power cut.
///
/// The cut is what xfstests' `godown` does: `ioctl(EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH)` stops
/// the filesystem at once without flushing the journal. Then the filesystem is unmounted and mounted
/// again, which replays only the journal transactions that had reached the disk.
///
/// Needs root, loop devices and `mkfs.ext4`; ``unavailableReason`` says what is missing elsewhere.
public final class PowerCutDisk: @unchecked Sendable {
    // Unchecked: the stored properties are constants set in init; the methods are called from one test at a time.
    /// The mount point; what is under it lives on the loop-mounted image.
    public let mountPoint: URL
    private let image: URL

    /// `EXT4_IOC_SHUTDOWN` = `_IOR('X', 125, __u32)`.
    static let shutdownRequest: UInt = 0x8004_587D
    /// `EXT4_GOING_FLAGS_NOLOGFLUSH`: do not flush the journal.
    static let noLogFlush: UInt32 = 2

    /// Why power-cut tests cannot run here, or nil when they can.
    public static let unavailableReason: String? = {
        if getuid() != 0 { return "power-cut tests need root (to mount a loop device)" }
        if access("/dev/loop-control", F_OK) != 0 { return "power-cut tests need loop devices (/dev/loop-control)" }
        if !["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"].contains(where: { (path: String) in access(path, X_OK) == 0 }) {
            return "power-cut tests need mkfs.ext4 (e2fsprogs)"
        }
        return nil
    }()

    /// Makes and mounts a new ext4 filesystem of `megabytes` MiB.
    public init(_ label: String, megabytes: Int = 256) throws {
        let folder = try Fixtures.temporaryDirectory(label)
        self.image = folder.appending(path: "disk.img")
        self.mountPoint = folder.appending(path: "mnt")
        try FileManager.default.createDirectory(at: self.mountPoint, withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: self.image.path, contents: nil), truncate(self.image.path, off_t(megabytes) << 20) == 0
        else {
            throw FixtureError("Cannot make the disk image \(self.image.path).")
        }
        try Self.check(try Fixtures.run(Self.tool("mkfs.ext4"), ["-q", "-F", self.image.path]), "mkfs.ext4")
        try self.mount()
    }

    deinit {
        _ = try? Fixtures.run(Self.tool("umount"), ["-l", self.mountPoint.path])
        try? FileManager.default.removeItem(at: self.image.deletingLastPathComponent())
    }

    /// Cuts the power: from now on nothing reaches the disk, and what was not durable is gone.
    public func cut() throws {
        let fd = open(self.mountPoint.path, O_RDONLY | O_DIRECTORY)
        guard fd >= 0 else { throw FixtureError("Cannot open \(self.mountPoint.path): errno \(errno).") }
        defer { close(fd) }
        var flags = Self.noLogFlush
        guard ioctl(fd, Self.shutdownRequest, &flags) == 0 else {
            throw FixtureError("EXT4_IOC_SHUTDOWN failed on \(self.mountPoint.path): errno \(errno).")
        }
    }

    /// After a cut (and once every process that used it has exited): unmounts and mounts again, as a
    /// machine does when it boots.
    public func remount() throws {
        var attempts = 0
        while true {
            let result = try Fixtures.run(Self.tool("umount"), [self.mountPoint.path])
            if result.status == 0 { break }
            attempts += 1
            if attempts > 50 { throw FixtureError("umount \(self.mountPoint.path) failed: \(result.stderr)") }
            usleep(100_000)
        }
        try self.mount()
    }

    private func mount() throws {
        try Self.check(try Fixtures.run(Self.tool("mount"), ["-o", "loop", self.image.path, self.mountPoint.path]), "mount")
    }

    /// A system tool by absolute path (tests may run with a PATH without /usr/sbin).
    static func tool(_ name: String) -> String {
        ["/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"].map { $0 + name }.first { (path: String) in access(path, X_OK) == 0 } ?? name
    }

    private static func check(_ result: (status: Int32, stdout: String, stderr: String), _ what: String) throws {
        guard result.status == 0 else { throw FixtureError("\(what) failed (\(result.status)): \(result.stderr)") }
    }
}
