import Foundation
import GRDB
import Logging
import Synchronization

/// The download half of `SKPaymentQueue`: takes purchased or restored transactions with their
/// downloads, runs them, reports every change, and lets a transaction finish only once its content is in place.
///
/// State lives in SQLite under the ``Home``, so a new queue on the same home picks up where an
/// earlier process stopped. Safe to use from any thread or task.
///
/// The queue's decisions live in value types (`QueueMachine` for scheduling and space, one
/// `DownloadMachine` per download); this class and its extensions only run what they decide:
/// `DownloadQueue+Driver` (actions, transfers, installs, saving), `DownloadQueue+Launch` (taking over
/// downloads at launch, checking recent installs, verify and repair) and `DownloadQueue+Delivery`
/// (observers and event streams).
public final class DownloadQueue: Sendable {
    /// How the queue runs.
    public struct Configuration: Sendable {
        /// Downloads transferring or unpacking at once; the rest wait in order.
        public var concurrency: Int
        /// Rate limit, timeouts, extra headers and TLS verification for every transfer.
        public var transfer: TransferOptions
        /// Whether downloads that were running when an earlier process died start again on their own when the queue opens.
        public var resumeInterruptedDownloads: Bool
        /// Whether downloads paused for lack of space resume on their own once enough is free (checked every few seconds).
        public var resumeWhenSpaceReturns: Bool
        /// Largest unpacked size, as a multiple of the pack's size, when the manifest gives no `unpackedLength`.
        public var maxExpansionRatio: Int64
        /// Largest number of entries in one pack.
        public var maxEntries: Int
        /// Failed attempts in a row (without new bytes kept) before a download fails.
        public var maxAttempts: Int
        /// Largest delay between retries, in seconds.
        public var maxRetryDelay: TimeInterval
        /// An active download whose bytes and phase progress do not move for this long (seconds) is stopped
        /// and tried again, then failed with `stalled`. Nil: the transfer's stall timeout plus 15 seconds.
        public var watchdogTimeout: TimeInterval?
        /// How long to wait for another process's lock on the state database before failing with `databaseBusy`.
        public var databaseBusyTimeout: TimeInterval
        /// At launch, installs recorded in this many seconds before the newest one are checked (presence and
        /// sizes) and delivered again when damaged; 0 turns the check off.
        public var launchCheckWindow: TimeInterval
        /// Writes every byte of downloads and unpacked content (replace it to inject disk-full faults in tests).
        public var writer: any FileWriting
        /// Gives the headers that authorize each pack request (a token that expires); with one, a refused request
        /// (401, 403) is tried once more with fresh credentials before the download pauses (`unauthorized`).
        public var credentials: CredentialProvider? = nil
        /// Unpack packs while they download, into a staging folder that is moved into place only once the whole
        /// pack's SHA-256 matched; false unpacks after the download, from the archive. A zip is read by its local
        /// headers as it arrives; once it is verified, its central directory (which comes last) decides the files'
        /// types and modes, and a zip whose local headers are not the central directory's entries is unpacked
        /// again from the archive.
        public var streamingUnpack = true
        /// Update an installed pack to a new version by fetching only its changed entries, when the manifest
        /// indexes the pack (see ``PackIndex``): ``Download/delta`` says what is fetched and reused, and
        /// ``Download/deltaFallback`` why the whole pack was fetched instead, when it was. The same mechanism makes the
        /// first install of an indexed tar or tar.zst pack of 16 MiB or more write each byte once: its chunks are
        /// fetched with range requests, checked and written straight into the new version's files, and no archive is
        /// kept. false fetches and keeps whole packs.
        public var deltaUpdates = true
        /// Folders on this machine that may hold chunks of the packs (casync's `--seed`): an installed tree of an earlier
        /// or the same version copied to a disk, a share or a backup. Each chunk of an indexed tar or tar.zst pack (see
        /// ``deltaUpdates``) found in their files, and verified against the SHA-256 the pack's index gives it, is copied
        /// from there instead of fetched, in updates and first installs alike; a file changed since is caught chunk by
        /// chunk, and its changed chunks are fetched. A folder that cannot be read (gone, a failing disk) is dropped,
        /// ``onSeedDropped`` is told, and its chunks are fetched. The agent does not read seeds: a queue with seeds
        /// should set ``agent`` to ``AgentUse/never`` (`packs fetch --seed` does).
        public var seeds: [URL] = []
        /// Told of each seed folder dropped because it could not be read, with the error (`fileSystem`, naming the
        /// folder); the install goes on, fetching its chunks. Called on a worker.
        public var onSeedDropped: (@Sendable (URL, PackDeliveryError) -> Void)? = nil
        /// The most bytes of installed content the caches may hold; nil uses the home's setting
        /// (``setCacheBudget(_:)``), and none there means no budget. Before a pack is installed into the caches,
        /// and when the disk is too full for a download, cached packs are evicted (see ``evictCaches(downTo:dryRun:)``).
        public var cacheBudget: Int64? = nil
        /// Whether the connection is metered: on a metered one, packs larger than ``meteredLimit`` that are not the
        /// user's explicit action (a restore's, prefetch and background packs) wait for an unmetered one
        /// (``PauseReason/waitingForUnmeteredNetwork``), their bytes kept, unless ``DownloadQueue/allowMetered(_:)``.
        /// NetworkManager's answer by default; ``FixedNetworkPolicy`` or a host's own.
        public var networkPolicy: any NetworkPolicy = NetworkManagerPolicy.system
        /// On a metered connection, the largest pack (bytes) that downloads without being the user's explicit action:
        /// 50 MiB by default.
        public var meteredLimit: Int64 = QueueMachine.defaultMeteredLimit
        /// Whether downloads run in the machine's agent (`packs agent`), which goes on when this process exits, or in
        /// this process: ``AgentUse/automatic`` by default (the agent when its socket answers, else this process, as
        /// before). A queue with a ``credentials`` provider or request headers of its own (``TransferOptions/headers``) runs its
        /// downloads itself, as the agent has neither (a receipt is stored with the transaction, and the agent sends it).
        public var agent: AgentUse = .automatic
        /// The agent's socket; nil for `$XDG_RUNTIME_DIR/packs/agent.sock` (no agent when `XDG_RUNTIME_DIR` is unset).
        public var agentSocket: String? = nil
        /// Admit by one order with the other queues of this process that share it, within the machine's slots
        /// (``AdmissionBoard``): the agent's queues, one per home.
        @_spi(Agent) public var sharesAdmission = false
        /// Called at steps of every install; test-only pause points for the power-cut tests.
        @_spi(Testing) public var installHook: (@Sendable (InstallStep) -> Void)?
        /// The smallest window (``ChunkPlan/window(packLength:)``, 4 MiB for a pack of 256 MiB or more) from which a first
        /// install's consecutive windows share one range request; test-only, so that a small pack takes that path too.
        @_spi(Testing) public var joinedWindow: Int64 = DeltaTransfer.joinedWindow
        /// The wall clock preload release dates (``Download/releaseDate``) are compared with; test-only, so that a test
        /// moves a queue's time past a release. Backoff between key requests runs on the real clock.
        @_spi(Testing) public var clock: @Sendable () -> Date = { Date() }

