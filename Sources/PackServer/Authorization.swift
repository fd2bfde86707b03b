import Foundation
import PackDelivery

/// What a request asks for, as a ``PackAuthorizer`` sees it.
public struct ProtectedResource: Sendable, Hashable {
    /// What kind of file is asked for.
    public enum Kind: Sendable, Hashable {
        /// The catalog, `manifest.json`.
        case catalog
        /// A pack listed in the manifest; these products list it (usually one).
        case pack(productIdentifiers: [String])
        /// A file the manifest does not list.
        case unlisted
    }

    /// What kind of file is asked for.
    public var kind: Kind
    /// The path asked for, from the served folder's root (`/forest-1.0.zip`), percent-decoded.
    public var path: String

    /// Creates a resource.
    ///
    /// - Parameters:
    ///   - kind: What kind of file is asked for.
    ///   - path: The path from the served folder's root.
    public init(kind: Kind, path: String) {
        self.kind = kind
        self.path = path
    }
}

/// An authorizer's answer.
public enum AccessDecision: Sendable, Hashable {
    /// Serve it (or, in `--auth-only` mode, answer 204).
    case allow
    /// 401 with `WWW-Authenticate: Bearer`: no credential, or one that is not valid.
    case unauthorized
    /// 403: a valid credential that does not cover this resource.
    case forbidden
}

/// An authorizer's answer with what it learnt from the credential.
public struct AccessGrant: Sendable, Hashable {
    /// Serve, 401 or 403.
    public var decision: AccessDecision
    /// The products the credential covers, when it names them (a receipt): `manifest.json` is then served with
    /// only these products. `nil` covers every product.
    public var products: [String]?
    /// Who presented the credential, for the request log (a receipt's id and subject); never the credential itself.
    public var credential: String?
    /// Why it was refused, as a short fixed word for the `reason` label of `packs_auth_refusals_total`
    /// (``ReceiptAuthorizer``: `no_credential`, a ``Receipt/Problem`` raw value, `other_product` or `unlisted`);
    /// `nil` when allowed, or when the authorizer does not say (then the decision's name is counted).
    public var refusal: String?
    /// The environment of the receipt presented, when the credential is a genuine receipt (``ReceiptAuthorizer``):
    /// for the `environment` label of `packs_auth_receipts_total` and the `X-Receipt-Environment` header of
    /// `--auth-only`'s answers; `nil` for other credentials.
    public var environment: Receipt.Environment?

    /// Creates a grant.
    ///
    /// - Parameters:
    ///   - decision: serve, 401 or 403.
    ///   - products: the products covered, or `nil` for all.
    ///   - credential: who presented it, for the log.
    public init(_ decision: AccessDecision, products: [String]? = nil, credential: String? = nil) {
        self.decision = decision
        self.products = products
        self.credential = credential
    }

    /// Creates a refusal that says why.
    ///
    /// - Parameters:
    ///   - decision: 401 or 403.
    ///   - refusal: why, as a short fixed word (it becomes a metric label: never a value from the request).
    ///   - products: the products the credential covers, or `nil` for all.
    ///   - credential: who presented it, for the log.
    public init(_ decision: AccessDecision, refusal: String, products: [String]? = nil, credential: String? = nil) {
        self.init(decision, products: products, credential: credential)
        self.refusal = refusal
    }
}

/// Decides whether the credential in an `Authorization` header may have a resource.
///
/// `packs serve --token` uses ``SharedTokenAuthorizer``. A credential that names products — a
/// signed receipt — plugs in as another authorizer: `.allow` for the packs of the products it
/// names and for the catalog, `.forbidden` for other packs, `.unauthorized` when its signature
/// does not verify. Authorizers are called for every request, on Swift's cooperative threads: they
/// must not block.
public protocol PackAuthorizer: Sendable {
    /// Decides one request.
    ///
    /// - Parameters:
    ///   - authorization: The `Authorization` header's value, or `nil` when there is none.
    ///   - resource: What the request asks for.
    /// - Returns: Whether to serve it, or answer 401 or 403.
    func decide(authorization: String?, resource: ProtectedResource) -> AccessDecision

