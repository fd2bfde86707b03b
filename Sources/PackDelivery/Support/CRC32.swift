import Foundation

/// The CRC-32 of zip (ISO 3309, reflected polynomial 0xEDB88320), eight bytes at a time ("slicing by 8").
///
/// A delta update computes it over the installed files it reuses, to compare them with the CRC-32 the new pack's
/// central directory gives their entries: the pack's own word about its bytes, beside the index's SHA-256.
enum CRC32 {
    /// `tables[k][b]`: the CRC of byte `b` followed by `k` zero bytes.
    private static let tables: [[UInt32]] = {
        var tables = [[UInt32]](repeating: [UInt32](repeating: 0, count: 256), count: 8)
        for byte in 0..<256 {
            var crc = UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
            tables[0][byte] = crc
        }
        for byte in 0..<256 {
            for k in 1..<8 { tables[k][byte] = (tables[k - 1][byte] >> 8) ^ tables[0][Int(tables[k - 1][byte] & 0xFF)] }
        }
        return tables
    }()

    /// The CRC-32 of `crc`'s bytes followed by `bytes` (start with 0).
    static func update(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc = ~crc
        Self.tables.withUnsafeBufferPointer { tables in
            let t0 = tables[0]
            let t1 = tables[1]
            let t2 = tables[2]
            let t3 = tables[3]
            let t4 = tables[4]
            let t5 = tables[5]
            let t6 = tables[6]
            let t7 = tables[7]
            var index = 0
            let count = bytes.count
            while index + 8 <= count {
                let low = crc ^ bytes.loadUnaligned(fromByteOffset: index, as: UInt32.self).littleEndian
                let high = bytes.loadUnaligned(fromByteOffset: index + 4, as: UInt32.self).littleEndian
                crc =
                    t7[Int(low & 0xFF)] ^ t6[Int(low >> 8 & 0xFF)] ^ t5[Int(low >> 16 & 0xFF)] ^ t4[Int(low >> 24)]
                    ^ t3[Int(high & 0xFF)] ^ t2[Int(high >> 8 & 0xFF)] ^ t1[Int(high >> 16 & 0xFF)] ^ t0[Int(high >> 24)]
                index += 8
            }
            while index < count {
                crc = (crc >> 8) ^ t0[Int((crc ^ UInt32(bytes[index])) & 0xFF)]
                index += 1
            }
        }
        return ~crc
    }

    /// The CRC-32 of a regular file's bytes (not followed if a symlink), read in 1 MiB blocks.
    ///
    /// - Parameters:
    ///   - path: the file.
    ///   - isCancelled: asked between blocks; when it answers true, nil is returned.
    /// - Returns: the CRC and the number of bytes read, or nil when cancelled.
    /// - Throws: `io` when the file cannot be opened or read.
    static func ofFile(_ path: String, isCancelled: () -> Bool) throws(PackDeliveryError) -> (crc: UInt32, count: Int64)? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { throw Installer.fileError("read", path, errno) }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var crc: UInt32 = 0
        var total: Int64 = 0
        while true {
            if isCancelled() { return nil }
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if got < 0, errno == EINTR { continue }
            if got < 0 { throw Installer.fileError("read", path, errno) }
            if got == 0 { return (crc, total) }
            crc = buffer.withUnsafeBytes { Self.update(crc, UnsafeRawBufferPointer(rebasing: $0[0..<got])) }
            total += Int64(got)
        }
    }
}
