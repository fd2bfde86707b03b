import Foundation

/// A signed receipt: what a store's backend hands a client after a purchase, and what a content server
/// checks before it serves a pack.
///
/// A compact JWS (RFC 7515) carrying a JWT (RFC 7519), `alg` `EdDSA` (RFC 8037, Ed25519) and nothing
/// else: a token whose header names another algorithm — `none`, or `HS256` keyed with the public key —
/// is refused before any signature is looked at, as is one whose header lists critical extensions (`crit`);
/// a header or claims that name a member twice make it malformed. Made and checked with the same OpenSSL
/// Ed25519 as signed manifests (``PublisherSigningKey``, ``PublisherKey``).
///
/// A receipt is a production one or a sandbox (test) one, as a store's are (``Receipt/Environment-swift.enum``): the claim
/// `environment` says which (`"Sandbox"`; absent, or `"Production"`, for production), and a key signs for one
/// environment only, so a server trusts a store's real key and its test key apart
/// (``Receipt/verify(_:keys:sandboxKeys:now:leeway:)``).
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
    /// Whether a real purchase or a test one made it (claim `environment`; absent: production).
    public var environment: Environment = .production

    /// Which store issued a receipt: the real one, or its test environment (App Review, TestFlight, a
    /// developer's purchases), as Apple's receipts say in their `environment` field.
    ///
    /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
    public enum Environment: String, Sendable, Hashable, CaseIterable {
        /// Real purchases: a receipt without the claim, or with `"environment": "Production"`.
        case production = "Production"
        /// Test purchases: `"environment": "Sandbox"`, signed by a sandbox key.
        case sandbox = "Sandbox"
    }

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
        /// Its `environment` claim does not name the environment of the key that signed it: a production key's
        /// receipt that claims `Sandbox` (or an environment not known here), or a sandbox key's that does not
        /// claim `Sandbox`. A key signs for one environment only.
        case environment
        /// A sandbox receipt checked where no sandbox key is trusted: what Apple's production validator
        /// answers with status 21007 ("this receipt is from the test environment"). Its signature was not
        /// checked by any key (none is trusted for it), so the receipt is not returned.
        case sandbox
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
        var environment: String?
    }
    /// Only the claim that decides which keys to try, read from claims whose signature did not verify.
    private struct ClaimedEnvironment: Decodable {
        var environment: String?
    }

    /// The longest lifetime a receipt may be issued with: 100 years (36,500 days), in seconds.
    public static let maxLifetime: TimeInterval = 36_500 * 86_400

    /// Makes and signs a production receipt.
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
        try Self.issue(products: products, subject: subject, lifetime: lifetime, key: key, environment: .production, now: now)
    }

    /// Makes and signs a receipt for an environment: a sandbox receipt carries `"environment": "Sandbox"` and
    /// must be signed with a sandbox key (one that servers trust as such), a production one carries no
    /// `environment` claim (as receipts made before the claim existed).
    ///
    /// - Parameters:
    ///   - products: the products bought.
    ///   - subject: who bought them.
    ///   - lifetime: how long it is valid, from now.
    ///   - key: the store's signing key for that environment.
    ///   - environment: production or sandbox.
    ///   - now: the issue time.
    /// - Returns: the compact JWS, `header.claims.signature`.
    public static func issue(
        products: [String], subject: String, lifetime: TimeInterval, key: PublisherSigningKey,
        environment: Environment, now: Date = Date()
    ) throws(PackDeliveryError) -> String {
        guard lifetime > 0, lifetime <= Self.maxLifetime, now.timeIntervalSince1970.magnitude < 1e15 else {
            throw PackDeliveryError(
                .invalidArgument, message: "A receipt's lifetime must be above 0 and at most 100 years.",
                hint: "Give a lifetime such as 30 days.")
        }
        let issued = Int64(now.timeIntervalSince1970)
        let claims = Claims(
            products: products, sub: subject, jti: UUID().uuidString.lowercased(), iat: issued,
            exp: issued + Int64(lifetime.rounded(.up)), nbf: issued,
            environment: environment == .production ? nil : environment.rawValue)
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

    /// Checks a production receipt: its form, `alg`, `crit`, signature (by any of `keys`), `environment`, `exp` and
    /// `nbf`; ``Receipt/verify(_:keys:sandboxKeys:now:leeway:)`` with no sandbox key. A sandbox receipt is refused with
    /// ``Receipt/Problem/sandbox``.
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
        Self.verify(token, keys: keys, sandboxKeys: [], now: now, leeway: leeway)
    }

    /// Checks a receipt: its form, `alg`, `crit`, signature (by any of `keys`, else any of `sandboxKeys`),
    /// `environment`, `exp` and `nbf`.
    ///
    /// The production keys are tried first and the sandbox keys second, as Apple's TN2387 (In-App Purchase Best
    /// Practices, "Always verify your receipt with the production URL first") asks of a receipt validator: verify
    /// with production first, even for an app running in the sandbox (App Review tests the production build with
    /// sandbox purchases), and on status 21007 — a sandbox receipt sent to production — verify it with the sandbox.
    /// Here the key that verifies the signature says the environment, and the receipt's `environment` claim
    /// must name that same one (absent means production): a key signs for one environment only, so a receipt that
    /// claims `Sandbox` signed by a production key, or a production one signed by a sandbox key, is refused
    /// (``Receipt/Problem/environment``). A receipt that claims `Sandbox`, when no sandbox key is given and no production
    /// key verifies it, is refused with ``Receipt/Problem/sandbox``, the 21007 of this check.
    ///
    /// The header and the claims must each be one strict JSON object in which no object names a member twice;
    /// a header with `crit` is refused, since no extension is understood here.
    ///
    /// - Parameters:
    ///   - token: the compact JWS.
    ///   - keys: the public keys whose production receipts are trusted.
    ///   - sandboxKeys: the public keys whose sandbox (test) receipts are trusted; none refuses every sandbox receipt.
    ///   - now: the time to check against; `leeway` seconds of clock difference are allowed.
    ///   - leeway: the seconds of clock difference allowed around `exp` and `nbf`.
    /// - Returns: the receipt, its `environment` the one its key signs for, or why it was refused.
    public static func verify(
        _ token: some StringProtocol, keys: [PublisherKey], sandboxKeys: [PublisherKey], now: Date = Date(),
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
        let signedFor: Environment
        if keys.contains(where: { $0.verifies(signature, of: signingInput) }) {
            signedFor = .production
        } else if sandboxKeys.contains(where: { $0.verifies(signature, of: signingInput) }) {
            signedFor = .sandbox
        } else {
            // TN2387's 21007: a sandbox receipt, and no sandbox key to check it with.
            if sandboxKeys.isEmpty, let claimed = try? JSONDecoder().decode(ClaimedEnvironment.self, from: bodyData),
                claimed.environment == Environment.sandbox.rawValue
            {
                return .failure(ReceiptRefusal(problem: .sandbox))
            }
            return .failure(ReceiptRefusal(problem: .signature))
        }
        guard StrictJSON.memberNames(ofObject: bodyData) != nil, let claims = try? JSONDecoder().decode(Claims.self, from: bodyData) else {
            return .failure(ReceiptRefusal(problem: .malformed))
        }
        // A key signs for one environment only: the claim must name the key's (absent: production).
        guard (claims.environment ?? Environment.production.rawValue) == signedFor.rawValue else {
            return .failure(ReceiptRefusal(problem: .environment))
        }
        let receipt = Receipt(
            products: claims.products, subject: claims.sub, id: claims.jti,
            issuedAt: Date(timeIntervalSince1970: TimeInterval(claims.iat)),
            expires: Date(timeIntervalSince1970: TimeInterval(claims.exp)),
            notBefore: Date(timeIntervalSince1970: TimeInterval(claims.nbf)), environment: signedFor)
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

/// Why ``Receipt/verify(_:keys:sandboxKeys:now:leeway:)`` (or ``Receipt/verify(_:keys:now:leeway:)``) refused a
/// receipt, with the receipt when its signature held.
public struct ReceiptRefusal: Error, Sendable, Hashable {
    /// What was wrong.
    public var problem: Receipt.Problem
    /// The receipt, when it was genuine but expired or not yet valid.
    public var receipt: Receipt?
}
