import CCompression
import Foundation

extension PackIndex {
    /// The largest index read: as large as a manifest may be. The manifest gives an index's length, so a larger
    /// one is refused before it is fetched.
    static let maxBytes: Int64 = 64 << 20

    /// The most chunks an index may list (a 64 MiB index holds fewer than this).
    static let maxChunks = 1 << 20

    /// The largest chunk but a whole deflated zip entry: 64 MiB, as ``Chunker`` allows.
    static let maxChunkSize: Int64 = 64 << 20

    /// Decodes and checks an index's bytes, as a delta update reads them: every reader of an index calls this.
    ///
    /// The bytes are the index file as served: JSON, or JSON compressed with zstd (as `packs pack` writes it since
    /// the index was compressed), told apart by zstd's magic number. Compressed, they are decoded into at most
    /// ``maxBytes`` (``json(_:)``). Its JSON objects are counted before anything is built, so an index of more than `maxEntries` entries (or
    /// more than ``maxChunks`` chunks) is refused in constant memory. Every number is then range-checked where it
    /// is decoded: sizes, offsets and lengths between 0 and 2^50 (a zip entry's length at least a local header's 30
    /// bytes), a method and a mode of 16 bits (as a zip stores them), a SHA-256 of 64 hex digits for every entry
    /// but a folder, and a path of at most 65,535 bytes (a zip's name field), relative, without NUL, `.` or `..`.
    /// In formats 2 and 3 every range lies inside the pack, no two chunks' ranges overlap (but slices of one shared
    /// frame, format 3, which give the same range and frame size), a slice lies inside its frame, a file's chunks add
    /// up to its size, and each chunk is stored as the pack's format allows.
    /// - Parameters:
    ///   - file: the index file's bytes, JSON or zstd-compressed JSON.
    ///   - maxEntries: the most entries accepted.
    ///   - containers: the pack formats the reader can use; by default zip only (what zip delta updates read).
    /// - Throws: `DeltaRefusal` (`indexUnusable`) saying what is wrong, naming the entry.
    static func decode(_ file: consuming Data, maxEntries: Int, containers: Set<Container> = [.zip]) throws(DeltaRefusal) -> PackIndex {
        guard file.count <= Self.maxBytes else {
            throw DeltaRefusal(.indexUnusable, "the pack's index is \(file.count) bytes, more than the \(Self.maxBytes) an index may have")
        }
        let data = try Self.json(file)
        // The file's bytes are let go before the JSON is decoded (when its caller gave them up): compressed, they are
        // 1 MB of a 1 GiB pack's index, held at the decoding's peak.
        _ = consume file
        // One object per entry, in the root's array; then the root, `pack`, `chunking` and the chunks.
        let counts = Self.objectCount(data, entriesAfter: maxEntries, totalAfter: maxEntries + Self.maxChunks + 3)
        guard counts.shallow <= maxEntries else {
            throw DeltaRefusal(.indexUnusable, "the pack's index lists more than \(maxEntries) entries, more than a pack may hold")
        }
        guard counts.total <= maxEntries + Self.maxChunks + 3 else {
            throw DeltaRefusal(.indexUnusable, "the pack's index lists more than \(Self.maxChunks) chunks, more than an index may hold")
        }
        // Read in one pass when written plainly (as `packs pack` writes it); any other JSON as before.
        guard let index = Self.plainlyDecoded(data) ?? (try? JSONDecoder().decode(PackIndex.self, from: data)) else {
            throw DeltaRefusal(.indexUnusable, "the pack's index cannot be read")
        }
        guard (1...3).contains(index.format) else {
            throw DeltaRefusal(.indexUnusable, "the pack's index has format \(index.format), not 1, 2 or 3")
        }
        guard containers.contains(index.container) else {
            throw DeltaRefusal(
                .indexUnusable, "the pack's index describes a \(index.container.rawValue) pack, which this reader cannot use")
        }
        if let problem = index.format >= 2 ? Self.packProblem(index) : nil {
            throw DeltaRefusal(.indexUnusable, "the pack's index \(problem)")
        }
        var paths = Set<String>()
        var ranges: [ChunkRange] = []
        for entry in index.entries {
            let zipRange = index.container == .zip
            if let problem = Self.problem(entry, zipRange: zipRange)
                ?? (index.format >= 2 ? Self.problemV2(entry, in: index, ranges: &ranges) : nil)
            {
                throw DeltaRefusal(.indexUnusable, "the pack's index gives \(PackDeliveryError.printable(entry.path)) \(problem)")
            }
            if index.format >= 2, !paths.insert(entry.path).inserted {
                throw DeltaRefusal(.indexUnusable, "the pack's index lists \(PackDeliveryError.printable(entry.path)) twice")
            }
        }
        if let (before, after) = Self.overlap(&ranges) {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index gives two chunks overlapping ranges (bytes \(before.offset)+\(before.length) and \(after.offset)+\(after.length))"
            )
        }
        return index
    }

    /// The range of the pack a chunk is stored in; `frameSize` for a slice of a shared frame, else nil.
    struct ChunkRange: Hashable {
        var offset: Int64
        var length: Int64
        var frameSize: Int64?
    }

    /// Two ranges of `ranges` (sorted here by offset) that overlap, or nil: identical ranges overlap only when
    /// both are slices of the same frame (the same decompressed size); every other overlap is refused.
    static func overlap(_ ranges: inout [ChunkRange]) -> (ChunkRange, ChunkRange)? {
        ranges.sort { ($0.offset, $0.length) < ($1.offset, $1.length) }
        for (before, after) in zip(ranges, ranges.dropFirst()) where before.offset + before.length > after.offset {
            if before == after, before.frameSize != nil { continue }
            return (before, after)
        }
        return nil
    }

    /// The first bytes of a zstd frame (RFC 8878), little-endian 0xFD2FB528.
    static let zstdMagic: [UInt8] = [0x28, 0xB5, 0x2F, 0xFD]

    /// The zstd level indexes are compressed with: its optimal parser takes 16 % more off an index's JSON than
    /// level 9 (the SHA-256s' hex digits are most of it), and a publisher compresses an index once.
    static let compressionLevel: Int32 = 19

    /// An index file's JSON: the bytes as they are, or, when they start with zstd's magic number, decompressed.
    ///
    /// Decompression is capped at ``maxBytes``: frames that claim more (in their headers) are refused before
    /// anything is decoded, and frames that do not say how much they hold are decoded into at most that much
    /// (memory that is only touched as it is written), refused once they would produce more. One frame or several
    /// are read, and nothing may follow them.
    /// - Parameter file: the index file's bytes (at most ``maxBytes``, as ``decode(_:maxEntries:containers:)`` checks).
    /// - Throws: `DeltaRefusal` (`indexUnusable`) when the frames cannot be decoded or hold more than ``maxBytes``.
    static func json(_ file: Data) throws(DeltaRefusal) -> Data {
        guard file.starts(with: Self.zstdMagic) else { return file }
        let claims = file.withUnsafeBytes { Self.frameClaims($0) }
        guard let claims else { throw DeltaRefusal(.indexUnusable, "the pack's index is not whole zstd frames") }
        if let claimed = claims, claimed > UInt64(Self.maxBytes) {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index claims to decompress to \(claimed) bytes, more than the \(Self.maxBytes) an index may have")
        }
        let capacity = claims.map { Int($0) } ?? Int(Self.maxBytes)
        // Not zeroed: pages that are never written are never touched.
        let output = UnsafeMutableRawBufferPointer.allocate(byteCount: max(capacity, 1), alignment: 16)
        var handedOver = false
        defer { if !handedOver { output.deallocate() } }
        let result = file.withUnsafeBytes { ZSTD_decompress(output.baseAddress, capacity, $0.baseAddress, $0.count) }
        if ZSTD_isError(result) == 0, claims != nil, let base = output.baseAddress {
            // The frames said how much they hold: the JSON is returned in place, not copied (3.5 MB for a 1 GiB pack's
            // index, held while it is decoded).
            handedOver = true
            return Data(bytesNoCopy: base, count: result, deallocator: .custom { pointer, _ in pointer.deallocate() })
        }
        guard ZSTD_isError(result) == 0 else {
            guard ZSTD_getErrorCode(result) == ZSTD_error_dstSize_tooSmall else {
                throw DeltaRefusal(
                    .indexUnusable, "the pack's index cannot be decompressed (zstd: \(String(cString: ZSTD_getErrorName(result))))")
            }
            throw DeltaRefusal(
                .indexUnusable,
                claims == nil
                    ? "the pack's index decompresses to more than the \(Self.maxBytes) bytes an index may have"
                    : "the pack's index decompresses to more than the \(capacity) bytes its zstd frames claim")
        }
        return Data(UnsafeRawBufferPointer(rebasing: output[..<result]))
    }

    /// The bytes zstd frames claim to hold, from their headers, added up: nil when they are not whole frames;
    /// `.some(nil)` when a frame does not say.
    private static func frameClaims(_ input: UnsafeRawBufferPointer) -> UInt64?? {
        var (start, total, known) = (0, UInt64(0), true)
        while start < input.count {
            let frame = UnsafeRawBufferPointer(rebasing: input[start...])
            let length = ZSTD_findFrameCompressedSize(frame.baseAddress, frame.count)
            let size = ZSTD_getFrameContentSize(frame.baseAddress, frame.count)
            guard ZSTD_isError(length) == 0, length > 0, size != ZSTD_CONTENTSIZE_ERROR else { return nil }
            if size == ZSTD_CONTENTSIZE_UNKNOWN {
                known = false
            } else {
                // Saturates: a claim past 2^63 is refused all the same.
                total = min(total &+ min(size, UInt64(Int64.max)), UInt64(Int64.max))
            }
            start += length
        }
        return .some(known ? total : nil)
    }

    /// An index's JSON, compressed as `packs pack` writes index files: one zstd frame that gives its size.
    ///
    /// - Parameter json: the JSON.
    /// - Returns: the frame, or nil when zstd fails (it does not, but for memory).
    static func compressed(_ json: Data) -> Data? {
        let bound = ZSTD_compressBound(json.count)
        var out = Data(count: bound)
        let count = out.withUnsafeMutableBytes { output in
            json.withUnsafeBytes { ZSTD_compress(output.baseAddress, bound, $0.baseAddress, $0.count, Self.compressionLevel) }
        }
        guard ZSTD_isError(count) == 0 else { return nil }
        out.count = count
        return out
    }

    /// What is wrong in a format 2 index as a whole, or nil.
    private static func packProblem(_ index: PackIndex) -> String? {
        guard let pack = index.pack else { return "does not give the pack's length and SHA-256" }
        if !(0...LoadedManifest.maxSize).contains(pack.length) { return "gives the pack a length of \(pack.length), outside 0…2^50 bytes" }
        if !Self.isDigest(pack.sha256) { return "gives the pack a sha256 that is not 64 hex digits" }
        if let chunking = index.chunking, chunking.chunker == nil {
            return
                "gives chunk sizes no chunker uses (\(chunking.minimum), \(chunking.average), \(chunking.maximum), normalization \(chunking.normalization.map(String.init) ?? "absent"))"
        }
        return nil
    }

    /// What is out of range in an entry, in either format, or nil.
    ///
    /// - Parameters:
    ///   - entry: the entry.
    ///   - zipRange: whether the entry has a zip entry's range (format 1, or a zip pack's format 2 index), or none.
    static func problem(_ entry: Entry, zipRange: Bool = true) -> String? {
        let sizes = 0...LoadedManifest.maxSize
        return if entry.path.isEmpty || entry.path.utf8.count > 0xFFFF || entry.path.utf8.contains(0) {
            "a path that no zip entry can have"
        } else if entry.path.hasPrefix("/") || entry.path.split(separator: "/", omittingEmptySubsequences: false).contains("..") {
            "a path that leaves the pack's folder"
        } else if !sizes.contains(entry.size) {
            "a size of \(entry.size), outside 0…2^50 bytes"
        } else if zipRange, !sizes.contains(entry.offset) {
            "an offset of \(entry.offset), outside 0…2^50"
        } else if zipRange, !(30...LoadedManifest.maxSize).contains(entry.length) {
            "a length of \(entry.length), outside 30…2^50 bytes"
        } else if zipRange, !(0...0xFFFF).contains(entry.method) {
            "a method of \(entry.method), outside 0…65535"
        } else if !zipRange, entry.offset != 0 || entry.length != 0 || entry.method != 0 {
            "a zip entry's range in a pack that is not a zip"
        } else if let mode = entry.mode, !(0...0xFFFF).contains(mode) {
            "a mode of \(mode), outside 0…0o177777"
        } else if let sha256 = entry.sha256, !Self.isDigest(sha256) {
            "a sha256 that is not 64 hex digits"
        } else if entry.kind != .directory, entry.sha256 == nil {
            "no SHA-256"
        } else {
            nil
        }
    }

    /// What format 2 requires of an entry and its chunks beyond ``problem(_:zipRange:)``, or nil; adds the chunks'
    /// ranges to `ranges`.
    private static func problemV2(_ entry: Entry, in index: PackIndex, ranges: inout [ChunkRange]) -> String? {
        let packLength = index.pack?.length ?? 0
        guard let mode = entry.mode else { return "no mode" }
        let type = mode & 0o170000
        let wanted =
            switch entry.kind {
            case .file: 0o100000
            case .directory: 0o040000
            case .symlink: 0o120000
            }
        if type != wanted { return "a mode of 0o\(String(mode, radix: 8)), which is not a \(entry.kind.rawValue)'s" }
        if entry.path.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0.isEmpty || $0 == "." }) {
            return "a path with an empty or `.` part"
        }
        if let target = entry.target {
            let hasher = SHA256Hasher()
            Array(target.utf8).withUnsafeBytes { hasher.update($0) }
            if entry.kind != .symlink {
                return "a symlink's target, but it is not a symlink"
            } else if Int64(target.utf8.count) != entry.size || hasher.hexDigest() != entry.sha256?.lowercased() {
                return "a symlink target that does not match its size and SHA-256"
            }
        }
        if index.container == .zip, entry.offset + entry.length > packLength {
            return "a range (bytes \(entry.offset)+\(entry.length)) that ends after the pack's \(packLength) bytes"
        }
        guard let chunks = entry.chunks else { return nil }
        if entry.kind != .file, !chunks.isEmpty { return "chunks, but it is not a file" }
        var total: Int64 = 0
        // Once per entry, not per chunk (an array made 25,000 times for a 1 GiB pack).
        let storages: [Storage] =
            switch index.container {
            case .tar: [.raw]
            case .tarZstd: index.format >= 3 ? [.zstdFrame, .zstdFrameSlice] : [.zstdFrame]
            case .tarGzip: [.gzipMember]
            case .zip: entry.method == 0 ? [.raw] : [.deflatedZipEntry]
            case .tarBzip2, .tarXz: []
            }
        for chunk in chunks {
            let maxSize = chunk.storage == .deflatedZipEntry ? LoadedManifest.maxSize : Self.maxChunkSize
            if !storages.contains(chunk.storage) {
                return "a chunk stored as \(chunk.storage.rawValue), which a \(index.container.rawValue) pack cannot hold"
            } else if !Self.isDigest(chunk.sha256) {
                return "a chunk whose sha256 is not 64 hex digits"
            } else if !(1...maxSize).contains(chunk.size) {
                return "a chunk of \(chunk.size) bytes, outside 1…\(maxSize)"
            } else if !(0...LoadedManifest.maxSize).contains(chunk.offset) || !(1...LoadedManifest.maxSize).contains(chunk.length)
                || chunk.offset + chunk.length > packLength
            {
                return "a chunk at bytes \(chunk.offset)+\(chunk.length), outside the pack's \(packLength) bytes"
            } else if let problem = Self.sliceProblem(chunk) {
                return problem
            } else if chunk.storage == .raw, chunk.length != chunk.size {
                return "a chunk stored raw in \(chunk.length) bytes that holds \(chunk.size)"
            } else if chunk.storage == .deflatedZipEntry, chunks.count != 1 {
                return "a deflated zip entry cut into \(chunks.count) chunks"
            } else if index.container == .zip, chunk.offset < entry.offset || chunk.offset + chunk.length > entry.offset + entry.length {
                return "a chunk at bytes \(chunk.offset)+\(chunk.length), outside its zip entry"
            }
            total += chunk.size
            if total > entry.size { break }
            ranges.append(ChunkRange(offset: chunk.offset, length: chunk.length, frameSize: chunk.frameSize))
        }
        if total != entry.size {
            return "chunks that hold \(total > entry.size ? "more" : "fewer") bytes than its size of \(entry.size)"
        }
        return nil
    }

    /// What is wrong in a chunk's frame fields, or nil: a slice gives a frame of 1…``maxChunkSize`` bytes
    /// decompressed and lies inside it; any other chunk gives no frame fields.
    private static func sliceProblem(_ chunk: Chunk) -> String? {
        guard chunk.storage == .zstdFrameSlice else {
            return chunk.frameSize != nil || chunk.frameOffset != nil
                ? "a chunk stored as \(chunk.storage.rawValue) with a frame slice's fields" : nil
        }
        guard let frameSize = chunk.frameSize, let frameOffset = chunk.frameOffset else {
            return "a frame slice without its frame's size and offset"
        }
        if !(1...Self.maxChunkSize).contains(frameSize) {
            return "a frame slice whose frame decompresses to \(frameSize) bytes, outside 1…\(Self.maxChunkSize)"
        } else if frameOffset < 0 || frameOffset > frameSize - chunk.size {
            return "a frame slice at bytes \(frameOffset)+\(chunk.size), outside its frame's \(frameSize) bytes"
        }
        return nil
    }

    static func isDigest(_ text: String) -> Bool {
        // Over the string's bytes in place when it has them (a native string does), with a test of two comparisons
        // per byte: 25,000 chunk digests of a 1 GiB pack's index took 58 million instructions through the UTF-8 view.
        text.utf8.withContiguousStorageIfAvailable { $0.count == 64 && $0.allSatisfy(Self.isHexDigit) }
            ?? (text.utf8.count == 64 && text.utf8.allSatisfy(Self.isHexDigit))
    }

    /// Whether `byte` is an ASCII hex digit (as ``LoadedManifest/isASCIIHexDigit(_:)``): 0-9, or a-f in either case
    /// (setting the bit 0x20 lowers A-F and leaves no other byte in a-f).
    @inline(__always)
    private static func isHexDigit(_ byte: UInt8) -> Bool {
        byte &- UInt8(ascii: "0") < 10 || (byte | 0x20) &- UInt8(ascii: "a") < 6
    }

    /// The number of JSON objects in `data` (its `{` outside strings), counted without parsing, up to one more
    /// than `limit`.
    static func objectCount(_ data: Data, stoppingAfter limit: Int) -> Int {
        Self.objectCount(data, entriesAfter: limit, totalAfter: limit).total
    }

    /// The number of JSON objects in `data` (its `{` outside strings) that are elements of the root's arrays (an
    /// index's entries), and of all, counted without parsing; the count stops at one more than either limit.
    static func objectCount(_ data: Data, entriesAfter shallowLimit: Int, totalAfter totalLimit: Int) -> (shallow: Int, total: Int) {
        data.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) -> (shallow: Int, total: Int) in
            var (shallow, total, depth) = (0, 0, 0)
            var at = 0
            while at < bytes.count {
                let byte = bytes[at]
                at += 1
                if byte == UInt8(ascii: "\"") {
                    // A string ends at the first quote after an even run of backslashes (each pair one escaped
                    // backslash), found with memchr: most of an index's bytes are its strings' (the digests).
                    at = Self.stringEnd(bytes, after: at)
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
    }

    /// Where the bytes after a string's closing quote start, for a string whose bytes start at `start`; the end of
    /// `bytes` when the string is not closed.
    private static func stringEnd(_ bytes: UnsafeRawBufferPointer, after start: Int) -> Int {
        guard let base = bytes.baseAddress else { return bytes.count }
        var at = start
        while at < bytes.count, let found = memchr(base + at, Int32(UInt8(ascii: "\"")), bytes.count - at) {
            let quote = base.distance(to: UnsafeRawPointer(found))
            var backslashes = 0
            while quote - backslashes - 1 >= start, bytes[quote - backslashes - 1] == UInt8(ascii: "\\") { backslashes += 1 }
            if backslashes % 2 == 0 { return quote + 1 }
            at = quote + 1
        }
        return bytes.count
    }
}
