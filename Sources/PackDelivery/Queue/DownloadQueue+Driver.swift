import Foundation
import Synchronization

// The driver: runs what the machines decide. Everything here runs on `driver`, one call at a time.
extension DownloadQueue {
    /// Changes the machine under the lock, then runs the actions it returned (and those they lead to) after unlocking.
    func change(_ body: (inout QueueMachine) -> [QueueMachine.Action]) {
        var work = self.driven { body(&$0.machine) }
        var index = 0
        var save = false
        var settled: [String] = []
        var stopped = Set<String>()
        while index < work.count {
            let action = work[index]
            index += 1
            switch action {
            case .run(let id, let action):
                if case .stopTransfer = action { stopped.insert(id) }
                if case .deleteFiles = action { self.installer.keyring.drop(id) }  // cancelled: its preload key goes
                if case .deleteFiles(let staging) = action, stopped.contains(id),
                    let download = self.driven({ $0.machine.download(id) })
                {
                    // Gone at once, as the cancel reports; the transfer thread removes it once more after the stop, in
                    // order, in case a start posted before the cancel creates it again (see TransferEngine.discard).
                    let archive = self.home.archiveURL(for: download)
                    self.discard(archive)
                    self.discard(self.home.deltaURL(for: download))
                    self.engineBox.withLock { $0 }?.discard(archive)
                    if let index = self.driven({ $0.work[id]?.index }) { self.engineBox.withLock { $0 }?.discard(index.file) }
                    if staging { self.discard(self.home.stagingURL(for: download)) }
                    continue
                }
                work += self.perform(action, for: id)
            case .measureSpace(let id, let destination):
                let folder = self.home.workFolder(for: destination)
                var available = SpaceCheck.available(at: folder)
                var facts = DeliveryFacts.none
                if let machine = self.driven({ $0.machine.machine(id) }) {
                    facts = self.facts(of: machine.download)
                    // Room first: evict cached packs to keep the budget, or to fit on a full disk (before pausing for space).
                    let needed = self.driven { $0.machine.spaceNeeded(id, facts: facts) } ?? 0
                    available = self.makeRoom(for: machine.download, needed: needed, available: available, folder: folder)
                }
                work += self.driven { $0.machine.admit(id, facts: facts, available: available, path: folder.path) }
                // A source picked for a download that did not start (paused for space or the network) is in flight nowhere.
                if self.driven({ $0.machine.download(id)?.state != .active }) { self.driven { _ = $0.sourcePicks.removeValue(forKey: id) } }
            case .notify(let id):
                if let download = self.driven({ $0.machine.download(id) }) { self.emit(.downloadUpdated(download)) }
            case .priorityChanged(let id):
                if let download = self.driven({ $0.machine.download(id) }) { self.emit(.priorityChanged(download)) }
            case .settled(let transactionID):
                if !settled.contains(transactionID) { settled.append(transactionID) }
            case .save:
                save = true
            }
        }
        if save { self.scheduleSave() }
        // A download that settles may make its transaction finishable: say so where finishing is decided.
        for transactionID in settled { self.emitTransaction(transactionID) }
        self.reportAdmission()
    }

    /// Tells the machine's admission order what this queue runs and waits to run, when that changed (a queue that
    /// shares it, ``Configuration/sharesAdmission``).
    private func reportAdmission() {
        guard let key = self.admissionKey.withLock({ $0 }) else { return }
        let demand = self.driven { state -> AdmissionBoard.Demand? in
            let fingerprint = state.machine.demandFingerprint
            guard fingerprint != state.admissionReported else { return nil }
            state.admissionReported = fingerprint
            return state.machine.demand(limit: AdmissionBoard.shared.total)
        }
        if let demand { AdmissionBoard.shared.report(key, demand) }
    }

