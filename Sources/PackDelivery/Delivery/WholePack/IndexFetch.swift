import Foundation
import Logging
import Synchronization

/// Fetches a pack's index beside the pack itself, for the digests of its files (``IndexDigests``): one more
/// transfer of the transfer engine, started with the pack's and ending long before it (an index is a small
/// fraction of its pack), so the pack's files need not be hashed as they unpack.
///
/// Whatever goes wrong with the index (it cannot be fetched, its SHA-256 or length is not the manifest's, it
/// cannot be read, it names another pack) only means the files are hashed after all: the installer then hashes
/// them from the staging folder. It is never retried: a pack's install does not wait for its index.
final class IndexFetch: Sendable {
    /// What the fetch gave.
    enum Outcome: Sendable {
        /// The digests to record.
        case digests(IndexDigests)
        /// Why the index cannot be used (a sentence for the log); the files are hashed.
        case unusable(String)
        /// The fetch was stopped with the pack's transfer.
        case stopped
    }

    let id: TransferID
    private let download: Download
    private let reference: Manifest.IndexReference
    /// Where the index is fetched (``Home/indexURL(for:token:)``), removed once read.
    let file: URL
    private let maxEntries: Int
    private let logger: Logger
    private let outcome = Mutex<Outcome?>(nil)
    private let done = DispatchSemaphore(value: 0)

    /// A fetch of the index of `download`'s pack.
    ///
    /// - Parameters:
    ///   - download: the download of the pack, with the manifest's length and SHA-256.
    ///   - reference: the index, as the manifest names it (absolute URL, SHA-256 and length).
    ///   - token: the machine's token of the pack's transfer.
    ///   - file: where to fetch it (``Home/indexURL(for:token:)``).
    ///   - maxEntries: the most entries the index may list.
    ///   - logger: says why an index is not used.
    init(download: Download, reference: Manifest.IndexReference, token: Int, file: URL, maxEntries: Int, logger: Logger) {
        // Part -1: beside the pack's transfer (part 0) of the same attempt.
        self.id = TransferID(download: download.id, token: token, part: -1)
        self.download = download
        self.reference = reference
        self.file = file
        self.maxEntries = maxEntries
        self.logger = logger
    }

    /// Whether the files of `download` take their digests from its index: it has one, small enough to fetch, and
    /// the pack is large enough that hashing its files costs more than the request.
    static func applies(to download: Download) -> Bool {
        guard let index = download.index, index.length <= PackIndex.maxBytes else { return false }
        return download.contentLength >= IndexDigests.minimumPackLength
    }

    /// Starts the fetch on `engine`.
    ///
    /// - Parameters:
    ///   - engine: the transfer engine.
    ///   - options: the pack's transfer options (its credentials too).
    ///   - writer: writes the file.
    func start(on engine: TransferEngine, options: TransferOptions, writer: any FileWriting) {
        guard let url = URL(string: self.reference.url) else { return self.end(.unusable("the index's URL cannot be read")) }
        unlink(self.file.path)
        engine.start(
            TransferRequest(
                id: self.id, url: url, file: self.file, expectedLength: self.reference.length, validator: nil, fromZero: true,
                options: options, writer: writer,
                report: { [self] event in
                    guard case .finished(_, let outcome) = event else { return }
                    // Not on the engine's thread: reading an index of a large pack takes a while.
                    WorkerPool.shared.run { self.end(self.read(outcome)) }
                }))
    }

    /// Waits for the outcome.
    ///
    /// - Parameter cancel: polled while waiting; nil is returned once it is set.
    /// - Returns: the outcome, or nil when cancelled.
    func wait(cancel: CancelFlag) -> Outcome? {
        while self.done.wait(timeout: .now() + 0.1) == .timedOut {
            if cancel.isCancelled { return nil }
        }
        self.done.signal()
        return self.outcome.withLock { $0 }
    }

    /// The outcome, if the fetch has ended.
    var ended: Outcome? { self.outcome.withLock { $0 } }

    private func end(_ outcome: Outcome) {
        let first = self.outcome.withLock { current -> Bool in
            guard current == nil else { return false }
            current = outcome
            return true
        }
        guard first else { return }
        if case .unusable(let why) = outcome {
            self.logger.info(
                "the pack's index does not give its files' digests; they are hashed",
                metadata: ["download": "\(self.download.id)", "why": "\(why)"])
        }
        self.done.signal()
    }

    /// Checks the fetched index against the manifest and reads it.
    private func read(_ outcome: TransferOutcome) -> Outcome {
        defer { unlink(self.file.path) }
        switch outcome {
        case .completed:
            // The bytes read are the ones checked (hashed here, not as they arrived).
            guard let data = try? Data(contentsOf: self.file) else {
                return .unusable("the pack's index cannot be read from \(self.file.path)")
            }
            let hasher = SHA256Hasher()
            data.withUnsafeBytes { hasher.update($0) }
            guard Int64(data.count) == self.reference.length, hasher.hexDigest() == self.reference.sha256.lowercased() else {
                return .unusable("the pack's index does not match the SHA-256 and length the manifest gives")
            }
            do {
                let index = try PackIndex.decode(data, maxEntries: self.maxEntries, containers: Set(PackIndex.Container.allCases))
                guard let digests = IndexDigests(index: index, for: self.download) else {
                    return .unusable("the pack's index describes another pack than the manifest's (its length or SHA-256)")
                }
                return .digests(digests)
            } catch {
                return .unusable(error.fallback.message)
            }
        case .failed(let failure, _):
            return .unusable("the pack's index could not be fetched (\(failure.error.message))")
        case .stopped, .assembled, .deltaRefused:
            return .stopped
        }
    }
}
