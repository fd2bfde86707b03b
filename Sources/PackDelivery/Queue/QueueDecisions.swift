import Foundation

/// What a new transaction's downloads start as, decided with no I/O: the driver gathers the facts (the
/// installs recorded for the content identifiers, which install folders exist) and runs the result.
enum AddPlan {
    /// The downloads of a new transaction for `product`, or the error that refuses it.
    ///
    /// A pack whose content identifier is installed for another product is refused; a pack whose version is
    /// installed in the same destination, with its folder present, starts finished (unless `force`).
    /// - Parameters:
    ///   - installs: the recorded installs of the product's content identifiers, by content identifier.
    ///   - presentFolders: the install folders (paths) that exist.
    static func downloads(
        for product: Manifest.Product, transactionID: String, urls: [URL], destination: Destination, force: Bool,
        priority: DownloadPriority = .essential, installs: [String: [InstallRecord]], presentFolders: Set<String>,
        newID: () -> String
    ) -> Result<[Download], PackDeliveryError> {
        var downloads: [Download] = []
        for (content, url) in zip(product.contents, urls) {
            if let other = installs[content.contentIdentifier]?.first(where: { $0.productIdentifier != product.productIdentifier }) {
                return .failure(
                    PackDeliveryError(
                        .contentIdentifierTaken,
                        message:
                            "The content identifier \(PackDeliveryError.printable(content.contentIdentifier)) is installed for \(PackDeliveryError.printable(other.productIdentifier)), so \(PackDeliveryError.printable(product.productIdentifier)) cannot install into it.",
                        hint: "Nothing was recorded; one of the two manifests must use another contentIdentifier.",
                        subject: content.contentIdentifier))
            }
            var download = Download(
                id: newID(), transactionID: transactionID, productIdentifier: product.productIdentifier,
                contentIdentifier: content.contentIdentifier, contentVersion: content.contentVersion,
                contentLength: content.contentLength, state: .waiting, phase: nil, progress: 0, timeRemaining: -1,
                pauseReason: nil, contentURL: nil, error: nil, url: url, sha256: content.sha256.lowercased(),
                unpackedLength: content.unpackedLength, destination: destination, bytesReceived: 0,
                priority: Self.priority(content.deliveryPolicy, transaction: priority), delivery: content.deliveryPolicy)
            if content.deliveryPolicy == .onDemand {
                // Recorded as available; nothing is fetched until someone asks (ensureAvailable, or its id resumed).
                download.state = .paused
                download.pauseReason = .onDemand
            }
            if !force, let existing = installs[content.contentIdentifier]?.first(where: { $0.destination == destination }),
                existing.contentVersion == content.contentVersion, presentFolders.contains(existing.contentURL)
            {
                download.state = .finished
                download.pauseReason = nil
                download.progress = 1
                download.timeRemaining = 0
                download.bytesReceived = content.contentLength
                download.contentURL = URL(filePath: existing.contentURL)
            }
            downloads.append(download)
        }
        return .success(downloads)
    }

    /// A pack's priority in a transaction whose essential packs get `transaction` (a purchase's `essential`, a
    /// restore's `restore`): a prefetch pack follows them at `prefetch`, behind a restore's packs.
    static func priority(_ delivery: DeliveryPolicy, transaction: DownloadPriority) -> DownloadPriority {
        delivery == .prefetch ? max(transaction, .prefetch) : transaction
    }
}

extension AddPlan {
    /// The open transaction a new one for `product` joins instead of delivering its packs a second time: one that
    /// is delivering the same packs (the same content identifiers and versions, into the same destination) with a
    /// download not yet settled. A double "buy" or two `fetch`es of one product then fetch each pack once.
    /// Nil when none is (or with `force`): a new transaction is recorded.
    static func joined(
        _ product: Manifest.Product, destination: Destination, force: Bool, open: [Transaction]
    ) -> Transaction? {
        guard !force else { return nil }
        let wanted = Set(product.contents.map { "\($0.contentIdentifier)\u{0}\($0.contentVersion)" })
        return open.first { transaction in
            transaction.productIdentifier == product.productIdentifier && !transaction.isFinished
                && transaction.downloads.contains { !$0.state.isSettled }
                && transaction.downloads.allSatisfy { $0.destination == destination && $0.state != .cancelled }
                && Set(transaction.downloads.map { "\($0.contentIdentifier)\u{0}\($0.contentVersion)" }) == wanted
        }
    }
}

/// How a download left by an earlier process is taken over, decided with no I/O from what the driver found.
enum Adoption {
    /// What the driver found about a download it took over.
    struct Facts: Sendable {
        var record: DownloadRecord
        /// The size of the partial archive, or nil when there is none.
        var archiveBytes: Int64?
        /// Where a move into place that a crash interrupted ended up, once recovery ran: the installed folder, or nil.
        var recoveredInstall: URL?
    }

    /// The machine for the download.
    ///
    /// A download that was running is paused (`interrupted`) unless its install was completed by recovery; the
    /// bytes it keeps are the archive's; a verification recorded by the earlier process holds only for a
    /// complete archive and is checked again before use (a power cut may have damaged it).
    static func machine(_ facts: Facts, retryPolicy: DownloadMachine.RetryPolicy) -> DownloadMachine {
        let record = facts.record
        var download = record.download
        if let url = facts.recoveredInstall {
            download.state = .finished
            download.contentURL = url
            download.progress = 1
            download.phase = nil
            download.bytesReceived = download.contentLength
            return DownloadMachine(download: download, retryPolicy: retryPolicy)
        }
        if download.state.isRunning || record.phase != nil {
            download.state = .paused
            download.pauseReason = .interrupted
            download.phase = nil
        }
        let onDisk = facts.archiveBytes ?? 0
        let verified = record.verified && onDisk == download.contentLength
        download.bytesReceived = min(max(0, onDisk), download.contentLength)
        download.progress = download.contentLength > 0 ? min(1, Double(download.bytesReceived) / Double(download.contentLength)) : 0
        download.retryDate = nil
        return DownloadMachine(
            download: download, validator: record.validator, retriedFromZero: record.retriedFromZero,
            archive: verified ? .verifiedEarlier : .partial, stagingInode: nil, retryPolicy: retryPolicy)
    }

