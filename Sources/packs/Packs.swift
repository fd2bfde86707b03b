import ArgumentParser
import CLinux
import Foundation
import Logging
@_spi(Testing) import PackDelivery
import Synchronization

@main
struct Packs: AsyncParsableCommand {
    static let version = PackDeliveryVersion.current

    static let configuration = CommandConfiguration(
        commandName: "packs",
        abstract: "Deliver purchased content packs: download, verify, unpack and install them.",
        discussion: """
            \(ExitStatus.helpParagraph)

            Example:
              packs --home ~/packs fetch https://cdn.example.com/manifest.json com.example.forest
            """,
        version: Packs.version,
        subcommands: [
            Fetch.self, Resume.self, Status.self, Pause.self, Priority.self, Cancel.self, Finish.self, Content.self, Verify.self,
            Remove.self, GC.self, Config.self, Quiet.self, Lease.self, Sources.self, Use.self, Export.self,
            Serve.self, Agent.self, Watch.self, Pack.self, MakeManifest.self, Keygen.self, MakeReceipt.self, Trust.self, Repo.self,
            Demo.self,
            TUFClient.self,
        ]
    )

    /// Parses `packs [--home DIR] [--json] COMMAND …`: global options may come before the subcommand.
    static func main() async {
        // A reader that goes away must not kill the process: writes fail with EPIPE instead (see Output).
        signal(SIGPIPE, SIG_IGN)
        // Two malloc arenas instead of glibc's 8 per core: installs run on many short-lived threads, and memory
        // freed in one arena was kept from the others. Measured on a 10,000-pack fetch: peak RSS 115 → 100 MB,
        // time unchanged (Benchmarks/RESULTS.md). The library leaves process-wide settings to its host.
        _ = clinux_mallopt(clinux_m_arena_max(), 2)
        let arguments = Self.movingGlobalOptions(Array(CommandLine.arguments.dropFirst()))
        do {
            var command = try Self.parseAsRoot(arguments)
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch {
            Self.exit(withError: error)
        }
    }

    /// Moves global options written before the subcommand to just after it, where ArgumentParser reads them.
    static func movingGlobalOptions(_ arguments: [String]) -> [String] {
        let flags: Set<String> = ["--json", "--quiet", "-q", "--verbose", "-v"]
        var moved: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if flags.contains(argument) || argument.hasPrefix("--home=") {
                moved.append(argument)
                index += 1
            } else if argument == "--home", index + 1 < arguments.count {
                moved += [argument, arguments[index + 1]]
                index += 2
            } else {
                break
            }
        }
        guard !moved.isEmpty, index < arguments.count else { return arguments }
        // `trust add`, `trust list`, `trust remove`: the options belong to the nested command.
        var command = [arguments[index]]
        if arguments[index] == "trust", index + 1 < arguments.count, ["add", "list", "remove"].contains(arguments[index + 1]) {
            command.append(arguments[index + 1])
        }
        return command + moved + arguments[(index + command.count)...]
    }
}

/// Options every command that touches the home folder shares.
struct GlobalOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp("Root of all state and installed content (default: $PACKS_HOME, else the XDG folders).", valueName: "dir"))
    var home: String?

    @Flag(name: .long, help: "Print JSON (one object per line for events).")
    var json = false

    @Flag(name: [.short, .long], help: "Print only errors.")
    var quiet = false

    @Flag(name: [.short, .long], help: "Log what happens, to stderr.")
    var verbose = false

    var resolvedHome: Home {
        if let home { return Home(folder: URL(filePath: (home as NSString).expandingTildeInPath).absoluteURL) }
        if let env = ProcessInfo.processInfo.environment["PACKS_HOME"], !env.isEmpty { return Home(folder: URL(filePath: env).absoluteURL) }
        return .xdg()
    }

    var logger: Logger? {
        guard self.verbose else { return nil }
        var logger = Logger(label: "packs", factory: { SafeLogHandler(label: $0) })
        logger.logLevel = .debug
        return logger
    }
}

/// `--metered yes|no|auto`.
enum MeteredFlag: String, ExpressibleByArgument, Sendable {
    case yes, no, auto
}

/// A byte count as curl writes it: `500000`, `500K`, `2M`, `1G` (powers of 1024).
struct ByteCount: ExpressibleByArgument, Sendable {
    var bytes: Int64

