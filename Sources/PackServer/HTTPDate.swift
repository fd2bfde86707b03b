import Foundation

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) without locale or formatter state.
enum HTTPDate {
    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static func format(seconds: Int) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    static func parse(_ text: String) -> Int? {
        // "Sun, 06 Nov 1994 08:49:37 GMT"
        let fields = text.split(separator: " ")
        guard fields.count == 6, fields[0].hasSuffix(","), fields[5] == "GMT",
            let day = Int32(fields[1]), let monthIndex = months.firstIndex(of: String(fields[2])),
            let year = Int32(fields[3])
        else { return nil }
        let clock = fields[4].split(separator: ":")
        guard clock.count == 3, let hour = Int32(clock[0]), let minute = Int32(clock[1]), let second = Int32(clock[2]) else {
            return nil
        }
        var parts = tm()
        parts.tm_year = year - 1900
        parts.tm_mon = Int32(monthIndex)
        parts.tm_mday = day
        parts.tm_hour = hour
        parts.tm_min = minute
        parts.tm_sec = second
        return Int(timegm(&parts))
    }
}

/// The `Date` header of responses, formatted once a second (as nginx does) rather than for every response.
struct DateHeader {
    private var seconds = 0
    private var text = ""

    /// The current time as IMF-fixdate.
    mutating func now() -> String {
        let seconds = Int(time(nil))
        if seconds != self.seconds {
            self.seconds = seconds
            self.text = HTTPDate.format(seconds: seconds)
        }
        return self.text
    }
}
