import CMalloc
import Foundation
import PackFuzzHarness
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The fuzzers' seeds (`Fuzz/corpus`) and every input they
/// saved (`Fuzz/crashers`) go through the same harness as under libFuzzer (`Fuzz/Harness`), here without
/// sanitizers. Each input returns within 10 s; a refusal is a thrown `PackDeliveryError`; nothing is written
/// outside the staging folder and nothing inside it leads out; a receipt's header or claims, signed into a token,
/// is accepted only as JSONSerialization reads it. Seeds named `valid-*` must be accepted and `hostile-*` refused
/// (`odd-*` either); saved leaks (`leak-*`) must not grow the heap when replayed.
@Suite(.serialized, .timeLimit(.minutes(1)))
struct FuzzCorpusTests {
    static let fuzzFolder = URL(filePath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appending(path: "Fuzz")

    /// The files (relative to `Fuzz/`) in these folders of `Fuzz/`, sorted; folders that do not exist count as empty.
    static func inputs(_ folders: String...) -> [String] {
        folders.flatMap { folder in
            let names = (try? FileManager.default.contentsOfDirectory(atPath: Self.fuzzFolder.appending(path: folder).path)) ?? []
            return names.filter { !$0.hasPrefix(".") && !$0.hasSuffix(".md") }.map { "\(folder)/\($0)" }
        }.sorted()
    }

    static let manifestInputs = Self.inputs("corpus/manifest", "crashers/manifest")
    static let indexInputs = Self.inputs("corpus/index", "crashers/index")
    /// Packs go through both pack targets, whichever found them.
    static let packInputs = Self.inputs("corpus/pack", "crashers/inspect", "crashers/unpack")
    static let receiptHeaderInputs = Self.inputs("corpus/receipt-header", "crashers/receipt-header")
    static let receiptClaimsInputs = Self.inputs("corpus/receipt-claims", "crashers/receipt-claims")
    static let printableInputs = Self.inputs("corpus/printable", "crashers/printable")
    static let metalinkInputs = Self.inputs("corpus/metalink", "crashers/metalink")

    /// The most one input may take; the fuzzers' `-timeout`.
    static let deadline: Duration = .seconds(10)

    /// Runs `body` on a thread of its own and waits at most `deadline`: nil when it has not returned by then
    /// (a hang; the thread is left behind, the test fails instead of hanging).
    static func withDeadline(_ body: @escaping @Sendable () -> FuzzHarness.Outcome) -> (FuzzHarness.Outcome, Duration)? {
        let result = Mutex<(FuzzHarness.Outcome, Duration)?>(nil)
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            let clock = ContinuousClock()
            var outcome: FuzzHarness.Outcome?
            let elapsed = clock.measure { outcome = body() }
            result.withLock { $0 = (outcome!, elapsed) }
            done.signal()
        }
        thread.stackSize = 8 << 20
        thread.start()
        let seconds = Double(Self.deadline.components.seconds)
        guard done.wait(timeout: .now() + seconds) == .success else { return nil }
        return result.withLock { $0 }
    }

    static func data(_ input: String) throws -> Data {
        try Data(contentsOf: Self.fuzzFolder.appending(path: input))
    }

