import ArgumentParser
import Foundation
import PackDelivery

/// The CLI's exit codes (sysexits.h, plus 130 for an interrupt), and the one table from error codes to them.
enum ExitStatus {
    static let usage: Int32 = 64
    static let badData: Int32 = 65
    static let network: Int32 = 69
    static let io: Int32 = 74
    static let resumable: Int32 = 75
    static let noPermission: Int32 = 77
    /// `packs agent`: the socket's folder belongs to another user or is open to others, or no socket path is known.
    static let config: Int32 = 78
    /// `packs fetch --detach`: no agent answers on the socket, or it is of another version.
    static let agentUnavailable: Int32 = 79
    static let interrupted: Int32 = 130

    /// Every exit code with a short meaning, for `--help` (the README's table says the same at length; a test keeps
    /// the three alike). No digits in the meanings: the test reads the codes from the help text.
    static let summary: [(code: Int32, meaning: String)] = [
        (0, "done"), (usage, "usage error"), (badData, "bad data (manifest, unknown product, checksum, unsafe or corrupt pack)"),
        (network, "server or network failure after retries"), (io, "local I/O failure"),
        (
            resumable,
            "stopped before finishing but resumable (paused, out of disk space, waiting for an unmetered connection, or a preload waiting for its release date)"
        ),
        (noPermission, "the server refused the credentials"),
        (config, "the agent's socket folder is unsafe (another owner, open to others) or no socket path is known"),
        (
            agentUnavailable,
            "no agent answers on its socket, or it is of another version (fetch --detach, watch, a command the agent stopped answering)"
        ), (interrupted, "interrupted"),
    ]

    /// The exit codes as one paragraph of `packs --help`.
    static var helpParagraph: String {
        "Exit codes: " + Self.summary.map { "\($0.code) \($0.meaning)" }.joined(separator: "; ") + "."
    }

    /// The exit code for an error, by its code.
    static func code(for error: PackDeliveryError) -> Int32 {
        switch error.code {
        case .finishRefused, .unknownTransaction, .unknownDownload, .notInstalled, .queueClosed, .invalidArgument:
            Self.usage
        case .unknownProduct, .invalidManifest, .untrustedManifest, .contentIdentifierTaken, .unsupportedURL, .lengthMismatch,
            .checksumMismatch, .unsafeEntry, .corruptArchive, .encryptedArchive, .unpackLimitExceeded, .emptyPack,
            .contentInfoMismatch, .contentDamaged, .indexMismatch, .preloadKeyMismatch, .preloadDecryptionFailed:
            Self.badData
        case .httpStatus where error.httpStatus == 404 || error.httpStatus == 410:
            Self.badData  // nothing at that URL: the manifest (or the URL given) is wrong
        case .httpStatus, .networkUnreachable, .timedOut, .tooSlow, .networkFailure, .stalled:
            Self.network
        case .unauthorized, .preloadKeyRefused:
            Self.noPermission
        case .insufficientStorage:
            Self.resumable
        case .cancelled:
            Self.interrupted
        case .fileSystem, .tooManyOpenFiles, .database, .databaseBusy, .databaseCorrupt, .internalError:
            Self.io
        default:
            switch error.kind {
            case .usage: Self.usage
            case .badData: Self.badData
            case .network: Self.network
            case .unauthorized: Self.noPermission
            case .insufficientStorage: Self.resumable
            case .io: Self.io
            case .cancelled: Self.interrupted
            }
        }
    }

    /// What to do next, naming `packs` commands, by code; nil keeps the library's hint.
    /// - Parameter download: the download the error ended, when there is one.
    static func hint(for error: PackDeliveryError, download: Download? = nil) -> String? {
        switch error.code {
        case .finishRefused:
            let ids = error.pendingDownloadIDs.joined(separator: " ")
            return "Run packs resume \(ids) to complete \(error.pendingDownloadIDs.count == 1 ? "it" : "them"), or packs cancel \(ids)."
        case .unknownTransaction, .unknownDownload:
            return "See packs status for the open ones."
        case .notInstalled:
            return "Fetch it with packs fetch MANIFEST \(error.subject.map(PackDeliveryError.printable) ?? "PRODUCT_ID")."
        case .invalidManifest:
            return download == nil ? "Check that it is a manifest.json (packs manifest DIR writes one)." : nil
        case .unauthorized:
            let resume = download.map { "packs resume \($0.id)" } ?? "packs resume"
            return
                "The server refused the credentials: renew the receipt and run \(resume) --receipt FILE (it is stored for later resumes), or pass other credentials with --header 'Authorization: …'."
        case .httpStatus, .networkUnreachable, .timedOut, .tooSlow, .networkFailure, .stalled:
            return download.map { "The partial download is kept; run packs resume \($0.id) to retry." }
        case .insufficientStorage:
            return download.map {
                "Free some space, then run packs resume \($0.id); or packs cancel \($0.id) to discard the partial download."
            }
        case .checksumMismatch, .lengthMismatch, .unsafeEntry, .corruptArchive, .encryptedArchive, .emptyPack, .contentInfoMismatch,
            .contentIdentifierTaken, .unsupportedURL, .indexMismatch:
            return error.hint ?? "Nothing was installed; ask the content provider for a fixed pack or manifest."
        case .unpackLimitExceeded:
            return
                "Nothing was installed. If you trust the pack, fetch it with --max-expansion-ratio N or --max-entries N, or publish its unpackedLength in the manifest."
        case .contentDamaged:
            return "Run packs verify --repair \(error.subject.map(PackDeliveryError.printable) ?? "PRODUCT_ID") to deliver it again."
        case .databaseCorrupt:
            return error.hint
        case .unreadableTrustedKey:
            let id = PackDeliveryError.printable(error.subject ?? "ID")
            // A TUF repository's id starts with tuf- (TrustedRepository.id): it is trusted again from its root.
            guard !id.hasPrefix("tuf-") else {
                return
                    "Run packs trust remove '\(id)', then packs trust add ROOT.json --repository METADATA_URL with the repository's root."
            }
            return "Run packs trust remove '\(id)', then packs trust add PUBLISHER.pub with the publisher's public key."
        case .tooManyOpenFiles:
            return
                "The process ran out of file descriptors: raise the limit (ulimit -n) or lower --concurrency\(download.map { ", then run packs resume \($0.id)" } ?? "")."
        default:
            return nil
        }
    }

    /// The one line printed on stderr for an error.
    static func line(for error: PackDeliveryError, download: Download? = nil) -> String {
        let hint = Self.hint(for: error, download: download) ?? error.hint
        let message = error.message
        let prefix =
            download.map {
                "\($0.id) (\(PackDeliveryError.printable($0.contentIdentifier))) \($0.state == .paused ? "paused" : "failed"): "
            } ?? ""
        return "packs: " + prefix + (hint.map { "\(message) \($0)" } ?? message)
    }
}

/// Prints the one stderr line every failure gets, and exits with its code.
func fail(_ error: PackDeliveryError) -> ExitCode {
    printError(ExitStatus.line(for: error))
    return ExitCode(ExitStatus.code(for: error))
}

/// Runs a body that throws PackDeliveryError, mapping it to the documented exit code.
func mapErrors<T>(_ body: () async throws(PackDeliveryError) -> T) async throws -> T {
    do throws(PackDeliveryError) { return try await body() } catch { throw fail(error) }
}
