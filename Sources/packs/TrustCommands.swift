import ArgumentParser
import Foundation
import PackDelivery

#if canImport(Glibc)
    import Glibc
#endif

/// A URL as shown: without credentials, query or fragment.
func shownURL(_ url: URL) -> String {
    guard var components = URLComponents(url: url, resolvingAgainstBaseURL: true) else { return "(a URL)" }
    components.user = nil
    components.password = nil
    components.query = nil
    components.fragment = nil
    return SafeOutput.line(components.string ?? "(a URL)")
}

/// Reads a publisher's public key file (PEM), saying which file when it is not one.
func readPublisherKey(_ path: String) throws(PackDeliveryError) -> PublisherKey {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
        throw PackDeliveryError(
            .invalidArgument, message: "Cannot read the public key \(PackDeliveryError.printable(path)).",
            hint: "Pass the .pub file written by packs keygen.", subject: path)
    }
    do { return try PublisherKey(pem: text) } catch {
        throw PackDeliveryError(
            .invalidArgument, message: "\(PackDeliveryError.printable(path)) is not an Ed25519 public key in PEM.",
            hint: "Pass the .pub file written by packs keygen.", subject: path)
    }
}

extension Packs {
    struct Keygen: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make a publisher's key pair for signing manifests: NAME.key (private, mode 0600) and NAME.pub.",
            discussion: """
                Ed25519, in PEM (PKCS#8 and SPKI), through OpenSSL. Sign with packs manifest DIR --sign NAME.key; \
                clients trust NAME.pub (packs fetch --trust NAME.pub, or packs trust add NAME.pub).

                Example:
                  packs keygen publisher
                """)

        @Argument(help: "The key's name, or a path without extension.") var name: String
        @Flag(
            help:
                "Make a preload key instead: NAME.preloadkey, 32 random bytes (mode 0600) for packs pack --encrypt and packs serve --keys.")
        var preload = false

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                if self.preload {
                    let key = PreloadKey.generate()
                    let path = self.name + ".preloadkey"
                    try Self.createSecret(path, bytes: Array(key.data))
                    printLine("wrote \(path) (keep it secret until the release; key id \(key.keyID))")
                    return
                }
                let key = try PublisherSigningKey.generate()
                let privatePath = self.name + ".key"
                let publicPath = self.name + ".pub"
                try Self.createSecret(privatePath, bytes: Array(key.pem.utf8))
                do { try key.publicKey.pem.write(toFile: publicPath, atomically: true, encoding: .utf8) } catch {
                    throw PackDeliveryError(.fileSystem, message: "Cannot write \(publicPath).", subject: publicPath)
                }
                printLine("wrote \(privatePath) (private, keep it secret) and \(publicPath) (key \(key.publicKey.id))")
            }
        }

        /// Creates a secret file (mode 0600) holding `bytes`, synced; O_EXCL: never overwrites a key that may already
        /// be in use.
        static func createSecret(_ path: String, bytes: [UInt8]) throws(PackDeliveryError) {
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else {
                let code = errno
                throw PackDeliveryError(
                    code == EEXIST ? .invalidArgument : .fileSystem,
                    message: "Cannot create \(path): \(String(cString: strerror(code))).",
                    hint: code == EEXIST ? "Choose another name; an existing key is never overwritten." : nil, subject: path)
            }
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            let synced = fsync(fd) == 0
            close(fd)
            guard written == bytes.count, synced else {
                unlink(path)
                throw PackDeliveryError(.fileSystem, message: "Cannot write \(path).", subject: path)
            }
        }
    }

    struct Trust: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Trust a manifest publisher or a TUF repository for this home: every later fetch needs a manifest it vouches for.",
            discussion: """
                Examples:
                  packs trust add publisher.pub
                  packs trust add root.json --repository https://cdn.example.com/metadata/
                  packs trust add root.json --repository https://cdn.example.com/metadata/ --targets https://cdn.example.com/content/
                """,
            subcommands: [Add.self, List.self, Remove.self])

        struct Add: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract:
                    "Trust the publisher of this public key (a .pub file from packs keygen), or, with --repository, a TUF repository from its root.json.",
                discussion: """
                    With --repository, a manifest read from under the repository's targets URL is a TUF target: before \
                    anything is recorded or downloaded, the repository's metadata is refreshed, and the manifest and each \
                    of its packs (its URL relative to the targets URL) must match the length and SHA-256 of its target. A \
                    refusal exits 65 and names the role, the version and the rule broken. Trusting the same metadata URL \
                    again starts its trusted metadata over from the root given.
                    """)
            @OptionGroup var global: GlobalOptions
            @Argument(help: "The public key file, or with --repository the repository's root.json.") var key: String
            @Option(
                name: .customLong("repository"),
                help: ArgumentHelp(
                    "Trust the TUF repository whose metadata is at this URL; the file is its root.json.", valueName: "metadata-url"))
            var repository: String?
            @Option(
                name: .customLong("targets"),
                help: ArgumentHelp(
                    "With --repository: the URL its targets (manifests and packs) are under (default: targets/ beside the metadata folder).",
                    valueName: "targets-url"))
            var targets: String?

            func validate() throws {
                if self.targets != nil, self.repository == nil { throw ValidationError("--targets goes with --repository.") }
            }

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    if let repository = self.repository {
                        try self.addRepository(repository)
                        return
                    }
                    let publisher = try readPublisherKey(self.key)
                    let queue = try openQueue(self.global, lookingConfiguration())
                    defer { queue.close() }
                    try queue.trust(publisher)
                    if !self.global.quiet {
                        printLine("trusting the publisher key \(publisher.id) for \(self.global.resolvedHome.stateFolder.path)")
                    }
                }
            }

            private func addRepository(_ metadata: String) throws(PackDeliveryError) {
                guard let metadataURL = URL(string: metadata), metadataURL.host != nil else {
                    throw PackDeliveryError(.invalidArgument, message: "--repository takes an http(s) URL.", subject: metadata)
                }
                let targetsURL = try self.targets.map { text throws(PackDeliveryError) in
                    guard let url = URL(string: text), url.host != nil else {
                        throw PackDeliveryError(.invalidArgument, message: "--targets takes an http(s) URL.", subject: text)
                    }
                    return url
                }
                guard let root = FileManager.default.contents(atPath: self.key) else {
                    throw PackDeliveryError(
                        .invalidArgument, message: "Cannot read the root \(PackDeliveryError.printable(self.key)).",
                        hint: "Pass the repository's root.json.", subject: self.key)
                }
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let trusted = try queue.trust(root: root, metadataURL: metadataURL, targetsBaseURL: targetsURL)
                if !self.global.quiet {
                    printLine(
                        "trusting the TUF repository \(trusted.id) (targets under \(shownURL(trusted.targetsBaseURL))) for \(self.global.resolvedHome.stateFolder.path)"
                    )
                }
            }
        }

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List the publisher keys and TUF repositories this home trusts.")
            @OptionGroup var global: GlobalOptions

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let queue = try openQueue(self.global, lookingConfiguration())
                    defer { queue.close() }
                    let records = try queue.trustedPublisherRecords()
                    for record in records {
                        printLine(PackDeliveryError.printable(record.id) + (record.key == nil ? " (unreadable)" : ""))
                    }
                    for repository in try queue.trustedRepositories() {
                        printLine(
                            "\(repository.id) TUF repository \(shownURL(repository.metadataURL)), targets under \(shownURL(repository.targetsBaseURL))"
                        )
                    }
                    // An unreadable key fails the command, with the error every fetch now ends with.
                    _ = try queue.trustedPublishers()
                }
            }
        }

        struct Remove: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Stop trusting a publisher key or a TUF repository, named as packs trust list shows it (an unreadable one too).",
                discussion: "Example:\n  packs trust remove 3f9a1c2e7b5d4a60")
            @OptionGroup var global: GlobalOptions
            @Argument(help: "The key's id, as packs trust list shows it.") var id: String

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let queue = try openQueue(self.global, lookingConfiguration())
                    defer { queue.close() }
                    guard try queue.untrust(id: self.id) else {
                        throw PackDeliveryError(
                            .invalidArgument,
                            message: "This home trusts no publisher key or TUF repository '\(PackDeliveryError.printable(self.id))'.",
                            hint: "See packs trust list.", subject: self.id)
                    }
                    if !self.global.quiet {
                        printLine("no longer trusting \(PackDeliveryError.printable(self.id))")
                    }
                }
            }
        }
    }
}

