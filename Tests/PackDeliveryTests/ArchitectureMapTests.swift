import Foundation
import Testing

/// The README's "Design" section is the newcomer's map of the code: every type, member, file and folder it names
/// in backticks must exist in `Sources/`, so the map cannot drift from the code without this test failing.
@Suite(.timeLimit(.minutes(1))) struct ArchitectureMapTests {
    static let root = URL(filePath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Names the section may give that are not declared in this repository (libraries and system calls).
    static let external: Set<String> = [
        "Hummingbird", "Range", "If-Range", "Authorization", "Download", "DispatchQueue",
    ]

    /// The text of the README from `## Design` to the next second-level heading.
    static func designSection() throws -> String {
        let readme = try String(contentsOf: Self.root.appending(path: "README.md"), encoding: .utf8)
        let start = try #require(readme.range(of: "\n## Design\n"), "README.md has a '## Design' section")
        let rest = readme[start.upperBound...]
        let end = rest.range(of: "\n## ")?.lowerBound ?? rest.endIndex
        return String(rest[..<end])
    }

    /// Every source of the package's targets and tests (the section names the tests a new rule goes in), by file
    /// name, and all of their text.
    static func sources() throws -> (files: [String: URL], folders: Set<String>, text: String) {
        var files: [String: URL] = [:]
        var folders: Set<String> = []
        var text = ""
        for top in ["Sources", "Tests"] {
            let enumerator = try #require(
                FileManager.default.enumerator(at: Self.root.appending(path: top), includingPropertiesForKeys: nil))
            for case let url as URL in enumerator {
                // A folder by its name and by its path from each folder above it: `Delta/`, `Delivery/Delta/`.
                if url.hasDirectoryPath {
                    var components = url.standardizedFileURL.pathComponents.drop { $0 != top }.dropFirst()
                    while !components.isEmpty {
                        folders.insert(components.joined(separator: "/"))
                        components = components.dropFirst()
                    }
                }
                guard ["swift", "c", "h"].contains(url.pathExtension), !url.path.contains("/Fixtures/") else { continue }
                files[url.deletingPathExtension().lastPathComponent] = url
                text += try String(contentsOf: url, encoding: .utf8) + "\n"
            }
        }
        return (files, folders, text)
    }

    /// The spans between backticks.
    static func quoted(_ text: String) -> [String] {
        text.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
    }

    static func declares(_ name: String, in text: String) -> Bool {
        let kinds = ["struct", "class", "enum", "protocol", "actor", "typealias", "extension"]
        return kinds.contains { text.contains("\($0) \(name)") }
    }

    static func hasMember(_ name: String, in text: String) -> Bool {
        let kinds = ["func", "var", "let", "case", "static func", "static let", "static var", "init"]
        return kinds.contains { text.contains("\($0) \(name)") } || text.contains("case .\(name)")
            || text.contains("case \(name)(")
    }

    /// What in one backticked span the map claims exists, or nil when the span is not a name of the code.
    static func problems(in span: String, files: [String: URL], folders: Set<String>, text: String) -> [String] {
        // A folder: `Queue/`.
        if span.hasSuffix("/"), !span.contains(" ") {
            let folder = String(span.dropLast())
            return folders.contains(folder) ? [] : ["folder \(span)"]
        }
        // A file of an extension: `+Driver`, `DownloadQueue+Driver`, `ChunkAssembly+FirstInstall`.
        if span.range(of: #"^[A-Z][A-Za-z]*\+[A-Z][A-Za-z]+$"#, options: .regularExpression) != nil {
            return files[span] == nil ? ["file \(span).swift"] : []
        }
        if span.range(of: #"^\+[A-Z][A-Za-z]+$"#, options: .regularExpression) != nil {
            return files.keys.contains { $0.hasSuffix(span) } ? [] : ["file *\(span).swift"]
        }
        // A type, a nested type or a member: `DownloadMachine`, `Stage.Kind.successors`, `TransferID.part`.
        guard span.range(of: #"^[A-Z][a-z][A-Za-z0-9]*(\.[A-Za-z][A-Za-z0-9]*)*$"#, options: .regularExpression) != nil else {
            return []
        }
        let parts = span.split(separator: ".").map(String.init)
        guard !Self.external.contains(parts[0]) else { return [] }
        var missing: [String] = []
        for part in parts {
            if part.first?.isUppercase == true {
                if !Self.declares(part, in: text) { missing.append("type \(part) (in `\(span)`)") }
            } else if !Self.hasMember(part, in: text) {
                missing.append("member \(part) (in `\(span)`)")
            }
        }
        return missing
    }

    @Test func everyNameTheDesignSectionGivesExistsInTheSources() throws {
        let section = try Self.designSection()
        let (files, folders, text) = try Self.sources()
        let spans = Self.quoted(section)
        #expect(spans.count > 50, "the Design section names the code it describes")
        var missing: [String] = []
        for span in Set(spans) { missing += Self.problems(in: span, files: files, folders: folders, text: text) }
        #expect(missing.isEmpty, "README.md's Design section names what the code does not have: \(missing.sorted())")
    }

    /// The checker itself finds a name that is not there.
    @Test func aNameThatIsNotInTheSourcesIsFound() throws {
        let (files, folders, text) = try Self.sources()
        #expect(Self.problems(in: "DownloadMachine", files: files, folders: folders, text: text).isEmpty)
        #expect(!Self.problems(in: "DownloadMachinery", files: files, folders: folders, text: text).isEmpty)
        #expect(!Self.problems(in: "DownloadMachine.teleport", files: files, folders: folders, text: text).isEmpty)
        #expect(!Self.problems(in: "Nowhere/", files: files, folders: folders, text: text).isEmpty)
        #expect(!Self.problems(in: "+Teleport", files: files, folders: folders, text: text).isEmpty)
        #expect(Self.problems(in: "Queue/", files: files, folders: folders, text: text).isEmpty)
        #expect(Self.problems(in: "Delivery/Delta/", files: files, folders: folders, text: text).isEmpty)
        #expect(!Self.problems(in: "Delivery/Nowhere/", files: files, folders: folders, text: text).isEmpty)
    }
}
