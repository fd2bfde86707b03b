import Foundation

/// A signed receipt: what a store's backend hands a client after a purchase, and what a content server
/// checks before it serves a pack.
///
/// A compact JWS (RFC 7515) carrying a JWT (RFC 7519), `alg` `EdDSA` (RFC 8037, Ed25519) and nothing
/// else: a token whose header names another algorithm — `none`, or `HS256` keyed with the public key —
/// is refused before any signature is looked at, as is one whose header lists critical extensions (`crit`);
/// a header or claims that name a member twice make it malformed. Made and checked with the same OpenSSL
/// Ed25519 as signed manifests (``PublisherSigningKey``, ``PublisherKey``).
public struct Receipt: Sendable, Hashable {
    /// The products bought (claim `products`).
    public var products: [String]
    /// Who bought them (claim `sub`).
    public var subject: String
    /// A unique id (claim `jti`), for logs.
    public var id: String
    /// When it was issued (claim `iat`).
    public var issuedAt: Date
    /// When it stops being valid (claim `exp`).
    public var expires: Date
    /// When it starts being valid (claim `nbf`).
    public var notBefore: Date

    /// Why a receipt was refused.
    ///
    /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
    public enum Problem: String, Sendable, Hashable {
        /// Not a compact JWS, or its parts are not base64url JSON objects, or an object in them names a member
        /// twice (a claim given twice: RFC 7519 §4 leaves the reader only to refuse or to take the last one).
        case malformed
        /// The header's `alg` is not `EdDSA`.
        case algorithm
        /// The header lists critical extensions (`crit`), which must be understood to use the token (RFC 7515
        /// §4.1.11); none is understood here.
        case critical
        /// The signature does not verify with any trusted key.
        case signature
        /// Past `exp`.
        case expired
        /// Before `nbf`.
        case notYetValid
    }

    private struct Header: Codable {
        var alg: String
        var typ: String?
        var kid: String?
    }
    private struct Claims: Codable {
        var products: [String]
        var sub: String
        var jti: String
        var iat: Int64
        var exp: Int64
        var nbf: Int64
    }

    /// The longest lifetime a receipt may be issued with: 100 years (36,500 days), in seconds.
    public static let maxLifetime: TimeInterval = 36_500 * 86_400

    /// Makes and signs a receipt.
    ///
    /// - Parameters:
    ///   - products: the products bought.
    ///   - subject: who bought them.
    ///   - lifetime: how long it is valid, from now.
    ///   - key: the store's signing key.
    ///   - now: the issue time.
    /// - Returns: the compact JWS, `header.claims.signature`.
    public static func issue(
        products: [String], subject: String, lifetime: TimeInterval, key: PublisherSigningKey,
        now: Date = Date()
    ) throws(PackDeliveryError) -> String {
        guard lifetime > 0, lifetime <= Self.maxLifetime, now.timeIntervalSince1970.magnitude < 1e15 else {
            throw PackDeliveryError(
                .invalidArgument, message: "A receipt's lifetime must be above 0 and at most 100 years.",
                hint: "Give a lifetime such as 30 days.")
        }
        let issued = Int64(now.timeIntervalSince1970)
        let claims = Claims(
            products: products, sub: subject, jti: UUID().uuidString.lowercased(), iat: issued,
            exp: issued + Int64(lifetime.rounded(.up)), nbf: issued)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let header = try? encoder.encode(Header(alg: "EdDSA", typ: "JWT", kid: key.publicKey.id)),
            let body = try? encoder.encode(claims)
        else {
            throw PackDeliveryError(.internalError, message: "A receipt could not be encoded.")
        }
        let signingInput = Self.base64URL(header) + "." + Self.base64URL(body)
        return signingInput + "." + Self.base64URL(try key.sign(Data(signingInput.utf8)))
    }

    /// Checks a receipt: its form, `alg`, `crit`, signature (by any of `keys`), `exp` and `nbf`.
    ///
    /// The header and the claims must each be one strict JSON object in which no object names a member twice;
    /// a header with `crit` is refused, since no extension is understood here.
    ///
    /// - Parameters:
    ///   - token: the compact JWS.
    ///   - keys: the public keys whose receipts are trusted.
    ///   - now: the time to check against; `leeway` seconds of clock difference are allowed.
    ///   - leeway: the seconds of clock difference allowed around `exp` and `nbf`.
    /// - Returns: the receipt, or why it was refused.
    public static func verify(
        _ token: some StringProtocol, keys: [PublisherKey], now: Date = Date(),
        leeway: TimeInterval = 30
    ) -> Result<Receipt, ReceiptRefusal> {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Self.decodeBase64URL(parts[0]), let bodyData = Self.decodeBase64URL(parts[1]),
            let signature = Self.decodeBase64URL(parts[2]),
            let headerNames = StrictJSON.memberNames(ofObject: headerData),
            let header = try? JSONDecoder().decode(Header.self, from: headerData)
        else {
            return .failure(ReceiptRefusal(problem: .malformed))
        }
        guard header.alg == "EdDSA" else { return .failure(ReceiptRefusal(problem: .algorithm)) }
        // No extension is understood here, so a header that makes any critical is refused (RFC 7515 §4.1.11).
        guard !headerNames.contains("crit") else { return .failure(ReceiptRefusal(problem: .critical)) }
        let signingInput = Data("\(parts[0]).\(parts[1])".utf8)
        guard keys.contains(where: { $0.verifies(signature, of: signingInput) }) else {
            return .failure(ReceiptRefusal(problem: .signature))
        }
        guard StrictJSON.memberNames(ofObject: bodyData) != nil, let claims = try? JSONDecoder().decode(Claims.self, from: bodyData) else {
            return .failure(ReceiptRefusal(problem: .malformed))
        }
        let receipt = Receipt(
            products: claims.products, subject: claims.sub, id: claims.jti,
            issuedAt: Date(timeIntervalSince1970: TimeInterval(claims.iat)),
            expires: Date(timeIntervalSince1970: TimeInterval(claims.exp)),
            notBefore: Date(timeIntervalSince1970: TimeInterval(claims.nbf)))
        if now.timeIntervalSince(receipt.expires) >= leeway { return .failure(ReceiptRefusal(problem: .expired, receipt: receipt)) }
        if receipt.notBefore.timeIntervalSince(now) > leeway { return .failure(ReceiptRefusal(problem: .notYetValid, receipt: receipt)) }
        return .success(receipt)
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func decodeBase64URL(_ text: some StringProtocol) -> Data? {
        guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) else { return nil }
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}

/// Why ``Receipt/verify(_:keys:now:leeway:)`` refused a receipt, with the receipt when its signature held.
public struct ReceiptRefusal: Error, Sendable, Hashable {
    /// What was wrong.
    public var problem: Receipt.Problem
    /// The receipt, when it was genuine but expired or not yet valid.
    public var receipt: Receipt?
}
