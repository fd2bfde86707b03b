import NIOHTTPTypes

/// Where a connection stands between requests and responses, counted from the HTTP parts that pass
/// one channel handler: request heads and ends read, response ends written.
///
/// A client may send its next request before the previous response's end has passed (it has all the
/// bytes once the body is sent), so these are counts, not one state. A handler counts what passes it:
/// the requests a handler answers itself never reach the handlers after it. The
/// ``RequestTimeoutHandler`` keeps the connection's count, which the ``LingeringCloseHandler`` asks
/// for (nothing between them answers or holds back a request), so that each request part is looked
/// at once for both.
struct ExchangeCount {
    private var requestsStarted = 0
    private var requestsEnded = 0
    private var responsesEnded = 0

    mutating func read(_ part: HTTPRequestPart) {
        switch part {
        case .head:
            self.requestsStarted += 1
        case .body:
            break
        case .end:
            self.requestsEnded += 1
        }
    }

    mutating func wrote(_ part: HTTPResponsePart) {
        if case .end = part {
            self.responsesEnded += 1
        }
    }

    /// A request has started and not been read to its end.
    var isReadingRequest: Bool { self.requestsStarted > self.requestsEnded }
    /// A request read to its end has not been answered to its end.
    var isResponding: Bool { self.responsesEnded < self.requestsEnded }
    /// Every request read has been answered to its end: waiting for the next one.
    var isIdle: Bool { self.requestsStarted == self.requestsEnded && self.responsesEnded == self.requestsEnded }
    /// No response has ended yet: the connection is still waiting for its first request.
    var isFirstRequest: Bool { self.responsesEnded == 0 }
}