        /// A configuration; every parameter has the default a long-running host wants.
        public init(
            concurrency: Int = 4, transfer: TransferOptions = TransferOptions(), resumeInterruptedDownloads: Bool = true,
            resumeWhenSpaceReturns: Bool = true, maxExpansionRatio: Int64 = 100, maxEntries: Int = 100_000,
            maxAttempts: Int = 6, maxRetryDelay: TimeInterval = 30, watchdogTimeout: TimeInterval? = nil,
            databaseBusyTimeout: TimeInterval = 15, launchCheckWindow: TimeInterval = 300,
            writer: any FileWriting = SystemFileWriter()
        ) {
            self.concurrency = max(1, concurrency)
            self.transfer = transfer
            self.resumeInterruptedDownloads = resumeInterruptedDownloads
            self.resumeWhenSpaceReturns = resumeWhenSpaceReturns
            self.maxExpansionRatio = max(1, maxExpansionRatio)
            self.maxEntries = max(1, maxEntries)
            self.maxAttempts = max(1, maxAttempts)
            self.maxRetryDelay = maxRetryDelay
            self.watchdogTimeout = watchdogTimeout
            self.databaseBusyTimeout = databaseBusyTimeout
            self.launchCheckWindow = launchCheckWindow
            self.writer = writer
        }

        var retryPolicy: DownloadMachine.RetryPolicy {
            DownloadMachine.RetryPolicy(
                maxAttempts: self.maxAttempts, maxDelay: self.maxRetryDelay,
                watchdog: self.watchdogTimeout ?? self.transfer.stallTimeout + 15)
        }
    }

