import CCurl
import Foundation
import Logging
import Synchronization

/// Runs every transfer on one libcurl multi handle, on one thread of its own.
///
/// Easy handles, files and hashers belong to that thread; other threads only post commands to the
/// inbox and wake the thread with `curl_multi_wakeup` (which libcurl documents as thread-safe).
final class TransferEngine: Sendable {
    /// The multi handle, shared only so that other threads can call `curl_multi_wakeup` on it.
    private struct MultiHandle: @unchecked Sendable {
        // Safe: after init, only the transfer thread uses the handle, except curl_multi_wakeup,
        // which libcurl documents as callable from any thread.
        let pointer: UnsafeMutableRawPointer
    }

    private let inbox = Mutex<[TransferCommand]>([])
    private let multi: MultiHandle
    private let finished = Mutex<Bool>(false)
    private let done = DispatchSemaphore(value: 0)
    private let onEvent: @Sendable (TransferEvent) -> Void

    /// - Parameter onEvent: called on the transfer thread for every progress step and outcome.
    init(logger: Logger, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        Curl.globalInit()
        guard let pointer = curl_multi_init() else { fatalError("curl_multi_init failed: out of memory") }
        self.multi = MultiHandle(pointer: pointer)
        self.onEvent = onEvent
        let multi = self.multi
        // The thread holds the engine until shutdown() ends its loop.
        let thread = Thread { [self] in
            let loop = TransferLoop(multi: multi.pointer, logger: logger, onEvent: onEvent)
            loop.run {
                self.inbox.withLock { commands in
                    defer { commands.removeAll() }
                    return commands
                }
            }
            curl_multi_cleanup(multi.pointer)
            self.done.signal()
        }
        thread.name = "PackDelivery.transfer"
        thread.start()
    }

    /// Starts a transfer; its outcome arrives as a `.finished` event (at once, `.stopped`, once the engine is shut down).
    func start(_ request: TransferRequest) {
        let open = self.finished.withLock { finished in
            if !finished { self.inbox.withLock { $0.append(.start(request)) } }
            return !finished
        }
        guard open else {
            (request.report ?? self.onEvent)(.finished(id: request.id, outcome: .stopped(bytesOnDisk: 0)))
            return
        }
        curl_multi_wakeup(self.multi.pointer)
    }

    /// Stops a transfer, keeping its file; reports `.stopped` when it was running.
    func stop(_ id: TransferID) { self.post(.stop(id)) }

    /// Removes a partial file once every command posted before has run: a transfer that was starting when it was
    /// cancelled cannot create the file again after it is gone.
    func discard(_ file: URL) { self.post(.discard(file)) }

    /// Stops every transfer (each reports `.stopped`) and ends the thread; waits for it.
    func shutdown() {
        let first = self.finished.withLock { finished in
            defer { finished = true }
            return !finished
        }
        guard first else { return }
        self.post(.shutdown)
        self.done.wait()
    }

    private func post(_ command: TransferCommand) {
        self.inbox.withLock { $0.append(command) }
        curl_multi_wakeup(self.multi.pointer)
    }
}

private enum TransferCommand: Sendable {
    case start(TransferRequest)
    case stop(TransferID)
    case discard(URL)
    case shutdown
}

/// The transfer thread's side: owns the multi handle's transfers. Not Sendable; lives on one thread.
private final class TransferLoop {
    private let multi: UnsafeMutableRawPointer
    private let logger: Logger
    private let onEvent: @Sendable (TransferEvent) -> Void
    private var transfers: [UnsafeMutableRawPointer: CurlTransfer] = [:]

    init(multi: UnsafeMutableRawPointer, logger: Logger, onEvent: @escaping @Sendable (TransferEvent) -> Void) {
        self.multi = multi
        self.logger = logger
        self.onEvent = onEvent
    }

