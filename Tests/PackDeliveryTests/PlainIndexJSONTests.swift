import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// ``PackIndex/plainlyDecoded(_:)``, the one-pass reader of indexes written plainly: it reads every index `packs pack`
/// writes as Foundation's `JSONDecoder` reads it, and leaves every other JSON to `JSONDecoder` (nil), so that a hostile
/// index is refused by ``PackIndex/decode(_:maxEntries:containers:)`` with the code and message it had before.
@Suite("Plain index JSON", .serialized, .timeLimit(.minutes(4)))
struct PlainIndexJSONTests {
    static let digest = String(repeating: "ab", count: 32)

    /// What `JSONDecoder` reads from `json`, or nil.
    static func decoded(_ json: Data) -> PackIndex? {
        try? JSONDecoder().decode(PackIndex.self, from: json)
    }

    /// The JSON of `index` as `packs pack` writes it (``PackIndexer/write(_:to:)``), or pretty-printed.
    static func json(_ index: PackIndex, pretty: Bool = false) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting =
            pretty ? [.sortedKeys, .withoutEscapingSlashes, .prettyPrinted] : [.sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(index)
    }

    /// `decode`'s refusal of `json`, or nil when it accepts it.
    static func refusal(_ json: Data) -> DeltaRefusal? {
        do {
            _ = try PackIndex.decode(json, maxEntries: 100_000, containers: Set(PackIndex.Container.allCases))
            return nil
        } catch {
            return error
        }
    }

