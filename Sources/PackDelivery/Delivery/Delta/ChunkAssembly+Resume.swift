import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A first install gone on with after a kill, a power cut or a pause: what of the tree an earlier attempt left it can
/// keep (issue 43: a file cut short in the staging folder was installed as it was, the record counting its chunks).
extension ChunkAssembly {
    /// Whether the tree an earlier attempt left can be gone on with: each of the plan's files absent or a regular file
    /// (one longer than the index gives it cut back to its size: bytes past its end are no chunk's), each symlink there
    /// with the index's target. What is in the files is checked chunk by chunk (``stillInTree(_:plan:destinations:)``).
    func treeHoldsThePlan(_ plan: ChunkPlan) -> Bool {
        var info = stat()
        for build in plan.build {
            let entry = self.index.entries[build.number]
            let path = self.tree.appending(path: entry.path).path
            guard lstat(path, &info) == 0 else {
                if errno == ENOENT { continue }
                return false
            }
            guard (info.st_mode & S_IFMT) == S_IFREG else { return false }
            if Int64(info.st_size) > entry.size, truncate(path, off_t(entry.size)) != 0 { return false }
        }
        for link in plan.links {
            let entry = self.index.entries[link.number]
            var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = readlink(self.tree.appending(path: entry.path).path, &buffer, buffer.count)
            guard count > 0, Self.sha256(Array(buffer[..<count])) == entry.sha256?.lowercased() else { return false }
        }
        return true
    }

    /// The chunks of `recorded` whose bytes the tree's files still hold, at every place of each: read back and hashed.
    /// The record says a chunk was written and synced, not that its file stayed as it was written: a file cut short or
    /// changed in the staging folder since (by hand, by a disk that lost writes) loses its chunks there, which are
    /// fetched again rather than installed as they are.
    func stillInTree(_ recorded: Set<Int>, plan: ChunkPlan, destinations: Destinations) throws -> Set<Int> {
        var kept = Set<Int>()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        let hasher = SHA256Hasher()
        // One file open at a time: the chunks are read in the order of their first place, file by file.
        var open: (entry: Int, fd: Int32)?
        defer { if let open { close(open.fd) } }
        func holds(_ chunk: PackIndex.Chunk, entry: Int, offset: Int64) -> Bool {
            if open?.entry != entry {
                if let open { close(open.fd) }
                let fd = Glibc.open(
                    self.tree.appending(path: self.index.entries[entry].path).path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
                open = (entry, fd)
            }
            guard let fd = open?.fd, fd >= 0 else { return false }
            hasher.reset()
            var done: Int64 = 0
            while done < chunk.size {
                let count = pread(fd, buffer.baseAddress, Int(min(Int64(buffer.count), chunk.size - done)), off_t(offset + done))
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { return false }
                hasher.update(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
                done += Int64(count)
            }
            return hasher.hexDigest() == ChunkPlan.lowercase(chunk.sha256)
        }
        let order = recorded.compactMap { number in destinations.first(number).map { (number, $0) } }
            .sorted { ($0.1.entry, $0.1.offset) < ($1.1.entry, $1.1.offset) }
        for (number, first) in order {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            let chunk = plan.fetch[number]
            guard holds(chunk, entry: first.entry, offset: first.offset),
                destinations.copies(number).allSatisfy({ holds(chunk, entry: $0.entry, offset: $0.offset) })
            else { continue }
            kept.insert(number)
        }
        return kept
    }
}
