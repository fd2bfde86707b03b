import Foundation
import Testing

@testable import PackDelivery

/// The machine's rate cap shared among running transfers, driven with measured bytes and an injected clock: no
/// sockets, no sleeps.
@Suite(.timeLimit(.minutes(1)))
struct RateBoardTests {
    static let cap: Int64 = 20_000_000

    /// Transfers that take all their share are shared fairly; one that starts mid-way at user-initiated priority gets
    /// at least half the cap at once and keeps it through the measures that follow, even when it started between
    /// two measures; a transfer its server holds low gives the rest of its share to the others.
    @Test func aUserInitiatedTransferKeepsHalfTheCapAndASlowOneGivesWhatItCannotTake() {
        let board = RateBoard()
        board.setCap(Self.cap)
        var now = ContinuousClock.now
        let background = (0..<4).map { _ in board.join(priority: .background, now: now) }
        #expect(background.map { $0.rate.load(ordering: .relaxed) } == [5_000_000, 5_000_000, 5_000_000, 5_000_000])
        /// Each ticket receives what its rate allows for `seconds` (`slow` at most `slowRate`), then the board measures.
        func run(_ seconds: Double, slow: RateBoard.Ticket? = nil, slowRate: Int64 = 0) {
            for ticket in board.tickets {
                let rate = ticket === slow ? min(slowRate, ticket.rate.load(ordering: .relaxed)) : ticket.rate.load(ordering: .relaxed)
                ticket.received.add(Int64(Double(rate) * seconds), ordering: .relaxed)
            }
            now += .milliseconds(Int64(seconds * 1000))
            board.remeasure(now: now)
        }
        for _ in 0..<4 { run(0.5) }
        #expect(background.map { $0.rate.load(ordering: .relaxed) } == [5_000_000, 5_000_000, 5_000_000, 5_000_000])

        // Started 0.4 s into a window: it has received for 0.1 s when the board measures.
        now += .milliseconds(400)
        let urgent = board.join(priority: .userInitiated, now: now)
        #expect(urgent.rate.load(ordering: .relaxed) >= Self.cap / 2)
        for ticket in background { ticket.received.add(Int64(Double(ticket.rate.load(ordering: .relaxed)) * 0.1), ordering: .relaxed) }
        urgent.received.add(urgent.rate.load(ordering: .relaxed) / 10, ordering: .relaxed)
        now += .milliseconds(100)
        board.remeasure(now: now)
        for step in 0..<6 {
            #expect(urgent.rate.load(ordering: .relaxed) >= Self.cap / 2, "step \(step): \(urgent.rate.load(ordering: .relaxed))")
            #expect(board.tickets.reduce(0) { $0 + $1.rate.load(ordering: .relaxed) } == Self.cap, "the whole cap is shared")
            run(0.5)
        }

        // A background transfer whose server sends 1 MB/s keeps a little room, and the others share the rest.
        let slow = background[0]
        for _ in 0..<4 { run(0.5, slow: slow, slowRate: 1_000_000) }
        let slowShare = slow.rate.load(ordering: .relaxed)
        #expect(slowShare >= 1_000_000 && slowShare <= 1_300_000, "\(slowShare)")
        #expect(urgent.rate.load(ordering: .relaxed) >= Self.cap / 2)
        board.leave(urgent)
        #expect(background.dropFirst().allSatisfy { $0.rate.load(ordering: .relaxed) > 5_000_000 }, "the urgent share goes to the others")
    }
}
