import Foundation

/// An error PackDelivery reports: a stable ``code`` to match, one sentence for people, and the facts an app needs.
///
/// Match errors by ``code`` (with `==` or `switch`), never by message text:
/// ```swift
/// do { try queue.finish(transaction.id) } catch {
///     switch error.code {
///     case .finishRefused: showPending(error.pendingDownloadIDs)
///     case .unknownTransaction: break
///     default: report(error)
///     }
/// }
/// ```
/// New codes may be added in later versions, so a `switch` over codes needs a `default`. The number
/// behind an error (an errno, a libcurl or libarchive code, an HTTP status, an SQLite result code)
/// keeps its namespace in ``underlying``. Messages and hints never name a command-line tool and
/// never show credentials: URLs appear without their query string and user info.
public struct PackDeliveryError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A stable identifier for each case an app may handle.
    ///
    /// A struct with a static constant per code, not an enum, so that a later version can add codes without breaking
    /// the code that matches them: compare with `==` (`error.code == .finishRefused`, or `catch where …`), and give a
    /// `switch` over codes a `default`.
    public struct Code: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
        /// The code's name, as stored and printed (`"finishRefused"`).
        public let rawValue: String
        /// A code from its name; unknown names are kept as they are.
        ///
        /// - Parameter rawValue: the code's name.
        public init(rawValue: String) { self.rawValue = rawValue }
        init(_ rawValue: String) { self.rawValue = rawValue }
        /// The code's name.
        public var description: String { self.rawValue }

        // Asked for something impossible.
        /// `finish` was refused: some downloads are neither finished nor cancelled (see ``pendingDownloadIDs``).
        public static let finishRefused = Code("finishRefused")
        /// No transaction has this id.
        public static let unknownTransaction = Code("unknownTransaction")
        /// No download has this id.
        public static let unknownDownload = Code("unknownDownload")
        /// The manifest lists no product with this identifier.
        public static let unknownProduct = Code("unknownProduct")
        /// Nothing is installed for this product.
        public static let notInstalled = Code("notInstalled")
        /// The queue was closed; open a new one.
        public static let queueClosed = Code("queueClosed")
        /// An argument is out of range or malformed.
        public static let invalidArgument = Code("invalidArgument")

        // The manifest.
        /// The manifest cannot be read or is not a valid manifest.
        public static let invalidManifest = Code("invalidManifest")
        /// The manifest's signature is missing or wrong, it expired, or it is older than one already accepted.
        public static let untrustedManifest = Code("untrustedManifest")
        /// A publisher key the home trusts no longer reads as a key (see ``subject`` for its id): the home refuses every
        /// manifest until the key is removed (``DownloadQueue/untrust(id:)``) and trusted again.
        public static let unreadableTrustedKey = Code("unreadableTrustedKey")
        /// The content identifier is already installed for another product, or names a file the home uses.
        public static let contentIdentifierTaken = Code("contentIdentifierTaken")

        // The server and the network.
        /// The server answered with an HTTP status that will not change by retrying (see ``httpStatus``).
        public static let httpStatus = Code("httpStatus")
        /// The server refused the credentials (401 or 403), even after renewing them.
        public static let unauthorized = Code("unauthorized")
        /// The host could not be resolved or reached.
        public static let networkUnreachable = Code("networkUnreachable")
        /// No answer for too long: the connect timeout, or no data for the stall timeout.
        public static let timedOut = Code("timedOut")
        /// Data arrived, but slower than the low-speed limit over the whole window, on every attempt allowed (a server
        /// that trickles); the message names the rate measured.
        public static let tooSlow = Code("tooSlow")
        /// Another network failure (connection reset, TLS, protocol error, redirect loop).
        public static let networkFailure = Code("networkFailure")
        /// The URL's scheme is not allowed (only http and https, and file for a local manifest).
        public static let unsupportedURL = Code("unsupportedURL")
        /// The server's file is longer or shorter than the manifest's `contentLength`.
        public static let lengthMismatch = Code("lengthMismatch")
        /// The pack's SHA-256 differs from the manifest's.
        public static let checksumMismatch = Code("checksumMismatch")

        // The pack.
        /// An entry would escape or abuse the install folder.
        public static let unsafeEntry = Code("unsafeEntry")
        /// The pack is not a readable archive, or is damaged.
        public static let corruptArchive = Code("corruptArchive")
        /// The pack is encrypted; encrypted packs are not supported.
        public static let encryptedArchive = Code("encryptedArchive")
        /// The pack unpacks to more bytes or entries than allowed (a possible decompression bomb).
        public static let unpackLimitExceeded = Code("unpackLimitExceeded")
        /// The pack holds no entry, and the manifest does not say it is empty.
        public static let emptyPack = Code("emptyPack")
        /// The pack's `ContentInfo.plist` is unreadable or names another product or version.
        public static let contentInfoMismatch = Code("contentInfoMismatch")
        /// The pack's index (named in the manifest, and matching its SHA-256) does not describe the pack: a file of
        /// the pack is not in it, a file it lists is not in the pack, or a file has another size or kind (see
        /// ``subject`` for the path). The files' SHA-256 would be taken from it, so nothing is installed.
        public static let indexMismatch = Code("indexMismatch")
        /// The key given for a preload pack is not the one it is encrypted with (see ``subject`` for the pack); the
        /// encrypted pack is kept.
        public static let preloadKeyMismatch = Code("preloadKeyMismatch")
        /// A preload pack does not decrypt with its key: its bytes were changed (see ``subject`` for the pack); the
        /// encrypted pack is kept and nothing is installed.
        public static let preloadDecryptionFailed = Code("preloadDecryptionFailed")
        /// The key server refused a preload pack's key for good (``httpStatus``: 401 or 403 without `Retry-After`, a
        /// credential that does not cover the product; 404 or 410, a key it does not hand out), or sent another key:
        /// the download stays paused (``PauseReason/awaitingRelease``) with its encrypted bytes, and its key is not asked
        /// for again until it is resumed (with other credentials, or once the server is fixed). See ``subject`` for the
        /// pack.
        public static let preloadKeyRefused = Code("preloadKeyRefused")

        // This machine.
        /// Not enough free space (see ``neededBytes`` and ``availableBytes``).
        public static let insufficientStorage = Code("insufficientStorage")
        /// A local file operation failed (see ``underlying`` for the errno).
        public static let fileSystem = Code("fileSystem")
        /// The process ran out of file descriptors (EMFILE/ENFILE).
        public static let tooManyOpenFiles = Code("tooManyOpenFiles")
        /// The machine's settings file (``MachineSettings``) does not read as settings; see ``subject`` for its path.
        public static let invalidSettings = Code("invalidSettings")
        /// The state database failed (see ``underlying`` for the SQLite result code).
        public static let database = Code("database")
        /// The state database stayed locked by another process for too long.
        public static let databaseBusy = Code("databaseBusy")
        /// The state database was damaged; it was moved aside and rebuilt from the installed content.
        public static let databaseCorrupt = Code("databaseCorrupt")
        /// An active download made no progress for too long and retrying did not help.
        public static let stalled = Code("stalled")
        /// Installed content is missing files or has changed files.
        public static let contentDamaged = Code("contentDamaged")
        /// The operation was stopped (pause, cancel, shutdown).
        public static let cancelled = Code("cancelled")
        /// An internal failure; please report it.
        public static let internalError = Code("internalError")
        /// ``AgentUse/required``, and no agent answers on its socket (``DownloadQueue/Configuration/agentSocket``), or it
        /// is of another version or refused the home: start `packs agent`, or use ``AgentUse/automatic``.
        public static let agentUnavailable = Code("agentUnavailable")

        /// The broad class of the code.
        public var kind: Kind {
            switch self {
            case .finishRefused, .unknownTransaction, .unknownDownload, .notInstalled, .queueClosed, .invalidArgument: .usage
            case .unknownProduct, .invalidManifest, .untrustedManifest, .unreadableTrustedKey, .contentIdentifierTaken, .lengthMismatch,
                .checksumMismatch,
                .unsafeEntry, .corruptArchive, .encryptedArchive, .unpackLimitExceeded, .emptyPack, .contentInfoMismatch,
                .unsupportedURL, .contentDamaged, .indexMismatch, .invalidSettings, .preloadKeyMismatch, .preloadDecryptionFailed:
                .badData
            case .httpStatus, .networkUnreachable, .timedOut, .tooSlow, .networkFailure, .stalled: .network
            case .unauthorized: .unauthorized
            case .preloadKeyRefused: .unauthorized
            case .insufficientStorage: .insufficientStorage
            case .cancelled: .cancelled
            default: .io
            }
        }
    }

    /// The broad class of an error.
    ///
    /// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
    public enum Kind: String, Sendable, Hashable, Codable {
        /// `usage`: the caller asked for something impossible; `badData`: the manifest, the pack or the server's
        /// file is wrong; `network`: the server or the network failed after retries; `unauthorized`: the server
        /// refused the credentials; `insufficientStorage`: not enough free space; `io`: a local file or database
        /// failure; `cancelled`: stopped on request.
        case usage, badData, network, unauthorized, insufficientStorage, io, cancelled
    }

    /// The number behind an error, in its own namespace.
    public struct Underlying: Sendable, Hashable, Codable, CustomStringConvertible {
        /// Where the number comes from.
        public enum Domain: String, Sendable, Hashable, Codable {
            /// `errno`: a C library errno; `curl`: a libcurl `CURLcode`; `libarchive`: libarchive's errno;
            /// `http`: an HTTP status; `sqlite`: an SQLite extended result code.
            case errno, curl, libarchive, http, sqlite
        }
        /// The namespace of ``value``.
        public let domain: Domain
        /// The number.
        public let value: Int
        /// Creates an underlying code.
        ///
        /// - Parameters:
        ///   - domain: the namespace.
        ///   - value: the number.
        public init(_ domain: Domain, _ value: Int) {
            self.domain = domain
            self.value = value
        }
        /// `domain value`, for example `errno 28`.
        public var description: String { "\(self.domain.rawValue) \(self.value)" }
    }

    /// The error's fields, out of line: an error is large, and a download that has none still holds room for one (a
    /// queue holds a download for each of its downloads; case 19 of the benchmark, 100,000).
    private let fields: OutOfLine<Fields>
    private struct Fields: Sendable, Hashable {
        var code: Code
        var message: String
        var hint: String?
        var subject: String?
        var underlying: Underlying?
        var httpStatus: Int?
        var pendingDownloadIDs: [String]
        var neededBytes: Int64?
        var availableBytes: Int64?
    }

    /// What went wrong, as a stable code.
    public var code: Code { self.fields.value.code }
    /// One human sentence: what happened.
    public var message: String { self.fields.value.message }
    /// What to do next, when there is a useful hint (never names a command).
    public var hint: String? { self.fields.value.hint }
    /// The archive entry, URL (without credentials) or file the error is about, when there is one.
    public var subject: String? { self.fields.value.subject }
    /// The number behind the error (errno, libcurl, libarchive, HTTP, SQLite), when there is one.
    public var underlying: Underlying? { self.fields.value.underlying }
    /// For `httpStatus` and `unauthorized`: the server's status.
    public var httpStatus: Int? { self.fields.value.httpStatus }
    /// For `finishRefused`: the downloads that are neither finished nor cancelled.
    public var pendingDownloadIDs: [String] { self.fields.value.pendingDownloadIDs }
    /// For `insufficientStorage`: bytes needed, when measured.
    public var neededBytes: Int64? { self.fields.value.neededBytes }
    /// For `insufficientStorage`: bytes available, when measured.
    public var availableBytes: Int64? { self.fields.value.availableBytes }

    /// The broad class of the error (derived from ``code``).
    public var kind: Kind { self.code.kind }

    /// Creates an error; the library's own errors come from the static factories.
    ///
    /// - Parameters:
    ///   - code: what went wrong.
    ///   - message: one human sentence: what happened.
    ///   - hint: what to do next, if anything useful.
    ///   - subject: the archive entry, URL or file the error is about.
    ///   - underlying: the number behind the error.
    ///   - httpStatus: the HTTP status, for HTTP errors.
    ///   - pendingDownloadIDs: for a refused finish, the pending downloads.
    ///   - neededBytes: for `insufficientStorage`, the bytes needed.
    ///   - availableBytes: for `insufficientStorage`, the bytes available.
    public init(
        _ code: Code, message: String, hint: String? = nil, subject: String? = nil, underlying: Underlying? = nil,
        httpStatus: Int? = nil, pendingDownloadIDs: [String] = [], neededBytes: Int64? = nil, availableBytes: Int64? = nil
    ) {
        self.fields = OutOfLine(
            Fields(
                code: code, message: Self.oneLine(message), hint: hint.map(Self.oneLine), subject: subject, underlying: underlying,
                httpStatus: httpStatus, pendingDownloadIDs: pendingDownloadIDs, neededBytes: neededBytes,
                availableBytes: availableBytes))
    }

    /// The message, followed by the hint when there is one.
    public var description: String {
        if let hint { return "\(self.message) \(hint)" }
        return self.message
    }

    /// The same error with another hint.
    func withHint(_ hint: String?) -> Self {
        Self(
            self.code, message: self.message, hint: hint, subject: self.subject, underlying: self.underlying, httpStatus: self.httpStatus,
            pendingDownloadIDs: self.pendingDownloadIDs, neededBytes: self.neededBytes, availableBytes: self.availableBytes)
    }

    /// Messages are one line: library texts (libarchive's, servers') may end in or hold line breaks and control characters.
    /// Bidirectional controls that a message took from outside raw are escaped as ``printable(_:)`` escapes them.
    static func oneLine(_ text: String) -> String {
        var result = ""
        result.unicodeScalars.reserveCapacity(text.unicodeScalars.count)
        var lastWasSpace = false
        for scalar in text.unicodeScalars {
            if scalar.properties.generalCategory == .control || scalar == "\u{2028}" || scalar == "\u{2029}" {
                if !lastWasSpace { result.unicodeScalars.append(" ") }
                lastWasSpace = true
            } else if Self.needsEscape(scalar) {
                result += Self.printable(String(scalar))
                lastWasSpace = false
            } else {
                result.unicodeScalars.append(scalar)
                lastWasSpace = scalar == " "
            }
        }
        return result.trimmingCharacters(in: .whitespaces)
    }
}

