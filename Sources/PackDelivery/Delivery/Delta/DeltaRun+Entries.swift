import CLinux
import Foundation
import Synchronization

// A zip updated entry by entry (``DeltaPlan``, ``DeltaAssembly``).
extension DeltaRun {
    /// A zip pack's update, entry by entry.
    func run(_ plan: DeltaPlan) throws -> (TransferOutcome, DeltaTree?) {
        do {
            try self.prepareFolder()
            let tail = try self.readDirectory()
            try DeltaPlan.check(self.index, against: self.directory)
            if let refusal = try DeltaPlan.reusedMismatch(
                plan, index: self.index, directory: self.directory, crcOfInstalled: self.installedCRC)
            {
                throw refusal
            }
            let assembly = self.assembly()
            var missing = plan.fetch.filter { !FileManager.default.fileExists(atPath: assembly.entryFile($0).path) }
            let kept =
                plan.fetch.filter { !missing.contains($0) }.reduce(Int64(0)) { $0 + self.index.entries[$1].length }
                + DeltaPlan.coalesce(missing, in: self.index).reduce(Int64(0)) {
                    $0 + min(Self.size(self.rangeFile($1)), $1.end - $1.start)
                }
            // The directory's bytes count as fetched: they were, in this attempt or an earlier one.
            self.total = plan.bytesToFetch + tail.bytes
            self.fetched = min(kept + tail.bytes, self.total)
            self.onEvent(
                .deltaPlanned(
                    id: self.request.id,
                    delta: Download.Delta(
                        bytesToFetch: self.total, bytesReused: plan.bytesReused, entriesToFetch: plan.fetch.count,
                        filesReused: plan.reuse.count, bytesKept: kept + (tail.kept ? tail.bytes : 0),
                        bytesFetched: self.fetched)))
            try self.awaitGoAhead()
            self.report(self.fetched, force: true)
            var refetched = Set<Int>()
            var verified: [Int: InstalledFile] = [:]
            while true {
                // Bytes of partial range files are counted in `fetched` already; each range adds what it fetches.
                self.fetched -= DeltaPlan.coalesce(missing, in: self.index).reduce(Int64(0)) {
                    $0 + min(Self.size(self.rangeFile($1)), $1.end - $1.start)
                }
                for range in DeltaPlan.coalesce(missing, in: self.index) {
                    try self.fetch(range)
                    try assembly.keep(range, from: self.rangeFile(range))
                }
                var bad: [Int] = []
                for number in plan.fetch where verified[number] == nil {
                    if self.stopped { throw Stop() }
                    if let file = try assembly.verify(number) { verified[number] = file } else { bad.append(number) }
                }
                if bad.isEmpty { break }
                if let twice = bad.first(where: { refetched.contains($0) }) {
                    let entry = self.index.entries[twice]
                    throw PackDeliveryError(
                        .checksumMismatch,
                        message:
                            "The entry \(PackDeliveryError.printable(entry.path)) of the pack \(self.request.download.contentIdentifier) does not match the SHA-256 its index gives, twice.",
                        hint:
                            "Nothing was installed and the installed version is untouched; the pack on the server does not match its index.",
                        subject: entry.path)
                }
                refetched.formUnion(bad)
                missing = bad
                // Fetched again: the progress total grows by what is fetched twice.
                self.total += bad.reduce(0) { $0 + self.index.entries[$1].length }
            }
            if self.stopped { throw Stop() }
            let tree = try assembly.assemble(plan, fetched: verified)
            return (.assembled(fetched: self.fetched), tree)
        }
    }
}
