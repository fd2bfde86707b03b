import ArgumentParser
import Foundation
import Logging
import PackDelivery

@main
struct Packs: AsyncParsableCommand {
    static let version = "0.1.0"

    static let configuration = CommandConfiguration(
        commandName: "packs",
        abstract: "Deliver purchased content packs: download, verify, unpack and install them.",
        discussion: """
            Exit codes: 0 done; 64 usage error; 65 bad data (manifest, unknown product, checksum, unsafe or corrupt pack); \
            69 server or network failure after retries; 74 local I/O failure; 75 stopped before finishing but resumable \
            (paused, or out of disk space); 130 interrupted.

            Example:
              packs --home ~/packs fetch https://cdn.example.com/manifest.json com.example.forest
            """,
        version: Packs.version,
        subcommands: [Fetch.self, Resume.self, Status.self, Pause.self, Cancel.self, Finish.self, Content.self, Remove.self,
                      Serve.self, Pack.self, MakeManifest.self, Demo.self]
    )

    /// Parses `packs [--home DIR] [--json] COMMAND …`: global options may come before the subcommand.
    static func main() async {
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
        return [arguments[index]] + moved + arguments[(index + 1)...]
    }
}

/// Options every command that touches the home folder shares.
struct GlobalOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("Root of all state and installed content (default: $PACKS_HOME, else the XDG folders).", valueName: "dir"))
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
        var logger = Logger(label: "packs", factory: { StreamLogHandler.standardError(label: $0) })
        logger.logLevel = .debug
        return logger
    }
}

/// Options for commands that transfer (`fetch`, `resume`).
struct TransferFlags: ParsableArguments {
    @Option(name: .customLong("max-rate"), help: ArgumentHelp("Limit each download to this many bytes per second.", valueName: "bytes-per-second"))
    var maxRate: Int64?

    @Option(help: "How many downloads run at once.")
    var concurrency = 4

    @Option(name: .customLong("stall-timeout"), help: ArgumentHelp("Retry a transfer after this many seconds without data.", valueName: "seconds"))
    var stallTimeout: Double = 30

    @Option(name: .customLong("header"), help: ArgumentHelp("Extra request header, e.g. 'Authorization: Bearer …' (repeatable).", valueName: "name: value"))
    var headers: [String] = []

    func validate() throws {
        if let maxRate, maxRate <= 0 { throw ValidationError("--max-rate must be a positive number of bytes per second.") }
        if self.concurrency < 1 || self.concurrency > 64 { throw ValidationError("--concurrency must be between 1 and 64.") }
        if self.stallTimeout <= 0 { throw ValidationError("--stall-timeout must be a positive number of seconds.") }
        for header in self.headers where !header.contains(":") || header.hasPrefix(":") {
            throw ValidationError("--header '\(header)' is not of the form 'Name: value'.")
        }
    }

    var options: TransferOptions {
        TransferOptions(maxBytesPerSecond: self.maxRate, stallTimeout: self.stallTimeout, headers: self.headers)
    }

    func configuration(resumeInterrupted: Bool = false) -> DownloadQueue.Configuration {
        DownloadQueue.Configuration(concurrency: self.concurrency, transfer: self.options, resumeInterruptedDownloads: resumeInterrupted,
                                    resumeWhenSpaceReturns: false)
    }
}

func printLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
