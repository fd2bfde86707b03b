import CCompression
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Writes a tar stream into a pack file as a series of independently readable pieces: a plain tar's bytes as they
/// are, each zstd frame or each gzip member compressed on its own. The caller decides where a piece ends
/// (``cut()``): after a tar header run, and after each chunk of a file's data, or, in a tar.zst, after a group of
/// small files with their headers (``groupLimit``).
///
/// A zstd pack ends with the zstd seekable format's seek table (a skippable frame that `zstd -d` and libarchive
/// pass over); concatenated gzip members are one valid gzip stream. The pack's bytes are hashed as they are
/// written. Owns its compression contexts; not `Sendable`: use it from one thread at a time.
final class PackFrameSink {
    enum Framing {
        case raw
        case zstd(level: Int32)
        case gzip(level: Int32)
    }

    /// The largest piece of tar headers kept before it is cut (a seekable frame may hold at most 1 GiB).
    static let maxHeaderRun = 1 << 20

    /// Files smaller than this share zstd frames in a tar.zst (their chunks are slices of a frame, index format 3):
    /// a frame of its own per small file compresses far worse than `bsdtar --zstd` (issue 29's size target; the
    /// trade-off is measured in RESULTS.md, case 12, "Round four: grouped frames").
    static let groupedFileLimit = 128 << 10

    /// The most bytes of tar a shared frame gathers before it is cut: a changed small file costs its whole frame in
    /// an update.
    static let groupLimit = 512 << 10

    let framing: Framing
    private let fd: Int32
    private let path: String
    /// Tar bytes not yet written as a piece.
    private var pending: [UInt8] = []
    private var output: [UInt8] = []
    /// The pack's length so far.
    private(set) var written: Int64 = 0
    private let packHasher = SHA256Hasher()
    /// Each frame's compressed and decompressed length, for the seek table.
    private var frames: [(compressed: UInt32, decompressed: UInt32)] = []
    private var zstd: OpaquePointer?
    private var gzip: UnsafeMutablePointer<z_stream>?
    /// The first failure met inside a libarchive callback, thrown by the next call that can throw.
    var failure: PackDeliveryError?

    init(fd: Int32, path: String, framing: Framing) {
        self.fd = fd
        self.path = path
        self.framing = framing
        switch framing {
        case .raw:
            break
        case .zstd(let level):
            self.zstd = ZSTD_createCCtx()
            if let zstd = self.zstd {
                ZSTD_CCtx_setParameter(zstd, ZSTD_c_compressionLevel, level)
                ZSTD_CCtx_setParameter(zstd, ZSTD_c_contentSizeFlag, 1)
            }
        case .gzip(let level):
            let stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
            stream.initialize(to: z_stream())
            // windowBits 15 + 16: a gzip header and trailer; zlib writes no timestamp and no name.
            if deflateInit2_(stream, level, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
                == Z_OK
            {
                self.gzip = stream
            } else {
                stream.deallocate()
            }
        }
    }

    deinit {
        if let zstd { ZSTD_freeCCtx(zstd) }
        if let gzip {
            deflateEnd(gzip)
            gzip.deallocate()
        }
    }

    /// The bytes of the tar stream not yet cut into a piece.
    var pendingCount: Int { self.pending.count }

    /// Adds tar bytes to the current piece.
    func append(_ bytes: UnsafeRawBufferPointer) {
        self.pending.append(contentsOf: bytes)
    }

    /// Ends the current piece: writes it raw, as one zstd frame or as one gzip member.
    ///
    /// - Returns: where the piece lies in the pack, or nil when there was nothing to write.
    @discardableResult
    func cut() throws(PackDeliveryError) -> (offset: Int64, length: Int64)? {
        if let failure { throw failure }
        guard !self.pending.isEmpty else { return nil }
        let offset = self.written
        switch self.framing {
        case .raw:
            try self.emit(self.pending)
        case .zstd:
            guard let zstd = self.zstd else { throw PackDeliveryError.io("compress", path: self.path, errno: ENOMEM) }
            let bound = ZSTD_compressBound(self.pending.count)
            if self.output.count < bound { self.output = [UInt8](repeating: 0, count: bound) }
            let count = self.output.withUnsafeMutableBytes { out in
                self.pending.withUnsafeBytes { ZSTD_compress2(zstd, out.baseAddress, out.count, $0.baseAddress, $0.count) }
            }
            guard ZSTD_isError(count) == 0 else {
                throw PackDeliveryError(
                    .internalError,
                    message: "zstd could not compress a frame of \(self.path): \(String(cString: ZSTD_getErrorName(count))).")
            }
            try self.emit(self.output[..<count])
            self.frames.append((UInt32(count), UInt32(self.pending.count)))
        case .gzip:
            guard let gzip = self.gzip else { throw PackDeliveryError.io("compress", path: self.path, errno: ENOMEM) }
            deflateReset(gzip)
            let bound = Int(deflateBound(gzip, uLong(self.pending.count))) + 64
            if self.output.count < bound { self.output = [UInt8](repeating: 0, count: bound) }
            let status = self.output.withUnsafeMutableBytes { out in
                self.pending.withUnsafeMutableBytes { input in
                    gzip.pointee.next_in = input.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    gzip.pointee.avail_in = uInt(input.count)
                    gzip.pointee.next_out = out.baseAddress?.assumingMemoryBound(to: Bytef.self)
                    gzip.pointee.avail_out = uInt(out.count)
                    return deflate(gzip, Z_FINISH)
                }
            }
            guard status == Z_STREAM_END else {
                throw PackDeliveryError(.internalError, message: "zlib could not compress a member of \(self.path) (status \(status)).")
            }
            try self.emit(self.output[..<Int(gzip.pointee.total_out)])
        }
        self.pending.removeAll(keepingCapacity: true)
        return (offset, self.written - offset)
    }

    /// Cuts the last piece and, for zstd, writes the seek table.
    ///
    /// - Returns: the pack's length and SHA-256.
    func finish() throws(PackDeliveryError) -> PackIndex.Pack {
        try self.cut()
        if case .zstd = self.framing {
            // Skippable frame (magic 0x184D2A5E, length), one entry per frame, then the footer: the number of
            // frames, a descriptor without checksums, and the seekable magic 0x8F92EAB1.
            var table: [UInt8] = []
            func add(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { table.append(contentsOf: $0) } }
            add(0x184D_2A5E)
            add(UInt32(self.frames.count * 8 + 9))
            for frame in self.frames {
                add(frame.compressed)
                add(frame.decompressed)
            }
            add(UInt32(self.frames.count))
            table.append(0)
            add(0x8F92_EAB1)
            try self.emit(table[...])
        }
        return PackIndex.Pack(length: self.written, sha256: self.packHasher.hexDigest())
    }

    private func emit(_ bytes: [UInt8]) throws(PackDeliveryError) { try self.emit(bytes[...]) }

    private func emit(_ bytes: ArraySlice<UInt8>) throws(PackDeliveryError) {
        let failed: Int32? = bytes.withUnsafeBytes { buffer in
            self.packHasher.update(buffer)
            var done = 0
            while done < buffer.count {
                let count = write(self.fd, buffer.baseAddress! + done, buffer.count - done)
                if count < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                done += count
            }
            return nil
        }
        if let failed { throw PackDeliveryError.io("write", path: self.path, errno: failed) }
        self.written += Int64(bytes.count)
    }
}