    /// Whether the download was in the middle of a move into place (recovery must look at the journal).
    static func needsInstallRecovery(_ record: DownloadRecord) -> Bool {
        (record.state.isRunning || record.phase != nil) && (record.phase == .installing || record.stagingInode != nil)
    }

    /// Whether taking it over leaves a staging folder to remove (it was running, but had not reached the move).
    static func discardsStaging(_ record: DownloadRecord) -> Bool {
        (record.state.isRunning || record.phase != nil) && !Self.needsInstallRecovery(record)
    }
}

/// A recorded download delivered again, by a restore or a repair.
enum Redelivery {
    /// The recorded download as a new one (`id`) of a new transaction: finished at once when its install is intact
    /// (at `contentURL`), otherwise waiting to download from byte 0.
    static func download(_ recorded: Download, id: String, transactionID: String, intact: Bool, contentURL: URL?) -> Download {
        var download = recorded
        download.id = id
        download.transactionID = transactionID
        download.error = nil
        download.pauseReason = nil
        download.phase = nil
        download.retryDate = nil
        download.priority = AddPlan.priority(recorded.delivery, transaction: .restore)
        if intact {
            download.state = .finished
            download.progress = 1
            download.timeRemaining = 0
            download.bytesReceived = download.contentLength
            download.contentURL = contentURL
        } else {
            download.state = .waiting
            download.progress = 0
            download.bytesReceived = 0
            download.contentURL = nil
            if recorded.delivery == .onDemand {
                // Recorded again as available, fetched when asked for, as at its purchase.
                download.state = .paused
                download.pauseReason = .onDemand
            }
        }
        return download
    }

    /// The URL of `download`'s pack in a manifest read again: the same product and content identifier, with the
    /// same SHA-256 and length (only then may the kept bytes continue at it; a new URL is fine — a presigned URL
    /// renewed, a pack moved to another host).
    static func packURL(of download: Download, in manifest: LoadedManifest) throws(PackDeliveryError) -> URL {
        let place = (manifest.source ?? manifest.baseURL).redacted
        guard let product = manifest.manifest.products.first(where: { $0.productIdentifier == download.productIdentifier }),
            let content = product.contents.first(where: { $0.contentIdentifier == download.contentIdentifier })
        else {
            throw PackDeliveryError(
                .invalidManifest,
                message: "The manifest at \(place) no longer lists \(download.contentIdentifier) for \(download.productIdentifier).",
                subject: place)
        }
        guard content.sha256.lowercased() == download.sha256.lowercased(), content.contentLength == download.contentLength else {
            throw PackDeliveryError(
                .invalidManifest,
                message:
                    "The manifest at \(place) now lists another version of \(download.contentIdentifier) (its SHA-256 or length changed): fetch the product again.",
                subject: place)
        }
        return try manifest.packURL(for: content)
    }
}

/// When a wait on one transaction ends, decided with no I/O from the transaction as the wait last saw it. Both
/// waits, ``DownloadQueue/settled(transactionID:)`` and ``DownloadQueue/delivered(transactionID:returningOnPause:)``,
/// follow the same events and ask this after each.
enum TransactionWait {
    /// What the wait waits for.
    enum Goal: Sendable, Hashable {
        /// Every download stopped running: finished, cancelled, failed or paused (`settled`).
        case settled
        /// Every download finished (`delivered`); a failure or a cancel ends the wait with an error; a pause ends it
        /// only with `returningOnPause`, once nothing runs.
        case delivered(returningOnPause: Bool)
    }

    enum Verdict: Sendable, Hashable {
        case wait
        case done
        case failed(PackDeliveryError)
    }

    static func verdict(_ transaction: Transaction, goal: Goal) -> Verdict {
        let nothingRuns = transaction.isFinished || transaction.downloads.allSatisfy { !$0.state.isRunning }
        guard case .delivered(let returningOnPause) = goal else { return nothingRuns ? .done : .wait }
        // A purchase is delivered once its essential packs are: prefetch and on-demand packs follow on their own.
        let essential = transaction.downloads.filter { $0.delivery == .essential }
        let essentialsStopped = transaction.isFinished || essential.allSatisfy { !$0.state.isRunning }
        if let failed = essential.first(where: { $0.state == .failed }) {
            // Failed for good: nothing changes until the app resumes or cancels it.
            return .failed(
                failed.error
                    ?? PackDeliveryError(
                        .internalError, message: "The download \(failed.id) of transaction \(transaction.id) failed without an error.",
                        subject: transaction.id))
        }
        if transaction.isFinished || transaction.isFinishable {
            guard let cancelled = essential.first(where: { $0.state == .cancelled }) else { return .done }
            return .failed(
                PackDeliveryError(
                    .cancelled,
                    message:
                        "The download \(cancelled.id) (\(PackDeliveryError.printable(cancelled.contentIdentifier))) of transaction \(transaction.id) was cancelled: its content is not installed.",
                    hint: "Finish the transaction: nothing more will be delivered for it.", subject: transaction.id))
        }
        return returningOnPause && essentialsStopped ? .done : .wait
    }
}
