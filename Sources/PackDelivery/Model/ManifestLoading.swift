import Foundation

extension LoadedManifest {
    /// Reads a manifest from an http(s) URL, a `file://` URL or a local path.
    ///
    /// - Parameters:
    ///   - location: a URL, or a path (relative paths start at the current directory).
    ///   - options: transfer options for fetching an http(s) manifest.
    /// - Returns: the checked manifest with the URL it was read from.
    /// - Throws: ``PackDeliveryError``: `badData` when it is missing, unreadable or invalid; `network` when the server fails.
    public static func load(_ location: String, options: TransferOptions = TransferOptions()) throws(PackDeliveryError) -> LoadedManifest {
        let url: URL
        if let parsed = URL(string: location), let scheme = parsed.scheme?.lowercased(), ["http", "https", "file"].contains(scheme) {
            url = parsed
        } else {
            url = URL(filePath: location, relativeTo: URL(filePath: FileManager.default.currentDirectoryPath, directoryHint: .isDirectory)).absoluteURL
        }
        let data: Data
        if url.isFileURL {
            guard let contents = FileManager.default.contents(atPath: url.path) else {
                let exists = FileManager.default.fileExists(atPath: url.path)
                throw PackDeliveryError(kind: .badData, message: "Cannot read the manifest \(url.path): \(exists ? "permission denied or not a file" : "no such file").",
                                        hint: "Pass the path or URL of a manifest.json (packs manifest DIR writes one).", subject: url.path)
            }
            data = contents
        } else {
            data = try Curl.fetch(url, options: options)
        }
        return try self.decode(data, from: url)
    }
}
