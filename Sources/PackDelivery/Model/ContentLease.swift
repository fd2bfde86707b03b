import Foundation

/// Content held in use (NSBundleResourceRequest's `beginAccessingResources`): while a lease is held, by this or
/// another process, its packs are never evicted. It ends with ``DownloadQueue/endAccessing(_:)``, or when the
/// process that took it exits (its row names the process by pid and start time, as a download's owner does).
public struct ContentLease: Sendable, Hashable, Codable {
    /// Identifies the lease in the home's store.
    public var token: String
    /// The products it covers (every pack of each).
    public var productIdentifiers: [String]
    /// The packs it covers, by content identifier.
    public var contentIdentifiers: [String]
}

/// A cached pack that was evicted: known, not installed. Fetching its product again (a purchase, a restore)
/// installs it again.
public struct EvictedContent: Sendable, Hashable, Codable {
    /// The product the pack belongs to.
    public var productIdentifier: String
    /// The pack's identifier.
    public var contentIdentifier: String
    /// The version that was installed.
    public var contentVersion: String
    /// Where it was installed (always ``Destination/caches``: documents are never evicted).
    public var destination: Destination
    /// Bytes of its files that were freed.
    public var byteCount: Int64
    /// When it was evicted.
    public var evictedAt: Date
}
