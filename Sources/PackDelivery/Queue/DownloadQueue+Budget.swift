import Foundation

// Leases, use, the cache budget and evictions (issue 31).
//
// An eviction is one mechanism wherever it is decided (before a cached install would exceed the budget, when the disk
// is too full for a download, `packs gc`): under the store's write lock, the pack's folder is renamed to
// `Caches/.packdelivery/trash/<uuid>.<contentIdentifier>` (a rename into a folder made at launch: no new block is
// needed, so it works on a full disk), both folders are synced, and the eviction is recorded (the install's rows
// replaced by an `evictions` row) in the same durable transaction; then the trash is deleted. A crash or power cut
// after the rename and before the commit leaves the folder in the trash with the install still recorded: the next
// queue to open the home records the eviction (it rolls forward, since the folder is already out of place and the
// pack unusable) and deletes the trash. So each pack is either installed, in place and verifying, or evicted and
// recorded as such.
extension DownloadQueue {
    static let cacheBudgetKey = "cacheBudget"

    var trashFolder: URL { self.home.workFolder(for: .caches).appending(path: "trash") }

    // MARK: Budget

    /// The home's cache budget (`packs config cache-budget`), kept in its store; nil when it has none.
    ///
    /// - Returns: the budget in bytes, or nil.
    /// - Throws: a database error when the store cannot be read.
    public func homeCacheBudget() throws(PackDeliveryError) -> Int64? {
        try self.requireOpen()
        return try self.store.setting(Self.cacheBudgetKey).flatMap { Int64($0) }
    }

    /// Sets or removes the home's cache budget, used by every queue on the home whose ``Configuration/cacheBudget`` is nil.
    ///
    /// - Parameter bytes: the most bytes of installed content the caches may hold; nil for no budget.
    /// - Throws: `invalidArgument` for a negative budget; a database error when the store cannot be written.
    public func setCacheBudget(_ bytes: Int64?) throws(PackDeliveryError) {
        try self.requireOpen()
        if let bytes, bytes < 0 {
            throw PackDeliveryError(.invalidArgument, message: "A cache budget cannot be negative (\(bytes) bytes).")
        }
        try self.store.setSetting(Self.cacheBudgetKey, bytes.map(String.init))
        self.homeBudget.withLock { $0 = (bytes, ContinuousClock.now) }
    }

    /// The budget in force: the configuration's, else the home's. Asked before each admission: the home's is read from
    /// the store at most once a second (a read costs what a small install's bookkeeping does; another process's
    /// `setCacheBudget` counts within a second, this queue's at once).
    var effectiveCacheBudget: Int64? {
        if let budget = self.configuration.cacheBudget { return budget }
        let now = ContinuousClock.now
        if let cached = self.homeBudget.withLock({ $0 }), now - cached.read < .seconds(1) { return cached.value }
        let value = (try? self.store.setting(Self.cacheBudgetKey)).flatMap { $0.flatMap { Int64($0) } }
        self.homeBudget.withLock { $0 = (value, now) }
        return value
    }

    /// Bytes of installed content in the caches (the files' sizes as recorded at install).
    ///
    /// - Returns: the sum over every cached pack.
    /// - Throws: a database error when the store cannot be read.
    public func cachedBytes() throws(PackDeliveryError) -> Int64 {
        try self.requireOpen()
        return try self.store.installedBytes(.caches)
    }

    /// Sets packs' preservation priority (as the manifest's `preservationPriority` does): when cached packs are
    /// evicted, the lowest goes first, then the least recently used.
    ///
    /// - Parameters:
    ///   - priority: the priority; nil goes back to 0.
    ///   - contentIdentifiers: the packs.
    /// - Throws: a database error when the store cannot be written.
    public func setPreservationPriority(_ priority: Int?, forContentIdentifiers contentIdentifiers: [String]) throws(PackDeliveryError) {
        try self.requireOpen()
        try self.store.setPreservationPriorities(Dictionary(contentIdentifiers.map { ($0, priority) }, uniquingKeysWith: { a, _ in a }))
    }

    // MARK: Leases

