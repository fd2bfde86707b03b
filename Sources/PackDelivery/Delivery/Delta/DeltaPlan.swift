import Foundation

/// What a delta update fetches and what it reuses, decided with no I/O from the new pack's index
/// and the files the installed version recorded (their SHA-256 as installed, and whether they still look so).
///
/// An entry of the new version whose SHA-256 and size match an installed regular file is reused (linked or
/// copied in); folders are made; every other entry, symlinks included, is fetched with range requests.
/// Entries that lie close together are fetched as one range.
struct DeltaPlan: Sendable, Hashable {
    /// An installed file that becomes `path` of the new version.
    struct Reuse: Sendable, Hashable {
        var path: String
        /// Its path in the installed version.
        var from: String
        var size: Int64
        var sha256: String
    }

    /// Bytes `start..<end` of the pack, holding the entries `entries` (indices into the index), and maybe
    /// unchanged entries between them.
    struct Range: Sendable, Hashable {
        var start: Int64
        var end: Int64
        var entries: [Int]
    }

    var fetch: [Int]
    var reuse: [Reuse]
    var directories: [String]
    var ranges: [Range]
    var bytesToFetch: Int64 { self.ranges.reduce(0) { $0 + $1.end - $1.start } }
    var bytesReused: Int64 { self.reuse.reduce(0) { $0 + $1.size } }

    /// Entries closer than this are fetched in one range (a request costs about a round trip; 64 KiB on a fast link less).
    static let coalesceGap: Int64 = 64 << 10

    /// The plan, or why the whole pack is fetched instead (a sentence for events and `--verbose`).
    ///
    /// - Parameters:
    ///   - index: the new pack's index, checked by ``PackIndex/decode(_:maxEntries:)``.
    ///   - packLength: the new pack's length, from the manifest.
    ///   - unpackedLength: the most the pack may unpack to, from the manifest, if it says.
    ///   - installed: the installed version's files, as recorded.
    ///   - damaged: the installed files that do not look as recorded (missing, another kind, size or time).
    static func make(
        index: PackIndex, packLength: Int64, unpackedLength: Int64? = nil, installed: [InstalledFileRecord], damaged: [String]
    ) -> Result<DeltaPlan, DeltaRefusal> {
        if let first = damaged.first {
            return .failure(
                DeltaRefusal(
                    .installedFilesChanged,
                    "the installed file \(PackDeliveryError.printable(first)) does not verify (\(damaged.count) file\(damaged.count == 1 ? "" : "s") changed since the install)"
                ))
        }
        var seen = Set<String>()
        var files: Int64 = 0
        for entry in index.entries {
            guard entry.offset >= 0, entry.length >= 30, entry.offset <= packLength - entry.length, entry.size >= 0,
                seen.insert(entry.path).inserted
            else {
                return .failure(
                    DeltaRefusal(
                        .indexUnusable, "the pack's index does not fit the pack (entry \(PackDeliveryError.printable(entry.path)))"))
            }
            // Each size is at most 2^50 (checked when decoded) and the sum stops past 2^50: it cannot overflow.
            if entry.kind == .file { files += entry.size }
            if files > min(LoadedManifest.maxSize, unpackedLength ?? LoadedManifest.maxSize) {
                return .failure(
                    DeltaRefusal(
                        .indexUnusable,
                        "the pack's index gives its files more than \(unpackedLength.map { "the \($0) bytes the manifest allows" } ?? "2^50 bytes")"
                    ))
            }
        }
        // A zip's entries do not overlap: each starts where the one before it (in the pack) ends, or later.
        var end: Int64 = 0
        for entry in index.entries.sorted(by: { $0.offset < $1.offset }) {
            guard entry.offset >= end else {
                return .failure(
                    DeltaRefusal(
                        .indexUnusable, "the pack's index gives \(PackDeliveryError.printable(entry.path)) bytes of another entry"))
            }
            end = entry.offset + entry.length
        }
        var byDigest: [String: InstalledFileRecord] = [:]
        for file in installed where file.kind == .file { byDigest[file.sha256.lowercased()] = byDigest[file.sha256.lowercased()] ?? file }
        var plan = DeltaPlan(fetch: [], reuse: [], directories: [], ranges: [])
        for (number, entry) in index.entries.enumerated() {
            switch entry.kind {
            case .directory:
                plan.directories.append(entry.path)
            case .file:
                if let sha256 = entry.sha256?.lowercased(), let old = byDigest[sha256], old.size == entry.size {
                    plan.reuse.append(Reuse(path: entry.path, from: old.path, size: entry.size, sha256: sha256))
                } else {
                    plan.fetch.append(number)
                }
            case .symlink:
                // A link's meaning depends on where it is: it goes through the unpacker's checks every time.
                plan.fetch.append(number)
            }
        }
        plan.ranges = Self.coalesce(plan.fetch, in: index)
        return .success(plan)
    }

