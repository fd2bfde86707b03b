import Foundation
import Testing

/// Every Swift snippet of the README's "The library" section and of the DocC catalog compiles: the suite compiles
/// DocSnippets.swift, which holds each of them verbatim, in a sync context, an async one, or both (see its header).
/// This test keeps that file and the docs the same; `scripts/doc-snippets` writes the file again from the docs.
@Suite(.timeLimit(.minutes(1))) struct DocSnippetTests {
    static let sources: [(path: String, section: String?)] = [
        ("README.md", "## The library"),
        ("Sources/PackDelivery/PackDelivery.docc/EmbeddingInAStoreClient.md", nil),
        ("Sources/PackDelivery/PackDelivery.docc/PackDelivery.md", nil),
    ]

    /// The bodies of a Markdown text's ```swift blocks, in order, each line with its newline.
    static func snippets(_ text: String) -> [String] {
        var result: [String] = []
        var current: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if let body = current {
                if trimmed == "```" {
                    result.append(body)
                    current = nil
                } else {
                    current = body + line + "\n"
                }
            } else if trimmed == "```swift" {
                current = ""
            }
        }
        return result
    }

    /// A block of DocSnippets.swift: the snippet's id, its text, and where it stands.
    struct Block {
        enum Context { case file, sync, async }
        var id: String
        var body: String
        var context: Context
    }

    /// The blocks of DocSnippets.swift; a snippet compiled in two contexts has two. An observer method's class
    /// counts as a sync context, as the queue calls it.
    static func blocks(_ text: String) -> [Block] {
        var result: [Block] = []
        var current: Block?
        var previous = Substring()
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            defer { previous = line }
            if var block = current {
                if line == "// end snippet" {
                    result.append(block)
                    current = nil
                } else {
                    block.body += line + "\n"
                    current = block
                }
            } else if line.hasPrefix("// snippet ") {
                let context: Block.Context =
                    previous.hasPrefix("@MainActor func async")
                    ? .async : previous.hasPrefix("func sync") || previous.hasPrefix("private final class Member") ? .sync : .file
                current = Block(id: String(line.dropFirst("// snippet ".count)), body: "", context: context)
            }
        }
        return result
    }

    @Test func everySwiftSnippetOfTheLibraryDocsIsCompiledVerbatim() throws {
        let root = CLI.packageRoot
        let file = try String(contentsOf: root.appending(path: "Tests/PackDeliveryTests/DocSnippets.swift"), encoding: .utf8)
        let blocks = Dictionary(grouping: Self.blocks(file), by: \.id)
        var ids = Set<String>()
        for source in Self.sources {
            var text = try String(contentsOf: root.appending(path: source.path), encoding: .utf8)
            if let section = source.section {
                let start = try #require(text.range(of: section), "\(source.path) has a section \(section)")
                let end = text[start.upperBound...].range(of: "\n## ")?.lowerBound ?? text.endIndex
                text = String(text[start.lowerBound..<end])
            }
            for (index, snippet) in Self.snippets(text).enumerated() {
                let id = "\(source.path) \(index)"
                if snippet.contains(".package(") {
                    #expect(file.contains("// \(id): a Package.swift fragment"), "\(id) is new: run scripts/doc-snippets")
                    continue
                }
                ids.insert(id)
                let compiled = blocks[id] ?? []
                #expect(!compiled.isEmpty, "\(id) is not compiled: run scripts/doc-snippets")
                for block in compiled { #expect(block.body == snippet, "\(id) is not the docs' snippet: run scripts/doc-snippets") }
            }
        }
        #expect(ids.count >= 18, "every snippet was found: \(ids.count)")
        #expect(Set(blocks.keys) == ids, "blocks of snippets the docs no longer have: run scripts/doc-snippets")
        // The error matching the docs show (`catch … where error.code == …`, then a plain catch) compiles in both kinds of context.
        let matching = blocks.values.joined().filter { $0.body.contains("catch where error.code ==") }
        #expect(matching.contains { $0.context == .sync } && matching.contains { $0.context == .async }, "\(matching.map(\.id))")
    }
}
