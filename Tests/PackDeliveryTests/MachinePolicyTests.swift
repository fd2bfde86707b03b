import Foundation
import Testing

@testable import PackDelivery

/// The machine's one policy (window, quiet, metered, admission across homes, rate shares), decided by a pure value:
/// inputs in, a plan out. No sockets, no sleeps, no clock: the time of day is given as seconds since local midnight.
@Suite(.timeLimit(.minutes(1))) struct MachinePolicyTests {
    typealias Candidate = MachinePolicy.Candidate

    static func at(_ hours: Int, _ minutes: Int = 0, _ seconds: Int = 0) -> Int { hours * 3600 + minutes * 60 + seconds }

    static func candidate(
        _ home: String, _ id: String, _ priority: DownloadPriority, sequence: Int, length: Int64 = 1 << 20, rate: Double? = nil,
        running: Bool = false, delivery: DeliveryPolicy = .essential
    ) -> Candidate {
        Candidate(
            home: home, id: id, priority: priority, delivery: delivery, sequence: sequence, contentLength: length, bytesPerSecond: rate,
            isRunning: running)
    }

    /// `home/id` of the downloads that run.
    static func running(_ plan: MachinePolicy.Plan, _ candidates: [Candidate]) -> Set<String> {
        Set(candidates.indices.filter { plan.decisions[$0].runs }.map { "\(candidates[$0].home)/\(candidates[$0].id)" })
    }

    static func rate(_ decision: MachinePolicy.Decision) -> Int64? {
        if case .run(let rate) = decision { return rate }
        return nil
    }

    @Test func aWindowCrossingMidnightHoldsTheNightAndNotTheDay() throws {
        let window = try #require(BackgroundWindow(parsing: "22:00-06:00"))
        #expect(window.start == 22 * 60 && window.end == 6 * 60 && window.description == "22:00-06:00")
        #expect(window.contains(second: Self.at(22)) && window.contains(second: Self.at(23, 30)) && window.contains(second: 0))
        #expect(window.contains(second: Self.at(5, 59, 59)) && !window.contains(second: Self.at(6)))
        #expect(!window.contains(second: Self.at(12)) && !window.contains(second: Self.at(21, 59, 59)))
        #expect(window.secondsToNextEdge(after: Self.at(21)) == 3600, "opens in an hour")
        #expect(window.secondsToNextEdge(after: Self.at(23)) == 7 * 3600, "closes at 06:00")
        #expect(window.secondsToNextEdge(after: Self.at(22)) == 8 * 3600, "just opened: the next edge is the close")
        for bad in [
            "", "01:00", "1:00-07:00", "25:00-01:00", "01:60-02:00", "01:00-01:00", "01:00-07:00-08:00", "aa:bb-cc:dd", "+1:00-07:00",
        ] {
            #expect(BackgroundWindow(parsing: bad) == nil, "\(bad) is not a window")
        }
        #expect(BackgroundWindow(parsing: "18:00-24:00")?.end == 0, "24:00 is midnight as an end")

        let policy = MachinePolicy(window: window)
        #expect(policy.nextChange(after: Self.at(5, 30)) == 1800)
        #expect(MachinePolicy().nextChange(after: Self.at(5, 30)) == nil, "no window: only other inputs change the plan")
        let candidates = [
            Self.candidate("a", "user", .userInitiated, sequence: 0), Self.candidate("a", "essential", .essential, sequence: 1),
            Self.candidate("a", "restore", .restore, sequence: 2), Self.candidate("b", "prefetch", .prefetch, sequence: 3),
            Self.candidate("b", "background", .background, sequence: 4),
        ]
        let noon = MachinePolicy(window: window, concurrency: 10).decide(candidates, .init(secondOfDay: Self.at(12)))
        #expect(noon.decisions.map(\.runs) == [true, true, false, false, false])
        #expect(noon.decisions[2...].allSatisfy { $0 == .wait(.outsideWindow) })
        let night = MachinePolicy(window: window, concurrency: 10).decide(candidates, .init(secondOfDay: Self.at(23, 30)))
        #expect(night.decisions.allSatisfy { $0.runs }, "inside the window everything runs")
    }

    @Test func localTimeIsGivenAsSecondsOfTheDayWithNoDaylightSavingInside() throws {
        // 2026-03-29 01:30 UTC: in Paris the clocks have just moved to 03:30 (CEST, UTC+2).
        let date = Date(timeIntervalSince1970: 1_774_747_800)
        #expect(MachineClock.secondOfDay(date, timeZone: try #require(TimeZone(identifier: "UTC"))) == Self.at(1, 30))
        #expect(MachineClock.secondOfDay(date, timeZone: try #require(TimeZone(identifier: "Europe/Paris"))) == Self.at(3, 30))
        let window = try #require(BackgroundWindow(parsing: "02:00-03:00"))
        #expect(!window.contains(second: Self.at(3, 30)), "the window is wall-clock time: skipped the night the hour is")
        #expect(window.contains(second: Self.at(2, 30) + 86_400), "seconds are taken modulo a day")
    }

    @Test func quietPausesPrefetchAndBackgroundAndCapsTheOthers() {
        let candidates = [
            Self.candidate("a", "user", .userInitiated, sequence: 0, running: true),
            Self.candidate("a", "restore", .restore, sequence: 1, running: true),
            Self.candidate("b", "prefetch", .prefetch, sequence: 2, running: true),
            Self.candidate("b", "background", .background, sequence: 3),
        ]
        let policy = MachinePolicy(maxRate: 20 << 20, quietRate: 1 << 20, concurrency: 4)
        let loud = policy.decide(candidates, .init(secondOfDay: 0))
        #expect(loud.runningCount == 4 && loud.cap == 20 << 20 && loud.totalRate == 20 << 20)
        let quiet = policy.decide(candidates, .init(secondOfDay: 0, quietHeld: true))
        #expect(quiet.decisions[2] == .wait(.quiet) && quiet.decisions[3] == .wait(.quiet), "prefetch and background wait")
        #expect(quiet.decisions[0].runs && quiet.decisions[1].runs)
        #expect(quiet.cap == 1 << 20 && quiet.totalRate == 1 << 20, "the others share the quiet rate")
        #expect(Self.rate(quiet.decisions[0])! >= 1 << 19, "the user's download keeps at least half of it")
        let held = policy.decide(candidates, .init(secondOfDay: 0, holds: [.init(pid: 1, reason: "game")]))
        #expect(held == quiet, "any hold is quiet")
        #expect(policy.decide(candidates, .init(secondOfDay: 0, holds: [])) == loud)
        let noQuietRate = MachinePolicy(maxRate: 20 << 20, concurrency: 4).decide(candidates, .init(secondOfDay: 0, quietHeld: true))
        #expect(noQuietRate.cap == 20 << 20 && noQuietRate.runningCount == 2, "no quiet rate: the machine's cap only")
        let quieterCap = MachinePolicy(maxRate: 1 << 19, quietRate: 1 << 20).decide(candidates, .init(secondOfDay: 0, quietHeld: true))
        #expect(quieterCap.cap == 1 << 19, "quiet never raises the cap")
        let uncapped = MachinePolicy(concurrency: 4).decide(candidates, .init(secondOfDay: 0))
        #expect(uncapped.cap == nil && uncapped.totalRate == nil && uncapped.decisions.allSatisfy { $0 == .run(bytesPerSecond: nil) })
    }

    @Test func prioritiesCrossBetweenTwoHomesInOneOrder() {
        let candidates = [
            Self.candidate("app", "prefetch", .prefetch, sequence: 0),
            Self.candidate("store", "background", .background, sequence: 1),
            Self.candidate("app", "purchase", .essential, sequence: 2),
            Self.candidate("store", "asked-now", .userInitiated, sequence: 3),
            Self.candidate("store", "restore", .restore, sequence: 4),
        ]
        let plan = MachinePolicy(concurrency: 2).decide(candidates, .init(secondOfDay: 0))
        #expect(
            Self.running(plan, candidates) == ["store/asked-now", "app/purchase"], "the other home's purchase beats this one's prefetch")
        #expect(plan.decisions[0] == .wait(.queued) && plan.decisions[1] == .wait(.queued) && plan.decisions[4] == .wait(.queued))
        let three = MachinePolicy(concurrency: 3).decide(candidates, .init(secondOfDay: 0))
        #expect(Self.running(three, candidates) == ["store/asked-now", "app/purchase", "store/restore"])
        // A running download is never stopped for another: it keeps its slot while a higher priority waits.
        var started = candidates
        started[1].isRunning = true
        let kept = MachinePolicy(concurrency: 2).decide(started, .init(secondOfDay: 0))
        #expect(Self.running(kept, started) == ["store/background", "store/asked-now"])
    }

    @Test func samePriorityIsFirstComeFirstServedAcrossHomes() {
        let candidates = (0..<6).map { n in
            Self.candidate(n % 2 == 0 ? "a" : "b", "d\(n)", .essential, sequence: [5, 3, 0, 4, 1, 2][n])
        }
        let plan = MachinePolicy(concurrency: 3).decide(candidates, .init(secondOfDay: 0))
        #expect(Self.running(plan, candidates) == ["a/d2", "a/d4", "b/d5"], "sequences 0, 1, 2 whatever their home")
    }

    @Test(arguments: [1, 2, 3, 7, 12])
    func sharesSumToTheCapWithinOneByte(count: Int) {
        for cap: Int64 in [1000, 20 << 20, 20_000_001, 1 << 40] {
            let candidates = (0..<count).map { n in
                Self.candidate(
                    "h\(n % 3)", "d\(n)", DownloadPriority.allCases[n % 2], sequence: n,
                    rate: n % 3 == 0 ? nil : Double(cap) / Double(n + 2),
                    running: true)
            }
            let plan = MachinePolicy(maxRate: cap, concurrency: 12).decide(candidates, .init(secondOfDay: 0))
            #expect(plan.runningCount == count)
            #expect(abs(plan.totalRate! - cap) <= 1, "\(count) downloads under \(cap): \(plan.decisions)")
            #expect(plan.decisions.allSatisfy { (Self.rate($0) ?? 0) >= 1 }, "never a rate of 0 (no cap, for curl)")
        }
    }

    @Test func aUserInitiatedDownloadAddedMidwayGetsAtLeastHalfTheCap() {
        let cap: Int64 = 20 << 20
        var candidates = (0..<3).map { n in
            Self.candidate("h\(n)", "d\(n)", .essential, sequence: n, rate: Double(cap) / 3, running: true)
        }
        let before = MachinePolicy(maxRate: cap, concurrency: 4).decide(candidates, .init(secondOfDay: 0))
        #expect(before.totalRate == cap && before.decisions.allSatisfy { Self.rate($0)! >= cap / 3 - 1 })
        candidates.append(Self.candidate("h0", "asked-now", .userInitiated, sequence: 3))
        let after = MachinePolicy(maxRate: cap, concurrency: 4).decide(candidates, .init(secondOfDay: 0))
        #expect(Self.rate(after.decisions[3])! >= cap / 2, "as soon as it runs: \(after.decisions)")
        #expect(after.totalRate == cap && after.decisions[0..<3].allSatisfy { Self.rate($0)! >= 1 })
        // Measured slow (its server sends 1 MiB/s): what it leaves goes to the others.
        candidates[3].bytesPerSecond = Double(1 << 20)
        candidates[3].isRunning = true
        let slow = MachinePolicy(maxRate: cap, concurrency: 4).decide(candidates, .init(secondOfDay: 0))
        #expect(slow.totalRate == cap)
        #expect(slow.decisions[0..<3].allSatisfy { Self.rate($0)! > cap / 4 }, "the others share what it does not use: \(slow.decisions)")
        // Others measured slow: the user's download takes what they leave.
        for n in 0..<3 { candidates[n].bytesPerSecond = 100_000 }
        candidates[3].bytesPerSecond = nil
        let alone = MachinePolicy(maxRate: cap, concurrency: 4).decide(candidates, .init(secondOfDay: 0))
        #expect(Self.rate(alone.decisions[3])! > cap * 9 / 10, "\(alone.decisions)")
    }

    @Test func theMeteredPolicyIsAppliedOnceForEveryHome() {
        let big: Int64 = 200 << 20
        let candidates = [
            Self.candidate("a", "purchase", .essential, sequence: 0, length: big),
            Self.candidate("b", "purchase-prefetch", .essential, sequence: 1, length: big, delivery: .prefetch),
            Self.candidate("a", "restore", .restore, sequence: 2, length: big),
            Self.candidate("b", "prefetch", .prefetch, sequence: 3, length: big),
            Self.candidate("a", "user", .userInitiated, sequence: 4, length: big),
            Self.candidate("b", "small", .background, sequence: 5, length: 1 << 20),
            Candidate(home: "b", id: "allowed", priority: .prefetch, sequence: 6, contentLength: big, allowedOnMetered: true),
        ]
        let plan = MachinePolicy(concurrency: 10).decide(candidates, .init(secondOfDay: 0, metered: true))
        #expect(plan.decisions.map(\.runs) == [true, false, false, false, true, true, true])
        #expect(plan.decisions[1...3].allSatisfy { $0 == .wait(.metered) })
        #expect(MachinePolicy(concurrency: 10).decide(candidates, .init(secondOfDay: 0)).runningCount == 7, "not metered: all run")
    }

    /// 100,000 downloads over 10 homes are decided in time linear in their number: ten times as many take far less than
    /// twenty times as long (the best of a few runs each, so a busy machine does not decide it).
    @Test func aMachineOf100000DownloadsIsDecidedInLinearTime() {
        let homes = (0..<10).map { "home-\($0)" }
        func candidates(_ count: Int) -> [Candidate] {
            (0..<count).map { n in
                Candidate(
                    home: homes[n % 10], id: String(n), priority: DownloadPriority.allCases[(n * 7) % 5], sequence: (n * 7_919) % count,
                    contentLength: 1 << 20)
            }
        }
        let policy = MachinePolicy(maxRate: 20 << 20, window: BackgroundWindow(parsing: "01:00-07:00"), concurrency: 8)
        func best(_ input: [Candidate], of runs: Int) -> Duration {
            (0..<runs).map { _ in
                ContinuousClock().measure {
                    let plan = policy.decide(input, .init(secondOfDay: Self.at(3)))
                    #expect(plan.runningCount == 8)
                }
            }.min()!
        }
        let small = candidates(10_000)
        let large = candidates(100_000)
        _ = policy.decide(small, .init(secondOfDay: 0))
        let ratio = best(large, of: 2) / best(small, of: 3)
        #expect(ratio < 20, "100,000 took \(ratio)× the time of 10,000")
    }

    /// Random machines (seeded, so a failure repeats): whatever the input, the invariants hold.
    @Test func invariantsHoldForRandomInputs() {
        var random = SplitMix(state: 44)
        for round in 0..<400 {
            let cap: Int64? = random.next(4) == 0 ? nil : Int64(random.next(50_000_000)) + 1
            let quietRate: Int64? = random.next(3) == 0 ? nil : Int64(random.next(5_000_000)) + 1
            let window = BackgroundWindow(start: random.next(1440), end: random.next(1440))
            let policy = MachinePolicy(
                maxRate: cap, window: window, quietRate: quietRate, concurrency: random.next(6) + 1, meteredLimit: 50 << 20)
            let conditions = MachinePolicy.Conditions(
                secondOfDay: random.next(86_400), quietHeld: random.next(3) == 0, metered: random.next(3) == 0)
            let candidates = (0..<random.next(30)).map { n in
                Candidate(
                    home: "h\(random.next(4))", id: "d\(n)", priority: DownloadPriority.allCases[random.next(5)],
                    delivery: DeliveryPolicy.allCases[random.next(3)], sequence: random.next(1000),
                    contentLength: Int64(random.next(200)) << 20,
                    bytesPerSecond: random.next(2) == 0 ? nil : Double(random.next(30_000_000)),
                    isRunning: random.next(2) == 0, allowedOnMetered: random.next(5) == 0)
            }
            let plan = policy.decide(candidates, conditions)
            let context = "round \(round): \(policy) \(conditions)"
            #expect(plan.decisions.count == candidates.count && plan.runningCount <= policy.concurrency, "\(context)")
            #expect(plan.runningCount == plan.decisions.filter { $0.runs }.count, "\(context)")
            if let cap = plan.cap {
                #expect(plan.totalRate! <= cap, "\(context)")
                #expect(plan.runningCount == 0 || plan.totalRate! == cap, "\(context)")
                #expect(plan.decisions.allSatisfy { !$0.runs || (Self.rate($0) ?? 0) >= 1 }, "\(context)")
            }
            for (candidate, decision) in zip(candidates, plan.decisions) where decision.runs {
                let background = candidate.priority >= .restore
                #expect(!(conditions.quietHeld && candidate.priority >= .prefetch), "\(context): \(candidate.id) runs while quiet")
                #expect(!background || window?.contains(second: conditions.secondOfDay) != false, "\(context): outside the window")
            }
            // Nothing that may run waits for a slot while a slot is free, or behind a later, lower-priority newcomer.
            let queued = candidates.indices.filter { plan.decisions[$0] == .wait(.queued) }
            #expect(queued.isEmpty || plan.runningCount == min(policy.concurrency, Int(plan.cap ?? .max)), "\(context)")
            for waiting in queued {
                for index in candidates.indices where plan.decisions[index].runs && !candidates[index].isRunning {
                    let (a, b) = (candidates[waiting], candidates[index])
                    #expect(a.isRunning || (b.priority.rank, b.sequence) <= (a.priority.rank, a.sequence), "\(context)")
                }
            }
        }
    }
}

extension SplitMix {
    /// 0..<bound.
    mutating func next(_ bound: Int) -> Int { Int(self.next() % UInt64(max(1, bound))) }
}
