import ArgumentParser
import Foundation
import PackDelivery

/// `packs tuf-client`: tuf-conformance's client-under-test interface (its CLIENT-CLI.md) over ``TUFUpdater``.
/// Hidden from `--help`; it exits 0 on success and 1 on any failure, as that interface requires.
struct TUFClient: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tuf-client",
        abstract: "A TUF client for tuf-conformance: init ROOT, refresh, download.",
        shouldDisplay: false)

    @Option(name: .customLong("metadata-dir"), help: "The folder of trusted metadata.") var metadataDir: String
    @Option(name: .customLong("metadata-url"), help: "The repository's metadata URL.") var metadataURL: String?
    @Option(name: .customLong("target-name"), help: "A target path to download (repeatable).") var targetNames: [String] = []
    @Option(name: .customLong("target-dir"), help: "Where downloaded targets go.") var targetDir: String?
    @Option(name: .customLong("target-base-url"), help: "The repository's targets URL.") var targetBaseURL: String?
    @Flag(name: .shortAndLong, help: "More output (accepted, ignored).") var verbose: Int
    @Argument(help: "init, refresh or download.") var command: String
    @Argument(help: "For init: the trusted root.json.") var trustedRoot: String?

    func run() async throws {
        do throws(PackDeliveryError) {
            try self.perform()
        } catch {
            printError("packs tuf-client: " + error.message)
            throw ExitCode(1)
        }
    }

    private func perform() throws(PackDeliveryError) {
        let folder = URL(filePath: self.metadataDir)
        switch self.command {
        case "init":
            guard let path = self.trustedRoot else { throw Self.usage("init needs the trusted root.json") }
            guard let data = FileManager.default.contents(atPath: path) else {
                throw PackDeliveryError(.fileSystem, message: "Cannot read \(PackDeliveryError.printable(path)).")
            }
            try TUFUpdater.initialize(metadataFolder: folder, trustedRoot: data)
        case "refresh":
            var updater = try self.updater(folder)
            try updater.refresh()
        case "download":
            guard let targetDir = self.targetDir, !self.targetNames.isEmpty else {
                throw Self.usage("download needs --target-name and --target-dir")
            }
            var updater = try self.updater(folder)
            for name in self.targetNames {
                guard let target = try updater.targetInfo(name) else {
                    throw PackDeliveryError(.unknownProduct, message: "No target \(PackDeliveryError.printable(name)) in the repository.")
                }
                _ = try updater.download(target, into: URL(filePath: targetDir))
            }
        default:
            throw Self.usage("unknown command \(PackDeliveryError.printable(self.command))")
        }
    }

    private func updater(_ folder: URL) throws(PackDeliveryError) -> TUFUpdater {
        guard let text = self.metadataURL, let url = URL(string: text) else { throw Self.usage("--metadata-url is needed") }
        return TUFUpdater(metadataFolder: folder, metadataURL: url, targetBaseURL: self.targetBaseURL.flatMap { URL(string: $0) })
    }

    private static func usage(_ why: String) -> PackDeliveryError {
        PackDeliveryError(.invalidArgument, message: "tuf-client: \(why).")
    }
}