extension Packs {
    struct MakeReceipt: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "receipt",
            abstract: "Print a signed receipt (a compact JWS, alg EdDSA) for products, as a store's backend makes one after a purchase.",
            discussion: """
                packs serve --receipt-key KEY.pub serves packs only to a receipt that names their product; clients present \
                it with packs fetch --receipt FILE|TOKEN. With --sandbox the receipt is a test one ("environment": \
                "Sandbox"): sign it with a key kept for test receipts, which servers trust with --sandbox-receipt-key \
                (a server refuses a sandbox receipt signed by a production key).

                Examples:
                  packs receipt --key store.key --product com.example.forest --subject user-42 --expires 1h > receipt.jws
                  packs receipt --sandbox --key test.key --product com.example.forest --subject reviewer-1 > test.jws
                """)

        @Option(help: ArgumentHelp("The store's private key (packs keygen).", valueName: "key")) var key: String
        @Option(help: "A product bought (repeatable).") var product: [String] = []
        @Option(help: "Who bought them.") var subject: String
        @Option(help: ArgumentHelp("How long the receipt is valid: 30d, 12h or 90m.", valueName: "duration")) var expires = "1h"
        @Flag(help: "Issue a sandbox (test) receipt, for servers that trust --key's public key as a --sandbox-receipt-key.")
        var sandbox = false

        func validate() throws {
            if self.product.isEmpty { throw ValidationError("Name at least one --product.") }
            if MakeManifest.seconds(self.expires) == nil {
                throw ValidationError("--expires takes a duration like 30d, 12h or 90m, of at most 36500d.")
            }
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                guard let text = try? String(contentsOfFile: self.key, encoding: .utf8) else {
                    throw PackDeliveryError(
                        .invalidArgument, message: "Cannot read the key \(PackDeliveryError.printable(self.key)).",
                        hint: "Pass the .key file written by packs keygen.", subject: self.key)
                }
                let key = try PublisherSigningKey(pem: text)
                printLine(
                    try Receipt.issue(
                        products: self.product, subject: self.subject, lifetime: MakeManifest.seconds(self.expires) ?? 3600, key: key,
                        environment: self.sandbox ? .sandbox : .production))
            }
        }
    }
}
