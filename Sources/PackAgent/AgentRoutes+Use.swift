import Foundation
import Hummingbird
import PackDelivery

// `POST /v1/use`: what `ensureAvailable` does, without holding the request open while packs download.
extension AgentRoutes {
    func addUseRoutes(to router: Router<BasicRequestContext>) {
        router.post("/v1/use") { request, _ in try await self.use(request) }
    }

    /// The packs of a product (or those named, which must be its packs): a pack not installed is fetched ahead of
    /// everything else waiting (`fetchIfNeeded`, priority userInitiated; bought from `manifest` when no download of it
    /// is recorded), and the answer names the downloads to wait for. Once every pack is installed, the answer lists
    /// their installed content and records their use, as `ensureAvailable` does. Never waits for a download.
    private func use(_ request: Request) async throws -> Response {
        let body = try await Self.body(request, allowed: ["home", "product", "packs", "manifest"], required: ["home", "product"])
        let home = try body.home()
        let product = try body.string("product") ?? ""
        let named = try body.strings("packs") ?? []
        let queue = try self.homes.queue(home: home)
        var loaded: LoadedManifest?
        if let manifest = try body.string("manifest") {
            let publishers = try DownloadQueue.trustedPublishers(home: Home(folder: URL(filePath: home)))
            let repositories = try DownloadQueue.trustedRepositories(home: Home(folder: URL(filePath: home)))
            let manifest = try await LoadedManifest.load(
                manifest, options: TransferOptions(), trusting: publishers, repositories: repositories)
            try queue.acceptManifest(manifest)
            loaded = manifest
        }
        let ofProduct = try queue.contentIdentifiers(productIDs: [product], from: loaded)
        if let stranger = named.first(where: { !ofProduct.contains($0) }) {
            let listed = ofProduct.prefix(20).joined(separator: ", ") + (ofProduct.count > 20 ? ", …" : "")
            throw PackDeliveryError(
                .invalidArgument,
                message: "'\(PackDeliveryError.printable(stranger))' is not a pack of \(PackDeliveryError.printable(product)).",
                hint: "Its packs are: \(PackDeliveryError.printable(listed)). Ask for the packs of one product at a time.",
                subject: stranger)
        }
        let packs = named.isEmpty ? ofProduct : named
        let downloads = try queue.fetchIfNeeded(contentIDs: packs, from: loaded)
        guard downloads.isEmpty else { return Self.json(UseAnswer(packs: packs, downloads: downloads.map(\.id), installed: [])) }
        let folders = try await queue.ensureAvailable(contentIDs: packs, from: loaded)
        // The product's packs only, by pack: a home with thousands installed is not read for a few.
        let installed = Dictionary(
            try queue.installedContent(forProductID: product).map { ($0.contentIdentifier, $0) }, uniquingKeysWith: { $1 })
        let content = zip(packs, folders).compactMap { pack, folder in installed[pack].flatMap { $0.contentURL == folder ? $0 : nil } }
        return Self.json(UseAnswer(packs: packs, downloads: [], installed: content))
    }
}
