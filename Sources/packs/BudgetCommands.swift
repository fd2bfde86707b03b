import ArgumentParser
import Foundation
import PackAgent
import PackDelivery
import Synchronization

extension Packs {
    struct GC: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "gc",
            abstract: "Evict cached packs by hand, down to a size (default: the home's cache budget, else everything that may go).",
            discussion: """
                Packs go in eviction order: lowest preservationPriority first, then least recently used. Documents, \
                packs of unfinished transactions and packs leased by a running process (packs lease, \
                DownloadQueue.beginAccessing) are never evicted. An evicted pack stays known (packs status, packs \
                content) and is installed again by packs fetch.

                Exit 0 when the caches are at or below the size; 75 when leased or protected packs keep them above it \
                (try again once they are released).

                Examples:
                  packs gc --to 2G --dry-run
                  packs gc
                """)
        @OptionGroup var global: GlobalOptions
        @Option(
            help: ArgumentHelp("Evict until the caches hold at most this much (2G, 500M; 0 for everything that may go).", valueName: "size")
        )
        var to: String?
        @Flag(name: .customLong("dry-run"), help: "List what would be evicted, and evict nothing.")
        var dryRun = false
        @OptionGroup var agent: AgentOptions

        func validate() throws {
            if let to = self.to, to != "0", ByteCount(argument: to) == nil {
                throw ValidationError("--to takes a size such as 500M or 2G, or 0.")
            }
        }

        private var toBytes: Int64? { self.to.map { $0 == "0" ? 0 : ByteCount(argument: $0)!.bytes } }

        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) {
                let answer = try AgentLink.run { try link.collectGarbage(to: self.toBytes, dryRun: self.dryRun) }
                let code = self.report(answer.evicted, left: answer.cachedBytes, target: answer.target)
                if code != 0 { throw ExitCode(code) }
                return
            }
            let code = try await mapErrors { () async throws(PackDeliveryError) -> Int32 in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                var target: Int64 = 0
                if let bytes = self.toBytes {
                    target = bytes
                } else if let budget = try queue.homeCacheBudget() {
                    target = budget
                }
                let evicted = try queue.evictCaches(downTo: target, dryRun: self.dryRun)
                let left = try queue.cachedBytes() - (self.dryRun ? evicted.reduce(0) { $0 + $1.byteCount } : 0)
                return self.report(
                    evicted.map { EvictedJSON($0, event: self.dryRun ? "wouldEvict" : "evicted") }, left: left, target: target)
            }
            if code != 0 { throw ExitCode(code) }
        }

        /// Prints what was evicted (or would be) and says when the caches stay above the target. - Returns: the exit code.
        private func report(_ evicted: [EvictedJSON], left: Int64, target: Int64) -> Int32 {
            for content in evicted {
                if self.global.json {
                    printJSON(content)
                } else if !self.global.quiet {
                    printLine(
                        "\(self.dryRun ? "would evict" : "evicted")  \(PackDeliveryError.printable(content.productIdentifier))  \(PackDeliveryError.printable(content.contentIdentifier)) \(PackDeliveryError.printable(content.contentVersion))  \(ByteFormat.string(content.byteCount))"
                    )
                }
            }
            if left > target {
                printError(
                    "packs: The caches still hold \(ByteFormat.string(left)) (more than \(ByteFormat.string(target))): the rest is leased, or belongs to unfinished transactions. Try again once it is released."
                )
                return ExitStatus.resumable
            }
            return 0
        }
    }

    struct Lease: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Hold products' (or packs') content in use until interrupted: it is not evicted meanwhile.",
            discussion: """
                Prints "leased TOKEN" once the lease is recorded, then waits. SIGINT or SIGTERM ends the lease and \
                exits 0; a process killed otherwise leaves a lease that the next eviction finds dead and removes.

                Example:
                  packs lease com.example.forest &
                """)
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Product identifiers.") var products: [String] = []
        @Option(name: .customLong("pack"), help: ArgumentHelp("A pack, by content identifier; repeatable.", valueName: "id"))
        var packs: [String] = []

        func validate() throws {
            if self.products.isEmpty && self.packs.isEmpty { throw ValidationError("Name products, or packs with --pack.") }
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let lease = try queue.beginAccessing(productIDs: self.products, contentIdentifiers: self.packs)
                printLine(self.global.json ? "{\"event\":\"leased\",\"token\":\"\(lease.token)\"}" : "leased \(lease.token)")
                await Self.waitForStopSignal()
                try queue.endAccessing(lease)
            }
        }

        static func waitForStopSignal() async {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let once = OnceFlag()
                for number in [SIGINT, SIGTERM, SIGHUP] {
                    signal(number, SIG_IGN)
                    let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                    source.setEventHandler { if once.claim() { continuation.resume() } }
                    source.resume()
                    once.keep(source)
                }
            }
        }
    }
}

/// Resumes a continuation once, whichever signal comes first, and keeps the signal sources alive.
final class OnceFlag: Sendable {
    private let state = Mutex<(done: Bool, sources: [any DispatchSourceSignal])>((false, []))
    func claim() -> Bool {
        self.state.withLock { state in
            defer { state.done = true }
            return !state.done
        }
    }
    func keep(_ source: any DispatchSourceSignal) { self.state.withLock { $0.sources.append(source) } }
}
