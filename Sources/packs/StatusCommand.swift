import ArgumentParser
import Foundation
import PackAgent
import PackDelivery

extension Packs {
    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List open (unfinished) transactions and their downloads.",
            discussion: "Example:\n  packs --json status")

        @OptionGroup var global: GlobalOptions
        @OptionGroup var agent: AgentOptions

        func run() async throws {
            if let link = AgentLink.serving(self.global, self.agent) {
                let body = try AgentLink.run { try link.status() }
                return try await mapErrors { () throws(PackDeliveryError) in try self.show(body) }
            }
            try await mapErrors { () async throws(PackDeliveryError) in
                let queue = try openQueue(self.global, lookingConfiguration())
                defer { queue.close() }
                let transactions = try await queue.transactions()
                let evicted = try queue.evictedContent()
                let status = StatusJSON(
                    transactions: transactions.map { TransactionJSON($0) }, evicted: evicted.isEmpty ? nil : evicted.map { EvictedJSON($0) }
                )
                if self.global.json {
                    printJSON(status)
                    return
                }
                try self.show(Data(JSONOutput.line(status).utf8))
            }
        }

        /// Prints the status as `GET /v1/downloads` answers it and `--json` prints it: the line as it is with
        /// `--json`, else one line per evicted pack, transaction and download. The in-process status goes through the
        /// same JSON, so that both ways print the same.
        private func show(_ json: Data) throws(PackDeliveryError) {
            if self.global.json {
                printLine(JSONOutput.asciiControls(String(decoding: json, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
                return
            }
            guard let status = try? AgentJSON.decoder.decode(StatusJSON.self, from: json) else {
                throw PackDeliveryError(.internalError, message: "The agent's status could not be read.")
            }
            for line in status.lines { printLine(line) }
        }
    }
}

/// The human status: one line per evicted pack, transaction and download.
extension StatusJSON {
    var lines: [String] {
        var lines: [String] = []
        for content in self.evicted ?? [] {
            lines.append(
                "evicted  \(PackDeliveryError.printable(content.productIdentifier))  \(PackDeliveryError.printable(content.contentIdentifier)) \(PackDeliveryError.printable(content.contentVersion))  \(ByteFormat.string(content.byteCount))  (fetch it again to use it)"
            )
        }
        if self.transactions.isEmpty {
            lines.append("No open transactions.")
            return lines
        }
        for transaction in self.transactions {
            lines.append(
                "\(transaction.id)  \(PackDeliveryError.printable(transaction.productIdentifier))  \(transaction.kind.rawValue)\(transaction.finishable ? "  (finishable)" : "")"
            )
            for download in transaction.downloads {
                var line = "  \(download.id)  \(download.state.rawValue)"
                if let reason = download.pauseReason.value { line += " (\(reason.rawValue))" }
                line +=
                    "  \(Int((download.progress * 100).rounded(.down)))%  \(ByteFormat.string(download.bytesReceived))/\(ByteFormat.string(download.contentLength))  \(PackDeliveryError.printable(download.contentIdentifier)) \(PackDeliveryError.printable(download.contentVersion))"
                if let error = download.error.value { line += "  — \(error.message)" }
                lines.append(line)
            }
        }
        return lines
    }
}
