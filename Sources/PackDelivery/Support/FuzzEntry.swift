import Foundation

/// The internal entry points that the fuzz targets (`Fuzz/Targets`) and the corpus tests drive with
/// arbitrary bytes, exposed without making them API.
///
/// Import with `@_spi(Fuzzing) import PackDelivery`. Manifest decoding needs no entry here: the fuzzers
/// call the public ``LoadedManifest/decode(_:from:)``.
@_spi(Fuzzing) public enum FuzzEntry {
    /// Inspects a pack as `packs manifest` does.
    ///
    /// - Parameter archive: any file.
    /// - Returns: the pack's unpacked length (the sum of its regular files' sizes).
    /// - Throws: ``PackDeliveryError`` when the file is not a usable pack.
    public static func inspect(_ archive: URL) throws(PackDeliveryError) -> Int64 {
        try PackInspector.inspect(archive).unpackedLength
    }

    /// Checks a zip's two directories, then unpacks it, as an install does, with the limits `fetch` uses by
    /// default for a pack whose manifest gives no `unpackedLength` (100 times the pack's size, 100,000 entries).
    ///
    /// - Parameters:
    ///   - archive: any file.
    ///   - staging: an existing, empty folder.
    /// - Returns: the number of entries unpacked.
    /// - Throws: ``PackDeliveryError`` when the file is not a pack that may be unpacked.
    public static func unpack(_ archive: URL, into staging: URL) throws(PackDeliveryError) -> Int {
        var info = stat()
        let length = stat(archive.path, &info) == 0 ? Int64(info.st_size) : 0
        let policy = Installer.UnpackLimitsPolicy()
        let limits = UnpackLimits(maxBytes: policy.maxBytes(packLength: length, unpackedLength: nil), maxEntries: policy.maxEntries)
        try ZipDirectories.check(archive)
        return try Unpacker.unpack(archive: archive, into: staging, limits: limits).entries
    }

    /// Reads a Metalink file as `fetch` reads a `.meta4` manifest (its encoding decided, a DTD refused, then parsed).
    ///
    /// - Parameter data: any bytes, as a `.meta4` file fetched from a server.
    /// - Returns: the identifiers of the products (and packs) it describes.
    /// - Throws: `invalidManifest` when it is refused.
    public static func metalink(_ data: Data) throws(PackDeliveryError) -> [String] {
        let url = URL(string: "https://packs.example.com/catalog/pack.meta4")!
        let loaded = try LoadedManifest(manifest: try Metalink.manifest(data, from: url), baseURL: url)
        return loaded.manifest.products.flatMap { [$0.productIdentifier] + $0.contents.map(\.contentIdentifier) }
    }

    /// What an accepted index promises its reader and does not hold: every chunk inside the pack, no two
    /// overlapping, a file's chunks adding up to its size, a path that stays inside the folder. Empty when the index
    /// is refused or keeps its promises.
    public static func indexPromisesBroken(_ data: Data) -> [String] {
        guard
            let index = try? PackIndex.decode(
                data, maxEntries: Installer.UnpackLimitsPolicy().maxEntries, containers: Set(PackIndex.Container.allCases)),
            index.format >= 2
        else { return [] }
        var problems: [String] = []
        var ranges: [(Int64, Int64, Int64?)] = []
        for entry in index.entries {
            if entry.path.hasPrefix("/") || entry.path.split(separator: "/").contains("..") {
                problems.append("escaping path \(entry.path)")
            }
            guard let chunks = entry.chunks else { continue }
            if chunks.reduce(0, { $0 + $1.size }) != entry.size { problems.append("chunks of \(entry.path) do not add up") }
            for chunk in chunks {
                if chunk.offset < 0 || chunk.length < 1 || chunk.offset + chunk.length > (index.pack?.length ?? 0) {
                    problems.append("chunk of \(entry.path) outside the pack")
                }
                if chunk.storage == .zstdFrameSlice {
                    let (frameSize, frameOffset) = (chunk.frameSize ?? 0, chunk.frameOffset ?? -1)
                    if frameOffset < 0 || frameOffset + chunk.size > frameSize {
                        problems.append("slice of \(entry.path) outside its frame")
                    }
                }
                ranges.append((chunk.offset, chunk.offset + chunk.length, chunk.frameSize))
            }
        }
        // Slices of one shared frame give the same range; any other overlap is broken.
        ranges.sort { ($0.0, $0.1) < ($1.0, $1.1) }
        let shared = { (a: (Int64, Int64, Int64?), b: (Int64, Int64, Int64?)) in a.0 == b.0 && a.1 == b.1 && a.2 != nil && a.2 == b.2 }
        if zip(ranges, ranges.dropFirst()).contains(where: { $0.1 > $1.0 && !shared($0, $1) }) { problems.append("overlapping chunks") }
        return problems
    }

