import ArgumentParser
import Foundation
import PackAgent
import PackDelivery

extension Packs {
    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Record a purchase of products, download their packs and install them.",
            discussion: """
                Products are named as arguments, read one per line from a file (--products-from FILE, - for \
                standard input), or taken from the whole manifest (--all).

                Examples:
                  packs --home ./store fetch http://127.0.0.1:8080/manifest.json com.example.forest --to documents
                  packs fetch https://cdn.example.com/manifest.json --all --concurrency 8
                  cut -f1 purchases.tsv | packs fetch manifest.json --products-from -
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags

        @Argument(help: "The manifest: an http(s) URL, a file:// URL or a local path.")
        var manifest: String

        @Argument(help: "Product identifiers to fetch.")
        var products: [String] = []

        @Flag(help: "Fetch every product the manifest lists.")
        var all = false

        @Option(
            name: .customLong("products-from"),
            help: ArgumentHelp("Read product identifiers from a file, one per line (- for standard input).", valueName: "file"))
        var productsFrom: String?

        @Option(help: "Where to install: caches (may be purged) or documents (kept).")
        var to: Destination = .caches

        @Flag(name: .customLong("no-finish"), help: "Leave the transactions unfinished (finish them later with packs finish).")
        var noFinish = false

        @Flag(help: "Record the transactions as restores of earlier purchases.")
        var restore = false

        @Flag(help: "Download again even when the same version is installed.")
        var force = false

        @Option(
            help: ArgumentHelp(
                "Trust manifests signed by this publisher's public key (a .pub file from packs keygen); repeatable. With it, or with keys added by packs trust add, an unsigned, tampered, expired or older manifest is refused (exit 65) and nothing is downloaded.",
                valueName: "pub"))
        var trust: [String] = []

        @Flag(
            help:
                "Hand the purchase to the agent (packs agent) and return at once, printing the transaction and download ids; exit 79 when no agent answers."
        )
        var detach = false

        @Option(help: ArgumentHelp("With --detach: the agent's socket (default $XDG_RUNTIME_DIR/packs/agent.sock).", valueName: "path"))
        var socket: String?

        @Option(
            name: .customLong("seed"),
            help: ArgumentHelp(
                "A folder that may hold chunks of the packs (an installed tree of an earlier or the same version, on a disk or a share); repeatable. Each chunk of an indexed tar or tar.zst pack found there, and verified, is copied instead of fetched. A folder that cannot be read during the install is dropped with a warning and its chunks fetched.",
                valueName: "dir"))
        var seeds: [String] = []

        func validate() throws {
            let sources = (self.products.isEmpty ? 0 : 1) + (self.all ? 1 : 0) + (self.productsFrom == nil ? 0 : 1)
            if sources == 0 { throw ValidationError("Name the products to fetch, or pass --all or --products-from FILE.") }
            if sources > 1 { throw ValidationError("Give products as arguments, --all or --products-from, not several of them.") }
            if self.detach, !self.seeds.isEmpty { throw ValidationError("--seed is read by this process: leave out --detach.") }
            for seed in self.seeds {
                var isFolder: ObjCBool = false
                guard FileManager.default.fileExists(atPath: seed, isDirectory: &isFolder), isFolder.boolValue else {
                    throw ValidationError("--seed \(SafeOutput.line(seed)): no such folder. Pass a folder that holds an installed tree.")
                }
            }
        }

        func run() async throws {
            if self.detach {
                // With --all or --products-from, the list is made here from the manifest (checked as in-process);
                // the agent reads the manifest again and checks it against the home's trust.
                var products = self.products
                if products.isEmpty {
                    products = try await mapErrors { () async throws(PackDeliveryError) -> [String] in
                        try self.wanted(try await self.load())
                    }
                }
                let code = DetachedFetch.run(
                    global: self.global, socket: self.socket, manifest: self.manifest, products: products, destination: self.to,
                    receipt: self.transfer.currentReceipt())
                if code != 0 { throw ExitCode(code) }
                return
            }
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                // The manifest first, then the queue: under a low descriptor limit the queue's files must not take
                // the manifest request's socket.
                let loaded = try await self.load()
                let products = try self.wanted(loaded)
                var configuration = self.transfer.configuration()
                configuration.seeds = self.seeds.map { URL(filePath: $0).absoluteURL }
                configuration.onSeedDropped = { folder, error in
                    printError("warning: the seed \(folder.path) is dropped, its chunks are fetched: \(error.message)")
                }
                let queue = try openQueue(self.global, configuration)
                defer { queue.close() }
                try queue.acceptManifest(loaded)
                let session = RunSession(queue: queue, global: self.global)
                return try await session.run { () throws(PackDeliveryError) in
                    let transactions = try queue.add(
                        products: products, from: loaded, kind: self.restore ? .restored : .purchased,
                        destination: self.to, autoFinish: !self.noFinish, force: self.force,
                        receipt: self.transfer.currentReceipt())
                    return RunSession.Follow(transactions: transactions, finishing: !self.noFinish)
                }
            }
            if code != 0 { throw ExitCode(code) }
        }

        /// The manifest, checked against the publishers trusted here (`--trust` and the home's).
        private func load() async throws(PackDeliveryError) -> LoadedManifest {
            let publishers =
                try self.trust.map { path throws(PackDeliveryError) in try readPublisherKey(path) }
                + DownloadQueue.trustedPublishers(home: self.global.resolvedHome)
            return try await LoadedManifest.load(
                self.manifest, options: self.transfer.options, trusting: publishers,
                repositories: DownloadQueue.trustedRepositories(home: self.global.resolvedHome))
        }

        /// The products asked for, checked against the manifest; duplicates and blank lines dropped.
        private func wanted(_ loaded: LoadedManifest) throws(PackDeliveryError) -> [String] {
            var list: [String]
            if self.all {
                list = loaded.manifest.products.map(\.productIdentifier)
            } else if let file = self.productsFrom {
                let data: Data?
                if file == "-" {
                    data = FileHandle.standardInput.readDataToEndOfFile()
                } else {
                    data = FileManager.default.contents(atPath: file)
                }
                guard let data, let text = String(data: data, encoding: .utf8) else {
                    throw PackDeliveryError(
                        .invalidArgument, message: "Cannot read product identifiers from \(file == "-" ? "standard input" : file).",
                        hint: "Pass a UTF-8 text file with one product identifier per line.", subject: file)
                }
                list = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
                    .filter { !$0.isEmpty && !$0.hasPrefix("#") }
            } else {
                list = self.products
            }
            var seen = Set<String>()
            list = list.filter { seen.insert($0).inserted }
            if list.isEmpty {
                throw PackDeliveryError(
                    .invalidArgument, message: self.all ? "The manifest lists no products." : "No product identifiers were given.",
                    subject: self.productsFrom)
            }
            let known = Set(loaded.manifest.products.map(\.productIdentifier))
            if let product = list.first(where: { !known.contains($0) }) {
                let names = loaded.manifest.products.prefix(20).map(\.productIdentifier).joined(separator: ", ")
                let receipt =
                    self.transfer.receipt == nil ? "" : " A server that checks receipts lists only the products the receipt names."
                throw PackDeliveryError(
                    .unknownProduct, message: "The manifest has no product '\(PackDeliveryError.printable(product))'.",
                    hint: (known.isEmpty
                        ? "It lists no products." : "It lists: \(PackDeliveryError.printable(names))\(known.count > 20 ? ", …" : "").")
                        + receipt,
                    subject: product)
            }
            return list
        }
    }

    struct Resume: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Resume paused or failed downloads (all when none is named) and run them until done.",
            discussion: "Example:\n  packs resume d-7k2m9x4q")

        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags

        @Argument(help: "Download ids (see packs status).")
        var ids: [String] = []

        @Flag(
            name: .customLong("allow-metered"),
            help: "Let these downloads (all when none is named) run on a metered connection, whatever their size.")
        var allowMetered = false

        @OptionGroup var agent: AgentOptions

        func run() async throws {
            // The agent's API takes no receipt and no metered consent yet: with those, the resume runs here.
            if !self.allowMetered, self.transfer.receipt == nil, let link = AgentLink.serving(self.global, self.agent) {
                let code = try AgentLink.run { try link.resume(self.ids, mode: ProgressDisplay.Mode(global: self.global)) }
                if code != 0 { throw ExitCode(code) }
                return
            }
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let queue = try openQueue(self.global, self.transfer.configuration())
                defer { queue.close() }
                let session = RunSession(queue: queue, global: self.global)
                return try await session.run { () throws(PackDeliveryError) in
                    if let receipt = self.transfer.currentReceipt() {
                        // A renewed receipt replaces the stored one, so that a later resume needs no flag either.
                        let wanted = Set(self.ids)
                        let transactions = try queue.transactions().filter { transaction in
                            wanted.isEmpty || transaction.downloads.contains { wanted.contains($0.id) }
                        }
                        try queue.setReceipt(receipt, forTransactions: transactions.map(\.id))
                    }
                    var resumed = Set<String>()
                    if self.allowMetered {
                        // The user's explicit yes, before the resume: those waiting for an unmetered connection go now,
                        // and a resume does not pause them again first.
                        let waiting = try queue.transactions().flatMap(\.downloads)
                            .filter { $0.pauseReason == .waitingForUnmeteredNetwork }.map(\.id)
                        resumed.formUnion(try queue.allowMetered(self.ids.isEmpty ? waiting : self.ids))
                    }
                    resumed.formUnion(try queue.resume(self.ids.isEmpty ? nil : self.ids))
                    let downloads = try queue.transactions().flatMap(\.downloads)
                    // Resumed on a metered connection, outside the window or while quiet is held, a pack the policy holds
                    // waits again at once: followed, so that the run says so (exit 75) rather than nothing.
                    let wanted = Set(self.ids)
                    let held: Set<PauseReason> = [.waitingForUnmeteredNetwork, .outsideWindow, .quiet]
                    resumed.formUnion(
                        downloads.filter { $0.pauseReason.map(held.contains) == true && (wanted.isEmpty || wanted.contains($0.id)) }
                            .map(\.id))
                    if !self.global.quiet {
                        let states = Dictionary(downloads.map { ($0.id, $0.state) }, uniquingKeysWith: { a, _ in a })
                        for id in self.ids where !resumed.contains(id) {
                            let why =
                                states[id].map { $0.isSettled ? "is \($0.rawValue)" : "is being run by another packs process" }
                                ?? "is not in an open transaction"
                            printError("packs: \(PackDeliveryError.printable(id)) \(why); nothing to resume.")
                        }
                    }
                    // The transactions of the downloads named are finished as the command that recorded them chose
                    // (`fetch` finishes unless --no-finish: the transaction's autoFinish).
                    let named = Set(downloads.filter { resumed.contains($0.id) }.map(\.transactionID))
                    // Prefetch packs go on after their transaction finished: followed too.
                    let open = Set(downloads.map(\.id))
                    let afterFinish = try queue.downloads(resumed.filter { !open.contains($0) }.sorted())
                    return RunSession.Follow(
                        downloads: downloads.filter { resumed.contains($0.id) } + afterFinish, finishingAllFinishable: self.ids.isEmpty,
                        finishingIfAsked: named)
                }
            }
            if code != 0 { throw ExitCode(code) }
        }
    }

    struct Pause: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Pause downloads, keeping their partial data (takes effect on a running fetch within a second).",
            discussion: "Example:\n  packs pause d-7k2m9x4q")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Download ids.") var ids: [String]
        @OptionGroup var agent: AgentOptions
        func validate() throws { if self.ids.isEmpty { throw ValidationError("Name the downloads to pause (see packs status).") } }
        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) { return try AgentLink.run { try link.control(self.ids, "pause") } }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                try queue.pause(self.ids)
            }
        }
    }

    struct Priority: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change how soon waiting downloads start (a running fetch takes it within a second).",
            discussion: """
                Priorities, first to last: userInitiated (or high), essential (or normal: a purchase's default), restore \
                (a restore's default), prefetch, background (or low). Waiting downloads start by priority, then in the \
                order they were added; a running download keeps running.

