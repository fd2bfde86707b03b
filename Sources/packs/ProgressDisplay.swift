import Foundation
import PackAgent
import PackDelivery

/// Shows downloads as they run: live lines on a terminal, plain lines when piped, JSON lines with --json.
final class ProgressDisplay {
    enum Mode {
        case json, quiet
        case terminal(color: Bool)
        case plain

        init(global: GlobalOptions) {
            if global.json {
                self = .json
            } else if global.quiet {
                self = .quiet
            } else if isatty(STDOUT_FILENO) == 1 {
                self = .terminal(color: ProcessInfo.processInfo.environment["NO_COLOR"].map(\.isEmpty) ?? true)
            } else {
                self = .plain
            }
        }
    }

    private let mode: Mode
    private var active: [String: Download] = [:]
    private var order: [String] = []
    private var drawnLines = 0
    private var lastDraw = Date.distantPast
    private var lastPlain: [String: String] = [:]

    init(mode: Mode) { self.mode = mode }

    func show(_ event: DownloadQueueEvent) {
        switch self.mode {
        case .quiet: return
        case .json:
            switch event {
            case .transactionUpdated(let transaction): printJSON(TransactionJSON(transaction, event: "transaction"))
            case .downloadUpdated(let download): printJSON(DownloadJSON(download, event: "download"))
            case .restoreCompleted(let transactions):
                printJSON(RestoreEventJSON(event: "restoreCompleted", transactions: transactions.map(\.id)))
            case .restoreFailed(let error): printJSON(RestoreEventJSON(event: "restoreFailed", error: error))
            case .priorityChanged(let download): printJSON(DownloadJSON(download, event: "priorityChanged"))
            case .transactionsRemoved: break  // each finished transaction is printed as a transaction event
            case .evicted(let content): printJSON(EvictedJSON(content, event: "evicted"))
            }
        case .plain:
            guard case .downloadUpdated(let download) = event else { return }
            // One line per state or phase change, and per wait before a retry; progress steps are left out so logs stay short.
            let key =
                "\(download.state.rawValue)/\(download.phase?.rawValue ?? "")/\(download.retryDate.map { "\($0.timeIntervalSince1970)" } ?? "")"
            guard self.lastPlain[download.id] != key else { return }
            self.lastPlain[download.id] = key
            printLine(Self.summary(download))
        case .terminal(let color):
            guard case .downloadUpdated(let download) = event else { return }
            var finishedLines: [String] = []
            if download.state == .active || download.state == .waiting {
                if self.active[download.id] == nil { self.order.append(download.id) }
                let changedPhase = self.active[download.id]?.phase != download.phase || self.active[download.id]?.state != download.state
                self.active[download.id] = download
                if !changedPhase && Date().timeIntervalSince(self.lastDraw) < 0.1 { return }
            } else {
                self.active[download.id] = nil
                self.order.removeAll { $0 == download.id }
                finishedLines.append(Self.summary(download, color: color))
            }
            self.draw(finished: finishedLines)
        }
    }

    /// Transactions were finished, in batches: JSON prints each at once; the plain line comes with the last batch
    /// (`total` transactions in all).
    func finished(_ transactions: [Transaction], last: Bool, total: Int) {
        switch self.mode {
        case .quiet: return
        case .json: for transaction in transactions { printJSON(TransactionJSON(transaction, event: "transaction")) }
        case .plain, .terminal:
            guard last else { return }
            if total == 1, let transaction = transactions.first {
                printLine("finished transaction \(transaction.id) (\(PackDeliveryError.printable(transaction.productIdentifier)))")
            } else {
                printLine("finished \(total) transactions")
            }
        }
    }

    func end() {
        if case .terminal = self.mode { self.draw(finished: []) }
    }

    /// The run ended: JSON's last line says what it did (``RunSummary``); people read it in the lines above.
    func runEnded(_ summary: RunSummary) {
        if case .json = self.mode { printJSON(summary) }
    }

    private func draw(finished: [String]) {
        var out = ""
        if self.drawnLines > 0 { out += "\u{1B}[\(self.drawnLines)A" }
        for line in finished { out += "\r\u{1B}[2K" + line + "\n" }
        let lines = self.order.compactMap { self.active[$0] }.map(Self.progressLine)
        for line in lines { out += "\r\u{1B}[2K" + line + "\n" }
        // Clear lines left over from a taller block.
        let extra = max(0, self.drawnLines - finished.count - lines.count)
        for _ in 0..<extra { out += "\r\u{1B}[2K\n" }
        if extra > 0 { out += "\u{1B}[\(extra)A" }
        self.drawnLines = lines.count
        self.lastDraw = Date()
        guard !Output.broken.load(ordering: .relaxed) else { return }
        Output.write(out)
    }