// MARK: - Codable (stored with downloads, printed as JSON)

extension PackDeliveryError: Codable {
    private enum CodingKeys: String, CodingKey {
        case code, kind, message, hint, subject, underlying, httpStatus, pendingDownloadIDs, neededBytes, availableBytes
    }

    /// Decodes an error; records written by earlier versions (a `kind` and a bare numeric `code`) decode too.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let message = try container.decode(String.self, forKey: .message)
        let code: Code
        if let name = try? container.decode(String.self, forKey: .code) {
            code = Code(rawValue: name)
        } else {
            // Earlier versions: only a kind.
            let kind = (try? container.decode(Kind.self, forKey: .kind)) ?? .io
            code =
                switch kind {
                case .usage: .invalidArgument
                case .badData: .corruptArchive
                case .network: .networkFailure
                case .unauthorized: .unauthorized
                case .insufficientStorage: .insufficientStorage
                case .io: .fileSystem
                case .cancelled: .cancelled
                }
        }
        self.init(
            code, message: message, hint: try container.decodeIfPresent(String.self, forKey: .hint),
            subject: try container.decodeIfPresent(String.self, forKey: .subject),
            underlying: try? container.decodeIfPresent(Underlying.self, forKey: .underlying),
            httpStatus: try container.decodeIfPresent(Int.self, forKey: .httpStatus),
            pendingDownloadIDs: (try? container.decodeIfPresent([String].self, forKey: .pendingDownloadIDs)) ?? [],
            neededBytes: try container.decodeIfPresent(Int64.self, forKey: .neededBytes),
            availableBytes: try container.decodeIfPresent(Int64.self, forKey: .availableBytes))
    }

    /// Encodes the error with its code, kind and fields.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.code, forKey: .code)
        try container.encode(self.kind, forKey: .kind)
        try container.encode(self.message, forKey: .message)
        try container.encodeIfPresent(self.hint, forKey: .hint)
        try container.encodeIfPresent(self.subject, forKey: .subject)
        try container.encodeIfPresent(self.underlying, forKey: .underlying)
        try container.encodeIfPresent(self.httpStatus, forKey: .httpStatus)
        if !self.pendingDownloadIDs.isEmpty { try container.encode(self.pendingDownloadIDs, forKey: .pendingDownloadIDs) }
        try container.encodeIfPresent(self.neededBytes, forKey: .neededBytes)
        try container.encodeIfPresent(self.availableBytes, forKey: .availableBytes)
    }
}