    /// What happened when the state database was found damaged at launch.
    public struct StoreRecovery: Sendable, Hashable {
        /// Where the damaged database was moved.
        public var damagedDatabase: URL
        /// Installed packs found in the destination folders and recorded again.
        public var installsRecovered: Int
        /// Install folders kept as they are but not recorded again (no product could be read from them).
        public var foldersNotRecognised: [URL]
        /// How many trusted publisher keys were read back (with the versions and scopes accepted from them) from
        /// `trust.json`, kept beside the database; nil when it could not be read: then this home refuses every manifest
        /// (`unreadableTrustedKey`) until the record standing for the lost trust is removed with ``untrust(id:)``.
        public var trustedPublishersRestored: Int? = nil
    }

    /// Where this queue keeps its state and content.
    public let home: Home
    /// How this queue runs.
    public let configuration: Configuration
    /// Set when the state database was damaged at launch and rebuilt from the installed content.
    public var storeRecovery: StoreRecovery? { self.recovery.withLock { $0 } }
    private let recovery = Mutex<StoreRecovery?>(nil)
    let store: Store
    let logger: Logger
    let installer: Installer
    let owner: QueueOwner
    /// Every state change runs here, one at a time and in order: the one serializer of ``DriverState``.
    let driver = DispatchQueue(label: "PackDelivery.DownloadQueue")
    /// Observers are called here, in order, so a slow observer never holds up the downloads.
    let delivery = DispatchQueue(label: "PackDelivery.DownloadQueue.delivery")
    /// Deletes leftovers (archives, old versions) off the critical path.
    let janitor = DispatchQueue(label: "PackDelivery.DownloadQueue.janitor", qos: .utility)
    /// What only the driver changes: the machines, the work running, restores, saving. Its one serializer is
    /// ``driver``; see ``driven(_:)``.
    let driverState: DriverStateBox
    /// Who is listening, and whether the queue is closed: registered from any thread, under this lock alone.
    let registry = Mutex(Registry())
    let engineBox = Mutex<TransferEngine?>(nil)
    let timer: Mutex<DispatchSourceTimer?>
    /// When ``noteUse(contentIDs:)`` last recorded a use of each pack, by content identifier: a client that asks
    /// for a folder on every frame writes the store once a minute, not every time.
    let recordedUses = Mutex<[String: ContinuousClock.Instant]>([:])
    /// The home's cache budget as last read from the store, and when (see ``effectiveCacheBudget``).
    /// This queue's key on the ``AdmissionBoard`` when it shares the machine's admission order.
    let admissionKey = Mutex<UInt64?>(nil)
    /// The agent's event stream, stopped when the queue closes or goes away.
    let agentFollower = Mutex<AgentEventFollower?>(nil)
    let homeBudget = Mutex<(value: Int64?, read: ContinuousClock.Instant)?>(nil)
    /// How long a recorded use stands for later ones: eviction orders packs by last use, to the minute.
    static let useRecordInterval: Duration = .seconds(60)
    static let driverKey = DispatchSpecificKey<Bool>()
    /// Set on ``delivery``: close() called from an observer's callback must not wait for that callback.
    static let deliveryKey = DispatchSpecificKey<Bool>()

    struct DriverState: Sendable {
        var machine: QueueMachine
        /// Restores in progress: their downloads still running, until each settles.
        var restores: [UUID: RestoreBatch] = [:]
        /// The work running for each download (its install, the unpack that follows its transfer, its delta).
        var work: [String: DownloadWork] = [:]
        var saveScheduled = false
        var ticks = 0
        /// Downloads of open transactions that other processes run (or none does), as last reported to this queue's
        /// listeners (``DownloadQueue/watchOthers()``); nil until they are first read.
        var others: [String: Download]?
        /// Transactions another process delivers that this queue joined: their downloads are taken over if it dies.
        var joinedElsewhere: Set<String> = []
        /// What the home measured of each source, read from the store when first needed, then kept up to date here.
        var ranking: SourceRanking?
        /// Where each running whole-pack transfer of a pack with several sources started: its origin, when, and the
        /// bytes kept then, to measure the source's throughput when it ends.
        var sourceStarts: [TransferID: (origin: String, at: Date, bytes: Int64)] = [:]
        /// The source picked for a download admitted and not yet started (it counts as in flight there until its
        /// transfer starts, see ``DeliveryFacts/preferredSource``), so that downloads starting together spread as picked.
        var sourcePicks: [String: URL] = [:]
        /// The machine's agent, when it serves this home (``AgentUse``).
        var agent: AgentSession?
        /// What the machine's admission order last heard of this queue (``AdmissionBoard``).
        var admissionReported: [Int] = []
    }

