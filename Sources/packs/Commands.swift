import ArgumentParser
import Foundation
import PackDelivery

extension Packs {
    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Record a purchase of products, download their packs and install them.",
            discussion: """
                Example:
                  packs --home ./store fetch http://127.0.0.1:8080/manifest.json com.example.forest --to documents
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags

        @Argument(help: "The manifest: an http(s) URL, a file:// URL or a local path.")
        var manifest: String

        @Argument(help: "Product identifiers to fetch.")
        var products: [String]

        @Option(help: "Where to install: caches (may be purged) or documents (kept).")
        var to: Destination = .caches

        @Flag(name: .customLong("no-finish"), help: "Leave the transactions unfinished (finish them later with packs finish).")
        var noFinish = false

        @Flag(help: "Record the transactions as restores of earlier purchases.")
        var restore = false

        @Flag(help: "Download again even when the same version is installed.")
        var force = false

        func validate() throws {
            if self.products.isEmpty { throw ValidationError("Name at least one product identifier to fetch.") }
        }

        func run() async throws {
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let loaded = try LoadedManifest.load(self.manifest, options: self.transfer.options)
                for product in self.products where loaded.manifest.product(product) == nil {
                    let known = loaded.manifest.products.map(\.productIdentifier).joined(separator: ", ")
                    throw PackDeliveryError(.unknownProduct, message: "The manifest has no product '\(product)'.",
                                            hint: known.isEmpty ? "It lists no products." : "It lists: \(known).", subject: product)
                }
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: self.transfer.configuration(), logger: self.global.logger)
                defer { queue.close() }
                let session = RunSession(queue: queue, global: self.global)
                return try await session.run { () throws(PackDeliveryError) in
                    try self.products.map { product throws(PackDeliveryError) in
                        try queue.add(product: product, from: loaded, kind: self.restore ? .restored : .purchased,
                                      destination: self.to, autoFinish: !self.noFinish, force: self.force)
                    }.flatMap(\.downloads).map(\.id)
                }
            }
            if code != 0 { throw ExitCode(code) }
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

        func run() async throws {
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: self.transfer.configuration(), logger: self.global.logger)
                defer { queue.close() }
                let session = RunSession(queue: queue, global: self.global)
                return try await session.run(finishingAll: self.ids.isEmpty) { () throws(PackDeliveryError) in
                    let resumed = try queue.resume(self.ids.isEmpty ? nil : self.ids)
                    if !self.global.quiet {
                        let states = Dictionary(try queue.transactions().flatMap(\.downloads).map { ($0.id, $0.state) }, uniquingKeysWith: { a, _ in a })
                        for id in self.ids where !resumed.contains(id) {
                            let why = states[id].map { $0.isSettled ? "is \($0.rawValue)" : "is being run by another packs process" } ?? "is not in an open transaction"
                            FileHandle.standardError.write(Data("packs: \(id) \(why); nothing to resume.\n".utf8))
                        }
                    }
                    return resumed
                }
            }
            if code != 0 { throw ExitCode(code) }
        }
    }

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List open (unfinished) transactions and their downloads.",
            discussion: "Example:\n  packs --json status")

        @OptionGroup var global: GlobalOptions

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                let transactions = try queue.transactions()
                if self.global.json {
                    printLine(JSONOutput.encode(["transactions": transactions.map(JSONOutput.transaction)]))
                    return
                }
                if transactions.isEmpty { printLine("No open transactions."); return }
                for transaction in transactions {
                    printLine("\(transaction.id)  \(transaction.productIdentifier)  \(transaction.kind.rawValue)\(transaction.isFinishable ? "  (finishable)" : "")")
                    for download in transaction.downloads {
                        var line = "  \(download.id)  \(download.state.rawValue)"
                        if let reason = download.pauseReason { line += " (\(reason.rawValue))" }
                        line += "  \(Int((download.progress * 100).rounded(.down)))%  \(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(download.contentLength))  \(download.contentIdentifier) \(download.contentVersion)"
                        if let error = download.error { line += "  — \(error.message)" }
                        printLine(line)
                    }
                }
            }
        }
    }

    struct Pause: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pause downloads, keeping their partial data (takes effect on a running fetch within a second).",
                                                        discussion: "Example:\n  packs pause d-7k2m9x4q")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Download ids.") var ids: [String]
        func validate() throws { if self.ids.isEmpty { throw ValidationError("Name the downloads to pause (see packs status).") } }
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                try queue.pause(self.ids)
            }
        }
    }

    struct Cancel: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Cancel downloads and delete their partial data and staging.",
                                                        discussion: "Example:\n  packs cancel d-7k2m9x4q")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Download ids.") var ids: [String]
        func validate() throws { if self.ids.isEmpty { throw ValidationError("Name the downloads to cancel (see packs status).") } }
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                try queue.cancel(self.ids)
            }
        }
    }

    struct Finish: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Finish a transaction whose downloads are all finished or cancelled.",
                                                        discussion: "Example:\n  packs finish t-3n8p2w6z")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "The transaction id.") var transaction: String
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                try queue.finish(self.transaction)
            }
        }
    }

    struct Content: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print where installed content is (all of it when no product is named).",
                                                        discussion: "Example:\n  ls \"$(packs content com.example.forest)\"/Contents")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "A product identifier.") var product: String?
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                let installed = try queue.installedContent(forProductID: self.product)
                if let product = self.product, installed.isEmpty {
                    throw PackDeliveryError(.notInstalled, message: "Nothing is installed for \(product).", subject: product)
                }
                for content in installed {
                    if self.global.json {
                        printLine(JSONOutput.encode(JSONOutput.content(content)))
                    } else if self.product != nil {
                        printLine(content.contentURL.path)
                    } else {
                        printLine("\(content.productIdentifier)\t\(content.contentVersion)\t\(content.contentURL.path)")
                    }
                }
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a product's installed content.",
                                                        discussion: "Example:\n  packs remove com.example.forest")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "A product identifier.") var product: String
        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try DownloadQueue(home: self.global.resolvedHome, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false))
                defer { queue.close() }
                if try queue.deleteContent(forProductID: self.product) == 0 {
                    throw PackDeliveryError(.notInstalled, message: "Nothing is installed for \(self.product).", hint: "See packs content for what is installed.", subject: self.product)
                }
            }
        }
    }
}

extension Destination: ExpressibleByArgument {}