    /// Runs one download's action; returns the machine's actions when running it failed at once.
    private func perform(_ action: DownloadMachine.Action, for id: String) -> [QueueMachine.Action] {
        guard let machine = self.driven({ $0.machine.machine(id) }) else { return [] }
        let download = machine.download
        switch action {
        case .startTransfer(let order):
            self.startTransfer(order, of: download)
        case .stopTransfer(let token):
            let transfer = TransferID(download: id, token: token)
            if let delta = self.driven({ $0.work[id]?.delta }), delta.request.id == transfer { delta.stop() }
            if let index = self.driven({ $0.work[id]?.index }), index.id.token == token { self.engineBox.withLock { $0 }?.stop(index.id) }
            self.engineBox.withLock { $0 }?.stop(transfer)
        case .answerDeltaPlan(let token, let refusal):
            if let delta = self.driven({ $0.work[id]?.delta }), delta.request.id.token == token { delta.answer(refusal) }
        case .scheduleRetry(let token, let delay):
            self.logger.info("retrying", metadata: ["download": "\(id)", "after": "\(delay)", "error": "\(download.error?.message ?? "")"])
            self.driver.asyncAfter(deadline: .now() + delay) { [weak self] in
                self?.change { $0.handle(id, .retryDue(token: token)) }
            }
        case .install(let token):
            let flag = CancelFlag()
            // The install takes the streamed unpack, the delta's tree and the index's digests, and can be stopped through its flag.
            let taken = self.driven { state in
                defer { state.work[id] = .install(token: token, flag: flag) }
                return state.work[id]
            }
            let source: Installer.Source =
                if let tree = taken?.delta?.tree.withLock({ $0 }) {
                    .built(tree)
                } else {
                    .archive(recheck: machine.recheckArchive, streamed: taken?.stream, index: taken?.index)
                }
            let installer = self.installer
            WorkerPool.shared.run { [weak self] in
                let progress: (DownloadPhase, Double) -> Void = { phase, fraction in
                    guard let self else { return }
                    self.driver.async { self.change { $0.handle(id, .installProgress(token: token, phase: phase, fraction: fraction)) } }
                }
                let result: Result<InstalledPack, PackDeliveryError>
                do throws(PackDeliveryError) {
                    result = .success(try installer.install(download, from: source, progress: progress, cancel: flag))
                } catch { result = .failure(error) }
                guard let self else { return }
                self.driver.async { self.installReturned(result, id: id, token: token) }
            }
        case .commitInstall(let token, let pack, let finished):
            let position = self.driven { $0.machine.entries[id]?.position } ?? 0
            self.commit(pack, row: self.record(finished, position: position), id: id, token: token)
        case .reloadManifest(let token):
            self.reloadManifest(for: download, token: token)
        case .stopInstall:
            if case .install(_, let flag) = self.driven({ $0.work[id] }) { flag.cancel() }
        case .deleteFiles(let staging):
            let work = self.driven { state -> DownloadWork? in
                guard let work = state.work[id] else { return nil }
                // A running install owns what it took, and the staging folder: it is cleared when it returns.
                if case .install = work { return nil }
                state.work[id] = nil
                return work
            }
            work?.stream?.discard()
            work?.delta?.stop()
            if let index = work?.index {
                self.engineBox.withLock { $0 }?.stop(index.id)
                self.engineBox.withLock { $0 }?.discard(index.file)
            }
            self.discard(self.home.deltaURL(for: download))
            self.discard(self.home.archiveURL(for: download))
            if staging { self.discard(self.home.stagingURL(for: download)) }
        }
        return []
    }

    /// The installer returned, on the driver: its content in place goes to the machine, which orders the commit
    /// (``DownloadMachine/Action/commitInstall(token:pack:finished:)``); a failure goes to the machine as it is. A
    /// download no longer queued (its transaction was finished while a stopped install completed) is committed
    /// finished, as recovery finishes one.
    private func installReturned(_ result: Result<InstalledPack, PackDeliveryError>, id: String, token: Int) {
        guard case .success(let pack) = result else {
            self.endInstall(id: id, token: token)
            self.change { $0.handle(id, .installFinished(token: token, result: result.map(\.contentURL))) }
            return
        }
        guard self.driven({ $0.machine.entries[id] == nil }) else {
            self.change { $0.handle(id, .installed(token: token, pack: pack)) }
            return
        }
        do throws(PackDeliveryError) {
            guard let record = try self.store.downloadRecord(id) else { throw PackDeliveryError.stopped("The download is gone.") }
            let facts = Adoption.Facts(record: record, archiveBytes: nil, recoveredInstall: pack.contentURL)
            let row = self.record(Adoption.machine(facts, retryPolicy: self.configuration.retryPolicy), position: record.position)
            self.commit(pack, row: row, id: id, token: token)
        } catch {
            self.endInstall(id: id, token: token)
        }
    }