    /// Holds the ``DriverState``, which only code running on the driver queue touches.
    final class DriverStateBox: @unchecked Sendable {
        // @unchecked Sendable: `value` is read and written only inside `DownloadQueue.driven(_:)`, which runs its
        // body on the driver queue (directly when already on it, as checked by its queue-specific key, otherwise
        // through `driver.sync`). A serial queue runs one block at a time, so no two threads touch `value` at once.
        fileprivate var value: DriverState
        init(_ value: DriverState) { self.value = value }
    }

    struct Registry: Sendable {
        var observers: [ObjectIdentifier: WeakObserver] = [:]
        /// The relays of main-actor observers, by observer (each relay is itself an observer).
        var relays: [ObjectIdentifier: any DownloadQueueObserver] = [:]
        var continuations: [UUID: EventStream] = [:]
        var closed = false
    }

    /// The work the driver started for one download's current token and may have to stop or hand on: one value, so
    /// that what runs for a download is found, stopped and discarded together. A download with no work has no entry
    /// (a catalog leaves nothing behind).
    ///
    /// An install that a pause or the watchdog stopped may still be returning when the next transfer starts: its flag
    /// was set when it was stopped, the machine knows it is outstanding (``DownloadMachine/installOutstanding``), and the
    /// next transfer's work takes its place here.
    enum DownloadWork: Sendable {
        /// A whole pack's transfer, running or ended: the unpack that follows it, and the fetch of the pack's index
        /// beside it for its files' digests, each until the install takes it.
        case wholePack(stream: StreamedUnpack?, index: IndexFetch?)
        /// A delta update, running or built, until the install takes its tree.
        case delta(DeltaTransfer)
        /// The install of `token`, and the flag that stops it (pause, cancel, the watchdog).
        case install(token: Int, flag: CancelFlag)

        var stream: StreamedUnpack? {
            if case .wholePack(let stream, _) = self { stream } else { nil }
        }
        var index: IndexFetch? {
            if case .wholePack(_, let index) = self { index } else { nil }
        }
        var delta: DeltaTransfer? {
            if case .delta(let delta) = self { delta } else { nil }
        }
    }

    struct WeakObserver: Sendable {
        weak var observer: (any DownloadQueueObserver)?
    }

    /// What this home measured of each source a pack was fetched from, best first: a pack with several sources
    /// starts at the best (one never measured first), as `packs sources` shows.
    ///
    /// - Returns: every source measured, by throughput over one plus recent failures, best first.
    /// - Throws: ``PackDeliveryError`` when the state database cannot be read.
    public func sourceRanking() throws(PackDeliveryError) -> [SourceStats] {
        SourceRanking(try self.store.sourceStats()).ranked(now: Date())
    }

