import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The keys of preload packs (``PreloadPack``) a queue holds, in memory only: a key is taken from the key server when
/// its pack's install needs it and forgotten once the pack is decrypted. Never written to disk, never logged.
final class PreloadKeyring: Sendable {
    /// A download paused for its key's release (``PauseReason/awaitingRelease``): the key it waits for, and when to ask
    /// for it next.
    struct Wanted: Sendable, Hashable {
        var keyID: String
        var attempt = 0
        var next = Date.distantPast
        var asking = false
    }

    private struct State {
        var keys: [String: PreloadKey] = [:]
        var wanted: [String: Wanted] = [:]
    }

    private let state = Mutex(State())

    /// The longest wait between two requests for a key that is not released yet.
    static let maxDelay: TimeInterval = 8

    func key(_ keyID: String) -> PreloadKey? { self.state.withLock { $0.keys[keyID] } }

    /// Keeps a key the server released (until ``forget(_:)``).
    func keep(_ key: PreloadKey) { self.state.withLock { $0.keys[key.keyID] = key } }

    /// Forgets a key: its pack is decrypted.
    func forget(_ keyID: String) { _ = self.state.withLock { $0.keys.removeValue(forKey: keyID) } }

    /// Notes that `downloadID` waits for `keyID`.
    func want(_ downloadID: String, keyID: String) {
        self.state.withLock { state in
            if state.wanted[downloadID]?.keyID != keyID { state.wanted[downloadID] = Wanted(keyID: keyID) }
        }
    }

    /// Claims a request for the key `downloadID` waits for, when one is due and none runs: the key's id, or nil.
    func claim(_ downloadID: String, now: Date, keyID: () -> String?) -> String? {
        self.state.withLock { state in
            if state.wanted[downloadID] == nil, let id = keyID() { state.wanted[downloadID] = Wanted(keyID: id) }
            guard var wanted = state.wanted[downloadID], !wanted.asking, wanted.next <= now else { return nil }
            wanted.asking = true
            state.wanted[downloadID] = wanted
            return wanted.keyID
        }
    }

    /// The request for `downloadID`'s key was answered without the key: the next waits longer (0.5 s, doubling, at
    /// most ``maxDelay``).
    func refused(_ downloadID: String, now: Date) {
        self.state.withLock { state in
            guard var wanted = state.wanted[downloadID] else { return }
            wanted.asking = false
            wanted.next = now.addingTimeInterval(min(Self.maxDelay, 0.5 * pow(2, Double(min(wanted.attempt, 10)))))
            wanted.attempt += 1
            state.wanted[downloadID] = wanted
        }
    }

    /// Whether some download waits for a key.
    var isWaiting: Bool { self.state.withLock { !$0.wanted.isEmpty } }

    /// `downloadID` waits for nothing any more.
    func settled(_ downloadID: String) { _ = self.state.withLock { $0.wanted.removeValue(forKey: downloadID) } }
}

extension Installer {
    /// The code an install of a preload pack throws while its key is not held: the machine pauses the download
    /// (``PauseReason/awaitingRelease``) and the queue asks the key server for the key. Never seen outside.
    static let awaitingRelease = PackDeliveryError.Code("awaitingRelease")

    /// Where a preload pack's plain bytes are decrypted to for its install (removed once unpacked).
    static func decryptedURL(for archive: URL) -> URL {
        archive.deletingLastPathComponent().appending(path: archive.lastPathComponent + ".decrypted")
    }

    /// For a preload pack (an archive that ends with ``PreloadPack``'s trailer): its plain pack, decrypted beside it
    /// with the key held in memory, which is then forgotten; nil for a plain pack.
    ///
    /// - Throws: ``awaitingRelease`` when the key is not held; `checksumMismatch` when `recheck` finds the archive
    ///   changed; what ``PreloadPack/decrypt(_:to:key:name:)`` throws.
    func decryptedPreload(_ download: Download, archive: URL, recheck: Bool) throws(PackDeliveryError) -> URL? {
        let name = download.contentIdentifier
        guard let layout = try? PreloadPack.layout(of: archive, name: name) else { return nil }
        if recheck, try SHA256Hasher.hexDigest(ofFile: archive) != download.sha256.lowercased() {
            throw PackDeliveryError(
                .checksumMismatch, message: "The downloaded pack \(name) changed on disk after it was verified.",
                hint: "It is fetched again.", subject: archive.path)
        }
        guard let key = self.keyring.key(layout.keyID) else {
            self.keyring.want(download.id, keyID: layout.keyID)
            throw PackDeliveryError(
                Self.awaitingRelease, message: "The preload pack \(PackDeliveryError.printable(name)) waits for its key's release.",
                subject: name)
        }
        let plain = Self.decryptedURL(for: archive)
        try PreloadPack.decrypt(archive, to: plain, key: key, name: name, temporaryName: "." + plain.lastPathComponent + ".part")
        self.keyring.forget(layout.keyID)
        self.keyring.settled(download.id)
        return plain
    }
}
