import Foundation

/// How a Metalink file's bytes are read as text, decided before anything else is checked: as libxml2 decides it
/// (a byte order mark, else the first four bytes, else UTF-8), and agreeing with the XML declaration's `encoding`.
///
/// Read: UTF-8 (with or without a BOM, and the ASCII-compatible encodings an XML declaration may name for it),
/// UTF-16 and UTF-32 in either byte order. Refused: EBCDIC, an 8-bit file that declares an encoding that is not
/// ASCII-compatible (UTF-7, an EBCDIC code page: there `<!DOCTYPE` has other bytes), a declaration that names
/// another encoding than the bytes show, a NUL byte in an 8-bit file, and bytes that are not valid in the encoding.
/// A DOCTYPE is then looked for in the decoded text, so it is found in every encoding that is read.
enum MetalinkEncoding {
    struct Problem: Error, Sendable, Hashable { var why: String }

    /// The encoding families libxml2 tells apart by their first bytes.
    enum Family: String, Sendable {
        case eightBit = "UTF-8"
        case utf16LE = "UTF-16LE"
        case utf16BE = "UTF-16BE"
        case utf32LE = "UTF-32LE"
        case utf32BE = "UTF-32BE"
        case ebcdic = "EBCDIC"

        var foundation: String.Encoding? {
            switch self {
            case .eightBit: .utf8
            case .utf16LE: .utf16LittleEndian
            case .utf16BE: .utf16BigEndian
            case .utf32LE: .utf32LittleEndian
            case .utf32BE: .utf32BigEndian
            case .ebcdic: nil
            }
        }
    }

    /// The family and the length of the byte order mark, from the first bytes (libxml2's `xmlDetectCharEncoding`).
    static func detect(_ bytes: [UInt8]) -> (Family, bom: Int) {
        let head = bytes.prefix(4) + [UInt8](repeating: 0xAA, count: max(0, 4 - bytes.count))
        let (a, b, c, d) = (head[0], head[1], head[2], head[3])
        switch (a, b, c, d) {
        case (0x00, 0x00, 0xFE, 0xFF): return (.utf32BE, 4)
        case (0xFF, 0xFE, 0x00, 0x00): return (.utf32LE, 4)
        case (0x00, 0x00, 0x00, 0x3C): return (.utf32BE, 0)
        case (0x3C, 0x00, 0x00, 0x00): return (.utf32LE, 0)
        case (0x00, 0x3C, 0x00, 0x3F): return (.utf16BE, 0)
        case (0x3C, 0x00, 0x3F, 0x00): return (.utf16LE, 0)
        case (0x4C, 0x6F, 0xA7, 0x94): return (.ebcdic, 0)
        case (0xEF, 0xBB, 0xBF, _): return (.eightBit, 3)
        case (0xFE, 0xFF, _, _): return (.utf16BE, 2)
        case (0xFF, 0xFE, _, _): return (.utf16LE, 2)
        default: return (.eightBit, 0)
        }
    }

    /// Encodings an 8-bit XML declaration may name: those in which every ASCII character has its ASCII byte.
    static let asciiCompatible: Set<String> = Set(
        ["utf-8", "utf8", "us-ascii", "ascii", "latin1", "iso-latin-1", "windows-1252", "cp1252"]
            + (1...16).map { "iso-8859-\($0)" } + (1...16).map { "iso8859-\($0)" })

    /// The file as text, in the encoding its bytes and its declaration agree on.
    static func decode(_ data: Data) -> Result<String, Problem> {
        let bytes = [UInt8](data)
        let (family, bom) = Self.detect(bytes)
        guard let encoding = family.foundation else {
            return .failure(Problem(why: "it is encoded in \(family.rawValue), which a Metalink file does not use (use UTF-8)"))
        }
        let body = Data(bytes.dropFirst(bom))
        let text: String
        if family == .eightBit {
            if bytes.contains(0) { return .failure(Problem(why: "it has a NUL byte, which UTF-8 text does not have")) }
            text = String(decoding: body, as: UTF8.self)
        } else {
            // A whole number of code units (Foundation drops a last odd byte); Foundation refuses a lone surrogate
            // and a code point out of range.
            let unit = family == .utf16LE || family == .utf16BE ? 2 : 4
            guard body.count % unit == 0, let decoded = String(data: body, encoding: encoding), !decoded.contains("\u{0}") else {
                return .failure(Problem(why: "it is not valid \(family.rawValue) text"))
            }
            text = decoded
        }
        guard let declared = Self.declaredEncoding(text)?.lowercased() else { return .success(text) }
        let agrees =
            switch family {
            case .eightBit: Self.asciiCompatible.contains(declared)
            case .utf16LE, .utf16BE: ["utf-16", family.rawValue.lowercased()].contains(declared)
            case .utf32LE, .utf32BE: ["utf-32", "ucs-4", family.rawValue.lowercased()].contains(declared)
            case .ebcdic: false
            }
        guard agrees else {
            return .failure(
                Problem(
                    why: "its XML declaration names the encoding '\(PackDeliveryError.printable(declared))', "
                        + "but its bytes are \(family.rawValue) (a Metalink file is UTF-8, or UTF-16 or UTF-32 as its bytes show)"))
        }
        return .success(text)
    }

    /// The `encoding` of an XML declaration at the start of the text; nil when there is none.
    static func declaredEncoding(_ text: String) -> String? {
        guard text.hasPrefix("<?xml") else { return nil }
        let declaration = text.prefix(while: { $0 != ">" }).prefix(512)
        guard let name = declaration.range(of: "encoding") else { return nil }
        var rest = declaration[name.upperBound...].drop(while: \.isWhitespace)
        guard rest.first == "=" else { return nil }
        rest = rest.dropFirst().drop(while: \.isWhitespace)
        guard let quote = rest.first, quote == "\"" || quote == "'" else { return nil }
        return String(rest.dropFirst().prefix(while: { $0 != quote }))
    }
}
