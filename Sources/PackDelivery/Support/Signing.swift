import CCrypto
import Foundation

/// A manifest publisher's public key (Ed25519, PEM "PUBLIC KEY", i.e. SPKI): what a client trusts.
///
/// OpenSSL's Ed25519 (`EVP_DigestVerify`) does the cryptography; this type only carries the PEM.
public struct PublisherKey: Sendable, Hashable {
    /// The key as PEM (`-----BEGIN PUBLIC KEY-----`).
    public let pem: String
    /// The first 16 hex digits of the SHA-256 of the key's DER: how a signature names its key.
    public let id: String
    /// The parsed key, kept so a server checking a receipt per request does not parse the PEM each time.
    private let key: OpenSSLKey

    /// Reads a public key.
    ///
    /// - Parameter pem: an Ed25519 public key in PEM (SPKI).
    /// - Throws: `invalidArgument` when it is not one.
    public init(pem: String) throws(PackDeliveryError) {
        self.key = try OpenSSLKey(publicPEM: pem)
        self.pem = pem
        self.id = self.key.id
    }

    /// Whether `signature` is this key's Ed25519 signature of `data`.
    public func verifies(_ signature: Data, of data: Data) -> Bool {
        self.key.verify(signature, of: data)
    }

    public static func == (lhs: PublisherKey, rhs: PublisherKey) -> Bool { lhs.pem == rhs.pem }
    public func hash(into hasher: inout Hasher) { hasher.combine(self.pem) }
}

/// A publisher's private key (Ed25519, PEM "PRIVATE KEY", i.e. PKCS#8), for signing manifests.
public struct PublisherSigningKey: Sendable {
    /// The key as PEM (`-----BEGIN PRIVATE KEY-----`). Keep it secret (mode 0600).
    public let pem: String
    /// The matching public key, to hand to clients.
    public let publicKey: PublisherKey

    /// A new random key.
    public static func generate() throws(PackDeliveryError) -> PublisherSigningKey {
        let key = try OpenSSLKey.generate()
        return try PublisherSigningKey(pem: try key.privatePEM())
    }

    /// Reads a private key.
    ///
    /// - Parameter pem: an Ed25519 private key in PEM (PKCS#8).
    /// - Throws: `invalidArgument` when it is not one.
    public init(pem: String) throws(PackDeliveryError) {
        let key = try OpenSSLKey(privatePEM: pem)
        self.pem = pem
        self.publicKey = try PublisherKey(pem: try key.publicPEM())
    }

    /// The Ed25519 signature of `data` (64 bytes).
    public func sign(_ data: Data) throws(PackDeliveryError) -> Data {
        try OpenSSLKey(privatePEM: self.pem).sign(data)
    }
}

/// The detached signature of a manifest, published beside it as `manifest.json.sig`.
public struct ManifestSignature: Sendable, Hashable, Codable {
    /// Always `Ed25519`.
    public var algorithm: String
    /// The ``PublisherKey/id`` of the key that signed.
    public var keyID: String
    /// The signature of the manifest file's exact bytes, base64.
    public var signature: String

    /// Signs a manifest's bytes.
    public init(signing data: Data, with key: PublisherSigningKey) throws(PackDeliveryError) {
        self.algorithm = "Ed25519"
        self.keyID = key.publicKey.id
        self.signature = try key.sign(data).base64EncodedString()
    }

    /// The file name of the signature of a manifest named `name`.
    public static func fileName(for name: String) -> String { name + ".sig" }
}

/// One EVP_PKEY, freed with the value.
///
/// `@unchecked Sendable`: the only stored property is the `EVP_PKEY` pointer, set once in `init` and never
/// changed; after construction the key is only read (`i2d_PUBKEY`, `PEM_write_bio_*`, and `EVP_DigestSign`/
/// `EVP_DigestVerify` each with a context of their own), and OpenSSL 3 documents a constructed `EVP_PKEY` as
/// safe to use from several threads at once as long as it is not modified.
private final class OpenSSLKey: @unchecked Sendable {
    let pkey: OpaquePointer

    private init(_ pkey: OpaquePointer) { self.pkey = pkey }
    deinit { EVP_PKEY_free(self.pkey) }

