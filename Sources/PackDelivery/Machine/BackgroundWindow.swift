import Foundation

/// The hours of the day when background work may run (`01:00-07:00`), in local time, as minutes of the day.
///
/// A window whose end is earlier than its start crosses midnight: `22:00-06:00` holds 23:30 and 05:00, not 12:00.
/// The start is inside the window and the end is not. Local time is given by the caller as seconds since local
/// midnight (``MachineClock/secondOfDay(_:timeZone:)``), so the window needs no calendar and no clock.
public struct BackgroundWindow: Sendable, Hashable, Codable, CustomStringConvertible {
    /// Minutes since local midnight when the window opens, 0…1439.
    public let start: Int
    /// Minutes since local midnight when the window closes, 0…1439; never equal to ``start``.
    public let end: Int

    /// A window from its minutes of the day.
    ///
    /// - Parameters:
    ///   - start: minutes since local midnight when it opens, 0…1439.
    ///   - end: minutes since local midnight when it closes, 0…1439, not equal to `start`.
    /// - Returns: nil when a minute is out of range or both are equal (an empty window).
    public init?(start: Int, end: Int) {
        guard (0..<Self.minutesPerDay).contains(start), (0..<Self.minutesPerDay).contains(end), start != end else { return nil }
        self.start = start
        self.end = end
    }

    /// A window from its text, `HH:MM-HH:MM` (24-hour clock; `24:00` stands for midnight as an end).
    ///
    /// - Parameter text: the window, such as `01:00-07:00` or `22:30-06:00`.
    /// - Returns: nil when the text is not two times of day, or both are equal.
    public init?(parsing text: String) {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let start = Self.minute(parts[0]), let end = Self.minute(parts[1]) else { return nil }
        self.init(start: start % Self.minutesPerDay, end: end % Self.minutesPerDay)
    }

    static let minutesPerDay = 24 * 60
    static let secondsPerDay = 24 * 60 * 60

    /// `HH:MM-HH:MM`.
    public var description: String { "\(Self.text(self.start))-\(Self.text(self.end))" }

    /// Whether the window holds a moment.
    ///
    /// - Parameter second: seconds since local midnight (taken modulo a day).
    /// - Returns: true from the start (included) to the end (excluded).
    public func contains(second: Int) -> Bool {
        let minute = Self.normalized(second) / 60
        if self.start < self.end { return minute >= self.start && minute < self.end }
        return minute >= self.start || minute < self.end
    }

    /// Seconds from a moment to the next time the window opens or closes, whichever comes first.
    ///
    /// - Parameter second: seconds since local midnight (taken modulo a day).
    /// - Returns: 1…86,400 seconds.
    public func secondsToNextEdge(after second: Int) -> Int {
        let now = Self.normalized(second)
        func until(_ minute: Int) -> Int {
            let delta = (minute * 60 - now + Self.secondsPerDay) % Self.secondsPerDay
            return delta == 0 ? Self.secondsPerDay : delta
        }
        return min(until(self.start), until(self.end))
    }

    /// Decodes a window from its text (`"01:00-07:00"`), as ``MachineSettings`` stores it.
    ///
    /// - Parameter decoder: the decoder to read from.
    /// - Throws: `DecodingError` when the text is not a window.
    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let window = Self(parsing: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a window HH:MM-HH:MM"))
        }
        self = window
    }

    /// Encodes the window as its text.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(self.description)
    }

    private static func normalized(_ second: Int) -> Int {
        ((second % Self.secondsPerDay) + Self.secondsPerDay) % Self.secondsPerDay
    }

    private static func minute(_ text: Substring) -> Int? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[0].count == 2, parts[1].count == 2,
            parts.allSatisfy({ $0.allSatisfy { $0.isASCII && $0.isNumber } }),
            let hours = Int(parts[0]), let minutes = Int(parts[1]), minutes < 60,
            hours < 24 || (hours == 24 && minutes == 0)
        else { return nil }
        return hours * 60 + minutes
    }

    private static func text(_ minute: Int) -> String {
        let hours = minute / 60
        let minutes = minute % 60
        return (hours < 10 ? "0" : "") + "\(hours):" + (minutes < 10 ? "0" : "") + "\(minutes)"
    }
}

/// Local time for ``BackgroundWindow``: the one place a date meets a calendar, outside the pure policy.
public enum MachineClock {
    /// Seconds since local midnight of a moment.
    ///
    /// - Parameters:
    ///   - date: the moment.
    ///   - timeZone: the local time zone (the system's by default).
    /// - Returns: 0…86,399 (a day with a DST change still counts its wall-clock time).
    public static func secondOfDay(_ date: Date, timeZone: TimeZone = .current) -> Int {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let parts = calendar.dateComponents([.hour, .minute, .second], from: date)
        return (parts.hour ?? 0) * 3600 + (parts.minute ?? 0) * 60 + (parts.second ?? 0)
    }
}
