import CCrypto
import Foundation

/// A public key of TUF metadata (`keys` of root or of a delegation), and the check of a signature by it through
/// OpenSSL's libcrypto: ed25519 (`keyval.public` as 64 hex digits), ecdsa-sha2-nistp256 (PEM, the signature hex of
/// DER) and rsassa-pss-sha256 (PEM, any salt length, MGF1 with SHA-256).
struct TUFKey: Sendable, Equatable {
    let keyType: String
    let scheme: String
    let publicValue: String

    init?(_ json: TUFJSON) {
        guard let keyType = json["keytype"]?.stringValue, let scheme = json["scheme"]?.stringValue,
            let publicValue = json["keyval"]?["public"]?.stringValue
        else { return nil }
        self.keyType = keyType
        self.scheme = scheme
        self.publicValue = publicValue
    }

    /// Whether `signatureHex` is this key's valid signature of `data`; false for an unknown key type or scheme,
    /// a key that does not read, or a signature that is not hex.
    func verifies(_ signatureHex: String, of data: Data) -> Bool {
        guard let signature = Self.bytes(hex: signatureHex) else { return false }
        switch (self.keyType, self.scheme) {
        case ("ed25519", "ed25519"):
            guard let raw = Self.bytes(hex: self.publicValue), raw.count == 32 else { return false }
            let key = raw.withUnsafeBufferPointer { EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, $0.baseAddress, 32) }
            guard let key else { return false }
            defer { EVP_PKEY_free(key) }
            return Self.verify(key, digest: nil, pss: false, signature, data)
        case ("ecdsa", "ecdsa-sha2-nistp256"), ("ecdsa-sha2-nistp256", "ecdsa-sha2-nistp256"):
            guard let key = Self.readPEM(self.publicValue), EVP_PKEY_get_base_id(key) == EVP_PKEY_EC else { return false }
            defer { EVP_PKEY_free(key) }
            return Self.verify(key, digest: EVP_sha256(), pss: false, signature, data)
        case ("rsa", "rsassa-pss-sha256"):
            guard let key = Self.readPEM(self.publicValue), EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA else { return false }
            defer { EVP_PKEY_free(key) }
            return Self.verify(key, digest: EVP_sha256(), pss: true, signature, data)
        default:
            return false
        }
    }

    private static func verify(_ key: OpaquePointer, digest: OpaquePointer?, pss: Bool, _ signature: [UInt8], _ data: Data) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        var keyContext: OpaquePointer?
        guard EVP_DigestVerifyInit(context, &keyContext, digest, nil, key) == 1 else { return false }
        if pss {
            guard let keyContext, EVP_PKEY_CTX_set_rsa_padding(keyContext, RSA_PKCS1_PSS_PADDING) == 1,
                EVP_PKEY_CTX_set_rsa_pss_saltlen(keyContext, RSA_PSS_SALTLEN_AUTO) == 1,
                EVP_PKEY_CTX_set_rsa_mgf1_md(keyContext, EVP_sha256()) == 1
            else { return false }
        }
        return signature.withUnsafeBufferPointer { sig in
            data.withUnsafeBytes { bytes in
                EVP_DigestVerify(context, sig.baseAddress, sig.count, bytes.bindMemory(to: UInt8.self).baseAddress, bytes.count) == 1
            }
        }
    }

    private static func readPEM(_ pem: String) -> OpaquePointer? {
        let bytes = Array(pem.utf8)
        return bytes.withUnsafeBytes { raw -> OpaquePointer? in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PUBKEY(bio, nil, nil, nil)
        }
    }

    /// The bytes of an even-length hex string; nil when it is not one.
    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: c - 0x30
            case 0x61...0x66: c - 0x61 + 10
            case 0x41...0x46: c - 0x41 + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = nibble(digits[index]), let low = nibble(digits[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }
}

/// Digests of TUF `hashes` (sha256, sha384, sha512) through libcrypto.
enum TUFDigest {
    /// The hex digest of `data` by the algorithm named as TUF names it; nil for an algorithm not supported.
    static func hex(_ algorithm: String, of data: Data) -> String? {
        let md: OpaquePointer?
        switch algorithm {
        case "sha256": md = EVP_sha256()
        case "sha384": md = EVP_sha384()
        case "sha512": md = EVP_sha512()
        default: return nil
        }
        guard let md else { return nil }
        var out = [UInt8](repeating: 0, count: 64)
        var length: UInt32 = 0
        let ok = data.withUnsafeBytes { bytes in EVP_Digest(bytes.baseAddress, bytes.count, &out, &length, md, nil) == 1 }
        guard ok else { return nil }
        return out.prefix(Int(length)).map { String(format: "%02x", $0) }.joined()
    }

    /// The SHA-256 of a string's UTF-8 bytes, raw (path hash prefixes and succinct hash bins).
    static func sha256(_ text: String) -> [UInt8] {
        let hex = Self.hex("sha256", of: Data(text.utf8)) ?? ""
        return TUFKey.bytes(hex: hex) ?? []
    }
}