    /// The ranges that fetch the entries `numbers` of `index`: entries less than ``coalesceGap`` apart share one.
    static func coalesce(_ numbers: [Int], in index: PackIndex) -> [Range] {
        var ranges: [Range] = []
        for number in numbers.sorted(by: { index.entries[$0].offset < index.entries[$1].offset }) {
            let entry = index.entries[number]
            // In place: a copy of the last range would copy its list of entries at each append.
            if let last = ranges.indices.last, entry.offset >= ranges[last].end, entry.offset - ranges[last].end <= Self.coalesceGap {
                ranges[last].end = max(ranges[last].end, entry.offset + entry.length)
                ranges[last].entries.append(number)
            } else {
                ranges.append(Range(start: entry.offset, end: entry.offset + entry.length, entries: [number]))
            }
        }
        return ranges
    }
}

extension DeltaPlan {
    /// Checks that the index describes the pack as the pack's own central directory does: the same entries in the
    /// same order, each with the same name, kind, method, uncompressed size and unix mode, starting at the local
    /// header the directory points at and running to the next one (or to the directory). The CRC-32s of entries
    /// are then the pack's word about their bytes (see ``reusedMismatch(_:directory:crcOfInstalled:)``).
    ///
    /// - Throws: `DeltaRefusal` (`indexUnusable`) naming the first entry that differs.
    static func check(_ index: PackIndex, against directory: ZipDirectories.Directory) throws(DeltaRefusal) {
        guard index.entries.count == directory.entries.count else {
            throw DeltaRefusal(
                .indexUnusable,
                "the pack's index lists \(index.entries.count) entries, its central directory \(directory.entries.count)")
        }
        let starts = directory.entries.map(\.localOffset).sorted()
        for (entry, central) in zip(index.entries, directory.entries) {
            let next = starts.first { $0 > central.localOffset } ?? directory.offset
            let problem: String? =
                if let name = String(validating: central.name, as: UTF8.self), PackInspector.normalized(name) == entry.path {
                    if Self.kind(central) != entry.kind {
                        "another kind"
                    } else if central.flags & 1 != 0 {
                        "an encrypted entry"
                    } else if Int(central.method) != entry.method {
                        "another compression method"
                    } else if entry.kind != .directory, central.size != entry.size {
                        "another size"
                    } else if central.unixMode != entry.mode {
                        "another mode"
                    } else if central.localOffset != entry.offset || next - central.localOffset != entry.length {
                        "another place in the pack"
                    } else {
                        nil
                    }
                } else {
                    "another name"
                }
            if let problem {
                throw DeltaRefusal(
                    .indexUnusable,
                    "the pack's index does not describe the pack: its central directory gives \(PackDeliveryError.printable(entry.path)) \(problem)"
                )
            }
        }
    }

