import Foundation

extension DownloadQueue {
    /// Every tick: for each download paused for its key's release (``PauseReason/awaitingRelease``) whose next request is
    /// due, asks the key server for the key (`GET /keys/<keyID>` at the pack's origin) through the same transfer options
    /// and credentials as its pack; a key served is held in memory and the download goes on to its install (decrypting
    /// the bytes it kept: no pack byte is fetched again). A refusal (403 before the release) is asked again later, with
    /// backoff. Neither the key nor the credentials are logged.
    func askForPreloadKeys() {
        let waiting = self.driven { state in
            state.machine.entries.values.map(\.machine.download).filter { $0.state == .paused && $0.pauseReason == .awaitingRelease }
        }
        let now = Date()
        let keyring = self.installer.keyring
        for download in waiting {
            let archive = self.home.archiveURL(for: download)
            guard
                let keyID = keyring.claim(
                    download.id, now: now, keyID: { try? PreloadPack.layout(of: archive, name: download.contentIdentifier).keyID })
            else { continue }
            guard let url = URL(string: "/keys/\(keyID)", relativeTo: download.url)?.absoluteURL else { continue }
            var options = self.configuration.transfer
            let access = self.recordedAccess(download.transactionID)
            if download.mayCarryCredentials(manifestURL: access?.manifestURL) {
                options.headers += self.credentialHeaders(for: download, url: url, refused: false, receipt: access?.receipt)
            } else {
                options = options.withoutCredentials
            }
            WorkerPool.shared.run { [weak self, options] in
                let answer: Result<PreloadKey, PackDeliveryError>
                do throws(PackDeliveryError) {
                    let data = try Curl.fetch(url, options: options, maxBytes: PreloadKey.length)
                    let key = try PreloadKey(bytes: data)
                    guard key.keyID == keyID else {
                        throw PackDeliveryError(.preloadKeyMismatch, message: "The key server sent another key.", subject: keyID)
                    }
                    answer = .success(key)
                } catch {
                    answer = .failure(error)
                }
                guard let self else { return }
                self.driver.async { self.keyAnswered(answer, for: download.id, keyID: keyID) }
            }
        }
    }

    private func keyAnswered(_ answer: Result<PreloadKey, PackDeliveryError>, for id: String, keyID: String) {
        let keyring = self.installer.keyring
        switch answer {
        case .success(let key):
            keyring.keep(key)
            keyring.settled(id)
            self.logger.info("preload key released", metadata: ["download": "\(id)", "key": "\(keyID)"])
            // Resumed only while it still waits for the key (not if someone paused or cancelled it meanwhile).
            let awaiting = self.driven { $0.machine.entries[id]?.machine.download.pauseReason == .awaitingRelease }
            if awaiting { self.change { $0.handle(id, .resume) } }
        case .failure(let error):
            keyring.refused(id, now: Date())
            self.logger.info(
                "preload key not served yet",
                metadata: ["download": "\(id)", "key": "\(keyID)", "status": "\(error.httpStatus.map(String.init) ?? error.code.rawValue)"])
        }
    }
}
