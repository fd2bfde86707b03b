import ArgumentParser
import Foundation
import PackDelivery

extension Packs {
    struct Use: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the installed folders of a product's packs (or of the packs named), fetching them first if needed.",
            discussion: """
                An installed pack is printed at once, without a request. A pack that is not installed is fetched ahead of \
                everything else waiting (priority userInitiated): an on-demand pack, or a prefetch or paused download; a \
                pack no download was recorded for is bought from --manifest. Folders are printed one per line once every \
                pack is in place (with --json, the progress events, then one object per pack as content prints it). \
                When the agent serves the home, it fetches them and this command follows. Exit codes as fetch.

                Example:
                  ls "$(packs use com.example.forest com.example.forest.music)"
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags

        @Argument(help: "The product.")
        var product: String

        @Argument(help: "Content identifiers of its packs (default: all of them); anything else is a usage error (exit 64).")
        var packs: [String] = []

        @Option(help: ArgumentHelp("The manifest to fetch from when no download of a pack is recorded.", valueName: "manifest"))
        var manifest: String?

        @OptionGroup var agent: AgentOptions

        func run() async throws {
            // The agent runs the downloads of the homes it serves; its own transfer settings apply there.
            if self.transfer.receipt == nil, let link = AgentLink.serving(self.global, self.agent) {
                var shown = self.global
                if !shown.json, isatty(STDOUT_FILENO) != 1 { shown.quiet = true }
                let code = try AgentLink.run {
                    try link.use(
                        product: self.product, packs: self.packs, manifest: self.manifest, mode: ProgressDisplay.Mode(global: shown))
                }
                guard code == 0 else { throw ExitCode(code) }
                return
            }
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                var loaded: LoadedManifest?
                if let manifest = self.manifest {
                    let publishers = try DownloadQueue.trustedPublishers(home: self.global.resolvedHome)
                    loaded = try await LoadedManifest.load(
                        manifest, options: self.transfer.options, trusting: publishers,
                        repositories: DownloadQueue.trustedRepositories(home: self.global.resolvedHome))
                }
                let queue = try openQueue(self.global, self.transfer.configuration())
                defer { queue.close() }
                if let loaded { try queue.acceptManifest(loaded) }
                let packs: [String]
                if self.packs.isEmpty {
                    packs = try queue.contentIdentifiers(productIDs: [self.product], from: loaded)
                } else {
                    try self.checkPacks(queue, loaded)
                    packs = self.packs
                }
                // Progress goes to stdout only on a terminal or with --json: `$(packs use …)` gets the folders alone.
                var shown = self.global
                if !shown.json, isatty(STDOUT_FILENO) != 1 { shown.quiet = true }
                let code = try await RunSession(queue: queue, global: shown).run { () throws(PackDeliveryError) in
                    let downloads = try queue.fetchIfNeeded(contentIDs: packs, from: loaded)
                    return RunSession.Follow(
                        downloads: downloads, finishingAllFinishable: false, finishingIfAsked: Set(downloads.map(\.transactionID)))
                }
                guard code == 0 else { return code }
                let clock = ContinuousClock()
                let started = clock.now
                let folders = try await queue.ensureAvailable(contentIDs: packs, from: loaded)
                if self.global.verbose {
                    // Benchmarks/run case 13 reads this: the library call alone, without the process start and queue open.
                    let elapsed = clock.now - started
                    let ms = Double(elapsed.components.seconds) * 1_000 + Double(elapsed.components.attoseconds) / 1e15
                    printError("packs: ensureAvailable took \(String(format: "%.3f", ms)) ms")
                }
                // The product's packs only, by pack: a home with thousands installed is not read for a few.
                let installed = Dictionary(
                    try queue.installedContent(forProductID: self.product).map { ($0.contentIdentifier, $0) }, uniquingKeysWith: { $1 })
                for (identifier, folder) in zip(packs, folders) {
                    if self.global.json {
                        guard let content = installed[identifier], content.contentURL == folder else { continue }
                        var object = InstalledJSON(content)
                        object.missing = false
                        printJSON(object)
                    } else {
                        printLine(folder.path)
                    }
                }
                return 0
            }
            if code != 0 { throw ExitCode(code) }
        }

        /// `use` takes packs of one product: any other argument (another product, a pack of another product, a typo)
        /// is refused before anything is fetched, so `use A B --manifest M` never buys B.
        /// Without a manifest, a product nothing is recorded of is left to the fetch, which says its packs are not
        /// installed and to pass the manifest (64); with one that does not list it, it is an unknown product (65).
        private func checkPacks(_ queue: DownloadQueue, _ loaded: LoadedManifest?) throws(PackDeliveryError) {
            let ofProduct: [String]
            do {
                ofProduct = try queue.contentIdentifiers(productIDs: [self.product], from: loaded)
            } catch  where error.code == .unknownProduct && loaded == nil {
                return
            }
            let known = Set(ofProduct)
            guard let stranger = self.packs.first(where: { !known.contains($0) }) else { return }
            let listed = ofProduct.prefix(20).joined(separator: ", ") + (ofProduct.count > 20 ? ", …" : "")
            throw PackDeliveryError(
                .invalidArgument,
                message:
                    "'\(PackDeliveryError.printable(stranger))' is not a pack of \(PackDeliveryError.printable(self.product)); packs use takes the packs of one product.",
                hint:
                    "Its packs are: \(PackDeliveryError.printable(listed)). Run packs use once per product (a product is bought with packs fetch MANIFEST PRODUCT).",
                subject: stranger)
        }
    }
}
