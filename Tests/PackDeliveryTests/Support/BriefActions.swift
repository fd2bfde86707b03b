import Foundation

@testable import PackDelivery

/// The machine tests compare a transfer order by its token and its plan: the source, validator and credentials it
/// also carries are checked by the tests about those (`SourceFailoverMachineTests`, `DeliveryPlanTests`).
extension TransferOrder {
    static let briefSource = URL(string: "brief:")!

    /// The order with only its token and plan kept.
    var brief: TransferOrder {
        TransferOrder(token: self.token, plan: self.plan, source: Self.briefSource, validator: nil, credentialsRefused: false)
    }
}

extension DownloadMachine.Action {
    /// A whole-pack transfer, as ``brief`` keeps it (from the first byte when `fromZero`).
    static func startTransfer(token: Int, fromZero: Bool) -> Self {
        .startTransfer(
            TransferOrder(
                token: token, plan: .wholePack(fromZero: fromZero), source: TransferOrder.briefSource, validator: nil,
                credentialsRefused: false))
    }

    /// The action with a transfer order's source, validator and credentials left out.
    var brief: Self {
        if case .startTransfer(let order) = self { return .startTransfer(order.brief) }
        return self
    }
}

extension QueueMachine.Action {
    var brief: Self {
        if case .run(let id, let action) = self { return .run(id: id, action.brief) }
        return self
    }
}

extension Array where Element == DownloadMachine.Action {
    /// Each action ``DownloadMachine/Action/brief``.
    var brief: [Element] { self.map(\.brief) }
}

extension Array where Element == QueueMachine.Action {
    /// Each action ``QueueMachine/Action/brief``.
    var brief: [Element] { self.map(\.brief) }
}
