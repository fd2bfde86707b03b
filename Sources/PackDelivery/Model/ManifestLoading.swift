import Foundation

extension LoadedManifest {
    /// Reads a manifest from an http(s) URL, a `file://` URL or a local path.
    ///
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching an http(s) manifest.
    /// - Returns: the checked manifest with the URL it was read from.
    /// - Throws: ``PackDeliveryError``: `invalidManifest` when it is missing, unreadable or invalid; a network code when the server fails.
    public static func load(_ location: String, options: TransferOptions = TransferOptions()) throws(PackDeliveryError) -> LoadedManifest {
        let url: URL
        if let parsed = URL(string: location), let scheme = parsed.scheme?.lowercased(), ["http", "https", "file"].contains(scheme) {
            url = parsed
        } else {
            url = URL(filePath: location, relativeTo: URL(filePath: FileManager.default.currentDirectoryPath, directoryHint: .isDirectory)).absoluteURL
        }
        let data: Data
        if url.isFileURL {
            data = try Self.readLocal(url.path)
        } else {
            data = try Curl.fetch(url, options: options)
        }
        return try self.decode(data, from: url)
    }

    /// The largest manifest read.
    static let maxBytes = 64 << 20

    /// Reads a local manifest: a regular file (never a FIFO or device, which could block forever) of at most 64 MiB.
    static func readLocal(_ path: String) throws(PackDeliveryError) -> Data {
        let shown = PackDeliveryError.printable(path)
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            let why = code == ENOENT ? "no such file" : String(cString: strerror(code))
            throw PackDeliveryError(code == EMFILE || code == ENFILE ? .tooManyOpenFiles : .invalidManifest,
                                    message: "Cannot read the manifest \(shown): \(why).",
                                    hint: "Pass the path or URL of a manifest.json.", subject: path, underlying: .init(.errno, Int(code)))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            throw PackDeliveryError(.invalidManifest, message: "Cannot read the manifest \(shown): it is not a regular file.",
                                    hint: "Pass the path or URL of a manifest.json.", subject: path)
        }
        guard info.st_size <= Self.maxBytes else {
            throw PackDeliveryError(.invalidManifest, message: "The manifest \(shown) is larger than \(Self.maxBytes) bytes, too large for a manifest.", subject: path)
        }
        var data = Data(count: Int(info.st_size))
        var done = 0
        while done < data.count {
            let got = data.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done)) }
            if got < 0, errno == EINTR { continue }
            guard got > 0 else {
                let code = got < 0 ? errno : EIO
                throw PackDeliveryError(.invalidManifest, message: "Cannot read the manifest \(shown): \(String(cString: strerror(code))).",
                                        subject: path, underlying: .init(.errno, Int(code)))
            }
            done += got
        }
        return data
    }
}
