import Foundation

extension MachinePolicy {
    /// The rate of each running download, so that they sum to the cap exactly.
    ///
    /// User-initiated downloads together get at least half (rounded up, and at least 1 byte per second each), or
    /// what they measurably use when every one of them is measured below it; the others get the rest, or what they
    /// measurably use. Within a group, max-min fairness over the demands (``demand(_:)``). What no demand took is
    /// spread evenly over every running download.
    ///
    /// - Parameters:
    ///   - cap: the rate cap, at least `running.count`.
    ///   - running: the admitted downloads.
    /// - Returns: one rate per running download, each at least 1, summing to `cap`.
    static func shares(of cap: Int64, among running: [Candidate]) -> [Int64] {
        guard !running.isEmpty else { return [] }
        let demands = running.map(Self.demand)
        var rates = [Int64](repeating: 0, count: running.count)
        func fill(_ group: [Int], _ budget: Int64) -> Int64 {
            let given = Self.waterFill(budget, group.map { demands[$0] })
            for (position, index) in group.enumerated() { rates[index] = given[position] }
            return given.reduce(0, +)
        }
        let user = running.indices.filter { running[$0].priority == .userInitiated }
        let others = running.indices.filter { running[$0].priority != .userInitiated }
        if user.isEmpty || others.isEmpty {
            _ = fill(Array(running.indices), cap)
        } else {
            let userFloor = min(max((cap + 1) / 2, Int64(user.count)), cap - Int64(others.count))
            let othersDemand = Self.total(others.map { demands[$0] })
            let othersUse = max(Int64(others.count), min(othersDemand ?? .max, cap - userFloor))
            let userUsed = fill(user, cap - othersUse)
            _ = fill(others, cap - userUsed)
        }
        let left = cap - rates.reduce(0, +)
        if left > 0 {
            let count = Int64(rates.count)
            for index in rates.indices { rates[index] += left / count + (Int64(index) < left % count ? 1 : 0) }
        }
        return rates
    }

    /// What a running download can use: its measured rate plus a quarter (room to grow), at least 1; nil when unknown
    /// (it may use anything).
    static func demand(_ candidate: Candidate) -> Int64? {
        guard let rate = candidate.bytesPerSecond, rate.isFinite, rate >= 0 else { return nil }
        let wanted = (rate * 1.25).rounded(.up)
        guard wanted < 9.0e18 else { return nil }
        return max(1, Int64(wanted))
    }

    /// Max-min fair shares of a budget: demands below the fair share get what they ask, the rest split what is left
    /// evenly (the first ones a byte more when it does not divide).
    ///
    /// - Parameters:
    ///   - budget: bytes per second to share, at least `demands.count`.
    ///   - demands: each one's demand, nil for unbounded.
    /// - Returns: the shares, in the demands' order; they sum to the budget unless every demand is met below it.
    static func waterFill(_ budget: Int64, _ demands: [Int64?]) -> [Int64] {
        let order = demands.indices.sorted { (demands[$0] ?? .max, $0) < (demands[$1] ?? .max, $1) }
        var given = [Int64](repeating: 0, count: demands.count)
        var remaining = budget
        for (position, index) in order.enumerated() {
            let left = Int64(order.count - position)
            if let demand = demands[index], demand <= remaining / left {
                given[index] = demand
                remaining -= demand
                continue
            }
            for (offset, rest) in order[position...].enumerated() {
                given[rest] = remaining / left + (Int64(offset) < remaining % left ? 1 : 0)
            }
            return given
        }
        return given
    }

    /// The sum of demands, saturating; nil when one is unbounded.
    private static func total(_ demands: [Int64?]) -> Int64? {
        var sum: Int64 = 0
        for demand in demands {
            guard let demand else { return nil }
            let (next, overflow) = sum.addingReportingOverflow(demand)
            sum = overflow ? .max : next
        }
        return sum
    }
}
