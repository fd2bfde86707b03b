import Foundation

/// A JSON value as TUF metadata holds it, read by a small parser of our own so that integers, booleans and
/// strings stay apart (Foundation's parsers make all numbers and booleans one `NSNumber`), and written back as
/// securesystemslib's canonical JSON: the bytes a TUF signature covers.
///
/// Canonical JSON (securesystemslib `encode_canonical`): object members sorted by name (by Unicode code point),
/// no whitespace, strings with only `\` and `"` escaped (every other character, control characters included,
/// written as its UTF-8 bytes), integers only (a fraction or exponent is refused), `true`, `false`, `null`.
enum TUFJSON: Equatable, Sendable {
    case object([String: TUFJSON])
    case array([TUFJSON])
    case string(String)
    case integer(Int)
    case bool(Bool)
    case null
    /// A number with a fraction or exponent: it may be read (a `custom` field) but not canonicalised.
    case fraction(String)

    /// The most arrays and objects nested in one another.
    static let maxDepth = 64

    /// Parses one JSON text (RFC 8259); nil when it is not exactly one valid value. A member named twice keeps its
    /// last value, as Python's `json` does.
    static func parse(_ data: Data) -> TUFJSON? {
        var parser = Parser(bytes: [UInt8](data))
        parser.skipWhitespace()
        guard let value = parser.value(depth: 0) else { return nil }
        parser.skipWhitespace()
        return parser.index == parser.bytes.count ? value : nil
    }

    /// The canonical encoding; nil when the value holds a fraction (securesystemslib refuses floats).
    var canonical: Data? {
        var out: [UInt8] = []
        out.reserveCapacity(1024)
        guard self.encode(into: &out) else { return nil }
        return Data(out)
    }

    private func encode(into out: inout [UInt8]) -> Bool {
        switch self {
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            let names = members.keys.sorted { $0.unicodeScalars.lexicographicallyPrecedes($1.unicodeScalars) }
            for (offset, name) in names.enumerated() {
                if offset > 0 { out.append(UInt8(ascii: ",")) }
                Self.encodeString(name, into: &out)
                out.append(UInt8(ascii: ":"))
                guard members[name]!.encode(into: &out) else { return false }
            }
            out.append(UInt8(ascii: "}"))
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (offset, item) in items.enumerated() {
                if offset > 0 { out.append(UInt8(ascii: ",")) }
                guard item.encode(into: &out) else { return false }
            }
            out.append(UInt8(ascii: "]"))
        case .string(let text): Self.encodeString(text, into: &out)
        case .integer(let number): out += Array(String(number).utf8)
        case .bool(let flag): out += Array((flag ? "true" : "false").utf8)
        case .null: out += Array("null".utf8)
        case .fraction: return false
        }
        return true
    }

