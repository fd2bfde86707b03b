import ArgumentParser
import Foundation
import PackDelivery

extension Packs {
    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write what another machine needs to install a product with no network: its manifest, packs and indexes.",
            discussion: """
                The manifest the product's newest transaction came from is read again as is (with its signature, \
                manifest.json.sig, when it has one) and checked against the trusted publishers; each of the product's \
                packs and indexes is fetched and checked against the manifest's SHA-256 and length, into DIR/packs/. \
                On the other machine, packs fetch DIR/manifest.json PRODUCT installs from those copies (export.json \
                beside the manifest says to use them), checked as any fetch, with no network. A manifest read from \
                under a trusted TUF repository is checked through TUF, and the export carries the repository's \
                metadata (DIR/tuf/metadata/): the other home must trust the same repository's root, and installs only \
                what that metadata, brought up to date from the export, vouches for.

                Example:
                  packs export com.example.forest --to /media/usb/forest
                  packs --home /other fetch /media/usb/forest/manifest.json com.example.forest --trust publisher.pub
                """)

        @OptionGroup var global: GlobalOptions
        @OptionGroup var transfer: TransferFlags

        @Argument(help: "The product to export.")
        var product: String

        @Option(help: ArgumentHelp("The folder to write (created when missing).", valueName: "dir"))
        var to: String

        @Option(
            help: ArgumentHelp("Trust manifests signed by this publisher's public key, besides the home's; repeatable.", valueName: "pub"))
        var trust: [String] = []

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let publishers = try self.trust.map { path throws(PackDeliveryError) in try readPublisherKey(path) }
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let folder = URL(filePath: self.to).absoluteURL
                let export = try queue.exportForOffline(
                    product: self.product, to: folder, trusting: publishers, options: self.transfer.configuration().transfer)
                if self.global.json {
                    printJSON(
                        ExportJSON(
                            manifest: export.manifest.path, signed: export.signed, packs: export.packs, bytes: export.bytes,
                            tufRepository: export.tufRepository))
                } else if !self.global.quiet {
                    let tufNote = export.tufRepository.map { ", with the metadata of the TUF repository \($0)" } ?? ""
                    printLine(
                        "Exported \(self.product) (\(export.packs.count) pack\(export.packs.count == 1 ? "" : "s"), \(export.bytes) bytes\(export.signed ? ", signed manifest" : "")\(tufNote)) to \(folder.path)."
                    )
                    printLine("Install it elsewhere with: packs fetch \(export.manifest.path) \(self.product)")
                }
            }
        }
    }
}

/// `packs export --json`: one line.
struct ExportJSON: Encodable {
    var event = "exported"
    let manifest: String
    let signed: Bool
    let packs: [String]
    let bytes: Int64
    /// The TUF repository whose metadata the export carries, when one vouched for the manifest.
    let tufRepository: String?
}
