import Foundation

/// An error PackDelivery reports: what happened, on what, and what to do next.
///
/// Errors are a struct around a private code so that new cases do not break the API; match them
/// with ``kind`` and the static factories' names.
public struct PackDeliveryError: Error, Sendable, Hashable, CustomStringConvertible, Codable {
    /// The broad class of an error, which also decides the CLI's exit code.
    public enum Kind: String, Sendable, Hashable, Codable {
        /// The caller asked for something impossible (bad argument, unknown id, finish refused).
        case usage
        /// The data is bad: unreadable manifest, unknown product, length or checksum mismatch,
        /// unsafe or corrupt archive.
        case badData
        /// The server or the network failed, after retries.
        case network
        /// Not enough free space on the filesystem being written to.
        case insufficientStorage
        /// A local I/O or database failure that is not about free space.
        case io
        /// The operation was cancelled or interrupted.
        case cancelled
    }

    /// What kind of failure this is.
    public let kind: Kind
    /// One human sentence: what happened.
    public let message: String
    /// What to do next, when there is a useful hint.
    public let hint: String?
    /// The archive entry, URL or file the error is about, when there is one.
    public let subject: String?
    /// The underlying code (errno, libcurl or libarchive code, HTTP status), when there is one.
    public let code: Int?
    /// For `insufficientStorage`: bytes needed, when measured.
    public let neededBytes: Int64?
    /// For `insufficientStorage`: bytes available, when measured.
    public let availableBytes: Int64?

    /// Creates an error; prefer the static factories where one fits.
    ///
    /// - Parameters:
    ///   - kind: the broad class of the error.
    ///   - message: one human sentence: what happened.
    ///   - hint: what to do next, if anything useful.
    ///   - subject: the archive entry, URL or file the error is about.
    ///   - code: the underlying errno, libcurl, libarchive or HTTP code.
    ///   - neededBytes: for `insufficientStorage`, the bytes needed.
    ///   - availableBytes: for `insufficientStorage`, the bytes available.
    public init(kind: Kind, message: String, hint: String? = nil, subject: String? = nil, code: Int? = nil,
                neededBytes: Int64? = nil, availableBytes: Int64? = nil) {
        self.kind = kind
        self.message = message
        self.hint = hint
        self.subject = subject
        self.code = code
        self.neededBytes = neededBytes
        self.availableBytes = availableBytes
    }

    /// The message, followed by the hint when there is one.
    public var description: String {
        if let hint { return "\(self.message) \(hint)" }
        return self.message
    }
}

extension PackDeliveryError {
    /// An archive entry that would escape or abuse the staging folder; the whole pack is rejected.
    ///
    /// - Parameters:
    ///   - path: the entry's path in the archive.
    ///   - why: what is unsafe about it.
    /// - Returns: a `badData` error about the entry.
    public static func unsafeEntry(_ path: String, _ why: String) -> Self {
        .init(kind: .badData, message: "The pack holds an unsafe entry '\(path)': \(why).",
              hint: "The pack was rejected and nothing was installed; ask the content provider for a fixed pack.",
              subject: path)
    }

    /// libarchive could not read the pack (corrupt, truncated or not an archive).
    ///
    /// - Parameters:
    ///   - detail: libarchive's message.
    ///   - entry: the entry being read, when the failure is inside one.
    ///   - code: libarchive's errno, when there is one.
    /// - Returns: a `badData` error.
    public static func corruptArchive(_ detail: String, entry: String? = nil, code: Int? = nil) -> Self {
        .init(kind: .badData,
              message: entry.map { "The pack is corrupt at entry '\($0)': \(detail)." } ?? "The pack is not a readable archive: \(detail).",
              hint: "Nothing was installed; the pack must be a zip or tar (optionally gzip, bzip2, xz or zstd compressed).",
              subject: entry, code: code)
    }

    /// The unpacked content grew past a limit (decompression or entry-count bomb).
    ///
    /// - Parameters:
    ///   - what: the unit of the limit, such as `bytes` or `entries`.
    ///   - limit: the limit that was exceeded.
    ///   - entry: the entry being unpacked when it was exceeded, if any.
    /// - Returns: a `badData` error.
    public static func unpackLimitExceeded(_ what: String, limit: Int64, entry: String?) -> Self {
        .init(kind: .badData, message: "The pack unpacks to more than \(limit) \(what)\(entry.map { " (at entry '\($0)')" } ?? "").",
              hint: "It was rejected as a possible decompression bomb; raise the limit only if you trust the pack.",
              subject: entry)
    }

    /// The filesystem is full (ENOSPC or EDQUOT) or too small for what remains.
    ///
    /// - Parameters:
    ///   - path: a folder on the filesystem that is short of space.
    ///   - needed: bytes needed, when measured.
    ///   - available: bytes available, when measured.
    ///   - code: the errno, when a write failed.
    /// - Returns: an `insufficientStorage` error carrying the byte counts.
    public static func insufficientStorage(path: String, needed: Int64?, available: Int64?, code: Int? = nil) -> Self {
        var message = "Not enough free space at \(path)"
        if let needed, let available { message += ": \(needed) bytes needed, \(available) available" }
        return .init(kind: .insufficientStorage, message: message + ".",
                     hint: "Free some space, then resume; or cancel to discard the partial download.",
                     subject: path, code: code, neededBytes: needed, availableBytes: available)
    }

    /// A local file operation failed.
    ///
    /// - Parameters:
    ///   - operation: what was being done, as a verb phrase (`open`, `create the folder`).
    ///   - path: the file or folder.
    ///   - code: the errno; its `strerror` text goes into the message.
    /// - Returns: an `io` error.
    public static func io(_ operation: String, path: String, errno code: Int32) -> Self {
        .init(kind: .io, message: "Could not \(operation) '\(path)': \(String(cString: strerror(code))).",
              subject: path, code: Int(code))
    }
}
