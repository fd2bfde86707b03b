import Foundation
import PackDelivery

extension FuzzHarness {
    /// `PackDeliveryError.printable` of the input read as UTF-8 (bad bytes as U+FFFD, as a `String` from outside
    /// has them). The output must hold no character a terminal acts on — no C0 or C1 control, DEL, bidirectional
    /// control (Unicode's Bidi_Control) or line or paragraph separator, as Unicode's own properties say, not the
    /// escape's list — and must read back to the input (``unescapePrintable(_:)``): two texts never print alike.
    public static func printable(_ data: Data) -> Outcome {
        let text = String(decoding: data, as: UTF8.self)
        let shown = PackDeliveryError.printable(text)
        var problems: [String] = []
        if let raw = shown.unicodeScalars.first(where: Self.actsOnTerminal) {
            problems.append("U+\(String(raw.value, radix: 16, uppercase: true)) is printed raw")
        }
        if Self.unescapePrintable(shown) != text { problems.append("the output does not read back to the input") }
        return Outcome(error: nil, problems: problems)
    }

    /// A character a terminal or a log viewer acts on instead of showing.
    static func actsOnTerminal(_ scalar: Unicode.Scalar) -> Bool {
        scalar.properties.generalCategory == .control || scalar.properties.isBidiControl || scalar == "\u{2028}"
            || scalar == "\u{2029}"
    }

    /// The inverse of `PackDeliveryError.printable`: `\\` → `\`, `\xHH` and `\u{H…}` → the character; nil for any
    /// other backslash sequence (which printable never writes).
    public static func unescapePrintable(_ shown: String) -> String? {
        var result = ""
        var scalars = shown.unicodeScalars.makeIterator()
        while let scalar = scalars.next() {
            guard scalar == "\\" else {
                result.unicodeScalars.append(scalar)
                continue
            }
            var hex = ""
            switch scalars.next() {
            case "\\"?: result += "\\"
            case "x"?:
                for _ in 0..<2 {
                    if let digit = scalars.next() { hex.unicodeScalars.append(digit) }
                }
                guard hex.count == 2, let value = UInt32(hex, radix: 16), let decoded = Unicode.Scalar(value) else { return nil }
                result.unicodeScalars.append(decoded)
            case "u"?:
                guard scalars.next() == "{" else { return nil }
                while let digit = scalars.next(), digit != "}" { hex.unicodeScalars.append(digit) }
                guard (1...6).contains(hex.count), let value = UInt32(hex, radix: 16), let decoded = Unicode.Scalar(value) else {
                    return nil
                }
                result.unicodeScalars.append(decoded)
            default: return nil
            }
        }
        return result
    }
}
