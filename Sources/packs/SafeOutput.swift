import Logging
import PackDelivery

/// The output boundary's last guard, for every line `packs` writes and every line it logs: whatever a line was
/// built from, no control character (but the tabs and line breaks the line is laid out with) and no bidirectional
/// control reaches the terminal raw. Texts from outside are escaped where they are put into a line, with
/// ``PackDeliveryError/printable(_:)``, which also escapes the backslash so that they read back; this pass leaves the
/// backslash alone, so that text escaped there is not escaped twice, and only catches what a line forgot.
enum SafeOutput {
    static func line(_ text: String) -> String {
        PackDeliveryError.printable(text, keeping: ["\n", "\t"], escapingBackslash: false)
    }

    /// A log line's text or one of its values.
    static func logged(_ text: String) -> String {
        PackDeliveryError.printable(text, keeping: [], escapingBackslash: false)
    }
}

/// `StreamLogHandler` on stderr, with the message and every metadata value passed through ``SafeOutput/logged(_:)``
/// (`packs --verbose` logs hosts, URLs and servers' words; `packs serve` logs request lines).
struct SafeLogHandler: LogHandler {
    private var inner: StreamLogHandler

    init(label: String) {
        self.inner = StreamLogHandler.standardError(label: label)
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { self.inner.metadataProvider }
        set { self.inner.metadataProvider = newValue }
    }

    var logLevel: Logger.Level {
        get { self.inner.logLevel }
        set { self.inner.logLevel = newValue }
    }

    var metadata: Logger.Metadata {
        get { self.inner.metadata }
        set { self.inner.metadata = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.inner[metadataKey: key] }
        set { self.inner[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) {
        var event = event
        event.message = "\(SafeOutput.logged(event.message.description))"
        event.metadata = event.metadata?.mapValues(Self.safe)
        self.inner.log(event: event)
    }

    private static func safe(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): .string(SafeOutput.logged(text))
        case .stringConvertible(let text): .string(SafeOutput.logged(text.description))
        case .array(let values): .array(values.map(Self.safe))
        case .dictionary(let values): .dictionary(values.mapValues(Self.safe))
        }
    }
}