    func run(takeCommands: () -> [TransferCommand]) {
        while true {
            for command in takeCommands() {
                switch command {
                case .start(let request):
                    self.start(request)
                case .stop(let id):
                    if let (easy, transfer) = self.transfers.first(where: { $0.value.request.id == id }) {
                        self.remove(easy)
                        transfer.stop()
                        transfer.onEvent(.finished(id: id, outcome: .stopped(bytesOnDisk: transfer.offset)))
                    }
                case .discard(let file):
                    unlink(file.path)
                case .shutdown:
                    for (easy, transfer) in self.transfers {
                        self.remove(easy)
                        transfer.stop()
                        transfer.onEvent(.finished(id: transfer.request.id, outcome: .stopped(bytesOnDisk: transfer.offset)))
                    }
                    return
                }
            }
            var running: Int32 = 0
            curl_multi_perform(self.multi, &running)
            var left: Int32 = 0
            while let message = curl_multi_info_read(self.multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle,
                    let transfer = self.transfers[easy]
                else { continue }
                let result = message.pointee.data.result
                self.remove(easy)
                self.complete(transfer, curlCode: result, stalled: false)
            }
            // Transfers paused to keep to the rate limit go on when their pause is over; the poll wakes for the next.
            var now = Date()
            var wait = 1000.0
            for (easy, transfer) in self.transfers {
                guard let until = transfer.pausedUntil else { continue }
                if until <= now {
                    transfer.resume()
                    // CURLPAUSE_CONT, a macro Swift does not import: 0.
                    curl_easy_pause(easy, 0)
                } else {
                    wait = min(wait, until.timeIntervalSince(now) * 1000 + 1)
                }
            }
            // No byte at all (not even a header) for the stall timeout: stop it here; libcurl's low-speed
            // limit only catches transfers that are slow on average. A transfer paused for the rate limit is not silent.
            now = Date()
            for (easy, transfer) in self.transfers
            where transfer.pausedUntil == nil && now.timeIntervalSince(transfer.lastActivity) > transfer.request.options.stallTimeout {
                self.remove(easy)
                self.complete(transfer, curlCode: CURLE_OPERATION_TIMEDOUT, stalled: true)
            }
            curl_multi_poll(self.multi, nil, 0, Int32(max(1, wait)), nil)
        }
    }

    private func complete(_ transfer: CurlTransfer, curlCode: CURLcode, stalled: Bool) {
        let (id, logger, onEvent) = (transfer.request.id, self.logger, transfer.onEvent)
        transfer.complete(curlCode: curlCode, stalled: stalled) { outcome in
            logger.debug("transfer ended", metadata: ["download": "\(id)", "outcome": "\(outcome)"])
            onEvent(.finished(id: id, outcome: outcome))
        }
    }

    private func start(_ request: TransferRequest) {
        let onEvent = request.report ?? self.onEvent
        do {
            let transfer = try CurlTransfer(request: request, onEvent: onEvent)
            let easy = transfer.easy.handle
            self.transfers[easy] = transfer
            let code = curl_multi_add_handle(self.multi, easy)
            guard code == CURLM_OK else {
                self.transfers[easy] = nil
                transfer.cancelHashing()
                let error = PackDeliveryError(
                    .internalError,
                    message:
                        "libcurl could not start the transfer of \(request.url.redacted): \(String(cString: curl_multi_strerror(code))).",
                    subject: request.url.redacted, underlying: .init(.curl, Int(code.rawValue)))
                onEvent(
                    .finished(
                        id: request.id,
                        outcome: .failed(TransferFailure(error: error, retryable: true, countsAlways: true), bytesOnDisk: transfer.offset)))
                return
            }
            self.logger.debug(
                "transfer started",
                metadata: ["download": "\(request.id)", "offset": "\(transfer.offset)", "url": "\(request.url.redacted)"])
        } catch {
            // No transfer, so nothing will feed the unpack that was to follow it.
            request.stream?.discard()
            // A local failure (no descriptor left, a file that cannot be opened) may pass: retried, then failed naming it.
            let failure = TransferFailure(error: error, retryable: error.kind == .io, countsAlways: true)
            onEvent(.finished(id: request.id, outcome: .failed(failure, bytesOnDisk: 0)))
        }
    }

    private func remove(_ easy: UnsafeMutableRawPointer) {
        curl_multi_remove_handle(self.multi, easy)
        self.transfers[easy] = nil
    }
}
