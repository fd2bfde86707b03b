import Foundation

// Asking for content: ensureAvailable returns installed packs at once, and fetches the others first.
extension DownloadQueue {
    /// Makes packs available: returns once each is installed, fetching those that are not.
    ///
    /// An installed pack costs one indexed query and no request. A pack that is not installed is fetched by its
    /// download: an on-demand pack recorded by a purchase (``DeliveryPolicy/onDemand``), a prefetch pack on its way,
    /// a paused or failed download; it is raised to `priority` (never lowered) and resumed. A pack that was evicted
    /// (``evictedContent(forProductID:)``) is fetched again on its own, as On-Demand Resources does for purged tags:
    /// through a restore transaction made from the download that installed it (its URLs, SHA-256 and index) and its
    /// transaction's manifest URL and receipt, unless `manifest` lists it. A pack no download was
    /// recorded for is bought from `manifest`: its product is added as a purchase (its essential and prefetch packs
    /// start as a purchase's do), then the pack is fetched. Progress is reported like any download's (events,
    /// observers), with a ``DownloadQueueEvent/priorityChanged(_:)`` when the priority was raised.
    ///
    /// The wait goes through pauses (a full disk, a pause by the user) until the download is resumed; a download that
    /// fails or is cancelled ends it with that error. Cancelling the awaiting task pauses (``PauseReason/user``,
    /// bytes kept) the downloads this call resumed or raised, and throws `cancelled`.
    ///
    /// ```swift
    /// let folders = try await queue.ensureAvailable(contentIDs: ["com.example.forest.music"])
    /// ```
    /// - Parameters:
    ///   - contentIDs: the packs' content identifiers.
    ///   - manifest: where to buy a pack no download was recorded for; nil: such a pack throws `notInstalled`.
    ///   - priority: how soon its download starts; ``DownloadPriority/userInitiated`` (ahead of everything) by default.
    /// - Returns: the installed folders (``Download/contentURL``), in the order of `contentIDs`.
    /// - Throws: `notInstalled` for a pack that is neither installed, evicted nor recorded (and not in `manifest`); the
    ///   download's error when it fails; `cancelled` when it is cancelled or the awaiting task is; `queueClosed`.
    public func ensureAvailable(
        contentIDs: [String], from manifest: LoadedManifest? = nil, priority: DownloadPriority = .userInitiated
    ) async throws(PackDeliveryError) -> [URL] {
        try self.requireOpen()
        // Installed: one indexed query a pack, no request, no driver.
        let installed = try self.store.installedFolders(contentIdentifiers: contentIDs)
            .filter { FileManager.default.fileExists(atPath: $0.value) }
        var folders: [String: URL] = installed.mapValues { URL(filePath: $0) }
        let missing = contentIDs.filter { folders[$0] == nil }
        if !missing.isEmpty {
            let asked = try await Blocking.run { () throws(PackDeliveryError) in
                try self.onDriver { () throws(PackDeliveryError) in try self.ask(for: missing, from: manifest, priority: priority) }
            }
            for (identifier, url) in try await self.installed(asked) { folders[identifier] = url }
        }
        // Every pack asked for is in place here: the one point where content is handed out, a use.
        self.noteUse(contentIDs: contentIDs)
        return contentIDs.compactMap { folders[$0] }
    }

    /// Starts what ``ensureAvailable(contentIDs:from:priority:)`` waits for, without waiting: the packs that are not
    /// installed are asked for (raised to `priority`, resumed, or bought from `manifest`), as it does.
    ///
    /// For a host that shows the downloads itself (or, like `packs use`, follows them as a fetch does).
    /// - Parameters:
    ///   - contentIDs: the packs' content identifiers.
    ///   - manifest: where to buy a pack no download was recorded for.
    ///   - priority: how soon the downloads start.
    /// - Returns: the downloads that deliver the packs not installed, as they are now; empty when all are installed.
    /// - Throws: as ``ensureAvailable(contentIDs:from:priority:)``, before anything is waited for.
    public func fetchIfNeeded(
        contentIDs: [String], from manifest: LoadedManifest? = nil, priority: DownloadPriority = .userInitiated
    ) throws(PackDeliveryError) -> [Download] {
        try self.requireOpen()
        let installed = try self.store.installedFolders(contentIdentifiers: contentIDs)
            .filter { FileManager.default.fileExists(atPath: $0.value) }
        let missing = contentIDs.filter { installed[$0] == nil }
        guard !missing.isEmpty else { return [] }
        return try self.onDriver { () throws(PackDeliveryError) -> [Download] in
            let asked = try self.ask(for: missing, from: manifest, priority: priority)
            var downloads: [Download] = []
            for id in Set(asked.downloads.values).sorted() {
                if let live = self.driven({ $0.machine.download(id) }) {
                    downloads.append(live)
                } else if let stored = try self.store.downloadRecord(id)?.download {
                    downloads.append(stored)
                }
            }
            return downloads
        }
    }