// MARK: - Factories

extension PackDeliveryError {
    /// An archive entry that would escape or abuse the install folder; the whole pack is rejected.
    ///
    /// - Parameters:
    ///   - path: the entry's path in the archive.
    ///   - why: what is unsafe about it.
    /// - Returns: an `unsafeEntry` error about the entry.
    public static func unsafeEntry(_ path: String, _ why: String) -> Self {
        .init(
            .unsafeEntry, message: "The pack holds an unsafe entry '\(Self.printable(path))': \(why).",
            hint: "The pack was rejected and nothing was installed; ask the content provider for a fixed pack.",
            subject: path)
    }

    /// libarchive could not read the pack (corrupt, truncated or not an archive).
    ///
    /// - Parameters:
    ///   - detail: libarchive's message.
    ///   - entry: the entry being read, when the failure is inside one.
    ///   - code: libarchive's errno, when there is one.
    /// - Returns: a `corruptArchive` error (or `encryptedArchive` when libarchive says the pack is encrypted).
    public static func corruptArchive(_ detail: String, entry: String? = nil, code: Int? = nil) -> Self {
        let detail = Self.oneLine(detail).trimmingCharacters(in: CharacterSet(charactersIn: ". "))
        let lower = detail.lowercased()
        if lower.contains("passphrase") || lower.contains("encrypt") || lower.contains("decryption") {
            return .init(
                .encryptedArchive,
                message:
                    "The pack is encrypted\(entry.map { " (entry '\(Self.printable($0))')" } ?? ""); encrypted packs are not supported.",
                hint: "Ask the content provider for an unencrypted pack.",
                subject: entry, underlying: code.map { .init(.libarchive, $0) })
        }
        return .init(
            .corruptArchive,
            message: entry.map { "The pack is corrupt at entry '\(Self.printable($0))': \(detail)." }
                ?? "The pack is not a readable archive: \(detail).",
            hint: "Ask the content provider for a fixed pack (a zip or tar, optionally gzip, bzip2, xz or zstd compressed).",
            subject: entry, underlying: code.map { .init(.libarchive, $0) })
    }

