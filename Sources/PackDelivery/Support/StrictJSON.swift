import Foundation

/// A strict check of one JSON text (RFC 8259), for what Foundation's parsers let through: JSONDecoder and
/// JSONSerialization silently keep one of two members with the same name, so `{"exp": later, "exp": past}`
/// would mean whatever the parser picks. Used on a receipt's header and claims before they are decoded.
///
/// A text passes when it is UTF-8, is exactly one object (with whitespace around it), follows RFC 8259's
/// grammar, nests arrays and objects at most ``maxDepth`` deep, and no object in it (at any depth) names a
/// member twice. Names are compared after their escapes are decoded (`"\u0065xp"` is `"exp"`) and as Swift
/// compares strings, as the decoder matches them. The scan is one pass over the bytes, its recursion
/// bounded by ``maxDepth``.
enum StrictJSON {
    /// The most arrays and objects nested in one another.
    static let maxDepth = 32

    /// The member names of the object `data` holds, in order, when it passes; nil otherwise.
    static func memberNames(ofObject data: Data) -> [String]? {
        let bytes = [UInt8](data)
        guard String(validating: bytes, as: UTF8.self) != nil else { return nil }
        var scanner = Scanner(bytes: bytes)
        scanner.skipWhitespace()
        guard scanner.peek == UInt8(ascii: "{"), let names = scanner.object(depth: 1) else { return nil }
        scanner.skipWhitespace()
        return scanner.index == bytes.count ? names : nil
    }

    private struct Scanner {
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

        /// One value after optional whitespace; false when there is none or it is not strict.
        mutating func value(depth: Int) -> Bool {
            self.skipWhitespace()
            switch self.peek {
            case UInt8(ascii: "{"): return self.object(depth: depth + 1) != nil
            case UInt8(ascii: "["): return self.array(depth: depth + 1)
            case UInt8(ascii: "\""): return self.string() != nil
            case UInt8(ascii: "t"): return self.literal("true")
            case UInt8(ascii: "f"): return self.literal("false")
            case UInt8(ascii: "n"): return self.literal("null")
            default: return self.number()
            }
        }

        /// An object at the cursor (`{`); its member names, or nil.
        mutating func object(depth: Int) -> [String]? {
            guard depth <= StrictJSON.maxDepth, self.take(UInt8(ascii: "{")) else { return nil }
            var names: [String] = []
            var seen: Set<String> = []
            self.skipWhitespace()
            if self.take(UInt8(ascii: "}")) { return names }
            repeat {
                self.skipWhitespace()
                guard let name = self.string(), seen.insert(name).inserted else { return nil }
                names.append(name)
                self.skipWhitespace()
                guard self.take(UInt8(ascii: ":")), self.value(depth: depth) else { return nil }
                self.skipWhitespace()
            } while self.take(UInt8(ascii: ","))
            return self.take(UInt8(ascii: "}")) ? names : nil
        }

        mutating func array(depth: Int) -> Bool {
            guard depth <= StrictJSON.maxDepth, self.take(UInt8(ascii: "[")) else { return false }
            self.skipWhitespace()
            if self.take(UInt8(ascii: "]")) { return true }
            repeat {
                guard self.value(depth: depth) else { return false }
                self.skipWhitespace()
            } while self.take(UInt8(ascii: ","))
            return self.take(UInt8(ascii: "]"))
        }

        /// A string at the cursor, its escapes decoded; nil when it is not one (unescaped control characters,
        /// an unknown escape, a lone surrogate, no closing quote). The input is known to be UTF-8.
        mutating func string() -> String? {
            guard self.take(UInt8(ascii: "\"")) else { return nil }
            var text = String.UnicodeScalarView()
            var start = self.index  // the run of bytes not yet added to `text`
            func flush(_ end: Int) { text.append(contentsOf: String(decoding: self.bytes[start..<end], as: UTF8.self).unicodeScalars) }
            while let byte = self.peek {
                switch byte {
                case UInt8(ascii: "\""):
                    flush(self.index)
                    self.index += 1
                    return String(text)
                case UInt8(ascii: "\\"):
                    flush(self.index)
                    self.index += 1
                    guard let scalar = self.escape() else { return nil }
                    text.append(scalar)
                    start = self.index
                case 0x00..<0x20:
                    return nil
                default:
                    self.index += 1
                }
            }
            return nil
        }

        /// The character of an escape, the cursor after its backslash.
        mutating func escape() -> Unicode.Scalar? {
            guard let byte = self.peek else { return nil }
            self.index += 1
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): return Unicode.Scalar(byte)
            case UInt8(ascii: "b"): return "\u{8}"
            case UInt8(ascii: "f"): return "\u{C}"
            case UInt8(ascii: "n"): return "\n"
            case UInt8(ascii: "r"): return "\r"
            case UInt8(ascii: "t"): return "\t"
            case UInt8(ascii: "u"):
                guard let unit = self.hex4() else { return nil }
                switch unit {
                case 0xD800..<0xDC00:
                    guard self.take(UInt8(ascii: "\\")), self.take(UInt8(ascii: "u")), let low = self.hex4(),
                        (0xDC00..<0xE000).contains(low)
                    else { return nil }
                    return Unicode.Scalar(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                case 0xDC00..<0xE000:
                    return nil
                default:
                    return Unicode.Scalar(unit)
                }
            default:
                return nil
            }
        }

        mutating func hex4() -> UInt32? {
            guard self.index + 4 <= self.bytes.count else { return nil }
            var value: UInt32 = 0
            for byte in self.bytes[self.index..<self.index + 4] {
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: return nil
                }
                value = value << 4 | UInt32(digit)
            }
            self.index += 4
            return value
        }

        /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
        mutating func number() -> Bool {
            func digits() -> Int {
                let start = self.index
                while let byte = self.peek, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { self.index += 1 }
                return self.index - start
            }
            _ = self.take(UInt8(ascii: "-"))
            if !self.take(UInt8(ascii: "0")) {
                guard let first = self.peek, (UInt8(ascii: "1")...UInt8(ascii: "9")).contains(first) else { return false }
                _ = digits()
            }
            if self.take(UInt8(ascii: ".")), digits() == 0 { return false }
            if self.take(UInt8(ascii: "e")) || self.take(UInt8(ascii: "E")) {
                if !self.take(UInt8(ascii: "+")) { _ = self.take(UInt8(ascii: "-")) }
                if digits() == 0 { return false }
            }
            return true
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard self.index + count <= self.bytes.count else { return false }
            let matches = word.withUTF8Buffer { self.bytes[self.index..<self.index + count].elementsEqual($0) }
            if matches { self.index += count }
            return matches
        }
    }
}