    /// `json` with its first member's name written with an escape (`"\u0066ormat"`): the same index to `JSONDecoder`,
    /// and JSON the plain reader leaves to it.
    static func escaped(_ json: String) -> String {
        json.replacing(#"{"chunking":"#, with: #"{"\u0063hunking":"#, maxReplacements: 1)
    }

    @Test("Every index `packs pack` writes, each format, is read as JSONDecoder reads it")
    func packsIndexesReadAlike() throws {
        let content = try ChunkedPackTests.content("plain-json-content")
        let grouped = try GroupedFramesTests.content("plain-json-grouped")
        let packs: [(URL, PackFormat)] = [
            (content, .tar), (content, .tarZstd), (content, .tarGzip), (content, .zip), (grouped, .tarZstd),
        ]
        var formats = Set<Int>()
        for (folder, format) in packs {
            let (pack, _) = try ChunkedPackTests.pack(folder, format, label: "plain-json-site")
            let json = try PackIndex.json(try Data(contentsOf: PackWriter.indexURL(for: pack)))
            let plain = try #require(PackIndex.plainlyDecoded(json), "\(format.rawValue): read plainly")
            #expect(plain == Self.decoded(json), "\(format.rawValue)")
            formats.insert(plain.format)
            // Pretty-printed, the same index.
            #expect(PackIndex.plainlyDecoded(try Self.json(plain, pretty: true)) == plain, "\(format.rawValue), pretty-printed")
        }
        #expect(formats == [2, 3], "formats 2 and 3 were read")
    }

    @Test("Every field of every format, UTF-8 paths, negative and zero numbers are read as JSONDecoder reads them")
    func everyFieldReadAlike() throws {
        let chunks = [
            PackIndex.Chunk(sha256: Self.digest, size: 10, offset: 0, length: 10, storage: .raw),
            PackIndex.Chunk(sha256: Self.digest.uppercased(), size: 5, offset: -3, length: 999_999_999_999_999_999, storage: .zstdFrame),
            PackIndex.Chunk(sha256: Self.digest, size: 7, offset: 100, length: 20, frameSize: 30, frameOffset: 0),
            PackIndex.Chunk(sha256: "", size: 1, offset: 2, length: 3, storage: .gzipMember),
            PackIndex.Chunk(sha256: Self.digest, size: 1, offset: 2, length: 3, storage: .deflatedZipEntry),
        ]
        let entries = [
            PackIndex.Entry(path: "Contents", kind: .directory, size: 0, sha256: nil, method: 0, offset: 0, length: 0, mode: 0o040755),
            PackIndex.Entry(
                path: "Contents/é 日本/ü.bin", kind: .file, size: 33, sha256: Self.digest, method: 8, offset: 40, length: 300, mode: 0o100644,
                chunks: chunks),
            PackIndex.Entry(
                path: "Contents/link", kind: .symlink, size: 5, sha256: Self.digest, method: 0, offset: 0, length: 0, mode: 0o120777,
                target: "b.txt"),
            PackIndex.Entry(path: "Contents/none", kind: .file, size: -1, sha256: nil, method: 0, offset: 0, length: 0, chunks: []),
        ]
        var indexes = [PackIndex(entries: Array(entries.prefix(2)))]
        for container in PackIndex.Container.allCases {
            indexes.append(
                PackIndex(
                    container: container, pack: .init(length: 12_345, sha256: Self.digest), chunking: .init(Chunker.standard),
                    entries: entries))
        }
        indexes.append(PackIndex(container: .tar, pack: .init(length: 0, sha256: "x"), chunking: nil, entries: []))
        var unrecorded = PackIndex(
            container: .tarZstd, pack: .init(length: 1, sha256: Self.digest), chunking: .init(Chunker.standard), entries: entries)
        unrecorded.format = 3
        unrecorded.chunking?.normalization = nil
        unrecorded.chunking?.algorithm = "buzhash"
        indexes.append(unrecorded)
        for index in indexes {
            for pretty in [false, true] {
                let json = try Self.json(index, pretty: pretty)
                let plain = try #require(PackIndex.plainlyDecoded(json), "\(String(decoding: json, as: UTF8.self))")
                #expect(plain == Self.decoded(json))
                #expect(plain == index)
            }
        }
    }

    @Test("JSON outside the plain subset is left to JSONDecoder, and what the plain reader reads JSONDecoder reads the same")
    func otherJSONLeftToJSONDecoder() throws {
        let chunk = #"{"length":3,"offset":1,"sha256":"\#(Self.digest)","size":3,"storage":"raw"}"#
        let file = #"{"chunks":[\#(chunk)],"kind":"file","mode":33188,"path":"Contents/a","sha256":"\#(Self.digest)","size":3}"#
        let root =
            #"{"chunking":{"algorithm":"fastcdc","average":65536,"maximum":262144,"minimum":16384},"container":"tar","entries":[\#(file)],"format":2,"pack":{"length":10,"sha256":"\#(Self.digest)"}}"#
        let plainOnes = [root, " \n\t\r\(root)\n ", root.replacing(",", with: " ,\n "), root.replacing(":", with: " : ")]
        for text in plainOnes {
            #expect(PackIndex.plainlyDecoded(Data(text.utf8)) != nil, "\(text)")
        }
        let variants: [String] = [
            root.replacing(#""format":2"#, with: #""format":2.0"#),
            root.replacing(#""format":2"#, with: #""format":2e0"#),
            root.replacing(#""format":2"#, with: #""format":02"#),
            root.replacing(#""format":2"#, with: #""format":-0"#),
            root.replacing(#""format":2"#, with: #""format":"2""#),
            root.replacing(#""format":2"#, with: #""format":null"#),
            root.replacing(#""format":2"#, with: #""format":2,"format":3"#),
            root.replacing(#""format":2"#, with: #""format":2,"extra":[1,{"a":null}]"#),
            root.replacing(#""format":2"#, with: #""format":9223372036854775807"#),
            root.replacing(#""format":2"#, with: #""format":9223372036854775808"#),
            root.replacing(#""format":2"#, with: #""format":-9223372036854775808"#),
            root.replacing(#""format":2"#, with: #""format":123456789012345678"#),
            root.replacing(#""format":2"#, with: #""format":1234567890123456789"#),
            root.replacing(#""format":2"#, with: #""format":true"#),
            root.replacing(#""format":2"#, with: ""),
            root.replacing(#","format":2"#, with: ""),
            root.replacing(#""size":3,"storage""#, with: #""size":3,"frameSize":null,"storage""#),
            root.replacing(#""size":3,"storage""#, with: #""size":3,"size":4,"storage""#),
            root.replacing(#""storage":"raw""#, with: #""storage":"lz4""#),
            root.replacing(#""storage":"raw""#, with: #""storage":"RAW""#),
            root.replacing(#""kind":"file""#, with: #""kind":"fifo""#),
            root.replacing(#""container":"tar""#, with: #""container":"tar.lz""#),
            root.replacing(#""container":"tar""#, with: #""container":null"#),
            root.replacing("Contents/a", with: #"Contents\/a"#),
            root.replacing("Contents/a", with: #"Contents\u002Fa"#),
            root.replacing("Contents/a", with: #"Contents\u0000a"#),
            root.replacing("Contents/a", with: "Contents\ta"),
            root.replacing("Contents/a", with: "Contents/\u{7F}a"),
            root.replacing(#""kind""#, with: #""\u006Bind""#),
            root.replacing(#""mode":33188"#, with: #""mode":-33188"#),
            root.replacing(#""mode":33188"#, with: #""mode":- 1"#),
            root.replacing(#""mode":33188"#, with: #""mode":+1"#),
            root.replacing(#""mode":33188"#, with: #""mode":0x10"#),
            root.replacing(#""mode":33188"#, with: #""mode":1.5"#),
            root.replacing(#""mode":33188"#, with: #""mode":Infinity"#),
            root.replacing(#""mode":33188"#, with: #""mode":NaN"#),
            root.replacing("[\(chunk)]", with: "[\(chunk),]"),
            root.replacing("[\(chunk)]", with: "[\(chunk),\(chunk)]"),
            root.replacing("[\(chunk)]", with: "[]"),
            root.replacing("[\(chunk)]", with: "{}"),
            root.replacing(#""pack":{"#, with: #""pack":{"length":1,"#),
            root.replacing(#""minimum":16384"#, with: #""minimum":16384,"normalization":2"#),
            root.replacing(#""minimum":16384"#, with: #""minimum":16384,"normalization":"2""#),
            root + " ", root + "x", root + "{}", root + "\u{0}", "\u{FEFF}" + root, String(root.dropLast()), "[" + root + "]", "",
            "{}", "null", #"{"format":1,"entries":[]}"#, #"{"format":1,"entries":[],}"#, #"{"entries":[],"format":1,"container":"zip"}"#,
            #"{"format":1 "entries":[]}"#, #"{"format":1,,"entries":[]}"#, #"{format:1,"entries":[]}"#, #"{'format':1,"entries":[]}"#,
            #"{"format":1,"entries":[]} // comment"#, #"{"format":1,"entries":[]/*c*/}"#, #"{"format":1,"entries":[ ]}"#,
            Self.escaped(root),
        ]
        var plainlyRead = 0
        for text in variants {
            let json = Data(text.utf8)
            if let plain = PackIndex.plainlyDecoded(json) {
                plainlyRead += 1
                #expect(plain == Self.decoded(json), "read plainly as JSONDecoder reads it: \(text)")
            }
        }
        // Invalid UTF-8 in a path, a lone surrogate's bytes, and bytes cut in the middle of a character.
        for bytes: [UInt8] in [[0xFF], [0xC3], [0xED, 0xA0, 0x80], [0xC0, 0xAF], [0xF4, 0x90, 0x80, 0x80]] {
            var json = Array(root.utf8)
            let at = try #require(json.firstRange(of: Array("Contents/a".utf8))).upperBound
            json.insert(contentsOf: bytes, at: at)
            #expect(PackIndex.plainlyDecoded(Data(json)) == nil, "\(bytes)")
            #expect(Self.decoded(Data(json)) == nil, "\(bytes): JSONDecoder refuses it too")
        }
        #expect(plainlyRead >= 5, "some variants are plain (\(plainlyRead))")
    }

    @Test("Hostile indexes written plainly are refused with the code and message JSONDecoder's reading gave")
    func hostileIndexesRefusedAlike() throws {
        let huge = "9223372036854775807"
        var cases: [(String, String)] = []
        let chunk1 = #"{"length":3000,"offset":1000,"sha256":"\#(Self.digest)","size":70000,"storage":"zstd-frame"}"#
        let chunk2 = #"{"length":2000,"offset":4100,"sha256":"\#(Self.digest)","size":30000,"storage":"zstd-frame"}"#
        let file =
            #"{"chunks":[\#(chunk1),\#(chunk2)],"kind":"file","mode":33188,"path":"Contents/a.bin","sha256":"\#(Self.digest)","size":100000}"#
        let folder = #"{"kind":"directory","mode":16877,"path":"Contents","size":0}"#
        let root =
            #"{"chunking":{"algorithm":"fastcdc","average":65536,"maximum":262144,"minimum":16384},"container":"tar.zst","entries":[\#(folder),\#(file)],"format":2,"pack":{"length":10000,"sha256":"\#(Self.digest)"}}"#
        cases.append(("well formed", root))
        for (name, from, to) in [
            ("overlapping", #""offset":4100"#, #""offset":3999"#), ("outside the pack", #""offset":4100"#, #""offset":9000"#),
            ("negative offset", #""offset":1000"#, #""offset":-1"#), ("empty chunk", #""size":70000"#, #""size":0"#),
            ("fewer bytes", #""size":100000"#, #""size":200000"#), ("storage", #""storage":"zstd-frame"}"#, #""storage":"gzip-member"}"#),
            ("unknown storage", #""storage":"zstd-frame"}"#, #""storage":"lz4"}"#), ("not a file's", "33188", "41471"),
            ("no mode", #""mode":33188,"#, ""), ("twice", "\(folder),", "\(folder),\(folder),"),
            ("2^50", #""size":100000"#, #""size":123456789012345678"#), ("2^63", #""size":100000"#, #""size":\#(huge)"#),
            ("past 2^63", #""size":100000"#, #""size":9223372036854775808"#), ("pack length", #""length":10000"#, #""length":\#(huge)"#),
            ("no pack", #""pack":{"length":10000,"sha256":"\#(Self.digest)"}"#, #""pack":{}"#),
            ("format 4", #""format":2"#, #""format":4"#),
            ("chunk sizes", #""minimum":16384"#, #""minimum":1"#), ("escapes", "Contents/a.bin", "../a.bin"),
            ("absolute", "Contents/a.bin", "/etc/passwd"), ("dot", "Contents/a.bin", "Contents/./a"),
            ("empty part", "Contents/a.bin", "Contents//a"),
            ("zip range", #""kind":"file","#, #""kind":"file","length":100,"#),
            ("short digest", #""sha256":"\#(Self.digest)","size":30000"#, #""sha256":"ab","size":30000"#),
            ("slice fields", #""size":30000,"#, #""size":30000,"frameSize":4,"#),
            ("target", #""kind":"file","#, #""kind":"file","target":"x","#),
        ] {
            let changed = root.replacing(from, with: to, maxReplacements: 1)
            #expect(changed != root, "\(name) changes the index")
            cases.append((name, changed))
        }
        var refused = 0
        for (name, text) in cases {
            let plain = Self.refusal(Data(text.utf8))
            let before = Self.refusal(Data(Self.escaped(text).utf8))
            #expect(PackIndex.plainlyDecoded(Data(Self.escaped(text).utf8)) == nil, "\(name): the escaped index is left to JSONDecoder")
            #expect(plain?.fallback.reason == before?.fallback.reason, "\(name)")
            #expect(plain?.fallback.message == before?.fallback.message, "\(name): \(plain?.fallback.message ?? "accepted")")
            if plain != nil { refused += 1 }
        }
        #expect(refused == cases.count - 1, "every hostile index is refused")
    }

    /// The count of objects as ``PackIndex/objectCount(_:entriesAfter:totalAfter:)`` made it byte by byte before its
    /// strings were skipped with memchr.
    static func objectCountByteByByte(_ data: Data, entriesAfter shallowLimit: Int, totalAfter totalLimit: Int) -> (Int, Int) {
        var (shallow, total, depth) = (0, 0, 0)
        var (inString, escaped) = (false, false)
        for byte in data {
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
            } else if byte == UInt8(ascii: "\"") {
                inString = true
            } else if byte == UInt8(ascii: "{") {
                total += 1
                if depth == 2 { shallow += 1 }
                depth += 1
                if total > totalLimit || shallow > shallowLimit { break }
            } else if byte == UInt8(ascii: "[") {
                depth += 1
            } else if byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") {
                depth -= 1
            }
        }
        return (shallow, total)
    }

    @Test("Objects are counted outside strings as byte by byte: escaped quotes, runs of backslashes, braces in strings")
    func objectsCountedAsBefore() throws {
        var texts = [
            #"{"entries":[{"path":"a{b}","x":"\"{"},{"p":"\\"},{"q":"\\\"{"}]}"#, #"{"a":"\\\\"}{"#, #"{"a":"{{{"#, #""\"#,
            #"{"entries":[{},{},{"c":[{},{}]}]}"#, "", #"""#, #"{"a":"\u0022{"}"#,
        ]
        var random = SplitMix(state: 29)
        let alphabet = Array(#"{}[]"\ a:,"#.utf8)
        for _ in 0..<2_000 {
            texts.append(
                String(
                    decoding: (0..<Int.random(in: 0..<60, using: &random)).map { _ in alphabet.randomElement(using: &random)! },
                    as: UTF8.self))
        }
        for text in texts {
            for (entries, all) in [(100, 100), (1, 3), (0, 0), (2, 1)] {
                let counted = PackIndex.objectCount(Data(text.utf8), entriesAfter: entries, totalAfter: all)
                let expected = Self.objectCountByteByByte(Data(text.utf8), entriesAfter: entries, totalAfter: all)
                #expect(counted.shallow == expected.0 && counted.total == expected.1, "\(text) (\(entries), \(all))")
            }
        }
    }
}