    /// The unpacked content grew past a limit (decompression or entry-count bomb).
    ///
    /// - Parameters:
    ///   - what: the unit of the limit, such as `bytes` or `entries`.
    ///   - limit: the limit that was exceeded.
    ///   - entry: the entry being unpacked when it was exceeded, if any.
    /// - Returns: an `unpackLimitExceeded` error.
    public static func unpackLimitExceeded(_ what: String, limit: Int64, entry: String?) -> Self {
        .init(
            .unpackLimitExceeded,
            message: "The pack unpacks to more than \(limit) \(what)\(entry.map { " (at entry '\(Self.printable($0))')" } ?? "").",
            hint:
                "It was rejected as a possible decompression bomb. If the pack is trusted, publish its unpackedLength in the manifest or raise the queue's limits (maxExpansionRatio, maxEntries).",
            subject: entry)
    }

    /// The filesystem is full (ENOSPC or EDQUOT) or too small for what remains.
    ///
    /// - Parameters:
    ///   - path: a folder on the filesystem that is short of space.
    ///   - needed: bytes needed, when measured.
    ///   - available: bytes available, when measured.
    ///   - errno: the errno, when a write failed.
    /// - Returns: an `insufficientStorage` error carrying the byte counts.
    public static func insufficientStorage(path: String, needed: Int64?, available: Int64?, errno: Int32? = nil) -> Self {
        var message = "Not enough free space at \(path)"
        if let needed, let available { message += ": \(needed) bytes needed, \(available) available" }
        return .init(
            .insufficientStorage, message: message + ".",
            hint: "Free some space, then resume; or cancel to discard the partial download.",
            subject: path, underlying: errno.map { .init(.errno, Int($0)) }, neededBytes: needed, availableBytes: available)
    }