    /// Marks content in use (NSBundleResourceRequest's `beginAccessingResources`): until ``endAccessing(_:)``, or
    /// until this process exits, its packs are never evicted, by this process or another on the same home. Their
    /// use is recorded.
    ///
    /// A lease may name content that is not installed, or was evicted: it protects it once installed.
    /// - Parameters:
    ///   - productIdentifiers: products, every pack of each.
    ///   - contentIdentifiers: packs, by content identifier.
    /// - Returns: the lease, to end with ``endAccessing(_:)``.
    /// - Throws: `invalidArgument` when nothing is named; a database error when the store cannot be written.
    public func beginAccessing(productIDs productIdentifiers: [String] = [], contentIdentifiers: [String] = []) throws(PackDeliveryError)
        -> ContentLease
    {
        try self.requireOpen()
        guard !productIdentifiers.isEmpty || !contentIdentifiers.isEmpty else {
            throw PackDeliveryError(.invalidArgument, message: "A lease must name at least one product or pack.")
        }
        let token = Self.newID("l")
        let now = Date()
        let pid = getpid()
        let start = QueueOwner.currentStart
        let rows =
            productIdentifiers.map {
                LeaseRecord(token: token, productIdentifier: $0, contentIdentifier: nil, ownerPID: pid, ownerStart: start, createdAt: now)
            }
            + contentIdentifiers.map {
                LeaseRecord(token: token, productIdentifier: "", contentIdentifier: $0, ownerPID: pid, ownerStart: start, createdAt: now)
            }
        try self.store.addLease(rows)
        return ContentLease(token: token, productIdentifiers: productIdentifiers, contentIdentifiers: contentIdentifiers)
    }

    /// Ends a lease: its content may be evicted again, and counts as used now.
    ///
    /// - Parameter lease: a lease from ``beginAccessing(productIDs:contentIdentifiers:)``.
    /// - Returns: false when it was not held (ended already, or its process is gone).
    /// - Throws: a database error when the store cannot be written.
    @discardableResult
    public func endAccessing(_ lease: ContentLease) throws(PackDeliveryError) -> Bool {
        try self.requireOpen()
        return try self.store.endLease(lease.token)
    }

    /// Leases held by live processes on this home.
    ///
    /// - Returns: one per lease.
    /// - Throws: a database error when the store cannot be read.
    public func leases() throws(PackDeliveryError) -> [ContentLease] {
        try self.requireOpen()
        let rows = try self.store.liveLeases()
        return Dictionary(grouping: rows, by: \.token).map { token, rows in
            ContentLease(
                token: token, productIdentifiers: rows.filter { $0.contentIdentifier == nil }.map(\.productIdentifier),
                contentIdentifiers: rows.compactMap(\.contentIdentifier))
        }.sorted { $0.token < $1.token }
    }

    // MARK: Evictions

    /// Evicted packs (known, not installed), by product.
    ///
    /// - Parameter productIdentifier: a product, or nil for all.
    /// - Returns: one entry per evicted pack.
    /// - Throws: a database error when the store cannot be read.
    public func evictedContent(forProductID productIdentifier: String? = nil) throws(PackDeliveryError) -> [EvictedContent] {
        try self.requireOpen()
        return try self.store.evictions(productIdentifier: productIdentifier).map(\.content)
    }

    /// Evicts cached packs until the caches hold at most `bytes`: not leased ones, lowest preservation priority
    /// first, then least recently used. Documents, packs of unfinished transactions and leased packs are never evicted.
    ///
    /// - Parameters:
    ///   - bytes: the size to get down to (0: everything that may go).
    ///   - dryRun: list what would go, and evict nothing.
    /// - Returns: the packs evicted (or that would be), in order; an `evicted` event is sent for each evicted.
    /// - Throws: a database or file error; the packs evicted before it stay evicted.
    @discardableResult
    public func evictCaches(downTo bytes: Int64, dryRun: Bool = false) throws(PackDeliveryError) -> [EvictedContent] {
        try self.requireOpen()
        var used = try self.store.installedBytes(.caches)
        var result: [EvictedContent] = []
        for candidate in try self.store.evictionCandidates(protecting: []) {
            guard used > bytes else { break }
            if dryRun {
                let install = candidate.install
                result.append(
                    EvictedContent(
                        productIdentifier: install.productIdentifier, contentIdentifier: install.contentIdentifier,
                        contentVersion: install.contentVersion, destination: install.destination, byteCount: max(0, install.byteCount),
                        evictedAt: Date()))
                used -= max(0, install.byteCount)
            } else if let evicted = try self.evict(candidate.install) {
                result.append(evicted)
                used -= evicted.byteCount
            }
        }
        return result
    }