                Example:
                  packs priority d-7k2m9x4q high
                """)
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Download ids, then the priority.") var words: [String]
        @OptionGroup var agent: AgentOptions

        /// The priority a word names: a level's own name, or high, normal, low.
        static func priority(_ word: String) -> DownloadPriority? {
            switch word {
            case "high": .userInitiated
            case "normal": .essential
            case "low": .background
            default: DownloadPriority(rawValue: word)
            }
        }

        func validate() throws {
            guard self.words.count >= 2, let last = self.words.last, Self.priority(last) != nil else {
                throw ValidationError(
                    "Name the downloads (see packs status), then a priority: high, normal, low, or "
                        + DownloadPriority.allCases.map(\.rawValue).joined(separator: ", ") + ".")
            }
        }

        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) {
                return try AgentLink.run { try link.setPriority(Array(self.words.dropLast()), Self.priority(self.words.last!)!) }
            }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                try queue.setPriority(Array(self.words.dropLast()), Self.priority(self.words.last!)!)
            }
        }
    }

    struct Sources: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the sources this home fetched packs from, fastest first, as measured (the order packs start in).",
            discussion: """
                A pack whose manifest names several sources starts at the best: one never measured first, then by
                throughput over one plus recent failures (each failure counts half as much after an hour).

                Example:
                  packs sources
                """)
        @OptionGroup var global: GlobalOptions
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let ranking = try queue.sourceRanking()
                if self.global.json {
                    for stats in ranking { printJSON(stats) }
                    return
                }
                if ranking.isEmpty { printLine("No source measured yet.") }
                for (rank, stats) in ranking.enumerated() {
                    let rate = stats.bytesPerSecond.map { String(format: "%.2f MB/s", $0 / 1_000_000) } ?? "no throughput yet"
                    printLine(
                        "\(rank + 1). \(PackDeliveryError.printable(stats.origin))  \(rate), \(String(format: "%.1f", stats.failures)) recent failures"
                    )
                }
            }
        }
    }

    struct Cancel: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Cancel downloads and delete their partial data and staging.",
            discussion: "Example:\n  packs cancel d-7k2m9x4q")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Download ids.") var ids: [String]
        @OptionGroup var agent: AgentOptions
        func validate() throws { if self.ids.isEmpty { throw ValidationError("Name the downloads to cancel (see packs status).") } }
        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) { return try AgentLink.run { try link.control(self.ids, "cancel") } }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                try queue.cancel(self.ids)
            }
        }
    }

    struct Finish: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Finish a transaction whose downloads are all finished or cancelled.",
            discussion: "Example:\n  packs finish t-3n8p2w6z")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "The transaction id.") var transaction: String
        @OptionGroup var agent: AgentOptions
        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) { return try AgentLink.run { try link.finish(self.transaction) } }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                try await queue.finish(self.transaction)
            }
        }
    }

    struct Verify: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check installed content against what was installed; with --repair, deliver damaged products again.",
            discussion: """
                Every file's presence, size and SHA-256 is compared with the record made at install, and files \
                that were not installed are listed. Exit 0 when everything is intact, 65 when something is \
                damaged (each difference is listed). --repair delivers the damaged products again through \
                restore transactions (from the URLs recorded at install), then verifies again.