    /// Records what an install put in place with `row`, the download as its machine holds it once it takes the result,
    /// in one durable write; then clears what the install left behind, and tells the machine. The machine is told only
    /// after the commit, so what it reports is recorded: a commit that fails is the install's failure. The write (a WAL
    /// sync) runs off the driver, which keeps starting transfers and taking events meanwhile (on the driver, a
    /// 1,000-pack catalog ran 1.16 × slower: each pack's sync stalled every other download); a save the driver makes
    /// meanwhile never overwrites the finished row (``Store/save(_:)`` skips finished rows).
    private func commit(_ pack: InstalledPack, row: DownloadRecord, id: String, token: Int) {
        WorkerPool.shared.run { [weak self] in
            guard let self else { return }
            let recorded: Result<URL, PackDeliveryError>
            do throws(PackDeliveryError) {
                try self.store.commitInstall(pack.install, files: pack.files, download: row)
                self.installer.clearAway(pack)
                recorded = .success(pack.contentURL)
            } catch {
                recorded = .failure(error)
            }
            self.driver.async {
                self.endInstall(id: id, token: token)
                self.change { $0.handle(id, .installFinished(token: token, result: recorded)) }
            }
        }
    }

    /// The install of `token` returned: its work is gone (the next transfer's may have taken its place already).
    private func endInstall(id: String, token: Int) {
        self.driven { state in
            if case .install(token, _) = state.work[id] { state.work[id] = nil }
        }
    }

    /// What the machines decide a download's delivery from (``DeliveryFacts``): the whole-pack bytes on disk, the
    /// version installed in its destination, the configuration, and the source the ranking picks for a pack with
    /// several (counting the transfers in flight at each origin, and the picks not yet started).
    private func facts(of download: Download) -> DeliveryFacts {
        var info = stat()
        let archiveBytes = stat(self.home.archiveURL(for: download).path, &info) == 0 ? Int64(info.st_size) : 0
        var deltaUpdates = self.configuration.deltaUpdates
        var installed: InstallRecord?
        do {
            installed = try self.store.installs(contentIdentifier: download.contentIdentifier).first {
                $0.destination == download.destination && $0.productIdentifier == download.productIdentifier
            }
        } catch {
            // Not knowing what is installed, only the whole pack is safe.
            deltaUpdates = false
        }
        var preferred: URL?
        if let sources = download.sources, download.bytesReceived == 0 {
            preferred = self.driven { state -> URL? in
                if state.ranking == nil { state.ranking = SourceRanking((try? self.store.sourceStats()) ?? []) }
                var inFlight: [String: Int] = [:]
                for start in state.sourceStarts.values { inFlight[start.origin, default: 0] += 1 }
                for picked in state.sourcePicks.values { inFlight[Download.origin(picked), default: 0] += 1 }
                let best = state.ranking?.pick(sources, inFlight: inFlight, now: Date())
                state.sourcePicks[download.id] = best
                return best
            }
        }
        return DeliveryFacts(
            archiveBytes: archiveBytes, installed: installed, deltaUpdates: deltaUpdates,
            preferredSource: preferred)
    }

