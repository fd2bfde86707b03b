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
}
