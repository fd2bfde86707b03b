import Foundation
import PackTestSupport
import Testing

@testable import PackDelivery

/// The ContentInfo.plist check after unpacking: every shape a pack can give it ends in an answer, never a hang, and
/// a broken plist is told apart from a process that could not read it.
@Suite(.timeLimit(.minutes(1)))
struct ContentInfoCheckTests {
    static let download = Download(
        id: "d-1", transactionID: "t-1", productIdentifier: "com.example.p", contentIdentifier: "c", contentVersion: "2",
        contentLength: 10, state: .active, phase: nil, progress: 0, timeRemaining: -1, pauseReason: nil, contentURL: nil,
        error: nil, url: URL(string: "http://127.0.0.1:9/p.zip")!, sha256: String(repeating: "0", count: 64),
        unpackedLength: nil, destination: .caches, bytesReceived: 0)

    static func plist(product: String, version: String) -> Data {
        Data(
            """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict><key>ContentVersion</key><string>\(version)</string>\
            <key>IAPProductIdentifier</key><string>\(product)</string></dict></plist>
            """.utf8)
    }

    /// The error code of the check on a staging folder that `make` filled, or nil when it passed.
    static func check(_ name: String, _ make: (URL) throws -> Void) throws -> PackDeliveryError.Code? {
        let staging = try Fixtures.temporaryDirectory("content-info-\(name)")
        try make(staging.appending(path: "ContentInfo.plist"))
        do {
            try Installer.checkContentInfo(in: staging, for: Self.download)
            return nil
        } catch {
            return error.code
        }
    }

    @Test func eachShapeOfThePlistEndsInAnAnswer() throws {
        #expect(try Self.check("none") { _ in } == nil, "a pack without one passes")
        #expect(try Self.check("good") { try Self.plist(product: "com.example.p", version: "2").write(to: $0) } == nil)
        #expect(
            try Self.check("other") { try Self.plist(product: "com.example.q", version: "2").write(to: $0) } == .contentInfoMismatch)
        #expect(try Self.check("garbage") { try Data("not a plist".utf8).write(to: $0) } == .contentInfoMismatch)
        #expect(
            try Self.check("folder") { try FileManager.default.createDirectory(at: $0, withIntermediateDirectories: false) }
                == .contentInfoMismatch, "a folder is a broken pack, not a disk error")
        #expect(try Self.check("fifo") { _ = mkfifo($0.path, 0o600) } == .contentInfoMismatch, "a FIFO never blocks")
        #expect(
            try Self.check("dangling") { try FileManager.default.createSymbolicLink(atPath: $0.path, withDestinationPath: "/nonexistent") }
                == .contentInfoMismatch)
        #expect(
            try Self.check("huge") { try Data(count: 2 << 20).write(to: $0) } == .contentInfoMismatch, "read up to 1 MiB, then refused")
    }
}
