import Foundation
import Logging
@_spi(Agent) import PackDelivery
import Synchronization

/// The homes the agent serves: one open ``DownloadQueue`` each, the list of them kept in the agent's state folder
/// (`agent-homes.json`) so that a new agent opens them again and their queues resume what was interrupted, and a
/// task per queue that numbers its events into the ``AgentEventLog`` and finishes the transactions that asked for it.
final class AgentHomes: Sendable {
    private struct Served {
        let queue: DownloadQueue
        let home: Home
        let pump: Task<Void, Never>
        let status: StatusCache
    }

    /// A home's last status answer (`GET /v1/downloads`), served again while nothing changed since (no event of its
    /// queue but progress, no request to the agent but reads) and it is younger than ``maximumAge``: clients that
    /// poll cost one read of the store per change or per 250 ms, not one per request.
    final class StatusCache: Sendable {
        /// How long an answer serves at most: what other processes change in the home's store (`packs gc`, a queue
        /// of an app) reports no event to the agent, and shows within this.
        static let maximumAge: Duration = .milliseconds(250)
        /// Bumped at each event of the queue.
        let generation = Atomic<UInt64>(0)
        private let last = Mutex<(generation: UInt64, at: ContinuousClock.Instant, body: String)?>(nil)

        /// The last answer, or a new one from `make` (kept with the generation read before it was made, so that an
        /// event while it is made leaves it stale).
        func answer(_ make: () async throws -> String) async rethrows -> String {
            let generation = self.generation.load(ordering: .acquiring)
            let now = ContinuousClock.now
            if let last = self.last.withLock({ $0 }), last.generation == generation, now - last.at < Self.maximumAge {
                return last.body
            }
            let body = try await make()
            // An answer made later is never replaced by one begun before it, and one that an event made stale while it
            // was made is not kept (a home's answer may be megabytes: it is held only while it can serve).
            self.last.withLock { last in
                guard self.generation.load(ordering: .acquiring) == generation else { return }
                if last.map({ ($0.generation, $0.at) <= (generation, now) }) ?? true { last = (generation, now, body) }
            }
            return body
        }

        /// Downloads whose last event said they transfer: a later such event of one of them is progress alone.
        private let transferring = Mutex<Set<String>>([])

        /// Takes an event of the queue: any change but progress makes the next answer new.
        func note(_ event: DownloadQueueEvent) {
            if case .downloadUpdated(let download) = event {
                let transfers = download.state == .active && download.phase == .downloading && download.retryDate == nil
                let progressOnly = self.transferring.withLock { set -> Bool in
                    guard transfers else {
                        set.remove(download.id)
                        return false
                    }
                    return !set.insert(download.id).inserted
                }
                if progressOnly { return }
            }
            self.generation.add(1, ordering: .releasing)
            self.last.withLock { $0 = nil }
        }
    }

    private let stateFile: URL
    private let configuration: @Sendable () -> DownloadQueue.Configuration
    private let events: AgentEventLog
    private let logger: Logger
    private let served = Mutex<[String: Served]>([:])

    init(
        stateFolder: URL, events: AgentEventLog, logger: Logger,
        configuration: @escaping @Sendable () -> DownloadQueue.Configuration
    ) {
        self.stateFile = stateFolder.appending(path: "agent-homes.json")
        self.configuration = configuration
        self.events = events
        self.logger = logger
    }

    /// A served home as `agent-homes.json` keeps it: its folder (a home of one folder, as `--home` makes), or its three
    /// folders.
    private struct Saved: Codable {
        var stateFolder: String
        var cachesFolder: String
        var documentsFolder: String

        init(_ home: Home) {
            self.stateFolder = home.stateFolder.path
            self.cachesFolder = home.cachesFolder.path
            self.documentsFolder = home.documentsFolder.path
        }

        /// Also the earlier form: the folder's path alone.
        init(from decoder: any Decoder) throws {
            if let path = try? decoder.singleValueContainer().decode(String.self) {
                self.init(Home(folder: URL(filePath: path)))
                return
            }
            let container = try decoder.container(keyedBy: CodingKeys.self)
            self.init(
                Home(
                    stateFolder: URL(filePath: try container.decode(String.self, forKey: .stateFolder)),
                    cachesFolder: URL(filePath: try container.decode(String.self, forKey: .cachesFolder)),
                    documentsFolder: URL(filePath: try container.decode(String.self, forKey: .documentsFolder))))
        }

