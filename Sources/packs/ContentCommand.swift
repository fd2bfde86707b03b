import ArgumentParser
import Foundation
import PackAgent
import PackDelivery

extension Packs {
    struct Content: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print where installed content is (all of it when no product is named).",
            discussion: """
                With a product, prints the folder of each of its packs (one line each, oldest install first); \
                with --json, one object per pack. A folder that is missing is reported (exit 65).

                Example:
                  ls "$(packs content com.example.forest)"/Contents
                """)
        @OptionGroup var global: GlobalOptions
        @Argument(help: "A product identifier.") var product: String?
        @OptionGroup var agent: AgentOptions
        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) {
                let answer = try AgentLink.run { try link.content(self.product) }
                return try await mapErrors { () throws(PackDeliveryError) in
                    try self.show(installed: answer.installed, evicted: answer.evicted, recordUse: {})
                }
            }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let installed = try queue.installedContent(forProductID: self.product)
                let evicted = try queue.evictedContent(forProductID: self.product)
                try self.show(
                    installed: installed, evicted: evicted,
                    recordUse: { if let product = self.product { try? queue.recordUse(productID: product) } })
            }
        }

        /// Prints the packs, installed and evicted, as the agent answers them or the home lists them; `recordUse`
        /// runs once the folders are handed out (through the agent, the agent recorded the use).
        private func show(
            installed: [InstalledContent], evicted: [EvictedContent], recordUse: () -> Void
        ) throws(PackDeliveryError) {
            for content in evicted {
                if self.global.json {
                    var object = EvictedJSON(content)
                    object.evicted = true
                    printJSON(object)
                } else if self.product == nil {
                    printLine(
                        "\(PackDeliveryError.printable(content.productIdentifier))\t\(PackDeliveryError.printable(content.contentVersion))\t(evicted)"
                    )
                } else if !self.global.quiet {
                    printError(
                        "packs: \(PackDeliveryError.printable(content.contentIdentifier)) of \(PackDeliveryError.printable(content.productIdentifier)) was evicted from the caches; packs use \(PackDeliveryError.printable(content.productIdentifier)) fetches it again."
                    )
                }
            }
            if installed.isEmpty, self.product != nil || evicted.isEmpty {
                throw PackDeliveryError(
                    .notInstalled,
                    message: self.product.map {
                        evicted.isEmpty
                            ? "Nothing is installed for \(PackDeliveryError.printable($0))."
                            : "The content of \(PackDeliveryError.printable($0)) was evicted from the caches."
                    } ?? "Nothing is installed.",
                    hint: evicted.isEmpty
                        ? nil : "packs use PRODUCT fetches it again, from what its eviction kept (no manifest needed).",
                    subject: self.product)
            }
            // Handing the folders out is a use: it orders evictions (least recently used first).
            recordUse()
            var missing: [InstalledContent] = []
            for content in installed {
                var isDirectory: ObjCBool = false
                if !FileManager.default.fileExists(atPath: content.contentURL.path, isDirectory: &isDirectory) || !isDirectory.boolValue {
                    missing.append(content)
                    if self.product != nil { continue }
                }
                if self.global.json {
                    var object = InstalledJSON(content)
                    object.missing = missing.last == content
                    printJSON(object)
                } else if self.product != nil {
                    printLine(content.contentURL.path)
                } else {
                    printLine(
                        "\(PackDeliveryError.printable(content.productIdentifier))\t\(PackDeliveryError.printable(content.contentVersion))\t\(content.contentURL.path)\(missing.last == content ? "\t(missing)" : "")"
                    )
                }
            }
            if let first = missing.first {
                throw PackDeliveryError(
                    .contentDamaged,
                    message:
                        "The installed folder \(first.contentURL.path) of \(PackDeliveryError.printable(first.productIdentifier)) is missing\(missing.count > 1 ? " (and \(missing.count - 1) more)" : "").",
                    subject: first.productIdentifier)
            }
        }
    }
}