    /// Opens (or creates) the queue's state under `home` and takes over downloads no live process runs.
    ///
    /// A damaged state database is moved aside and rebuilt from the installed content (see ``storeRecovery``).
    /// Installs recorded in the last minutes before the previous process stopped are checked, and those
    /// found damaged are delivered again through a restore transaction.
    /// - Parameters:
    ///   - home: where state, partial downloads and installed content live.
    ///   - configuration: concurrency, transfer options, limits and resume behaviour.
    ///   - logger: where to log; without one the library logs nothing.
    /// - Throws: ``PackDeliveryError`` when the home folder or the state database cannot be used.
    public init(home: Home, configuration: Configuration = Configuration(), logger: Logger? = nil) throws(PackDeliveryError) {
        self.home = home
        self.configuration = configuration
        self.logger = logger ?? Logger(label: "PackDelivery", factory: { _ in SwiftLogNoOpLogHandler() })
        try home.prepare()
        let (store, recovery) = try Self.openStore(home: home, busyTimeout: configuration.databaseBusyTimeout, logger: self.logger)
        self.store = store
        self.owner = QueueOwner.new()
        QueueOwner.register(self.owner)
        self.installer = Installer(
            home: home, store: store,
            limits: .init(maxExpansionRatio: configuration.maxExpansionRatio, maxEntries: configuration.maxEntries),
            writer: configuration.writer, hook: configuration.installHook, janitor: self.janitor)
        var machine = QueueMachine(concurrency: configuration.concurrency, meteredLimit: configuration.meteredLimit)
        let logger = self.logger
        // A compact download's machine, read back from its row (``QueueMachine/Entry``), on the driver.
        machine.loader = { id in
            do throws(PackDeliveryError) {
                guard let record = try store.downloadRecord(id) else { return nil }
                return Self.machine(record.download, configuration: configuration)
            } catch {
                logger.error("could not read a waiting download back from the store", metadata: ["download": "\(id)", "error": "\(error)"])
                return nil
            }
        }
        self.driverState = DriverStateBox(DriverState(machine: machine))
        self.timer = Mutex(DispatchSource.makeTimerSource(queue: self.driver))
        self.driver.setSpecific(key: Self.driverKey, value: true)
        self.delivery.setSpecific(key: Self.deliveryKey, value: true)
        let engine = TransferEngine(logger: self.logger) { [weak self] event in
            guard let self else { return }
            self.driver.async { self.handle(event) }
        }
        self.engineBox.withLock { $0 = engine }
        // The machine's policy (the network, the window, quiet) holds what it holds before the launch admits anything.
        let (conditions, policy) = self.policyInputs(readingSettings: true)
        self.driven { _ = $0.machine.conditionsChanged(conditions, policy: policy) }
        RateBoard.shared.setCap(self.driven { $0.machine.policy.cap($0.machine.conditions) })
        do throws(PackDeliveryError) {
            if let session = try self.openAgentSession() {
                self.driven { state in
                    state.agent = session
                    state.machine.startHandingOver()
                }
            }
            if let recovery {
                let (count, unknown) = try self.rebuildInstalls()
                var rebuilt = recovery
                (rebuilt.installsRecovered, rebuilt.foldersNotRecognised) = (count, unknown)
                self.recovery.withLock { $0 = rebuilt }
            }
            try self.onDriver { () throws(PackDeliveryError) in
                try self.launch()
                self.handOverToAgent()
            }
        } catch {
            engine.shutdown()
            QueueOwner.unregister(self.owner)
            // A dispatch source must not be released while suspended.
            self.timer.withLock {
                $0?.resume()
                $0?.cancel()
            }
            throw error
        }
        if configuration.sharesAdmission {
            let (key, grant) = AdmissionBoard.shared.join(total: configuration.concurrency) { [weak self] grant in
                guard let self else { return }
                self.driver.async { self.change { $0.setSlots(grant.slots, lent: grant.lent) } }
            }
            self.admissionKey.withLock { $0 = key }
            self.driver.async { self.change { $0.setSlots(grant.slots, lent: grant.lent) } }
        }
        configuration.networkPolicy.observe { [weak self] metered in
            guard let self else { return }
            self.driver.async { self.change { $0.networkChanged(metered: metered) } }
        }
        if let follower = self.driven({ $0.agent })?.follower {
            self.agentFollower.withLock { $0 = follower }
            follower.start()
        }
        self.timer.withLock { timer in
            timer?.setEventHandler { [weak self] in self?.tick() }
            timer?.schedule(deadline: .now() + 0.5, repeating: 0.5)
            timer?.resume()
        }
    }

    deinit {
        self.agentFollower.withLock { $0 }?.stop()
        if let key = self.admissionKey.withLock({ $0 }) { AdmissionBoard.shared.leave(key) }
        self.timer.withLock { $0?.cancel() }
        self.engineBox.withLock { $0 }?.shutdown()
        QueueOwner.unregister(self.owner)
        let continuations = self.registry.withLock { $0.continuations.values }
        for stream in continuations { stream.continuation.finish() }
    }

    // MARK: Transactions

    /// Records a transaction for a product of the manifest, with one download per pack, and starts them.
    ///
    /// Packs whose `contentVersion` is already installed are finished at once without downloading, unless `force`.
    ///
    /// - Parameters:
    ///   - productIdentifier: a product the manifest lists.
    ///   - manifest: the loaded manifest, for the packs and their URLs.
    ///   - kind: a purchase or a restore.
    ///   - destination: install into caches (may be purged) or documents (kept).
    ///   - autoFinish: recorded for hosts (such as a command-line tool) that finish transactions themselves.
    ///   - force: download again even when the same version is installed.
    ///   - start: false to record the downloads without starting them (see ``add(products:from:kind:destination:autoFinish:force:start:receipt:)-75d7v``).
    ///   - receipt: a signed receipt for the purchase (``Receipt``), stored with the transaction and sent as
    ///     `Authorization: Bearer` with each of its pack requests, through pauses and relaunches (see there).
    /// - Returns: the recorded transaction with its downloads. When a transaction for the same product is already
    ///   delivering the same packs into the same destination (a second "buy" while the first downloads), that one is
    ///   returned instead and nothing new is recorded: each pack is delivered once (`force` records a new one
    ///   anyway). That holds for a delivery another process runs on the same home too: its progress reaches this
    ///   queue's observers and events, and its downloads are taken over if that process dies.
    /// - Throws: `unknownProduct` for a product the manifest does not list; `contentIdentifierTaken` when a pack's
    ///   content identifier is installed for another product; `queueClosed` after ``close()-9kmx4``; a database error
    ///   when the store cannot be written.
    @discardableResult
    public func add(
        product productIdentifier: String, from manifest: LoadedManifest, kind: TransactionKind = .purchased,
        destination: Destination = .caches, autoFinish: Bool = false, force: Bool = false,
        start: Bool = true, receipt: String? = nil
    ) throws(PackDeliveryError) -> Transaction {
        try self.add(
            products: [productIdentifier], from: manifest, kind: kind, destination: destination, autoFinish: autoFinish,
            force: force, start: start, receipt: receipt)[0]
    }

