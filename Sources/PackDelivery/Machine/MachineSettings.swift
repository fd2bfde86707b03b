import Foundation

/// The machine-wide delivery settings of one user, shared by every home: the rate cap, the window for background
/// work and the rate allowed while quiet is held (``MachinePolicy``).
///
/// Kept in one small JSON file, `$XDG_CONFIG_HOME/packs/agent.json` (``defaultURL(environment:)``):
/// `{"maxRate": 20971520, "schedule": "01:00-07:00", "quietRate": 1048576}`, each key optional (absent: none).
/// A missing file is the defaults; a file that does not read as settings is an error
/// (``PackDeliveryError/Code/invalidSettings``), never silently replaced.
public struct MachineSettings: Sendable, Hashable, Codable {
    /// The machine's rate cap in bytes per second, shared by every transfer; nil for none.
    public var maxRate: Int64?
    /// When restore, prefetch and background downloads may run; nil for at any time.
    public var schedule: BackgroundWindow?
    /// The rate cap while quiet is held, in bytes per second; nil for no cap beyond ``maxRate``.
    public var quietRate: Int64?

    /// Settings from their parts; all nil is the defaults (no cap, no window).
    ///
    /// - Parameters:
    ///   - maxRate: bytes per second, at least 1, or nil.
    ///   - schedule: the window for background work, or nil.
    ///   - quietRate: bytes per second while quiet, at least 1, or nil.
    public init(maxRate: Int64? = nil, schedule: BackgroundWindow? = nil, quietRate: Int64? = nil) {
        self.maxRate = maxRate
        self.schedule = schedule
        self.quietRate = quietRate
    }

    /// The settings file of the current user: `$XDG_CONFIG_HOME/packs/agent.json`, else `~/.config/packs/agent.json`.
    ///
    /// - Parameter environment: where to read `XDG_CONFIG_HOME` and `HOME`.
    /// - Returns: the file's URL (it may not exist).
    public static func defaultURL(environment: [String: String] = ProcessInfo.processInfo.environment) -> URL {
        let base: URL
        if let value = environment["XDG_CONFIG_HOME"], value.hasPrefix("/") {
            base = URL(filePath: value)
        } else {
            base = URL(filePath: environment["HOME"] ?? NSHomeDirectory()).appending(path: ".config")
        }
        return base.appending(path: "packs").appending(path: "agent.json")
    }

    /// Files larger than this are not settings.
    static let maximumFileSize = 64 << 10

    /// Reads the settings file.
    ///
    /// - Parameter url: the file (``defaultURL(environment:)`` by default).
    /// - Returns: its settings; the defaults when it does not exist.
    /// - Throws: `invalidSettings` when it is not a JSON object of known keys with valid values; `fileSystem` when it
    ///   cannot be read.
    public static func load(from url: URL = Self.defaultURL()) throws(PackDeliveryError) -> MachineSettings {
        guard
            let data = try SmallFile.read(
                url.path, limit: Self.maximumFileSize, tooLarge: { .invalidSettings(path: $0, "it is larger than 64 KiB") })
        else { return MachineSettings() }
        return try Self.decode(data, path: url.path)
    }

    /// Settings from the file's bytes, checked.
    static func decode(_ data: Data, path: String) throws(PackDeliveryError) -> MachineSettings {
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: data)
        } catch {
            throw .invalidSettings(path: path, "it is not JSON")
        }
        guard let fields = object as? [String: Any] else { throw .invalidSettings(path: path, "it is not a JSON object") }
        let known: Set<String> = ["maxRate", "schedule", "quietRate"]
        if let unknown = fields.keys.sorted().first(where: { !known.contains($0) }) {
            throw .invalidSettings(path: path, "'\(PackDeliveryError.printable(unknown))' is not a setting (maxRate, schedule, quietRate)")
        }
        let raw: Raw
        do {
            raw = try JSONDecoder().decode(Raw.self, from: data)
        } catch {
            let key = (error as? DecodingError).flatMap(Self.key) ?? "a value"
            throw .invalidSettings(path: path, "\(key) has the wrong type")
        }
        for (key, value) in [("maxRate", raw.maxRate), ("quietRate", raw.quietRate)] where (value ?? 1) <= 0 {
            throw .invalidSettings(path: path, "\(key) must be a whole number of bytes per second above 0, or null")
        }
        var settings = MachineSettings(maxRate: raw.maxRate, quietRate: raw.quietRate)
        if let text = raw.schedule {
            guard let window = BackgroundWindow(parsing: text) else {
                throw .invalidSettings(path: path, "schedule must be a window such as \"01:00-07:00\", or null")
            }
            settings.schedule = window
        }
        return settings
    }

    /// The file's fields as JSON has them, before they are checked.
    private struct Raw: Decodable {
        var maxRate: Int64?
        var schedule: String?
        var quietRate: Int64?
    }

    /// The key a decoding error is about.
    private static func key(_ error: DecodingError) -> String? {
        switch error {
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
            return context.codingPath.first?.stringValue
        case .keyNotFound(let key, _):
            return key.stringValue
        @unknown default:
            return nil
        }
    }

    /// Writes the settings file atomically: a new file beside it, synced, renamed over the old one, the folder synced.
    ///
    /// - Parameter url: the file (``defaultURL(environment:)`` by default); its folder is created when missing.
    /// - Throws: `fileSystem` (or `insufficientStorage`) when it cannot be written; the old file is then unchanged.
    public func save(to url: URL = Self.defaultURL()) throws(PackDeliveryError) {
        let folder = url.deletingLastPathComponent()
        try Self.makeFolders(folder)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        let data: Data
        do { data = try encoder.encode(self) } catch { throw .init(.internalError, message: "The settings could not be encoded.") }
        try SmallFile.write(data, to: url)
    }

    /// `mkdir -p`, each new folder 0700.
    static func makeFolders(_ folder: URL) throws(PackDeliveryError) {
        var missing: [String] = []
        var path = folder.standardizedFileURL.path
        while path != "/", !path.isEmpty, access(path, F_OK) != 0 {
            missing.append(path)
            path = (path as NSString).deletingLastPathComponent
        }
        for path in missing.reversed() where mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw .io("create the folder", path: path, errno: errno)
        }
    }

    /// Encodes the settings, leaving out those that are none.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(self.maxRate, forKey: .maxRate)
        try container.encodeIfPresent(self.schedule, forKey: .schedule)
        try container.encodeIfPresent(self.quietRate, forKey: .quietRate)
    }
}

extension PackDeliveryError {
    /// The settings file does not read as settings.
    ///
    /// - Parameters:
    ///   - path: the file.
    ///   - why: what is wrong with it.
    /// - Returns: an `invalidSettings` error naming the file.
    static func invalidSettings(path: String, _ why: String) -> Self {
        .init(
            .invalidSettings, message: "The settings file '\(path)' is not valid: \(why).",
            hint: "Correct it, or remove it to go back to the defaults (no rate cap, no window).", subject: path)
    }
}
