import Foundation

extension PreloadPack {
    /// A preload pack's plain bytes, decrypted in order as an unpack reads them from the ciphertext: no plain pack is
    /// written. Each segment's GCM runs over its bytes as they pass, and its tag is checked at its last byte.
    ///
    /// The bytes of a segment are given out before its tag is checked; they go into an install's staging folder, which
    /// a failed tag (`preloadDecryptionFailed`) removes and which is never installed. The ciphertext was held to the
    /// manifest's SHA-256 before, and the key to the pack's key id, so a failed tag means a byte changed on disk since.
    ///
    /// Not thread-safe: one per unpack.
    final class Decryption {
        let layout: Layout
        let name: String
        private let cipher: PreloadCipher
        /// The segment being read, and how many of its bytes are decrypted.
        private var segment = 0
        private var segmentDone: Int64 = 0
        /// The plain bytes decrypted so far: where the next read starts.
        private(set) var position: Int64 = 0

        /// - Throws: `preloadKeyMismatch` when the key is not the pack's.
        init(layout: Layout, key: PreloadKey, name: String) throws(PackDeliveryError) {
            try PreloadPack.check(key, layout: layout, name: name)
            (self.layout, self.name) = (layout, name)
            self.cipher = PreloadCipher(key: key, salt: layout.salt)
        }

        /// The plain pack's first `count` bytes at most (its format's magic), decrypted apart and not authenticated; to
        /// be called before the first ``decrypt(_:)``.
        func peek(_ count: Int, fd: Int32, path: String) throws(PackDeliveryError) -> [UInt8] {
            guard let first = self.layout.segments.first else { return [] }
            var bytes = try PreloadPack.read(fd, at: 0, count: Int(min(Int64(count), first.length)), path: path)
            let done = bytes.withUnsafeMutableBytes { buffer in
                self.cipher.startDecrypting(offset: 0, length: first.length) && self.cipher.continueDecrypting(buffer)
            }
            guard done else { throw PreloadPack.tampered(self.name, offset: 0) }
            return bytes
        }

        /// Decrypts in place the ciphertext read at ``position``, and moves past it.
        ///
        /// - Throws: `preloadDecryptionFailed` naming the pack when a segment ends that does not match its tag, or when
        ///   the bytes go past the plain pack.
        func decrypt(_ buffer: UnsafeMutableRawBufferPointer) throws(PackDeliveryError) {
            var start = 0
            while start < buffer.count {
                guard self.segment < self.layout.segments.count else { throw PreloadPack.tampered(self.name, offset: self.position) }
                let current = self.layout.segments[self.segment]
                if self.segmentDone == 0, !self.cipher.startDecrypting(offset: current.offset, length: current.length) {
                    throw PreloadPack.tampered(self.name, offset: current.offset)
                }
                let step = Int(min(Int64(buffer.count - start), current.length - self.segmentDone))
                guard self.cipher.continueDecrypting(UnsafeMutableRawBufferPointer(rebasing: buffer[start..<start + step])) else {
                    throw PreloadPack.tampered(self.name, offset: current.offset)
                }
                (start, self.segmentDone, self.position) = (start + step, self.segmentDone + Int64(step), self.position + Int64(step))
                if self.segmentDone == current.length {
                    guard self.cipher.finishDecrypting(tag: current.tag) else {
                        throw PreloadPack.tampered(self.name, offset: current.offset)
                    }
                    (self.segment, self.segmentDone) = (self.segment + 1, 0)
                }
            }
        }
    }
}