    /// The manifest's products of these identifiers, in their order.
    /// - Throws: `unknownProduct` naming the first identifier the manifest does not list, and what it lists.
    private static func products(_ productIdentifiers: [String], in manifest: LoadedManifest) throws(PackDeliveryError)
        -> [Manifest.Product]
    {
        var products: [Manifest.Product] = []
        let index = Dictionary(manifest.manifest.products.map { ($0.productIdentifier, $0) }, uniquingKeysWith: { a, _ in a })
        for identifier in productIdentifiers {
            guard let product = index[identifier] else {
                let known = manifest.manifest.products.prefix(20).map(\.productIdentifier).joined(separator: ", ")
                throw PackDeliveryError(
                    .unknownProduct,
                    message: "The manifest at \(manifest.baseURL.redacted) has no product '\(PackDeliveryError.printable(identifier))'.",
                    hint: known.isEmpty
                        ? "The manifest lists no products."
                        : "It lists: \(PackDeliveryError.printable(known))\(manifest.manifest.products.count > 20 ? ", …" : "").",
                    subject: identifier)
            }
            products.append(product)
        }
        return products
    }

    /// Records one transaction per product in one write and starts their downloads (unless `start` is false):
    /// the way to add a whole catalog.
    ///
    /// - Parameters:
    ///   - productIdentifiers: products the manifest lists; each gets a transaction of its own.
    ///   - manifest: the loaded manifest, for the packs and their URLs.
    ///   - kind: purchases or restores.
    ///   - destination: install into caches (may be purged) or documents (kept).
    ///   - autoFinish: recorded for hosts that finish transactions themselves.
    ///   - force: download again even when the same version is installed.
    ///   - start: false to record the downloads without moving a byte (paused, reason `notStarted`), so the app can
    ///     show their sizes and ask first; ``start(_:)-17zz2`` starts them.
    ///   - receipt: a signed receipt for the purchase (``Receipt``), stored with each transaction and sent as
    ///     `Authorization: Bearer <receipt>` with its pack requests (and a reload of its manifest), through pauses,
    ///     resumes and relaunches, unless the ``Configuration/credentials`` provider gives an `Authorization` header.
    ///     Replace it with ``setReceipt(_:forTransactions:)-3uwgj``. It never appears in errors, events or logs.
    /// - Returns: the recorded transactions, in the order of `productIdentifiers`.
    /// - Throws: as ``add(product:from:kind:destination:autoFinish:force:start:receipt:)-8cspe``; nothing is recorded when any product is refused.
    @discardableResult
    public func add(
        products productIdentifiers: [String], from manifest: LoadedManifest, kind: TransactionKind = .purchased,
        destination: Destination = .caches, autoFinish: Bool = false, force: Bool = false,
        start: Bool = true, receipt: String? = nil
    ) throws(PackDeliveryError) -> [Transaction] {
        try self.add(
            products: productIdentifiers, from: manifest, kind: kind, destination: destination, autoFinish: autoFinish,
            force: force, start: start, receipt: receipt, priority: nil)
    }

