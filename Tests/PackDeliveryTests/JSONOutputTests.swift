import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// The README's JSON examples against what `packs` really prints. Every fenced block of README.md whose info
/// string starts with `json` is labelled with what prints it (`json events`, `json status`, …); each object of
/// a block must have exactly the keys, with values of the same types, of a real object printed in the same
/// situation, and each real object must have the top-level keys of one of its label's examples.
@Suite(.timeLimit(.minutes(3))) struct JSONOutputTests {
    @Test func theReadmesJSONExamplesHaveTheKeysAndTypesOfRealOutput() throws {
        let examples = try Self.readmeExamples()
        let real = try Self.realOutput()
        #expect(
            Set(examples.keys) == Set(real.keys),
            "README json blocks are labelled \(examples.keys.sorted()); the test makes \(real.keys.sorted())")
        for (label, objects) in examples.sorted(by: { $0.key < $1.key }) {
            guard let printed = real[label] else { continue }
            #expect(!objects.isEmpty, "the README's json \(label) block holds no object")
            #expect(!printed.isEmpty, "packs printed nothing for json \(label)")
            for example in objects {
                let candidates = printed.filter { Self.sameSituation(example, $0) }
                let misses = candidates.map { Self.differences(example: example, real: $0) }
                if !misses.contains(where: \.isEmpty) {
                    let closest = misses.min { $0.count < $1.count } ?? ["no real object in the same situation (event, state, phase)"]
                    Issue.record(
                        "The README's json \(label) example \(Self.describe(example)) does not match real output: \(closest.joined(separator: "; "))"
                    )
                }
            }
            for object in printed {
                guard case .object(let fields) = object else {
                    Issue.record("packs printed a non-object for json \(label): \(Self.describe(object))")
                    continue
                }
                let documented = objects.contains { example in
                    guard case .object(let exampleFields) = example else { return false }
                    return exampleFields["event"] == fields["event"] && Set(exampleFields.keys) == Set(fields.keys)
                }
                #expect(documented, "packs printed keys no README json \(label) example has: \(fields.keys.sorted())")
            }
        }
    }

    // MARK: - The README

    /// The objects of each labelled `json` block of README.md, by label.
    static func readmeExamples() throws -> [String: [JSONValue]] {
        let readme = try String(contentsOf: CLI.packageRoot.appending(path: "README.md"), encoding: .utf8)
        var examples: [String: [JSONValue]] = [:]
        var label: String?
        var block = ""
        for line in readme.split(separator: "\n", omittingEmptySubsequences: false) {
            if let current = label {
                if line.trimmingCharacters(in: .whitespaces) == "```" {
                    examples[current, default: []] += try Self.objects(in: block, label: current)
                    label = nil
                } else {
                    block += line + "\n"
                }
            } else if line.hasPrefix("```json") {
                let name = line.dropFirst("```json".count).trimmingCharacters(in: .whitespaces)
                #expect(!name.isEmpty, "a json block of the README has no label saying what prints it: \(line)")
                label = name
                block = ""
            }
        }
        #expect(label == nil, "the README's json \(label ?? "") block is not closed")
        return examples
    }

    /// The top-level JSON objects of a block (each may span lines).
    static func objects(in text: String, label: String) throws -> [JSONValue] {
        var objects: [JSONValue] = []
        var depth = 0
        var inString = false
        var escaped = false
        var start: String.Index?
        for index in text.indices {
            let character = text[index]
            if inString {
                if escaped {
                    escaped = false
                } else if character == "\\" {
                    escaped = true
                } else if character == "\"" {
                    inString = false
                }
                continue
            }
            switch character {
            case "\"": inString = true
            case "{", "[":
                if depth == 0 { start = index }
                depth += 1
            case "}", "]":
                depth -= 1
                if depth == 0, let first = start {
                    let object = String(text[first...index])
                    do {
                        objects.append(try JSONDecoder().decode(JSONValue.self, from: Data(object.utf8)))
                    } catch {
                        throw FixtureError("The README's json \(label) block holds invalid JSON (\(error)): \(object)")
                    }
                }
            default: break
            }
        }
        return objects
    }

    // MARK: - Real output

    /// Runs `packs` as the README's examples describe, against a loopback server, and returns what it printed, by label.
    static func realOutput() throws -> [String: [JSONValue]] {
        let work = try Fixtures.temporaryDirectory("json-output")
        let site = work.appending(path: "site")
        let home = work.appending(path: "home")
        try FileManager.default.createDirectory(at: site, withIntermediateDirectories: true)
        let samples = CLI.packageRoot.appending(path: "SampleContent")
        try Self.packs(["pack", samples.appending(path: "forest").path, "--output", site.appending(path: "forest.zip").path])
        try Self.packs(["pack", samples.appending(path: "ocean").path, "--output", site.appending(path: "ocean.tar.gz").path])
        try Self.packs(["manifest", site.path])
        let manifest = try Self.file(site.appending(path: "manifest.json"))
        let server = try FaultServer(root: site)
        defer { server.stop() }
        let manifestURL = server.baseURL.appending(path: "manifest.json").absoluteString
        var real: [String: [JSONValue]] = ["manifest": [manifest]]
        /// Adds each line of `stdout` to what `packs` printed for `label`.
        func record(_ label: String, _ stdout: String) throws {
            real[label, default: []] += try stdout.split(separator: "\n").map {
                try JSONDecoder().decode(JSONValue.self, from: Data($0.utf8))
            }
        }

        // forest straight away; ocean after a 503 with Retry-After; gone is not on the server (404).
        try Self.editManifest(site) { manifest in
            let ocean = try #require(manifest.products.firstIndex { $0.productIdentifier == "com.example.ocean" })
            manifest.products[ocean].contents[0].url =
                server.url("ocean.tar.gz", fault: .status(503, times: 1, retryAfter: 1)).absoluteString
            var gone = try #require(manifest.products.first { $0.productIdentifier == "com.example.forest" })
            gone.productIdentifier = "com.example.gone"
            gone.contents[0].contentIdentifier = "com.example.gone"
            gone.contents[0].url = "gone.zip"
            gone.contents[0].index = nil
            manifest.products.append(gone)
        }
        let fetch = try CLI.run(home: home, ["--json", "fetch", manifestURL, "com.example.forest", "com.example.ocean"])
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        try record("events", fetch.stdout)
        // A finished download reads the same from the store as from its machine: no error, nothing left to wait.
        for line in fetch.stdout.split(separator: "\n")
        where line.contains(#""state":"finished""#) && line.contains(#""event":"transaction""#) {
            #expect(line.contains(#""error":null"#) && !line.contains(#""timeRemaining":-1"#), "\(line)")
        }
        let gone = try CLI.run(home: home, ["--json", "fetch", manifestURL, "com.example.gone"])
        #expect(gone.status == 65, "a pack the server does not have: \(gone.stderr)")
        try record("events", gone.stdout)
        try record("status", try CLI.run(home: home, ["--json", "status"]).stdout)
        try record("content", try CLI.run(home: home, ["--json", "content"]).stdout)

        // One file of forest changed and one added: verify finds both; --repair delivers forest again.
        let installed = home.appending(path: "Caches/com.example.forest/Contents")
        let handle = try FileHandle(forWritingTo: installed.appending(path: "README.txt"))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("changed\n".utf8))
        try handle.close()
        try Data("extra".utf8).write(to: installed.appending(path: "extra.bin"))
        let verify = try CLI.run(home: home, ["--json", "verify"])
        #expect(verify.status == 65, "stderr: \(verify.stderr)")
        try record("verify", verify.stdout)
        let repair = try CLI.run(home: home, ["--json", "verify", "--repair", "com.example.forest"])
        #expect(repair.status == 0, "stderr: \(repair.stderr)")
        let repaired = repair.stdout.split(separator: "\n")
        try record("events", repaired.dropLast().joined(separator: "\n"))
        try record("verify", repaired.last.map(String.init) ?? "")

        // forest 2.0 changes one file: a delta update. forest 3.0 from a server that ignores Range: a fallback.
        for (version, fault) in [("2.0", Fault.none), ("3.0", Fault.ignoreRange)] {
            let content = work.appending(path: "forest-\(version)")
            try FileManager.default.copyItem(at: samples.appending(path: "forest"), to: content)
            try Data("version \(version)\n".utf8).write(to: content.appending(path: "Contents/README.txt"))
            try FileManager.default.removeItem(at: site.appending(path: "forest.zip"))
            try Self.packs([
                "pack", content.path, "--product", "com.example.forest", "--version", version, "--output",
                site.appending(path: "forest.zip").path,
            ])
            try Self.packs(["manifest", site.path])
            try Self.editManifest(site) { manifest in
                let forest = try #require(manifest.products.firstIndex { $0.productIdentifier == "com.example.forest" })
                manifest.products[forest].contents[0].url = server.url("forest.zip", fault: fault).absoluteString
            }
            let update = try CLI.run(home: home, ["--json", "fetch", manifestURL, "com.example.forest"])
            #expect(update.status == 0, "forest \(version): \(update.stderr)")
            try record("events", update.stdout)
        }

        // An on-demand pack: bought (nothing fetched), then asked for with `use`, which raises it (a priorityChanged
        // line), fetches it and prints it as `content` does.
        try Self.packs([
            "pack", samples.appending(path: "ocean").path, "--product", "com.example.music", "--version", "1.0", "--output",
            site.appending(path: "music.tar.gz").path,
        ])
        try Self.packs(["manifest", site.path, "--delivery", "com.example.music=onDemand"])
        let buy = try CLI.run(home: home, ["--json", "fetch", manifestURL, "com.example.music"])
        #expect(buy.status == 0, "stderr: \(buy.stderr)")
        try record("events", buy.stdout)
        let use = try CLI.run(home: home, ["--json", "use", "com.example.music"])
        #expect(use.status == 0, "stderr: \(use.stderr)")
        let used = use.stdout.split(separator: "\n")
        #expect(used.contains { $0.contains(#""event":"priorityChanged""#) }, "\(use.stdout)")
        try record("events", used.filter { $0.contains(#""event":"#) }.joined(separator: "\n"))
        try record("content", used.filter { !$0.contains(#""event":"#) }.joined(separator: "\n"))

        try Self.packs(["keygen", work.appending(path: "publisher").path])
        try Self.packs(["manifest", site.path, "--sign", work.appending(path: "publisher.key").path])
        real["signature"] = [try Self.file(site.appending(path: "manifest.json.sig"))]
        return real
    }

    /// Runs `packs ARGS…` (without a home), expecting success.
    static func packs(_ arguments: [String]) throws {
        let result = try Fixtures.run(CLI.binary, arguments)
        #expect(result.status == 0, "packs \(arguments.joined(separator: " ")): \(result.stderr)")
    }

    static func file(_ url: URL) throws -> JSONValue {
        try JSONDecoder().decode(JSONValue.self, from: Data(contentsOf: url))
    }

    static func editManifest(_ site: URL, _ change: (inout Manifest) throws -> Void) throws {
        let url = site.appending(path: "manifest.json")
        var manifest = try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: url))
        try change(&manifest)
        try JSONEncoder().encode(manifest).write(to: url)
    }

    // MARK: - Comparing

    /// Whether a real object was printed in the situation an example shows: the same event, state and phase.
    static func sameSituation(_ example: JSONValue, _ real: JSONValue) -> Bool {
        guard case .object(let exampleFields) = example, case .object(let realFields) = real else { return false }
        return ["event", "state", "phase"].allSatisfy { key in exampleFields[key] == nil || exampleFields[key] == realFields[key] }
    }

    /// Where a real value differs from an example in keys or value types (empty when it does not). An empty
    /// example array matches any array; each element of another must match an element of the real array.
    static func differences(example: JSONValue, real: JSONValue, at path: String = "") -> [String] {
        switch (example, real) {
        case (.object(let exampleFields), .object(let realFields)):
            var found: [String] = []
            for key in Set(exampleFields.keys).union(realFields.keys).sorted() {
                switch (exampleFields[key], realFields[key]) {
                case (let e?, let r?): found += Self.differences(example: e, real: r, at: path + "." + key)
                case (_?, nil): found.append("\(path).\(key) is in the README but not printed")
                case (nil, _?): found.append("\(path).\(key) is printed but not in the README")
                case (nil, nil): break
                }
            }
            return found
        case (.array(let exampleElements), .array(let realElements)):
            if exampleElements.isEmpty { return [] }
            if realElements.isEmpty { return ["\(path) is an empty array when printed"] }
            var found: [String] = []
            for (index, element) in exampleElements.enumerated() {
                let misses = realElements.map { Self.differences(example: element, real: $0, at: "\(path)[\(index)]") }
                if !misses.contains(where: \.isEmpty) { found += misses.min { $0.count < $1.count } ?? [] }
            }
            return found
        case (.string, .string), (.number, .number), (.bool, .bool), (.null, .null):
            return []
        default:
            return ["\(path.isEmpty ? "the value" : path) is \(example.typeName) in the README but \(real.typeName) when printed"]
        }
    }

    static func describe(_ value: JSONValue) -> String {
        guard case .object(let fields) = value else { return value.typeName }
        let situation = ["event", "state", "phase"].compactMap { key in fields[key].map { "\(key) \($0)" } }
        return "{\(situation.isEmpty ? fields.keys.sorted().prefix(3).joined(separator: ", ") + ", …" : situation.joined(separator: ", "))}"
    }
}

/// Any JSON value, decoded without knowing its shape.
indirect enum JSONValue: Decodable, Equatable, CustomStringConvertible {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    var description: String {
        switch self {
        case .null: "null"
        case .bool(let value): "\(value)"
        case .number(let value): "\(value)"
        case .string(let value): value
        case .array(let values): "[\(values.map(\.description).joined(separator: ", "))]"
        case .object(let fields): "{\(fields.keys.sorted().joined(separator: ", "))}"
        }
    }
}