    /// The first reused file whose installed bytes have another CRC-32 than the pack's central directory gives its
    /// entry (the index's SHA-256 for it then describes other bytes than the pack's), as a refusal; nil when all match.
    ///
    /// - Parameters:
    ///   - index: the index, already checked against `directory`.
    ///   - crcOfInstalled: the CRC-32 of an installed file, by its path in the installed version (nil: stop).
    static func reusedMismatch(
        _ plan: DeltaPlan, index: PackIndex, directory: ZipDirectories.Directory, crcOfInstalled: (String) throws -> UInt32?
    ) rethrows -> DeltaRefusal? {
        var numbers: [String: Int] = [:]
        for (number, entry) in index.entries.enumerated() { numbers[entry.path] = number }
        var known: [String: UInt32] = [:]
        for reuse in plan.reuse {
            guard let number = numbers[reuse.path] else { continue }
            // An installed file may be reused for several entries: it is read once.
            guard let crc = try known[reuse.from] ?? crcOfInstalled(reuse.from) else { continue }
            known[reuse.from] = crc
            let wanted = directory.entries[number].crc
            if crc != wanted {
                return DeltaRefusal(
                    .indexUnusable,
                    "the pack's index gives \(PackDeliveryError.printable(reuse.path)) the SHA-256 of the installed \(PackDeliveryError.printable(reuse.from)), but the pack's central directory gives it another CRC-32 (\(String(format: "%08x", wanted)), not \(String(format: "%08x", crc))): the index does not describe the pack"
                )
            }
        }
        return nil
    }

    /// What an entry is, as the central directory says (a name ending in `/` is a folder); nil for a type a pack
    /// may not hold (a device, a FIFO, …).
    static func kind(_ central: ZipDirectories.Central) -> PackIndex.Entry.Kind? {
        let type = (central.unixMode ?? 0) & 0o170000
        if central.name.last == UInt8(ascii: "/") || type == 0o040000 { return .directory }
        switch type {
        case 0o120000: return .symlink
        case 0, 0o100000: return .file
        default: return nil
        }
    }
}

/// Why a delta update is not used: the whole pack is fetched instead.
struct DeltaRefusal: Error, Sendable, Hashable {
    var fallback: Download.DeltaFallback
    init(_ reason: Download.DeltaFallback.Reason, _ message: String) { self.fallback = Download.DeltaFallback(reason, message) }
    init(_ fallback: Download.DeltaFallback) { self.fallback = fallback }
}

