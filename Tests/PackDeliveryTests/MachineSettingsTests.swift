import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// The machine's settings (`packs config max-rate|schedule|quiet-rate`, `MachineSettings`) and quiet holds
/// (`packs quiet`, `QuietHold`), as a user sees them: files, exit codes, output.
@Suite(.timeLimit(.minutes(2))) struct MachineSettingsTests {
    /// A home, a config folder and a runtime folder of their own, removed afterwards.
    struct Machine {
        let root: URL
        var home: URL { self.root.appending(path: "home") }
        var config: URL { self.root.appending(path: "config") }
        var runtime: URL { self.root.appending(path: "runtime") }
        var settingsFile: URL { self.config.appending(path: "packs/agent.json") }
        var quietFolder: URL { self.runtime.appending(path: "packs/quiet") }
        var environment: [String: String] { ["XDG_CONFIG_HOME": self.config.path, "XDG_RUNTIME_DIR": self.runtime.path] }

        init(_ label: String) throws {
            self.root = try Fixtures.temporaryDirectory(label)
            try FileManager.default.createDirectory(at: self.runtime, withIntermediateDirectories: true)
        }

        func packs(_ arguments: [String]) throws -> CLI.Result {
            try CLI.run(home: self.home, arguments, timeout: 30, environment: self.environment)
        }

        func remove() { try? FileManager.default.removeItem(at: self.root) }
    }

    @Test func configStoresTheMachineSettingsInOneFileBesideTheHomeSettings() throws {
        let machine = try Machine("machine-config")
        defer { machine.remove() }
        #expect(try machine.packs(["config", "max-rate", "20M"]).status == 0)
        #expect(try machine.packs(["config", "schedule", "22:00-06:00"]).status == 0)
        #expect(try machine.packs(["config", "quiet-rate", "1M"]).status == 0)
        #expect(try machine.packs(["config", "cache-budget", "2G"]).status == 0)
        let stored = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: machine.settingsFile)) as? [String: Any])
        #expect(stored["maxRate"] as? Int == 20 << 20 && stored["quietRate"] as? Int == 1 << 20)
        #expect(stored["schedule"] as? String == "22:00-06:00" && stored["cacheBudget"] == nil, "\(stored)")
        #expect(try machine.packs(["config", "max-rate"]).stdout == "\(20 << 20)\n")
        #expect(try machine.packs(["--json", "config", "schedule"]).stdout == "{\"schedule\":\"22:00-06:00\"}\n")
        let all = try machine.packs(["config"])
        #expect(all.status == 0)
        #expect(
            all.stdout == "cache-budget \(2 << 30)\nmax-rate \(20 << 20)\nschedule 22:00-06:00\nquiet-rate \(1 << 20)\n", "\(all.stdout)")
        #expect(try machine.packs(["config", "max-rate", "none"]).status == 0)
        #expect(
            try machine.packs(["--json", "config"]).stdout
                == "{\"cacheBudget\":\(2 << 30),\"maxRate\":null,\"schedule\":\"22:00-06:00\",\"quietRate\":\(1 << 20)}\n")
        let settings = try MachineSettings.load(from: machine.settingsFile)
        #expect(settings == MachineSettings(schedule: BackgroundWindow(parsing: "22:00-06:00"), quietRate: 1 << 20))
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: machine.settingsFile.deletingLastPathComponent().path)
        #expect(leftovers == ["agent.json"], "no temporary file left: \(leftovers)")
    }

    @Test func badValuesAreUsageErrorsSayingWhatIsAccepted() throws {
        let machine = try Machine("machine-config-bad")
        defer { machine.remove() }
        let cases: [([String], String)] = [
            (["config", "max-rate", "fast"], "max-rate takes a rate in bytes per second such as 500K or 20M"),
            (["config", "quiet-rate", "0"], "quiet-rate takes a rate"),
            (["config", "schedule", "7-9"], "schedule takes a window of local time HH:MM-HH:MM"),
            (["config", "schedule", "01:00-01:00"], "start and end differ"),
            (["config", "volume", "11"], "The settings are cache-budget (this home), max-rate, schedule and quiet-rate"),
        ]
        for (arguments, message) in cases {
            let result = try machine.packs(arguments)
            #expect(result.status == 64 && result.stderr.contains(message), "\(arguments): \(result.status) \(result.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: machine.settingsFile.path), "nothing was written")
    }

    @Test func aBadSettingsFileIsAnErrorWithACodeAndIsNotReplaced() throws {
        let machine = try Machine("machine-config-file")
        defer { machine.remove() }
        try FileManager.default.createDirectory(at: machine.settingsFile.deletingLastPathComponent(), withIntermediateDirectories: true)
        for bad in ["{\"maxRate\": \"fast\"}", "{\"maxRate\": -5}", "{\"schedule\": \"noon\"}", "{\"volume\": 11}", "[1]", "not json"] {
            try Data(bad.utf8).write(to: machine.settingsFile)
            #expect(throws: PackDeliveryError.self, "\(bad)") { try MachineSettings.load(from: machine.settingsFile) }
            do {
                _ = try MachineSettings.load(from: machine.settingsFile)
            } catch {
                #expect(error.code == .invalidSettings && error.subject == machine.settingsFile.path, "\(bad): \(error)")
            }
            let result = try machine.packs(["config", "max-rate", "20M"])
            #expect(result.status == 65 && result.stderr.contains(machine.settingsFile.path), "\(bad): \(result.stderr)")
            #expect(try String(contentsOf: machine.settingsFile, encoding: .utf8) == bad, "the file is left as it was")
        }
        try FileManager.default.removeItem(at: machine.settingsFile)
        #expect(try MachineSettings.load(from: machine.settingsFile) == MachineSettings(), "no file: the defaults")
    }

    @Test func packsQuietHoldsQuietWhileItsCommandRunsAndReturnsItsStatus() throws {
        let machine = try Machine("quiet-hold")
        defer { machine.remove() }
        let process = try Self.start(machine, ["quiet", "--reason", "playing Forest", "--", "sleep", "2"])
        let held = Self.waitFor(seconds: 10) { QuietHolds.current(in: machine.quietFolder) }
        #expect(held.map(\.reason) == ["playing Forest"] && held.first?.pid == process.processIdentifier, "waited for the hold: \(held)")
        let listed = try machine.packs(["--json", "quiet"])
        #expect(listed.stdout.contains("\"reason\":\"playing Forest\""), "\(listed.stdout)")
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(QuietHolds.current(in: machine.quietFolder).isEmpty, "released once the command exited")
        #expect(try machine.packs(["quiet"]).stdout == "not quiet\n")
        #expect(try machine.packs(["quiet", "--", "sh", "-c", "exit 3"]).status == 3, "the command's exit status")
        #expect(try machine.packs(["quiet", "--", "sh", "-c", "kill -TERM $$"]).status == 128 + SIGTERM)
        let missing = try machine.packs(["quiet", "--", "no-such-command-44"])
        #expect(missing.status == 127 && missing.stderr.contains("no-such-command-44"), "\(missing.stderr)")
        #expect(QuietHolds.current(in: machine.quietFolder).isEmpty)
    }

    @Test func aHolderSIGTERMedPassesItOnAndOneSIGKILLedIsNotCounted() throws {
        let machine = try Machine("quiet-kill")
        defer { machine.remove() }
        let term = try Self.start(machine, ["quiet", "--", "sleep", "30"])
        #expect(Self.waitFor(seconds: 10) { QuietHolds.current(in: machine.quietFolder) }.count == 1, "waited for the hold")
        kill(term.processIdentifier, SIGTERM)
        term.waitUntilExit()
        #expect(term.terminationStatus == 128 + SIGTERM, "sleep got the SIGTERM and packs returned its status")
        #expect(QuietHolds.current(in: machine.quietFolder).isEmpty)

        let childPID = machine.root.appending(path: "child.pid")
        let killed = try Self.start(machine, ["quiet", "--", "sh", "-c", "echo $$ > '\(childPID.path)'; exec sleep 30"])
        defer {
            if let pid = try? String(contentsOf: childPID, encoding: .utf8),
                let number = Int32(pid.trimmingCharacters(in: .whitespacesAndNewlines))
            {
                kill(number, SIGKILL)
            }
            killed.waitUntilExit()
        }
        #expect(Self.waitFor(seconds: 10) { QuietHolds.current(in: machine.quietFolder) }.count == 1, "waited for the hold")
        kill(killed.processIdentifier, SIGKILL)
        // Not reaped yet (its command still runs): a zombie holds nothing either.
        let deadline = Date().addingTimeInterval(10)
        while !QuietHolds.current(in: machine.quietFolder).isEmpty, Date() < deadline { usleep(20_000) }
        #expect(QuietHolds.current(in: machine.quietFolder).isEmpty, "a dead holder's hold is not counted (waited 10 s)")
        let files = (try? FileManager.default.contentsOfDirectory(atPath: machine.quietFolder.path)) ?? []
        #expect(files.isEmpty, "and its file was removed: \(files)")
    }

    @Test func aLibraryHoldEndsWhenReleasedOrDeinitialized() throws {
        let machine = try Machine("quiet-library")
        defer { machine.remove() }
        var hold: QuietHold? = try QuietHold(reason: "call", folder: machine.quietFolder)
        let second = try QuietHold(reason: "game", folder: machine.quietFolder)
        #expect(QuietHolds.current(in: machine.quietFolder).map(\.reason) == ["call", "game"])
        hold = nil
        #expect(QuietHolds.current(in: machine.quietFolder).map(\.reason) == ["game"], "deinit released it")
        second.release()
        second.release()
        #expect(QuietHolds.current(in: machine.quietFolder).isEmpty)
        #expect(hold == nil)
        var info = stat()
        #expect(lstat(machine.quietFolder.path, &info) == 0 && info.st_mode & 0o777 == 0o700, "a private folder")
    }

    /// Starts `packs ARGS…` with the machine's environment, without waiting.
    static func start(_ machine: Machine, _ arguments: [String]) throws -> Process {
        let process = Process()
        process.executableURL = URL(filePath: CLI.binary)
        process.arguments = ["--home", machine.home.path] + arguments
        process.environment = ProcessInfo.processInfo.environment.merging(machine.environment) { $1 }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }

    /// Polls until the value is not empty, or the time is up (then returns it empty, and the caller's expectation says
    /// what it waited for).
    static func waitFor<T: Collection>(seconds: Double, _ value: () -> T) -> T {
        let deadline = Date().addingTimeInterval(seconds)
        var current = value()
        while current.isEmpty, Date() < deadline {
            usleep(20_000)
            current = value()
        }
        return current
    }
}
