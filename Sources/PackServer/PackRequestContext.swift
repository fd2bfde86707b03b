import Hummingbird
import Synchronization

/// The request context of `packs serve`: Hummingbird's basic one plus the connection's flow control.
struct PackRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The connection's flow control; `nil` where there is no real connection (router tests).
    let flow: ConnectionFlow?
    /// What the authorization learnt, for the request log (which runs outside it).
    let notes = RequestNotes()

    init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.flow = ConnectionFlow.registered(for: source.channel)
    }
}

/// Shared by every copy of one request's context: the authorization writes, the request log reads.
final class RequestNotes: Sendable {
    private let value = Mutex<String?>(nil)

    /// Who presented the credential (``AccessGrant/credential``).
    var credential: String? {
        get { self.value.withLock { $0 } }
        set { self.value.withLock { $0 = newValue } }
    }
}
