import CArchive
import Foundation

/// libarchive reading a pack from a file, fed by callbacks of our own rather than `archive_read_open_fd`,
/// so that what libarchive does stays bounded:
///
/// - The compression is chosen from the pack's first bytes, and only that one filter is used: libarchive
///   never stacks filters, so a gzip that decompresses to itself (a "quine") is read once and then refused
///   as not an archive, instead of unwrapping forever.
/// - A compressed pack is decompressed by a reader of its own (libarchive's `raw` format with that filter),
///   whose output is pulled 64 KiB at a time into the reader that parses the tar. So every decompressed
///   byte passes here: a bomb stops at the limit (the entries' bytes plus an allowance per entry for
///   headers and padding), and a pause or cancel stops an unpack inside one long libarchive call, even when
///   libarchive skips data on its own. (Without this, a few KiB of bzip2 can expand to gigabytes inside one
///   call.) An uncompressed pack is read from the file with seeks, as zip needs for its central directory.
///
/// With a ``GrowingFile`` the pack is read while it downloads: a read past what is written waits for more,
/// and nothing is seeked: a zip is then read by its local headers (libarchive's streamable zip reader; see ``StreamedUnpack``).
///
/// With a ``PreloadPack/Decryption`` the file is a preload pack's ciphertext: each block is decrypted as it is read, in
/// order, and nothing is seeked or skipped; the file ends where the plain pack does (its segment table follows).
///
/// Not thread-safe; one per unpack or inspection. Freed by its owner (`deinit`).
final class ArchiveReader {
    /// The reader that parses the archive (tar or zip).
    let reader: OpaquePointer
    /// The reader that decompresses, for a compressed pack.
    private let decoder: OpaquePointer?
    let path: String
    private let fd: Int32
    /// Blocks read from the file.
    private let fileBuffer: UnsafeMutableRawBufferPointer
    /// Decompressed blocks, for a compressed pack.
    private let decompressedBuffer: UnsafeMutableRawBufferPointer?
    private var position: Int64 = 0
    /// Decompressed bytes handed to the parser so far.
    private var decompressed: Int64 = 0
    private let isCancelled: () -> Bool
    /// The file is still being written: reads wait for it.
    private let growing: GrowingFile?
    /// The file is a preload pack: its blocks are decrypted as they are read.
    private let decryption: PreloadPack.Decryption?
    /// The most decompressed bytes of entry data; headers and padding get an allowance per entry.
    private let maxDecompressed: Int64
    /// Entries read so far (the unpacker counts them).
    var entries = 0
    /// Why a callback stopped libarchive; preferred over libarchive's own message.
    private(set) var failure: PackDeliveryError?

    /// Bytes read from the file at a time.
    static let blockSize = 256 << 10
    /// Decompressed bytes pulled at a time.
    static let decompressedBlockSize = 64 << 10
    /// Decompressed bytes allowed per entry on top of its data, and once for the archive's own framing.
    static let perEntryAllowance: Int64 = 16 << 10
    static let framingAllowance: Int64 = 1 << 20

    /// Opens a pack for reading.
    ///
    /// - Parameters:
    ///   - url: the pack.
    ///   - maxDecompressed: the most bytes of entry data the format may read; headers and padding get an allowance per entry.
    ///   - isCancelled: polled for every block read or decompressed.
    ///   - growing: the file is still being written.
    ///   - decryption: the file is a preload pack's ciphertext, decrypted as it is read.
    /// - Throws: `fileSystem` when the file cannot be opened, `corruptArchive` when it is not a zip or tar;
    ///   `preloadDecryptionFailed` from `decryption`.
    init(
        _ url: URL, maxDecompressed: Int64, isCancelled: @escaping () -> Bool = { false }, growing: GrowingFile? = nil,
        decryption: PreloadPack.Decryption? = nil
    ) throws(PackDeliveryError) {
        self.path = url.path
        self.isCancelled = isCancelled
        self.maxDecompressed = maxDecompressed
        self.growing = growing
        self.decryption = decryption
        // A growing file may not exist yet: its first bytes (the magic) are waited for before it is opened.
        if let growing, case .stop(let why) = growing.wait(beyond: 5) { throw why }
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open the pack", path: url.path, errno: errno) }
        var info = stat()
        let size =
            growing?.length ?? decryption?.layout.plainLength ?? (fstat(fd, &info) == 0 ? Int64(info.st_size) : Int64(Self.blockSize))
        var magic = [UInt8](repeating: 0, count: 6)
        if let decryption {
            do { magic = try decryption.peek(magic.count, fd: fd, path: url.path) } catch {
                close(fd)
                throw error
            }
        } else {
            let got = magic.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
            magic = Array(magic.prefix(max(0, got)))
        }
        let filter = Self.filter(forMagic: magic)
        guard let reader = archive_read_new() else {
            close(fd)
            throw .io("start reading the pack", path: url.path, errno: ENOMEM)
        }
        self.fd = fd
        self.reader = reader
        self.decoder = filter == nil ? nil : archive_read_new()
        self.fileBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(min(Int64(Self.blockSize), max(4096, size))), alignment: 16)
        self.decompressedBuffer =
            filter == nil ? nil : UnsafeMutableRawBufferPointer.allocate(byteCount: Self.decompressedBlockSize, alignment: 16)
        let me = Unmanaged.passUnretained(self).toOpaque()

