import Foundation

extension DownloadQueue {
    /// Each tick while a download waits for a preload's key (``PauseReason/awaitingRelease``; only those, by the
    /// keyring's set, are visited): asks the key server for the keys due (`GET /keys/<keyID>` at the pack's origin)
    /// through the same transfer options and credentials as the pack.
    ///
    /// - No key is asked for before the manifest's release date (``Download/releaseDate``, by the queue's clock).
    /// - A key served is held in memory and the download goes on to its install, which decrypts the bytes it kept (no
    ///   pack byte is fetched again) and forgets the key.
    /// - An answer that is not the key yet (403 with `Retry-After` before the release on the server's clock, 429, 5xx, a
    ///   network failure) is asked again after a backoff: 1 s doubling to 5 min, and no sooner than the server's
    ///   `Retry-After`.
    /// - A 401 asks the credential provider (``DownloadQueue/Configuration/credentials``) again with ``CredentialRequest/refused`` set,
    ///   as a pack request's 401 does, and the key once more with the credentials it gives, at once.
    /// - A refusal for good (401 again, or with no provider; 403 without `Retry-After`, a receipt of another product; 404 or 410, a key the server
    ///   does not hand out; another key's bytes) leaves the download `paused(.awaitingRelease)`, its encrypted bytes
    ///   kept, with ``Download/error`` set to ``PackDeliveryError/Code/preloadKeyRefused`` (the HTTP status in
    ///   ``PackDeliveryError/httpStatus``): a store shows it and offers to renew the purchase; nothing is asked again
    ///   until the download is resumed (``resume(_:)``) or the queue opens again.
    ///
    /// Neither the key nor the credentials are logged or put into an error.
    func askForPreloadKeys() {
        let keyring = self.installer.keyring
        let due = keyring.claimDue(now: Date(), clock: self.configuration.clock())
        guard !due.isEmpty else { return }
        let downloads = self.driven { state in due.map { state.machine.download($0.downloadID) } }
        for ((downloadID, keyID), download) in zip(due, downloads) {
            if download?.state.isRunning == true {
                // Its install noted the key wanted and is about to pause for it (or it was resumed, and its install
                // asks again if it still needs the key). Dropping it here would leave the pause that follows waiting
                // for a key nobody asks for: it is asked for at a tick after the pause.
                keyring.unclaim(downloadID)
                continue
            }
            guard let download, download.state == .paused, download.pauseReason == .awaitingRelease else {
                // Paused by someone, settled, failed or gone since: its install wants the key again if it still needs it.
                keyring.drop(downloadID)
                continue
            }
            guard let url = URL(string: "/keys/\(keyID)", relativeTo: download.url)?.absoluteURL else {
                keyring.drop(downloadID)
                continue
            }
            let access = self.recordedAccess(download.transactionID)
            let first = self.keyRequestOptions(for: download, url: url, access: access, refused: false)
            // A 401 asks the credential provider for fresh credentials, as a pack request's does (on the queue's
            // thread), and the key once more with them; only a second 401 is a refusal.
            let renews = download.mayCarryCredentials(manifestURL: access?.manifestURL) && self.configuration.credentials != nil
            let name = download.contentIdentifier
            WorkerPool.shared.run { [weak self, first] in
                let answer: KeyAnswer
                do throws(PackDeliveryError) {
                    var reply = try Curl.get(url, options: first, maxBytes: 4096)
                    if reply.status == 401, renews, let self {
                        let fresh = self.driven { _ in self.keyRequestOptions(for: download, url: url, access: access, refused: true) }
                        reply = try Curl.get(url, options: fresh, maxBytes: 4096)
                    }
                    answer = KeyAnswer(reply, keyID: keyID, name: name)
                } catch {
                    answer = .notYet(status: error.code.rawValue, retryAfter: nil)
                }
                guard let self else { return }
                self.driver.async { self.keyAnswered(answer, for: downloadID, keyID: keyID) }
            }
        }
    }

    /// The transfer options of a request for `download`'s key at `url`: the queue's, with the transaction's credentials
    /// (the provider's, `refused` after a 401, and the receipt) where the pack may carry them.
    private func keyRequestOptions(
        for download: Download, url: URL, access: TransactionAccessRecord?, refused: Bool
    ) -> TransferOptions {
        var options = self.configuration.transfer
        guard download.mayCarryCredentials(manifestURL: access?.manifestURL) else { return options.withoutCredentials }
        options.headers += self.credentialHeaders(for: download, url: url, refused: refused, receipt: access?.receipt)
        return options
    }