    /// Runs a transfer order: the plan says which transfer, the order where from; nothing here decides.
    private func startTransfer(_ order: TransferOrder, of machineDownload: Download) {
        let id = machineDownload.id
        var download = machineDownload
        download.url = order.source
        download.index = download.indexAtSource
        let archive = self.home.archiveURL(for: download)
        if case .wholePack(fromZero: true) = order.plan { self.discard(archive) }
        var options = self.configuration.transfer
        let access = self.recordedAccess(download.transactionID)
        if download.mayCarryCredentials(manifestURL: access?.manifestURL) {
            options.headers += self.credentialHeaders(
                for: download, url: download.url, refused: order.credentialsRefused, receipt: access?.receipt)
        } else {
            // The headers given that carry credentials follow the receipt's rule: none for a mirror of another origin.
            options = options.withoutCredentials
        }
        options.ratePriority = download.priority
        if download.sources != nil {
            self.logger.info("fetching", metadata: ["download": "\(id)", "source": "\(PackDeliveryError.printable(download.source))"])
            let fromZero = order.plan == .wholePack(fromZero: true)
            let start = (origin: Download.origin(download.url), at: Date(), bytes: fromZero ? 0 : download.bytesReceived)
            self.driven { state in
                state.sourcePicks[id] = nil
                state.sourceStarts[TransferID(download: id, token: order.token)] = start
            }
        }
        let transfer = TransferID(download: id, token: order.token)
        switch order.plan {
        case .delta(let installed):
            // The installed version's files, as recorded: a delta reuses them. Unreadable, the update is refused as
            // any other (an event, in order), and the machine fetches the whole pack.
            guard let files = try? self.store.files(of: installed) else {
                let refusal = Download.DeltaFallback(.installedFilesChanged, "the installed files' records could not be read")
                self.driver.async { self.handle(.finished(id: transfer, outcome: .deltaRefused(refusal))) }
                return
            }
            self.startDelta(for: download, transfer: transfer, install: installed, files: files, options: options)
        case .writeOnce:
            self.startDelta(for: download, transfer: transfer, install: nil, files: [], options: options)
        case .wholePack(let fromZero):
            // The index, beside the pack: its files' digests, so that the unpack hashes none of them.
            let index = self.startIndexFetch(for: download, token: order.token, options: options)
            let request = TransferRequest(
                id: transfer, url: download.url, file: archive, expectedLength: download.contentLength, validator: order.validator,
                fromZero: fromZero, options: options, writer: self.configuration.writer,
                stream: self.startStream(for: download, token: order.token, hashFiles: index == nil))
            self.engineBox.withLock { $0 }?.start(request)
        }
    }

    /// Starts a delta update from `install` (nil: a first install that writes each chunk once).
    private func startDelta(
        for download: Download, transfer: TransferID, install: InstallRecord?, files: [InstalledFileRecord], options: TransferOptions
    ) {
        guard let index = download.index, let engine = self.engineBox.withLock({ $0 }) else { return }
        let delta = DeltaTransfer(
            DeltaTransfer.Request(
                id: transfer, download: download, index: index, install: install, installedFiles: files,
                folder: self.home.deltaURL(for: download), options: options, writer: self.configuration.writer,
                maxEntries: self.installer.limits.maxEntries, engine: engine, joinedWindow: self.configuration.joinedWindow,
                seeds: self.configuration.seeds,
                onSeedDropped: { [logger, configuration] folder, error in
                    logger.warning("seed dropped", metadata: ["folder": "\(folder.path)", "error": "\(error.message)"])
                    configuration.onSeedDropped?(folder, error)
                }))
        self.driven { $0.work[download.id] = .delta(delta) }
        delta.start { [weak self] event in
            guard let self else { return }
            self.driver.async { self.handle(event) }
        }
    }

    /// A fetch of the pack's index beside this transfer, for its files' digests, when ``IndexFetch/applies(to:)``
    /// (the previous one, if any, is stopped); nil when the files are hashed as they unpack.
    private func startIndexFetch(for download: Download, token: Int, options: TransferOptions) -> IndexFetch? {
        let id = download.id
        let engine = self.engineBox.withLock { $0 }
        let previous = self.driven { state in
            defer { state.work[id] = .wholePack(stream: state.work[id]?.stream, index: nil) }
            return state.work[id]?.index
        }
        if let previous { engine?.stop(previous.id) }
        guard IndexFetch.applies(to: download), let reference = download.index, let engine else { return nil }
        let fetch = IndexFetch(
            download: download, reference: reference, token: token, file: self.home.indexURL(for: download, token: token),
            maxEntries: self.installer.limits.maxEntries, logger: self.logger)
        self.driven { $0.work[id] = .wholePack(stream: $0.work[id]?.stream, index: fetch) }
        fetch.start(on: engine, options: options, writer: self.configuration.writer)
        return fetch
    }

