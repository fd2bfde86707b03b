import Foundation

extension PackIndex {
    /// The index `json` holds, read in one pass over its bytes, when it is written plainly, as `packs pack` and
    /// `packs manifest` write indexes; nil for any other JSON, which Foundation's `JSONDecoder` then reads or refuses,
    /// as it read every index before.
    ///
    /// `JSONDecoder` takes 84 ms of CPU for the 3.5 MB of JSON of a 1 GiB pack's index (25,000 chunks), before the
    /// first byte of the pack is asked for; this takes a fraction of that. It gives exactly what `JSONDecoder` gives,
    /// because it reads only a strict subset of JSON and gives up (nil) on everything else: RFC 8259's grammar with
    /// only the members ``PackIndex``'s types decode, each at most once per object, of the JSON types they decode
    /// (no `null`); integers of at most 18 digits without a fraction, an exponent or `-0`; strings without escapes
    /// or control characters, of valid UTF-8; and an enum's raw value. A hostile index (an unknown storage, a size
    /// past 2^63, an escaped path, …) is therefore read by `JSONDecoder` and refused as before.
    static func plainlyDecoded(_ json: Data) -> PackIndex? {
        json.withUnsafeBytes { bytes in
            var reader = PlainIndexReader(bytes: bytes)
            return try? reader.document()
        }
    }
}

/// The reader of ``PackIndex/plainlyDecoded(_:)``: every method throws ``Unplain`` at the first byte outside the
/// subset it reads.
private struct PlainIndexReader {
    /// The JSON is not in the subset read: `JSONDecoder` reads it.
    struct Unplain: Error {}

    let bytes: UnsafeRawBufferPointer
    var at = 0

