import Foundation
import Logging

// Launch and recovery: the store (rebuilt when damaged), downloads no live process runs, leftovers,
// recent installs checked, verify and repair.
extension DownloadQueue {
    /// Opens the store; a damaged one is moved aside and a new one made (the installs are recorded again by ``rebuildInstalls()``).
    static func openStore(home: Home, busyTimeout: TimeInterval, logger: Logger) throws(PackDeliveryError) -> (Store, StoreRecovery?) {
        do {
            let store = try Store(url: home.databaseURL, busyTimeout: busyTimeout)
            store.ensureTrustFile()
            return (store, nil)
        } catch  where error.code == .databaseCorrupt {
            let aside = try Store.quarantine(home.databaseURL)
            logger.error("the state database was damaged; moved aside and rebuilt", metadata: ["moved to": "\(aside.path)"])
            let store = try Store(url: home.databaseURL, busyTimeout: busyTimeout)
            // The installed folders say nothing about trust: it is read back from trust.json, or every manifest is refused.
            let trust = try store.restoreTrust(from: store.trustFileURL)
            var recovery = StoreRecovery(damagedDatabase: aside, installsRecovered: 0, foldersNotRecognised: [])
            if case .restored(let publishers) = trust { recovery.trustedPublishersRestored = publishers }
            return (store, recovery)
        }
    }

    /// On open: leftovers cleaned, recent installs checked, downloads left running by a dead process (or
    /// paused by a shutdown) taken over and resumed when configured, otherwise marked `paused (interrupted)`.
    func launch() throws(PackDeliveryError) {
        self.cleanLeftovers()
        // Before the check of recent installs: a pack whose eviction a crash interrupted is evicted, not damaged.
        self.finishEvictions()
        if self.configuration.launchCheckWindow > 0 { try self.checkRecentInstalls() }
        let resumeInterrupted = self.configuration.resumeInterruptedDownloads
        try self.takeOrphans(resumingInterrupted: resumeInterrupted)
        self.save(includingProgress: false)
        if !resumeInterrupted {
            // Recorded as paused (interrupted); they wait for a resume, by this queue or another.
            let ids = self.driven { Array($0.machine.entries.keys) }
            try self.store.release(ids, owner: self.owner)
            self.driven { state in for id in ids { state.machine.forget(id) } }
        }
    }

    /// Takes the downloads no live process runs that were running or installing when their process stopped, and, with
    /// `resumingInterrupted`, those paused as interrupted, resumed.
    /// - Returns: the ids taken.
    @discardableResult
    func takeOrphans(resumingInterrupted: Bool) throws(PackDeliveryError) -> [String] {
        let taken = try self.take(nil) { record in
            record.state.isRunning || record.phase != nil
                || (resumingInterrupted && (record.pauseReason == .interrupted || record.pauseReason == .awaitingRelease))
        }
        if resumingInterrupted { self.resumeInterrupted(taken) }
        return taken
    }

    /// Resumes those of the downloads just taken that their taking left paused as interrupted (a process that stopped
    /// mid-transfer): they go on from their bytes.
    func resumeInterrupted(_ taken: [String]) {
        for id in taken where self.driven({ $0.machine.download(id)?.pauseReason == .interrupted }) {
            self.change { $0.handle(id, .resume) }
        }
    }