    /// A new unpack that follows this transfer (the previous one, if any, is discarded); nil when streaming is off.
    /// - Parameter hashFiles: hash the files as they unpack; false when an ``IndexFetch`` gives their digests.
    private func startStream(for download: Download, token: Int, hashFiles: Bool) -> StreamedUnpack? {
        let id = download.id
        self.driven { state in
            defer { state.work[id] = .wholePack(stream: nil, index: state.work[id]?.index) }
            return state.work[id]?.stream
        }?.discard()
        guard self.configuration.streamingUnpack else { return nil }
        let limits = UnpackLimits(
            maxBytes: self.installer.limits.maxBytes(packLength: download.contentLength, unpackedLength: download.unpackedLength),
            maxEntries: self.installer.limits.maxEntries)
        let hook = self.installer.hook
        let hooked = Atomic<Bool>(false)
        let stream = StreamedUnpack(
            archive: self.home.archiveURL(for: download), folder: URL(filePath: self.home.stagingURL(for: download).path + ".s\(token)"),
            length: download.contentLength, limits: limits, writer: self.configuration.writer, hashFiles: hashFiles
        ) { [weak self] bytes in
            if bytes > 0, !hooked.exchange(true, ordering: .relaxed) { hook?(.unpacking) }
            guard let self else { return }
            self.driver.async { self.change { $0.handle(id, .streamProgress(token: token, bytes: bytes)) } }
        }
        self.driven { $0.work[id] = .wholePack(stream: stream, index: $0.work[id]?.index) }
        return stream
    }

    /// The credential headers of a request for `download`'s transaction: the provider's, and its stored receipt
    /// as `Authorization: Bearer` unless an `Authorization` header is already there.
    func credentialHeaders(for download: Download, url: URL, refused: Bool, receipt: String?) -> [String] {
        var headers: [String] = []
        if let provider = self.configuration.credentials {
            headers = provider(
                CredentialRequest(
                    url: url, productIdentifier: download.productIdentifier,
                    contentIdentifier: download.contentIdentifier, refused: refused))
        }
        if let receipt, !(self.configuration.transfer.headers + headers).contains(where: { $0.lowercased().hasPrefix("authorization:") }) {
            headers.append("Authorization: Bearer \(receipt)")
        }
        return headers
    }

    /// The transaction's recorded manifest URL and receipt; nil when none (or the store cannot be read: then
    /// the request goes without, and a refusal says so).
    func recordedAccess(_ transactionID: String) -> TransactionAccessRecord? {
        do { return try self.store.transactionAccess(transactionID) } catch {
            self.logger.warning(
                "cannot read a transaction's receipt", metadata: ["transaction": "\(transactionID)", "error": "\(error.message)"])
            return nil
        }
    }

    /// Reads the transaction's manifest again (off the driver) and reports the pack's URL in it, when the pack
    /// is still there with the same SHA-256 and length.
    private func reloadManifest(for download: Download, token: Int) {
        let access = self.recordedAccess(download.transactionID)
        guard let location = access?.manifestURL else {
            self.change {
                $0.handle(
                    download.id,
                    .manifestReloaded(
                        token: token,
                        result: .failure(
                            PackDeliveryError(
                                .invalidManifest,
                                message: "The transaction records no manifest to read again (it was added from a manifest built in memory)."
                            ))))
            }
            return
        }
        var options = self.configuration.transfer
        let manifestURL = URL(string: location) ?? URL(filePath: location)
        // Not `refused`: after a refusal the provider was asked for fresh credentials already (once, before the pause).
        options.headers += self.credentialHeaders(for: download, url: manifestURL, refused: false, receipt: access?.receipt)
        let manifestOptions = options
        self.logger.info("reading the manifest again", metadata: ["download": "\(download.id)", "manifest": "\(manifestURL.redacted)"])
        WorkerPool.shared.run { [weak self] in
            let result = Result { () throws(PackDeliveryError) in
                try Redelivery.packURL(of: download, in: try LoadedManifest.load(location, options: manifestOptions))
            }
            guard let self else { return }
            self.driver.async { self.change { $0.handle(download.id, .manifestReloaded(token: token, result: result)) } }
        }
    }

