import Foundation

extension QueueMachine {
    /// One download the queue owns: its machine, or, while it waits (or is held) and its row in the store holds all of
    /// it, a compact form with what admission, the policy and the order read.
    ///
    /// A queue of 100,000 waiting downloads (case 19d of the benchmark) kept a machine for each: its `Download`, its
    /// strings and its `URL`, ≈ 1.8 KiB a download. A compact entry is a few words; its machine is read back from the
    /// store (``QueueMachine/loader``) when it is about to be admitted, when an event changes it, or when someone asks
    /// for it (and then not kept).
    struct Entry: Sendable {
        /// What a compact entry keeps: the token of its machine (``DownloadMachine/compactToken``), and what the order and
        /// the policy decide from.
        struct Compact: Sendable, Hashable {
            var token: Int
            var contentLength: Int64
            /// Nil while it waits; the reason it is paused otherwise.
            var pauseReason: PauseReason?
            var priority: DownloadPriority
            var delivery: DeliveryPolicy
        }

        enum Form: Sendable {
            /// Kept in a box of its own: a machine is hundreds of bytes, and a table holding them inline would keep its
            /// free buckets that size too.
            case loaded(OutOfLine<DownloadMachine>)
            case compact(Compact)
        }

        private(set) var form: Form
        /// Position of the download in its transaction (saved with it).
        var position: Int
        /// Scheduling order among downloads of one priority: first added, first started; kept across pauses.
        var sequence: Int
        var inHeap = false
        /// The priority its place in the heap was given: a place with another one is stale.
        var heapRank = 0

        init(machine: DownloadMachine, position: Int, sequence: Int) {
            self.form = .loaded(OutOfLine(machine))
            self.position = position
            self.sequence = sequence
        }

        /// The machine, when it is loaded.
        var loaded: DownloadMachine? {
            guard case .loaded(let box) = self.form else { return nil }
            return box.value
        }

        var compact: Compact? {
            guard case .compact(let compact) = self.form else { return nil }
            return compact
        }

        var state: DownloadState {
            switch self.form {
            case .loaded(let box): box.value.state
            case .compact(let compact): compact.pauseReason == nil ? .waiting : .paused
            }
        }

        var pauseReason: PauseReason? {
            switch self.form {
            case .loaded(let box): box.value.pauseReason
            case .compact(let compact): compact.pauseReason
            }
        }

        var priority: DownloadPriority {
            switch self.form {
            case .loaded(let box): box.value.priority
            case .compact(let compact): compact.priority
            }
        }

        /// Changes the loaded machine in its place (its box referenced once, so not copied); nil when compact.
        mutating func withMachine<T>(_ body: (inout DownloadMachine) -> T) -> T? {
            guard case .loaded(var box) = self.form else { return nil }
            // The form lets go of the box while it changes, so that the box is unique.
            self.form = .compact(Compact(token: 0, contentLength: 0, priority: .essential, delivery: .essential))
            defer { self.form = .loaded(box) }
            return body(&box.value)
        }

        /// Keeps the machine, read back from the store.
        mutating func load(_ machine: DownloadMachine) { self.form = .loaded(OutOfLine(machine)) }

        /// Keeps only the compact form, when the machine holds nothing beyond its row in the store
        /// (``DownloadMachine/compactToken``). Its caller knows that row is saved.
        /// - Returns: whether it is compact now.
        @discardableResult
        mutating func compactIfPlain() -> Bool {
            guard case .loaded(let box) = self.form else { return true }
            let machine = box.value
            guard let token = machine.compactToken else { return false }
            let download = machine.download
            self.form = .compact(
                Compact(
                    token: token, contentLength: download.contentLength, pauseReason: machine.pauseReason,
                    priority: download.priority, delivery: download.delivery))
            return true
        }
    }

    /// How many entries are compact (for tests: a compact entry holds no machine).
    var compactCount: Int { self.entries.values.count { $0.compact != nil } }

    /// The space a download needs to start with `facts`: ``needed(_:writesOnce:)`` for the plan the machine would
    /// order with them. The driver asks it before the admission, to make room; nil for a download it does not own.
    func spaceNeeded(_ id: String, facts: DeliveryFacts) -> Int64? {
        guard let machine = self.machine(id) else { return nil }
        return self.needed(machine.download, writesOnce: machine.plan(with: facts).writesOnce)
    }

    /// Bytes still to download, plus the unpacked size, plus the margin; never overflows. (A preload's install
    /// decrypts as it unpacks, with no plain pack written; a zip preload's, which is decrypted to a file first, checks
    /// for that room itself.)
    /// - Parameter writesOnce: the download is a first install that writes each byte once (``DeliveryPlan/writeOnce``):
    ///   it keeps no archive, so it needs its files and the margin only.
    func needed(_ download: Download, writesOnce: Bool) -> Int64 {
        let unpacked = max(0, download.unpackedLength ?? download.contentLength)
        let remaining = writesOnce ? 0 : max(0, download.contentLength &- download.bytesReceived)
        let (sum, overflow1) = remaining.addingReportingOverflow(unpacked)
        let (total, overflow2) = sum.addingReportingOverflow(self.spaceMargin)
        return overflow1 || overflow2 ? .max : total
    }
}
