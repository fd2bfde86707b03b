import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The keys of preload packs (``PreloadPack``) a queue holds, in memory only, and the downloads that wait for one: a key
/// is taken from the key server when its pack's install needs it and forgotten once the pack is decrypted, or its
/// download is cancelled or settled. Never written to disk, never logged.
final class PreloadKeyring: Sendable {
    /// A download paused for its key's release (``PauseReason/awaitingRelease``): the key it waits for, when it is
    /// released, and when to ask for it next.
    struct Wanted: Sendable, Hashable {
        var keyID: String
        /// The manifest's release date; nil (a download recorded before release dates were) asks at once.
        var releases: Date?
        var attempt = 0
        /// The next request's earliest time, on the real clock (backoff and `Retry-After`).
        var next = Date.distantPast
        var asking = false
        /// Refused for good (``PackDeliveryError/Code/preloadKeyRefused``): not asked again until wanted again.
        var refused = false
    }

    private struct State {
        var keys: [String: PreloadKey] = [:]
        var wanted: [String: Wanted] = [:]
    }

    private let state = Mutex(State())

    /// The first wait after a key request that did not get the key; it doubles at each one, up to ``maxDelay``.
    static let firstDelay: TimeInterval = 1
    /// The longest wait between two requests for a key, unless the server's `Retry-After` asks for longer.
    static let maxDelay: TimeInterval = 300
    /// The longest `Retry-After` honoured (a server's clock far behind the release must not stop asking for days).
    static let maxRetryAfter: TimeInterval = 86_400

    func key(_ keyID: String) -> PreloadKey? { self.state.withLock { $0.keys[keyID] } }

    /// The ids of the keys held (for tests: a key never outlives its install).
    var heldKeyIDs: [String] { self.state.withLock { $0.keys.keys.sorted() } }

    /// Keeps a key the server released for `downloadID`, while that download still waits for it (until its install
    /// decrypts, or ``drop(_:)``); a key for a download that no longer waits is not kept. Returns whether it was kept.
    @discardableResult
    func keep(_ key: PreloadKey, for downloadID: String) -> Bool {
        self.state.withLock { state in
            guard state.wanted[downloadID]?.keyID == key.keyID else { return false }
            state.keys[key.keyID] = key
            state.wanted[downloadID]?.asking = false
            return true
        }
    }

    /// Forgets a key: its pack is decrypted (or could not be).
    func forget(_ keyID: String) { _ = self.state.withLock { $0.keys.removeValue(forKey: keyID) } }

    /// Notes that `downloadID` waits for `keyID`, released at `releases` (a download refused for good is asked for again).
    func want(_ downloadID: String, keyID: String, releases: Date?) {
        self.state.withLock { state in
            if let wanted = state.wanted[downloadID], wanted.keyID == keyID, !wanted.refused { return }
            state.wanted[downloadID] = Wanted(keyID: keyID, releases: releases)
        }
    }

    /// Claims a request for each key due: its download waits for it, none runs for it, its release date has come by
    /// `clock` and its backoff has passed by `now`. Visits only the downloads that wait for a key.
    func claimDue(now: Date, clock: Date) -> [(downloadID: String, keyID: String)] {
        self.state.withLock { state in
            var due: [(downloadID: String, keyID: String)] = []
            for (id, wanted) in state.wanted
            where !wanted.asking && !wanted.refused && state.keys[wanted.keyID] == nil && wanted.next <= now
                && (wanted.releases ?? .distantPast) <= clock
            {
                state.wanted[id]?.asking = true
                due.append((id, wanted.keyID))
            }
            return due
        }
    }

    /// The request for `downloadID`'s key was answered without the key, for now: the next waits `retryAfter` when the
    /// server gave one (at most ``maxRetryAfter``), and at least the backoff (``firstDelay``, doubling, at most
    /// ``maxDelay``).
    func notYet(_ downloadID: String, retryAfter: TimeInterval?, now: Date) {
        self.state.withLock { state in
            guard var wanted = state.wanted[downloadID] else { return }
            let backoff = min(Self.maxDelay, Self.firstDelay * pow(2, Double(min(wanted.attempt, 16))))
            wanted.asking = false
            wanted.next = now.addingTimeInterval(max(backoff, min(retryAfter ?? 0, Self.maxRetryAfter)))
            wanted.attempt += 1
            state.wanted[downloadID] = wanted
        }
    }

    /// A request for `downloadID`'s key was claimed but not made (its download is not paused for it yet): claimable
    /// again at the next tick.
    func unclaim(_ downloadID: String) { self.state.withLock { $0.wanted[downloadID]?.asking = false } }

    /// The request for `downloadID`'s key was refused for good: not asked again until ``want(_:keyID:releases:)``.
    func refused(_ downloadID: String) {
        self.state.withLock { state in
            state.wanted[downloadID]?.asking = false
            state.wanted[downloadID]?.refused = true
        }
    }