    /// Checks one run. `valid-*` inputs must be accepted; `hostile-*` ones refused when `refusesHostile`
    /// (manifest decoding and unpacking are the gates; inspection reads only what a manifest needs).
    static func expect(
        _ result: (FuzzHarness.Outcome, Duration)?, _ input: String, _ target: String, refusesHostile: Bool,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        guard let (outcome, elapsed) = result else {
            Issue.record("\(target) of \(input) did not return within \(Self.deadline)", sourceLocation: sourceLocation)
            return
        }
        #expect(outcome.problems.isEmpty, "\(target) of \(input): \(outcome.problems)", sourceLocation: sourceLocation)
        #expect(elapsed < Self.deadline, "\(target) of \(input) took \(elapsed)", sourceLocation: sourceLocation)
        let name = input.split(separator: "/").last.map(String.init) ?? input
        if name.hasPrefix("valid-") {
            #expect(
                outcome.accepted, "\(target) accepts \(input): \(outcome.error?.description ?? outcome.refusal ?? "")",
                sourceLocation: sourceLocation)
        } else if refusesHostile, name.hasPrefix("hostile-") {
            #expect(!outcome.accepted, "\(target) refuses \(input)", sourceLocation: sourceLocation)
        }
    }

    @Test func theCorpusIsThere() {
        #expect(Self.manifestInputs.contains { $0.hasSuffix("/valid-one-pack.json") }, "Fuzz/corpus/manifest at \(Self.fuzzFolder.path)")
        #expect(Self.indexInputs.contains("corpus/index/valid-layout.json"), "Fuzz/corpus/index at \(Self.fuzzFolder.path)")
        for format in ["zip", "tar", "tar.gz", "tar.bz2", "tar.xz", "tar.zst"] {
            #expect(Self.packInputs.contains("corpus/pack/valid-layout.\(format)"), "a valid \(format) seed")
        }
        #expect(Self.receiptHeaderInputs.contains("corpus/receipt-header/hostile-crit.json"))
        #expect(Self.receiptClaimsInputs.contains("corpus/receipt-claims/hostile-products-twice.json"))
        #expect(Self.printableInputs.contains("corpus/printable/valid-osc-title.txt"))
        for encoding in ["utf8", "utf8-bom", "utf16le-bom", "utf16be-bom", "utf32le-bom", "utf32be-no-bom", "ebcdic", "utf7"] {
            #expect(Self.metalinkInputs.contains("corpus/metalink/hostile-dtd-\(encoding).meta4"), "a Metalink DTD in \(encoding)")
        }
    }

    @Test(arguments: Self.manifestInputs)
    func manifest(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.manifest(data) }, input, "manifest decoding", refusesHostile: true)
    }

    /// A pack index is refused by decoding and planning (a delta update then fetches the whole pack) or by the
    /// unpack of an entry.
    @Test(arguments: Self.indexInputs)
    func index(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.index(data) }, input, "index reading", refusesHostile: true)
    }

    @Test(arguments: Self.packInputs)
    func pack(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.inspect(data) }, input, "inspection", refusesHostile: false)
        Self.expect(Self.withDeadline { FuzzHarness.unpack(data) }, input, "unpacking", refusesHostile: true)
    }

    @Test(arguments: Self.receiptHeaderInputs)
    func receiptHeader(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.receiptHeader(data) }, input, "receipt header checking", refusesHostile: true)
    }

    @Test(arguments: Self.receiptClaimsInputs)
    func receiptClaims(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.receiptClaims(data) }, input, "receipt claims checking", refusesHostile: true)
    }

    /// A text from outside, escaped for a terminal: no control or bidirectional control left raw, and it reads back.
    @Test(arguments: Self.printableInputs)
    func printable(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.printable(data) }, input, "escaping for a terminal", refusesHostile: false)
    }

    /// A Metalink file is refused (a DTD in any encoding, EBCDIC, a declaration the bytes belie) or read as it says.
    @Test(arguments: Self.metalinkInputs)
    func metalink(_ input: String) throws {
        let data = try Self.data(input)
        Self.expect(Self.withDeadline { FuzzHarness.metalink(data) }, input, "Metalink reading", refusesHostile: true)
    }

    /// A saved leak (`leak-*`) replayed 1,000 times must not grow the heap.
    @Test(
        arguments: Self.inputs(
            "crashers/manifest", "crashers/inspect", "crashers/unpack", "crashers/index", "crashers/receipt-header",
            "crashers/receipt-claims", "crashers/printable", "crashers/metalink"
        )
        .filter { $0.contains("/leak-") })
    func savedLeak(_ input: String) throws {
        let data = try Self.data(input)
        let target = input.split(separator: "/")[1]
        func run(_ data: Data) -> FuzzHarness.Outcome {
            switch target {
            case "manifest": FuzzHarness.manifest(data)
            case "index": FuzzHarness.index(data)
            case "inspect": FuzzHarness.inspect(data)
            case "receipt-header": FuzzHarness.receiptHeader(data)
            case "receipt-claims": FuzzHarness.receiptClaims(data)
            case "printable": FuzzHarness.printable(data)
            case "metalink": FuzzHarness.metalink(data)
            default: FuzzHarness.unpack(data)
            }
        }
        for _ in 0..<50 { _ = run(data) }  // caches, lazily made globals
        let before = try Self.heapInUse()
        for _ in 0..<1000 { _ = run(data) }
        let grown = try Self.heapInUse() - before
        #expect(grown < 64 << 10, "\(input): the heap grew by \(grown) bytes over 1,000 runs")
    }

    /// Bytes allocated with malloc and not freed, over all of glibc's arenas (`malloc_info`'s totals: what the
    /// arenas took from the system and mmapped chunks, less their free chunks). `mallinfo2` counts only the
    /// main thread's arena, and swift-testing runs tests on other threads.
    static func heapInUse() throws -> Int {
        var buffer: UnsafeMutablePointer<CChar>?
        var size = 0
        let stream = try #require(open_memstream(&buffer, &size))
        malloc_info(0, stream)
        fclose(stream)
        defer { free(buffer) }
        let xml = String(cString: try #require(buffer))
        // The totals over all arenas come after the last </heap>.
        let totals = xml[(xml.range(of: "</heap>", options: .backwards)?.upperBound ?? xml.startIndex)...]
        func total(_ pattern: Regex<(Substring, Substring)>) throws -> Int {
            try #require(totals.firstMatch(of: pattern).flatMap { Int($0.output.1) }, "\(totals)")
        }
        return try total(/<system type="current" size="(\d+)"/) + total(/<total type="mmap" count="\d+" size="(\d+)"/)
            - total(/<total type="fast" count="\d+" size="(\d+)"/) - total(/<total type="rest" count="\d+" size="(\d+)"/)
    }
}