        // The parser: exactly the formats a pack may be.
        if archive_read_support_format_zip(reader) < ARCHIVE_WARN || archive_read_support_format_tar(reader) < ARCHIVE_WARN {
            throw PackDeliveryError.corruptArchive("libarchive cannot read zip or tar: \(self.message)")
        }
        archive_read_set_callback_data(reader, me)
        if let filter {
            guard let decoder = self.decoder else { throw .io("start reading the pack", path: url.path, errno: ENOMEM) }
            // ARCHIVE_WARN from a filter means "through an external program": still usable.
            if archive_read_append_filter(decoder, filter.code) < ARCHIVE_WARN || archive_read_support_format_raw(decoder) < ARCHIVE_WARN {
                throw PackDeliveryError.corruptArchive("libarchive cannot read \(filter.name): \(Self.message(of: decoder))")
            }
            archive_read_set_callback_data(decoder, me)
            archive_read_set_read_callback(decoder) { _, data, block in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().readFile(block)
            }
            var entry: OpaquePointer?
            if archive_read_open1(decoder) != ARCHIVE_OK || archive_read_next_header(decoder, &entry) != ARCHIVE_OK {
                throw self.failure ?? PackDeliveryError.corruptArchive("\(filter.name): \(Self.message(of: decoder))")
            }
            archive_read_set_read_callback(reader) { _, data, block in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().readDecompressed(block)
            }
        } else if growing != nil || decryption != nil {
            archive_read_set_read_callback(reader) { _, data, block in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().readFile(block)
            }
        } else {
            archive_read_set_read_callback(reader) { _, data, block in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().readFile(block)
            }
            archive_read_set_seek_callback(reader) { _, data, offset, whence in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().seek(offset, whence)
            }
            archive_read_set_skip_callback(reader) { _, data, request in
                Unmanaged<ArchiveReader>.fromOpaque(data!).takeUnretainedValue().skip(request)
            }
        }
        if archive_read_open1(reader) != ARCHIVE_OK {
            throw self.error(nil)
        }
    }

    deinit {
        archive_read_free(self.reader)
        if let decoder { archive_read_free(decoder) }
        close(self.fd)
        if self.decryption != nil {
            // They held plaintext: cleared before they go back to the allocator.
            memset(self.fileBuffer.baseAddress!, 0, self.fileBuffer.count)
            if let buffer = self.decompressedBuffer { memset(buffer.baseAddress!, 0, buffer.count) }
        }
        self.fileBuffer.deallocate()
        self.decompressedBuffer?.deallocate()
    }

    /// The pack is compressed as a whole (a tar.gz, .bz2, .xz or .zst): this reader decompresses it.
    var isCompressed: Bool { self.decoder != nil }

    /// The compression of a pack, from its first bytes.
    static func filter(forMagic bytes: [UInt8]) -> (code: Int32, name: String)? {
        if bytes.starts(with: [0x1F, 0x8B]) { return (ARCHIVE_FILTER_GZIP, "gzip") }
        if bytes.starts(with: Array("BZh".utf8)) { return (ARCHIVE_FILTER_BZIP2, "bzip2") }
        if bytes.starts(with: [0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00]) { return (ARCHIVE_FILTER_XZ, "xz") }
        if bytes.starts(with: [0x28, 0xB5, 0x2F, 0xFD]) { return (ARCHIVE_FILTER_ZSTD, "zstd") }
        return nil
    }

    /// libarchive's last message, one line, or a stand-in when it has none.
    var message: String { Self.message(of: self.reader) }

    static func message(of archive: OpaquePointer) -> String {
        guard let text = archive_error_string(archive) else { return "unknown libarchive error" }
        return PackDeliveryError.oneLine(String(cString: text))
    }

    /// The error to report for a failed libarchive call: ours when a callback stopped it, else libarchive's.
    func error(_ entry: String?) -> PackDeliveryError {
        if let failure { return failure }
        let code = Int(archive_errno(self.reader))
        if code == Int(ENOSPC) || code == Int(EDQUOT) {
            return .insufficientStorage(path: self.path, needed: nil, available: nil, errno: Int32(code))
        }
        return .corruptArchive(self.message, entry: entry, code: code == 0 ? nil : code)
    }

    /// Stops when cancelled or past the decompressed-bytes limit; checked for every block and by the unpacker between blocks.
    func checkBounds() -> Bool {
        if self.failure != nil { return false }
        if self.isCancelled() {
            self.failure = PackDeliveryError(
                .cancelled, message: "Unpacking '\(URL(filePath: self.path).lastPathComponent)' was cancelled.", subject: self.path)
            return false
        }
        let (overhead, overflow1) = Int64(self.entries + 1).multipliedReportingOverflow(by: Self.perEntryAllowance)
        let (allowed, overflow2) = self.maxDecompressed.addingReportingOverflow(overhead + Self.framingAllowance)
        if !overflow1, !overflow2, self.decompressed > allowed {
            self.failure = .unpackLimitExceeded("bytes once decompressed", limit: allowed, entry: nil)
            return false
        }
        return true
    }

    // MARK: Callbacks (on the calling thread, inside libarchive)

    /// The file's next block (for the decoder, or for the parser of an uncompressed pack).
    private func readFile(_ block: UnsafeMutablePointer<UnsafeRawPointer?>?) -> la_ssize_t {
        if self.decoder == nil { guard self.checkBounds() else { return -1 } }
        var want = self.fileBuffer.count
        if let growing = self.growing {
            switch growing.wait(beyond: self.position) {
            case .available(let end): want = Int(min(Int64(want), end - self.position))
            case .ended: return 0
            case .stop(let why):
                self.failure = why
                return -1
            }
        }
        if let decryption {
            want = Int(min(Int64(want), decryption.layout.plainLength - self.position))
            if want == 0 { return 0 }
        }
        while true {
            let got = pread(self.fd, self.fileBuffer.baseAddress, want, off_t(self.position))
            if got < 0, errno == EINTR { continue }
            if got < 0 {
                self.failure = .io("read the pack", path: self.path, errno: errno)
                return -1
            }
            if let decryption {
                do throws(PackDeliveryError) {
                    try decryption.decrypt(UnsafeMutableRawBufferPointer(rebasing: self.fileBuffer[0..<got]))
                } catch {
                    self.failure = error
                    return -1
                }
            }
            self.position += Int64(got)
            if self.decoder == nil { self.decompressed += Int64(got) }
            block?.pointee = UnsafeRawPointer(self.fileBuffer.baseAddress)
            return got
        }
    }

    /// The next decompressed block, for the parser of a compressed pack.
    private func readDecompressed(_ block: UnsafeMutablePointer<UnsafeRawPointer?>?) -> la_ssize_t {
        guard self.checkBounds(), let decoder = self.decoder, let buffer = self.decompressedBuffer else { return -1 }
        let got = archive_read_data(decoder, buffer.baseAddress, buffer.count)
        if got < 0 {
            if self.failure == nil { self.failure = .corruptArchive(Self.message(of: decoder)) }
            return -1
        }
        self.decompressed += Int64(got)
        block?.pointee = UnsafeRawPointer(buffer.baseAddress)
        return got
    }

    private func seek(_ offset: la_int64_t, _ whence: Int32) -> la_int64_t {
        var info = stat()
        guard fstat(self.fd, &info) == 0 else { return -1 }
        let target: Int64 =
            switch whence {
            case SEEK_SET: offset
            case SEEK_CUR: self.position + offset
            case SEEK_END: Int64(info.st_size) + offset
            default: -1
            }
        guard target >= 0 else { return -1 }
        self.position = target
        return target
    }

    private func skip(_ request: la_int64_t) -> la_int64_t {
        guard self.checkBounds(), request > 0 else { return 0 }
        self.position += request
        return request
    }
}
