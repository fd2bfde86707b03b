import Foundation
import Logging
import PackDelivery
import PackTestSupport
import Testing

@testable import PackAgent

/// The agent's HTTP API against its OpenAPI document (Sources/PackAgent/agent-openapi.yaml), and its refusals:
/// malformed requests, unknown fields, another client version.
@Suite(.serialized, .timeLimit(.minutes(3))) struct AgentAPITests {
    static let documentURL = CLI.packageRoot.appending(path: "Sources/PackAgent/agent-openapi.yaml")

    /// The document's operations, read line by line: path → method → (status codes; required fields of the 2xx body).
    struct Document {
        struct Operation {
            var statuses: Set<Int> = []
            var schema: String?
        }
        var operations: [String: [String: Operation]] = [:]
        var required: [String: [String]] = [:]

        init(_ text: String) {
            var path: String?
            var method: String?
            var schemaName: String?
            for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
                if let match = line.wholeMatch(of: #/  (/v1/[^:]*):/#) {
                    path = String(match.1)
                    method = nil
                } else if let match = line.wholeMatch(of: #/    (get|post|put|delete):/#), let path {
                    method = match.1.uppercased()
                    self.operations[path, default: [:]][String(method!)] = Operation()
                } else if let match = line.firstMatch(of: /^        "([0-9]{3})":(.*)$/), let path, let method {
                    self.operations[path]?[method]?.statuses.insert(Int(match.1)!)
                    if match.1.hasPrefix("2"), let schema = match.2.firstMatch(of: /(?:schemas|responses)\/([A-Za-z]+)/) {
                        self.operations[path]?[method]?.schema = String(schema.1)
                    }
                } else if let match = line.firstMatch(of: /^              schema: \{\$ref: "#\/components\/schemas\/([A-Za-z]+)"\}/),
                    let path, let method, self.operations[path]?[method]?.schema == nil
                {
                    self.operations[path]?[method]?.schema = String(match.1)
                } else if line.hasPrefix("components:") {
                    path = nil
                } else if let match = line.wholeMatch(of: #/    ([A-Z][A-Za-z]+):/#) {
                    schemaName = String(match.1)
                } else if let match = line.firstMatch(of: /^      required: \[(.*)\]/), let schemaName {
                    self.required[schemaName] = match.1.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                }
            }
        }
    }

    static func document() throws -> Document {
        Document(try String(contentsOf: Self.documentURL, encoding: .utf8))
    }

    @Test func everyRouteIsDocumentedAndEveryDocumentedPathIsRouted() throws {
        let folder = try Fixtures.temporaryDirectory("agent-routes")
        defer { try? FileManager.default.removeItem(at: folder) }
        let events = AgentEventLog()
        let homes = AgentHomes(stateFolder: folder, events: events, logger: Logger(label: "test")) { .init() }
        let router = AgentRoutes(homes: homes, events: events, version: "0.1.0", keepAlive: .seconds(1)).router()
        let routed = Set(router.routes.map { "\($0.method) \($0.path)" })
        let document = try Self.document()
        let documented = Set(document.operations.flatMap { path, methods in methods.keys.map { "\($0) \(path)" } })
        #expect(
            routed == documented,
            "routed but not documented: \(routed.subtracting(documented)); documented but not routed: \(documented.subtracting(routed))")
        #expect(routed.count == 13, "\(routed.sorted())")
    }

    /// Checks an answer against the document: its status is listed for the operation, and a 2xx body has the
    /// schema's required top-level fields (an error body: `error.code` and `error.message`).
    static func conforms(_ answer: AgentProcess.Answer, _ method: String, _ path: String, _ document: Document) -> Bool {
        guard let operation = document.operations[path]?[method] else {
            Issue.record("\(method) \(path) is not in the document")
            return false
        }
        #expect(
            operation.statuses.contains(answer.status),
            "\(method) \(path) answered \(answer.status), documented \(operation.statuses.sorted())")
        if answer.status >= 300 {
            #expect(answer.errorCode != nil && answer.errorMessage != nil, "\(method) \(path): error shape: \(answer.body)")
            return operation.statuses.contains(answer.status)
        }
        let schema = operation.schema == "Download" ? "Download" : operation.schema ?? ""
        for field in document.required[schema] ?? [] {
            #expect(answer.json[field] != nil, "\(method) \(path): \(field) missing in \(answer.body)")
        }
        return operation.statuses.contains(answer.status)
    }

    @Test func realAnswersMatchTheDocument() throws {
        let folder = try Fixtures.temporaryDirectory("agent-api")
        defer { try? FileManager.default.removeItem(at: folder) }
        let site = try TestSite.random("agent-api-site", size: 2_000_000)
        let server = try FaultServer(root: site.folder)
        defer {
            server.stop()
            try? FileManager.default.removeItem(at: site.folder)
        }
        let packURL = server.url("big.tar", fault: .slow(bytesPerSecond: 200_000))
        try site.editManifest { $0.products[0].contents[0].url = packURL.absoluteString }
        let document = try Self.document()
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home").path
        let check = { (answer: AgentProcess.Answer, method: String, path: String) in #expect(Self.conforms(answer, method, path, document))
        }

        check(try agent.request("GET", "/v1/version"), "GET", "/v1/version")
        check(try agent.request("GET", "/v1/downloads?home=\(home)"), "GET", "/v1/downloads")
        let fetch = try agent.request(
            "POST", "/v1/fetch",
            body: jsonBody(["home": home, "manifest": server.url("manifest.json").absoluteString, "products": ["com.example.big"]]))
        #expect(fetch.status == 202, "\(fetch.body)")
        check(fetch, "POST", "/v1/fetch")
        let id = try #require(((fetch.json["transactions"] as? [[String: Any]])?.first?["downloads"] as? [String])?.first)
        for action in ["pause", "resume"] {
            check(
                try agent.request("POST", "/v1/downloads/\(id)/\(action)", body: jsonBody(["home": home])), "POST",
                "/v1/downloads/{id}/\(action)")
        }
        let priority = try agent.request(
            "PUT", "/v1/downloads/\(id)/priority", body: jsonBody(["home": home, "priority": "userInitiated"]))
        check(priority, "PUT", "/v1/downloads/{id}/priority")
        #expect(priority.json["priority"] as? String == "userInitiated", "\(priority.body)")
        let unknown = try agent.request("POST", "/v1/downloads/d-nothere/pause", body: jsonBody(["home": home]))
        #expect(unknown.status == 404)
        check(unknown, "POST", "/v1/downloads/{id}/pause")
        let cancel = try agent.request("POST", "/v1/downloads/\(id)/cancel", body: jsonBody(["home": home]))
        check(cancel, "POST", "/v1/downloads/{id}/cancel")
        #expect(cancel.json["state"] as? String == "cancelled", "\(cancel.body)")
        let finish = try agent.request("POST", "/v1/transactions/t-nothere/finish", body: jsonBody(["home": home]))
        #expect(finish.status == 404, "\(finish.body)")
        check(finish, "POST", "/v1/transactions/{id}/finish")
        let gc = try agent.request("POST", "/v1/gc", body: #"{"home": "\#(home)", "to": 0, "dryRun": true}"#)
        #expect(gc.status == 200, "\(gc.body)")
        check(gc, "POST", "/v1/gc")
        check(try agent.request("GET", "/v1/content?home=\(home)"), "GET", "/v1/content")
        let unknownProduct = try agent.request(
            "POST", "/v1/fetch",
            body: jsonBody(["home": home, "manifest": server.url("manifest.json").absoluteString, "products": ["nope"]]))
        #expect(unknownProduct.status == 422)
        check(unknownProduct, "POST", "/v1/fetch")
        #expect(try agent.stop() == 0)
    }

    @Test func aMalformedRequestIs400AndChangesNothing() throws {
        let folder = try Fixtures.temporaryDirectory("agent-400")
        defer { try? FileManager.default.removeItem(at: folder) }
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let bodies = [
            ("{\"home\": ", "malformedJSON"), ("[1, 2]", "malformedJSON"),
            (jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json", "products": ["p"], "extra": 1]), "unknownField"),
            (jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json"]), "missingField"),
            (jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json", "products": "p"]), "invalidField"),
            (jsonBody(["home": "relative", "manifest": "http://127.0.0.1:9/m.json", "products": ["p"]]), "invalidField"),
            (
                jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json", "products": ["p"], "priority": "soon"]),
                "invalidField"
            ),
            // A receipt goes into a request header: one with a line break or a space would forge headers.
            (
                jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json", "products": ["p"], "receipt": "abc\r\nX-Forged: 1"]),
                "invalidField"
            ),
            (jsonBody(["home": home.path, "manifest": "http://127.0.0.1:9/m.json", "products": ["p"], "receipt": "a b"]), "invalidField"),
        ]
        for (body, code) in bodies {
            let answer = try agent.request("POST", "/v1/fetch", body: body)
            #expect(answer.status == 400, "\(body): \(answer.body)")
            #expect(answer.errorCode == code, "\(body): \(answer.body)")
            #expect(answer.errorMessage?.isEmpty == false)
            #expect(!answer.body.contains("X-Forged") && !answer.body.contains("a b"), "a refused receipt is not echoed: \(answer.body)")
        }
        let control = try agent.request("POST", "/v1/downloads/d-1/pause", body: jsonBody(["home": home.path, "priority": "essential"]))
        #expect(control.status == 400 && control.errorCode == "unknownField", "\(control.body)")
        #expect(!FileManager.default.fileExists(atPath: home.path), "no store was created for a refused request")
        let version = try agent.request("GET", "/v1/version")
        #expect(version.json["homes"] as? Int == 0, "no home is served: \(version.body)")
        let unknownRoute = try agent.request("GET", "/v1/nothing")
        #expect(unknownRoute.status == 404 && unknownRoute.errorCode == "notFound", "\(unknownRoute.body)")
        #expect(try agent.stop() == 0)
    }

    /// A status or content read of a path with no home (a typo, a home not made yet) answers empty: it creates no folder,
    /// and the agent does not serve the path, so it is not opened again at each start.
    @Test func readingAHomeThatDoesNotExistCreatesAndServesNothing() throws {
        let folder = try Fixtures.temporaryDirectory("agent-no-home")
        defer { try? FileManager.default.removeItem(at: folder) }
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "typo/home").path
        let status = try agent.request("GET", "/v1/downloads?home=\(home)")
        #expect(status.status == 200 && (status.json["transactions"] as? [Any])?.isEmpty == true, "\(status.body)")
        let content = try agent.request("GET", "/v1/content?home=\(home)&product=com.example.big")
        #expect(content.status == 200, "\(content.body)")
        #expect((content.json["installed"] as? [Any])?.isEmpty == true && (content.json["evicted"] as? [Any])?.isEmpty == true)
        #expect(!FileManager.default.fileExists(atPath: folder.appending(path: "typo").path), "no folder was created")
        let version = try agent.request("GET", "/v1/version?home=\(home)")
        #expect(version.json["homes"] as? Int == 0 && version.json["servesHome"] as? Bool == false, "\(version.body)")
        #expect(try agent.stop() == 0)
        let saved = folder.appending(path: "state/packs/agent-homes.json")
        let savedText = (try? String(contentsOf: saved, encoding: .utf8)) ?? ""
        #expect(!savedText.contains("typo"), "the path is not kept to be served again: \(savedText)")
    }

    @Test func anotherClientVersionIsRefusedWith409NamingBoth() throws {
        let folder = try Fixtures.temporaryDirectory("agent-409")
        defer { try? FileManager.default.removeItem(at: folder) }
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home").path
        let mismatch = try agent.request("GET", "/v1/downloads?home=\(home)", version: "0.9.0")
        #expect(mismatch.status == 409)
        #expect(mismatch.errorCode == "versionMismatch")
        #expect(mismatch.errorMessage?.contains("0.9.0") == true && mismatch.errorMessage?.contains("0.2.0") == true, "\(mismatch.body)")
        #expect(try agent.request("GET", "/v1/downloads?home=\(home)", version: "0.2.7").status == 200, "patch versions may differ")
        let missing = try agent.request("GET", "/v1/downloads?home=\(home)", version: nil)
        #expect(missing.status == 400 && missing.errorCode == "missingClientVersion", "\(missing.body)")
        #expect(try agent.stop() == 0)
    }

    @Test func anEventStreamResumedWithLastEventIDMissesNothing() throws {
        let folder = try Fixtures.temporaryDirectory("agent-sse")
        defer { try? FileManager.default.removeItem(at: folder) }
        let site = try TestSite.random("agent-sse-site", size: 600_000)
        let server = try FaultServer(root: site.folder)
        defer {
            server.stop()
            try? FileManager.default.removeItem(at: site.folder)
        }
        let packURL = server.url("big.tar", fault: .slow(bytesPerSecond: 300_000))
        try site.editManifest { $0.products[0].contents[0].url = packURL.absoluteString }
        let agent = try AgentProcess(folder: folder)
        let home = folder.appending(path: "home")
        let first = try EventStreamClient(socket: agent.socket)
        try waitUntil("the first stream counted", timeout: 10) { try agent.request("GET", "/v1/version").json["eventStreams"] as? Int == 1 }
        let result = try CLI.run(
            home: home, ["fetch", "--detach", "--socket", agent.socket, server.url("manifest.json").absoluteString, "com.example.big"])
        #expect(result.status == 0, "\(result.stderr)")
        try waitUntil("three events on the first stream", timeout: 20) { first.events.count >= 3 }
        first.kill()
        let seen = first.events
        let finished = { (events: [EventStreamClient.Event]) in
            events.contains { $0.kind == "download" && $0.data.contains("\"state\":\"finished\"") }
        }
        try waitUntil("the download finished") {
            FileManager.default.fileExists(atPath: home.appending(path: "Caches/com.example.big").path)
        }
        let second = try EventStreamClient(socket: agent.socket, lastEventID: "\(seen.last!.id)")
        try waitUntil("the missed events replayed", timeout: 20) { finished(second.events) }
        let ids = (seen + second.events).map(\.id)
        #expect(ids == Array(1...UInt64(ids.count)), "every id once, in order: \(ids)")
        #expect(second.events.allSatisfy { $0.data.contains("\"home\":\"\(home.path)\"") })
        second.kill()
        // A cursor the agent never gave (an earlier agent's): a reset, then the stream.
        let third = try EventStreamClient(socket: agent.socket, lastEventID: "999999")
        try waitUntil("a reset event", timeout: 10) { third.events.first?.kind == "reset" }
        third.kill()
        #expect(try agent.stop() == 0)
    }

    /// One error type on both sides: what the agent writes for a library error, a client reads back as that error.
    @Test func aLibraryErrorAnsweredByTheAgentReadsBackAsTheSameError() throws {
        let refused = PackDeliveryError(
            .finishRefused, message: "Some downloads are not finished.", hint: "Wait.", subject: "t-1", pendingDownloadIDs: ["d-1", "d-2"])
        let answer = AgentAPIError(refused)
        #expect(answer.status == .conflict)
        let body = try JSONDecoder().decode(AgentErrorBody.self, from: Data(answer.body.utf8))
        #expect(body.error.code == "finishRefused" && body.error.message == refused.message, "\(answer.body)")
        let error = body.libraryError
        #expect(error.code == .finishRefused && error.hint == "Wait." && error.subject == "t-1")
        #expect(error.pendingDownloadIDs == ["d-1", "d-2"])
        let plain = AgentAPIError.badRequest("The body is not a JSON object.", code: "malformedJSON")
        #expect(plain.body == #"{"error":{"code":"malformedJSON","message":"The body is not a JSON object."}}"#)
        let fetch = FetchAnswer(transactions: [.init(id: "t-1", productIdentifier: "p", downloads: ["d-1"])])
        #expect(try JSONDecoder().decode(FetchAnswer.self, from: Data(AgentJSON.line(fetch).utf8)) == fetch)
    }
}
