import ArgumentParser
import Foundation
import PackDelivery

/// Reads a private key file (PEM, from packs keygen), saying which file when it is not one.
func readSigningKey(_ path: String) throws(PackDeliveryError) -> PublisherSigningKey {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
        throw PackDeliveryError(
            .invalidArgument, message: "Cannot read the key \(PackDeliveryError.printable(path)).",
            hint: "Pass a .key file written by packs keygen.", subject: path)
    }
    return try PublisherSigningKey(pem: text)
}

extension Packs {
    struct Repo: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep a TUF repository folder (metadata/ and targets/) that nginx or a CDN serves, for homes that trust its root.",
            discussion: """
                Keys are Ed25519 files from packs keygen, each kept where its step runs: the root key offline, the \
                timestamp key online (packs repo timestamp needs it alone, from cron), the snapshot and targets keys \
                with the publisher. A targets change reaches clients after packs repo sign and packs repo timestamp.

                Example:
                  for k in root timestamp snapshot targets; do packs keygen $k; done
                  packs repo init site --root-key root.key --timestamp-key timestamp.key --snapshot-key snapshot.key --targets-key targets.key
                  packs repo add site manifest.json forest.tar.zst --key targets.key
                  packs repo sign site --key snapshot.key
                  packs repo timestamp site --key timestamp.key
                  packs trust add site/metadata/1.root.json --repository https://cdn.example.com/metadata/
                """,
            subcommands: [Init.self, Add.self, Remove.self, Sign.self, Timestamp.self, Rotate.self, Delegate.self])

        struct Init: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Create a repository: root, targets, snapshot and timestamp version 1, consistent snapshots on.")
            @Argument(help: "The repository folder.") var folder: String
            @Option(name: .customLong("root-key"), help: "The root key (.key).") var rootKey: String
            @Option(name: .customLong("timestamp-key"), help: "The online timestamp key (.key).") var timestampKey: String
            @Option(name: .customLong("snapshot-key"), help: "The snapshot key (.key).") var snapshotKey: String
            @Option(name: .customLong("targets-key"), help: "The top-level targets key (.key).") var targetsKey: String

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    try TUFRepositoryWriter.initialize(
                        folder: URL(filePath: self.folder), root: try readSigningKey(self.rootKey),
                        timestamp: try readSigningKey(self.timestampKey), snapshot: try readSigningKey(self.snapshotKey),
                        targets: try readSigningKey(self.targetsKey))
                    printLine("created a TUF repository in \(SafeOutput.line(self.folder)); hand clients metadata/1.root.json")
                }
            }
        }

        struct Add: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Add files as targets (their path: relative to --from, by default their name) in the role's next version.")
            @Argument(help: "The repository folder.") var folder: String
            @Argument(help: "The files to add.") var files: [String]
            @Option(help: "The role's key (.key).") var key: String
            @Option(help: "The targets role: targets, a delegated role, or the hash bins' name prefix (each target to its bin).")
            var role = "targets"
            @Option(help: ArgumentHelp("Target paths are the files' paths relative to this folder.", valueName: "dir")) var from: String?
            @Option(help: "A folder the target paths start with (packs/).") var prefix = ""

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let base = self.from.map { URL(filePath: $0).standardizedFileURL.path + "/" }
                    let files = try self.files.map { file throws(PackDeliveryError) -> (path: String, file: URL) in
                        let url = URL(filePath: file).standardizedFileURL
                        var path = url.lastPathComponent
                        if let base {
                            guard url.path.hasPrefix(base) else {
                                throw PackDeliveryError(
                                    .invalidArgument, message: "\(SafeOutput.line(file)) is not under --from.", subject: file)
                            }
                            path = String(url.path.dropFirst(base.count))
                        }
                        return (self.prefix + path, url)
                    }
                    let folder = URL(filePath: self.folder)
                    let roles = try TUFRepositoryWriter.roles(of: files.map(\.path), role: self.role, folder: folder)
                    try TUFRepositoryWriter.addTargets(folder: folder, files: files, role: self.role, key: try readSigningKey(self.key))
                    for (path, _) in files {
                        printLine("added \(SafeOutput.line(path)) to \(SafeOutput.line(roles[path] ?? self.role))")
                    }
                }
            }
        }

        struct Remove: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove targets from the role's next version.")
            @Argument(help: "The repository folder.") var folder: String
            @Argument(help: "The target paths.") var paths: [String]
            @Option(help: "The role's key (.key).") var key: String
            @Option(help: "The targets role: targets, a delegated role, or the hash bins' name prefix.") var role = "targets"

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    try TUFRepositoryWriter.removeTargets(
                        folder: URL(filePath: self.folder), paths: self.paths, role: self.role, key: try readSigningKey(self.key))
                }
            }
        }

        struct Sign: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Sign a new snapshot naming the newest version of every targets role (the snapshot key).")
            @Argument(help: "The repository folder.") var folder: String
            @Option(help: "The snapshot key (.key).") var key: String
            @Option(help: "Days until it expires.") var expires = 7

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    try TUFRepositoryWriter.signSnapshot(
                        folder: URL(filePath: self.folder), key: try readSigningKey(self.key), expires: self.expires)
                }
            }
        }

        struct Timestamp: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Sign a new timestamp naming the newest snapshot, with the online timestamp key alone (run it from cron).")
            @Argument(help: "The repository folder.") var folder: String
            @Option(help: "The timestamp key (.key).") var key: String
            @Option(help: "Days until it expires.") var expires = 1

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    try TUFRepositoryWriter.timestamp(
                        folder: URL(filePath: self.folder), key: try readSigningKey(self.key), expires: self.expires)
                }
            }
        }

        struct Rotate: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract:
                    "Replace a role's key in a new root version: the root key with the old and the new root keys, another role's with the root key.",
                discussion: """
                    Examples:
                      packs repo rotate site --root-key old-root.key --new-key new-root.key
                      packs repo rotate site --role timestamp --root-key root.key --new-key timestamp2.pub
                    """)
            @Argument(help: "The repository folder.") var folder: String
            @Option(help: "The role whose key is replaced: root, timestamp, snapshot or targets.") var role = "root"
            @Option(name: .customLong("root-key"), help: "The current root key (.key).") var rootKey: String
            @Option(
                name: .customLong("new-key"),
                help: "The new key: a .key (needed for the root role, which signs its own rotation) or, for other roles, a .pub.")
            var newKey: String

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    var signers = [try readSigningKey(self.rootKey)]
                    let newKey: PublisherKey
                    if self.role == "root" {
                        let signing = try readSigningKey(self.newKey)
                        signers.append(signing)
                        newKey = signing.publicKey
                    } else if let signing = try? readSigningKey(self.newKey) {
                        newKey = signing.publicKey
                    } else {
                        newKey = try readPublisherKey(self.newKey)
                    }
                    try TUFRepositoryWriter.rotate(folder: URL(filePath: self.folder), role: self.role, newKey: newKey, rootKeys: signers)
                }
            }
        }

        struct Delegate: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract:
                    "Delegate target paths (TUF patterns such as studio/*) to a new role, or every path to hash bins, with its own key.",
                discussion: """
                    With --bins N, every target path goes to one of N succinct hash bins (NAME-000…, by the SHA-256 of \
                    the path; N a power of two, about one bin per 100 targets): packs repo add --role NAME puts each \
                    target in its bin and signs only the bins that change. A client downloads the snapshot (about 30 \
                    bytes a bin) and the bins it looks in.

                    Examples:
                      packs repo delegate site studio --paths 'studio/*' --key targets.key --delegate-key studio.key
                      packs repo delegate site bins --bins 1024 --key targets.key --delegate-key bins.key
                      packs repo add site products/*/manifest.json --from . --role bins --key bins.key
                    """)
            @Argument(help: "The repository folder.") var folder: String
            @Argument(help: "The delegated role's name (with --bins: the bins' name prefix).") var name: String
            @Option(help: "A path pattern delegated (repeatable).") var paths: [String] = []
            @Option(help: ArgumentHelp("Delegate every path to this many hash bins (a power of two).", valueName: "count"))
            var bins: Int?
            @Flag(help: "Stop the search for a matching target at this role.") var terminating = false
            @Option(help: "The top-level targets key (.key).") var key: String
            @Option(name: .customLong("delegate-key"), help: "The delegated role's key (.key), or the bins' one key.") var delegateKey:
                String

            func validate() throws {
                if self.bins != nil, !self.paths.isEmpty || self.terminating {
                    throw ValidationError("--bins delegates every path: leave out --paths and --terminating.")
                }
                if self.bins == nil, self.paths.isEmpty { throw ValidationError("Name at least one --paths pattern, or --bins.") }
            }

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let folder = URL(filePath: self.folder)
                    if let bins = self.bins {
                        try TUFRepositoryWriter.delegateHashBins(
                            folder: folder, namePrefix: self.name, count: bins, targetsKey: try readSigningKey(self.key),
                            binsKey: try readSigningKey(self.delegateKey))
                        printLine(
                            "delegated every target path to \(bins) hash bins \(SafeOutput.line(self.name))-…; add targets with --role \(SafeOutput.line(self.name))"
                        )
                        return
                    }
                    try TUFRepositoryWriter.delegate(
                        folder: folder, name: self.name, paths: self.paths, terminating: self.terminating,
                        targetsKey: try readSigningKey(self.key), delegateKey: try readSigningKey(self.delegateKey))
                }
            }
        }
    }
}