    /// Removes a file or folder: moved aside at once (so a new attempt never meets it), deleted by the janitor.
    func discard(_ url: URL) {
        var info = stat()
        guard lstat(url.path, &info) == 0 else { return }
        let folder = url.deletingLastPathComponent()
        let aside = folder.appending(path: "removed-\(UUID().uuidString)")
        if rename(url.path, aside.path) == 0 {
            self.janitor.async { try? Installer.removeTree(aside) }
        } else {
            try? Installer.removeTree(url)
        }
    }

    /// An event from the transfer thread.
    func handle(_ event: TransferEvent) {
        switch event {
        case .progress(let transferID, let bytes, let validator):
            let (id, token) = (transferID.download, transferID.token)
            self.change { $0.handle(id, .transferProgress(token: token, bytes: bytes, validator: validator)) }
        case .durable(let transferID, let bytes):
            let (id, token) = (transferID.download, transferID.token)
            self.change { $0.handle(id, .transferDurable(token: token, bytes: bytes)) }
        case .finished(let transferID, let outcome):
            let (id, token) = (transferID.download, transferID.token)
            if case .deltaRefused(let fallback) = outcome {
                self.logger.info(
                    "delta update not used; fetching the whole pack",
                    metadata: ["download": "\(id)", "reason": "\(fallback.reason.rawValue)", "why": "\(fallback.message)"])
            }
            if case .assembled(let fetched) = outcome {
                self.logger.info("delta update fetched what it needed", metadata: ["download": "\(id)", "bytesFetched": "\(fetched)"])
            }
            self.measureSource(transferID, outcome)
            self.change { $0.handle(id, .transferFinished(token: token, outcome: outcome)) }
        case .deltaPlanned(let transferID, let delta):
            let (id, token) = (transferID.download, transferID.token)
            self.logger.info(
                "delta update planned",
                metadata: [
                    "download": "\(id)", "bytesToFetch": "\(delta.bytesToFetch)", "bytesReused": "\(delta.bytesReused)",
                    "entriesToFetch": "\(delta.entriesToFetch)", "filesReused": "\(delta.filesReused)",
                    "chunksFetched": "\(delta.chunksFetched)", "chunksReused": "\(delta.chunksReused)", "bytesKept": "\(delta.bytesKept)",
                ])
            self.change { $0.handle(id, .deltaPlanned(token: token, delta: delta)) }
        }
    }

    /// Records what a transfer of a pack with several sources measured of its source: the bytes it brought over the time
    /// it ran, and whether the source failed. Kept in the home (``SourceStats``), so the next packs start at the fastest.
    private func measureSource(_ transferID: TransferID, _ outcome: TransferOutcome) {
        guard let start = self.driven({ $0.sourceStarts.removeValue(forKey: transferID) }) else { return }
        let now = Date()
        let bytes: Int64
        let failed: Bool
        switch outcome {
        case .completed(_, let length, let resumedFrom): (bytes, failed) = (length - resumedFrom, false)
        case .failed(let failure, let onDisk): (bytes, failed) = (onDisk - start.bytes, DownloadMachine.isSourceFailure(failure.error))
        case .assembled(let fetched): (bytes, failed) = (fetched - start.bytes, false)
        case .stopped, .deltaRefused: return  // says nothing of the source
        }
        let stats = self.driven { state in
            var ranking = state.ranking ?? SourceRanking((try? self.store.sourceStats()) ?? [])
            defer { state.ranking = ranking }
            return ranking.record(origin: start.origin, bytes: bytes, seconds: now.timeIntervalSince(start.at), failed: failed, now: now)
        }
        do { try self.store.saveSourceStats(stats) } catch {
            self.logger.warning(
                "cannot record a source's throughput",
                metadata: ["source": "\(PackDeliveryError.printable(start.origin))", "error": "\(error.message)"])
        }
    }