/// One zip entry as fetched (its local header, data and any data descriptor), made into a zip of its own by
/// appending a central directory built from the local header and the index: the unpacker then reads it with
/// every check it applies to a whole pack.
enum DeltaZip {
    /// Appends a central directory and an end record to `fd`, which holds exactly the entry's `length` bytes.
    ///
    /// The entry's local header (and data descriptor) must be what the pack's central directory says of it: the
    /// same name, method, CRC-32 and sizes, as the adoption of a streamed zip requires (``Unpacker/adopt(archive:listing:streamed:into:limits:isCancelled:)``).
    /// The central directory written is built from the pack's.
    /// - Parameters:
    ///   - entry: the entry, as the index gives it (and its mode, as the central directory does).
    ///   - central: the pack's central directory's record of the entry.
    /// - Throws: `DeltaRefusal` (`indexUnusable`) when the bytes are not the entry the central directory describes,
    ///   or one this cannot describe (ZIP64); `PackDeliveryError` when the file cannot be written.
    static func close(_ fd: Int32, entry: PackIndex.Entry, central: ZipDirectories.Central) throws {
        func refuse(_ why: String) -> DeltaRefusal {
            DeltaRefusal(
                .indexUnusable,
                "the local header of \(PackDeliveryError.printable(entry.path)) at byte \(entry.offset) of the pack \(why): it does not match the pack's central directory"
            )
        }
        guard entry.length <= 0xFFFF_FFFF, central.compressedSize >= 0, central.compressedSize < 0xFFFF_FFFF, central.size >= 0,
            central.size < 0xFFFF_FFFF
        else { throw DeltaRefusal(.indexUnusable, "the entry \(PackDeliveryError.printable(entry.path)) is a ZIP64 entry") }
        let length = Int(entry.length)
        var header = [UInt8](repeating: 0, count: 30)
        guard pread(fd, &header, 30, 0) == 30, u32(header, 0) == 0x0403_4B50 else { throw refuse("is missing") }
        let flags = u16(header, 6)
        let nameLength = Int(u16(header, 26))
        let extraLength = Int(u16(header, 28))
        let dataStart = 30 + nameLength + extraLength
        guard dataStart + Int(central.compressedSize) <= length else { throw refuse("and its data do not fit its bytes") }
        var name = [UInt8](repeating: 0, count: nameLength)
        guard nameLength == 0 || pread(fd, &name, nameLength, 30) == nameLength, name == central.name else {
            throw refuse("names '\(PackDeliveryError.printable(String(decoding: name, as: UTF8.self)))'")
        }
        var crc = u32(header, 14)
        var compressed = Int64(u32(header, 18))
        var uncompressed = Int64(u32(header, 22))
        if flags & 0x8 != 0 {
            // The sizes follow the data, in a descriptor with or without its signature: 32-bit sizes (ZIP64 is refused).
            var descriptor = [UInt8](repeating: 0, count: 16)
            let at = dataStart + Int(central.compressedSize)
            let got = pread(fd, &descriptor, min(16, length - at), off_t(at))
            let skip = got >= 4 && u32(descriptor, 0) == 0x0807_4B50 ? 4 : 0
            guard got >= skip + 12 else { throw refuse("has no data descriptor") }
            crc = u32(descriptor, skip)
            compressed = Int64(u32(descriptor, skip + 4))
            uncompressed = Int64(u32(descriptor, skip + 8))
        }
        guard u16(header, 8) == central.method, flags & 1 == 0, crc == central.crc, compressed == central.compressedSize,
            uncompressed == central.size
        else { throw refuse("gives another method, CRC-32 or size") }
        let mode = central.unixMode ?? (entry.kind == .symlink ? 0o120777 : entry.kind == .directory ? 0o040755 : 0o100644)
        var record: [UInt8] = []
        func put16(_ value: UInt16) { record += [UInt8(value & 0xFF), UInt8(value >> 8)] }
        func put32(_ value: UInt32) {
            put16(UInt16(value & 0xFFFF))
            put16(UInt16(value >> 16))
        }
        put32(0x0201_4B50)
        put16(0x031E)  // made on unix, zip 3.0: the external attributes hold a unix mode
        put16(u16(header, 4))
        put16(flags)
        put16(u16(header, 8))
        put16(u16(header, 10))
        put16(u16(header, 12))
        put32(central.crc)
        put32(UInt32(central.compressedSize))
        put32(UInt32(central.size))
        put16(UInt16(nameLength))
        put16(0)
        put16(0)
        put16(0)
        put16(0)
        put32(UInt32(mode) << 16 | (entry.kind == .directory ? 0x10 : 0))
        put32(0)
        record += name
        let directorySize = record.count
        put32(0x0605_4B50)
        put16(0)
        put16(0)
        put16(1)
        put16(1)
        put32(UInt32(directorySize))
        put32(UInt32(length))
        put16(0)
        let written = record.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(length)) }
        guard written == record.count else { throw PackDeliveryError.io("write the fetched entry", path: entry.path, errno: errno) }
    }

    /// Unpacks a fetched entry, made a zip of its own by ``close(_:entry:central:)``, with every check of the
    /// unpacker, into the empty folder `out`, and compares what it holds with the index.
    ///
    /// - Returns: the file; nil when the bytes are not the entry the index describes (another path, kind, size or
    ///   SHA-256, or bytes libarchive does not read as that entry: corrupt, too large, encrypted).
    /// - Throws: any other error of the unpack (an unsafe entry, a full disk, a stop).
    static func unpack(
        _ archive: URL, entry: PackIndex.Entry, into out: URL, isCancelled: @escaping () -> Bool, writer: any FileWriting
    ) throws(PackDeliveryError) -> InstalledFile? {
        let summary: UnpackSummary
        do {
            // The size is at most 2^50 (checked when the index was decoded).
            summary = try Unpacker.unpack(
                archive: archive, into: out, limits: UnpackLimits(maxBytes: entry.size + 1, maxEntries: 2), isCancelled: isCancelled,
                writer: writer)
        } catch  where [.corruptArchive, .unpackLimitExceeded, .encryptedArchive].contains(error.code) {
            return nil
        }
        guard summary.files.count == 1, let file = summary.files.first, file.path == entry.path,
            file.kind == (entry.kind == .symlink ? .symlink : .file), file.size == entry.size,
            file.sha256.lowercased() == entry.sha256?.lowercased()
        else { return nil }
        return file
    }

    private static func u16(_ bytes: [UInt8], _ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
    private static func u32(_ bytes: [UInt8], _ at: Int) -> UInt32 { UInt32(u16(bytes, at)) | UInt32(u16(bytes, at + 2)) << 16 }
}
