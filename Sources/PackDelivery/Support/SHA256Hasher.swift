import CCrypto
import Foundation

/// Incremental SHA-256 over OpenSSL's libcrypto (measured faster here than swift-crypto: ≈320 vs ≈200 MB/s).
///
/// Owns one `EVP_MD_CTX`; not `Sendable`: use it from one thread at a time.
final class SHA256Hasher {
    private let context: OpaquePointer

    init() {
        guard let context = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new failed: out of memory") }
        self.context = context
        self.reset()
    }

    deinit { EVP_MD_CTX_free(self.context) }

    /// Starts over, as if nothing had been hashed.
    func reset() {
        EVP_DigestInit_ex(self.context, EVP_sha256(), nil)
    }

    func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        EVP_DigestUpdate(self.context, base, bytes.count)
    }

    /// The hex digest of everything hashed so far; the hasher can keep going afterwards.
    func hexDigest() -> String {
        guard let copy = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new failed: out of memory") }
        defer { EVP_MD_CTX_free(copy) }
        EVP_MD_CTX_copy_ex(copy, self.context)
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        EVP_DigestFinal_ex(copy, &digest, &length)
        return Self.hex(digest)
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// Lower-case hex of bytes. (`String(format: "%02x")` per byte cost ≈ 1.5 µs each through Foundation's
    /// formatter: 0.5 s of CPU for the 10,000 file digests of one pack.)
    static func hex(_ bytes: [UInt8]) -> String {
        String(unsafeUninitializedCapacity: bytes.count * 2) { buffer in
            for (index, byte) in bytes.enumerated() {
                buffer[2 * index] = Self.hexDigits[Int(byte >> 4)]
                buffer[2 * index + 1] = Self.hexDigits[Int(byte & 0x0F)]
            }
            return bytes.count * 2
        }
    }

    /// Hashes the first `length` bytes of an open file (used when a transfer resumes on a partial file).
    func update(fileDescriptor fd: Int32, length: Int64) throws(PackDeliveryError) {
        let chunk = 1 << 20
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: chunk, alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while offset < length {
            let want = Int(min(Int64(chunk), length - offset))
            let got = pread(fd, buffer.baseAddress, want, off_t(offset))
            if got < 0 {
                if errno == EINTR { continue }
                throw .io("read", path: "fd \(fd)", errno: errno)
            }
            if got == 0 { break }
            self.update(UnsafeRawBufferPointer(rebasing: buffer[0..<got]))
            offset += Int64(got)
        }
    }

    /// The hex SHA-256 of a whole file.
    static func hexDigest(ofFile url: URL) throws(PackDeliveryError) -> String {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open", path: url.path, errno: errno) }
        defer { close(fd) }
        let hasher = SHA256Hasher()
        try hasher.update(fileDescriptor: fd, length: .max)
        return hasher.hexDigest()
    }
}
