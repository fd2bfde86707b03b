import ArgumentParser
import Foundation
import PackDelivery

#if canImport(Glibc)
import Glibc
#endif

/// Reads a publisher's public key file (PEM), saying which file when it is not one.
func readPublisherKey(_ path: String) throws(PackDeliveryError) -> PublisherKey {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
        throw PackDeliveryError(.invalidArgument, message: "Cannot read the public key \(PackDeliveryError.printable(path)).",
                                hint: "Pass the .pub file written by packs keygen.", subject: path)
    }
    do { return try PublisherKey(pem: text) } catch {
        throw PackDeliveryError(.invalidArgument, message: "\(PackDeliveryError.printable(path)) is not an Ed25519 public key in PEM.",
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

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let key = try PublisherSigningKey.generate()
                let privatePath = self.name + ".key"
                let publicPath = self.name + ".pub"
                // O_EXCL: never overwrite a key that may already sign published manifests.
                let fd = open(privatePath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
                guard fd >= 0 else {
                    let code = errno
                    throw PackDeliveryError(code == EEXIST ? .invalidArgument : .fileSystem,
                                            message: "Cannot create \(privatePath): \(String(cString: strerror(code))).",
                                            hint: code == EEXIST ? "Choose another name; an existing key is never overwritten." : nil, subject: privatePath)
                }
                let bytes = Array(key.pem.utf8)
                let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                let synced = fsync(fd) == 0
                close(fd)
                guard written == bytes.count, synced else {
                    unlink(privatePath)
                    throw PackDeliveryError(.fileSystem, message: "Cannot write \(privatePath).", subject: privatePath)
                }
                do { try key.publicKey.pem.write(toFile: publicPath, atomically: true, encoding: .utf8) } catch {
                    throw PackDeliveryError(.fileSystem, message: "Cannot write \(publicPath).", subject: publicPath)
                }
                printLine("wrote \(privatePath) (private, keep it secret) and \(publicPath) (key \(key.publicKey.id))")
            }
        }
    }

    struct Trust: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Trust a manifest publisher for this home: every later fetch needs a manifest it signed.",
            discussion: "Example:\n  packs trust add publisher.pub",
            subcommands: [Add.self, List.self])

        struct Add: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Trust the publisher of this public key (a .pub file from packs keygen).")
            @OptionGroup var global: GlobalOptions
            @Argument(help: "The public key file.") var key: String

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let publisher = try readPublisherKey(self.key)
                    let queue = try openQueue(self.global, lookingConfiguration())
                    defer { queue.close() }
                    try queue.trust(publisher)
                    if !self.global.quiet { printLine("trusting the publisher key \(publisher.id) for \(self.global.resolvedHome.stateFolder.path)") }
                }
            }
        }

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List the publisher keys this home trusts.")
            @OptionGroup var global: GlobalOptions

            func run() async throws {
                try await mapErrors { () async throws(PackDeliveryError) in
                    let queue = try openQueue(self.global, lookingConfiguration())
                    defer { queue.close() }
                    for publisher in try queue.trustedPublishers() { printLine(publisher.id) }
                }
            }
        }
    }
}
