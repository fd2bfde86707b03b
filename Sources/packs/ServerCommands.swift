import ArgumentParser
import Foundation
import Logging
import PackDelivery
import PackServer

extension Packs {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve a folder of packs and its manifest.json over HTTP (Range, If-Range, ETag), or gate nginx in front of it.",
            discussion: """
                The token can come from --token, --token-file FILE or the PACKS_TOKEN environment variable; prefer the file \
                or the variable, which do not show in ps. With --auth-only nothing is served: the server answers nginx \
                auth_request subrequests (204, 401 or 403) for the pack named by X-Original-URI, and nginx sends the bytes.

                With --receipt-key, a pack is served to a signed receipt naming its product. --sandbox-receipt-key also                 accepts test receipts (packs receipt --sandbox) signed with a sandbox key: production keys are tried                 first, sandbox keys second, and a key signs for one environment only (a receipt claiming the other is                 refused with 401). A sandbox receipt opens the same products; the request log marks it                 environment=sandbox, the metrics count it under environment="sandbox", and --auth-only answers                 X-Receipt-Environment: sandbox (production otherwise). --no-sandbox refuses every sandbox receipt                 with 401.

                Examples:
                  packs serve ./site --port 8080 --token-file /etc/packs/token
                  PACKS_TOKEN=s3cret packs serve ./site --auth-only --port 9090
                  packs serve ./site --receipt-key store.pub --sandbox-receipt-key test.pub
                """)

        @Argument(help: "The folder to serve (with --auth-only: the folder holding manifest.json).") var directory: String
        @Option(help: "Address to listen on.") var host = "127.0.0.1"
        @Option(help: "Port to listen on (0 picks a free one).") var port = 8080
        @Option(help: "Require 'Authorization: Bearer TOKEN' on every request (visible in ps: prefer --token-file or PACKS_TOKEN).")
        var token: String?
        @Option(name: .customLong("token-file"), help: ArgumentHelp("Read the token from this file (its first line).", valueName: "file"))
        var tokenFile: String?
        @Option(
            name: .customLong("receipt-key"),
            help: ArgumentHelp(
                "Serve a pack only to a signed receipt (packs receipt) that names its product, checked with this store public key; repeatable.",
                valueName: "pub"))
        var receiptKeys: [String] = []
        @Option(
            name: .customLong("sandbox-receipt-key"),
            help: ArgumentHelp(
                "Also serve sandbox (test) receipts (packs receipt --sandbox) checked with this key, after the --receipt-key ones; repeatable.",
                valueName: "pub"))
        var sandboxReceiptKeys: [String] = []
        @Flag(
            name: .customLong("no-sandbox"),
            help: "Refuse every sandbox receipt with 401 (for a server that must); not with --sandbox-receipt-key.")
        var noSandbox = false
        @Flag(name: .customLong("auth-only"), help: "Serve no file: answer nginx auth_request subrequests with 204, 401 or 403.")
        var authOnly = false
        @Flag(name: .customLong("serve-dotfiles"), help: "Also serve files and folders whose names start with '.' (.git, .env).")
        var serveDotfiles = false
        @Option(
            name: .customLong("request-timeout"),
            help: ArgumentHelp("Seconds a client may take to send a whole request.", valueName: "seconds"))
        var requestTimeout: Double = 60
        @Option(
            name: .customLong("idle-timeout"),
            help: ArgumentHelp("Seconds a connection may wait for its next request.", valueName: "seconds"))
        var idleTimeout: Double = 60
        @Option(
            name: .customLong("send-timeout"),
            help: ArgumentHelp("Seconds a response may wait for the client to take bytes.", valueName: "seconds"))
        var sendTimeout: Double = 60
        @Option(name: .customLong("max-connections"), help: "Most connections at once (default: what the descriptor limit allows).")
        var maxConnections: Int?
        @Option(
            name: .customLong("metrics-address"),
            help: ArgumentHelp(
                "Serve Prometheus metrics at http://HOST:PORT/metrics, a listener of its own (e.g. 127.0.0.1:9464; port 0 picks a free one).",
                valueName: "host:port"))
        var metricsAddress: String?
        @Option(
            help: ArgumentHelp(
                "Hand out the preload keys of this folder (files of 32 bytes, packs keygen --preload) at GET /keys/KEYID: to a receipt of a product whose pack the manifest marks with the key, from the manifest's release date on (403 before). Needs --receipt-key.",
                valueName: "dir"))
        var keys: String?
        @Flag(name: [.short, .long], help: "Print only errors.") var quiet = false

        func validate() throws {
            if self.token != nil && self.tokenFile != nil { throw ValidationError("Give --token or --token-file, not both.") }
            if self.keys != nil, self.receiptKeys.isEmpty && self.sandboxReceiptKeys.isEmpty || self.authOnly {
                throw ValidationError("--keys hands keys to receipts: give --receipt-key, and no --auth-only.")
            }
            if self.noSandbox && !self.sandboxReceiptKeys.isEmpty {
                throw ValidationError("--no-sandbox refuses sandbox receipts, which --sandbox-receipt-key accepts: give one of them.")
            }
            for (name, value) in [
                ("--request-timeout", self.requestTimeout), ("--idle-timeout", self.idleTimeout), ("--send-timeout", self.sendTimeout),
            ]
            where !(value > 0 && value <= 86_400) {
                throw ValidationError("\(name) must be a number of seconds between 0 and 86400.")
            }
            if let maxConnections, maxConnections < 1 { throw ValidationError("--max-connections must be at least 1.") }
            // NIO would take the port modulo 65536 (70000 listens on 4464).
            if !(0...65535).contains(self.port) { throw ValidationError("--port takes a port from 0 to 65535 (0 picks a free one).") }
            if let metricsAddress, Self.parseAddress(metricsAddress) == nil {
                throw ValidationError("--metrics-address takes HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464.")
            }
        }

        /// `HOST:PORT` or `[IPV6]:PORT`, the port from 0 to 65535.
        static func parseAddress(_ text: String) -> PackServerConfiguration.MetricsAddress? {
            guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
                return nil
            }
            var host = text[..<colon]
            if host.hasPrefix("["), host.hasSuffix("]") {
                host = host.dropFirst().dropLast()
            } else if host.contains(":") {
                return nil
            }
            guard !host.isEmpty else { return nil }
            return PackServerConfiguration.MetricsAddress(host: String(host), port: port)
        }

        func run() async throws {
            let folder = URL(filePath: self.directory).absoluteURL
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: folder.path, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw fail(
                    PackDeliveryError(
                        .invalidArgument, message: "\(folder.path) is not a folder.",
                        hint: "Pass the folder holding manifest.json and its packs."))
            }
            let token = try self.resolvedToken()
            let authorizer = try self.receiptAuthorizer()
            if self.authOnly && token == nil && authorizer == nil {
                throw fail(
                    PackDeliveryError(
                        .invalidArgument, message: "--auth-only needs a credential to check.",
                        hint: "Give --token-file FILE or set PACKS_TOKEN."))
            }
            Self.raiseDescriptorLimit()
            var logger = Logger(label: "packs.serve", factory: { SafeLogHandler(label: $0) })
            logger.logLevel = self.quiet ? .error : .info
            let limits = PackServerConfiguration.Limits(
                requestTimeout: .milliseconds(Int64(self.requestTimeout * 1000)),
                idleTimeout: .milliseconds(Int64(self.idleTimeout * 1000)),
                sendTimeout: .milliseconds(Int64(self.sendTimeout * 1000)),
                // nginx's 5 s, or less when the request timeout is shorter.
                lingeringTimeout: .milliseconds(Int64(min(5, self.requestTimeout) * 1000)),
                maxConnections: self.maxConnections
            )
            var configuration = PackServerConfiguration(
                directory: folder, host: self.host, port: self.port, token: token, authorizer: authorizer,
                mode: self.authOnly ? .authOnly : .files,
                servesDotfiles: self.serveDotfiles, limits: limits)
            let metricsAddress = self.metricsAddress.flatMap(Self.parseAddress)
            configuration.metricsAddress = metricsAddress
            if let keys = self.keys {
                do throws(PackDeliveryError) {
                    configuration.preloadKeys = try PreloadKeyStore(folder: URL(filePath: keys).absoluteURL)
                } catch { throw fail(error) }
                configuration.now = TestHooks.clock()
            }
            do {
                try await PackServer.run(configuration, logger: logger) { (port: Int, metricsPort: Int?) in
                    let what = self.authOnly ? "Answering auth subrequests for" : "Serving"
                    // One line, so that whoever reads the port finds both.
                    var metrics = ""
                    if let address = metricsAddress, let metricsPort {
                        let host = address.host.contains(":") ? "[\(address.host)]" : address.host
                        metrics = "; metrics at http://\(host):\(metricsPort)/metrics"
                    }
                    printLine("\(what) \(folder.path) at http://\(self.host):\(port)/ (Ctrl-C stops)\(metrics)")
                }
            } catch {
                throw fail(
                    PackDeliveryError(.networkFailure, message: "The server stopped: \(error).", hint: "Is the port free? Try --port 0."))
            }
        }

        /// The authorizer of --receipt-key and --sandbox-receipt-key, or nil when neither is given.
        private func receiptAuthorizer() throws -> (any PackAuthorizer)? {
            guard !self.receiptKeys.isEmpty || !self.sandboxReceiptKeys.isEmpty else { return nil }
            do throws(PackDeliveryError) {
                let keys = try self.receiptKeys.map { path throws(PackDeliveryError) in try readPublisherKey(path) }
                let sandboxKeys = try self.sandboxReceiptKeys.map { path throws(PackDeliveryError) in try readPublisherKey(path) }
                if let index = sandboxKeys.firstIndex(where: keys.contains) {
                    throw PackDeliveryError(
                        .invalidArgument,
                        message:
                            "\(PackDeliveryError.printable(self.sandboxReceiptKeys[index])) is given as both a --receipt-key and a --sandbox-receipt-key.",
                        hint: "A key signs for one environment only: sign test receipts with a key of their own (packs keygen).",
                        subject: self.sandboxReceiptKeys[index])
                }
                return ReceiptAuthorizer(keys: keys, sandboxKeys: sandboxKeys)
            } catch {
                throw fail(error)
            }
        }

        /// The token from --token, else the first line of --token-file, else PACKS_TOKEN; nil for none.
        private func resolvedToken() throws -> String? {
            if let token { return token }
            if let tokenFile {
                guard let data = FileManager.default.contents(atPath: tokenFile) else {
                    throw fail(
                        PackDeliveryError(
                            .invalidArgument, message: "Cannot read the token file \(tokenFile).",
                            hint: "Check that it exists and that this user may read it."))
                }
                let token =
                    String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).first
                    .map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
                guard !token.isEmpty else {
                    throw fail(
                        PackDeliveryError(
                            .invalidArgument, message: "The token file \(tokenFile) is empty.", hint: "Write the token on its first line."))
                }
                return token
            }
            if let token = ProcessInfo.processInfo.environment["PACKS_TOKEN"], !token.isEmpty { return token }
            return nil
        }

        /// Raises the soft descriptor limit to the hard one (as Go and nginx's worker_rlimit_nofile
        /// do): the connection limit is derived from it.
        private static func raiseDescriptorLimit() {
            var limit = rlimit()
            guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
            limit.rlim_cur = min(limit.rlim_max, 1 << 20)
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
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
        @Option(
            help: ArgumentHelp(
                "The average chunk size in KiB, a power of two from 1 to 16384 (chunks run from half of it to eight times it).",
                valueName: "KiB"))
        var chunkAverage: Int = Chunker.standard.average >> 10
        @Option(
            help: ArgumentHelp(
                "Encrypt the pack for a preload with this key (a file of 32 bytes, from packs keygen --preload NAME): writes the pack encrypted with AES-256-GCM and OUTPUT.preload.json for packs manifest. Needs --product, --version and --releases.",
                valueName: "keyfile"))
        var encrypt: String?
        @Option(help: ArgumentHelp("When a preload's key is released, ISO 8601 (2026-12-01T00:00:00Z).", valueName: "date"))
        var releases: String?

        /// The default (32) gives ``Chunker/standard``.
        var chunker: Chunker? {
            Chunker(minimum: self.chunkAverage << 9, average: self.chunkAverage << 10, maximum: min(64 << 20, self.chunkAverage << 13))
        }

        func validate() throws {
            if (self.product == nil) != (self.version == nil) { throw ValidationError("Give --product and --version together.") }
            if (self.encrypt == nil) != (self.releases == nil) { throw ValidationError("Give --encrypt and --releases together.") }
            if self.encrypt != nil, self.product == nil { throw ValidationError("--encrypt needs --product and --version.") }
            if let releases, Manifest.Content.Preload.date(releases) == nil {
                throw ValidationError("--releases takes an ISO 8601 date and time, like 2026-12-01T00:00:00Z.")
            }
            if self.chunker == nil { throw ValidationError("--chunk-average takes a power of two from 1 to 16384 (KiB).") }
            if PackFormat(fileName: self.output) == nil {
                throw ValidationError("Cannot tell the format of '\(self.output)': use .zip, .tar, .tar.gz, .tar.bz2, .tar.xz or .tar.zst.")
            }
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let output = URL(filePath: self.output).absoluteURL
                let info = self.product.flatMap { product in self.version.map { (productIdentifier: product, contentVersion: $0) } }
                if let encrypt = self.encrypt, let info, let releases = self.releases {
                    let key = try PreloadKey(contentsOf: URL(filePath: encrypt))
                    let unpacked = try PreloadPack.write(
                        folder: URL(filePath: self.folder).absoluteURL, to: output, format: PackFormat(fileName: self.output)!,
                        contentInfo: info, chunker: self.chunker ?? .standard, key: key, releases: releases)
                    printLine(
                        "wrote \(output.path) (\(unpacked) bytes of content, encrypted with key \(key.keyID), released \(releases)), its index and \(PreloadPack.descriptionURL(for: output).lastPathComponent)"
                    )
                    return
                }
                let unpacked = try PackWriter.write(
                    folder: URL(filePath: self.folder).absoluteURL, to: output,
                    format: PackFormat(fileName: self.output)!, contentInfo: info, chunker: self.chunker ?? .standard)
                printLine(
                    "wrote \(output.path) (\(unpacked) bytes of content) and its index \(PackWriter.indexURL(for: output).lastPathComponent)"
                )
            }
        }
    }

    struct MakeManifest: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "manifest",
            abstract: "Write DIR/manifest.json describing the packs in DIR (product and version from each ContentInfo.plist).",
            discussion: "Example:\n  packs manifest ./site")

        @Argument(help: "The folder holding the packs.") var directory: String

        @Option(
            help: ArgumentHelp(
                "Sign the manifest with this publisher key (a .key file from packs keygen): writes manifest.json.sig beside it.",
                valueName: "key"))
        var sign: String?

        @Option(
            name: .customLong("manifest-version"),
            help: "The signed manifest's version (default: one more than the manifest.json it replaces, else 1).")
        var manifestVersion: Int?

        @Option(
            help: ArgumentHelp(
                "How long the signed manifest stays valid: a number of days (30d), hours (12h) or minutes (90m).", valueName: "duration"))
        var expires: String?

        @Option(
            help: ArgumentHelp(
                "What the signed manifest's version counts; clients keep a rollback mark per publisher and scope (default: the scope of the manifest.json it replaces, else its one product's identifier, else the folder's name).",
                valueName: "name"))
        var scope: String?

        @Option(
            name: .customLong("mirror"), parsing: .upToNextOption,
            help: ArgumentHelp(
                "Base URLs the packs are also served from, tried in this order before the manifest's own place (the manifest's mirrors).",
                valueName: "url"))
        var mirrors: [String] = []

        @Option(
            help: ArgumentHelp(
                "A pack's delivery policy: essential (the default: a purchase waits for it), prefetch (fetched after, at a lower priority) or onDemand (fetched only when asked for, by packs use); repeatable.",
                valueName: "pack=policy"))
        var delivery: [String] = []

        /// `--delivery` as policies by content identifier, or the first that cannot be read.
        func policies() -> Result<[String: DeliveryPolicy], ValidationError> {
            var policies: [String: DeliveryPolicy] = [:]
            for item in self.delivery {
                guard let equals = item.lastIndex(of: "="),
                    let policy = DeliveryPolicy(rawValue: String(item[item.index(after: equals)...])),
                    equals != item.startIndex
                else {
                    return .failure(ValidationError("--delivery takes PACK=POLICY, the policy essential, prefetch or onDemand: '\(item)'."))
                }
                policies[String(item[..<equals])] = policy
            }
            return .success(policies)
        }

        func validate() throws {
            _ = try self.policies().get()
            if self.sign == nil, self.manifestVersion != nil || self.expires != nil || self.scope != nil {
                throw ValidationError("--manifest-version, --expires and --scope apply to a signed manifest: add --sign KEY.")
            }
            if let expires, Self.seconds(expires) == nil {
                throw ValidationError("--expires takes a duration like 30d, 12h or 90m, of at most 36500d.")
            }
            if let manifestVersion, manifestVersion < 1 { throw ValidationError("--manifest-version takes a whole number from 1.") }
        }

        /// A duration (`30d`, `12h`, `90m`) in seconds: above 0 and at most ``Receipt/maxLifetime`` (100 years), else
        /// nil (`inf`, `nan` and `1e300h` included).
        static func seconds(_ text: String) -> TimeInterval? {
            guard let unit = text.last, let count = Double(text.dropLast()), count > 0, count.isFinite else { return nil }
            let seconds: TimeInterval
            switch unit {
            case "d": seconds = count * 86_400
            case "h": seconds = count * 3_600
            case "m": seconds = count * 60
            default: return nil
            }
            return seconds <= PackDelivery.Receipt.maxLifetime ? seconds : nil
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                var key: PublisherSigningKey?
                if let sign = self.sign {
                    guard let text = try? String(contentsOfFile: sign, encoding: .utf8) else {
                        throw PackDeliveryError(
                            .invalidArgument, message: "Cannot read the key \(PackDeliveryError.printable(sign)).",
                            hint: "Pass the .key file written by packs keygen.", subject: sign)
                    }
                    key = try PublisherSigningKey(pem: text)
                }
                let expiry = self.expires.flatMap(Self.seconds).map { Date().addingTimeInterval($0) }
                var noted = false
                let manifest = try ManifestBuilder.write(
                    folder: URL(filePath: self.directory).absoluteURL, signing: key,
                    version: self.manifestVersion, expires: expiry, scope: self.scope, delivery: (try? self.policies().get()) ?? [:],
                    note: {
                        noted = true
                        printError("packs: note: \($0)")
                    }, mirrors: self.mirrors)
                if noted {
                    printError("packs: hint: packs pack writes packs whose every chunk can be fetched and checked alone.")
                }
                let count = manifest.products.reduce(0) { $0 + $1.contents.count }
                printLine(
                    "wrote \(URL(filePath: self.directory).appending(path: "manifest.json").path): \(manifest.products.count) products, \(count) packs"
                )
            }
        }
    }

    struct Demo: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Build packs from SampleContent, serve them on loopback and fetch them, showing progress.",
            discussion: "Example:\n  packs demo --home /tmp/packs-demo")

        @OptionGroup var global: GlobalOptions
        @Option(help: "The folder of sample packs (default: SampleContent here, else the installed package's, else the source's).")
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
                    try PackWriter.write(
                        folder: samples.appending(path: name), to: site.appending(path: "\(name).\(format.rawValue)"), format: format)
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
                let loaded = try await LoadedManifest.load(manifestURL.absoluteString)
                let queue = try DownloadQueue(
                    home: home, configuration: .init(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false),
                    logger: self.global.logger)
                let code = try await RunSession(queue: queue, global: self.global).run { () throws(PackDeliveryError) in
                    let transactions = try queue.add(
                        products: manifest.products.map(\.productIdentifier), from: loaded, autoFinish: true, force: true)
                    return RunSession.Follow(transactions: transactions)
                }
                if code == 0 && !self.global.quiet && !self.global.json {
                    printLine("\nContent landed in:")
                    for content in try queue.installedContent() {
                        printLine("  \(content.productIdentifier) \(content.contentVersion): \(content.contentURL.path)")
                    }
                    printLine("Try: packs\(self.global.home.map { " --home \($0)" } ?? "") content")
                }
                await queue.close()
                await server.stop()
                return code
            }
            if code != 0 { throw ExitCode(code) }
        }

        private func findSamples() throws(PackDeliveryError) -> URL {
            var candidates: [URL] = []
            if let samples { candidates.append(URL(filePath: samples).absoluteURL) }
            candidates.append(URL(filePath: FileManager.default.currentDirectoryPath).appending(path: "SampleContent"))
            var folder = URL(filePath: CommandLine.arguments[0]).absoluteURL.resolvingSymlinksInPath().deletingLastPathComponent()
            // Installed from the Debian package (scripts/package): /usr/bin/packs, /usr/share/packs/SampleContent.
            candidates.append(folder.deletingLastPathComponent().appending(path: "share/packs/SampleContent"))
            // The package root, from the executable in .build/<config>/packs.
            for _ in 0..<5 {
                candidates.append(folder.appending(path: "SampleContent"))
                folder = folder.deletingLastPathComponent()
            }
            if let found = candidates.first(where: { FileManager.default.fileExists(atPath: $0.path) }) { return found }
            throw PackDeliveryError(
                .invalidArgument, message: "Cannot find the SampleContent folder.",
                hint: "Run packs demo from the package folder, or pass --samples DIR.")
        }
    }
}
