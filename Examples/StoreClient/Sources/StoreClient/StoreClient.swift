// The delivery half of a store client, as a small program:
//
//     StoreClient --home DIR MANIFEST_URL [PRODUCT_ID...] [--leave-open] [--play PACK_ID]
//
// At launch it opens the queue and registers its main-actor view model (purchases an earlier run left
// open are delivered to it again); then, for each product, it adds a purchase, shows that finishing
// is refused while the download runs (matched by the error's code), awaits the delivery with one call, and
// finishes it once its content is in place — unless --leave-open, which leaves them for the next run.
// With --play, the player then opens the level of an on-demand pack: it is fetched now, if it is not installed,
// and held (a lease) until the level closes, here when standard input ends.
// The article "Embedding PackDelivery in a Store Client" walks through the same steps.

import Foundation
import PackDelivery

@main
struct StoreClient {
    static func main() async {
        var arguments = Array(CommandLine.arguments.dropFirst())
        let leaveOpen = arguments.contains("--leave-open")
        arguments.removeAll { $0 == "--leave-open" }
        var level: String?
        if let index = arguments.firstIndex(of: "--play"), index + 1 < arguments.count {
            level = arguments[index + 1]
            arguments.removeSubrange(index...index + 1)
        }
        guard arguments.count >= 3, arguments[0] == "--home" else {
            print("usage: StoreClient --home DIR MANIFEST_URL [PRODUCT_ID...] [--leave-open] [--play PACK_ID]")
            exit(64)
        }
        let home = Home(folder: URL(filePath: arguments[1]))
        let manifestLocation = arguments[2]
        let products = Array(arguments[3...])
        do throws(PackDeliveryError) {
            exit(
                try await Self.run(home: home, manifestLocation: manifestLocation, products: products, leaveOpen: leaveOpen, level: level))
        } catch {
            // Errors are matched by code; the message is for people.
            print("error \(error.code): \(error.message)")
            exit(1)
        }
    }

    @MainActor static func run(
        home: Home, manifestLocation: String, products: [String], leaveOpen: Bool, level: String? = nil
    ) async throws(PackDeliveryError) -> Int32 {
        // 1. At launch: open the queue without blocking the main actor, and register the observer at once.
        let queue = try await DownloadQueue.open(home: home)
        let model = ShopModel()
        queue.add(model)
        let manifest = try await LoadedManifest.load(manifestLocation)

        // 2. Purchases an earlier run left open are delivered again: finish them once their content is in place. One
        //    that another process is delivering right now (a `packs fetch`, another instance) is followed as it runs:
        //    its progress reaches the view model like this process's own.
        for transaction in try await queue.transactions() {
            print("redelivered \(transaction.id) \(transaction.productIdentifier)")
            let delivered = try await queue.delivered(transactionID: transaction.id)
            if !leaveOpen { try await queue.finish(delivered.id) }
        }

        // 3. An error an app handles is matched by its code; the do ends with a plain catch, as the docs' do.
        do {
            try await queue.add(product: "com.example.not-for-sale", from: manifest)
        } catch  where error.code == .unknownProduct {
            print("matched \(error.code)")
        } catch {
            throw error
        }

        var allInstalled = true
        for product in products {
            let transaction = try await queue.add(product: product, from: manifest, kind: .purchased)
            // 4. Finishing before the content is in place is refused, with the pending downloads named.
            do {
                if transaction.downloads.contains(where: { !$0.state.isSettled }) { try await queue.finish(transaction.id) }
            } catch  where error.code == .finishRefused {
                print("refused \(error.code) \(error.pendingDownloadIDs.joined(separator: " "))")
            } catch {
                throw error
            }
            // 5. One await for the whole purchase, through pauses; cancelling this task would stop the wait, not the download.
            do {
                let delivered = try await queue.delivered(transactionID: transaction.id)
                for download in delivered.downloads { print("settled \(download.contentIdentifier) \(download.state.rawValue)") }
                print("delivered \(delivered.id) \(product)")
                if !leaveOpen {
                    try await queue.finish(delivered.id)
                    print("finished \(delivered.id) \(product)")
                }
                if let folder = queue.contentURL(forProductID: product) { print("content \(product) \(folder.path)") }
            } catch  where error.code == .cancelled && error.subject == transaction.id {
                // Cancelled (by the user, from another process): nothing more will be delivered for it.
                print("cancelled \(transaction.id) \(product)")
                try await queue.finish(transaction.id)
                allInstalled = false
            } catch {
                // Failed for good: a store would offer queue.resume([id]), which continues from the bytes kept.
                print("failed \(product) \(error.code): \(error.message)")
                allInstalled = false
            }
        }
        if let level { try await Self.play(level: level, queue: queue) }
        await queue.close()
        return allInstalled ? 0 : 1
    }

    /// 6. The player opens a level whose pack is on demand (`"delivery": "onDemand"`): nothing of it was fetched with the
    ///    purchase. Hold it with a lease first, so that no process evicts it between its install and its use; then
    ///    make it available (one query when it is installed; otherwise it is fetched ahead of everything else, its
    ///    progress reaching the view model like any download's). End the lease when the level closes.
    @MainActor static func play(level: String, queue: DownloadQueue) async throws(PackDeliveryError) {
        let lease = try queue.beginAccessing(contentIdentifiers: [level])
        let folders = try await queue.ensureAvailable(contentIDs: [level])
        print("level open \(level) \(folders[0].path)")
        // The level plays until the player closes it: here, until standard input ends (read off the main actor, which
        // stays free for the view model). Were the process to exit first, its lease would end with it.
        await Task.detached { while readLine() != nil {} }.value
        try queue.endAccessing(lease)
        print("level closed \(level)")
    }
}