        var home: Home {
            Home(
                stateFolder: URL(filePath: self.stateFolder), cachesFolder: URL(filePath: self.cachesFolder),
                documentsFolder: URL(filePath: self.documentsFolder))
        }
    }

    /// The homes saved by earlier runs, opened again (their interrupted downloads resume). A home that no longer
    /// opens is logged and dropped from the list.
    func openSaved() {
        guard let data = FileManager.default.contents(atPath: self.stateFile.path),
            let saved = try? JSONDecoder().decode([Saved].self, from: data)
        else { return }
        for entry in saved {
            do throws(PackDeliveryError) {
                _ = try self.queue(entry.home, saving: false)
            } catch {
                self.logger.error("Cannot open a served home again; it is no longer served", metadata: ["error": "\(error.code)"])
            }
        }
        self.save()
    }

    /// Makes every home's next status answer new.
    func statusChanged() {
        for served in self.served.withLock({ Array($0.values) }) { served.status.generation.add(1, ordering: .releasing) }
    }

    /// The served homes' keys (their state folders), sorted.
    var paths: [String] { self.served.withLock { $0.keys.sorted() } }

    /// The key of a home: its state folder's path (for a home of one folder, the folder), as events name it.
    static func key(_ home: Home) -> String { home.stateFolder.standardizedFileURL.path }

    /// Whether a home of one folder has anything to show: the agent serves it, or its store exists. A read of a home
    /// that has none answers empty and serves nothing, so a mistyped path creates no folder and is not served
    /// (and resumed at each start) from then on.
    func hasStore(home: String) -> Bool {
        let home = Home(folder: URL(filePath: home).standardizedFileURL)
        if self.served.withLock({ $0[Self.key(home)] != nil }) { return true }
        return FileManager.default.fileExists(atPath: home.databaseURL.path)
    }

    /// The queue of a home of one folder, opened (and from now on served) when it was not.
    /// - Parameter home: an absolute path.
    func queue(home: String, saving: Bool = true) throws(PackDeliveryError) -> DownloadQueue {
        try self.queue(Home(folder: URL(filePath: home).standardizedFileURL), saving: saving)
    }

    /// The queue of a home, opened (and from now on served) when it was not; a home is known by its state folder.
    func queue(_ home: Home, saving: Bool = true) throws(PackDeliveryError) -> DownloadQueue {
        try self.served(home, saving: saving).queue
    }

    /// The queue of a home of one folder and its status cache, opened (and from now on served) when it was not.
    func served(home: String) throws(PackDeliveryError) -> (queue: DownloadQueue, status: StatusCache) {
        let served = try self.served(Home(folder: URL(filePath: home).standardizedFileURL), saving: true)
        return (served.queue, served.status)
    }

    private func served(_ home: Home, saving: Bool) throws(PackDeliveryError) -> Served {
        let key = Self.key(home)
        if let served = self.served.withLock({ $0[key] }) { return served }
        var configuration = self.configuration()
        configuration.resumeInterruptedDownloads = true
        // The agent is where downloads run: its queues never hand them on.
        configuration.agent = .never
        // One admission order for every home: by priority, then first come, within the machine's slots.
        configuration.sharesAdmission = true
        let queue = try DownloadQueue(home: home, configuration: configuration, logger: nil)
        let status = StatusCache()
        let entry = Served(queue: queue, home: home, pump: self.pump(queue, home: key, status: status), status: status)
        let inserted = self.served.withLock { served -> Bool in
            guard served[key] == nil else { return false }
            served[key] = entry
            return true
        }
        guard inserted else {
            entry.pump.cancel()
            queue.close()
            return try self.served(home, saving: saving)
        }
        self.logger.info("Serving a home", metadata: ["home": "\(key)"])
        if saving { self.save() }
        return entry
    }

