import CCurl
import Foundation

/// The library's side of the agent's API (`packs agent`): requests over its Unix socket with libcurl
/// (`CURLOPT_UNIX_SOCKET_PATH`), sending this library's version as `Packs-Client-Version`.
struct AgentLink: Sendable {
    struct Answer: Sendable {
        let status: Int
        let body: Data
    }

    /// The socket's path.
    let socket: String

    /// The headers every request sends.
    static let headers = ["Packs-Client-Version: \(PackDeliveryVersion.current)", "Content-Type: application/json"]

    /// The link for a configuration: its socket, or the default one; nil when the queue runs its downloads itself
    /// (``AgentUse/never``, or credentials only this process has, ``keepsCredentials(_:)``).
    static func link(for configuration: DownloadQueue.Configuration) -> AgentLink? {
        guard configuration.agent != .never, !Self.keepsCredentials(configuration),
            let socket = configuration.agentSocket ?? AgentUse.defaultSocket()
        else { return nil }
        return AgentLink(socket: socket)
    }

    /// Whether the queue authorizes its requests with what the agent does not have: a credentials provider it cannot
    /// call, or request headers of its own (a receipt is stored with the transaction, and the agent sends it).
    static func keepsCredentials(_ configuration: DownloadQueue.Configuration) -> Bool {
        configuration.credentials != nil || !configuration.transfer.headers.isEmpty
    }

    /// Asks the agent to serve a home: it opens the home's queue (once) and takes every download of it that no live
    /// process runs, those this queue just gave up among them.
    /// - Throws: `agentUnavailable` when nothing answers on the socket, or the agent refuses (another version, a home
    ///   it cannot open), naming why.
    func serve(_ home: Home) throws(PackDeliveryError) {
        let body = [
            "stateFolder": home.stateFolder.standardizedFileURL.path, "cachesFolder": home.cachesFolder.standardizedFileURL.path,
            "documentsFolder": home.documentsFolder.standardizedFileURL.path,
        ]
        let json = (try? JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])) ?? Data()
        let answer = try self.request("POST", "/v1/homes", json: json)
        guard (200..<300).contains(answer.status) else {
            let refused =
                ((try? JSONSerialization.jsonObject(with: answer.body)) as? [String: Any])?["error"] as? [String: Any]
            let message = refused?["message"] as? String ?? "HTTP \(answer.status)"
            throw PackDeliveryError(
                .agentUnavailable, message: "The agent refused to serve the home: \(PackDeliveryError.printable(message))",
                hint: "Restart the agent with the same version as this library, or run the downloads in this process.",
                subject: self.socket, httpStatus: answer.status)
        }
    }

    /// One request, its whole answer read.
    func request(_ method: String, _ path: String, json: Data? = nil, timeout: TimeInterval = 30) throws(PackDeliveryError) -> Answer {
        Curl.globalInit()
        let easy = try CurlEasy(url: URL(string: "http://localhost\(path)")!)
        try easy.set(CURLOPT_UNIX_SOCKET_PATH, string: self.socket)
        try easy.set(CURLOPT_FOLLOWLOCATION, long: 0)
        try easy.set(CURLOPT_TIMEOUT_MS, long: Int(timeout * 1000))
        try easy.set(CURLOPT_CONNECTTIMEOUT_MS, long: 2000)
        try easy.setHeaders(Self.headers)
        if let json {
            try easy.set(CURLOPT_POSTFIELDSIZE, long: json.count)
            try easy.set(CURLOPT_COPYPOSTFIELDS, string: String(decoding: json, as: UTF8.self))
        }
        if method != "GET", method != "POST" { try easy.set(CURLOPT_CUSTOMREQUEST, string: method) }
        let (code, data, _) = easy.performCollecting(limit: 16 << 20)
        guard code == CURLE_OK else {
            // libcurl names "localhost port 80" for a Unix socket it could not reach; the system's reason is the one to show.
            let errno = easy.osErrno
            let reason = code == CURLE_COULDNT_CONNECT && errno != 0 ? String(cString: strerror(errno)) : easy.errorMessage(code)
            throw PackDeliveryError(
                .agentUnavailable,
                message: "No agent answers on \(self.socket): \(PackDeliveryError.printable(reason)).",
                hint: "Start it with `systemctl --user start packs-agent.socket`, or run the downloads in this process.",
                subject: self.socket, underlying: .init(.curl, Int(code.rawValue)))
        }
        return Answer(status: easy.responseCode, body: data)
    }
}