    /// Decides one request, saying also which products the credential covers and who presented it.
    /// The default is ``decide(authorization:resource:)`` covering every product.
    ///
    /// - Parameters:
    ///   - authorization: The `Authorization` header's value, or `nil` when there is none.
    ///   - resource: What the request asks for.
    /// - Returns: The decision, the products covered and who presented the credential.
    func authorize(authorization: String?, resource: ProtectedResource) -> AccessGrant
}

extension PackAuthorizer {
    /// ``decide(authorization:resource:)``, covering every product, naming nobody.
    public func authorize(authorization: String?, resource: ProtectedResource) -> AccessGrant {
        AccessGrant(self.decide(authorization: authorization, resource: resource))
    }
}

/// One shared secret that opens everything: `Authorization: Bearer <token>`.
public struct SharedTokenAuthorizer: PackAuthorizer {
    private let token: [UInt8]

    /// Creates the authorizer.
    ///
    /// - Parameter token: The secret; compared in constant time.
    public init(token: String) {
        self.token = Array(token.utf8)
    }

    /// `.allow` for every resource when the bearer token is the secret, `.unauthorized` otherwise.
    ///
    /// - Parameters:
    ///   - authorization: The `Authorization` header's value, or `nil`.
    ///   - resource: Not looked at: the token covers every product.
    /// - Returns: `.allow` or `.unauthorized`.
    public func decide(authorization: String?, resource: ProtectedResource) -> AccessDecision {
        guard let authorization, let presented = BearerCredentials.token(in: authorization) else { return .unauthorized }
        return BearerCredentials.constantTimeEqual(Array(presented.utf8), self.token) ? .allow : .unauthorized
    }
}

/// Reading `Authorization: Bearer <token68>` (RFC 9110 §11.4, RFC 6750 §2.1).
public enum BearerCredentials {
    /// The token of a `Bearer` credential, or `nil` when the value is not one.
    ///
    /// The scheme is case-insensitive; one or more spaces separate it from the token (`1*SP`);
    /// spaces and tabs around the whole value are ignored (they are not part of a field value);
    /// the token must be a `token68`.
    ///
    /// - Parameter fieldValue: The `Authorization` header's value.
    /// - Returns: The token, or `nil`.
    public static func token(in fieldValue: String) -> Substring? {
        let isOWS: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        var value = Substring(fieldValue)
        while let first = value.first, isOWS(first) { value.removeFirst() }
        while let last = value.last, isOWS(last) { value.removeLast() }
        guard let space = value.firstIndex(of: " ") else { return nil }
        guard value[..<space].lowercased() == "bearer" else { return nil }
        var token = value[space...]
        while token.first == " " { token.removeFirst() }
        guard !token.isEmpty, Self.isToken68(token) else { return nil }
        return token
    }

    /// `token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`
    static func isToken68(_ text: Substring) -> Bool {
        let bytes = Array(text.utf8)
        var end = bytes.count
        while end > 0, bytes[end - 1] == UInt8(ascii: "=") { end -= 1 }
        guard end > 0 else { return false }
        return bytes[..<end].allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                true
            case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "+"), UInt8(ascii: "/"):
                true
            default:
                false
            }
        }
    }

    /// Compares two byte strings in time that depends only on their lengths.
    static func constantTimeEqual(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = given.count ^ expected.count
        for index in 0..<expected.count {
            difference |= Int(expected[index] ^ (index < given.count ? given[index] : 0))
        }
        return difference == 0
    }
}

