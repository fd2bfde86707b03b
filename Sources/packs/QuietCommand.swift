import ArgumentParser
import Foundation
import PackDelivery
import Synchronization

extension Packs {
    struct Quiet: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Hold quiet while a command runs (a game, a call): background and prefetch downloads wait meanwhile.",
            discussion: """
                As systemd-inhibit does: quiet is held from before COMMAND starts until it exits, and released however \
                packs quiet ends (a hold whose process is gone is not counted, even after SIGKILL). While any hold is \
                held, every home's prefetch and background downloads wait and the others share the quiet rate \
                (packs config quiet-rate). SIGTERM and SIGHUP are passed on to COMMAND; SIGINT from the terminal reaches \
                it directly. Without a command, lists the holds held now (pid and reason).

                Exit: COMMAND's exit status (128 + the signal's number when a signal ended it); 127 when COMMAND is not \
                found, 126 when it cannot be run; 74 when the hold cannot be recorded.

                Examples:
                  packs quiet --reason "playing Forest" -- ./forest --fullscreen
                  packs quiet
                """)
        @OptionGroup var global: GlobalOptions
        @Option(help: ArgumentHelp("Why quiet is held, as listed (default: the command).", valueName: "text"))
        var reason: String?
        @Argument(parsing: .postTerminator, help: ArgumentHelp("The command and its arguments, after --.", valueName: "command"))
        var command: [String] = []

        func run() throws {
            guard let program = self.command.first else { return self.list() }
            let hold: QuietHold
            do throws(PackDeliveryError) {
                hold = try QuietHold(reason: self.reason ?? self.command.joined(separator: " "))
            } catch {
                throw fail(error)
            }
            let status = QuietChild.run(program, self.command)
            hold.release()
            if status != 0 { throw ExitCode(status) }
        }

        private func list() {
            let holds = QuietHolds.current()
            if self.global.json {
                printJSON(["holds": holds])
            } else if holds.isEmpty {
                if !self.global.quiet { printLine("not quiet") }
            } else {
                for hold in holds { printLine("\(hold.pid)  \(PackDeliveryError.printable(hold.reason))") }
            }
        }
    }
}

/// Runs the command `packs quiet` holds quiet for, passing SIGTERM and SIGHUP on.
enum QuietChild {
    /// Signals passed on to the command.
    static let forwarded = [SIGTERM, SIGHUP]

    /// Runs a program with this process's standard streams and environment, and waits for it.
    ///
    /// - Parameters:
    ///   - program: the program, looked up in `PATH` when it has no slash.
    ///   - arguments: its arguments, the program first.
    /// - Returns: its exit status, 128 + the signal that ended it, 127 when not found, 126 when it cannot run.
    static func run(_ program: String, _ arguments: [String]) -> Int32 {
        let child = ChildProcess()
        var sources: [any DispatchSourceSignal] = []
        for number in Self.forwarded + [SIGINT] {
            signal(number, SIG_IGN)
            guard number != SIGINT else { continue }
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                child.state.withLock { child in
                    if child.pid > 0 { kill(child.pid, number) } else { child.pending = number }
                }
            }
            source.resume()
            sources.append(source)
        }
        defer {
            for source in sources { source.cancel() }
        }
        var pid: pid_t = 0
        let code = Self.spawn(program, arguments, &pid)
        guard code == 0 else {
            printError("packs: Could not run \(PackDeliveryError.printable(program)): \(String(cString: strerror(code))).")
            return code == ENOENT ? 127 : 126
        }
        child.state.withLock { child in
            child.pid = pid
            if let pending = child.pending { kill(pid, pending) }
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        let signalled = status & 0x7f
        return signalled == 0 ? (status >> 8) & 0xff : 128 + signalled
    }

    /// `posix_spawnp` with the signals this process ignores set back to their defaults in the child.
    private static func spawn(_ program: String, _ arguments: [String], _ pid: inout pid_t) -> Int32 {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for number in Self.forwarded + [SIGINT, SIGPIPE] { sigaddset(&defaults, number) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        let environment = ProcessInfo.processInfo.environment.map { "\($0.key)=\($0.value)" }
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        var envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) } + [nil]
        defer {
            for pointer in argv + envp { free(pointer) }
        }
        return posix_spawnp(&pid, program, nil, &attributes, &argv, &envp)
    }
}

/// The command's pid once started, and a signal that came before it was (passed on as soon as it starts).
final class ChildProcess: Sendable {
    let state = Mutex<(pid: pid_t, pending: Int32?)>((0, nil))
}