                Examples:
                  packs verify
                  packs verify com.example.forest --repair
                """)
        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags
        @Argument(help: "Products to check (all installed ones when none is named).") var products: [String] = []
        @Flag(help: "Deliver damaged products again, then verify again.") var repair = false

        func run() async throws {
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let queue = try openQueue(self.global, self.transfer.configuration())
                defer { queue.close() }
                let ids = self.products.isEmpty ? nil : self.products
                if let ids {
                    let installed = Set(try queue.installedContent().map(\.productIdentifier))
                    if let missing = ids.first(where: { !installed.contains($0) }) {
                        throw PackDeliveryError(
                            .notInstalled, message: "Nothing is installed for \(PackDeliveryError.printable(missing)).", subject: missing)
                    }
                }
                var results = try await queue.verify(productIDs: ids)
                if self.repair, results.contains(where: { !$0.isIntact }) {
                    self.report(results, final: false)
                    let session = RunSession(queue: queue, global: self.global)
                    let code = try await session.run { () throws(PackDeliveryError) in
                        let transactions = try queue.repair(productIDs: ids)
                        return RunSession.Follow(transactions: transactions)
                    }
                    if code != 0 { return code }
                    results = try await queue.verify(productIDs: ids)
                }
                self.report(results, final: true)
                return results.allSatisfy(\.isIntact) ? 0 : ExitStatus.badData
            }
            if code != 0 { throw ExitCode(code) }
        }

        private func report(_ results: [VerifyResult], final: Bool) {
            if self.global.json {
                guard final else { return }
                printJSON(VerifyJSON(intact: results.allSatisfy(\.isIntact), contents: results.map(InstalledJSON.init)))
                return
            }
            for result in results {
                let name =
                    "\(PackDeliveryError.printable(result.content.productIdentifier)) \(PackDeliveryError.printable(result.content.contentIdentifier)) \(PackDeliveryError.printable(result.content.contentVersion))"
                if result.folderMissing {
                    printLine("damaged \(name): the folder \(result.content.contentURL.path) is missing")
                } else if result.damage.isEmpty {
                    if !self.global.quiet {
                        printLine(
                            "intact \(name)\(result.filesRecorded ? "" : " (installed before files were recorded: only its folder was checked)")"
                        )
                    }
                } else {
                    printLine("damaged \(name): \(result.damage.count) file\(result.damage.count == 1 ? "" : "s")")
                    for damage in result.damage { printLine("  \(damage.problem.rawValue)  \(PackDeliveryError.printable(damage.path))") }
                }
            }
            if final, let bad = results.first(where: { !$0.isIntact }) {
                printError(
                    "packs: Installed content is damaged (\(results.filter { !$0.isIntact }.count) of \(results.count) packs). Run packs verify --repair \(PackDeliveryError.printable(bad.content.productIdentifier)) to deliver it again."
                )
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a product's installed content.",
            discussion: "Example:\n  packs remove com.example.forest")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "A product identifier.") var product: String
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                if try queue.deleteContent(forProductID: self.product) == 0 {
                    throw PackDeliveryError(
                        .notInstalled, message: "Nothing is installed for \(PackDeliveryError.printable(self.product)).",
                        hint: "See packs content for what is installed.", subject: self.product)
                }
            }
        }
    }
}

extension Destination: ExpressibleByArgument {}

/// Opens the queue for a command; says on stderr when the state database had to be rebuilt.
func openQueue(_ global: GlobalOptions, _ configuration: DownloadQueue.Configuration) throws(PackDeliveryError) -> DownloadQueue {
    let queue = try DownloadQueue(home: global.resolvedHome, configuration: configuration, logger: global.logger)
    if let recovery = queue.storeRecovery {
        var line =
            "packs: The state database was damaged; it was moved aside to \(recovery.damagedDatabase.path) and rebuilt from the installed content (\(recovery.installsRecovered) installed pack\(recovery.installsRecovered == 1 ? "" : "s") found)."
        if !recovery.foldersNotRecognised.isEmpty {
            line +=
                " \(recovery.foldersNotRecognised.count) folder\(recovery.foldersNotRecognised.count == 1 ? " was" : "s were") kept but not recognised: \(recovery.foldersNotRecognised.prefix(5).map(\.path).joined(separator: ", "))."
        }
        if let kept = recovery.trustedPublishersRestored {
            line +=
                " Its trust was kept: \(kept) trusted publisher key\(kept == 1 ? "" : "s"), with the manifest versions and scopes accepted, read back from trust.json."
        } else {
            line +=
                " Which publishers it trusted could not be read back (trust.json is missing or damaged): every manifest is refused until trust is set again (packs trust remove \(TrustedPublisherRecord.lostTrustID), then packs trust add PUBLISHER.pub)."
        }
        line += " Open transactions were lost; fetch unfinished purchases again."
        printError(line)
    }
    return queue
}