    /// Moves a whole-pack transfer to another of its sources when that one measured much faster (aria2's feedback
    /// style): after the transfer ran for `SourceRanking.moveAfter` seconds, when the other is `SourceRanking.moveFactor`
    /// times faster than the rate now, and the move saves at least `SourceRanking.moveSaves` seconds. What the slow
    /// transfer measured is recorded first. A delta is never moved (its worker may still be placing a range).
    private func moveSlowTransfers(now: Date) {
        let running = self.driven { $0.sourceStarts }
        for (transferID, start) in running where now.timeIntervalSince(start.at) >= SourceRanking.moveAfter {
            let (machine, delta, ranking) = self.driven {
                ($0.machine.machine(transferID.download), $0.work[transferID.download]?.delta, $0.ranking)
            }
            guard let machine, machine.token == transferID.token, delta == nil, let ranking else { continue }
            let download = machine.download
            guard download.state == .active, let sources = download.sources, let rate = download.bytesPerSecond, rate > 0 else { continue }
            let remaining = Double(download.contentLength - download.bytesReceived)
            let candidates = ranking.order(sources, now: now).filter { $0 != download.url && !machine.badSources.contains($0) }
            guard let best = candidates.first, let score = ranking.score(Download.origin(best), now: now),
                score >= rate * SourceRanking.moveFactor, remaining / rate - remaining / score >= SourceRanking.moveSaves
            else { continue }
            self.measureSource(
                transferID, .failed(TransferFailure(error: .stopped(""), retryable: true), bytesOnDisk: download.bytesReceived))
            let error = PackDeliveryError(
                .tooSlow,
                message:
                    "\(download.source) sent \(Int(rate)) bytes per second, where \(Download.sourceName(best)) measured \(Int(score)): moved there.",
                subject: download.source)
            self.logger.info(
                "moving to a faster source",
                metadata: [
                    "download": "\(transferID.download)", "from": "\(PackDeliveryError.printable(download.source))",
                    "to": "\(PackDeliveryError.printable(Download.sourceName(best)))",
                ])
            self.change { $0.handle(transferID.download, .moveSource(token: transferID.token, best, because: error)) }
        }
    }

    /// Twice a second: requests from other processes, the watchdog, progress checkpoints, and every few
    /// seconds the space of downloads paused for it.
    func tick() {
        let ticks = self.driven { state -> Int in
            state.ticks += 1
            return state.ticks
        }
        do {
            for (id, request) in try self.store.takeRequests(owner: self.owner) {
                switch request {
                case .success(let request): self.change { $0.handle(id, request.event) }
                case .failure(let error):
                    self.logger.error("ignored a request of another process", metadata: ["download": "\(id)", "error": "\(error.message)"])
                }
            }
        } catch {
            self.logger.warning("could not read requests from other processes", metadata: ["error": "\(error)"])
        }
        var available: [Destination: Int64?]?
        if ticks % 10 == 0, self.configuration.resumeWhenSpaceReturns {
            available = Dictionary(
                uniqueKeysWithValues: Destination.allCases.map { ($0, SpaceCheck.available(at: self.home.workFolder(for: $0))) })
        }
        let (conditions, policy) = self.policyInputs(readingSettings: ticks % 10 == 0)
        self.change { $0.conditionsChanged(conditions, policy: policy) + $0.tick(now: Date(), available: available) }
        // The machine's cap, shared by every transfer of this process (and, in the agent, of the machine).
        RateBoard.shared.setCap(self.driven { $0.machine.policy.cap($0.machine.conditions) })
        RateBoard.shared.remeasure()
        self.moveSlowTransfers(now: Date())
        if self.installer.keyring.isWaiting { self.askForPreloadKeys() }
        if ticks % 2 == 0 {
            self.save(includingProgress: true)
        } else {
            self.takeOverJoinedDeliveries()
            // While the agent's stream is connected, the downloads it runs are reported as it pushes them.
            if !self.driven({ $0.agent?.streaming ?? false }) { self.watchOthers() }
        }
        self.handOverToAgent()
    }