    /// Evicts one cached pack (see the top of this file).
    /// - Returns: the eviction, or nil when the pack changed or was leased meanwhile.
    func evict(_ install: InstallRecord) throws(PackDeliveryError) -> EvictedContent? {
        // Made at launch (finishEvictions); made here only when something removed it since.
        if access(self.trashFolder.path, F_OK) != 0 { try Home.makeDirectories(self.trashFolder) }
        let folder = URL(filePath: install.contentURL)
        let target = self.trashFolder.appending(path: "\(UUID().uuidString).\(install.contentIdentifier)")
        let hook = self.configuration.installHook
        let record = try self.store.evict(install, at: Date()) {
            if rename(folder.path, target.path) != 0 {
                // A folder already missing is evicted all the same.
                guard errno == ENOENT else {
                    throw PackDeliveryError.io("move the evicted pack out of place", path: folder.path, errno: errno)
                }
            } else {
                do {
                    try Durability.syncFolder(folder.deletingLastPathComponent())
                    try Durability.syncFolder(self.trashFolder)
                } catch {
                    rename(target.path, folder.path)
                    throw error
                }
            }
            hook?(.evictionMoved)
        } undo: {
            rename(target.path, folder.path)
        }
        // Off the critical path: the eviction is recorded. Deleted before returning, as the space is what was asked for.
        try? Installer.removeTree(target)
        guard let record else { return nil }
        self.logger.info(
            "evicted a cached pack",
            metadata: [
                "content": "\(PackDeliveryError.printable(record.contentIdentifier))",
                "product": "\(PackDeliveryError.printable(record.productIdentifier))", "bytes": "\(record.byteCount)",
            ])
        self.emit(.evicted(record.content))
        return record.content
    }

    /// At launch: a folder left in the trash by an eviction a crash interrupted. Its install still recorded and its
    /// folder not back in place, the eviction is recorded (rolled forward); then the trash is deleted.
    func finishEvictions() {
        try? Home.makeDirectories(self.trashFolder)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: self.trashFolder.path)) ?? [] {
            // <uuid>.<contentIdentifier>: a UUID has no dot.
            guard let dot = name.firstIndex(of: ".") else { continue }
            do {
                let contentIdentifier = String(name[name.index(after: dot)...])
                if let record = try self.store.recordEviction(destination: .caches, contentIdentifier: contentIdentifier, at: Date()) {
                    self.logger.info(
                        "recorded an eviction a crash interrupted",
                        metadata: ["content": "\(PackDeliveryError.printable(record.contentIdentifier))"])
                }
            } catch {
                // The store cannot be written (or another process holds an eviction open): leave it for later.
                continue
            }
            try? Installer.removeTree(self.trashFolder.appending(path: name))
        }
    }

    /// Before a download starts: evicts cached packs when its install would take the caches over the budget, or when
    /// the disk holding `folder` has less than `needed` bytes free (and the caches are on it).
    /// - Returns: the bytes available afterwards.
    func makeRoom(for download: Download, needed: Int64, available: Int64?, folder: URL) -> Int64? {
        var excess: Int64 = 0
        if download.destination == .caches, let budget = self.effectiveCacheBudget {
            let used = (try? self.store.installedBytes(.caches, excluding: download.contentIdentifier)) ?? 0
            excess = used &+ max(0, download.unpackedLength ?? download.contentLength) &- budget
        }
        let short = available.map { needed > $0 } ?? false && Self.sameDevice(self.home.cachesFolder, folder)
        guard excess > 0 || short else { return available }
        guard let candidates = try? self.store.evictionCandidates(protecting: [download.contentIdentifier]) else { return available }
        var freed: Int64 = 0
        var free = available
        for candidate in candidates {
            let stillShort = short && (free.map { needed > $0 } ?? false)
            guard freed < excess || stillShort else { break }
            guard let evicted = try? self.evict(candidate.install) else { continue }
            freed += evicted.byteCount
            if short { free = SpaceCheck.available(at: folder) }
        }
        return short ? SpaceCheck.available(at: folder) : available
    }

    static func sameDevice(_ a: URL, _ b: URL) -> Bool {
        var first = stat()
        var second = stat()
        guard stat(a.path, &first) == 0, stat(b.path, &second) == 0 else { return false }
        return first.st_dev == second.st_dev
    }

    /// Records a use of a product's content (its packs, or only `contentIdentifiers`): the order of evictions.
    ///
    /// - Parameters:
    ///   - productIdentifier: the product.
    ///   - contentIdentifiers: only these packs; nil for all of the product's.
    /// - Throws: a database error when the store cannot be written.
    public func recordUse(productID productIdentifier: String, contentIdentifiers: [String]? = nil) throws(PackDeliveryError) {
        try self.requireOpen()
        try self.store.recordUse(productIdentifier: productIdentifier, contentIdentifiers: contentIdentifiers)
    }
}