    /// A local file operation failed.
    ///
    /// - Parameters:
    ///   - operation: what was being done, as a verb phrase (`open`, `create the folder`).
    ///   - path: the file or folder.
    ///   - code: the errno; its `strerror` text goes into the message.
    /// - Returns: `insufficientStorage` for ENOSPC/EDQUOT, `tooManyOpenFiles` for EMFILE/ENFILE, else `fileSystem`.
    public static func io(_ operation: String, path: String, errno code: Int32) -> Self {
        if code == ENOSPC || code == EDQUOT { return .insufficientStorage(path: path, needed: nil, available: nil, errno: code) }
        let text = String(cString: strerror(code))
        if code == EMFILE || code == ENFILE {
            return .init(
                .tooManyOpenFiles, message: "Could not \(operation) '\(path)': \(text).",
                hint: "The process ran out of file descriptors; raise its limit (ulimit -n) or lower the concurrency.",
                subject: path, underlying: .init(.errno, Int(code)))
        }
        return .init(
            .fileSystem, message: "Could not \(operation) '\(path)': \(text).", subject: path, underlying: .init(.errno, Int(code)))
    }

    /// A download stopped on request.
    static func stopped(_ what: String) -> Self { .init(.cancelled, message: what) }

    /// A text from outside (an identifier, a file name from a pack, a host, a server's words) made safe to print or
    /// log: every character that a terminal or a log viewer would act on instead of showing is shown as an escape.
    ///
    /// Escaped: C0 controls (U+0000–U+001F, line breaks and tabs too), DEL (U+007F) and C1 controls (U+0080–U+009F,
    /// a raw U+009B is a CSI) as `\x1B`; the bidirectional controls (U+061C, U+200E–U+200F, U+202A–U+202E,
    /// U+2066–U+2069) and the line and paragraph separators (U+2028, U+2029) as `\u{202E}`; and the backslash itself
    /// as `\\`, so that the result can be read back: two different texts never print alike.
    /// So a printed text cannot move the cursor, set a terminal's title, reorder what follows it or forge a line.
    ///
    /// This is the one escape of the package: the CLI, the server's request log and the library's messages use it.
    ///
    /// - Parameter text: the text to show.
    /// - Returns: the text with those characters escaped.
    public static func printable(_ text: String) -> String {
        Self.printable(text, keeping: [], escapingBackslash: true)
    }

