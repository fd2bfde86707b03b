import ArgumentParser
import Foundation
import Logging
import PackDelivery
import PackServer

extension Packs {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve a folder of packs and its manifest.json over HTTP (Range, If-Range, ETag).",
            discussion: "Example:\n  packs serve ./site --port 8080 --token s3cret")

        @Argument(help: "The folder to serve.") var directory: String
        @Option(help: "Address to listen on.") var host = "127.0.0.1"
        @Option(help: "Port to listen on (0 picks a free one).") var port = 8080
        @Option(help: "Require 'Authorization: Bearer TOKEN' on every request.") var token: String?
        @Flag(name: [.short, .long], help: "Print only errors.") var quiet = false

        func run() async throws {
            let folder = URL(filePath: self.directory).absoluteURL
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: folder.path, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw fail(PackDeliveryError(.invalidArgument, message: "\(folder.path) is not a folder.", hint: "Pass the folder holding manifest.json and its packs."))
            }
            var logger = Logger(label: "packs.serve", factory: { StreamLogHandler.standardError(label: $0) })
            logger.logLevel = self.quiet ? .error : .info
            do {
                try await PackServer.run(PackServerConfiguration(directory: folder, host: self.host, port: self.port, token: self.token),
                                         logger: logger) { port in
                    printLine("Serving \(folder.path) at http://\(self.host):\(port)/ (Ctrl-C stops)")
                }
            } catch {
                throw fail(PackDeliveryError(.networkFailure, message: "The server stopped: \(error).", hint: "Is the port free? Try --port 0."))
            }
        }
    }

    struct Pack: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Build a pack (zip, tar, tar.gz, tar.bz2, tar.xz or tar.zst, by the output's extension) from a content folder.",
            discussion: "Example:\n  packs pack ./forest --product com.example.forest --version 1.0 --output site/forest-1.0.zip")

        @Argument(help: "The content folder.") var folder: String
        @Option(help: "The pack file to write.") var output: String
        @Option(help: "Product identifier for ContentInfo.plist.") var product: String?
        @Option(help: "Content version for ContentInfo.plist.") var version: String?

        func validate() throws {
            if (self.product == nil) != (self.version == nil) { throw ValidationError("Give --product and --version together.") }
            if PackFormat(fileName: self.output) == nil {
                throw ValidationError("Cannot tell the format of '\(self.output)': use .zip, .tar, .tar.gz, .tar.bz2, .tar.xz or .tar.zst.")
            }
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let output = URL(filePath: self.output).absoluteURL
                let info = self.product.flatMap { product in self.version.map { (productIdentifier: product, contentVersion: $0) } }
                let unpacked = try PackWriter.write(folder: URL(filePath: self.folder).absoluteURL, to: output,
                                                    format: PackFormat(fileName: self.output)!, contentInfo: info)
                printLine("wrote \(output.path) (\(unpacked) bytes of content)")
            }
        }
    }

    struct MakeManifest: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "manifest",
            abstract: "Write DIR/manifest.json describing the packs in DIR (product and version from each ContentInfo.plist).",
            discussion: "Example:\n  packs manifest ./site")

        @Argument(help: "The folder holding the packs.") var directory: String

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let manifest = try ManifestBuilder.write(folder: URL(filePath: self.directory).absoluteURL)
                let count = manifest.products.reduce(0) { $0 + $1.contents.count }
                printLine("wrote \(URL(filePath: self.directory).appending(path: "manifest.json").path): \(manifest.products.count) products, \(count) packs")
            }
        }
    }

    struct Demo: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Build packs from SampleContent, serve them on loopback and fetch them, showing progress.",
            discussion: "Example:\n  packs demo --home /tmp/packs-demo")

        @OptionGroup var global: GlobalOptions
        @Option(help: "The folder of sample packs (default: SampleContent beside the package or the current folder).")
        var samples: String?

        func run() async throws {
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let samples = try self.findSamples()
                let site = FileManager.default.temporaryDirectory.appending(path: "packs-demo-\(getpid())")
                defer { try? FileManager.default.removeItem(at: site) }
                try? FileManager.default.createDirectory(at: site, withIntermediateDirectories: true)
                let folders = ((try? FileManager.default.contentsOfDirectory(atPath: samples.path)) ?? []).sorted()
                    .filter { FileManager.default.fileExists(atPath: samples.appending(path: "\($0)/ContentInfo.plist").path) }
                let formats: [PackFormat] = [.zip, .tarGzip, .tarXz, .tarZstd]
                for (index, name) in folders.enumerated() {
                    let format = formats[index % formats.count]
                    try PackWriter.write(folder: samples.appending(path: name), to: site.appending(path: "\(name).\(format.rawValue)"), format: format)
                }
                let manifest = try ManifestBuilder.write(folder: site)
                var logger = Logger(label: "packs.demo.server", factory: { StreamLogHandler.standardError(label: $0) })
                logger.logLevel = self.global.verbose ? .info : .error
                let server: RunningPackServer
                do {
                    server = try await PackServer.start(PackServerConfiguration(directory: site, port: 0), logger: logger)
                } catch {
                    throw PackDeliveryError(.networkFailure, message: "The demo server could not start: \(error).")
                }
                let manifestURL = server.baseURL.appending(path: "manifest.json")
                if !self.global.quiet && !self.global.json {
                    printLine("Serving \(manifest.products.count) sample packs from \(samples.path) at \(server.baseURL.absoluteString)")
                }
                let home = self.global.resolvedHome
                let loaded = try LoadedManifest.load(manifestURL.absoluteString)
                let queue = try DownloadQueue(home: home, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false),
                                              logger: self.global.logger)
                let code = try await RunSession(queue: queue, global: self.global).run { () throws(PackDeliveryError) in
                    let transactions = try queue.add(products: manifest.products.map(\.productIdentifier), from: loaded, autoFinish: true, force: true)
                    return RunSession.Follow(downloads: transactions.flatMap(\.downloads), finishing: Set(transactions.map(\.id)))
                }
                if code == 0 && !self.global.quiet && !self.global.json {
                    printLine("\nContent landed in:")
                    for content in try queue.installedContent() {
                        printLine("  \(content.productIdentifier) \(content.contentVersion): \(content.contentURL.path)")
                    }
                    printLine("Try: packs\(self.global.home.map { " --home \($0)" } ?? "") content")
                }
                queue.close()
                await server.stop()
                return code
            }
            if code != 0 { throw ExitCode(code) }
        }

        private func findSamples() throws(PackDeliveryError) -> URL {
            var candidates: [URL] = []
            if let samples { candidates.append(URL(filePath: samples).absoluteURL) }
            candidates.append(URL(filePath: FileManager.default.currentDirectoryPath).appending(path: "SampleContent"))
            // The package root, from the executable in .build/<config>/packs.
            var folder = URL(filePath: CommandLine.arguments[0]).absoluteURL.resolvingSymlinksInPath().deletingLastPathComponent()
            for _ in 0..<5 {
                candidates.append(folder.appending(path: "SampleContent"))
                folder = folder.deletingLastPathComponent()
            }
            if let found = candidates.first(where: { FileManager.default.fileExists(atPath: $0.path) }) { return found }
            throw PackDeliveryError(.invalidArgument, message: "Cannot find the SampleContent folder.", hint: "Run packs demo from the package folder, or pass --samples DIR.")
        }
    }
}
