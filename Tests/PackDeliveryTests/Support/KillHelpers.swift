import Foundation
import PackTestSupport
import Synchronization

/// Runs `packs --json …`, calling `action` (once) with the process id as soon as an event matches.
/// - Returns: the exit status and whether an event matched.
@discardableResult
func runWatching(
    home: URL, _ arguments: [String], deadline: TimeInterval = 90, environment: [String: String] = [:],
    when predicate: @escaping @Sendable ([String: Any]) -> Bool,
    do action: @escaping @Sendable (Int32) -> Void
) throws -> (status: Int32, matched: Bool) {
    let process = Process()
    process.executableURL = URL(filePath: CLI.binary)
    process.arguments = ["--home", home.path, "--json"] + arguments
    if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = FileHandle.nullDevice
    try process.run()
    let matched = Atomic<Bool>(false)
    let pid = process.processIdentifier
    let reader = Thread {
        var buffer = Data()
        let handle = pipe.fileHandleForReading
        while true {
            let chunk = handle.availableData
            if chunk.isEmpty { return }
            buffer.append(chunk)
            while let newline = buffer.firstIndex(of: 10) {
                let line = buffer[buffer.startIndex..<newline]
                buffer = Data(buffer[(newline + 1)...])
                if let object = (try? JSONSerialization.jsonObject(with: line)) as? [String: Any], predicate(object) {
                    if !matched.exchange(true, ordering: .relaxed) { action(pid) }
                }
            }
        }
    }
    reader.start()
    let start = Date()
    while process.isRunning && Date().timeIntervalSince(start) < deadline { usleep(5_000) }
    if process.isRunning { kill(pid, SIGKILL) }
    process.waitUntilExit()
    return (process.terminationStatus, matched.load(ordering: .relaxed))
}

/// Runs `packs --json …` and SIGKILLs it as soon as an event matches.
/// - Returns: whether the kill happened on a matching event.
@discardableResult
func runAndKill(
    home: URL, _ arguments: [String], deadline: TimeInterval = 60, environment: [String: String] = [:],
    when predicate: @escaping @Sendable ([String: Any]) -> Bool
) throws -> Bool {
    try runWatching(home: home, arguments, deadline: deadline, environment: environment, when: predicate) { pid in kill(pid, SIGKILL) }
        .matched
}

/// Waits until a file grows to at least `bytes`, then returns true; false after `timeout`.
func waitForFile(_ url: URL, atLeast bytes: Int64, timeout: TimeInterval = 30) -> Bool {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if let size = try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int64, size >= bytes { return true }
        usleep(10_000)
    }
    return false
}

/// The one partial archive in a home (there is one download in flight in these tests).
func partialArchive(_ home: URL) -> URL? {
    for root in ["Caches", "Documents"] {
        let folder = home.appending(path: "\(root)/.packdelivery/downloads")
        if let name = (try? FileManager.default.contentsOfDirectory(atPath: folder.path))?.first(where: { $0.hasSuffix(".pack") }) {
            return folder.appending(path: name)
        }
    }
    return nil
}
