import NIOCore
import Synchronization

/// Per-connection flow control for response bodies: how many body bytes have been handed to the
/// connection and not yet taken by the socket; and the way to send a file region with `sendfile`.
///
/// Files are sent with ``sendFile(_:offset:count:)``: one `FileRegion` written below the HTTP
/// encoder, which NIO sends with `sendfile(2)` as fast as the socket takes it — no copy into this
/// process, no buffer per connection, and the write completes only when the socket took the last
/// byte (backpressure by construction). nginx does the same (`sendfile on`).
///
/// Why it is needed: Hummingbird writes a response body through NIO's `NIOAsyncChannel` writer,
/// which suspends a writer only once the channel has *reported* itself unwritable. A write made
/// off the event loop is queued to the loop (`eventLoop.execute`), and the report comes back only
/// when the loop gets to it; a producer that reads a file faster than the loop writes can queue
/// the whole file before the first report. Measured: 1,000 clients of a 4 MiB file took 750 MB
/// even with one-chunk reads. Here the file body reserves each chunk before reading it and waits
/// while `window` bytes are in flight; ``ConnectionFlowHandler`` releases them when the socket took them.
final class ConnectionFlow: Sendable {
    private struct State {
        var inFlight = 0
        /// The writer waiting for room (one at most: a connection writes one response at a time).
        var waiter: (continuation: CheckedContinuation<Void, Never>, bytes: Int)?
        var closed = false
    }

    /// The most body bytes in flight on one connection.
    let window: Int
    private let state = Mutex(State())
    /// How a file region reaches the connection, set by ``ConnectionFlowHandler`` (nil: copy instead).
    private let regionWriter = Mutex<(write: RegionWrite, abort: @Sendable () -> Void)?>(nil)

    /// Writes `count` bytes of `fd` from `offset` and calls `done` once the socket took them.
    typealias RegionWrite =
        @Sendable (_ fd: Int32, _ offset: Int, _ count: Int, _ done: @escaping @Sendable (Result<Void, any Error>) -> Void) -> Void

    /// Lets ``sendFile(_:offset:count:)`` write regions through `write` (which hops to the event
    /// loop); `abort` closes the connection when the sending task is cancelled.
    func attachRegionWriter(_ write: @escaping RegionWrite, abort: @escaping @Sendable () -> Void) {
        self.regionWriter.withLock { $0 = (write, abort) }
    }

    /// Sends `count` bytes of the open file `fd` from `offset` with `sendfile`, and returns once the
    /// socket took them all.
    ///
    /// - Returns: `false` when the connection cannot send file regions (nothing was sent).
    /// - Throws: When the connection failed or closed before the region was sent (also when the
    ///   task was cancelled: the connection is closed then).
    func sendFile(_ fd: Int32, offset: Int, count: Int) async throws -> Bool {
        guard let (write, abort) = self.regionWriter.withLock({ $0 }) else { return false }
        // A write to a client that stopped reading completes only when the connection closes: on
        // cancellation (a shutdown past its grace period) close it, or the task would never end.
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                write(fd, offset, count) { continuation.resume(with: $0) }
            }
        } onCancel: {
            abort()
        }
        return true
    }

    init(window: Int) {
        self.window = window
    }

    /// Waits until `bytes` more fit in the window (or nothing is in flight), then counts them.
    func reserve(_ bytes: Int) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = self.state.withLock { state -> Bool in
                if state.closed || state.inFlight == 0 || state.inFlight + bytes <= self.window {
                    state.inFlight += bytes
                    return true
                }
                precondition(state.waiter == nil, "two response bodies waiting on one connection")
                state.waiter = (continuation, bytes)
                return false
            }
            if ready {
                continuation.resume()
            }
        }
    }

    /// The socket took `bytes` body bytes (or the write failed): wakes the waiting writer if it fits now.
    func release(_ bytes: Int) {
        let waiter = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
            // Bodies that reserved nothing (error messages) are released too: never below zero.
            state.inFlight = max(0, state.inFlight - bytes)
            guard let waiter = state.waiter, state.inFlight == 0 || state.inFlight + waiter.bytes <= self.window else { return nil }
            state.waiter = nil
            state.inFlight += waiter.bytes
            return waiter.continuation
        }
        waiter?.resume()
    }

    /// The connection closed: no writer waits any more (its next write fails).
    func close() {
        self.regionWriter.withLock { $0 = nil }
        let waiter = self.state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.closed = true
            defer { state.waiter = nil }
            return state.waiter?.continuation
        }
        waiter?.resume()
    }

    // MARK: - Finding a connection's flow from a request

    private static let registry = Mutex<[ObjectIdentifier: ConnectionFlow]>([:])

    /// Registers `flow` for `channel` until the channel closes.
    static func register(_ flow: ConnectionFlow, for channel: any Channel) {
        let key = ObjectIdentifier(channel)
        self.registry.withLock { $0[key] = flow }
        channel.closeFuture.whenComplete { _ in
            flow.close()
            _ = self.registry.withLock { $0.removeValue(forKey: key) }
        }
    }

    /// The flow registered for `channel`, if any (none in `app.test(.router)`).
    static func registered(for channel: any Channel) -> ConnectionFlow? {
        self.registry.withLock { $0[ObjectIdentifier(channel)] }
    }
}