    /// ``printable(_:)`` with some characters kept and, for a text that may already hold escapes of its own
    /// (a whole line about to be written), the backslash left as it is.
    ///
    /// - Parameters:
    ///   - text: the text to show.
    ///   - kept: characters shown as they are (a line's own tabs and line breaks).
    ///   - escapingBackslash: whether `\` is shown as `\\`.
    /// - Returns: the text with the other characters escaped.
    package static func printable(_ text: String, keeping kept: Set<Unicode.Scalar>, escapingBackslash: Bool) -> String {
        // Printable ASCII, the common case (a request log line, an identifier), is returned as it is.
        if text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && ($0 != UInt8(ascii: "\\") || !escapingBackslash) }) { return text }
        var result = ""
        result.unicodeScalars.reserveCapacity(text.unicodeScalars.count)
        for scalar in text.unicodeScalars {
            if scalar == "\\" && escapingBackslash {
                result += "\\\\"
            } else if !Self.needsEscape(scalar) || kept.contains(scalar) {
                result.unicodeScalars.append(scalar)
            } else if scalar.value <= 0xFF {
                result += "\\x" + Self.hex(scalar.value, digits: 2)
            } else {
                result += "\\u{" + Self.hex(scalar.value, digits: 4) + "}"
            }
        }
        return result
    }

    /// Whether ``printable(_:)`` escapes a character (the backslash aside).
    package static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069, 0x2028, 0x2029: true
        default: false
        }
    }

    private static func hex(_ value: UInt32, digits: Int) -> String {
        let text = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }
}

extension URL {
    /// The URL without credentials, for messages, events and logs: user info dropped, a query shown as `?…`.
    var redacted: String {
        guard var components = URLComponents(url: self, resolvingAgainstBaseURL: false) else { return "(a URL)" }
        components.user = nil
        components.password = nil
        let hadQuery = components.query != nil
        components.query = nil
        components.fragment = nil
        let base = components.string ?? "(a URL)"
        return PackDeliveryError.printable(hadQuery ? base + "?…" : base)
    }
}