    static func generate() throws(PackDeliveryError) -> OpenSSLKey {
        guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nil) else { throw Self.failure("make a key") }
        defer { EVP_PKEY_CTX_free(context) }
        var pkey: OpaquePointer?
        guard EVP_PKEY_keygen_init(context) == 1, EVP_PKEY_keygen(context, &pkey) == 1, let pkey else { throw Self.failure("make a key") }
        return OpenSSLKey(pkey)
    }

    convenience init(publicPEM pem: String) throws(PackDeliveryError) {
        guard let pkey = Self.withBIO(pem, { PEM_read_bio_PUBKEY($0, nil, nil, nil) }), EVP_PKEY_get_id(pkey) == EVP_PKEY_ED25519 else {
            throw PackDeliveryError(
                .invalidArgument, message: "This is not an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----).",
                hint: "Use the .pub file that made the signing key.")
        }
        self.init(pkey)
    }

    convenience init(privatePEM pem: String) throws(PackDeliveryError) {
        guard let pkey = Self.withBIO(pem, { PEM_read_bio_PrivateKey($0, nil, nil, nil) }), EVP_PKEY_get_id(pkey) == EVP_PKEY_ED25519 else {
            throw PackDeliveryError(
                .invalidArgument, message: "This is not an Ed25519 private key in PEM (-----BEGIN PRIVATE KEY-----).",
                hint: "Use the .key file made with the key generator.")
        }
        self.init(pkey)
    }

    var id: String {
        let length = i2d_PUBKEY(self.pkey, nil)
        guard length > 0 else { return "" }
        var der = [UInt8](repeating: 0, count: Int(length))
        der.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            _ = i2d_PUBKEY(self.pkey, &cursor)
        }
        let hasher = SHA256Hasher()
        der.withUnsafeBytes { hasher.update($0) }
        return String(hasher.hexDigest().prefix(16))
    }

    func privatePEM() throws(PackDeliveryError) -> String {
        try Self.pem { PEM_write_bio_PrivateKey($0, self.pkey, nil, nil, 0, nil, nil) }
    }

    func publicPEM() throws(PackDeliveryError) -> String {
        try Self.pem { PEM_write_bio_PUBKEY($0, self.pkey) }
    }

    func sign(_ data: Data) throws(PackDeliveryError) -> Data {
        guard let context = EVP_MD_CTX_new() else { throw Self.failure("sign") }
        defer { EVP_MD_CTX_free(context) }
        var signature = [UInt8](repeating: 0, count: 64)
        var length = signature.count
        let ok = data.withUnsafeBytes { bytes in
            EVP_DigestSignInit(context, nil, nil, nil, self.pkey) == 1
                && EVP_DigestSign(context, &signature, &length, bytes.bindMemory(to: UInt8.self).baseAddress, bytes.count) == 1
        }
        guard ok else { throw Self.failure("sign") }
        return Data(signature.prefix(length))
    }

    func verify(_ signature: Data, of data: Data) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        return signature.withUnsafeBytes { sig in
            data.withUnsafeBytes { bytes in
                EVP_DigestVerifyInit(context, nil, nil, nil, self.pkey) == 1
                    && EVP_DigestVerify(
                        context, sig.bindMemory(to: UInt8.self).baseAddress, sig.count,
                        bytes.bindMemory(to: UInt8.self).baseAddress, bytes.count) == 1
            }
        }
    }

    private static func withBIO(_ text: String, _ body: (OpaquePointer) -> OpaquePointer?) -> OpaquePointer? {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { raw -> OpaquePointer? in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return body(bio)
        }
    }

    private static func pem(_ write: (OpaquePointer) -> Int32) throws(PackDeliveryError) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw Self.failure("write a key") }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else { throw Self.failure("write a key") }
        let pending = Int(BIO_ctrl_pending(bio))
        var buffer = [UInt8](repeating: 0, count: pending)
        let read = BIO_read(bio, &buffer, Int32(pending))
        return String(decoding: buffer.prefix(Int(max(0, read))), as: UTF8.self)
    }

    private static func failure(_ what: String) -> PackDeliveryError {
        PackDeliveryError(.internalError, message: "OpenSSL could not \(what) (error \(ERR_get_error())).")
    }
}