    /// Whether some download waits for a key that may be asked for.
    var isWaiting: Bool { self.state.withLock { state in state.wanted.values.contains { !$0.refused && state.keys[$0.keyID] == nil } } }

    /// `downloadID` waits for nothing any more (cancelled, finished, failed, or paused by someone): it is forgotten, and
    /// so is the key it waited for, unless another download waits for the same key.
    func drop(_ downloadID: String) {
        self.state.withLock { state in
            guard let wanted = state.wanted.removeValue(forKey: downloadID) else { return }
            if !state.wanted.values.contains(where: { $0.keyID == wanted.keyID }) { state.keys[wanted.keyID] = nil }
        }
    }
}

extension Installer {
    /// The code an install of a preload pack throws while its key is not held: the machine pauses the download
    /// (``PauseReason/awaitingRelease``) and the queue asks the key server for the key. Never seen outside.
    static let awaitingRelease = PackDeliveryError.Code("awaitingRelease")

    /// Where a zip preload pack's plain bytes are decrypted to for its install (removed once unpacked).
    static func decryptedURL(for archive: URL) -> URL {
        archive.deletingLastPathComponent().appending(path: archive.lastPathComponent + ".decrypted")
    }

    /// How a preload pack's install reads its plain bytes.
    enum PreloadSource {
        /// Decrypted as they are unpacked, straight from the ciphertext: a tar, compressed or not.
        case decrypting(PreloadPack.Decryption)
        /// Decrypted to this file first: a zip, whose central directory is read before its entries.
        case decrypted(URL)
    }

    /// For a preload pack (an archive that ends with ``PreloadPack``'s trailer): how its install reads the plain bytes,
    /// with the key held in memory, which the keyring then forgets; nil for a plain pack.
    ///
    /// - Throws: ``awaitingRelease`` when the key is not held; `checksumMismatch` when `recheck` finds the archive
    ///   changed; `preloadKeyMismatch` when the key is not the pack's; for a zip, `insufficientStorage` (bytes needed
    ///   and available) when the plain pack and its files do not fit, and what ``PreloadPack/decrypt(_:to:key:name:)``
    ///   throws.
    func preload(_ download: Download, archive: URL, recheck: Bool) throws(PackDeliveryError) -> PreloadSource? {
        let name = download.contentIdentifier
        guard let layout = try? PreloadPack.layout(of: archive, name: name) else { return nil }
        if recheck, try SHA256Hasher.hexDigest(ofFile: archive) != download.sha256.lowercased() {
            throw PackDeliveryError(
                .checksumMismatch, message: "The downloaded pack \(name) changed on disk after it was verified.",
                hint: "It is fetched again.", subject: archive.path)
        }
        guard let key = self.keyring.key(layout.keyID) else {
            // It may wait days for its release: the ciphertext is made durable before the download is recorded waiting
            // for it, so that a power cut meanwhile does not lose what was fetched.
            try Durability.syncFile(archive)
            try Durability.syncFolder(archive.deletingLastPathComponent())
            self.keyring.want(download.id, keyID: layout.keyID, releases: download.releaseDate)
            self.hook?(.awaitingKey)
            throw PackDeliveryError(
                Self.awaitingRelease, message: "The preload pack \(PackDeliveryError.printable(name)) waits for its key's release.",
                subject: name)
        }
        // Taken once, whatever the install's outcome: a wrong key or a failure asks for it again if ever needed. The
        // decryption keeps its own copy until the unpack ends.
        defer {
            self.keyring.drop(download.id)
            self.keyring.forget(layout.keyID)
        }
        let decryption = try PreloadPack.Decryption(layout: layout, key: key, name: name)
        let fd = open(archive.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .io("open", path: archive.path, errno: errno) }
        let magic: [UInt8]
        do { magic = try decryption.peek(4, fd: fd, path: archive.path) } catch {
            close(fd)
            throw error
        }
        close(fd)
        guard magic.starts(with: Array("PK".utf8)) else { return .decrypting(decryption) }
        let plain = Self.decryptedURL(for: archive)
        // Room for the plain pack and its unpacked files before a byte of plaintext is written: on a full disk the
        // download pauses for space (``PauseReason/insufficientStorage``), its ciphertext kept, as any install's does.
        try SpaceCheck.require(
            download: layout.plainLength, unpacked: download.unpackedLength ?? layout.plainLength, at: plain.deletingLastPathComponent())
        // Not synced: it is unpacked at once and removed, and one a crash leaves is removed at the next launch (never
        // used), so its bytes need not reach the disk (its pages go with the file, most of them unwritten).
        try PreloadPack.decrypt(
            archive, to: plain, key: key, name: name, temporaryName: "." + plain.lastPathComponent + ".part", durable: false)
        return .decrypted(plain)
    }
}