    /// As the public `add(products:…)`, with the downloads' priority given (nil: essential, or restore for a restore),
    /// so that they are recorded and first admitted with it.
    func add(
        products productIdentifiers: [String], from manifest: LoadedManifest, kind: TransactionKind,
        destination: Destination, autoFinish: Bool, force: Bool, start: Bool, receipt: String?, priority: DownloadPriority?
    ) throws(PackDeliveryError) -> [Transaction] {
        try self.requireOpen()
        let products = try Self.products(productIdentifiers, in: manifest)
        // The facts (what is installed, which folders exist), then the decision (AddPlan), then the record.
        let wanted = Set(products.flatMap { $0.contents.map(\.contentIdentifier) })
        let byContent = Dictionary(
            grouping: try self.store.installs().filter { wanted.contains($0.contentIdentifier) }, by: \.contentIdentifier)
        let present = Set(byContent.values.joined().map(\.contentURL).filter { FileManager.default.fileExists(atPath: $0) })
        // A product this queue or another live process is already delivering is joined, not delivered twice: the
        // other process's progress reaches this queue's listeners (watchOthers), and its downloads are taken over if
        // it dies (takeOverJoinedDeliveries).
        let running = Set(self.driven { Array($0.machine.entries.keys) })
        let elsewhere = Set(
            try self.store.openDownloads(ownedByOtherThan: self.owner).filter { !$0.state.isSettled && ($0.owner?.isAlive ?? false) }.map(
                \.id))
        let open = try self.liveTransactions().filter { $0.downloads.contains { running.contains($0.id) || elsewhere.contains($0.id) } }
        var transactions: [Transaction] = []
        var joined: [Int: Transaction] = [:]
        for (position, product) in products.enumerated() {
            if let running = AddPlan.joined(product, destination: destination, force: force, open: open) {
                joined[position] = try self.asFollowed(running)
                if self.awaitsKeyUnrun(running) || running.downloads.contains(where: { elsewhere.contains($0.id) }) {
                    self.driven { _ = $0.joinedElsewhere.insert(running.id) }
                }
                continue
            }
            let transactionID = Self.newID("t")
            var urls: [URL] = []
            var sources: [[URL]] = []
            for content in product.contents {
                sources.append(try manifest.packURLs(for: content))
                urls.append(sources[sources.count - 1][0])
            }
            var downloads = try AddPlan.downloads(
                for: product, transactionID: transactionID, urls: urls, destination: destination, force: force,
                priority: priority ?? (kind == .restored ? .restore : .essential), installs: byContent, presentFolders: present,
                newID: { Self.newID("d") }
            ).get()
            for (offset, content) in product.contents.enumerated() where offset < downloads.count {
                // A preload's bytes are fetched whole and kept encrypted: no chunk of it is written before its key.
                downloads[offset].index = content.preload == nil ? manifest.resolvedIndex(for: content) : nil
                downloads[offset].releaseDate = content.preload?.releaseDate
                if sources[offset].count > 1 {
                    downloads[offset].sources = sources[offset]
                    downloads[offset].credentialsToAllSources = manifest.manifest.credentialsToAllSources ?? false
                }
            }
            if !start {
                for index in downloads.indices where downloads[index].state == .waiting {
                    downloads[index].state = .paused
                    downloads[index].pauseReason = .notStarted
                }
            }
            transactions.append(
                Transaction(
                    id: transactionID, productIdentifier: product.productIdentifier, kind: kind, createdAt: Date(),
                    finishedAt: nil, autoFinish: autoFinish, downloads: downloads))
        }
        // Preservation priorities the manifest gives (for evictions); packs that say nothing keep theirs (0 by default).
        var priorities: [String: Int?] = [:]
        for content in products.flatMap(\.contents) {
            if let priority = content.preservationPriority { priorities[content.contentIdentifier] = priority }
        }
        try self.store.setPreservationPriorities(priorities)
        // Checked again under the store's write lock: a process that recorded the same delivery since is joined too.
        var late: [String: String] = [:]
        if !transactions.isEmpty {
            late = try self.record(
                transactions, manifestURL: manifest.source, receipt: receipt, joining: !force, adoptingRestores: kind == .restored)
        }
        var recorded = try self.withJoined(transactions, late).makeIterator()
        return products.indices.compactMap { joined[$0] ?? recorded.next() }
    }

    /// Replaces the receipt that transactions present (a renewed one, after the old one expired), for their
    /// next pack requests; a download paused `unauthorized` then needs only ``resume(_:)``.
    ///
    /// - Parameters:
    ///   - receipt: the new signed receipt.
    ///   - transactionIDs: the transactions it is for.
    /// - Returns: the ids among `transactionIDs` that are recorded (finished or not).
    /// - Throws: a database error when the store cannot be written.
    @discardableResult
    public func setReceipt(_ receipt: String, forTransactions transactionIDs: [String]) throws(PackDeliveryError) -> [String] {
        try self.requireOpen()
        return try self.store.setReceipt(receipt, transactionIDs: transactionIDs)
    }

