import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// `packs serve --metrics-address`: the real binary, real HTTP with curl, the metrics scraped from their own
/// listener after known requests and compared with what the clients saw; and `/healthz` on the content port,
/// answered without credentials where everything else needs them.
@Suite(.serialized, .timeLimit(.minutes(2))) struct MetricsTests {
    /// The samples' site, with a store key for receipts.
    struct Store {
        let site: TestSite
        let key: PublisherSigningKey
        let publicKeyPath: String

        init(_ label: String) async throws {
            self.site = try TestSite.samples(label + "-site")
            let keys = try Fixtures.temporaryDirectory(label + "-keys")
            let keygen = try await Fixtures.runAsync(CLI.binary, ["keygen", keys.appending(path: "store").path])
            #expect(keygen.status == 0, "\(keygen.stderr)")
            self.key = try PublisherSigningKey(pem: String(contentsOf: keys.appending(path: "store.key"), encoding: .utf8))
            self.publicKeyPath = keys.appending(path: "store.pub").path
        }
    }

    /// `name{labels} value` lines of a Prometheus text page, by `name{labels}`.
    static func samples(_ text: String) -> [String: Double] {
        var samples: [String: Double] = [:]
        for line in text.split(whereSeparator: \.isNewline) where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            samples[String(line[..<space])] = value
        }
        return samples
    }

    /// GET http://127.0.0.1:`port`/metrics with curl: its status and samples.
    static func scrape(_ port: Int) async throws -> (status: Int, type: String?, samples: [String: Double], text: String) {
        let result = try await curl("http://127.0.0.1:\(port)/metrics")
        let text = String(decoding: result.body, as: UTF8.self)
        return (result.status, result.header("content-type"), Self.samples(text), text)
    }

    /// Scrapes until `condition` holds (the server counts a request once its last byte is written, a moment
    /// after curl has it), or for 10 s; the last samples either way.
    static func scrape(_ port: Int, until condition: ([String: Double]) -> Bool) async throws -> (samples: [String: Double], text: String) {
        var last: (samples: [String: Double], text: String) = ([:], "")
        for _ in 0..<100 {
            let scraped = try await Self.scrape(port)
            last = (scraped.samples, scraped.text)
            if condition(scraped.samples) { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        return last
    }

    @Test func countersAfterAWholeFileARangeA404AndHealthz() async throws {
        let site = try TestSite.samples("metrics-files")
        let server = try PackServeProcess(binary: CLI.binary, [site.folder.path, "--metrics-address", "127.0.0.1:0"])
        let metricsPort = try #require(server.metricsPort, "packs serve did not print where its metrics are")
        let base = server.baseURL.absoluteString
        let whole = try await curl(base + "forest.tar.gz")
        let range = try await curl(base + "ocean.tar.xz", ["-H", "Range: bytes=0-99"])
        let missing = try await curl(base + "nothing-here.zip")
        let health = try await curl(base + "healthz")
        #expect(whole.status == 200 && range.status == 206 && missing.status == 404 && health.status == 200)
        #expect(range.body.count == 100 && String(decoding: health.body, as: UTF8.self) == "ok\n")
        let sent = whole.body.count + range.body.count + missing.body.count + health.body.count

        let requests = "packs_http_requests_total"
        let (samples, text) = try await Self.scrape(metricsPort) {
            ($0["packs_http_sent_bytes_total"] ?? 0) >= Double(sent) && ($0[#"\#(requests){route="healthz",status="200"}"#] ?? 0) >= 1
        }
        // Exactly the requests made, each under its route and status.
        let counted = samples.filter { $0.key.hasPrefix(requests + "{") }
        #expect(
            counted == [
                #"\#(requests){route="file",status="200"}"#: 1, #"\#(requests){route="file",status="206"}"#: 1,
                #"\#(requests){route="file",status="404"}"#: 1, #"\#(requests){route="healthz",status="200"}"#: 1,
            ], "\(text)")
        #expect(
            samples.filter { $0.key.hasPrefix("packs_http_range_requests_total") } == [#"packs_http_range_requests_total{status="206"}"#: 1]
        )
        // The body bytes curl received, no more and no less.
        #expect(samples["packs_http_sent_bytes_total"] == Double(sent), "\(text)")
        #expect(samples[#"packs_http_request_duration_seconds_count{route="file"}"#] == 3, "\(text)")
        #expect(samples[#"packs_http_request_duration_seconds_count{route="healthz"}"#] == 1, "\(text)")
        #expect(samples[#"packs_http_request_duration_seconds_bucket{route="file",le="+Inf"}"#] == 3, "\(text)")
        #expect(samples.keys.contains { $0.hasPrefix("packs_auth_refusals_total") } == false)

        // Active connections: one held open counts, and none once it closes.
        let held = try RawConnection(port: server.port)
        held.send("GET /manifest.json HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let open = try await Self.scrape(metricsPort) { $0["packs_http_connections_active"] == 1 }
        #expect(open.samples["packs_http_connections_active"] == 1, "\(open.text)")
        // Open descriptors, counted in /proc/self/fd at scrape time: the process's own count, give or take the
        // connections coming and going around the scrape.
        let descriptors = try #require(open.samples["process_open_fds"])
        #expect(abs(descriptors - Double(server.openDescriptors)) <= 4, "\(descriptors) vs \(server.openDescriptors)")
        #expect((open.samples["process_max_fds"] ?? 0) >= descriptors)
        withExtendedLifetime(held) {}
        held.shutdownWrite()
        _ = held.readToEnd()
        let closed = try await Self.scrape(metricsPort) { $0["packs_http_connections_active"] == 0 }
        #expect(closed.samples["packs_http_connections_active"] == 0, "\(closed.text)")
        #expect(closed.samples[#"\#(requests){route="catalog",status="200"}"#] == 1, "\(closed.text)")

        // The page is Prometheus's text format.
        let page = try await Self.scrape(metricsPort)
        #expect(page.status == 200 && page.type?.hasPrefix("text/plain; version=0.0.4") == true)
        #expect(page.text.contains("# TYPE packs_http_requests_total counter"))
        #expect(page.text.contains("# TYPE packs_http_request_duration_seconds histogram"))
        // And it is not on the content port.
        #expect(try await curl(base + "metrics").status == 404)
        server.stop()
    }

    @Test func receiptRefusalsAreCountedByReason() async throws {
        let store = try await Store("metrics-receipts")
        let server = try PackServeProcess(
            binary: CLI.binary, [store.site.folder.path, "--receipt-key", store.publicKeyPath, "--metrics-address", "127.0.0.1:0"])
        let metricsPort = try #require(server.metricsPort)
        let base = server.baseURL.absoluteString
        let forest = try Receipt.issue(products: ["com.example.forest"], subject: "user-42", lifetime: 3600, key: store.key)
        let forged = try Receipt.issue(
            products: ["com.example.forest"], subject: "user-42", lifetime: 3600, key: PublisherSigningKey.generate())
        let codes = [
            try await curl(base + "forest.tar.gz").status,
            try await curl(base + "ocean.tar.xz", ["-H", "Authorization: Bearer \(forest)"]).status,
            try await curl(base + "forest.tar.gz", ["-H", "Authorization: Bearer \(forged)"]).status,
            try await curl(base + "forest.tar.gz", ["-H", "Authorization: Bearer \(forest)"]).status,
            try await curl(base + "forest.tar.gz", ["-H", "Authorization: Bearer \(forest)", "-H", "Range: bytes=10-19"]).status,
        ]
        #expect(codes == [401, 403, 401, 200, 206])

        let requests = "packs_http_requests_total"
        let (samples, text) = try await Self.scrape(metricsPort) { ($0[#"\#(requests){route="file",status="206"}"#] ?? 0) >= 1 }
        #expect(
            samples.filter { $0.key.hasPrefix("packs_auth_refusals_total") } == [
                #"packs_auth_refusals_total{reason="no_credential"}"#: 1,
                #"packs_auth_refusals_total{reason="other_product"}"#: 1,
                #"packs_auth_refusals_total{reason="signature"}"#: 1,
            ], "\(text)")
        #expect(
            samples.filter { $0.key.hasPrefix(requests + "{") } == [
                #"\#(requests){route="file",status="401"}"#: 2, #"\#(requests){route="file",status="403"}"#: 1,
                #"\#(requests){route="file",status="200"}"#: 1, #"\#(requests){route="file",status="206"}"#: 1,
            ], "\(text)")
        server.stop()
    }

    @Test func healthzAnswersWithoutCredentialsWhereContentNeedsThem() async throws {
        let store = try await Store("metrics-health")
        for extra in [[String](), ["--auth-only"]] {
            let server = try PackServeProcess(
                binary: CLI.binary, [store.site.folder.path, "--receipt-key", store.publicKeyPath] + extra)
            #expect(server.metricsPort == nil)
            let base = server.baseURL.absoluteString
            let health = try await curl(base + "healthz")
            #expect(health.status == 200 && String(decoding: health.body, as: UTF8.self) == "ok\n", "\(extra)")
            #expect(try await curl(base + "healthz", ["-I"]).status == 200, "\(extra)")
            // Everything else needs a receipt (the gate judges the original request named by X-Original-URI).
            let content = try await curl(base + "forest.tar.gz", ["-H", "X-Original-URI: /forest.tar.gz"])
            #expect(content.status == 401, "\(extra)")
            server.stop()
        }
    }
}
