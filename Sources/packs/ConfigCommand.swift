import ArgumentParser
import Foundation
import PackDelivery

extension Packs {
    struct Config: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Show or change the settings: cache-budget SIZE|none (this home); max-rate RATE|none, schedule HH:MM-HH:MM|none, quiet-rate RATE|none (this machine).",
            discussion: """
                The cache budget is kept in the home's state database and used by every packs command and library \
                queue on the home (a --cache-budget option, or DownloadQueue.Configuration.cacheBudget, overrides it).

                max-rate, schedule and quiet-rate are the machine's, shared by every home of this user: kept in \
                $XDG_CONFIG_HOME/packs/agent.json (else ~/.config/packs/agent.json). max-rate caps all transfers \
                together (bytes per second, 500K, 20M: powers of 1024); schedule is the local time window when \
                restore, prefetch and background downloads may run (it may cross midnight: 22:00-06:00); quiet-rate \
                caps transfers while quiet is held (packs quiet). Without a key, prints every setting.

                Exit 0; 64 for an unknown setting or a value it does not take; 65 when the settings file is not valid \
                (correct or remove it); 74 when it cannot be read or written.

                Examples:
                  packs config cache-budget 2G
                  packs config max-rate 20M
                  packs config schedule 01:00-07:00
                  packs config quiet-rate none
                  packs config
                """)
        @OptionGroup var global: GlobalOptions
        @Argument(help: "The setting (cache-budget, max-rate, schedule, quiet-rate); without one, prints them all.") var key: String?
        @Argument(help: "Its new value; none removes it; without one, prints it.") var value: String?

        static let keys = ["cache-budget", "max-rate", "schedule", "quiet-rate"]

        func validate() throws {
            guard let key = self.key else { return }
            guard Self.keys.contains(key) else {
                throw ValidationError(
                    "The settings are cache-budget (this home), max-rate, schedule and quiet-rate (this machine).")
            }
            guard let value = self.value, value != "none" else { return }
            switch key {
            case "cache-budget" where ByteCount(argument: value) == nil:
                throw ValidationError("cache-budget takes a size such as 500M or 2G, or none.")
            case "max-rate", "quiet-rate":
                if ByteCount(argument: value) == nil {
                    throw ValidationError("\(key) takes a rate in bytes per second such as 500K or 20M (powers of 1024), or none.")
                }
            case "schedule" where BackgroundWindow(parsing: value) == nil:
                throw ValidationError(
                    "schedule takes a window of local time HH:MM-HH:MM such as 01:00-07:00 (22:00-06:00 crosses midnight; start and end differ), or none."
                )
            default:
                break
            }
        }

        func run() async throws {
            try await mapErrors { () async throws(PackDeliveryError) in
                switch self.key {
                case nil: try self.showAll()
                case "cache-budget": try self.cacheBudget()
                default: try self.machineSetting(self.key!)
                }
            }
        }

        private func cacheBudget() throws(PackDeliveryError) {
            let queue = try openQueue(self.global, lookingConfiguration())
            defer { queue.close() }
            if let value = self.value {
                try queue.setCacheBudget(value == "none" ? nil : ByteCount(argument: value)!.bytes)
            } else if let budget = try queue.homeCacheBudget() {
                printLine(self.global.json ? "{\"cacheBudget\":\(budget)}" : "\(budget)")
            } else {
                printLine(self.global.json ? "{\"cacheBudget\":null}" : "none")
            }
        }

        private func machineSetting(_ key: String) throws(PackDeliveryError) {
            let url = MachineSettings.defaultURL()
            var settings = try MachineSettings.load(from: url)
            guard let value = self.value else {
                let shown = Self.shown(settings)
                let name = Self.jsonName(key)
                printLine(self.global.json ? "{\"\(name)\":\(shown[name]!.json)}" : shown[name]!.text)
                return
            }
            let rate = value == "none" ? nil : ByteCount(argument: value)?.bytes
            switch key {
            case "max-rate": settings.maxRate = rate
            case "quiet-rate": settings.quietRate = rate
            default: settings.schedule = value == "none" ? nil : BackgroundWindow(parsing: value)
            }
            try settings.save(to: url)
        }

        private func showAll() throws(PackDeliveryError) {
            let queue = try openQueue(self.global, lookingConfiguration())
            let budget = try queue.homeCacheBudget()
            queue.close()
            let settings = try MachineSettings.load()
            var shown = Self.shown(settings)
            shown["cacheBudget"] = budget.map { ("\($0)", "\($0)") } ?? ("none", "null")
            if self.global.json {
                let fields = ["cacheBudget", "maxRate", "schedule", "quietRate"].map { "\"\($0)\":\(shown[$0]!.json)" }
                printLine("{" + fields.joined(separator: ",") + "}")
            } else {
                for key in Self.keys { printLine("\(key) \(shown[Self.jsonName(key)]!.text)") }
            }
        }

        /// The machine's settings as printed: text and JSON, by JSON name.
        private static func shown(_ settings: MachineSettings) -> [String: (text: String, json: String)] {
            func rate(_ value: Int64?) -> (String, String) { value.map { ("\($0)", "\($0)") } ?? ("none", "null") }
            return [
                "maxRate": rate(settings.maxRate), "quietRate": rate(settings.quietRate),
                "schedule": settings.schedule.map { ($0.description, "\"\($0.description)\"") } ?? ("none", "null"),
            ]
        }

        /// `max-rate` → `maxRate`.
        private static func jsonName(_ key: String) -> String {
            let parts = key.split(separator: "-")
            return String(parts[0]) + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
        }
    }
}
