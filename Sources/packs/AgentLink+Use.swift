import Foundation
import PackAgent
import PackDelivery

// `packs use` through the agent: the agent fetches what is not installed (ahead of everything waiting), the command
// shows the downloads' progress as resume does, then asks again for the folders, printed as the in-process use prints.
extension AgentLink {
    struct UseBody: Encodable {
        let home: String
        let product: String
        let packs: [String]?
        let manifest: String?
    }

    /// - Returns: the exit code (as fetch's: 0 when every pack is in place).
    func use(product: String, packs: [String], manifest: String?, mode: ProgressDisplay.Mode) throws -> Int32 {
        // A local manifest is the caller's path: the agent runs elsewhere.
        let location = manifest.map { $0.contains("://") ? $0 : URL(filePath: $0).standardizedFileURL.absoluteString }
        let body = UseBody(home: self.home, product: product, packs: packs.isEmpty ? nil : packs, manifest: location)
        // Followed from before the downloads start, so that no change is missed.
        let inbox = AgentEventInbox(self.client)
        let stop = StopFlag()
        defer { stop.cancel() }
        var answer = try self.askUse(body)
        if !answer.downloads.isEmpty {
            let code = try self.follow(answer.downloads, inbox: inbox, stop: stop, mode: mode)
            guard code == 0 else { return code }
            answer = try self.askUse(body)
        } else if case .json = mode {
            // Nothing to fetch: the summary of a run that followed nothing, as in-process.
            var summary = RunSummary()
            printJSON(summary.end())
        }
        guard answer.downloads.isEmpty, answer.installed.count == answer.packs.count else {
            throw PackDeliveryError(
                .internalError,
                message: "The agent still lists \(answer.downloads.count) downloads after they settled; run the command again.")
        }
        for content in answer.installed {
            if case .json = mode {
                var object = InstalledJSON(content)
                object.missing = false
                printJSON(object)
            } else {
                printLine(content.contentURL.path)
            }
        }
        return 0
    }

    private func askUse(_ body: UseBody) throws -> UseAnswer {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        // Called outside `try?`, so that the library error the agent answers with reaches the caller.
        let answered = try self.call("POST", "/v1/use", body: body)
        guard let answer = try? decoder.decode(UseAnswer.self, from: answered) else {
            throw PackDeliveryError(.internalError, message: "The agent's answer to use could not be read.")
        }
        return answer
    }
}
