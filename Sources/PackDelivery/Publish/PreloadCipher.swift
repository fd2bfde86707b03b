import CCrypto
import Foundation

/// AES-256-GCM over OpenSSL's libcrypto, one segment of a preload pack at a time.
///
/// A segment's nonce is the first 12 bytes of SHA-256(salt ‖ offset) — the salt is 16 random bytes of each pack, so
/// a key used for two packs never meets the same nonce twice — and its additional data binds the segment to its place
/// (salt ‖ offset ‖ length, big-endian): a segment moved elsewhere in the pack fails its tag. The ciphertext has the
/// plaintext's length; the 16-byte tag is kept apart (``PreloadPack``'s segment table).
///
/// Owns one `EVP_CIPHER_CTX`; not `Sendable`: use it from one thread at a time.
final class PreloadCipher {
    static let tagLength = 16
    static let saltLength = 16
    // EVP_CTRL_AEAD_GET_TAG and EVP_CTRL_AEAD_SET_TAG (openssl/evp.h): macros Swift does not import.
    private static let getTag: Int32 = 0x10
    private static let setTag: Int32 = 0x11

    private let context: OpaquePointer
    private let key: [UInt8]
    private let salt: [UInt8]

    init(key: PreloadKey, salt: [UInt8]) {
        guard let context = EVP_CIPHER_CTX_new() else { fatalError("EVP_CIPHER_CTX_new failed: out of memory") }
        (self.context, self.key, self.salt) = (context, key.bytes, salt)
    }

    deinit { EVP_CIPHER_CTX_free(self.context) }

    private func nonceAndData(offset: Int64, length: Int64) -> (nonce: [UInt8], aad: [UInt8]) {
        var place = self.salt
        withUnsafeBytes(of: UInt64(offset).bigEndian) { place.append(contentsOf: $0) }
        let hasher = SHA256Hasher()
        place.withUnsafeBytes { hasher.update($0) }
        var nonce: [UInt8] = []
        let hex = Array(hasher.hexDigest().utf8)
        for index in 0..<12 {
            func value(_ digit: UInt8) -> UInt8 { digit >= 0x61 ? digit - 0x61 + 10 : digit - 0x30 }
            nonce.append(value(hex[2 * index]) << 4 | value(hex[2 * index + 1]))
        }
        withUnsafeBytes(of: UInt64(length).bigEndian) { place.append(contentsOf: $0) }
        return (nonce, place)
    }

    /// Encrypts `buffer` in place as the segment at `offset`; returns its tag.
    func encrypt(_ buffer: UnsafeMutableRawBufferPointer, offset: Int64) -> [UInt8]? {
        let (nonce, aad) = self.nonceAndData(offset: offset, length: Int64(buffer.count))
        guard EVP_EncryptInit_ex(self.context, EVP_aes_256_gcm(), nil, self.key, nonce) == 1 else { return nil }
        var count: Int32 = 0
        guard EVP_EncryptUpdate(self.context, nil, &count, aad, Int32(aad.count)) == 1 else { return nil }
        guard self.update(buffer, decrypt: false) else { return nil }
        var scratch = [UInt8](repeating: 0, count: 32)
        guard EVP_EncryptFinal_ex(self.context, &scratch, &count) == 1 else { return nil }
        var tag = [UInt8](repeating: 0, count: Self.tagLength)
        guard EVP_CIPHER_CTX_ctrl(self.context, Self.getTag, Int32(Self.tagLength), &tag) == 1 else { return nil }
        return tag
    }

    /// Decrypts `buffer` in place as the segment at `offset`; false when the tag does not match (a wrong key, a
    /// changed byte, a segment out of place). The buffer then holds no usable plaintext: the caller discards it.
    func decrypt(_ buffer: UnsafeMutableRawBufferPointer, offset: Int64, tag: [UInt8]) -> Bool {
        self.startDecrypting(offset: offset, length: Int64(buffer.count)) && self.continueDecrypting(buffer)
            && self.finishDecrypting(tag: tag)
    }

    /// Starts decrypting the segment at `offset` of `length` bytes, whose bytes are then given in order to
    /// ``continueDecrypting(_:)`` and whose tag is checked by ``finishDecrypting(tag:)``. Drops any segment started before.
    func startDecrypting(offset: Int64, length: Int64) -> Bool {
        let (nonce, aad) = self.nonceAndData(offset: offset, length: length)
        guard EVP_DecryptInit_ex(self.context, EVP_aes_256_gcm(), nil, self.key, nonce) == 1 else { return false }
        var count: Int32 = 0
        return EVP_DecryptUpdate(self.context, nil, &count, aad, Int32(aad.count)) == 1
    }

    /// Decrypts in place the next bytes of the segment started: not yet authenticated (``finishDecrypting(tag:)``).
    func continueDecrypting(_ buffer: UnsafeMutableRawBufferPointer) -> Bool { self.update(buffer, decrypt: true) }

    /// Whether the segment started, all of whose bytes were decrypted, matches its tag.
    func finishDecrypting(tag: [UInt8]) -> Bool {
        guard tag.count == Self.tagLength else { return false }
        var expected = tag
        guard EVP_CIPHER_CTX_ctrl(self.context, Self.setTag, Int32(Self.tagLength), &expected) == 1 else { return false }
        var scratch = [UInt8](repeating: 0, count: 32)
        var count: Int32 = 0
        return EVP_DecryptFinal_ex(self.context, &scratch, &count) == 1
    }

    /// Runs the cipher over the buffer in place, at most 256 MiB per call (the length is an Int32).
    private func update(_ buffer: UnsafeMutableRawBufferPointer, decrypt: Bool) -> Bool {
        guard let base = buffer.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return true }
        var done = 0
        while done < buffer.count {
            let step = min(buffer.count - done, 256 << 20)
            var count: Int32 = 0
            let status =
                decrypt
                ? EVP_DecryptUpdate(self.context, base + done, &count, base + done, Int32(step))
                : EVP_EncryptUpdate(self.context, base + done, &count, base + done, Int32(step))
            guard status == 1, Int(count) == step else { return false }
            done += step
        }
        return true
    }
}