    /// Downloads as they are now, of open or finished transactions (a prefetch pack goes on after its transaction
    /// finished).
    ///
    /// - Parameter ids: download ids; unknown ones are left out.
    /// - Returns: the downloads found, in the order of `ids`.
    /// - Throws: a database error; `queueClosed` after ``close()-9kmx4``.
    public func downloads(_ ids: [String]) throws(PackDeliveryError) -> [Download] {
        try self.requireOpen()
        return try self.current(ids)
    }

    /// Each download of `ids` as the queue holds it, or as recorded when it is no longer queued; unknown ones left out.
    private func current(_ ids: some Sequence<String>) throws(PackDeliveryError) -> [Download] {
        var downloads: [Download] = []
        for id in ids {
            if let live = self.driven({ $0.machine.download(id) }) {
                downloads.append(live)
            } else if let stored = try self.store.downloadRecord(id)?.download {
                downloads.append(stored)
            }
        }
        return downloads
    }

    /// The content identifiers of products' packs: those `manifest` lists for each, or, without it, those recorded.
    ///
    /// - Parameters:
    ///   - productIDs: the products.
    ///   - manifest: lists the products' packs, when given.
    /// - Returns: the packs' content identifiers, product by product.
    /// - Throws: `unknownProduct` for a product with no pack recorded (and not in `manifest`).
    public func contentIdentifiers(productIDs: [String], from manifest: LoadedManifest? = nil) throws(PackDeliveryError) -> [String] {
        try self.requireOpen()
        var contentIDs: [String] = []
        for productID in productIDs {
            var packs = manifest?.manifest.product(productID)?.contents.map(\.contentIdentifier) ?? []
            if packs.isEmpty { packs = try self.store.contentIdentifiers(productIdentifier: productID) }
            guard !packs.isEmpty else {
                throw PackDeliveryError(
                    .unknownProduct,
                    message: "No pack of '\(PackDeliveryError.printable(productID))' is recorded or listed by a manifest.",
                    hint: "Pass the manifest that lists it.", subject: productID)
            }
            contentIDs += packs
        }
        return contentIDs
    }

    /// ``ensureAvailable(contentIDs:from:priority:)`` for every pack of products: those `manifest` lists for each,
    /// or, without it, those recorded for each (its downloads and installs).
    ///
    /// - Parameters:
    ///   - productIDs: the products.
    ///   - manifest: the products' packs, and where to buy them when no download was recorded.
    ///   - priority: how soon the downloads start; ``DownloadPriority/userInitiated`` by default.
    /// - Returns: the installed folders of every pack, product by product, in the manifest's (or the record's) order.
    /// - Throws: `unknownProduct` for a product with no pack recorded (and not in `manifest`); as
    ///   ``ensureAvailable(contentIDs:from:priority:)`` otherwise.
    public func ensureAvailable(
        productIDs: [String], from manifest: LoadedManifest? = nil, priority: DownloadPriority = .userInitiated
    ) async throws(PackDeliveryError) -> [URL] {
        let contentIDs = try self.contentIdentifiers(productIDs: productIDs, from: manifest)
        return try await self.ensureAvailable(contentIDs: contentIDs, from: manifest, priority: priority)
    }

