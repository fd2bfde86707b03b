import Foundation

/// What a delta update (issue 17) fetches and what it reuses, decided with no I/O from the new pack's index
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
    /// A delta that would fetch more than this share of the pack fetches the whole pack instead.
    static let maxShare = 0.6

    /// The plan, or why the whole pack is fetched instead (a sentence for events and `--verbose`).
    ///
    /// - Parameters:
    ///   - index: the new pack's index.
    ///   - packLength: the new pack's length, from the manifest.
    ///   - installed: the installed version's files, as recorded.
    ///   - damaged: the installed files that do not look as recorded (missing, another kind, size or time).
    static func make(index: PackIndex, packLength: Int64, installed: [InstalledFileRecord], damaged: [String]) -> Result<
        DeltaPlan, DeltaRefusal
    > {
        if let first = damaged.first {
            return .failure(
                DeltaRefusal(
                    .installedFilesChanged,
                    "the installed file \(PackDeliveryError.printable(first)) does not verify (\(damaged.count) file\(damaged.count == 1 ? "" : "s") changed since the install)"
                ))
        }
        var seen = Set<String>()
        for entry in index.entries {
            guard entry.offset >= 0, entry.length >= 30, entry.offset <= packLength - entry.length, entry.size >= 0,
                seen.insert(entry.path).inserted
            else {
                return .failure(
                    DeltaRefusal(
                        .indexUnusable, "the pack's index does not fit the pack (entry \(PackDeliveryError.printable(entry.path)))"))
            }
            if entry.kind != .directory, entry.sha256 == nil {
                return .failure(
                    DeltaRefusal(.indexUnusable, "the pack's index gives no SHA-256 for \(PackDeliveryError.printable(entry.path))"))
            }
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
        for number in plan.fetch.sorted(by: { index.entries[$0].offset < index.entries[$1].offset }) {
            let entry = index.entries[number]
            if var last = plan.ranges.last, entry.offset >= last.end, entry.offset - last.end <= Self.coalesceGap {
                last.end = max(last.end, entry.offset + entry.length)
                last.entries.append(number)
                plan.ranges[plan.ranges.count - 1] = last
            } else {
                plan.ranges.append(Range(start: entry.offset, end: entry.offset + entry.length, entries: [number]))
            }
        }
        if Double(plan.bytesToFetch) > Self.maxShare * Double(packLength) {
            return .failure(
                DeltaRefusal(
                    .tooMuchChanged,
                    "the update would fetch \(plan.bytesToFetch) of the pack's \(packLength) bytes (more than \(Int(Self.maxShare * 100))%)"
                ))
        }
        return .success(plan)
    }
}

/// Why a delta update is not used: the whole pack is fetched instead.
struct DeltaRefusal: Error, Sendable, Hashable {
    var fallback: Download.DeltaFallback
    init(_ reason: Download.DeltaFallback.Reason, _ message: String) { self.fallback = Download.DeltaFallback(reason, message) }
}

/// One zip entry as fetched (its local header, data and any data descriptor), made into a zip of its own by
/// appending a central directory built from the local header and the index: the unpacker then reads it with
/// every check it applies to a whole pack.
enum DeltaZip {
    /// Appends a central directory and an end record to `fd`, which holds exactly the entry's `length` bytes.
    ///
    /// - Throws: `DeltaRefusal` for an entry this cannot describe (ZIP64, no local header);
    ///   `PackDeliveryError` `unsafeEntry` when the local header names another path than the index.
    static func close(_ fd: Int32, entry: PackIndex.Entry, path: String) throws {
        let length = Int(entry.length)
        var header = [UInt8](repeating: 0, count: 30)
        guard pread(fd, &header, 30, 0) == 30, u32(header, 0) == 0x0403_4B50 else {
            throw PackDeliveryError(
                .corruptArchive,
                message: "The bytes fetched for \(PackDeliveryError.printable(entry.path)) do not start with a zip local header.",
                hint: "The pack on the server does not match its index.", subject: entry.path)
        }
        let flags = u16(header, 6)
        let nameLength = Int(u16(header, 26))
        let extraLength = Int(u16(header, 28))
        var name = [UInt8](repeating: 0, count: nameLength)
        guard nameLength == 0 || pread(fd, &name, nameLength, 30) == nameLength else {
            throw DeltaRefusal(.indexUnusable, "an entry's local header is cut short")
        }
        var shown = String(decoding: name, as: UTF8.self)
        while shown.hasPrefix("./") { shown.removeFirst(2) }
        if shown.count > 1, shown.hasSuffix("/") { shown.removeLast() }
        guard shown == entry.path else {
            throw PackDeliveryError(
                .unsafeEntry,
                message:
                    "The pack's local header at byte \(entry.offset) names '\(PackDeliveryError.printable(shown))', but its index says '\(PackDeliveryError.printable(entry.path))'.",
                hint: "Nothing was installed; the pack on the server does not match its index.", subject: entry.path)
        }
        var crc = u32(header, 14)
        var compressed = u32(header, 18)
        var uncompressed = u32(header, 22)
        if compressed == 0xFFFF_FFFF || uncompressed == 0xFFFF_FFFF {
            throw DeltaRefusal(.indexUnusable, "the entry \(PackDeliveryError.printable(entry.path)) is a ZIP64 entry")
        }
        let dataStart = 30 + nameLength + extraLength
        if flags & 0x8 != 0 {
            // The sizes follow the data, in a descriptor of 12 bytes or 16 with its signature.
            var tail = [UInt8](repeating: 0, count: 16)
            guard length >= dataStart + 12, pread(fd, &tail, 16, off_t(length - 16)) == 16 else {
                throw DeltaRefusal(.indexUnusable, "an entry's data descriptor is missing")
            }
            // With or without its signature, the descriptor's last 12 bytes are the CRC and the two sizes.
            crc = u32(tail, 4)
            compressed = u32(tail, 8)
            uncompressed = u32(tail, 12)
        }
        guard Int(compressed) <= length - dataStart else {
            throw PackDeliveryError(
                .corruptArchive,
                message:
                    "The entry \(PackDeliveryError.printable(entry.path)) says it holds \(compressed) bytes, more than its \(length - dataStart) in the pack.",
                hint: "The pack on the server does not match its index.", subject: entry.path)
        }
        let mode = entry.mode ?? (entry.kind == .symlink ? 0o120777 : entry.kind == .directory ? 0o040755 : 0o100644)
        var central: [UInt8] = []
        func put16(_ value: UInt16) { central += [UInt8(value & 0xFF), UInt8(value >> 8)] }
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
        put32(crc)
        put32(compressed)
        put32(uncompressed)
        put16(UInt16(nameLength))
        put16(0)
        put16(0)
        put16(0)
        put16(0)
        put32(UInt32(mode) << 16 | (entry.kind == .directory ? 0x10 : 0))
        put32(0)
        central += name
        let directorySize = central.count
        put32(0x0605_4B50)
        put16(0)
        put16(0)
        put16(1)
        put16(1)
        put32(UInt32(directorySize))
        put32(UInt32(length))
        put16(0)
        let written = central.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(length)) }
        guard written == central.count else { throw PackDeliveryError.io("write the fetched entry", path: entry.path, errno: errno) }
    }

    private static func u16(_ bytes: [UInt8], _ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
    private static func u32(_ bytes: [UInt8], _ at: Int) -> UInt32 { UInt32(u16(bytes, at)) | UInt32(u16(bytes, at + 2)) << 16 }
}
