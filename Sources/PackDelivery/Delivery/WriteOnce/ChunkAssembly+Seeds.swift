import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

// A first install whose chunks were found in seed folders (``SeedFolders``): those are copied into the tree's files.
extension ChunkAssembly {
    /// Copies every chunk of `plan` found on this machine (a seed folder's) into its place in the tree's files, each
    /// checked against its SHA-256 as it is read; then syncs the files and their folders. Not recorded: a resume
    /// copies them again (or fetches them, when the seed is gone by then).
    ///
    /// - Throws: a retryable ``TransferFailure`` when a chunk cannot be read back as found (the seed changed or failed
    ///   since it was read): the attempt is planned afresh, the seed read again or dropped.
    func writeSeeded(_ plan: ChunkPlan) throws {
        var directories: Set<String> = [""]
        var folders: Set<String> = []
        var sources: [String: Int32] = [:]
        defer { for fd in sources.values { close(fd) } }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.copyBytes, alignment: 16)
        defer { buffer.deallocate() }
        let hasher = SHA256Hasher()
        for build in plan.build where build.pieces.contains(where: { if case .local = $0.source { true } else { false } }) {
            if self.isCancelled() { throw DeltaAssembly.Stopped() }
            let entry = self.index.entries[build.number]
            let fd = try self.openFile(build.number, directories: &directories, folders: &folders)
            defer { close(fd) }
            let target = self.tree.appending(path: entry.path)
            var offset: Int64 = 0
            for piece in build.pieces {
                defer { offset += piece.size }
                guard case .local(let local) = piece.source else { continue }
                guard
                    try self.copy(
                        piece, into: fd, at: offset, target: (target, entry.size), hashing: hasher, buffer: buffer, sources: &sources)
                else {
                    throw Self.tryAgain(
                        PackDeliveryError(
                            .contentDamaged,
                            message:
                                "A chunk of \(PackDeliveryError.printable(entry.path)) could not be read back from the seed file \(PackDeliveryError.printable(self.file(of: local).path)): it changed or failed since it was read.",
                            hint: "It is tried again; a seed that cannot be read is dropped and its chunks fetched.", subject: entry.path))
                }
            }
            guard Durability.syncData(fd) == 0 else { throw PackDeliveryError.io("sync", path: target.path, errno: errno) }
        }
        for folder in folders { try Durability.syncFolder(URL(filePath: folder)) }
    }
}
