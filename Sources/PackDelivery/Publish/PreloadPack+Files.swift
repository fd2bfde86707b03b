import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension PreloadPack {
    /// What `packs manifest` needs to know of a preload pack it cannot read: `<pack>.preload.json` beside it.
    public struct Description: Sendable, Hashable, Codable {
        /// The key's id and release date, as the manifest gives them.
        public var preload: Manifest.Content.Preload
        /// The product and version of the pack's `ContentInfo.plist`.
        public var productIdentifier: String
        public var contentVersion: String
        /// The total size of the pack's regular files.
        public var unpackedLength: Int64
        /// The plain pack's length and SHA-256 (its index describes it).
        public var plain: PackIndex.Pack
    }

    /// Where the description of the preload pack at `pack` goes: `<pack>.preload.json`.
    public static func descriptionURL(for pack: URL) -> URL {
        pack.deletingLastPathComponent().appending(path: pack.lastPathComponent + ".preload.json")
    }

    /// Writes `folder` into a preload pack at `output`, encrypted with `key`: the pack as ``PackWriter`` writes it,
    /// encrypted (``PreloadPack``), with its index beside it (describing the plain pack, whose ranges are those of the
    /// encrypted one) and its ``Description`` (`<output>.preload.json`). No plain pack is left behind.
    ///
    /// - Parameters:
    ///   - folder: the folder to pack.
    ///   - output: the encrypted pack to create or replace.
    ///   - format: the archive format.
    ///   - contentInfo: the product identifier and content version (a preload pack needs them: its manifest entry
    ///     cannot read them from the encrypted pack).
    ///   - chunker: the chunk sizes.
    ///   - key: the key.
    ///   - releases: when the key is released, ISO 8601.
    /// - Returns: the unpacked length.
    /// - Throws: as ``PackWriter/write(folder:to:format:contentInfo:chunker:)``; `invalidArgument` for a release date
    ///   that is not ISO 8601.
    @discardableResult
    public static func write(
        folder: URL, to output: URL, format: PackFormat, contentInfo: (productIdentifier: String, contentVersion: String),
        chunker: Chunker = .standard, key: PreloadKey, releases: String
    ) throws(PackDeliveryError) -> Int64 {
        guard Manifest.Content.Preload.date(releases) != nil else {
            throw PackDeliveryError(
                .invalidArgument, message: "The release date '\(PackDeliveryError.printable(releases))' is not ISO 8601.",
                hint: "Give a date and time like 2026-12-01T00:00:00Z.", subject: releases)
        }
        let plain = output.deletingLastPathComponent().appending(path: ".\(output.lastPathComponent).plain-\(getpid())")
        let plainIndex = PackWriter.indexURL(for: plain)
        defer {
            unlink(plain.path)
            unlink(plainIndex.path)
        }
        let unpacked = try PackWriter.write(folder: folder, to: plain, format: format, contentInfo: contentInfo, chunker: chunker)
        let indexData = try SmallFile.read(plainIndex.path, limit: 1 << 30) { _ in .init(.internalError, message: "index too large") }
        guard let indexData else { throw .io("read", path: plainIndex.path, errno: ENOENT) }
        let index: PackIndex
        do { index = try PackIndex.decode(indexData, maxEntries: Int.max / 2, containers: Set(PackIndex.Container.allCases)) } catch {
            throw PackDeliveryError(.internalError, message: "The index just written for \(output.path) does not read back.")
        }
        guard let pack = index.pack else { throw PackDeliveryError(.internalError, message: "The index of \(output.path) names no pack.") }
        try Self.encrypt(plain, to: output, key: key, index: index)
        let description = Description(
            preload: .init(keyID: key.keyID, releases: releases), productIdentifier: contentInfo.productIdentifier,
            contentVersion: contentInfo.contentVersion, unpackedLength: unpacked, plain: pack)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        let descriptionData = (try? encoder.encode(description)) ?? Data()
        try SmallFile.write(descriptionData, to: Self.descriptionURL(for: output))
        if rename(plainIndex.path, PackWriter.indexURL(for: output).path) != 0 {
            throw .io("rename", path: PackWriter.indexURL(for: output).path, errno: errno)
        }
        return unpacked
    }

    /// Encrypts the plain pack at `plain` into a preload pack at `output` (written beside it and renamed into place).
    ///
    /// - Parameters:
    ///   - plain: the plain pack.
    ///   - output: the preload pack to create or replace.
    ///   - key: the key.
    ///   - index: the pack's index, whose chunks' ranges become segments; nil for segments of 1 MiB.
    /// - Throws: `io` (or `insufficientStorage`) when a file cannot be read or written.
    public static func encrypt(_ plain: URL, to output: URL, key: PreloadKey, index: PackIndex?) throws(PackDeliveryError) {
        let input = open(plain.path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw .io("open", path: plain.path, errno: errno) }
        defer { close(input) }
        var info = stat()
        guard fstat(input, &info) == 0 else { throw .io("stat", path: plain.path, errno: errno) }
        let length = Int64(info.st_size)
        var generator = SystemRandomNumberGenerator()
        let salt = (0..<PreloadCipher.saltLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let cipher = PreloadCipher(key: key, salt: salt)
        var trailer: [UInt8] = []
        let segments = Self.segments(length: length, index: index)
        let longest = Int(segments.map(\.length).max() ?? 1)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(longest, 1), alignment: 16)
        defer { buffer.deallocate() }
        try Self.replace(output) { (fd) throws(PackDeliveryError) in
            for segment in segments {
                let bytes = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<Int(segment.length)])
                try Self.read(input, into: bytes, at: segment.offset, path: plain.path)
                guard let tag = cipher.encrypt(bytes, offset: segment.offset) else {
                    throw PackDeliveryError(.internalError, message: "OpenSSL could not encrypt \(output.path).")
                }
                try Self.write(fd, UnsafeRawBufferPointer(bytes), path: output.path)
                withUnsafeBytes(of: segment.length.littleEndian) { trailer.append(contentsOf: $0) }
                trailer.append(contentsOf: tag)
            }
            trailer.append(contentsOf: Self.bytes(ofHex: key.keyID))
            trailer.append(contentsOf: salt)
            withUnsafeBytes(of: length.littleEndian) { trailer.append(contentsOf: $0) }
            withUnsafeBytes(of: Int64(segments.count).littleEndian) { trailer.append(contentsOf: $0) }
            trailer.append(contentsOf: Self.magic)
            try Self.write(fd, trailer, path: output.path)
        }
    }

    /// Decrypts the preload pack at `encrypted` into the plain pack at `plain` (written beside it, synced and renamed
    /// into place: a kill or a power cut leaves no plain pack, or the whole one). The encrypted pack is never changed.
    ///
    /// - Parameters:
    ///   - encrypted: the preload pack.
    ///   - plain: where the plain pack goes.
    ///   - key: the pack's key.
    ///   - name: the pack's name for errors (its content identifier).
    /// - Throws: `preloadKeyMismatch` when the key is not the pack's; `preloadDecryptionFailed` naming the pack when a
    ///   segment does not decrypt (a changed byte); `corruptArchive` when the pack has no valid trailer; `io`.
    public static func decrypt(_ encrypted: URL, to plain: URL, key: PreloadKey, name: String) throws(PackDeliveryError) {
        try Self.decrypt(encrypted, to: plain, key: key, name: name, temporaryName: nil)
    }

    /// ``decrypt(_:to:key:name:)``, writing to `temporaryName` beside `plain` (nil: one named for this process).
    /// - Parameter durable: sync the plain pack and its folder; an install's plain pack is not (it is read at once and
    ///   removed, and one left by a crash is removed, never used), so that its bytes need never reach the disk.
    static func decrypt(
        _ encrypted: URL, to plain: URL, key: PreloadKey, name: String, temporaryName: String?, durable: Bool = true
    ) throws(PackDeliveryError) {
        let input = open(encrypted.path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw .io("open", path: encrypted.path, errno: errno) }
        defer { close(input) }
        var info = stat()
        guard fstat(input, &info) == 0 else { throw .io("stat", path: encrypted.path, errno: errno) }
        let layout = try Self.layout(fd: input, size: Int64(info.st_size), path: encrypted.path, name: name)
        try Self.check(key, layout: layout, name: name)
        let cipher = PreloadCipher(key: key, salt: layout.salt)
        let longest = Int(layout.segments.map(\.length).max() ?? 1)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(longest, 1), alignment: 16)
        defer {
            // The buffer held plaintext: clear it before it goes back to the allocator.
            memset(buffer.baseAddress!, 0, buffer.count)
            buffer.deallocate()
        }
        try Self.replace(plain, temporaryName: temporaryName, durable: durable) { (fd) throws(PackDeliveryError) in
            for segment in layout.segments {
                let bytes = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<Int(segment.length)])
                try Self.read(input, into: bytes, at: segment.offset, path: encrypted.path)
                guard cipher.decrypt(bytes, offset: segment.offset, tag: segment.tag) else {
                    throw Self.tampered(name, offset: segment.offset)
                }
                try Self.write(fd, UnsafeRawBufferPointer(bytes), path: plain.path)
            }
        }
    }

    /// Writes a new file beside `target` with `body`, syncs it and renames it over `target`, then syncs the folder (no
    /// sync unless `durable`); a failure removes the new file and leaves `target` as it was.
    static func replace(
        _ target: URL, temporaryName: String? = nil, durable: Bool = true, body: (Int32) throws(PackDeliveryError) -> Void
    ) throws(PackDeliveryError) {
        let temporary = target.deletingLastPathComponent().appending(
            path: temporaryName ?? ".\(target.lastPathComponent).part-\(getpid())")
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw .io("create", path: temporary.path, errno: errno) }
        var failure: PackDeliveryError?
        do throws(PackDeliveryError) {
            try body(fd)
            if durable, fsync(fd) != 0 { failure = .io("sync", path: temporary.path, errno: errno) }
        } catch { failure = error }
        close(fd)
        if failure == nil, rename(temporary.path, target.path) != 0 { failure = .io("rename", path: target.path, errno: errno) }
        if let failure {
            unlink(temporary.path)
            throw failure
        }
        guard durable else { return }
        let folder = open(target.deletingLastPathComponent().path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 {
            fsync(folder)
            close(folder)
        }
    }

    static func bytes(ofHex hex: String) -> [UInt8] {
        let digits = Array(hex.utf8)
        func value(_ digit: UInt8) -> UInt8 { digit >= 0x61 ? digit - 0x61 + 10 : digit - 0x30 }
        return stride(from: 0, to: digits.count - 1, by: 2).map { value(digits[$0]) << 4 | value(digits[$0 + 1]) }
    }
}

extension PreloadPack.Description {
    var contentInfo: ContentInfo { ContentInfo(contentVersion: self.contentVersion, productIdentifier: self.productIdentifier) }
}

extension PreloadPack {
    /// The description beside the pack at `pack` (`<pack>.preload.json`), or nil when it is a plain pack.
    ///
    /// - Throws: `invalidManifest` naming the file when it does not read as a description.
    static func description(of pack: URL) throws(PackDeliveryError) -> Description? {
        let url = Self.descriptionURL(for: pack)
        guard let data = try SmallFile.read(url.path, limit: 1 << 20, tooLarge: { .init(.invalidManifest, message: "\($0) is too large.") })
        else { return nil }
        guard let description = try? JSONDecoder().decode(Description.self, from: data),
            PreloadKey.isKeyID(description.preload.keyID), description.preload.releaseDate != nil
        else {
            throw PackDeliveryError(
                .invalidManifest, message: "\(url.lastPathComponent) does not describe a preload pack.",
                hint: "Write the pack again with its key.", subject: url.path)
        }
        return description
    }
}
