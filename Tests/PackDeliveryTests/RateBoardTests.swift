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

    /// A ticket paces the requests that hold it one after another as one body: a request started after a gap takes the
    /// gap's worth at once (a delta run's ranges keep their share between them), and no more; a new rate paces from
    /// its change on, with a fresh burst.
    @Test func aTicketsPaceHoldsAcrossTheRequestsThatShareIt() throws {
        let board = RateBoard()
        board.setCap(1_000_000)
        let ticket = board.join(priority: .userInitiated)
        let start = Date()
        let burst = Int(RateBoard.Ticket.paceBurst(1_000_000))
        #expect(ticket.pace(burst, own: nil, now: start) == nil)
        let wait = try #require(ticket.pace(100_000, own: nil, now: start))
        #expect(abs(wait - 0.1) < 0.001)
        #expect(ticket.pace(100_000, own: nil, now: start + 0.1) == nil)
        // The request ended at 0.1 s; the next starts 50 ms later, and takes those 50 ms' worth at once.
        #expect(ticket.pace(50_000, own: nil, now: start + 0.15) == nil)
        let more = try #require(ticket.pace(50_000, own: nil, now: start + 0.15))
        #expect(abs(more - 0.05) < 0.001)
        #expect(ticket.received.load(ordering: .relaxed) == Int64(burst + 150_000))

        // The cap halves: paced at the new rate from now, after a burst.
        board.setCap(500_000)
        #expect(ticket.pace(burst, own: nil, now: start + 0.2) == nil)
        let halved = try #require(ticket.pace(50_000, own: nil, now: start + 0.2))
        #expect(abs(halved - 0.1) < 0.001)
        // A transfer's own lower limit paces it below the share.
        let own = try #require(ticket.pace(50_000, own: 250_000, now: start + 0.2))
        #expect(own > halved)

        // After 30 s unused at that rate (a retry's backoff), a quarter second's worth is taken at once, not 30 s' worth.
        let later = start + 30.2
        let lowBurst = Int(RateBoard.Ticket.paceBurst(250_000))
        #expect(ticket.pace(62_500 + lowBurst, own: 250_000, now: later) == nil)
        let paced = try #require(ticket.pace(25_000, own: 250_000, now: later), "30 s' worth was taken unpaced")
        #expect(paced > 0.03)

        // A read larger than a quarter second's worth (16 KiB at 4 KiB/s) waits its time, then is taken.
        let tiny = RateBoard().join(priority: .background)
        let at = Date()
        let tinyBurst = Int(RateBoard.Ticket.paceBurst(4096))
        #expect(tiny.pace(tinyBurst, own: 4096, now: at) == nil)
        let tinyWait = try #require(tiny.pace(16_384, own: 4096, now: at))
        #expect(abs(tinyWait - 4.0) < 0.01)
        #expect(tiny.pace(16_384, own: 4096, now: at + tinyWait) == nil, "taken once its wait is over")
    }
}
