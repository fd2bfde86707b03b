import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A pack encrypted for a preload: downloaded before its release, installed once its key (``PreloadKey``) is out.
///
/// The file is the plain pack's bytes encrypted in place with AES-256-GCM, segment by segment, followed by a trailer.
/// Each segment is one range of the pack's index (a chunk's stored bytes: a range of a plain tar, a zstd frame, a gzip
/// member), and the bytes between them (tar headers, padding, the seek table) are segments of up to 1 MiB. The
/// ciphertext has the plaintext's length, so every range of the pack's index lies where it lies in the plain pack: a
/// chunk fetched with a range request is decrypted and checked alone, and a download resumes from any byte.
///
/// The trailer: per segment, its length (UInt64, little-endian) and GCM tag (16 bytes); then the key's id (16 bytes),
/// the pack's salt (16 bytes), the plain length (UInt64), the segment count (UInt64) and the magic `PDPRELD1`.
public enum PreloadPack {
    static let magic = Array("PDPRELD1".utf8)
    static let footerLength = 16 + 16 + 8 + 8 + 8
    static let entryLength = 8 + PreloadCipher.tagLength
    /// The longest segment between two ranges of the index.
    static let gapLimit: Int64 = 1 << 20

    /// One encrypted range of the pack.
    public struct Segment: Sendable, Hashable {
        /// Where it starts, in the pack and in the plain pack.
        public var offset: Int64
        /// Its length.
        public var length: Int64
        /// Its GCM tag.
        var tag: [UInt8]
    }

    /// What a preload pack's trailer says.
    public struct Layout: Sendable, Hashable {
        /// The id of the key it is encrypted with (``PreloadKey/keyID``).
        public var keyID: String
        /// The length of the plain pack (and of the ciphertext before the trailer).
        public var plainLength: Int64
        /// The segments, in order, covering the plain length.
        public var segments: [Segment]
        var salt: [UInt8]

        /// The segment that starts at `offset`, or nil.
        public func segment(at offset: Int64) -> Segment? {
            var (low, high) = (0, self.segments.count)
            while low < high {
                let middle = (low + high) / 2
                if self.segments[middle].offset < offset { low = middle + 1 } else { high = middle }
            }
            return low < self.segments.count && self.segments[low].offset == offset ? self.segments[low] : nil
        }
    }

    /// The segments of a plain pack of `length` bytes: each range of its index's chunks, and the gaps between them in
    /// pieces of at most ``gapLimit``.
    static func segments(length: Int64, index: PackIndex?) -> [(offset: Int64, length: Int64)] {
        var ranges = Set<[Int64]>()
        for entry in index?.entries ?? [] {
            for chunk in entry.chunks ?? [] where chunk.length > 0 && chunk.offset >= 0 && chunk.offset + chunk.length <= length {
                ranges.insert([chunk.offset, chunk.length])
            }
        }
        var result: [(offset: Int64, length: Int64)] = []
        var position: Int64 = 0
        func gap(to end: Int64) {
            while position < end {
                let step = min(Self.gapLimit, end - position)
                result.append((position, step))
                position += step
            }
        }
        for range in ranges.sorted(by: { $0[0] < $1[0] }) where range[0] >= position {
            gap(to: range[0])
            result.append((range[0], range[1]))
            position = range[0] + range[1]
        }
        gap(to: length)
        return result
    }

    /// Reads the trailer of the preload pack at `url`.
    ///
    /// - Parameters:
    ///   - url: the encrypted pack.
    ///   - name: the pack's name for errors (its content identifier).
    /// - Throws: `corruptArchive` naming the pack when it has no valid trailer; `io` when it cannot be read.
    public static func layout(of url: URL, name: String) throws(PackDeliveryError) -> Layout {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open", path: url.path, errno: errno) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw .io("stat", path: url.path, errno: errno) }
        return try Self.layout(fd: fd, size: Int64(info.st_size), path: url.path, name: name)
    }

