import Foundation
import PackDelivery

/// What `--json` prints: one `Encodable` type per object, with the library's field names.
///
/// The library's own Codable types are printed as they encode themselves (``PackDeliveryError``, the state,
/// phase, reason and kind enums, ``Download/Delta``, ``Download/DeltaFallback``). A download, a transaction
/// and an installed pack have a shape of their own here: paths rather than file URLs, the pack's URL without
/// credentials, only what a reader needs, and `null` for a field that is unset rather than no key.
enum JSONOutput {
    /// One line of compact JSON: keys sorted, `/` not escaped, dates in ISO 8601 (`2025-03-01T12:00:00Z`).
    static func line(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        // Encoding fails only for a progress or time that is not a finite number.
        guard let data = try? encoder.encode(value) else { return "{}" }
        return Self.asciiControls(String(decoding: data, as: UTF8.self))
    }

    /// JSON with every character ``PackDeliveryError/printable(_:)`` escapes written as a `\uXXXX` escape: the
    /// encoder escapes C0 controls, but leaves DEL, C1 controls (a raw U+009B is a CSI), bidirectional controls and
    /// U+2028/U+2029 raw, and `--json` lines reach terminals too. Outside strings JSON is ASCII, so only strings
    /// change, and they decode to the same text.
    static func asciiControls(_ json: String) -> String {
        guard json.unicodeScalars.contains(where: PackDeliveryError.needsEscape) else { return json }
        var result = ""
        for scalar in json.unicodeScalars {
            if PackDeliveryError.needsEscape(scalar) {
                let hex = String(scalar.value, radix: 16, uppercase: true)
                result += "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}

/// Prints a value as one line of JSON on stdout.
func printJSON(_ value: some Encodable) {
    printLine(JSONOutput.line(value))
}

/// An installed pack: a line of `content`, with `"missing"`; an element of `verify`'s `"contents"`, with
/// `"intact"`, `"folderMissing"`, `"filesRecorded"` and `"damage"`.
struct InstalledJSON: Encodable {
    struct Damage: Encodable {
        let path: String
        let problem: VerifyResult.Damage.Problem
    }

    let productIdentifier: String
    let contentIdentifier: String
    let contentVersion: String
    /// The installed folder's path.
    let contentURL: String
    let destination: Destination
    var missing: Bool?
    var intact: Bool?
    var folderMissing: Bool?
    var filesRecorded: Bool?
    var damage: [Damage]?

    init(_ content: InstalledContent) {
        self.productIdentifier = content.productIdentifier
        self.contentIdentifier = content.contentIdentifier
        self.contentVersion = content.contentVersion
        self.contentURL = content.contentURL.path
        self.destination = content.destination
    }

    init(_ result: VerifyResult) {
        self.init(result.content)
        self.intact = result.isIntact
        self.folderMissing = result.folderMissing
        self.filesRecorded = result.filesRecorded
        self.damage = result.damage.map { Damage(path: $0.path, problem: $0.problem) }
    }
}

/// `verify`: whether everything is intact, and each pack checked.
struct VerifyJSON: Encodable {
    let intact: Bool
    let contents: [InstalledJSON]
}
