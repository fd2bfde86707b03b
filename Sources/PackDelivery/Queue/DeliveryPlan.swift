import Foundation

/// What the driver learned of a download's surroundings when the queue admitted it: the facts its delivery is
/// decided from. The driver gathers them (a `stat`, a read of the store, the source ranking) and hands them to
/// ``QueueMachine/admit(_:facts:available:path:now:)``; the machines decide from them, and never read the disk or
/// the store themselves.
struct DeliveryFacts: Sendable, Hashable {
    /// Bytes of the whole pack already in the download's partial archive.
    var archiveBytes: Int64 = 0
    /// The version of this pack installed in the download's destination for its product, if any: a delta update
    /// starts from it.
    var installed: InstallRecord?
    /// Whether the home updates packs by delta and installs indexed tar packs chunk by chunk
    /// (``DownloadQueue/Configuration/deltaUpdates``).
    var deltaUpdates = true
    /// The source the home's measurements pick for the download's first bytes (``SourceRanking/pick(_:inFlight:now:)``),
    /// for a pack with several; nil when there is no pick.
    var preferredSource: URL?

    /// Facts that let nothing but the whole pack be fetched from the download's own URL (a machine started with no
    /// facts, as the machine tests start one).
    static let none = DeliveryFacts(deltaUpdates: false)
}

/// How a download's pack is delivered: decided by ``decide(for:facts:deltaRefused:fromZero:)`` from the
/// ``DeliveryFacts``, carried in each ``TransferOrder``, and run by the driver without a decision of its own.
enum DeliveryPlan: Sendable, Hashable {
    /// The whole pack into the partial archive, resumed from its bytes (or from zero), unpacked as it arrives
    /// (`CurlTransfer`, `StreamedUnpack`, `IndexFetch` beside it).
    case wholePack(fromZero: Bool)
    /// An update from the installed version: the entries or chunks that changed, fetched by range requests
    /// (`DeltaTransfer` with the installed version's files).
    case delta(from: InstallRecord)
    /// The first install of an indexed tar or tar.zst pack, each chunk written once into the new version's files
    /// and no archive kept (`DeltaTransfer` from nothing, `ChunkAssembly+FirstInstall`).
    case writeOnce

    /// The plan for `download` now.
    ///
    /// - Parameters:
    ///   - download: the download at the source it fetches from (its index is the one of that source).
    ///   - facts: what the driver gathered when it was admitted.
    ///   - deltaRefused: a delta update of this download was refused (``TransferOutcome/deltaRefused(_:)``): the
    ///     whole pack is fetched from then on.
    ///   - fromZero: the partial bytes are worthless (a resumed file that failed its checksum, another source after
    ///     wrong bytes): the whole pack, from its first byte.
    static func decide(for download: Download, facts: DeliveryFacts, deltaRefused: Bool, fromZero: Bool) -> DeliveryPlan {
        // Bytes of the whole pack on disk are kept and resumed; a delta update is never mixed with them.
        guard !fromZero, !deltaRefused, facts.deltaUpdates, facts.archiveBytes == 0, download.index != nil else {
            return .wholePack(fromZero: fromZero)
        }
        if let installed = facts.installed { return .delta(from: installed) }
        return download.writesOnce ? .writeOnce : .wholePack(fromZero: false)
    }

    /// A delta update that would fetch more than this share of the pack fetches the whole pack instead, in one request:
    /// past it, the range requests cost more than the bytes they save.
    static let maxDeltaShare = 0.6

    /// Whether a delta update, now that it knows what it would fetch (``TransferEvent/deltaPlanned(id:delta:)``), goes on:
    /// nil, or why the whole pack is fetched instead. The machine answers the transfer with it
    /// (``DownloadMachine/Action/answerDeltaPlan(token:refusal:)``); the transfer decides nothing.
    ///
    /// - Parameters:
    ///   - delta: what the update fetches and reuses.
    ///   - packLength: the whole pack's length, from the manifest.
    static func refusal(of delta: Download.Delta, packLength: Int64) -> Download.DeltaFallback? {
        guard Double(delta.bytesToFetch) > Self.maxDeltaShare * Double(packLength) else { return nil }
        return Download.DeltaFallback(
            .tooMuchChanged,
            "the update would fetch \(delta.bytesToFetch) of the pack's \(packLength) bytes (more than \(Int(Self.maxDeltaShare * 100))%)")
    }

    /// The plan writes the new version's files directly and keeps no archive: the disk needs the unpacked bytes only.
    var writesOnce: Bool {
        if case .writeOnce = self { return true }
        return false
    }
}

/// Everything the driver needs to start a download's transfer: what ``DownloadMachine/Action/startTransfer(_:)``
/// carries.
struct TransferOrder: Sendable, Hashable {
    /// The token of the work: events of this transfer carry it.
    var token: Int
    /// How the pack is delivered.
    var plan: DeliveryPlan
    /// The source the transfer fetches from.
    var source: URL
    /// The validator (ETag or Last-Modified) of the partial bytes at that source, for `If-Range`.
    var validator: String?
    /// The source refused the credentials last time: fresh ones are asked for (``DownloadMachine/credentialsRefused``).
    var credentialsRefused: Bool
}