/// `packs serve --receipt-key store.pub [--sandbox-receipt-key test.pub]`: every pack needs a signed receipt
/// (``Receipt``) that names its product. No receipt, a bad signature, an `alg` other than `EdDSA` (`none`, `HS256`
/// keyed with the public key…), a header with `crit`, a header or claims naming a member twice, an expired one or
/// one not yet valid, a sandbox receipt with no sandbox key trusted, or one whose `environment` claim is not its
/// key's get 401; a valid receipt for other products gets 403 for the pack. The catalog is open to any valid
/// receipt. Production keys are tried first, sandbox keys second (``Receipt/verify(_:keys:sandboxKeys:now:leeway:)``);
/// a sandbox receipt opens the same products as a production one, and the grant says which it was.
public struct ReceiptAuthorizer: PackAuthorizer {
    private let keys: [PublisherKey]
    private let sandboxKeys: [PublisherKey]

    /// Creates the authorizer for production receipts only.
    ///
    /// - Parameter keys: the store's public keys whose receipts are honoured.
    public init(keys: [PublisherKey]) {
        self.init(keys: keys, sandboxKeys: [])
    }

    /// Creates the authorizer for production receipts and sandbox (test) ones.
    ///
    /// - Parameters:
    ///   - keys: the store's public keys whose production receipts are honoured.
    ///   - sandboxKeys: the public keys whose sandbox receipts are honoured; none refuses every sandbox receipt.
    public init(keys: [PublisherKey], sandboxKeys: [PublisherKey]) {
        self.keys = keys
        self.sandboxKeys = sandboxKeys
    }

    /// Checks the bearer receipt against the resource.
    public func decide(authorization: String?, resource: ProtectedResource) -> AccessDecision {
        self.authorize(authorization: authorization, resource: resource).decision
    }

    /// Checks the bearer receipt against the resource; the grant names the receipt's products (the catalog
    /// shows only those), its environment and, for the log, its id and subject — also for a genuine receipt that
    /// expired.
    public func authorize(authorization: String?, resource: ProtectedResource) -> AccessGrant {
        guard let authorization, let token = BearerCredentials.token(in: authorization) else {
            return AccessGrant(.unauthorized, refusal: "no_credential")
        }
        let receipt: Receipt
        switch Receipt.verify(token, keys: self.keys, sandboxKeys: self.sandboxKeys) {
        case .success(let valid):
            receipt = valid
        case .failure(let refusal):
            var grant = AccessGrant(
                .unauthorized, refusal: refusal.problem.rawValue,
                credential: refusal.receipt.map { Self.describe($0) + " (\(refusal.problem.rawValue))" })
            grant.environment = refusal.receipt?.environment
            return grant
        }
        let credential = Self.describe(receipt)
        var grant: AccessGrant
        switch resource.kind {
        case .catalog:
            grant = AccessGrant(.allow, products: receipt.products, credential: credential)
        case .pack(let products):
            grant =
                products.contains(where: receipt.products.contains)
                ? AccessGrant(.allow, products: receipt.products, credential: credential)
                : AccessGrant(.forbidden, refusal: "other_product", products: receipt.products, credential: credential)
        case .unlisted:
            grant = AccessGrant(.forbidden, refusal: "unlisted", products: receipt.products, credential: credential)
        }
        grant.environment = receipt.environment
        return grant
    }

    /// `receipt=<id> subject=<subject>`, then `environment=sandbox` for a sandbox receipt (a production one's line
    /// is as before sandbox receipts existed); printable and short (claims are the store's, but a log line stays
    /// one line).
    static func describe(_ receipt: Receipt) -> String {
        let sandbox = receipt.environment == .sandbox ? " environment=sandbox" : ""
        return
            "receipt=\(PackDeliveryError.printable(String(receipt.id.prefix(64)))) subject=\(PackDeliveryError.printable(String(receipt.subject.prefix(128))))\(sandbox)"
    }
}

extension Receipt.Environment {
    /// `production` or `sandbox`: the `environment` metric label, the `X-Receipt-Environment` header's value and
    /// the request log's `environment=`.
    var label: String {
        switch self {
        case .production: "production"
        case .sandbox: "sandbox"
        }
    }
}
