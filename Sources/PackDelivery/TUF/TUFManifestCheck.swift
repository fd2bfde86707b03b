import Foundation

/// Checks a manifest read from under a trusted TUF repository's targets URL: the repository's metadata refreshed, the
/// manifest's bytes matched against its target, and every pack's length and SHA-256 against the pack's target.
struct TUFManifestCheck {
    let repository: TrustedRepository
    let options: TransferOptions
    let now: Date

    /// The repository whose targets `url` is under (the longest targets URL when several are), or nil.
    static func repository(for url: URL, in repositories: [TrustedRepository]) -> TrustedRepository? {
        repositories.filter { $0.targetPath(of: url) != nil }.max {
            $0.targetsBaseURL.absoluteString.count < $1.targetsBaseURL.absoluteString.count
        }
    }

    /// Refreshes the repository's metadata and checks the manifest's bytes (`data`, read from `url`).
    ///
    /// - Returns: the updater, refreshed, for ``checkPacks(_:updater:)``.
    func checkManifest(_ data: Data, url: URL) throws(PackDeliveryError) -> TUFUpdater {
        let now = self.now
        var updater = TUFUpdater(
            metadataFolder: self.repository.metadataFolder, metadataURL: self.repository.metadataURL,
            targetBaseURL: self.repository.targetsBaseURL, options: self.options, clock: { now })
        try updater.refresh()
        guard let path = self.repository.targetPath(of: url) else { preconditionFailure("the manifest is under the targets URL") }
        let target = try self.target(path, what: "the manifest", updater: &updater)
        let place = url.redacted
        if data.count != target.length {
            throw Self.refuse(
                place, target, "length: the manifest has \(data.count) bytes, the target \(target.length) (a changed or replaced manifest)")
        }
        if let why = TUFTargetFile.hashMismatch(target.hashes, data) {
            throw Self.refuse(place, target, "\(why): the manifest is not the target (a changed or replaced manifest)")
        }
        return updater
    }

    /// Checks that every pack of the manifest is a target of the repository, with the length and SHA-256 the manifest
    /// gives it: a pack's target path is its URL (resolved against the manifest's) relative to the targets URL.
    func checkPacks(_ loaded: LoadedManifest, updater: inout TUFUpdater) throws(PackDeliveryError) {
        let place = loaded.baseURL.redacted
        for product in loaded.manifest.products {
            for content in product.contents {
                let shown = PackDeliveryError.printable(content.contentIdentifier)
                guard let url = URL(string: content.url, relativeTo: loaded.baseURL)?.absoluteURL,
                    let path = self.repository.targetPath(of: url)
                else {
                    throw PackDeliveryError(
                        .untrustedManifest,
                        message:
                            "The manifest at \(place) is not trusted: the URL of its pack '\(shown)' is not under the targets of the TUF repository \(self.repository.id), so no TUF targets metadata can vouch for it.",
                        hint: "Nothing was downloaded; the publisher must serve each pack under the repository's targets URL.",
                        subject: place)
                }
                let target = try self.target(path, what: "the pack '\(shown)'", updater: &updater)
                guard Int64(target.length) == content.contentLength else {
                    throw Self.refuse(
                        place, target,
                        "length: the manifest gives the pack '\(shown)' \(content.contentLength) bytes, the target \(target.length)")
                }
                guard let sha256 = target.hashes["sha256"] else {
                    throw Self.refuse(place, target, "wrong hash: the target of the pack '\(shown)' has no sha256")
                }
                guard sha256.lowercased() == content.sha256.lowercased() else {
                    throw Self.refuse(
                        place, target, "wrong hash (sha256): the manifest gives the pack '\(shown)' another SHA-256 than its target")
                }
            }
        }
    }

    private func target(_ path: String, what: String, updater: inout TUFUpdater) throws(PackDeliveryError) -> TUFUpdater.Target {
        guard let target = try updater.targetInfo(path) else {
            let version = updater.trustedVersion("targets").map { " version \($0)" } ?? ""
            throw PackDeliveryError(
                .untrustedManifest,
                message:
                    "The TUF targets metadata\(version) was refused for \(what): no role that may sign for the target '\(PackDeliveryError.printable(path))' names it (not a target).",
                hint: "Nothing was downloaded; the publisher must add it to the repository's targets.", subject: path)
        }
        return target
    }

    private static func refuse(_ place: String, _ target: TUFUpdater.Target, _ rule: String) -> PackDeliveryError {
        PackDeliveryError(
            .untrustedManifest,
            message:
                "The manifest at \(place) is not trusted: against the TUF \(PackDeliveryError.printable(target.role)) metadata version \(target.roleVersion), target '\(PackDeliveryError.printable(target.path))', \(rule).",
            hint: "Nothing was downloaded or recorded; the repository may be under attack, or was published wrongly.", subject: place)
    }
}