    /// What a key request brought.
    enum KeyAnswer: Sendable {
        case key(PreloadKey)
        /// Not yet: asked again after a backoff, no sooner than `retryAfter`.
        case notYet(status: String, retryAfter: TimeInterval?)
        case refused(PackDeliveryError)

        /// What an HTTP answer to a key request means.
        init(_ answer: (status: Int, body: Data, retryAfter: TimeInterval?), keyID: String, name: String) {
            let printable = PackDeliveryError.printable(name)
            switch answer.status {
            case 200..<300:
                if let key = try? PreloadKey(bytes: answer.body), key.keyID == keyID {
                    self = .key(key)
                } else {
                    self = .refused(
                        PackDeliveryError(
                            .preloadKeyRefused,
                            message: "The key server sent something else than the key of the preload pack \(printable).",
                            hint: "Its encrypted bytes are kept; resume it once the server is fixed.", subject: name))
                }
            case 403 where answer.retryAfter != nil:
                // Not released yet by the server's clock.
                self = .notYet(status: "403", retryAfter: answer.retryAfter)
            case 401, 403, 404, 410:
                let why =
                    answer.status == 404 || answer.status == 410
                    ? "does not hand out the key of the preload pack \(printable)"
                    : "refused the credentials for the key of the preload pack \(printable): they do not cover it"
                self = .refused(
                    PackDeliveryError(
                        .preloadKeyRefused, message: "The key server \(why) (HTTP \(answer.status)).",
                        hint:
                            "Its encrypted bytes are kept; resume it with a receipt for the product, or once the server hands the key out.",
                        subject: name, underlying: .init(.http, answer.status), httpStatus: answer.status))
            default:
                self = .notYet(status: String(answer.status), retryAfter: answer.retryAfter)
            }
        }
    }

    private func keyAnswered(_ answer: KeyAnswer, for id: String, keyID: String) {
        let keyring = self.installer.keyring
        let awaiting = self.driven { $0.machine.entries[id]?.pauseReason == .awaitingRelease }
        switch answer {
        case .key(let key):
            self.logger.info("preload key released", metadata: ["download": "\(id)", "key": "\(keyID)"])
            // Resumed only while it still waits for the key (not if someone paused or cancelled it meanwhile, and then
            // the key is not kept).
            if awaiting, keyring.keep(key, for: id) {
                self.change { $0.handle(id, .resume) }
            } else {
                keyring.drop(id)
            }
        case .notYet(let status, let retryAfter):
            keyring.notYet(id, retryAfter: retryAfter, now: Date())
            self.logger.info("preload key not served yet", metadata: ["download": "\(id)", "key": "\(keyID)", "status": "\(status)"])
        case .refused(let error):
            keyring.refused(id)
            self.logger.warning(
                "preload key refused",
                metadata: ["download": "\(id)", "key": "\(keyID)", "status": "\(error.httpStatus.map(String.init) ?? "-")"])
            if awaiting { self.change { $0.handle(id, .abort(error)) } }
        }
    }

    /// Notes in the keyring the downloads just taken that wait for their key (``PauseReason/awaitingRelease``), so that
    /// it is asked for from their release date on.
    func awaitKeys(of taken: [String]) {
        for id in taken {
            guard let download = self.driven({ $0.machine.download(id) }), download.pauseReason == .awaitingRelease else { continue }
            let archive = self.home.archiveURL(for: download)
            guard let keyID = try? PreloadPack.layout(of: archive, name: download.contentIdentifier).keyID else { continue }
            self.installer.keyring.want(id, keyID: keyID, releases: download.releaseDate)
        }
    }

    /// Whether a joined transaction has a download paused for its preload key's release (``PauseReason/awaitingRelease``)
    /// that this queue does not run: it is taken over (``takeOverJoinedDeliveries()``) to ask for the key.
    func awaitsKeyUnrun(_ transaction: Transaction) -> Bool {
        transaction.downloads.contains { download in
            download.pauseReason == .awaitingRelease && self.driven { $0.machine.entries[download.id] == nil }
        }
    }
}