    static func progressLine(_ download: Download) -> String {
        let width = 24
        let filled = Int((download.progress * Double(width)).rounded(.down))
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        let percent = String(format: "%3d%%", Int((download.progress * 100).rounded(.down)))
        let total = download.delta?.bytesToFetch ?? download.contentLength
        var line =
            "\(PackDeliveryError.printable(download.contentIdentifier)) \(PackDeliveryError.printable(download.contentVersion)) [\(bar)] \(percent) \(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(total))"
        if download.delta != nil { line += " (delta)" }
        if download.timeRemaining > 0 {
            let speed = Double(total - download.bytesReceived) / download.timeRemaining
            line += " \(ByteFormat.string(Int64(speed)))/s ETA \(ByteFormat.duration(download.timeRemaining))"
        } else if download.state == .active, download.phase == .downloading {
            line += " --/s ETA --"
        }
        line += "  \(download.state == .waiting ? "waiting" : download.phase?.rawValue ?? download.state.rawValue)"
        if let wait = Self.retryWait(download) { line += "  \(wait)" }
        return line
    }

    static func summary(_ download: Download, color: Bool = false) -> String {
        let paint: (String, String) -> String = { text, code in color ? "\u{1B}[\(code)m\(text)\u{1B}[0m" : text }
        switch download.state {
        case .finished:
            let how =
                download.delta.map { Self.deltaSummary($0, contentLength: download.contentLength) }
                ?? ByteFormat.string(download.contentLength)
            return
                "\(paint("installed", "32")) \(PackDeliveryError.printable(download.contentIdentifier)) \(PackDeliveryError.printable(download.contentVersion)) (\(how)) → \(download.contentURL.map { PackDeliveryError.printable($0.path) } ?? "?")"
        case .failed:
            return
                "\(paint("failed", "31")) \(PackDeliveryError.printable(download.contentIdentifier)) \(download.id): \(download.error?.description ?? "unknown error")"
        case .paused:
            return
                "\(paint("paused", "33")) \(PackDeliveryError.printable(download.contentIdentifier)) \(download.id) (\(download.pauseReason?.rawValue ?? "user")) at \(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(download.contentLength))"
        case .cancelled:
            return "cancelled \(PackDeliveryError.printable(download.contentIdentifier)) \(download.id)"
        case .waiting:
            return
                "waiting \(PackDeliveryError.printable(download.contentIdentifier)) \(PackDeliveryError.printable(download.contentVersion)) \(download.id)"
        case .active:
            let wait = Self.retryWait(download).map { " — \($0)" } ?? ""
            return
                "\(download.phase?.rawValue ?? "active") \(PackDeliveryError.printable(download.contentIdentifier)) \(PackDeliveryError.printable(download.contentVersion)) \(download.id) \(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(download.contentLength))\(wait)"
        }
    }

    /// What a finished delta update fetched and reused: "delta: fetched 1.1 MiB of 40.0 MiB, reused 38 files", and for a
    /// chunked pack ", 12 chunks fetched, 610 reused".
    static func deltaSummary(_ delta: Download.Delta, contentLength: Int64) -> String {
        var text =
            "delta: fetched \(ByteFormat.string(delta.bytesFetched)) of \(ByteFormat.string(contentLength)), reused \(delta.filesReused) files"
        if delta.chunksFetched + delta.chunksReused > 0 {
            text += ", \(delta.chunksFetched) chunks fetched, \(delta.chunksReused) reused"
        }
        return text
    }

    /// "waiting 5m00s: The server answered 503 …" while a download waits to try again.
    static func retryWait(_ download: Download) -> String? {
        guard let date = download.retryDate, let error = download.error else { return nil }
        return "waiting \(ByteFormat.duration(max(0, date.timeIntervalSinceNow))) to try again: \(error.message)"
    }
}

enum ByteFormat {
    static func string(_ bytes: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(bytes)
        var unit = 0
        while value >= 1024, unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
    }

    static func duration(_ seconds: Double) -> String {
        let total = Int(seconds.rounded(.up))
        if total < 60 { return "\(total)s" }
        if total < 3600 { return "\(total / 60)m\(String(format: "%02d", total % 60))s" }
        return "\(total / 3600)h\(String(format: "%02d", total % 3600 / 60))m"
    }
}