    private static func encodeString(_ text: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            if byte == UInt8(ascii: "\\") || byte == UInt8(ascii: "\"") { out.append(UInt8(ascii: "\\")) }
            out.append(byte)
        }
        out.append(UInt8(ascii: "\""))
    }

    // MARK: Reading

    subscript(_ name: String) -> TUFJSON? {
        if case .object(let members) = self { return members[name] }
        return nil
    }

    var objectValue: [String: TUFJSON]? {
        if case .object(let members) = self { return members }
        return nil
    }
    var arrayValue: [TUFJSON]? {
        if case .array(let items) = self { return items }
        return nil
    }
    var stringValue: String? {
        if case .string(let text) = self { return text }
        return nil
    }
    var intValue: Int? {
        if case .integer(let number) = self { return number }
        return nil
    }
    var boolValue: Bool? {
        if case .bool(let flag) = self { return flag }
        return nil
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0

        var peek: UInt8? { self.index < self.bytes.count ? self.bytes[self.index] : nil }

        mutating func skipWhitespace() {
            while let byte = self.peek, byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D { self.index += 1 }
        }

        mutating func take(_ byte: UInt8) -> Bool {
            guard self.peek == byte else { return false }
            self.index += 1
            return true
        }

        mutating func literal(_ word: String) -> Bool {
            let expected = Array(word.utf8)
            guard self.index + expected.count <= self.bytes.count,
                Array(self.bytes[self.index..<(self.index + expected.count)]) == expected
            else { return false }
            self.index += expected.count
            return true
        }

        mutating func value(depth: Int) -> TUFJSON? {
            guard depth < TUFJSON.maxDepth, let byte = self.peek else { return nil }
            switch byte {
            case UInt8(ascii: "{"): return self.object(depth: depth + 1)
            case UInt8(ascii: "["): return self.array(depth: depth + 1)
            case UInt8(ascii: "\""): return self.string().map { .string($0) }
            case UInt8(ascii: "t"): return self.literal("true") ? .bool(true) : nil
            case UInt8(ascii: "f"): return self.literal("false") ? .bool(false) : nil
            case UInt8(ascii: "n"): return self.literal("null") ? .null : nil
            default: return self.number()
            }
        }

        mutating func object(depth: Int) -> TUFJSON? {
            self.index += 1
            var members: [String: TUFJSON] = [:]
            self.skipWhitespace()
            if self.take(UInt8(ascii: "}")) { return .object(members) }
            while true {
                self.skipWhitespace()
                guard self.peek == UInt8(ascii: "\""), let name = self.string() else { return nil }
                self.skipWhitespace()
                guard self.take(UInt8(ascii: ":")) else { return nil }
                self.skipWhitespace()
                guard let value = self.value(depth: depth) else { return nil }
                members[name] = value
                self.skipWhitespace()
                if self.take(UInt8(ascii: ",")) { continue }
                return self.take(UInt8(ascii: "}")) ? .object(members) : nil
            }
        }

        mutating func array(depth: Int) -> TUFJSON? {
            self.index += 1
            var items: [TUFJSON] = []
            self.skipWhitespace()
            if self.take(UInt8(ascii: "]")) { return .array(items) }
            while true {
                self.skipWhitespace()
                guard let value = self.value(depth: depth) else { return nil }
                items.append(value)
                self.skipWhitespace()
                if self.take(UInt8(ascii: ",")) { continue }
                return self.take(UInt8(ascii: "]")) ? .array(items) : nil
            }
        }

        mutating func number() -> TUFJSON? {
            let start = self.index
            _ = self.take(UInt8(ascii: "-"))
            let digitsStart = self.index
            while let byte = self.peek, byte >= 0x30, byte <= 0x39 { self.index += 1 }
            let digits = self.index - digitsStart
            guard digits > 0, !(digits > 1 && self.bytes[digitsStart] == 0x30) else { return nil }
            var integral = true
            if self.take(UInt8(ascii: ".")) {
                integral = false
                guard self.digits() else { return nil }
            }
            if self.peek == UInt8(ascii: "e") || self.peek == UInt8(ascii: "E") {
                integral = false
                self.index += 1
                if self.peek == UInt8(ascii: "+") || self.peek == UInt8(ascii: "-") { self.index += 1 }
                guard self.digits() else { return nil }
            }
            let text = String(decoding: self.bytes[start..<self.index], as: UTF8.self)
            if integral, let number = Int(text) { return .integer(number) }
            return .fraction(text)
        }

        mutating func digits() -> Bool {
            let start = self.index
            while let byte = self.peek, byte >= 0x30, byte <= 0x39 { self.index += 1 }
            return self.index > start
        }

        mutating func string() -> String? {
            self.index += 1
            var out: [UInt8] = []
            while let byte = self.peek {
                self.index += 1
                switch byte {
                case UInt8(ascii: "\""): return String(validating: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard let escaped = self.escape() else { return nil }
                    out += escaped
                case 0..<0x20: return nil
                default: out.append(byte)
                }
            }
            return nil
        }

        mutating func escape() -> [UInt8]? {
            guard let byte = self.peek else { return nil }
            self.index += 1
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): return [byte]
            case UInt8(ascii: "b"): return [0x08]
            case UInt8(ascii: "f"): return [0x0C]
            case UInt8(ascii: "n"): return [0x0A]
            case UInt8(ascii: "r"): return [0x0D]
            case UInt8(ascii: "t"): return [0x09]
            case UInt8(ascii: "u"):
                guard var unit = self.hex4() else { return nil }
                if (0xD800..<0xDC00).contains(unit) {
                    guard self.literal("\\u"), let low = self.hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                    unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(unit) {
                    return nil
                }
                guard let scalar = Unicode.Scalar(unit) else { return nil }
                return Array(String(Character(scalar)).utf8)
            default: return nil
            }
        }

        mutating func hex4() -> UInt32? {
            guard self.index + 4 <= self.bytes.count,
                let unit = UInt32(String(decoding: self.bytes[self.index..<(self.index + 4)], as: UTF8.self), radix: 16)
            else { return nil }
            self.index += 4
            return unit
        }
    }
}
