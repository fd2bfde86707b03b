// A GUI app on Linux whose toolkit runs its own loop on the main thread (GTK's g_main_loop, an SDL or game loop):
// nothing serves the main dispatch queue, through which main-actor observers are called, unless the loop drains it.
// This program is such a loop. Each turn handles "the toolkit's events" (here: a short sleep), then drains the main
// queue with `RunLoop.main.run(mode:before:)`; in GTK, the same line goes in a `g_timeout_add(16, …)` callback.
//
//     ToolkitLoop --home DIR MANIFEST PRODUCT
//
// Prints how many main-actor callbacks arrived, whether all ran on the main thread, and exits 0 once the product is
// installed (1 after 60 s, or on an error).
import Foundation
import PackDelivery

/// The toolkit's view model: lives on the main actor, as its widgets do.
@MainActor final class LoopModel: DownloadQueueMainActorObserver {
    var callbacks = 0
    var allOnMainThread = true
    var finished: String?

    func downloadQueue(_ queue: DownloadQueue, updatedTransactions transactions: [Transaction]) { self.saw() }

    func downloadQueue(_ queue: DownloadQueue, updatedDownloads downloads: [Download]) {
        self.saw()
        if let done = downloads.first(where: { $0.state == .finished }) { self.finished = done.contentIdentifier }
    }

    private func saw() {
        self.callbacks += 1
        self.allOnMainThread = self.allOnMainThread && Thread.isMainThread
    }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count == 4, arguments[0] == "--home" else {
    FileHandle.standardError.write(Data("usage: ToolkitLoop --home DIR MANIFEST PRODUCT\n".utf8))
    exit(64)
}
let (home, manifestURL, product) = (URL(filePath: arguments[1]), arguments[2], arguments[3])

let model = LoopModel()
let queue: DownloadQueue
do {
    queue = try DownloadQueue(home: Home(folder: home))
} catch {
    print("error \(error.code)")
    exit(1)
}
queue.add(model)
// The purchase starts off the loop (loading a manifest is async); its callbacks come back through the main queue.
Task.detached {
    do throws(PackDeliveryError) {
        let manifest = try await LoadedManifest.load(manifestURL)
        _ = try await queue.add(product: product, from: manifest)
    } catch {
        print("error \(error.code)")
        exit(1)
    }
}

// The toolkit's loop.
let deadline = Date().addingTimeInterval(60)
while model.finished == nil, Date() < deadline {
    usleep(5_000)  // the toolkit's own events
    _ = RunLoop.main.run(mode: .default, before: Date())  // drains the main queue: main-actor callbacks run here
}
print("main-actor callbacks \(model.callbacks), all on the main thread: \(model.allOnMainThread ? "yes" : "no")")
guard let installed = model.finished else {
    print("not installed after 60 s")
    exit(1)
}
print("installed \(installed)")
queue.close()
exit(0)
