import Foundation
import Synchronization

/// Tells the queue whether the connection is metered (a phone's hotspot, a mobile modem), so that large downloads
/// that are not the user's explicit action wait for an unmetered one (``PauseReason/waitingForUnmeteredNetwork``).
///
/// The queue reads ``isMetered`` about twice a second, on its own serial queue: answer from what you already know,
/// never block. Call the handler given to ``observe(_:)`` when the answer changes, for the queue to act at once.
/// A host that knows its network (a settings switch, its own network monitor) supplies its own; the default is
/// ``NetworkManagerPolicy/system``.
public protocol NetworkPolicy: Sendable {
    /// Whether the connection is metered now.
    var isMetered: Bool { get }
    /// Registers a handler to call with the new answer whenever it changes. Optional: the queue also reads
    /// ``isMetered`` on its own about twice a second.
    ///
    /// - Parameter changed: called with the new answer, from any thread.
    func observe(_ changed: @escaping @Sendable (_ metered: Bool) -> Void)
}

extension NetworkPolicy {
    /// Does nothing: the queue reads ``isMetered`` on its own.
    public func observe(_ changed: @escaping @Sendable (_ metered: Bool) -> Void) {}
}

/// A connection that is always metered, or never (`packs --metered yes|no`, tests, a host's setting).
public struct FixedNetworkPolicy: NetworkPolicy {
    public let isMetered: Bool

    /// - Parameter metered: the answer, for ever.
    public init(metered: Bool) { self.isMetered = metered }
}

/// NetworkManager's `Metered` property, read over D-Bus with `busctl` every 10 seconds off the caller's thread.
///
/// `Metered` is NM_METERED: 1 (yes) and 3 (guessed yes) are metered; 0 (unknown), 2 (no) and 4 (guessed no) are not.
/// Without a system bus, without `busctl`, or without NetworkManager, the connection counts as unmetered (most
/// Linux servers and desktops without NetworkManager). Until the first reading comes back (a few milliseconds), it
/// says unmetered; a download started meanwhile that should wait is paused, its bytes kept, once it does.
public final class NetworkManagerPolicy: NetworkPolicy {
    /// One for the process: every queue that keeps the default shares its readings.
    public static let system = NetworkManagerPolicy()

    private struct State {
        var metered = false
        var started = false
        var handlers: [@Sendable (Bool) -> Void] = []
    }

    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "PackDelivery.NetworkManagerPolicy", qos: .utility)
    private let interval: TimeInterval

    /// - Parameter interval: seconds between readings.
    public init(interval: TimeInterval = 10) {
        self.interval = interval
    }

    public var isMetered: Bool {
        self.startIfNeeded()
        return self.state.withLock { $0.metered }
    }

    public func observe(_ changed: @escaping @Sendable (_ metered: Bool) -> Void) {
        self.state.withLock { $0.handlers.append(changed) }
        self.startIfNeeded()
    }

    private func startIfNeeded() {
        let start = self.state.withLock { state in
            defer { state.started = true }
            return !state.started
        }
        if start { self.queue.async { self.read() } }
    }

    private func read() {
        let metered = Self.readMetered()
        let handlers = self.state.withLock { state -> [@Sendable (Bool) -> Void] in
            guard state.metered != metered else { return [] }
            state.metered = metered
            return state.handlers
        }
        for handler in handlers { handler(metered) }
        self.queue.asyncAfter(deadline: .now() + self.interval) { [weak self] in self?.read() }
    }

    /// NetworkManager's answer, or false when it cannot be asked.
    static func readMetered() -> Bool {
        guard FileManager.default.fileExists(atPath: "/run/dbus/system_bus_socket"),
            let busctl = ["/usr/bin/busctl", "/bin/busctl"].first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else { return false }
        let process = Process()
        process.executableURL = URL(filePath: busctl)
        process.arguments = [
            "--system", "--timeout=2", "get-property", "org.freedesktop.NetworkManager", "/org/freedesktop/NetworkManager",
            "org.freedesktop.NetworkManager", "Metered",
        ]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return false }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { return false }
        return Self.parse(String(decoding: data, as: UTF8.self))
    }

    /// `busctl get-property`'s answer, `u 1`: metered for 1 (yes) and 3 (guessed yes).
    static func parse(_ text: String) -> Bool {
        let fields = text.split(whereSeparator: \.isWhitespace)
        guard fields.count == 2, fields[0] == "u", let value = Int(fields[1]) else { return false }
        return value == 1 || value == 3
    }
}
