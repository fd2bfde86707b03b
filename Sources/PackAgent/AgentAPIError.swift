import Foundation
import HTTPTypes
import PackDelivery

/// One line of compact JSON as `--json` prints it: keys sorted, `/` not escaped, dates in ISO 8601.
public enum AgentJSON {
    public static func line(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        // Encoding fails only for a progress or time that is not a finite number.
        guard let data = try? encoder.encode(value) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }

    /// Reads what ``line(_:)`` writes (dates in ISO 8601).
    public static var decoder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// Every non-2xx answer of the agent: `{"error": {"code": "...", "message": "..."}}` with its HTTP status.
struct AgentAPIError: Error, Sendable {
    let status: HTTPResponse.Status
    /// The code and message, with the library's hint, subject and pending downloads for a library error.
    let detail: AgentErrorBody.Detail

    var code: String { self.detail.code }
    var message: String { self.detail.message }

    var body: String { AgentJSON.line(AgentErrorBody(error: self.detail)) }

    static func badRequest(_ message: String, code: String = "badRequest") -> Self {
        Self(status: .badRequest, code: code, message: message)
    }

    /// A library error: its code, its message (which never carries credentials), and the status its kind means.
    init(_ error: PackDeliveryError) {
        self.detail = AgentErrorBody.Detail(
            code: error.code.rawValue, message: error.message, hint: error.hint, subject: error.subject,
            pendingDownloadIDs: error.pendingDownloadIDs.isEmpty ? nil : error.pendingDownloadIDs)
        switch error.code {
        case .unknownDownload, .unknownTransaction, .notInstalled: self.status = .notFound
        case .finishRefused, .queueClosed: self.status = .conflict
        default:
            switch error.kind {
            case .usage: self.status = .badRequest
            case .badData: self.status = .unprocessableContent
            case .network: self.status = .badGateway
            case .unauthorized: self.status = .forbidden
            case .insufficientStorage: self.status = .init(code: 507, reasonPhrase: "Insufficient Storage")
            case .io: self.status = .internalServerError
            case .cancelled: self.status = .conflict
            }
        }
    }

    init(status: HTTPResponse.Status, code: String, message: String) {
        self.status = status
        self.detail = AgentErrorBody.Detail(code: code, message: message)
    }
}

/// Reads a request body as one JSON object with only the fields allowed and all the fields required, each of the
/// type asked for; anything else is a 400 and nothing happens.
struct StrictBody {
    private let object: [String: Any]

    init(_ data: Data, allowed: Set<String>, required: Set<String>) throws(AgentAPIError) {
        guard let value = try? JSONSerialization.jsonObject(with: data), let object = value as? [String: Any] else {
            throw .badRequest("The body is not a JSON object.", code: "malformedJSON")
        }
        if let unknown = object.keys.sorted().first(where: { !allowed.contains($0) }) {
            throw .badRequest("Unknown field '\(PackDeliveryError.printable(unknown))'.", code: "unknownField")
        }
        if let missing = required.sorted().first(where: { object[$0] == nil }) {
            throw .badRequest("The field '\(missing)' is required.", code: "missingField")
        }
        self.object = object
    }

    /// The field's JSON value as JSONSerialization reads it.
    func value(_ key: String) -> Any? { self.object[key] }

    func string(_ key: String) throws(AgentAPIError) -> String? {
        guard let value = self.object[key] else { return nil }
        guard let string = value as? String, !string.isEmpty else {
            throw .badRequest("The field '\(key)' must be a non-empty string.", code: "invalidField")
        }
        return string
    }

    func strings(_ key: String) throws(AgentAPIError) -> [String]? {
        guard let value = self.object[key] else { return nil }
        guard let strings = value as? [String], !strings.isEmpty, strings.allSatisfy({ !$0.isEmpty }) else {
            throw .badRequest("The field '\(key)' must be a non-empty array of non-empty strings.", code: "invalidField")
        }
        return strings
    }

    /// A receipt (a signed token, presented as `Authorization: Bearer`): printable ASCII with no space, at most 64 KiB,
    /// so that it cannot forge a header. Never echoed.
    func receipt() throws(AgentAPIError) -> String? {
        guard let receipt = try self.string("receipt") else { return nil }
        guard receipt.utf8.count <= 64 << 10, receipt.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw .badRequest(
                "The field 'receipt' must be a receipt token: printable ASCII, no spaces or line breaks, at most 64 KiB.",
                code: "invalidField")
        }
        return receipt
    }

    /// An absolute home path.
    func home() throws(AgentAPIError) -> String {
        guard let home = try self.string("home"), home.hasPrefix("/") else {
            throw .badRequest("The field 'home' must be an absolute path.", code: "invalidField")
        }
        return home
    }

    func priority() throws(AgentAPIError) -> DownloadPriority? {
        guard let word = try self.string("priority") else { return nil }
        guard let priority = DownloadPriority(rawValue: word) else {
            throw .badRequest(
                "The field 'priority' must be one of " + DownloadPriority.allCases.map(\.rawValue).joined(separator: ", ") + ".",
                code: "invalidField")
        }
        return priority
    }
}
