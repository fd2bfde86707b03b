import Foundation

/// A zip names each file twice: in the local header before its data, and in the central directory at the end.
/// Tools disagree about which to believe (libarchive takes the local header's name, `unzip` the central
/// directory's), so a zip whose two names differ unpacks to different files in different tools: a way to get a
/// file past a review. Such a zip is refused before anything is unpacked.
///
/// Only the structure is read (APPNOTE 4.3.7, 4.3.12, 4.3.16, and the ZIP64 records 4.3.14–4.3.15): the end
/// record, the central directory, and each local header it points at. A file that is not a zip, or whose
/// structure cannot be followed, is left to libarchive, which refuses what it cannot read.
enum ZipDirectories {
    /// The largest central directory read (a pack's directory of 100,000 entries is about 10 MiB).
    static let maxDirectory = 64 << 20

    /// One file of a zip as its central directory describes it, with the name its local header gives.
    struct Entry: Sendable, Hashable {
        /// The name in the central directory, as stored.
        var name: [UInt8]
        /// The name in the entry's local header, as stored.
        var localName: [UInt8]
        /// The compression method (0 stored, 8 deflate, …).
        var method: UInt16
        /// Where the local header starts.
        var localOffset: Int64
        /// The unix mode from the external attributes, when the entry was made on unix (a symlink, an executable).
        var unixMode: Int? = nil
        /// The CRC-32 in the central directory.
        var crc: UInt32 = 0
        /// The CRC-32 that a read by local headers checks the data against: the local header's, or the data
        /// descriptor's when the entry has one; nil when the descriptor cannot be found.
        var localCRC: UInt32? = nil
        /// The general purpose flags in the central directory (bit 0: encrypted).
        var flags: UInt16 = 0
        /// Where the entry's data starts: after its local header's name and extra field.
        var dataOffset: Int64 = 0
        /// The length of its stored (compressed) data, as the central directory gives it.
        var compressedSize: Int64 = 0
    }

    /// A zip's entries in central-directory order, and where the central directory starts.
    struct Listing: Sendable, Hashable {
        var entries: [Entry]
        var directoryOffset: Int64
    }

    /// - Parameter archive: the complete pack.
    /// - Throws: `unsafeEntry` naming the first file whose two names differ.
    static func check(_ archive: URL) throws(PackDeliveryError) {
        guard let listing = try Self.listing(archive) else { return }
        try Self.check(listing)
    }

    /// The same, for a directory already read.
    static func check(_ listing: Listing) throws(PackDeliveryError) {
        for entry in listing.entries where entry.localName != entry.name {
            let shown = PackDeliveryError.printable(String(decoding: entry.name, as: UTF8.self))
            throw PackDeliveryError(
                .unsafeEntry,
                message:
                    "The zip's central directory and its local headers disagree about '\(shown)' (the local header says '\(PackDeliveryError.printable(String(decoding: entry.localName, as: UTF8.self)))'): tools would unpack different files from it.",
                hint: "Nothing was installed; rebuild the pack with a standard zip tool.", subject: shown)
        }
    }

