import Foundation
import HTTPTypes
import Hummingbird
import PackDelivery

/// The preload keys a server hands out (`packs serve --keys DIR`): every file of `DIR` that holds exactly 32 bytes,
/// by its key id (``PreloadKey/keyID``). Read once, at start.
public struct PreloadKeyStore: Sendable {
    private let keys: [String: PreloadKey]

    /// Reads the keys of a folder.
    ///
    /// - Parameter folder: the folder of key files (`packs keygen --preload NAME` writes `NAME.preloadkey`).
    /// - Throws: `invalidArgument` when the folder cannot be listed.
    public init(folder: URL) throws(PackDeliveryError) {
        let names: [String]
        do { names = try FileManager.default.contentsOfDirectory(atPath: folder.path) } catch {
            throw PackDeliveryError(
                .invalidArgument, message: "Cannot list the key folder \(PackDeliveryError.printable(folder.path)).",
                hint: "Pass a folder of preload key files (NAME.preloadkey, 32 bytes each).", subject: folder.path)
        }
        var keys: [String: PreloadKey] = [:]
        for name in names where !name.hasPrefix(".") {
            if let key = try? PreloadKey(contentsOf: folder.appending(path: name)) { keys[key.keyID] = key }
        }
        self.keys = keys
    }

    /// Keys given as they are (for tests and embedding servers).
    ///
    /// - Parameter keys: the keys.
    public init(keys: [PreloadKey]) {
        self.keys = Dictionary(keys.map { ($0.keyID, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// The ids of the keys held.
    public var keyIDs: [String] { self.keys.keys.sorted() }

    func key(_ id: String) -> PreloadKey? { self.keys[id] }
}

/// Answers `GET /keys/<keyID>` (and `HEAD`): the key's 32 bytes to a credential that the ``PackAuthorizer`` allows to
/// have a pack the manifest marks with that key (`"preload": {"keyID": …}`), once the manifest's release date has
/// come. 401 without a valid credential, 403 for one of another product or before the release (with `Retry-After`),
/// 404 for a key the server does not hold or the manifest does not name. The key is never cached by others and never
/// logged (the request log has the path, the status and the credential's id, as for a pack).
struct KeyMiddleware<Context: RequestContext>: RouterMiddleware {
    static var prefix: String { "/keys/" }

    let store: PreloadKeyStore
    let authorizer: any PackAuthorizer
    let index: ManifestIndex
    let now: @Sendable () -> Date
    var metrics: ServerMetrics? = nil

    /// Whether a request target (query removed) is one this middleware answers.
    static func isKeyPath(_ target: some StringProtocol) -> Bool { target.hasPrefix(Self.prefix) }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let target = request.uri.path
        guard Self.isKeyPath(target) else { return try await next(request, context) }
        let id = String(target.dropFirst(Self.prefix.count))
        guard PreloadKey.isKeyID(id), let key = self.store.key(id), let preload = self.index.preload(keyID: id),
            let releases = Manifest.Content.Preload.date(preload.releases)
        else {
            throw HTTPError(.notFound, message: "No such key.")
        }
        let resource = ProtectedResource(kind: .pack(productIdentifiers: preload.products), path: target)
        let grant = self.authorizer.authorize(authorization: request.headers[.authorization], resource: resource)
        (context as? PackRequestContext)?.notes.credential = grant.credential
        if grant.decision != .allow { self.metrics?.refusal(grant) }
        switch grant.decision {
        case .allow: break
        case .unauthorized: throw AuthGateMiddleware<Context>.unauthorized
        case .forbidden: throw HTTPError(.forbidden, message: "This credential does not cover this key.")
        }
        let wait = releases.timeIntervalSince(self.now())
        if wait > 0 {
            throw HTTPError(
                .forbidden, headers: [.retryAfter: "\(Int(wait.rounded(.up)))"], message: "This key is released at \(preload.releases).")
        }
        self.metrics?.allowed(grant)
        let headers: HTTPFields = [
            .contentType: "application/octet-stream", .cacheControl: "private, no-store", .vary: "Authorization",
            .contentLength: "\(PreloadKey.length)",
        ]
        if request.method == .head { return Response(status: .ok, headers: headers, body: ResponseBody()) }
        return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: key.data)))
    }
}
