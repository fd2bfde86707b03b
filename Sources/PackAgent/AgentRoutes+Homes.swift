import Foundation
import Hummingbird
@_spi(Agent) import PackDelivery

extension AgentRoutes {
    /// The answer of `POST /v1/homes`.
    struct ServeAnswer: Encodable {
        /// The home's key, as events name it (its state folder).
        let home: String
        /// How many downloads the agent took now.
        let taken: Int
    }

    /// `POST /v1/homes`: serve a home (a library's queue with ``AgentUse`` hands it its downloads this way), then take
    /// every download of it that no live process runs. Body: `{"home": DIR}` for a home of one folder, or its
    /// `stateFolder`, `cachesFolder` and `documentsFolder`.
    func serve(_ request: Request) async throws -> Response {
        let body = try await Self.body(
            request, allowed: ["home", "stateFolder", "cachesFolder", "documentsFolder"], required: [])
        let home: Home
        if try body.string("home") != nil {
            home = Home(folder: URL(filePath: try body.home()).standardizedFileURL)
        } else {
            var folders: [URL] = []
            for key in ["stateFolder", "cachesFolder", "documentsFolder"] {
                guard let path = try body.string(key), path.hasPrefix("/") else {
                    throw AgentAPIError.badRequest(
                        "Name the home: \"home\", or \"stateFolder\", \"cachesFolder\" and \"documentsFolder\", as absolute paths.",
                        code: "invalidField")
                }
                folders.append(URL(filePath: path).standardizedFileURL)
            }
            home = Home(stateFolder: folders[0], cachesFolder: folders[1], documentsFolder: folders[2])
        }
        let queue = try self.homes.queue(home)
        let taken = try queue.takeOrphans()
        return Self.json(ServeAnswer(home: AgentHomes.key(home), taken: taken))
    }
}