    /// For the agent, when a client hands it a home's downloads (``AgentUse``): takes and resumes every download of the
    /// home no live process runs, as a launch does (``takeOrphans(resumingInterrupted:)``).
    /// - Returns: how many it took.
    /// - Throws: `queueClosed` after ``close()``; a database error when the store cannot be written.
    @_spi(Agent) public func takeOrphans() throws(PackDeliveryError) -> Int {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in
            let taken = try self.takeOrphans(resumingInterrupted: true)
            self.save(includingProgress: false)
            return taken.count
        }
    }

    /// For the agent: whether any download this queue owns waits or runs, or waits for its preload key's release (an
    /// agent with none may stop when idle; one that stopped would ask no key at the release, and the preload would
    /// install only once a client starts it again). Asks the queue's machine, not the store, so that it costs nothing
    /// next to a large queue; waits for the driver (busy for seconds while a catalog is recorded) on a thread of its
    /// own, not on the caller's.
    @_spi(Agent) public var hasRunningDownloads: Bool {
        get async {
            if self.installer.keyring.isWaiting { return true }
            return (try? await Blocking.run { self.driven { $0.machine.entries.values.contains { $0.state.isRunning } } })
                ?? false
        }
    }

    /// For the agent's `POST /v1/fetch`: ``add(products:from:kind:destination:autoFinish:force:start:receipt:)`` of
    /// purchases with the downloads' priority given, so that they are recorded and first admitted with it (not
    /// admitted as essential, then changed), and the client's receipt, stored with the transactions.
    @_spi(Agent) public func add(
        products productIdentifiers: [String], from manifest: LoadedManifest, destination: Destination,
        autoFinish: Bool, priority: DownloadPriority?, receipt: String? = nil
    ) async throws(PackDeliveryError) -> [Transaction] {
        try await Blocking.run { () throws(PackDeliveryError) in
            try self.add(
                products: productIdentifiers, from: manifest, kind: .purchased, destination: destination,
                autoFinish: autoFinish, force: false, start: true, receipt: receipt, priority: priority)
        }
    }

    /// Takes over downloads no live queue owns (`ids`, or every unsettled download of an open transaction
    /// that `wanted` accepts), finishing or rolling back a move into place a crash interrupted.
    /// - Returns: the ids taken.
    @discardableResult
    func take(_ ids: [String]?, wanted: @escaping (DownloadRecord) -> Bool = { _ in true }) throws(PackDeliveryError) -> [String] {
        let records = try self.store.claim(ids, owner: self.owner, wanted: wanted)
        var taken: [String] = []
        for record in records {
            guard let machine = try self.adopt(record) else { continue }
            taken.append(record.id)
            if machine.state.isSettled {
                // The crash came after the move: the install is now recorded, and its transaction may finish.
                self.emitTransaction(record.transactionID)
                try self.store.release([record.id], owner: self.owner)
                continue
            }
            self.change { $0.own(machine, position: record.position) }
        }
        // Those that wait for a preload's key: asked for from their release date on.
        self.awaitKeys(of: taken)
        return taken
    }

    /// The machine for a download taken over from an earlier process: the facts (recovery of a move into place,
    /// the archive's size), then the decision (``Adoption``).
    private func adopt(_ record: DownloadRecord) throws(PackDeliveryError) -> DownloadMachine? {
        if let reason = record.unreadableIndexReference {
            self.logger.warning(
                "the pack index recorded for a download cannot be read; the download has none, and an update fetches the whole pack",
                metadata: ["download": "\(record.id)", "column": "downloads.indexReference", "reason": "\(reason)"])
        }
        var recovered: InstalledPack?
        if Adoption.needsInstallRecovery(record) {
            recovered = try self.installer.recover(record.download, stagingInode: record.stagingInode)
        } else if Adoption.discardsStaging(record) {
            self.discard(self.home.stagingURL(for: record.download))
        }
        let facts = Adoption.Facts(
            record: record, archiveBytes: Self.fileSize(self.home.archiveURL(for: record.download)),
            recoveredInstall: recovered?.contentURL)
        var machine = Adoption.machine(facts, retryPolicy: self.configuration.retryPolicy)
        machine.credentialsRenewable = self.configuration.credentials != nil
        if let recovered {
            // The move into place had happened: the install is recorded with the finished download, in one commit.
            try self.store.commitInstall(
                recovered.install, files: recovered.files, download: self.record(machine, position: record.position))
            self.installer.clearAway(recovered)
        }
        return machine
    }

    /// Removes staging folders and archives that nothing will use: no record, a settled download, or no
    /// live owner (a staging folder that a crash left mid-move stays for recovery).
    private func cleanLeftovers() {
        for destination in Destination.allCases {
            let work = self.home.workFolder(for: destination)
            for folder in ["staging", "downloads"] {
                let url = work.appending(path: folder)
                // List first, then read the records: a record is always written before its files exist.
                let names = (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []
                for name in names {
                    let item = url.appending(path: name)
                    if name.hasPrefix("removed-") {
                        self.janitor.async { try? Installer.removeTree(item) }
                        continue
                    }
                    // downloads/<id>.pack; staging/<id>, or staging/<id>.s<token> for an unpack that followed a transfer.
                    // downloads/<id>.delta for the entries a delta update fetched, downloads/<id>.t<token>.index for an index.
                    // A preload's plain pack, downloads/<id>.pack.decrypted (and .<id>.pack.decrypted.part while written):
                    // kept only while its owner lives (a kill leaves no plaintext; the install decrypts again).
                    let plain = Self.plainPackName(name)
                    let id =
                        folder == "downloads" && !name.hasSuffix(".index")
                        ? [".pack", ".delta"].first(where: (plain ?? name).hasSuffix).map { String((plain ?? name).dropLast($0.count)) }
                            ?? name
                        : String(name.prefix { $0 != "." })
                    let record: DownloadRecord?
                    do { record = try self.store.downloadRecord(id) } catch { continue }  // the store cannot be read: leave it
                    if let record {
                        if let owner = record.owner, owner.isAlive { continue }
                        if !record.state.isSettled, folder == "downloads", plain == nil { continue }
                        if folder == "staging", name == id, record.stagingInode != nil, !record.state.isSettled { continue }
                    }
                    self.discard(item)
                }
            }
        }
    }

    /// For the name of a preload's plain pack (``Installer/decryptedURL(for:)``, or the hidden `.part` it is written as),
    /// the archive's name; nil for any other name.
    static func plainPackName(_ name: String) -> String? {
        if name.hasPrefix("."), name.hasSuffix(".decrypted.part") { return String(name.dropFirst().dropLast(".decrypted.part".count)) }
        if name.hasSuffix(".decrypted") { return String(name.dropLast(".decrypted".count)) }
        return nil
    }

    // MARK: Recent installs, verify and repair

    /// Checks, cheaply (presence and sizes), the installs recorded in the last minutes before the newest one,
    /// and delivers again those found damaged.
    private func checkRecentInstalls() throws(PackDeliveryError) {
        let recent = try self.store.recentInstalls(window: self.configuration.launchCheckWindow)
        let damaged = recent.filter { !Self.looksIntact($0.install, files: $0.files) }.map(\.install)
        guard !damaged.isEmpty else { return }
        self.logger.warning(
            "installed content found damaged at launch; delivering it again",
            metadata: ["content": "\(damaged.map { PackDeliveryError.printable($0.contentIdentifier) })"])
        _ = try self.redeliver(damaged)
    }

    static func looksIntact(_ install: InstallRecord, files: [InstalledFileRecord]) -> Bool {
        var info = stat()
        guard lstat(install.contentURL, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { return false }
        return Self.damagedFiles(install, files: files, modifiedSinceInstall: false, first: true).isEmpty
    }

    /// The installed files that do not look as recorded, by `lstat` alone: missing, another kind, another size,
    /// and with `modifiedSinceInstall` also a regular file modified after the install. Hashing every file would
    /// cost as much as a delta update saves; `verify` hashes them.
    ///
    /// File times come from the kernel's coarse clock (a tick, a few milliseconds, behind the recorded install
    /// time), so an edit within a tick of the install goes unseen; an edit of a file that keeps its size and
    /// resets its time by hand (`touch -d`) too: `verify` finds those.
    ///
    /// - Parameter first: stop at the first damaged file.
    static func damagedFiles(_ install: InstallRecord, files: [InstalledFileRecord], modifiedSinceInstall: Bool, first: Bool = false)
        -> [String]
    {
        var damaged: [String] = []
        var info = stat()
        let installedAt = install.installedAt.timeIntervalSince1970
        for file in files {
            let path = install.contentURL + "/" + file.path
            let looksRight: Bool
            if lstat(path, &info) != 0 {
                looksRight = false
            } else {
                switch file.kind {
                case .file:
                    let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
                    looksRight =
                        (info.st_mode & S_IFMT) == S_IFREG && Int64(info.st_size) == file.size
                        && !(modifiedSinceInstall && modified > installedAt)
                case .symlink:
                    looksRight = (info.st_mode & S_IFMT) == S_IFLNK
                }
            }
            if !looksRight {
                damaged.append(file.path)
                if first { break }
            }
        }
        return damaged
    }

    /// Compares installed content with the record made at install: every file's presence, kind, size and
    /// SHA-256, and files that were not installed.
    ///
    /// - Parameter productIDs: products to check, or nil for everything installed.
    /// - Returns: one result per installed pack.
    /// - Throws: a database error when the store cannot be read.
    public func verify(productIDs: [String]? = nil) throws(PackDeliveryError) -> [VerifyResult] {
        try self.requireOpen()
        var installs = try self.store.installs()
        if let productIDs {
            let wanted = Set(productIDs)
            installs = installs.filter { wanted.contains($0.productIdentifier) }
        }
        var results: [VerifyResult] = []
        for install in installs {
            results.append(try self.verify(install))
        }
        return results
    }

    private func verify(_ install: InstallRecord) throws(PackDeliveryError) -> VerifyResult {
        let files = try self.store.files(of: install)
        let root = URL(filePath: install.contentURL)
        var info = stat()
        guard lstat(root.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            return VerifyResult(content: install.content, damage: [], folderMissing: true, filesRecorded: install.fileCount >= 0)
        }
        guard install.fileCount >= 0 else {
            return VerifyResult(content: install.content, damage: [], folderMissing: false, filesRecorded: false)
        }
        var damage: [VerifyResult.Damage] = []
        var recorded = Set<String>()
        for file in files {
            recorded.insert(file.path)
            let url = root.appending(path: file.path)
            guard lstat(url.path, &info) == 0 else {
                damage.append(.init(path: file.path, problem: .missing))
                continue
            }
            switch file.kind {
            case .file:
                guard (info.st_mode & S_IFMT) == S_IFREG else {
                    damage.append(.init(path: file.path, problem: .changed))
                    continue
                }
                if Int64(info.st_size) < file.size {
                    damage.append(.init(path: file.path, problem: .truncated))
                    continue
                }
                let digest = try? SHA256Hasher.hexDigest(ofFile: url)
                if Int64(info.st_size) != file.size || digest != file.sha256 { damage.append(.init(path: file.path, problem: .changed)) }
            case .symlink:
                let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: url.path)) ?? ""
                let hasher = SHA256Hasher()
                Array(target.utf8).withUnsafeBytes { hasher.update($0) }
                if (info.st_mode & S_IFMT) != S_IFLNK || hasher.hexDigest() != file.sha256 {
                    damage.append(.init(path: file.path, problem: .changed))
                }
            }
        }
        let enumerator = FileManager.default.enumerator(atPath: root.path)
        while let relative = enumerator?.nextObject() as? String {
            guard lstat(root.appending(path: relative).path, &info) == 0, (info.st_mode & S_IFMT) != S_IFDIR else { continue }
            if !recorded.contains(relative) { damage.append(.init(path: relative, problem: .extra)) }
        }
        return VerifyResult(
            content: install.content, damage: damage.sorted { $0.path < $1.path }, folderMissing: false, filesRecorded: true)
    }

    /// Verifies products and delivers the damaged ones again, through one restore transaction per product
    /// (from the URLs recorded at install: no manifest is needed). Intact packs of the product finish at once.
    ///
    /// - Parameter productIDs: products to check, or nil for everything installed.
    /// - Returns: the restore transactions started; empty when everything is intact.
    /// - Throws: a database error; `queueClosed` after ``close()-9kmx4``.
    @discardableResult
    public func repair(productIDs: [String]? = nil) throws(PackDeliveryError) -> [Transaction] {
        try self.requireOpen()
        let damaged = try self.verify(productIDs: productIDs).filter { !$0.isIntact }
        guard !damaged.isEmpty else { return [] }
        let wanted = Set(damaged.map { "\($0.content.destination.rawValue)/\($0.content.contentIdentifier)" })
        let installs = try self.store.installs().filter { wanted.contains("\($0.destination.rawValue)/\($0.contentIdentifier)") }
        return try self.onDriver { () throws(PackDeliveryError) in try self.redeliver(installs) }
    }

    /// One restore transaction per product of `damaged`: its damaged packs download again from the URL
    /// recorded with the download that installed them; its other packs finish at once.
    private func redeliver(_ damaged: [InstallRecord]) throws(PackDeliveryError) -> [Transaction] {
        var transactions: [Transaction] = []
        var reused: [Transaction] = []
        let open = try self.store.transactions().filter { $0.kind == .restored }
        for (product, broken) in Dictionary(grouping: damaged, by: \.productIdentifier).sorted(by: { $0.key < $1.key }) {
            let brokenKeys = Set(broken.map { "\($0.destination.rawValue)/\($0.contentIdentifier)" })
            // A restore already open for this damage (an earlier launch found it) is taken over, not repeated.
            if let existing = open.first(where: { transaction in
                transaction.productIdentifier == product
                    && brokenKeys.isSubset(
                        of: Set(
                            transaction.downloads.filter { !$0.state.isSettled }
                                .map { "\($0.destination.rawValue)/\($0.contentIdentifier)" }))
            }) {
                let pending = existing.downloads.filter { !$0.state.isSettled }.map(\.id)
                _ = try self.take(pending)
                for id in pending { self.change { $0.handle(id, .resume) } }
                reused.append(existing)
                continue
            }
            let transactionID = Self.newID("t")
            var downloads: [Download] = []
            for install in try self.store.installs(productIdentifier: product) {
                guard let record = try self.store.downloadRecord(install.downloadID) else { continue }
                var recorded = record.download
                recorded.destination = install.destination
                let broken = brokenKeys.contains("\(install.destination.rawValue)/\(install.contentIdentifier)")
                let download = Redelivery.download(
                    recorded, id: Self.newID("d"), transactionID: transactionID, intact: !broken,
                    contentURL: URL(filePath: install.contentURL))
                downloads.append(download)
            }
            guard downloads.contains(where: { $0.state == .waiting }) else {
                self.logger.error(
                    "cannot deliver damaged content again: the download that installed it is not recorded",
                    metadata: ["product": "\(PackDeliveryError.printable(product))"])
                continue
            }
            transactions.append(
                Transaction(
                    id: transactionID, productIdentifier: product, kind: .restored, createdAt: Date(),
                    finishedAt: nil, autoFinish: true, downloads: downloads))
        }
        // Another process's repair (or restore) of the same packs recorded since the look above is joined, not repeated.
        if !transactions.isEmpty {
            transactions = try self.withJoined(transactions, try self.record(transactions, joining: true, adoptingRestores: true))
        }
        return reused.isEmpty ? transactions : (try self.liveTransactions(ids: reused.map(\.id))) + transactions
    }

    // MARK: A damaged store

    /// Records again what the destination folders hold, after the state database was found damaged and
    /// replaced: every install folder is kept; those whose product can be read (from the folder's
    /// `user.packdelivery.product` attribute or its `ContentInfo.plist`) are recorded with their files.
    func rebuildInstalls() throws(PackDeliveryError) -> (Int, [URL]) {
        var count = 0
        var unknown: [URL] = []
        for destination in Destination.allCases {
            let root = self.home.root(for: destination)
            for name in ((try? FileManager.default.contentsOfDirectory(atPath: root.path)) ?? []).sorted() {
                guard !name.hasPrefix("."), name != BackupExclusion.tagName else { continue }
                let folder = root.appending(path: name)
                var info = stat()
                guard lstat(folder.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { continue }
                let plist = try? PropertyListDecoder().decode(
                    ContentInfo.self, from: Data(contentsOf: folder.appending(path: "ContentInfo.plist")))
                guard let product = Installer.attribute(Installer.productAttribute, of: folder) ?? plist?.productIdentifier else {
                    unknown.append(folder)
                    continue
                }
                let files = try Durability.scan(folder)
                let install = InstallRecord(
                    destination: destination, contentIdentifier: name, productIdentifier: product,
                    contentVersion: plist?.contentVersion ?? "unknown", contentURL: folder.path,
                    installedAt: Date(timeIntervalSince1970: TimeInterval(info.st_mtim.tv_sec)),
                    downloadID: "recovered", fileCount: files.count,
                    byteCount: files.reduce(0) { $0 + ($1.kind == .file ? $1.size : 0) })
                try self.store.commitInstall(
                    install,
                    files: files.map {
                        InstalledFileRecord(
                            destination: destination, contentIdentifier: name, path: $0.path, kind: $0.kind, size: $0.size,
                            sha256: $0.sha256)
                    }, download: nil)
                count += 1
            }
        }
        return (count, unknown)
    }
}
