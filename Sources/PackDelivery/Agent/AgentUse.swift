import Foundation

/// Where a queue's downloads run (``DownloadQueue/Configuration/agent``).
///
/// With the agent, the queue records purchases and hands their downloads to `packs agent`, the machine's background
/// service: they go on when the app exits, under the machine's one rate cap, window and priority order, and the
/// queue's observers and event streams get the agent's events as it pushes them. Everything else (transactions,
/// finishing, content, pausing) works as in this process. When the agent goes away, the queue takes its downloads
/// back and runs them itself (``automatic``), from the bytes on disk.
///
/// New cases may be added in a minor version: switch with a `default` or `@unknown default`.
public enum AgentUse: String, Sendable, Hashable, Codable, CaseIterable {
    /// The agent when its socket answers at open; else this process, as before (logged once).
    case automatic
    /// Only the agent: opening the queue fails with ``PackDeliveryError/Code/agentUnavailable`` when none answers.
    case required
    /// This process, always.
    case never

    /// `$XDG_RUNTIME_DIR/packs/agent.sock`, where `packs agent` listens; nil when `XDG_RUNTIME_DIR` is not an
    /// absolute path.
    /// - Parameter environment: where to read `XDG_RUNTIME_DIR`.
    public static func defaultSocket(environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        guard let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") else { return nil }
        return URL(filePath: runtime).appending(path: "packs/agent.sock").path
    }
}