    init?(argument: String) {
        let text = argument.trimmingCharacters(in: .whitespaces)
        let units: [Character: Int64] = ["k": 1 << 10, "m": 1 << 20, "g": 1 << 30]
        var digits = Substring(text)
        var multiplier: Int64 = 1
        if let last = text.last?.lowercased().first, let unit = units[last] {
            multiplier = unit
            digits = text.dropLast()
        }
        guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let value = Int64(digits), value > 0 else { return nil }
        let (bytes, overflow) = value.multipliedReportingOverflow(by: multiplier)
        guard !overflow else { return nil }
        self.bytes = bytes
    }
}

/// Options for commands that transfer (`fetch`, `resume`, `verify --repair`).
struct TransferFlags: ParsableArguments {
    @Option(
        name: .customLong("max-rate"),
        help: ArgumentHelp("Limit each download to this many bytes per second (500K, 2M: powers of 1024, as curl).", valueName: "rate"))
    var maxRate: ByteCount?

    @Option(
        name: .customLong("cache-budget"),
        help: ArgumentHelp(
            "Keep at most this much installed content in the caches (2G, 500M), evicting unused packs before an install (default: the home's, see packs config).",
            valueName: "size"))
    var cacheBudget: ByteCount?

    @Option(
        name: .customLong("max-expansion-ratio"),
        help: ArgumentHelp(
            "Refuse packs that unpack to more than N times their size, unless the manifest gives unpackedLength.", valueName: "n"))
    var maxExpansionRatio: Int64 = 100

    @Option(name: .customLong("max-entries"), help: ArgumentHelp("Refuse packs with more entries than this.", valueName: "n"))
    var maxEntries = 100_000

    @Option(help: "How many downloads run at once.")
    var concurrency = 4

    @Option(
        help: ArgumentHelp(
            "Retry a failed transfer this many times (without new bytes kept; a stalled or too slow attempt always counts) before the download fails.",
            valueName: "n"))
    var retries = 5

    @Option(
        name: .customLong("stall-timeout"),
        help: ArgumentHelp(
            "Retry a transfer that receives nothing, or less than 1 KiB/s on average, for this many seconds (the manifest request too).",
            valueName: "seconds"))
    var stallTimeout: Double = 30

    @Option(
        name: .customLong("header"),
        help: ArgumentHelp("Extra request header, e.g. 'Authorization: Bearer …' (repeatable).", valueName: "name: value"))
    var headers: [String] = []

    @Option(
        name: .customLong("secret-header"),
        help: ArgumentHelp(
            "A request header that carries a credential, e.g. 'X-Api-Key: …' (repeatable): sent as --header is, but only to the manifest's origin, as Authorization, Cookie and Proxy-Authorization headers and receipts always are.",
            valueName: "name: value"))
    var secretHeaders: [String] = []

    /// The names of the --secret-header headers.
    var secretHeaderNames: Set<String> {
        Set(self.secretHeaders.map { $0.prefix { $0 != ":" }.trimmingCharacters(in: .whitespaces) })
    }

    @Option(
        help: ArgumentHelp(
            "A signed receipt (packs receipt) to present as 'Authorization: Bearer …': a file holding it, read again before each transfer so a renewed receipt is used, or the token itself. It is stored with the transaction, so a later resume needs no flag.",
            valueName: "file|token"))
    var receipt: String?

    @Flag(
        name: .customLong("no-delta"),
        help:
            "Fetch the whole pack of a new version even when only some of its files changed (no delta update), and keep a first install's whole pack until installed rather than writing each byte once."
    )
    var noDelta = false

    @Option(
        help: ArgumentHelp(
            "Whether the connection is metered: yes, no, or auto (NetworkManager's answer, unmetered without it). On a metered one, packs above --metered-limit that you did not ask for yourself (a restore's, prefetch packs, a resume of those) wait, exit 75, until packs resume --allow-metered.",
            valueName: "yes|no|auto"))
    var metered: MeteredFlag = .auto

    @Option(
        name: .customLong("metered-limit"),
        help: ArgumentHelp("The largest pack fetched on a metered connection without --allow-metered (default 50M).", valueName: "size"))
    var meteredLimit: ByteCount?