    /// Reads a zip's directory; nil when the file is not a zip or its structure cannot be followed.
    static func listing(_ archive: URL) throws(PackDeliveryError) -> Listing? {
        let fd = open(archive.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open the pack", path: archive.path, errno: errno) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_size >= 22, Self.read(fd, at: 0, count: 2) == [0x50, 0x4B] else { return nil }
        let size = Int64(info.st_size)
        guard let directory = Self.directory(size: size, read: { offset, count in Self.read(fd, at: offset, count: count) }) else {
            return nil
        }
        var listing = Listing(entries: [], directoryOffset: directory.offset)
        for central in directory.entries {
            let localOffset = central.localOffset
            guard localOffset <= size - 30, let local = Self.read(fd, at: localOffset, count: 30), Self.u32(local, 0) == 0x0403_4B50
            else { return nil }
            let localName = Self.read(fd, at: localOffset + 30, count: Int(Self.u16(local, 26))) ?? []
            var localCRC: UInt32? = Self.u32(local, 14)
            if Self.u16(local, 6) & 0x8 != 0 {
                // A data descriptor follows the data: its CRC (after an optional signature) is the one checked.
                let after = localOffset + 30 + Int64(Self.u16(local, 26)) + Int64(Self.u16(local, 28)) + central.compressedSize
                localCRC =
                    central.compressedSize < 0
                    ? nil : Self.read(fd, at: after, count: 8).map { Self.u32($0, 0) == 0x0807_4B50 ? Self.u32($0, 4) : Self.u32($0, 0) }
            }
            listing.entries.append(
                Entry(
                    name: central.name, localName: localName, method: central.method, localOffset: localOffset,
                    unixMode: central.unixMode, crc: central.crc, localCRC: localCRC, flags: central.flags,
                    dataOffset: localOffset + 30 + Int64(Self.u16(local, 26)) + Int64(Self.u16(local, 28)),
                    compressedSize: central.compressedSize))
        }
        return listing
    }

    /// One file of a zip as its central directory alone describes it.
    struct Central: Sendable, Hashable {
        /// The name, as stored.
        var name: [UInt8]
        /// The general purpose flags (bit 0: encrypted; bit 3: sizes in a data descriptor).
        var flags: UInt16
        /// The compression method (0 stored, 8 deflate, …).
        var method: UInt16
        var crc: UInt32
        /// The sizes, from the ZIP64 extra field when saturated; -1 when a saturated one is missing there.
        var compressedSize: Int64
        var size: Int64
        /// Where the local header starts (at least 0).
        var localOffset: Int64
        /// The unix mode from the external attributes, when the entry was made on unix (a symlink, an executable).
        var unixMode: Int?
    }

    /// A zip's central directory: its entries in order, and where it lies.
    struct Directory: Sendable, Hashable {
        var entries: [Central]
        var offset: Int64
        var size: Int64
    }

    /// Reads a zip's central directory through `read`, which gives `count` bytes at an offset of a zip of `size`
    /// bytes (nil when it cannot): the end record within the last 64 KiB + 22 bytes, the ZIP64 records it points
    /// at, and the directory, of at most ``maxDirectory`` bytes. Local headers are not read.
    /// - Returns: nil when the structure cannot be followed.
    static func directory<Failure: Error>(size: Int64, read: (Int64, Int) throws(Failure) -> [UInt8]?) throws(Failure) -> Directory? {
        guard size >= 22 else { return nil }
        // The end record: the last "PK\5\6" within the last 64 KiB + 22 bytes (a comment may follow it). Most zips
        // have no comment, so the last 42 bytes (the record and the ZIP64 locator before it) are read first.
        let shortStart = max(0, size - 42)
        guard let short = try read(shortStart, Int(size - shortStart)), short.count == Int(size - shortStart) else { return nil }
        var tail = short
        var end = short.count - 22
        if Self.u32(short, end) != 0x0605_4B50 {
            let tailStart = max(0, size - 65_557)
            guard let window = try read(tailStart, Int(size - tailStart)), window.count == Int(size - tailStart),
                let found = (0...(window.count - 22)).reversed().first(where: { Self.u32(window, $0) == 0x0605_4B50 })
            else { return nil }
            (tail, end) = (window, found)
        }
        var entries = Int64(Self.u16(tail, end + 10))
        var directorySize = Int64(Self.u32(tail, end + 12))
        var directoryOffset = Int64(Self.u32(tail, end + 16))
        if entries == 0xFFFF || directorySize == 0xFFFF_FFFF || directoryOffset == 0xFFFF_FFFF {
            // ZIP64: the locator just before the end record points at the ZIP64 end record.
            guard end >= 20, Self.u32(tail, end - 20) == 0x0706_4B50 else { return nil }
            let recordOffset = Int64(truncatingIfNeeded: Self.u64(tail, end - 20 + 8))
            guard recordOffset >= 0, recordOffset <= size - 56, let record = try read(recordOffset, 56), record.count == 56,
                Self.u32(record, 0) == 0x0606_4B50
            else { return nil }
            entries = Int64(truncatingIfNeeded: Self.u64(record, 32))
            directorySize = Int64(truncatingIfNeeded: Self.u64(record, 40))
            directoryOffset = Int64(truncatingIfNeeded: Self.u64(record, 48))
        }
        guard entries >= 0, directorySize >= 0, directorySize <= Self.maxDirectory, directoryOffset >= 0,
            directoryOffset <= size - directorySize,
            let directory = try read(directoryOffset, Int(directorySize)), directory.count == Int(directorySize)
        else { return nil }
        var result = Directory(entries: [], offset: directoryOffset, size: directorySize)
        var position = 0
        for _ in 0..<entries {
            guard position + 46 <= directory.count, Self.u32(directory, position) == 0x0201_4B50 else { return nil }
            let nameLength = Int(Self.u16(directory, position + 28))
            let extraLength = Int(Self.u16(directory, position + 30))
            let commentLength = Int(Self.u16(directory, position + 32))
            guard position + 46 + nameLength + extraLength <= directory.count else { return nil }
            let (uncompressedSize, compressedSize, localOffset) = Self.sizesAndOffset(
                uncompressed: Self.u32(directory, position + 24), compressed: Self.u32(directory, position + 20),
                offset: Self.u32(directory, position + 42),
                extra: Array(directory[(position + 46 + nameLength)..<(position + 46 + nameLength + extraLength)]))
            guard localOffset >= 0 else { return nil }
            let madeOnUnix = Self.u16(directory, position + 4) >> 8 == 3
            let mode = Int(Self.u32(directory, position + 38) >> 16)
            result.entries.append(
                Central(
                    name: Array(directory[(position + 46)..<(position + 46 + nameLength)]), flags: Self.u16(directory, position + 8),
                    method: Self.u16(directory, position + 10), crc: Self.u32(directory, position + 16), compressedSize: compressedSize,
                    size: uncompressedSize, localOffset: localOffset, unixMode: madeOnUnix && mode != 0 ? mode : nil))
            position += 46 + nameLength + extraLength + commentLength
        }
        return result
    }

    /// An entry's sizes and local header offset: its 32-bit fields, or for those saturated (0xFFFFFFFF) the ZIP64
    /// extra field's values, which hold the saturated fields only, in the order uncompressed size, compressed size,
    /// offset; -1 when a saturated one is missing there (or does not fit an `Int64`).
    private static func sizesAndOffset(uncompressed: UInt32, compressed: UInt32, offset: UInt32, extra: [UInt8]) -> (
        uncompressed: Int64, compressed: Int64, offset: Int64
    ) {
        var values = [uncompressed, compressed, offset].map { $0 == 0xFFFF_FFFF ? -1 : Int64($0) }
        var position = 0
        while position + 4 <= extra.count {
            let length = Int(Self.u16(extra, position + 2))
            if Self.u16(extra, position) == 0x0001 {
                var at = position + 4
                for index in values.indices where values[index] == -1 && at + 8 <= min(position + 4 + length, extra.count) {
                    values[index] = Int64(exactly: Self.u64(extra, at)) ?? -1
                    at += 8
                }
                break
            }
            position += 4 + length
        }
        return (values[0], values[1], values[2])
    }

    private static func read(_ fd: Int32, at offset: Int64, count: Int) -> [UInt8]? {
        guard count >= 0, offset >= 0 else { return nil }
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let got = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, count - done, off_t(offset) + off_t(done)) }
            if got < 0, errno == EINTR { continue }
            guard got > 0 else { return nil }
            done += got
        }
        return bytes
    }

    private static func u16(_ bytes: [UInt8], _ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
    private static func u32(_ bytes: [UInt8], _ at: Int) -> UInt32 { UInt32(Self.u16(bytes, at)) | UInt32(Self.u16(bytes, at + 2)) << 16 }
    private static func u64(_ bytes: [UInt8], _ at: Int) -> UInt64 { UInt64(Self.u32(bytes, at)) | UInt64(Self.u32(bytes, at + 4)) << 32 }
}