    /// The unfinished transactions, with their downloads as they are now.
    ///
    /// - Returns: unfinished transactions, oldest first.
    /// - Throws: a database error when the store cannot be read.
    public func transactions() throws(PackDeliveryError) -> [Transaction] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in try self.liveTransactions() }
    }

    /// Finishes a transaction whose downloads are all finished or cancelled.
    ///
    /// Its installed content stays, findable with ``contentURL(forProductID:)``. Once this returns, the
    /// finish is durable.
    /// - Parameter transactionID: the transaction to finish; finishing a finished one does nothing.
    /// - Throws: `finishRefused` with ``PackDeliveryError/pendingDownloadIDs`` when downloads are pending
    ///   (nothing changes then); `unknownTransaction` for an unknown id.
    public func finish(_ transactionID: String) throws(PackDeliveryError) {
        try self.finish([transactionID])
    }

    /// Finishes transactions in one durable write; all or none.
    ///
    /// - Parameter transactionIDs: transactions whose downloads are all finished or cancelled.
    /// - Returns: the transactions this call finished (those already finished are left out).
    /// - Throws: as ``finish(_:)``, for the first that cannot finish; then none is finished.
    @discardableResult
    public func finish(_ transactionIDs: [String]) throws(PackDeliveryError) -> [Transaction] {
        try self.requireOpen()
        return try self.onDriver { () throws(PackDeliveryError) in try self.finishOnDriver(transactionIDs) }
    }

    /// Pauses running downloads (reason `interrupted`), saves their state, gives them up for other
    /// processes, and stops the transfer thread. Event streams end.
    public func close() {
        let first = self.registry.withLock { state in
            defer { state.closed = true }
            return !state.closed
        }
        guard first else { return }
        self.timer.withLock { $0?.cancel() }
        self.agentFollower.withLock { $0 }?.stop()
        if let key = self.admissionKey.withLock({ $0 }) { AdmissionBoard.shared.leave(key) }
        self.runOnDriver { self.change { $0.pauseAll(.interrupted, closing: true) } }
        self.engineBox.withLock { $0 }?.shutdown()
        self.runOnDriver {
            // Discarded, and waited for (briefly): a process that exits leaves no half-unpacked folder behind.
            let work = self.driven { state in
                defer { state.work = [:] }
                return Array(state.work.values)
            }
            let streams = work.compactMap(\.stream)
            for stream in streams { stream.discard() }
            for stream in streams { stream.waitUntilEnded(timeout: 2) }
            // Stopped by the pause above; their threads end at the next block of bytes.
            for delta in work.compactMap(\.delta) { delta.stopAndWait() }
            self.save(includingProgress: true)
            let ids = self.driven { Array($0.machine.entries.keys) }
            do { try self.store.release(ids, owner: self.owner) } catch {
                self.logger.error("could not give up the downloads", metadata: ["error": "\(error)"])
            }
        }
        QueueOwner.unregister(self.owner)
        self.janitor.sync {}
        // From an observer's callback, the callbacks before it have run; those after it see a closed queue.
        if DispatchQueue.getSpecific(key: Self.deliveryKey) != true { self.delivery.sync {} }
        // Closed now rather than whenever the last reference goes: its WAL is folded back before the process exits.
        self.store.close()
        // Finished outside the lock: a stream's onTermination takes it too.
        let continuations = self.registry.withLock { $0.continuations.values }
        for stream in continuations { stream.continuation.finish() }
    }

    // MARK: Helpers

    func requireOpen() throws(PackDeliveryError) {
        if self.registry.withLock({ $0.closed }) {
            throw PackDeliveryError(
                .queueClosed, message: "The download queue was closed.", hint: "Open a new DownloadQueue on the same home.")
        }
    }

    /// Runs `body` on the driver queue and waits, keeping the typed error; runs inline when already on it.
    func onDriver<T>(_ body: () throws(PackDeliveryError) -> T) throws(PackDeliveryError) -> T {
        if DispatchQueue.getSpecific(key: Self.driverKey) == true { return try body() }
        let result: Result<T, PackDeliveryError> = self.driver.sync {
            do throws(PackDeliveryError) { return .success(try body()) } catch { return .failure(error) }
        }
        return try result.get()
    }

    /// Reads or changes the driver's state, on the driver queue: at once when already on it, otherwise by waiting
    /// for it. Every access to ``DriverState`` goes through here, so the driver queue is its one serializer.
    func driven<T>(_ body: (inout DriverState) -> T) -> T {
        if DispatchQueue.getSpecific(key: Self.driverKey) == true { return body(&self.driverState.value) }
        return self.driver.sync { body(&self.driverState.value) }
    }

    func runOnDriver(_ body: () -> Void) {
        if DispatchQueue.getSpecific(key: Self.driverKey) == true { return body() }
        self.driver.sync(execute: body)
    }

    static func fileSize(_ url: URL) -> Int64? {
        var info = stat()
        guard stat(url.path, &info) == 0 else { return nil }
        return Int64(info.st_size)
    }

    static func newID(_ prefix: String) -> String {
        let alphabet = Array("0123456789abcdefghjkmnpqrstvwxyz")
        return prefix + "-" + String((0..<10).map { _ in alphabet.randomElement()! })
    }
}
