import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// The machine's policy applied by the in-process queue: the window for background work and quiet hold restore,
/// prefetch and background downloads as a metered connection does (one mechanism, ``QueueMachine/heldBy(_:)``), at
/// admission and while they transfer, and let them go when they hold no more.
@Suite(.timeLimit(.minutes(3))) struct MachinePolicyQueueTests {
    static func start(_ queue: inout QueueMachine, _ ids: [(String, DownloadPriority)]) -> [String] {
        var actions: [QueueMachine.Action] = []
        for (id, priority) in ids {
            actions += queue.own(MeteredMachineTests.download(id, length: 5000, priority: priority), position: 0)
        }
        return DeliveryPolicyMachineTests.admitAll(&queue, actions)
    }

    @Test func theWindowAndQuietHoldBackgroundWorkAndLetItGo() throws {
        var queue = QueueMachine(concurrency: 8)
        let night = try #require(BackgroundWindow(parsing: "01:00-07:00"))
        let noon = 12 * 3600
        _ = queue.conditionsChanged(.init(secondOfDay: noon), policy: MachinePolicy(window: night, concurrency: 8))
        let started = Self.start(
            &queue, [("asked", .userInitiated), ("purchase", .essential), ("restore", .restore), ("prefetch", .prefetch)])
        #expect(Set(started) == ["asked", "purchase"], "\(started)")
        #expect(queue.download("restore")?.pauseReason == .outsideWindow && queue.download("prefetch")?.pauseReason == .outsideWindow)
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")
        // A resume is not a way around the window: admission holds it again.
        #expect(DeliveryPolicyMachineTests.admitAll(&queue, queue.handle("restore", .resume)).isEmpty)
        #expect(queue.download("restore")?.pauseReason == .outsideWindow)

        // The window opens: both go.
        let opened = DeliveryPolicyMachineTests.admitAll(&queue, queue.conditionsChanged(.init(secondOfDay: 2 * 3600)))
        #expect(Set(opened) == ["restore", "prefetch"], "\(opened)")
        let (prefetch, restore) = (try #require(queue.machine("prefetch")?.token), try #require(queue.machine("restore")?.token))
        _ = queue.handle("prefetch", .transferProgress(token: prefetch, bytes: 1200, validator: "\"v\""))
        _ = queue.handle("restore", .transferProgress(token: restore, bytes: 1200, validator: "\"v\""))

        // Quiet: the prefetch transfer stops, its bytes kept; the restore and the user's downloads go on.
        let quiet = queue.conditionsChanged(.init(secondOfDay: 2 * 3600, quietHeld: true))
        #expect(quiet.contains(.run(id: "prefetch", .stopTransfer(token: prefetch))), "\(quiet)")
        #expect(!quiet.contains(.run(id: "restore", .stopTransfer(token: restore))), "a restore is not held by quiet")
        #expect(queue.download("prefetch")?.pauseReason == .quiet)
        _ = queue.handle("prefetch", .transferFinished(token: prefetch, outcome: .stopped(bytesOnDisk: 1200)))
        #expect(queue.download("prefetch")?.bytesReceived == 1200, "its bytes are kept")

        // Quiet is released outside the window: the prefetch pack now waits for the window, not for quiet.
        let after = DeliveryPolicyMachineTests.admitAll(&queue, queue.conditionsChanged(.init(secondOfDay: noon)))
        #expect(after.isEmpty && queue.download("prefetch")?.pauseReason == .outsideWindow, "\(after)")
        #expect(queue.download("restore")?.state == .paused && queue.download("restore")?.pauseReason == .outsideWindow)
        // The window is lifted from the settings: everything held goes.
        let lifted = DeliveryPolicyMachineTests.admitAll(
            &queue, queue.conditionsChanged(.init(secondOfDay: noon), policy: MachinePolicy(concurrency: 8)))
        #expect(Set(lifted) == ["restore", "prefetch"], "\(lifted)")
        #expect(queue.disagreements().isEmpty, "\(queue.disagreements())")
    }

    /// From the command line: while `packs quiet -- sleep 60` runs, a purchase's essential pack installs and its prefetch
    /// pack sends no byte; `packs resume` of it exits 75 saying quiet is held. Once the holder is gone, it lands. The
    /// window (`packs config schedule`) holds it the same way until it is lifted.
    @Test func quietAndTheWindowHoldAPrefetchPackOfTheCommandLine() throws {
        let machine = try MachineSettingsTests.Machine("policy-queue")
        defer { machine.remove() }
        let site = try DeliveryPolicyTests.site("policy-queue-site", delivery: [DeliveryPolicyTests.prefetch: .prefetch])
        let nginx = try NginxServer(root: site)
        defer { nginx.stop() }
        let manifestURL = nginx.baseURL.appending(path: "manifest.json").absoluteString

        let holder = try MachineSettingsTests.start(machine, ["quiet", "--reason", "playing", "--", "sleep", "60"])
        defer {
            kill(holder.processIdentifier, SIGTERM)
            holder.waitUntilExit()
        }
        #expect(!MachineSettingsTests.waitFor(seconds: 10) { QuietHolds.current(in: machine.quietFolder) }.isEmpty, "waited for the hold")
        let fetch = try machine.packs(["fetch", manifestURL, "com.example.game", "--no-finish"])
        #expect(fetch.status == 0, "the essential pack installs: \(fetch.stderr)")
        #expect(nginx.bodyBytesSent(path: "/a.tar") > 0 && nginx.bodyBytesSent(path: "/b.tar") == 0, "no byte of the prefetch pack")
        let status = try machine.packs(["--json", "status"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let downloads = try #require((object["transactions"] as? [[String: Any]])?.first?["downloads"] as? [[String: Any]])
        let prefetch = try #require(downloads.first { $0["delivery"] as? String == "prefetch" }?["id"] as? String)

        let held = try machine.packs(["resume", prefetch])
        #expect(held.status == 75 && held.stderr.contains("quiet is held"), "\(held.status) \(held.stderr)")
        #expect(nginx.bodyBytesSent(path: "/b.tar") == 0)

        kill(holder.processIdentifier, SIGTERM)
        holder.waitUntilExit()
        // A window that is closed now (it opened two hours ago for one hour).
        let hour = (MachineClock.secondOfDay(Date()) / 3600 + 22) % 24
        let closed = String(format: "%02d:00-%02d:00", hour, (hour + 1) % 24)
        #expect(try machine.packs(["config", "schedule", closed]).status == 0)
        let outside = try machine.packs(["resume", prefetch])
        #expect(outside.status == 75 && outside.stderr.contains("packs config schedule"), "\(outside.status) \(outside.stderr)")
        #expect(nginx.bodyBytesSent(path: "/b.tar") == 0)

        #expect(try machine.packs(["config", "schedule", "none"]).status == 0)
        let landed = try machine.packs(["resume", prefetch])
        #expect(landed.status == 0, "\(landed.stderr)")
        #expect(
            FileManager.default.fileExists(
                atPath: machine.home.appending(path: "Caches/\(DeliveryPolicyTests.prefetch)/Contents/b.bin").path))
    }
}
