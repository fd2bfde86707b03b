import Foundation

/// A change the queue reports, in order, to observers and to ``DownloadQueue/events()``.
///
/// New cases may be added in a minor version: a `switch` over events needs a `default` (or `@unknown default`).
///
/// Indirect, so that an event takes a pointer, not the size of a ``Download``, in a stream's buffer: a catalog of
/// 10,000 transactions, recorded before the stream is read, buffers an event for each.
public indirect enum DownloadQueueEvent: Sendable, Hashable {
    /// A transaction was added, delivered again on launch, or finished.
    case transactionUpdated(Transaction)
    /// A download changed state, phase or progress.
    case downloadUpdated(Download)
    /// Transactions were finished and leave the queue (StoreKit's `removedTransactions`).
    case transactionsRemoved([Transaction])
    /// A restore (``DownloadQueue/restoreCompletedTransactions(productIDs:)-6euxm``) delivered everything it started
    /// (`paymentQueueRestoreCompletedTransactionsFinished`); its transactions, finishable.
    case restoreCompleted([Transaction])
    /// A restore could not complete: a download of it failed or paused (`restoreCompletedTransactionsFailedWithError`).
    case restoreFailed(PackDeliveryError)
    /// A cached pack was evicted to keep the cache budget or to make room (see ``DownloadQueue/evictCaches(downTo:dryRun:)``).
    case evicted(EvictedContent)
    /// A download that waits (or is paused) was given another priority (``DownloadQueue/setPriority(_:_:)``, or
    /// ``DownloadQueue/ensureAvailable(contentIDs:from:priority:)`` raising it), with its new ``Download/priority``.
    /// Reported after the ``downloadUpdated(_:)`` of the same change.
    case priorityChanged(Download)
}