    /// On the driver: the downloads that deliver `contentIDs`, raised to `priority` and resumed; a pack no download
    /// was recorded for is bought from the manifest first.
    /// - Returns: the download id of each pack, and those this call resumed or raised (paused if the caller gives up).
    private func ask(
        for contentIDs: [String], from manifest: LoadedManifest?, priority: DownloadPriority
    ) throws(PackDeliveryError) -> Asked {
        var asked = Asked()
        // Evicted packs with no open download (and not in `manifest`) are fetched again on their own, from what their
        // eviction kept.
        let listed = Set(manifest?.manifest.products.flatMap { $0.contents.map(\.contentIdentifier) } ?? [])
        var open: [String: DownloadRecord] = [:]
        for identifier in contentIDs { open[identifier] = try self.store.openDownload(contentIdentifier: identifier) }
        let again = try self.refetchEvicted(contentIDs.filter { open[$0] == nil && !listed.contains($0) })
        for identifier in contentIDs {
            var record = open[identifier] ?? again[identifier]
            if record == nil, let manifest,
                let product = manifest.manifest.products.first(where: { $0.contents.contains { $0.contentIdentifier == identifier } })
            {
                let transaction = try self.add(product: product.productIdentifier, from: manifest, autoFinish: true)
                if let download = transaction.downloads.first(where: { $0.contentIdentifier == identifier }) {
                    if download.state == .finished, let url = download.contentURL {
                        asked.installed[identifier] = url
                        continue
                    }
                    record = try self.store.downloadRecord(download.id)
                }
            }
            guard let record else {
                throw PackDeliveryError(
                    .notInstalled,
                    message: "The pack '\(PackDeliveryError.printable(identifier))' is not installed, and no download of it is recorded.",
                    hint: "Pass the manifest that lists it, so it can be fetched.", subject: identifier)
            }
            let id = record.id
            asked.downloads[identifier] = id
            if self.driven({ $0.machine.machine(id) == nil }), try self.take([id]).isEmpty {
                // Another live process runs it: ask that process (it acts within a second), and follow it.
                if record.state == .paused || record.state == .failed {
                    try self.store.setRequest(.resume, for: id)
                } else if priority < (record.priority ?? .essential) {
                    try self.store.setRequest(.priority(priority), for: id)
                }
                continue
            }
            guard let download = self.driven({ $0.machine.download(id) }) else { continue }
            // One change: its reports come after both, so none shows the download still paused once it was asked for.
            self.change { queue in
                (priority < download.priority ? queue.handle(id, .setPriority(priority)) : [])
                    + (download.state.isRunning ? [] : queue.handle(id, .resume))
            }
            asked.resumed.append(id)
        }
        self.save(includingProgress: false)
        return asked
    }

    /// What ``ask(for:from:priority:)`` found and started.
    struct Asked: Sendable {
        /// The download delivering each pack, by content identifier.
        var downloads: [String: String] = [:]
        /// Packs found installed on the way (a purchase whose pack was installed meanwhile).
        var installed: [String: URL] = [:]
        /// Downloads this call resumed or raised.
        var resumed: [String] = []
    }

    /// Follows the downloads until each is finished; pauses those the call resumed if the task is cancelled.
    private func installed(_ asked: Asked) async throws(PackDeliveryError) -> [String: URL] {
        var folders = asked.installed
        guard !asked.downloads.isEmpty else { return folders }
        let ids = Set(asked.downloads.values)
        let read = { @Sendable () throws(PackDeliveryError) -> [Download] in try self.current(ids) }
        let steps = try await Blocking.run { () throws(PackDeliveryError) in
            self.waitSteps(
                self.events { event in
                    if case .downloadUpdated(let download) = event { return ids.contains(download.id) }
                    return false
                })
        }
        var current: [String: Download] = [:]
        for download in try await Blocking.run(read) { current[download.id] = download }
        func done() throws(PackDeliveryError) -> Bool {
            for id in ids {
                guard let download = current[id] else { return false }
                switch download.state {
                case .finished: continue
                case .failed:
                    throw download.error
                        ?? PackDeliveryError(.internalError, message: "The download \(id) failed without an error.", subject: id)
                case .cancelled:
                    throw PackDeliveryError(
                        .cancelled,
                        message: "The download \(id) (\(PackDeliveryError.printable(download.contentIdentifier))) was cancelled.",
                        subject: id)
                case .waiting, .active, .paused: return false
                }
            }
            return true
        }
        let resumed = asked.resumed
        let outcome: Result<Bool, PackDeliveryError> = await withTaskCancellationHandler {
            do throws(PackDeliveryError) {
                if try done() { return .success(true) }
                for await step in steps {
                    switch step {
                    case .event(.downloadUpdated(let download)): current[download.id] = download
                    case .event: break
                    case .poll: if let fresh = try? await Blocking.run(read) { for download in fresh { current[download.id] = download } }
                    }
                    if try done() { return .success(true) }
                }
                return .success(false)
            } catch {
                return .failure(error)
            }
        } onCancel: {
            // The caller gave up: what it started stops, its bytes kept (resume or ask again to go on).
            try? self.pause(resumed)
        }
        guard try outcome.get() else {
            throw Task.isCancelled
                ? PackDeliveryError(.cancelled, message: "The wait was cancelled; the downloads it started are paused, their bytes kept.")
                : PackDeliveryError(
                    .queueClosed, message: "The download queue was closed while waiting.",
                    hint: "Open a new DownloadQueue on the same home.")
        }
        for (identifier, id) in asked.downloads { folders[identifier] = current[id]?.contentURL }
        return folders
    }
}