    /// The receipt now: the file's first line when `--receipt` names a file, else the token given.
    func currentReceipt() -> String? {
        guard let receipt = self.receipt else { return nil }
        if let data = FileManager.default.contents(atPath: receipt) {
            return String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).first.map {
                $0.trimmingCharacters(in: .whitespaces)
            }
        }
        return receipt
    }

    func validate() throws {
        if self.maxExpansionRatio < 1 { throw ValidationError("--max-expansion-ratio must be at least 1.") }
        if self.maxEntries < 1 { throw ValidationError("--max-entries must be at least 1.") }
        if self.retries < 0 || self.retries > 100 { throw ValidationError("--retries must be between 0 and 100.") }
        if self.concurrency < 1 || self.concurrency > 64 { throw ValidationError("--concurrency must be between 1 and 64.") }
        if self.stallTimeout <= 0 { throw ValidationError("--stall-timeout must be a positive number of seconds.") }
        for header in self.headers where !header.contains(":") || header.hasPrefix(":") {
            throw ValidationError("--header '\(header)' is not of the form 'Name: value'.")
        }
        // The value is a secret: never echoed.
        for header in self.secretHeaders where !header.contains(":") || header.hasPrefix(":") {
            throw ValidationError("A --secret-header is not of the form 'Name: value'.")
        }
    }

    /// The options of the manifest request: the headers, with the receipt.
    var options: TransferOptions {
        var options = TransferOptions(
            maxBytesPerSecond: self.maxRate?.bytes, stallTimeout: self.stallTimeout, lowSpeedTime: self.stallTimeout,
            headers: self.headers + self.secretHeaders + (self.currentReceipt().map { ["Authorization: Bearer \($0)"] } ?? []))
        options.secretHeaderNames = self.secretHeaderNames
        return options
    }

    func configuration(resumeInterrupted: Bool = false) -> DownloadQueue.Configuration {
        var packOptions = TransferOptions(
            maxBytesPerSecond: self.maxRate?.bytes, stallTimeout: self.stallTimeout, lowSpeedTime: self.stallTimeout,
            headers: self.headers + self.secretHeaders)
        packOptions.secretHeaderNames = self.secretHeaderNames
        var configuration = DownloadQueue.Configuration(
            concurrency: self.concurrency, transfer: packOptions, resumeInterruptedDownloads: resumeInterrupted,
            resumeWhenSpaceReturns: false, maxExpansionRatio: self.maxExpansionRatio,
            maxEntries: self.maxEntries, maxAttempts: self.retries + 1)
        configuration.deltaUpdates = !self.noDelta
        // The CLI runs its downloads itself (`fetch --detach` hands them to the agent through its API).
        configuration.agent = .never
        configuration.cacheBudget = self.cacheBudget?.bytes
        switch self.metered {
        case .yes: configuration.networkPolicy = FixedNetworkPolicy(metered: true)
        case .no: configuration.networkPolicy = FixedNetworkPolicy(metered: false)
        case .auto: break
        }
        if let limit = self.meteredLimit { configuration.meteredLimit = limit.bytes }
        if self.receipt != nil {
            // Asked before every pack transfer, and again after a 401/403: a receipt file renewed meanwhile is used.
            let flags = self
            configuration.credentials = { _ in flags.currentReceipt().map { ["Authorization: Bearer \($0)"] } ?? [] }
        }
        TestHooks.apply(to: &configuration)
        return configuration
    }
}

/// The configuration of commands that only look at the home (status, content, pause, …).
func lookingConfiguration() -> DownloadQueue.Configuration {
    var configuration = DownloadQueue.Configuration(resumeInterruptedDownloads: false, resumeWhenSpaceReturns: false)
    TestHooks.apply(to: &configuration)
    return configuration
}

/// Standard output that survives a reader that went away (`packs fetch … | head -1`): a write that
/// fails with EPIPE marks the run as interrupted instead of killing the process.
enum Output {
    static let broken = Atomic<Bool>(false)

    static func write(_ text: String, to fd: Int32 = STDOUT_FILENO) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                if errno == EPIPE, fd == STDOUT_FILENO { Self.broken.store(true, ordering: .relaxed) }
                return
            }
            bytes = bytes.dropFirst(written)
        }
    }
}

func printLine(_ line: String) {
    guard !Output.broken.load(ordering: .relaxed) else { return }
    Output.write(SafeOutput.line(line) + "\n")
}

func printError(_ line: String) {
    Output.write(SafeOutput.line(line) + "\n", to: STDERR_FILENO)
}