    static func layout(fd: Int32, size: Int64, path: String, name: String) throws(PackDeliveryError) -> Layout {
        func corrupt() -> PackDeliveryError {
            PackDeliveryError(
                .corruptArchive, message: "The preload pack \(PackDeliveryError.printable(name)) has no valid segment table.",
                hint: "Fetch it again.", subject: name)
        }
        guard size >= Int64(Self.footerLength) else { throw corrupt() }
        let footer = try Self.read(fd, at: size - Int64(Self.footerLength), count: Self.footerLength, path: path)
        guard Array(footer[48..<56]) == Self.magic else { throw corrupt() }
        let plainLength = Int64(littleEndian: footer[32..<40].withUnsafeBytes { $0.loadUnaligned(as: Int64.self) })
        let count = Int64(littleEndian: footer[40..<48].withUnsafeBytes { $0.loadUnaligned(as: Int64.self) })
        let tableLength = count.multipliedReportingOverflow(by: Int64(Self.entryLength))
        guard plainLength >= 0, count >= 0, !tableLength.overflow,
            plainLength + tableLength.partialValue + Int64(Self.footerLength) == size
        else { throw corrupt() }
        let table = try Self.read(fd, at: plainLength, count: Int(tableLength.partialValue), path: path)
        var segments: [Segment] = []
        segments.reserveCapacity(Int(count))
        var offset: Int64 = 0
        for item in 0..<Int(count) {
            let base = item * Self.entryLength
            let length = Int64(littleEndian: table[base..<base + 8].withUnsafeBytes { $0.loadUnaligned(as: Int64.self) })
            guard length > 0, length <= plainLength - offset else { throw corrupt() }
            segments.append(Segment(offset: offset, length: length, tag: Array(table[base + 8..<base + Self.entryLength])))
            offset += length
        }
        guard offset == plainLength else { throw corrupt() }
        return Layout(
            keyID: SHA256Hasher.hex(Array(footer[0..<16])), plainLength: plainLength, segments: segments, salt: Array(footer[16..<32]))
    }

    /// Decrypts one segment's bytes in place (a chunk fetched alone with a range request).
    ///
    /// - Parameters:
    ///   - bytes: the segment's ciphertext; its plaintext afterwards.
    ///   - segment: the segment, from the pack's ``Layout``.
    ///   - layout: the pack's layout.
    ///   - key: the pack's key.
    ///   - name: the pack's name for errors.
    /// - Throws: `preloadKeyMismatch` when the key is not the pack's; `preloadDecryptionFailed` naming the pack when
    ///   the bytes are not those encrypted there.
    public static func decrypt(
        _ bytes: inout [UInt8], segment: Segment, layout: Layout, key: PreloadKey, name: String
    ) throws(PackDeliveryError) {
        try Self.check(key, layout: layout, name: name)
        let cipher = PreloadCipher(key: key, salt: layout.salt)
        guard Int64(bytes.count) == segment.length,
            bytes.withUnsafeMutableBytes({ cipher.decrypt($0, offset: segment.offset, tag: segment.tag) })
        else { throw Self.tampered(name, offset: segment.offset) }
    }

    static func check(_ key: PreloadKey, layout: Layout, name: String) throws(PackDeliveryError) {
        guard key.keyID == layout.keyID else {
            throw PackDeliveryError(
                .preloadKeyMismatch,
                message: "The key given for the preload pack \(PackDeliveryError.printable(name)) is not its key.",
                hint: "The encrypted pack is kept; install it with its own key.", subject: name)
        }
    }

    static func tampered(_ name: String, offset: Int64) -> PackDeliveryError {
        PackDeliveryError(
            .preloadDecryptionFailed,
            message:
                "The preload pack \(PackDeliveryError.printable(name)) does not decrypt at byte \(offset): its bytes are not those that were encrypted.",
            hint: "The encrypted pack is kept; fetch it again.", subject: name)
    }

    static func read(_ fd: Int32, at offset: Int64, count: Int, path: String) throws(PackDeliveryError) -> [UInt8] {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(count, 1), alignment: 16)
        defer { buffer.deallocate() }
        let bytes = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<count])
        try Self.read(fd, into: bytes, at: offset, path: path)
        return Array(bytes)
    }

    static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, path: String) throws(PackDeliveryError) {
        var done = 0
        while done < buffer.count {
            let count = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                throw .io("read", path: path, errno: errno)
            }
            if count == 0 { throw .io("read", path: path, errno: EIO) }
            done += count
        }
    }

    static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, path: String) throws(PackDeliveryError) {
        if let failed = Self.writeAll(fd, buffer) { throw .io("write", path: path, errno: failed) }
    }

    static func write(_ fd: Int32, _ bytes: [UInt8], path: String) throws(PackDeliveryError) {
        let failed = bytes.withUnsafeBytes { Self.writeAll(fd, $0) }
        if let failed { throw .io("write", path: path, errno: failed) }
    }

    /// Writes the whole buffer; the errno of a failure, or nil.
    private static func writeAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) -> Int32? {
        var done = 0
        while done < buffer.count {
            let count = Glibc.write(fd, buffer.baseAddress! + done, buffer.count - done)
            if count < 0 {
                if errno == EINTR { continue }
                return errno
            }
            done += count
        }
        return nil
    }
}
