import CLinux
import Foundation

/// The folders PackDelivery uses: the state database, partial downloads, staging and installed content.
///
/// With a home folder (`--home DIR` or `PACKS_HOME`): `DIR/state.sqlite`, `DIR/Caches/`, `DIR/Documents/`.
/// Without one, the XDG base directories: `$XDG_STATE_HOME/packdelivery` for the state,
/// `$XDG_CACHE_HOME/packdelivery` for caches and `$XDG_DATA_HOME/packdelivery` for documents.
/// Inside each destination root: `<contentIdentifier>/` holds installed content (its `contentURL`),
/// `.packdelivery/downloads/<id>.pack` the downloaded archive, `.packdelivery/staging/<id>/` an unpack in progress.
public struct Home: Sendable, Hashable {
    /// Where `state.sqlite` lives (with its WAL and shared-memory files).
    public var stateFolder: URL
    /// The root for ``Destination/caches``: installed content and its downloads and staging.
    public var cachesFolder: URL
    /// The root for ``Destination/documents``: installed content and its downloads and staging.
    public var documentsFolder: URL

    /// Creates a home from three folders; nothing is created on disk until a ``DownloadQueue`` opens it.
    ///
    /// - Parameters:
    ///   - stateFolder: where `state.sqlite` goes.
    ///   - cachesFolder: the root for caches content.
    ///   - documentsFolder: the root for documents content.
    public init(stateFolder: URL, cachesFolder: URL, documentsFolder: URL) {
        self.stateFolder = stateFolder
        self.cachesFolder = cachesFolder
        self.documentsFolder = documentsFolder
    }

    /// Everything under one folder: the state in it, content in its `Caches/` and `Documents/`.
    ///
    /// - Parameter folder: the home folder (`--home DIR` or `PACKS_HOME`).
    public init(folder: URL) {
        self.init(stateFolder: folder, cachesFolder: folder.appending(path: "Caches"), documentsFolder: folder.appending(path: "Documents"))
    }

    /// The XDG base directories of the current user.
    ///
    /// A variable that is unset or not an absolute path falls back to its XDG default under `HOME`.
    /// - Parameter environment: where to read `HOME`, `XDG_STATE_HOME`, `XDG_CACHE_HOME` and `XDG_DATA_HOME`.
    /// - Returns: a home with a `packdelivery` folder in each base directory.
    public static func xdg(environment: [String: String] = ProcessInfo.processInfo.environment) -> Home {
        let home = URL(filePath: environment["HOME"] ?? NSHomeDirectory())
        func base(_ variable: String, _ fallback: String) -> URL {
            if let value = environment[variable], value.hasPrefix("/") { return URL(filePath: value) }
            return home.appending(path: fallback)
        }
        return Home(
            stateFolder: base("XDG_STATE_HOME", ".local/state").appending(path: "packdelivery"),
            cachesFolder: base("XDG_CACHE_HOME", ".cache").appending(path: "packdelivery"),
            documentsFolder: base("XDG_DATA_HOME", ".local/share").appending(path: "packdelivery"))
    }

    /// The state database, `state.sqlite` in ``stateFolder``.
    public var databaseURL: URL { self.stateFolder.appending(path: "state.sqlite") }
    /// Where versions before 0.2 kept one lock file per download; still reserved, so no install takes the name.
    var locksFolder: URL { self.stateFolder.appending(path: "locks") }

    /// The root folder of a destination.
    ///
    /// - Parameter destination: caches or documents.
    /// - Returns: ``cachesFolder`` or ``documentsFolder``.
    public func root(for destination: Destination) -> URL {
        switch destination {
        case .caches: self.cachesFolder
        case .documents: self.documentsFolder
        }
    }

    /// Folders and files the home uses for itself; no install may take them or a folder holding them.
    var reservedPaths: [URL] {
        [self.stateFolder, self.databaseURL, self.locksFolder, self.cachesFolder, self.documentsFolder]
            + Destination.allCases.flatMap { [self.workFolder(for: $0), self.root(for: $0).appending(path: BackupExclusion.tagName)] }
    }

    func workFolder(for destination: Destination) -> URL { self.root(for: destination).appending(path: ".packdelivery") }
    func archiveURL(for download: Download) -> URL {
        self.workFolder(for: download.destination).appending(path: "downloads/\(download.id).pack")
    }
    /// Where the pack's index is fetched beside the pack, for its files' digests: a file per attempt (`token`), so
    /// that a stopped attempt's never meets the next one's; removed once read.
    func indexURL(for download: Download, token: Int) -> URL {
        self.workFolder(for: download.destination).appending(path: "downloads/\(download.id).t\(token).index")
    }
    /// Where a delta update keeps the entries it fetched and builds the new version.
    func deltaURL(for download: Download) -> URL {
        self.workFolder(for: download.destination).appending(path: "downloads/\(download.id).delta")
    }
    func stagingURL(for download: Download) -> URL {
        self.workFolder(for: download.destination).appending(path: "staging/\(download.id)")
    }
    func contentURL(for download: Download) -> URL {
        self.root(for: download.destination).appending(path: download.contentIdentifier)
    }

    /// `mkdir -p`, with the errno of the step that failed.
    static func makeDirectories(_ url: URL) throws(PackDeliveryError) {
        var path = ""
        for component in url.standardizedFileURL.path.split(separator: "/") {
            path += "/" + component
            if mkdir(path, 0o755) != 0, errno != EEXIST {
                throw Installer.fileError("create the folder", path, errno)
            }
        }
    }

    /// Creates the folders, and marks both roots as re-downloadable for backup tools
    /// (a `CACHEDIR.TAG` and the `user.xdg.robots.backup` attribute).
    func prepare() throws(PackDeliveryError) {
        for folder in [self.stateFolder]
            + Destination.allCases.flatMap({
                [self.workFolder(for: $0).appending(path: "downloads"), self.workFolder(for: $0).appending(path: "staging")]
            })
        {
            try Self.makeDirectories(folder)
        }
        for destination in Destination.allCases {
            BackupExclusion.mark(folder: self.root(for: destination))
        }
    }
}

/// Marks folders as not for backup, the ways Linux backup tools understand.
enum BackupExclusion {
    static let tagName = "CACHEDIR.TAG"
    static let tagContents = """
        Signature: 8a477f597d28d172789f06886806bc55
        # This file is a cache directory tag created by PackDelivery.
        # Its content can be downloaded again; backup tools may skip this folder.
        # For information about cache directory tags, see https://bford.info/cachedir/

        """

    /// Sets `user.xdg.robots.backup=false` and, with `tag`, writes `CACHEDIR.TAG` (tar --exclude-caches, borg, restic); best effort.
    /// Installed content folders get only the attribute, so their files stay exactly the pack's.
    static func mark(folder: URL, tag writeTag: Bool = true) {
        let tag = folder.appending(path: Self.tagName)
        if writeTag, !FileManager.default.fileExists(atPath: tag.path) {
            try? Data(Self.tagContents.utf8).write(to: tag, options: .atomic)
        }
        _ = "false".withCString { value in setxattr(folder.path, "user.xdg.robots.backup", value, strlen(value), 0) }
    }
}