    /// Stops serving the homes whose store was removed (their folder deleted by the user or an uninstaller): their
    /// downloads could only fail one after another, and, having come first, would hold the machine's slots from the
    /// other homes' meanwhile. Logged; the list of served homes is saved without them.
    func dropRemoved() async {
        let gone = self.served.withLock { served -> [(key: String, value: Served)] in
            let gone = served.filter { !FileManager.default.fileExists(atPath: $0.value.home.databaseURL.path) }
            for key in gone.keys { served.removeValue(forKey: key) }
            return gone.sorted { $0.key < $1.key }
        }
        guard !gone.isEmpty else { return }
        for (key, served) in gone {
            self.logger.warning("A served home's store was removed; it is no longer served", metadata: ["home": "\(key)"])
            await served.queue.close()
            served.pump.cancel()
        }
        self.save()
    }

    /// Whether any download of a served home waits or runs.
    func isBusy() async -> Bool {
        for queue in self.served.withLock({ $0.values.map(\.queue) }) where await queue.hasRunningDownloads { return true }
        return false
    }

    /// Closes every queue: running downloads pause as interrupted with their bytes kept, for the next agent.
    func closeAll() async {
        let all = self.served.withLock { served in
            defer { served.removeAll() }
            return Array(served.values)
        }
        for served in all {
            await served.queue.close()
            served.pump.cancel()
        }
    }

    private func save() {
        let saved = self.served.withLock { served in served.keys.sorted().compactMap { served[$0].map { Saved($0.home) } } }
        guard let data = try? JSONEncoder().encode(saved) else { return }
        let folder = self.stateFile.deletingLastPathComponent()
        try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let temporary = folder.appending(path: ".agent-homes.json.\(getpid())")
        do {
            try data.write(to: temporary)
            _ = rename(temporary.path, self.stateFile.path)
        } catch {
            self.logger.error("Cannot save the list of served homes", metadata: ["error": "\(error)"])
        }
    }

    /// Numbers the queue's events into the log, and finishes a transaction that asked for it once it is finishable.
    private func pump(_ queue: DownloadQueue, home: String, status: StatusCache) -> Task<Void, Never> {
        let events = self.events
        let stream = queue.events()
        return Task.detached {
            for await event in stream {
                // Before the event goes out: a client that saw it and then asks gets a new answer.
                status.note(event)
                let (kind, data) = AgentEventEncoding.encode(event, home: home)
                events.append(kind: kind, data: data)
                if case .transactionUpdated(let transaction) = event, transaction.autoFinish, transaction.isFinishable,
                    transaction.state != .finished
                {
                    _ = try? await queue.finish([transaction.id])
                }
            }
        }
    }
}

/// An event of a queue as the agent's stream carries it: the `--json` event line of `packs fetch`, with the home.
enum AgentEventEncoding {
    private struct WithHome<Inner: Encodable>: Encodable {
        let home: String
        let inner: Inner

        private enum Keys: String, CodingKey { case home }

        func encode(to encoder: any Encoder) throws {
            try self.inner.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(self.home, forKey: .home)
        }
    }

    static func encode(_ event: DownloadQueueEvent, home: String) -> (kind: String, data: String) {
        switch event {
        case .transactionUpdated(let transaction):
            ("transaction", AgentJSON.line(WithHome(home: home, inner: TransactionJSON(transaction, event: "transaction"))))
        case .downloadUpdated(let download):
            ("download", AgentJSON.line(WithHome(home: home, inner: DownloadJSON(download, event: "download"))))
        case .priorityChanged(let download):
            ("priorityChanged", AgentJSON.line(WithHome(home: home, inner: DownloadJSON(download, event: "priorityChanged"))))
        case .transactionsRemoved(let transactions):
            (
                "transactionsRemoved",
                AgentJSON.line(
                    WithHome(home: home, inner: RestoreEventJSON(event: "transactionsRemoved", transactions: transactions.map(\.id))))
            )
        case .restoreCompleted(let transactions):
            (
                "restoreCompleted",
                AgentJSON.line(
                    WithHome(home: home, inner: RestoreEventJSON(event: "restoreCompleted", transactions: transactions.map(\.id))))
            )
        case .restoreFailed(let error):
            ("restoreFailed", AgentJSON.line(WithHome(home: home, inner: RestoreEventJSON(event: "restoreFailed", error: error))))
        case .evicted(let content):
            ("evicted", AgentJSON.line(WithHome(home: home, inner: EvictedJSON(content, event: "evicted"))))
        }
    }
}