    /// Reads a pack index as a delta update does, then does with its numbers what a delta update does: plans the
    /// update (with every other file entry taken as installed), checks the index against the central directory it
    /// describes, and for each of the first 16 entries to fetch of at most 64 KiB, makes its bytes (a stored local
    /// header naming it, and `a`s), closes them into a zip of their own and unpacks that into `staging`.
    ///
    /// - Parameters:
    ///   - data: any bytes, as an index fetched from a server.
    ///   - staging: an existing, empty folder.
    /// - Returns: the number of entries unpacked whose bytes matched the index (`a`s rarely do).
    /// - Throws: `invalidManifest` saying why when a delta update would not use the index (it would fetch the whole
    ///   pack); another ``PackDeliveryError`` when an entry's unpack fails. A tar pack's index is only read.
    public static func index(_ data: Data, staging: URL) throws(PackDeliveryError) -> Int {
        func refused(_ refusal: DeltaRefusal) -> PackDeliveryError {
            PackDeliveryError(.invalidManifest, message: "The pack's index is not used: \(refusal.fallback.message).")
        }
        let index: PackIndex
        do {
            index = try PackIndex.decode(
                data, maxEntries: Installer.UnpackLimitsPolicy().maxEntries, containers: Set(PackIndex.Container.allCases))
        } catch {
            throw refused(error)
        }
        // A tar pack's index is read, not planned: zip delta updates cannot use it.
        guard index.container == .zip else { return 0 }
        let installed = index.entries.enumerated().compactMap { number, entry in
            number % 2 == 0 && entry.kind == .file
                ? InstalledFileRecord(
                    destination: .caches, contentIdentifier: "fuzz", path: entry.path, kind: .file, size: entry.size,
                    sha256: entry.sha256 ?? "")
                : nil
        }
        // The plan for a pack as long as a pack may be, so that it never falls back for fetching too much of it.
        let plan: DeltaPlan
        switch DeltaPlan.make(index: index, packLength: LoadedManifest.maxSize, installed: installed, damaged: []) {
        case .success(let made): plan = made
        case .failure(let refusal): throw refused(refusal)
        }
        // Offsets and lengths are at most 2^50 each: their sums fit.
        let packLength = index.entries.map { $0.offset + $0.length }.max() ?? 0
        func central(_ entry: PackIndex.Entry, method: Int, dataLength: Int64, crc: UInt32) -> ZipDirectories.Central {
            ZipDirectories.Central(
                name: Array(entry.path.utf8) + (entry.kind == .directory ? [UInt8(ascii: "/")] : []), flags: 0,
                method: UInt16(truncatingIfNeeded: method), crc: crc, compressedSize: dataLength, size: dataLength,
                localOffset: entry.offset, unixMode: entry.mode)
        }
        let directory = ZipDirectories.Directory(
            entries: index.entries.map { central($0, method: $0.method, dataLength: $0.size, crc: 0) }, offset: packLength, size: 0)
        _ = try? DeltaPlan.check(index, against: directory)
        var matched = 0
        for number in plan.fetch.filter({ index.entries[$0].length <= 64 << 10 }).prefix(16) {
            let entry = index.entries[number]
            let name = Array(entry.path.utf8)
            let dataLength = Int(entry.length) - 30 - name.count
            guard dataLength >= 0 else { continue }
            let filler = [UInt8](repeating: UInt8(ascii: "a"), count: dataLength)
            let crc = filler.withUnsafeBytes { CRC32.update(0, $0) }
            var bytes: [UInt8] = [0x50, 0x4B, 0x03, 0x04, 20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]
            for value in [crc, UInt32(dataLength), UInt32(dataLength)] { bytes += withUnsafeBytes(of: value.littleEndian, Array.init) }
            bytes += [UInt8(name.count & 0xFF), UInt8(name.count >> 8), 0, 0] + name + filler
            let file = staging.appending(path: "e\(number).zip")
            let fd = open(file.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw .io("create", path: file.path, errno: errno) }
            defer { close(fd) }
            guard bytes.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) == bytes.count else {
                throw .io("write", path: file.path, errno: errno)
            }
            do {
                // Stored, as its local header says.
                try DeltaZip.close(fd, entry: entry, central: central(entry, method: 0, dataLength: Int64(dataLength), crc: crc))
            } catch let refusal as DeltaRefusal {
                throw refused(refusal)
            } catch let error as PackDeliveryError {
                throw error
            } catch {
                throw PackDeliveryError(.internalError, message: "\(error)")
            }
            let out = staging.appending(path: "u\(number)")
            guard mkdir(out.path, 0o700) == 0 else { throw .io("create", path: out.path, errno: errno) }
            if try DeltaZip.unpack(file, entry: entry, into: out, isCancelled: { false }, writer: SystemFileWriter()) != nil {
                matched += 1
            }
        }
        return matched
    }
}
