import ArgumentParser
import Foundation
import PackAgent
import PackDelivery

/// `--socket`, for the commands that go through the agent when it serves the home.
struct AgentOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "The agent's socket (default $XDG_RUNTIME_DIR/packs/agent.sock). When an agent answers there and serves the home, the command goes through it; else it runs here.",
            valueName: "path"))
    var socket: String?

    /// The socket path asked for, else the default one; nil when there is none (no XDG_RUNTIME_DIR).
    var path: String? {
        if let socket = self.socket { return socket }
        return try? AgentSocket.defaultPath()
    }
}

/// The agent that serves a home: commands on that home go to it, so that they act at once on the downloads it runs
/// rather than through the store within a second. Found with one `GET /v1/version?home=`; with no agent, one of
/// another version, or one that does not serve the home, commands run in-process exactly as before.
struct AgentLink {
    let client: AgentClient
    /// The home's absolute path, as the agent names it.
    let home: String

    /// The agent when one answers on the socket, is of this version and serves the home; nil otherwise.
    static func serving(_ global: GlobalOptions, _ options: AgentOptions) -> AgentLink? {
        guard let home = DetachedFetch.homePath(global), let path = options.path else { return nil }
        var info = stat()
        // No socket file: nothing to ask, and nothing to wait for.
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFSOCK else { return nil }
        let client = AgentClient(socketPath: path, clientVersion: Packs.version)
        guard let answer = try? client.send("GET", "/v1/version?home=" + Self.escaped(home), timeout: 5), answer.status == 200,
            let version = try? JSONDecoder().decode(VersionAnswer.self, from: answer.body), version.servesHome == true,
            Self.majorMinor(version.version) == Self.majorMinor(Packs.version)
        else { return nil }
        return AgentLink(client: client, home: home)
    }

    static func majorMinor(_ version: String) -> [Substring] { Array(version.split(separator: ".").prefix(2)) }

    private static let unreserved = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"

    /// A query value (a path) with everything but unreserved characters and `/` percent-encoded.
    static func escaped(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: CharacterSet(charactersIn: Self.unreserved + "/")) ?? text
    }

    /// A path segment (an id) with everything but unreserved characters percent-encoded.
    static func segment(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: CharacterSet(charactersIn: Self.unreserved)) ?? text
    }

    /// The agent stopped answering between the check and a request: said once, exit 79.
    struct Gone: Error {
        let reason: String
    }

    /// Sends one request and returns a 2xx answer's body.
    /// - Throws: the library error the agent answered with (as the in-process command would have thrown it), or
    ///   ``Gone`` when the agent no longer answers.
    func call(_ method: String, _ path: String, body: (any Encodable)? = nil) throws -> Data {
        let json = body.map { Data(AgentJSON.line($0).utf8) }
        let answer: AgentClient.Answer
        do {
            answer = try self.client.send(method, path, json: json)
        } catch {
            throw Gone(reason: "\(error.path): \(error.reason)")
        }
        guard (200..<300).contains(answer.status) else {
            if let refused = try? JSONDecoder().decode(AgentErrorBody.self, from: answer.body) { throw refused.libraryError }
            throw PackDeliveryError(.internalError, message: "The agent answered \(answer.status) with no error body.")
        }
        return answer.body
    }

    struct HomeBody: Encodable {
        let home: String
    }

    struct PriorityBody: Encodable {
        let home: String
        let priority: DownloadPriority
    }

    /// `POST /v1/downloads/{id}/ACTION` for each id in turn, stopping at the first refused, as the library does.
    func control(_ ids: [String], _ action: String) throws {
        for id in ids {
            _ = try self.call("POST", "/v1/downloads/\(Self.segment(id))/\(action)", body: HomeBody(home: self.home))
        }
    }

    func setPriority(_ ids: [String], _ priority: DownloadPriority) throws {
        for id in ids {
            _ = try self.call(
                "PUT", "/v1/downloads/\(Self.segment(id))/priority",
                body: PriorityBody(home: self.home, priority: priority))
        }
    }

    /// `GET /v1/downloads?home=`: the status, as `packs --json status` prints it.
    func status() throws -> Data {
        try self.call("GET", "/v1/downloads?home=" + Self.escaped(self.home))
    }

    /// Runs `body` against the agent, mapping what it throws as the in-process command maps its errors: a library error
    /// to its exit code and line, an agent gone away to exit 79.
    static func run<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as PackDeliveryError {
            throw fail(error)
        } catch let error as Gone {
            printError(
                "packs: The agent stopped answering on \(error.reason). Run the command again: with no agent it runs here.")
            throw ExitCode(ExitStatus.agentUnavailable)
        }
    }
}

// `finish`, `gc` and `content` through the agent.
extension AgentLink {
    struct GCBody: Encodable {
        let home: String
        let to: Int64?
        let dryRun: Bool
    }

    func finish(_ transaction: String) throws {
        _ = try self.call("POST", "/v1/transactions/\(Self.segment(transaction))/finish", body: HomeBody(home: self.home))
    }

    /// `GET /v1/content`: the packs installed and evicted, one product's or all.
    func content(_ product: String?) throws -> ContentAnswer {
        let query = "home=" + Self.escaped(self.home) + (product.map { "&product=" + Self.segment($0) } ?? "")
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        // Called outside `try?`, so that the library error the agent answers with reaches the caller.
        let body = try self.call("GET", "/v1/content?" + query)
        guard let answer = try? decoder.decode(ContentAnswer.self, from: body) else {
            throw PackDeliveryError(.internalError, message: "The agent's answer to content could not be read.")
        }
        return answer
    }

    /// `POST /v1/gc`: what went (or would go), the target and the bytes left.
    func collectGarbage(to: Int64?, dryRun: Bool) throws -> GCAnswer {
        let body = try self.call("POST", "/v1/gc", body: GCBody(home: self.home, to: to, dryRun: dryRun))
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        guard let answer = try? decoder.decode(GCAnswer.self, from: body) else {
            throw PackDeliveryError(.internalError, message: "The agent's answer to gc could not be read.")
        }
        return answer
    }
}
