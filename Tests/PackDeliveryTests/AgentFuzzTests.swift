import Foundation
import PackTestSupport
import Testing

/// schemathesis (PyPI) fuzzes the real agent over its socket (`scripts/fuzz-agent`): no 5xx, every answer matches
/// agent-openapi.yaml, and afterwards the agent still answers and the home's store and installed pack are intact.
/// The agent runs as nobody: a generated home path outside the test's folder finds nothing it may write.
@Suite(.serialized, .timeLimit(.minutes(10))) struct AgentFuzzTests {
    @Test func schemathesisFindsNoServerErrorAndTheStoreStaysIntact() throws {
        guard getuid() == 0 else {
            Issue.record("this test runs the agent as nobody with setpriv and needs root")
            return
        }
        guard (try? Fixtures.run("python3", ["-c", "import schemathesis"], timeout: 60))?.status == 0 else {
            Issue.record("schemathesis is missing: scripts/install-deps installs it (pip install schemathesis)")
            return
        }
        let test = try AgentSite("agent-fuzz", size: 200_000, bytesPerSecond: nil)
        defer { test.remove() }
        let (folder, site, server, manifest) = (test.folder, test.site, test.server, test.manifest)
        try Data("{\"products\": [".utf8).write(to: site.folder.appending(path: "malformed.json"))
        // The pack installed in-process first; then the agent runs as nobody, so that whatever the fuzzer makes it
        // do can write only where nobody may (the fuzzer itself runs as root).
        let home = folder.appending(path: "home")
        let fetch = try CLI.run(home: home, ["fetch", manifest, "com.example.big"], timeout: 60)
        #expect(fetch.status == 0, "stderr: \(fetch.stderr)")
        let agent = try AgentProcess(folder: folder, user: "nobody")

        let fuzz = try Fixtures.run(
            CLI.packageRoot.appending(path: "scripts/fuzz-agent").path,
            [
                "--socket", agent.socket, "--home", home.path, "--manifest", manifest, "--manifest",
                server.url("malformed.json").absoluteString, "--product", "com.example.big", "--client-version",
                AgentProcess.clientVersion, "--examples", "25", "--as-user", "nobody",
            ], timeout: 420)
        #expect(fuzz.status == 0, "schemathesis found something:\n\(fuzz.stdout.suffix(6000))\n\(fuzz.stderr.suffix(2000))")
        // "Test cases:" then "  N generated, …": the fuzz reached the agent with many requests.
        let generated = fuzz.stdout.split(separator: "\n").last { $0.contains(" generated, ") }
            .flatMap { Int($0.trimmingCharacters(in: .whitespaces).prefix { $0.isNumber }) }
        #expect((generated ?? 0) >= 200, "schemathesis ran: \(fuzz.stdout.suffix(2000))")
        let agentLog = agent.log
        #expect(agentLog.contains("Serving a home"), "the fuzz's requests reached the agent: \(agentLog.suffix(2000))")

        #expect(try agent.request("GET", "/v1/version").status == 200, "the agent still answers; log: \(agent.log.suffix(3000))")
        #expect(try agent.stop() == 0, "a clean stop after the fuzz; log: \(agent.log.suffix(3000))")
        let integrity = try Fixtures.run("sqlite3", [home.appending(path: "state.sqlite").path, "PRAGMA integrity_check;"], timeout: 30)
        #expect(integrity.stdout == "ok\n", "\(integrity.stdout)\(integrity.stderr)")
        let status = try CLI.run(home: home, ["--json", "status"], timeout: 30)
        #expect(status.status == 0, "the store reads back: \(status.stderr)")
        // The fuzz may evict (gc) or fetch the pack again; what is installed verifies.
        let verify = try CLI.run(home: home, ["verify"], timeout: 60)
        #expect(verify.status == 0, "\(verify.stdout)\(verify.stderr)")
    }
}