    init(bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    mutating func document() throws(Unplain) -> PackIndex {
        let index = try self.index()
        self.skipSpace()
        guard self.at == self.bytes.count else { throw Unplain() }
        return index
    }

    // MARK: The index's types, member by member as their `init(from:)` decode them

    private mutating func index() throws(Unplain) -> PackIndex {
        var seen = Members()
        var format: Int?
        var container = PackIndex.Container.zip
        var pack: PackIndex.Pack?
        var chunking: PackIndex.Chunking?
        var entries: [PackIndex.Entry]?
        var more = try self.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
        while more {
            let key = try self.key()
            if Self.is(key, "format") {
                try seen.once(0)
                format = try self.integer()
            } else if Self.is(key, "container") {
                try seen.once(1)
                container = try self.enumeration()
            } else if Self.is(key, "pack") {
                try seen.once(2)
                pack = try self.pack()
            } else if Self.is(key, "chunking") {
                try seen.once(3)
                chunking = try self.chunking()
            } else if Self.is(key, "entries") {
                try seen.once(4)
                var list: [PackIndex.Entry] = []
                var element = try self.open(UInt8(ascii: "["), UInt8(ascii: "]"))
                while element {
                    list.append(try self.entry())
                    element = try self.next(closing: UInt8(ascii: "]"))
                }
                entries = list
            } else {
                throw Unplain()
            }
            more = try self.next(closing: UInt8(ascii: "}"))
        }
        guard let format, let entries else { throw Unplain() }
        var index = PackIndex(entries: entries)
        (index.format, index.container, index.pack, index.chunking) = (format, container, pack, chunking)
        return index
    }

    private mutating func pack() throws(Unplain) -> PackIndex.Pack {
        var seen = Members()
        var length: Int64?
        var sha256: String?
        var more = try self.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
        while more {
            let key = try self.key()
            if Self.is(key, "length") {
                try seen.once(0)
                length = Int64(try self.integer())
            } else if Self.is(key, "sha256") {
                try seen.once(1)
                sha256 = try self.string()
            } else {
                throw Unplain()
            }
            more = try self.next(closing: UInt8(ascii: "}"))
        }
        guard let length, let sha256 else { throw Unplain() }
        return PackIndex.Pack(length: length, sha256: sha256)
    }

    private mutating func chunking() throws(Unplain) -> PackIndex.Chunking {
        var seen = Members()
        var algorithm: String?
        var (minimum, average, maximum, normalization): (Int?, Int?, Int?, Int?) = (nil, nil, nil, nil)
        var more = try self.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
        while more {
            let key = try self.key()
            if Self.is(key, "algorithm") {
                try seen.once(0)
                algorithm = try self.string()
            } else if Self.is(key, "minimum") {
                try seen.once(1)
                minimum = try self.integer()
            } else if Self.is(key, "average") {
                try seen.once(2)
                average = try self.integer()
            } else if Self.is(key, "maximum") {
                try seen.once(3)
                maximum = try self.integer()
            } else if Self.is(key, "normalization") {
                try seen.once(4)
                normalization = try self.integer()
            } else {
                throw Unplain()
            }
            more = try self.next(closing: UInt8(ascii: "}"))
        }
        guard let algorithm, let minimum, let average, let maximum else { throw Unplain() }
        return PackIndex.Chunking(
            algorithm: algorithm, minimum: minimum, average: average, maximum: maximum, normalization: normalization)
    }

    private mutating func entry() throws(Unplain) -> PackIndex.Entry {
        var seen = Members()
        var path: String?
        var kind: PackIndex.Entry.Kind?
        var size: Int64?
        var sha256: String?
        var (method, offset, length): (Int, Int64, Int64) = (0, 0, 0)
        var mode: Int?
        var chunks: [PackIndex.Chunk]?
        var target: String?
        var more = try self.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
        while more {
            let key = try self.key()
            if Self.is(key, "path") {
                try seen.once(0)
                path = try self.string()
            } else if Self.is(key, "kind") {
                try seen.once(1)
                kind = try self.enumeration()
            } else if Self.is(key, "size") {
                try seen.once(2)
                size = Int64(try self.integer())
            } else if Self.is(key, "sha256") {
                try seen.once(3)
                sha256 = try self.string()
            } else if Self.is(key, "method") {
                try seen.once(4)
                method = try self.integer()
            } else if Self.is(key, "offset") {
                try seen.once(5)
                offset = Int64(try self.integer())
            } else if Self.is(key, "length") {
                try seen.once(6)
                length = Int64(try self.integer())
            } else if Self.is(key, "mode") {
                try seen.once(7)
                mode = try self.integer()
            } else if Self.is(key, "chunks") {
                try seen.once(8)
                var list: [PackIndex.Chunk] = []
                var element = try self.open(UInt8(ascii: "["), UInt8(ascii: "]"))
                while element {
                    list.append(try self.chunk())
                    element = try self.next(closing: UInt8(ascii: "]"))
                }
                chunks = list
            } else if Self.is(key, "target") {
                try seen.once(9)
                target = try self.string()
            } else {
                throw Unplain()
            }
            more = try self.next(closing: UInt8(ascii: "}"))
        }
        guard let path, let kind, let size else { throw Unplain() }
        return PackIndex.Entry(
            path: path, kind: kind, size: size, sha256: sha256, method: method, offset: offset, length: length, mode: mode, chunks: chunks,
            target: target)
    }

    private mutating func chunk() throws(Unplain) -> PackIndex.Chunk {
        var seen = Members()
        var sha256: String?
        var (size, offset, length): (Int64?, Int64?, Int64?) = (nil, nil, nil)
        var storage: PackIndex.Storage?
        var (frameSize, frameOffset): (Int64?, Int64?) = (nil, nil)
        var more = try self.open(UInt8(ascii: "{"), UInt8(ascii: "}"))
        while more {
            let key = try self.key()
            if Self.is(key, "sha256") {
                try seen.once(0)
                sha256 = try self.string()
            } else if Self.is(key, "size") {
                try seen.once(1)
                size = Int64(try self.integer())
            } else if Self.is(key, "offset") {
                try seen.once(2)
                offset = Int64(try self.integer())
            } else if Self.is(key, "length") {
                try seen.once(3)
                length = Int64(try self.integer())
            } else if Self.is(key, "storage") {
                try seen.once(4)
                storage = try self.enumeration()
            } else if Self.is(key, "frameSize") {
                try seen.once(5)
                frameSize = Int64(try self.integer())
            } else if Self.is(key, "frameOffset") {
                try seen.once(6)
                frameOffset = Int64(try self.integer())
            } else {
                throw Unplain()
            }
            more = try self.next(closing: UInt8(ascii: "}"))
        }
        guard let sha256, let size, let offset, let length, let storage else { throw Unplain() }
        var chunk = PackIndex.Chunk(sha256: sha256, size: size, offset: offset, length: length, storage: storage)
        (chunk.frameSize, chunk.frameOffset) = (frameSize, frameOffset)
        return chunk
    }

    // MARK: JSON

    /// The members an object has given, by number: one given twice is left to `JSONDecoder`.
    private struct Members {
        var given: UInt32 = 0

        mutating func once(_ number: Int) throws(Unplain) {
            let bit = UInt32(1) << UInt32(number)
            guard self.given & bit == 0 else { throw Unplain() }
            self.given |= bit
        }
    }

    /// Whether a member's name (its bytes between the quotes) is `name`.
    private static func `is`(_ key: UnsafeRawBufferPointer, _ name: StaticString) -> Bool {
        guard key.count == name.utf8CodeUnitCount, let base = key.baseAddress else { return false }
        return memcmp(base, name.utf8Start, key.count) == 0
    }

    private mutating func skipSpace() {
        while self.at < self.bytes.count {
            switch self.bytes[self.at] {
            case 0x20, 0x0A, 0x0D, 0x09: self.at += 1
            default: return
            }
        }
    }

    /// Reads `opening` (after whitespace); whether a first element or member follows rather than `closing`.
    private mutating func open(_ opening: UInt8, _ closing: UInt8) throws(Unplain) -> Bool {
        self.skipSpace()
        guard self.at < self.bytes.count, self.bytes[self.at] == opening else { throw Unplain() }
        self.at += 1
        self.skipSpace()
        guard self.at < self.bytes.count else { throw Unplain() }
        if self.bytes[self.at] == closing {
            self.at += 1
            return false
        }
        return true
    }

    /// Reads the `,` before another element or member (true), or `closing` (false).
    private mutating func next(closing: UInt8) throws(Unplain) -> Bool {
        self.skipSpace()
        guard self.at < self.bytes.count else { throw Unplain() }
        let byte = self.bytes[self.at]
        self.at += 1
        if byte == UInt8(ascii: ",") { return true }
        guard byte == closing else { throw Unplain() }
        return false
    }

    /// A member's name and the `:` after it.
    private mutating func key() throws(Unplain) -> UnsafeRawBufferPointer {
        let key = try self.stringBytes()
        self.skipSpace()
        guard self.at < self.bytes.count, self.bytes[self.at] == UInt8(ascii: ":") else { throw Unplain() }
        self.at += 1
        return key
    }

    /// The bytes between the quotes of a string without escapes or control characters, of valid UTF-8.
    private mutating func stringBytes() throws(Unplain) -> UnsafeRawBufferPointer {
        self.skipSpace()
        guard self.at < self.bytes.count, self.bytes[self.at] == UInt8(ascii: "\"") else { throw Unplain() }
        let start = self.at + 1
        var end = start
        var ascii = true
        while true {
            guard end < self.bytes.count else { throw Unplain() }
            let byte = self.bytes[end]
            if byte == UInt8(ascii: "\"") { break }
            guard byte >= 0x20, byte != UInt8(ascii: "\\") else { throw Unplain() }
            if byte >= 0x80 { ascii = false }
            end += 1
        }
        self.at = end + 1
        let text = UnsafeRawBufferPointer(rebasing: self.bytes[start..<end])
        if !ascii, String(validating: text, as: UTF8.self) == nil { throw Unplain() }
        return text
    }

    private mutating func string() throws(Unplain) -> String {
        String(decoding: try self.stringBytes(), as: UTF8.self)
    }

    /// A string that is one of an enum's raw values.
    private mutating func enumeration<Value: RawRepresentable<String>>() throws(Unplain) -> Value {
        guard let value = Value(rawValue: try self.string()) else { throw Unplain() }
        return value
    }

    /// An integer of 1 to 18 digits, without a leading zero (but 0 itself), a fraction or an exponent, and not `-0`.
    private mutating func integer() throws(Unplain) -> Int {
        self.skipSpace()
        var negative = false
        if self.at < self.bytes.count, self.bytes[self.at] == UInt8(ascii: "-") {
            negative = true
            self.at += 1
        }
        let start = self.at
        var value = 0
        while self.at < self.bytes.count, case let digit = self.bytes[self.at] &- UInt8(ascii: "0"), digit < 10 {
            // 18 digits never overflow; more are left to JSONDecoder.
            guard self.at - start < 18 else { throw Unplain() }
            value = value * 10 + Int(digit)
            self.at += 1
        }
        let digits = self.at - start
        guard digits > 0, digits == 1 || self.bytes[start] != UInt8(ascii: "0"), !(negative && value == 0) else {
            throw Unplain()
        }
        // A fraction or an exponent is left to JSONDecoder (what follows must be `,`, `}`, `]` or whitespace).
        if self.at < self.bytes.count {
            switch self.bytes[self.at] {
            case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): throw Unplain()
            default: break
            }
        }
        return negative ? -value : value
    }
}
