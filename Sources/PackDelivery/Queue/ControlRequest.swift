import Foundation
import GRDB

/// What one process asks of a download another process runs, left in the download's `request` column and taken by
/// the owner's next tick (``Store/takeRequests(owner:)``).
///
/// Stored as text, in the form earlier versions wrote (`pause`, `cancel`, `resume`, `allowMetered`,
/// `priority:NAME`), so that processes of either version on one home understand each other. A text this version
/// does not know is not dropped: ``init(stored:)`` throws, and the owner logs it as an error with the download's id.
enum ControlRequest: Sendable, Hashable, Codable {
    case pause
    case cancel
    case resume
    case allowMetered
    case priority(DownloadPriority)

    /// The event the owner's queue machine takes for it.
    var event: QueueMachine.Event {
        switch self {
        case .pause: .pause(.user, nil)
        case .cancel: .cancel
        case .resume: .resume
        case .allowMetered: .allowMetered
        case .priority(let priority): .setPriority(priority)
        }
    }

    /// The text stored in the `request` column.
    var stored: String {
        switch self {
        case .pause: "pause"
        case .cancel: "cancel"
        case .resume: "resume"
        case .allowMetered: "allowMetered"
        case .priority(let priority): "priority:\(priority.rawValue)"
        }
    }

    /// A request read back from its stored text.
    /// - Throws: ``PackDeliveryError/Code/database`` naming the text, when it is not one of the requests above.
    init(stored text: String) throws(PackDeliveryError) {
        switch text {
        case "pause": self = .pause
        case "cancel": self = .cancel
        case "resume": self = .resume
        case "allowMetered": self = .allowMetered
        default:
            let prefix = "priority:"
            if text.hasPrefix(prefix), let priority = DownloadPriority(rawValue: String(text.dropFirst(prefix.count))) {
                self = .priority(priority)
                return
            }
            throw PackDeliveryError(
                .database,
                message: "A request of another process, '\(PackDeliveryError.printable(text))', is not one this version knows.",
                hint: "The process that left it may be of a newer version; it was ignored.")
        }
    }

    init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        do throws(PackDeliveryError) {
            try self.init(stored: text)
        } catch {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: error.message))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(self.stored)
    }
}

extension ControlRequest: DatabaseValueConvertible {
    var databaseValue: DatabaseValue { self.stored.databaseValue }

    /// Nil for a text this version does not know (GRDB's contract); ``Store/takeRequests(owner:)`` reads the text and
    /// decodes it with ``init(stored:)`` so that such a text is reported, not lost.
    static func fromDatabaseValue(_ dbValue: DatabaseValue) -> ControlRequest? {
        guard let text = String.fromDatabaseValue(dbValue) else { return nil }
        return try? ControlRequest(stored: text)
    }
}
