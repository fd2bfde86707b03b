import Foundation
import PackDelivery
import PackTestSupport
import Testing

/// The attacks TUF's client workflow stops, each against a repository python-tuf's `tuf.api.metadata` builds
/// (scripts/tuf-repo.py), served by nginx, through `packs tuf-client` (the real binary): a rollback of the snapshot
/// and of targets, a freeze with an expired snapshot or targets, mix-and-match, a terminating delegation, and an
/// attacker holding the online keys. Each refusal exits 1 naming the role, the version and the rule, and the
/// trusted metadata it would have replaced keeps its bytes.
@Suite(.timeLimit(.minutes(3))) struct TUFAttackTests {
    typealias Setup = TUFClientTests.Setup

    /// Refreshes after `attack` and expects a refusal whose message holds every one of `words`; the trusted metadata
    /// of `kept` roles keeps its bytes.
    func expectRefused(
        _ setup: Setup, after attack: String..., words: [String], kept: [String], sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let before = try setup.trusted()
        try Setup.script(setup.repository, attack[0], attack.count > 1 ? attack[1] : "")
        let refresh = try setup.refresh()
        #expect(refresh.status == 1, "\(refresh.stderr)", sourceLocation: sourceLocation)
        for word in words {
            #expect(refresh.stderr.contains(word), "\(word) in: \(refresh.stderr)", sourceLocation: sourceLocation)
        }
        let after = try setup.trusted()
        for role in kept {
            #expect(after[role + ".json"] == before[role + ".json"], "\(role).json kept", sourceLocation: sourceLocation)
        }
    }

    @Test func aTimestampNamingAnOlderSnapshotIsRefused() throws {
        let setup = try Setup("tuf-old-snapshot")
        try setup.change("unusual-text")
        #expect(try setup.refresh().status == 0)
        try self.expectRefused(
            setup, after: "old-snapshot", words: ["timestamp metadata version 3", "rollback", "snapshot version 1"],
            kept: ["timestamp", "snapshot", "targets"])
    }

    @Test func aSnapshotNamingOlderTargetsIsRefused() throws {
        let setup = try Setup("tuf-old-targets")
        try setup.change("unusual-text")
        #expect(try setup.refresh().status == 0)
        try self.expectRefused(
            setup, after: "old-targets", words: ["snapshot metadata version 3", "rollback", "targets.json", "version 1"],
            kept: ["snapshot", "targets"])
    }

    /// A freeze: the snapshot, or the targets, expired (a newer snapshot naming expired targets is itself valid, and
    /// kept).
    @Test(arguments: [
        ("expired-snapshot", "snapshot metadata version 2", ["snapshot", "targets"]),
        ("expired-targets", "targets metadata version 2", ["targets"]),
    ])
    func anExpiredSnapshotOrTargetsIsRefused(attack: String, role: String, kept: [String]) throws {
        let setup = try Setup("tuf-" + attack)
        #expect(try setup.refresh().status == 0)
        try self.expectRefused(setup, after: attack, words: [role, "expired"], kept: kept)
    }

    /// Targets version 1's bytes served as version 2, which the snapshot names: refused, version 1 kept.
    @Test func mixAndMatchIsRefused() throws {
        let setup = try Setup("tuf-mix-and-match")
        #expect(try setup.refresh().status == 0)
        try self.expectRefused(setup, after: "mix-and-match", words: ["targets metadata version 1", "mix-and-match"], kept: ["targets"])
        #expect(try setup.version("targets") == 1)
    }

    /// `first` (terminating, no targets) and then `second` (signs shared/x.txt) both may sign shared/*: with `first`
    /// terminating, the search stops there and the target is not found; without, `second` provides it.
    @Test(arguments: [true, false]) func aTerminatingDelegationEndsTheSearch(terminating: Bool) throws {
        let setup = try Setup("tuf-terminating-\(terminating)")
        try setup.change("terminating", terminating ? "true" : "false")
        let download = try setup.download("shared/x.txt")
        if terminating {
            #expect(download.status == 1)
            #expect(download.stderr.contains("No target"), "\(download.stderr)")
            #expect(try treeContents(setup.targetDir).isEmpty)
        } else {
            #expect(download.status == 0, "\(download.stderr)")
            #expect(try treeContents(setup.targetDir) == ["shared%2Fx.txt": TUFClientTests.hello])
        }
    }

    /// An attacker with the timestamp and snapshot keys (online) signs targets with them: the snapshot and timestamp
    /// verify, the targets do not, and its target is never written.
    @Test func theOnlineKeysCannotSignTargets() throws {
        let setup = try Setup("tuf-compromised-online")
        #expect(try setup.refresh().status == 0)
        try self.expectRefused(
            setup, after: "compromised-online", words: ["targets metadata version 2", "threshold not met"], kept: ["targets"])
        let download = try setup.download("evil/x.txt")
        #expect(download.status == 1)
        #expect(try treeContents(setup.targetDir).isEmpty)
        #expect(try setup.version("targets") == 1)
    }
}
