import Foundation
@_spi(Testing) import PackDelivery

/// The hooks the suite drives the built `packs` with, through environment variables. They are compiled into debug
/// builds only: the tests run `.build/debug/packs`, and the release binary that `scripts/package` ships (and that
/// the benchmarks run) has none of them, so no variable of a user's environment can pause or reshape an install.
enum TestHooks {
    /// Applies the hooks the environment asks for (none in a release build).
    static func apply(to configuration: inout DownloadQueue.Configuration) {
        #if DEBUG
            configuration.installHook = TestPausePoint.hook
            // `PACKS_TEST_JOINED_WINDOW=0` makes a small pack's first install take the path of a large one's
            // (consecutive windows in one request), so that the kill tests cover it.
            if let window = ProcessInfo.processInfo.environment["PACKS_TEST_JOINED_WINDOW"].flatMap(Int64.init) {
                configuration.joinedWindow = window
            }
            configuration.clock = Self.clock()
        #endif
    }

    /// The clock `packs serve --keys` and a client's queue compare preload release dates with: the system's, or in a
    /// debug build with `PACKS_TEST_CLOCK_FILE=PATH`, the ISO 8601 date written in that file, read at each use (so that
    /// a test moves a running server's or client's time past a release).
    static func clock() -> @Sendable () -> Date {
        #if DEBUG
            if let path = ProcessInfo.processInfo.environment["PACKS_TEST_CLOCK_FILE"], !path.isEmpty {
                return {
                    let text = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
                    return text.flatMap(Manifest.Content.Preload.date) ?? Date()
                }
            }
        #endif
        return { Date() }
    }
}

#if DEBUG
    /// Pause points for the power-cut tests: with `PACKS_TEST_PAUSE_AT=after-rename` (or `before-rename`,
    /// `mid-unpack`), an install that reaches the step prints `paused at STEP` on stderr and sleeps until the
    /// process is killed.
    enum TestPausePoint {
        static let hook: (@Sendable (InstallStep) -> Void)? = {
            guard let wanted = ProcessInfo.processInfo.environment["PACKS_TEST_PAUSE_AT"].flatMap(InstallStep.init(rawValue:)) else {
                return nil
            }
            return { step in
                guard step == wanted else { return }
                printError("packs: paused at \(step.rawValue) (PACKS_TEST_PAUSE_AT)")
                while true { sleep(60) }
            }
        }()
    }
#endif