    /// What the machine's policy is decided from now: the time of day, the quiet holds (``QuietHolds/current(in:)``) and
    /// the network; with `readingSettings`, the policy of the machine's settings too (``MachineSettings``, the window and
    /// the rate caps), or nil to keep the one in force. A settings file that cannot be read is logged and changes nothing.
    func policyInputs(readingSettings: Bool) -> (MachinePolicy.Conditions, MachinePolicy?) {
        let conditions = MachinePolicy.Conditions(
            secondOfDay: MachineClock.secondOfDay(Date()), holds: QuietHolds.current(),
            metered: self.configuration.networkPolicy.isMetered)
        guard readingSettings else { return (conditions, nil) }
        do {
            var policy = MachinePolicy(settings: try MachineSettings.load(), concurrency: self.configuration.concurrency)
            policy.meteredLimit = self.configuration.meteredLimit
            return (conditions, policy)
        } catch {
            self.logger.warning("could not read the machine's settings; keeping those in force", metadata: ["error": "\(error.message)"])
            return (conditions, nil)
        }
    }

    /// Takes over the downloads of deliveries this queue joined (``AddPlan/joined(_:destination:force:open:)``) whose
    /// process is gone, so that a joined purchase does not wait forever on a dead process.
    func takeOverJoinedDeliveries() {
        let joined = self.driven { $0.joinedElsewhere }
        guard !joined.isEmpty, let records = try? self.store.downloadRecords(transactionIDs: joined.sorted()) else { return }
        // Left running (or marked interrupted by another queue that took it over and closed): taken, and resumed, as
        // the purchase this queue joined waits for it.
        let orphans = records.filter { record in
            joined.contains(record.transactionID) && !(record.owner?.isAlive ?? false)
                && (record.state.isRunning || record.phase != nil || record.pauseReason == .interrupted
                    || record.pauseReason == .awaitingRelease)
        }
        if !orphans.isEmpty, let taken = try? self.take(orphans.map(\.id)) { self.resumeInterrupted(taken) }
        // Joined until this queue runs them, or they settled.
        let elsewhere = Set(records.filter { !$0.state.isSettled && $0.owner?.queue != self.owner.queue }.map(\.transactionID))
        self.driven { $0.joinedElsewhere.formIntersection(elsewhere) }
    }

    /// Reports the downloads other processes run to this queue's observers and event streams, as their owners save
    /// them (progress about once a second): each change is a `downloadUpdated` event, and a download that settles
    /// reports its transaction too. Read once a second, and only while someone listens; the first read reports them
    /// all.
    func watchOthers() {
        guard self.registry.withLock({ !$0.continuations.isEmpty || !$0.observers.isEmpty }) else {
            self.driven { $0.others = nil }
            return
        }
        guard var read = try? self.store.openDownloads(ownedByOtherThan: self.owner).map(\.download) else { return }
        // A download last seen running whose transaction was finished since (its process finishes it right after the
        // download): read on its own, so that its end is reported too.
        let seen = Set(read.map(\.id))
        let gone = self.driven { state in (state.others ?? [:]).values.filter { !$0.state.isSettled && !seen.contains($0.id) }.map(\.id) }
        read += gone.compactMap { try? self.store.downloadRecord($0)?.download }
        let (changed, settled) = self.driven { state -> ([Download], Set<String>) in
            let known = state.others ?? [:]
            var now: [String: Download] = [:]
            var changed: [Download] = []
            var settled = Set<String>()
            for download in read where state.machine.entries[download.id] == nil {
                now[download.id] = download
                guard known[download.id] != download else { continue }
                changed.append(download)
                if download.state.isSettled, known[download.id].map({ !$0.state.isSettled }) ?? false {
                    settled.insert(download.transactionID)
                }
            }
            state.others = now
            return (changed, settled)
        }
        for download in changed { self.emit(.downloadUpdated(download)) }
        for transactionID in settled.sorted() { self.emitTransaction(transactionID) }
    }
}
