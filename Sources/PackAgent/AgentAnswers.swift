import Foundation
import PackDelivery

// The bodies the agent answers with, one Codable type each: the agent encodes them and the CLI decodes them, so the
// two sides cannot drift apart (agent-openapi.yaml documents them).

/// `POST /v1/fetch`'s answer (202): the transactions recorded, with their download ids.
public struct FetchAnswer: Codable, Sendable, Equatable {
    public struct Added: Codable, Sendable, Equatable {
        public let id: String
        public let productIdentifier: String
        public let downloads: [String]

        public init(id: String, productIdentifier: String, downloads: [String]) {
            self.id = id
            self.productIdentifier = productIdentifier
            self.downloads = downloads
        }
    }

    public let transactions: [Added]

    public init(transactions: [Added]) { self.transactions = transactions }
}

/// Every non-2xx answer: `{"error": {"code": "...", "message": "..."}}`. A library error also carries its `hint`,
/// `subject` and `pendingDownloadIDs` when it has them, so that a client can say what the in-process CLI says.
public struct AgentErrorBody: Codable, Sendable, Equatable {
    public struct Detail: Codable, Sendable, Equatable {
        public let code: String
        public let message: String
        public var hint: String?
        public var subject: String?
        public var pendingDownloadIDs: [String]?

        public init(code: String, message: String, hint: String? = nil, subject: String? = nil, pendingDownloadIDs: [String]? = nil) {
            self.code = code
            self.message = message
            self.hint = hint
            self.subject = subject
            self.pendingDownloadIDs = pendingDownloadIDs
        }
    }

    public let error: Detail

    public init(error: Detail) { self.error = error }

    /// The library error the answer stands for: its code, message, hint, subject and pending downloads.
    public var libraryError: PackDeliveryError {
        PackDeliveryError(
            PackDeliveryError.Code(rawValue: self.error.code), message: self.error.message, hint: self.error.hint,
            subject: self.error.subject, pendingDownloadIDs: self.error.pendingDownloadIDs ?? [])
    }
}

/// `GET /v1/version`'s answer; `servesHome` only when `?home=` asked about a home.
public struct VersionAnswer: Codable, Sendable, Equatable {
    public let version: String
    public let api: String
    /// How many homes the agent serves.
    public let homes: Int
    /// How many clients follow `/v1/events` now.
    public let eventStreams: Int
    /// Whether the agent serves the home `?home=` named.
    public var servesHome: Bool?

    public init(version: String, api: String, homes: Int, eventStreams: Int, servesHome: Bool? = nil) {
        self.version = version
        self.api = api
        self.homes = homes
        self.eventStreams = eventStreams
        self.servesHome = servesHome
    }
}

/// `GET /v1/content`'s answer: the packs installed and evicted, in the library's own Codable shape (`contentURL` a
/// file URL, dates in ISO 8601).
public struct ContentAnswer: Codable, Sendable {
    public let installed: [InstalledContent]
    public let evicted: [EvictedContent]

    public init(installed: [InstalledContent], evicted: [EvictedContent]) {
        self.installed = installed
        self.evicted = evicted
    }
}

/// `POST /v1/use`'s answer: the packs asked for, in order; the downloads to wait for when some are not installed
/// (ask again once they finish); else each pack's installed content, in the same order.
public struct UseAnswer: Codable, Sendable {
    public let packs: [String]
    public let downloads: [String]
    public let installed: [InstalledContent]

    public init(packs: [String], downloads: [String], installed: [InstalledContent]) {
        self.packs = packs
        self.downloads = downloads
        self.installed = installed
    }
}
