import CArchive
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The archive formats a pack can be written in.
public enum PackFormat: String, Sendable, CaseIterable {
    /// A zip archive (`.zip`).
    case zip
    /// An uncompressed tar (`.tar`).
    case tar
    /// A gzip-compressed tar (`.tar.gz`), written without a gzip timestamp.
    case tarGzip = "tar.gz"
    /// A bzip2-compressed tar (`.tar.bz2`).
    case tarBzip2 = "tar.bz2"
    /// An xz-compressed tar (`.tar.xz`).
    case tarXz = "tar.xz"
    /// A zstd-compressed tar (`.tar.zst`).
    case tarZstd = "tar.zst"

    /// The format an output file name asks for.
    ///
    /// - Parameter fileName: a file name or path ending in `.zip`, `.tar`, `.tar.gz` or `.tgz`,
    ///   `.tar.bz2`, `.tar.xz` or `.tar.zst` (any letter case).
    /// - Returns: `nil` for any other name.
    public init?(fileName: String) {
        let name = fileName.lowercased()
        if name.hasSuffix(".tgz") {
            self = .tarGzip
            return
        }
        guard let format = Self.allCases.first(where: { name.hasSuffix("." + $0.rawValue) }) else { return nil }
        self = format
    }
}

/// Writes a folder into a pack (a zip or a tar) with libarchive.
public enum PackWriter {
    /// The name of the metadata file at the root of a pack in Apple's hosted-content layout.
    public static let contentInfoName = "ContentInfo.plist"
    /// The folder that holds a pack's payload in Apple's hosted-content layout.
    public static let contentsFolderName = "Contents"

    /// Writes `folder`'s files into a new archive at `output`.
    ///
    /// Regular files, folders and relative symlinks that stay inside the folder are written, sorted by
    /// path, owned by 0:0, with modes normalised to 0755 (folders and files with the owner's execute
    /// bit) or 0644, and the files' modification times; gzip headers carry no timestamp. Writing the
    /// same folder twice gives the same bytes. The folder is not followed through symlinks; a hard-linked
    /// file is written once per name. A file named like `output` inside `folder` is skipped.
    ///
    /// When `contentInfo` is given, the archive gets a `ContentInfo.plist` at its root (an XML plist
    /// with the string keys `ContentVersion` and `IAPProductIdentifier`), replacing one at the top of
    /// the folder, and the payload goes under `Contents/`: a folder that already has a `Contents/`
    /// subfolder keeps its layout; otherwise everything in it is placed under `Contents/`. Without
    /// `contentInfo`, the folder is archived exactly as it is.
    ///
    /// The pack is written to a temporary file beside `output`, flushed to disk and renamed into
    /// place, so a failure leaves no half-written pack (and an earlier `output` untouched).
    ///
    /// Its ``PackIndex`` (format 2, or 3 when files share frames) goes beside it, as `<output>.index.json` (``indexURL(for:)``): its JSON
    /// compressed with zstd (read it with `zstd -dc`). A tar is
    /// written so that each file's content-defined chunks can be fetched apart: in a plain tar each chunk is a
    /// range of a file's data; in a tar.zst each chunk of a file of `PackFrameSink.groupedFileLimit` or more is a
    /// zstd frame of its own, smaller files share frames of up to `PackFrameSink.groupLimit` bytes with their tar
    /// headers (each of their chunks a slice of its frame), the other tar headers and padding are frames of their
    /// own, and the zstd seekable format's seek table ends the pack; in a
    /// tar.gz the same pieces are gzip members. Every tool reads these as ordinary archives. A zip's stored
    /// entries are chunked and its deflated entries are indexed whole; a tar.bz2 or tar.xz is indexed by entry.
    ///
    /// - Parameters:
    ///   - folder: the folder to pack.
    ///   - output: the archive to create or replace.
    ///   - format: the archive format and compression.
    ///   - contentInfo: the product identifier and content version for `ContentInfo.plist`.
    ///   - chunker: the chunk sizes.
    /// - Returns: the number of bytes of all regular files' contents, `ContentInfo.plist` included
    ///   (the pack's unpacked length, as a manifest's `unpackedLength`).
    /// - Throws: `PackDeliveryError` of kind `.usage` when the folder holds something a pack may not
    ///   (a device, FIFO or socket, an absolute or escaping symlink, a symlink through a symlink);
    ///   `.insufficientStorage` when the output filesystem is full; `.io` for other failures.
    @discardableResult
    public static func write(
        folder: URL, to output: URL, format: PackFormat,
        contentInfo: (productIdentifier: String, contentVersion: String)? = nil, chunker: Chunker = .standard
    ) throws(PackDeliveryError) -> Int64 {
        let locale = ArchiveThreadLocale.useUTF8()
        defer { locale.restore() }

        let folderPath = folder.path
        var skip: (dev_t, ino_t)?
        var outputStat = stat()
        if lstat(output.path, &outputStat) == 0 { skip = (outputStat.st_dev, outputStat.st_ino) }

        var scanner = PackFolderScanner(root: folderPath, skip: skip)
        var items = try scanner.scan(
            omittingTopLevel: contentInfo == nil ? nil : Array(Self.contentInfoName.utf8))
        try PackFolderScanner.checkSymlinks(items, root: folderPath)

        if let contentInfo {
            let contents = Array(Self.contentsFolderName.utf8)
            let hasContentsFolder = items.contains { $0.path == contents && $0.kind == .directory }
            let newest = (items.map(\.mtime.0).max() ?? 0, 0)
            if !hasContentsFolder {
                for index in items.indices { items[index].path = contents + [UInt8(ascii: "/")] + items[index].path }
                items.append(PackItem(path: contents, source: nil, kind: .directory, mode: 0o755, size: 0, mtime: newest))
            }
            let plist = try Self.contentInfoPlist(
                productIdentifier: contentInfo.productIdentifier,
                contentVersion: contentInfo.contentVersion)
            items.append(
                PackItem(
                    path: Array(Self.contentInfoName.utf8), source: nil, kind: .generated(plist),
                    mode: 0o644, size: Int64(plist.count), mtime: newest))
        }
        items.sort { $0.path.lexicographicallyPrecedes($1.path) }

        var writer = try PackArchiveWriter(output: output, format: format, chunker: chunker)
        do {
            var total: Int64 = 0
            for item in items {
                try writer.add(item, folderPath: folderPath)
                if item.isRegularFile { total += item.size }
            }
            var index = try writer.finish()
            // A pack libarchive wrote (zip, tar.bz2, tar.xz) is indexed by reading it back.
            if index == nil { index = try PackIndexer.index(output, chunker: chunker).index }
            if let index { try PackIndexer.write(index, to: Self.indexURL(for: output)) }
            return total
        } catch {
            writer.abandon()
            throw error
        }
    }

    /// Where the index of the pack at `pack` goes: `<pack>.index.json` beside it (zstd-compressed JSON; a reader
    /// also takes plain JSON, as indexes were before).
    public static func indexURL(for pack: URL) -> URL {
        pack.deletingLastPathComponent().appending(path: pack.lastPathComponent + ".index.json")
    }

    /// The XML property list of a pack's `ContentInfo.plist`.
    static func contentInfoPlist(productIdentifier: String, contentVersion: String) throws(PackDeliveryError) -> Data {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .xml
        do {
            return try encoder.encode(ContentInfo(contentVersion: contentVersion, productIdentifier: productIdentifier))
        } catch {
            throw PackDeliveryError(
                .invalidArgument, message: "Could not encode \(Self.contentInfoName): \(error).",
                subject: Self.contentInfoName)
        }
    }
}

// MARK: - Scanning the folder
