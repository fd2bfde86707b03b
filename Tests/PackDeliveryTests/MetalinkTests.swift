import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// A Metalink 4 file (RFC 5854) of one pack as a manifest source (issue 32): its size, sha-256 and URLs, lowest
/// priority first, make a manifest of one pack with several sources; anything else is refused by code.
@Suite(.serialized, .timeLimit(.minutes(2))) struct MetalinkTests {
    /// A `.meta4` document with the given `<file>` bodies.
    static func document(_ files: [String], prefix: String = "") -> String {
        """
        <?xml version="1.0" encoding="UTF-8"?>
        \(prefix)<metalink xmlns="urn:ietf:params:xml:ns:metalink">
          <generator>aria2-style/1.0</generator>
        \(files.joined(separator: "\n"))
        </metalink>
        """
    }

    static func write(_ text: String, _ label: String, in folder: URL? = nil) throws -> URL {
        let file = try (folder ?? Fixtures.temporaryDirectory(label)).appending(path: "pack.meta4")
        try text.write(to: file, atomically: true, encoding: .utf8)
        return file
    }

    /// The pack (its `<identity>` and `<version>` those of its ContentInfo.plist) served by a 404 mirror (priority 1,
    /// listed second) and by nginx (priority 2), the .meta4 itself served by nginx: `packs fetch URL.meta4` tries the priority-1 URL first, then installs the pack from nginx; a piece's hash and a `<metaurl>` are passed over.
    @Test func aMeta4OfOnePackIsFetchedFromItsURLsLowestPriorityFirst() throws {
        let site = try TestSite.random("meta4-fetch", size: 1 << 20)
        let faults = try FaultServer(root: site.folder)
        defer { faults.stop() }
        let nginx = try NginxServer(root: site.folder)
        defer { nginx.stop() }
        let size = try site.packSize()
        let sha256 = try Fixtures.sha256Hex(of: site.folder.appending(path: "big.tar"))
        let file = try Self.write(
            Self.document([
                """
                  <file name="big.tar">
                    <identity>com.example.big</identity>
                    <version>1.0</version>
                    <size>\(size)</size>
                    <hash type="sha-1">0000000000000000000000000000000000000000</hash>
                    <hash type="sha-256">\(sha256.uppercased())</hash>
                    <pieces length="262144" type="sha-256"><hash>\(String(repeating: "0", count: 64))</hash></pieces>
                    <metaurl mediatype="torrent" priority="1">http://127.0.0.1:1/big.tar.torrent</metaurl>
                    <url priority="2">http://127.0.0.1:\(nginx.port)/big.tar</url>
                    <url priority="1">\(faults.url("big.tar", fault: .status(404, times: 1000, retryAfter: nil)).absoluteString)</url>
                    <url>ftp://127.0.0.1/big.tar</url>
                  </file>
                """
            ]), "meta4-fetch-file", in: site.folder)
        // Read over http, from nginx, as a user would be given it.
        let served = "http://127.0.0.1:\(nginx.port)/\(file.lastPathComponent)"
        let loaded = try LoadedManifest.load(served)
        let content = try #require(loaded.manifest.products.first?.contents.first)
        #expect(loaded.manifest.products.map(\.productIdentifier) == ["com.example.big"] && content.contentVersion == "1.0")
        #expect(content.contentLength == Int64(size) && content.sha256 == sha256.lowercased())
        #expect(
            try loaded.packURLs(for: content).map(\.port) == [faults.port, nginx.port], "priority 1 first, ftp and the metaurl passed over")
        let home = try Fixtures.temporaryDirectory("meta4-fetch-home")
        let fetched = try CLI.run(home: home, ["--json", "fetch", served, "com.example.big"])
        #expect(fetched.status == 0, "\(fetched.stderr)")
        #expect(faults.requests().filter { $0.file == "big.tar" }.count == 1, "the priority-1 URL was tried first")
        #expect(nginx.bodyBytesSent(path: "/big.tar") == size, "nginx served the pack")
        let shown = try CLI.run(home: home, ["--json", "content"])
        let path = try #require(shown.events.first?["contentURL"] as? String)
        #expect(try Fixtures.sha256Hex(of: URL(filePath: path).appending(path: "Contents/data.bin")) == site.dataSHA256)
    }

    /// Two files, no sha-256, no size, no http(s) URL, a document type declaration (entities): each refused with
    /// `invalidManifest`, saying why.
    @Test(arguments: ["two files", "no sha-256", "no size", "no http", "entities"])
    func aHostileOrIncompleteMeta4IsRefused(_ kind: String) throws {
        let sha = String(repeating: "ab", count: 32)
        func file(_ name: String = "a.tar", size: String? = "10", hash: String? = sha, url: String = "https://a.example/a.tar") -> String {
            """
              <file name="\(name)">
                \(size.map { "<size>\($0)</size>" } ?? "")
                \(hash.map { "<hash type=\"sha-256\">\($0)</hash>" } ?? "<hash type=\"sha-1\">\(String(repeating: "0", count: 40))</hash>")
                <url priority="1">\(url)</url>
              </file>
            """
        }
        let (text, why): (String, String) =
            switch kind {
            case "two files": (Self.document([file(), file("b.tar")]), "2 files")
            case "no sha-256": (Self.document([file(hash: nil)]), "no sha-256")
            case "no size": (Self.document([file(size: nil)]), "no <size>")
            case "no http": (Self.document([file(url: "ftp://a.example/a.tar")]), "no http(s)")
            default:
                (
                    Self.document(
                        [file("&lol;")],
                        prefix: "<!DOCTYPE metalink [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;\">]>\n"),
                    "document type declaration"
                )
            }
        let path = try Self.write(text, "meta4-refused").path
        #expect {
            try LoadedManifest.load(path)
        } throws: {
            guard let error = $0 as? PackDeliveryError else { return false }
            return error.code == .invalidManifest && error.message.contains(why)
        }
    }
}
