#!/usr/bin/env python3
"""Builds and changes a TUF repository folder with python-tuf's tuf.api.metadata, for the suite's TUF tests.

    tuf-repo.py DIR ACTION

DIR holds metadata/ and targets/ (served as they are, by nginx in the tests), keys/ (private keys, PEM) and
state/ (the newest version of each role, unversioned, and every timestamp written as timestamp.N.json).
Consistent snapshots are on. Actions:

  init                 root, timestamp, snapshot, targets v1, each role its own ed25519 key; targets
                       files/hello.txt; a delegated role "studio" (paths studio/*) that signs studio/a.txt and,
                       outside its paths, other/b.txt
  timestamp            a new timestamp version (same snapshot)
  serve-timestamp N    serves the timestamp version N written earlier again (a rollback)
  expired-timestamp    a new timestamp version that expired a day ago
  endless-timestamp    serves a timestamp.json of 20,000 bytes (more than python-tuf's 16,384 limit)
  duplicate-root-key   root v+1 whose root threshold 2 is met only by the same key under two key ids
  rotate-root          root v+1 (already expired) and v+2, each with a new root key, signed by old and new
  key-types            root v+1 whose root threshold 3 needs the ed25519 key, a new rsa (rsassa-pss-sha256) and a
                       new ecdsa (ecdsa-sha2-nistp256) key
  key-types-broken K   root v+1 signed by the three, with key K's (rsa or ecdsa) signature of another text
  rotate-timestamp-key root v+1 with a new timestamp key, and a timestamp signed by it that starts again at
                       version 1 (fast-forward recovery after a compromised timestamp key)
  unusual-text         targets, snapshot and timestamp v+1: a target whose path and custom field hold non-ASCII
                       text, quotes, backslashes and control characters (canonical JSON as securesystemslib writes it)
  corrupt-target       replaces the served bytes of files/hello.txt (metadata unchanged)
  expired-snapshot     snapshot and timestamp v+1, the snapshot expired a day ago (a freeze)
  expired-targets      targets, snapshot and timestamp v+1, the targets expired a day ago (a freeze)
  old-snapshot         timestamp v+1 naming the snapshot version before the newest (a snapshot rollback)
  old-targets          snapshot and timestamp v+1, the snapshot naming targets version 1 (a targets rollback)
  mix-and-match        snapshot and timestamp v+1, the snapshot naming targets v+1, served with the bytes of
                       targets v (an older targets file under the newer name)
  terminating FLAG     targets, snapshot and timestamp v+1 delegating shared/* to "first" (terminating when FLAG is
                       true; no targets) then to "second" (signs shared/x.txt), each with its own key
  compromised-online   an attacker holding the online keys (timestamp and snapshot): targets v+1 with a target
                       evil/x.txt signed by them, snapshot and timestamp v+1 signed as usual
  add-targets SRC      targets, snapshot and timestamp v+1: every file under SRC a target at its path relative to
                       SRC, served under that plain path and, for consistent snapshots, under its hash-prefixed name
                       (as a manifest and its packs are published for packs fetch)
"""

import datetime
import json
import os
import shutil
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner, Signature
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)

HELLO = b"hello from a TUF repository\n"
STUDIO_A = b"studio target a\n"
OUTSIDE_B = b"a target outside the studio's paths\n"


def future(days: int = 365) -> datetime.datetime:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now + datetime.timedelta(days=days)


class Repo:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        for sub in ("metadata", "targets", "keys", "state"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    def new_key(self, name: str, kind: str = "ed25519") -> CryptoSigner:
        if kind == "rsa":
            key = rsa.generate_private_key(65537, 3072)
        elif kind == "ecdsa":
            key = ec.generate_private_key(ec.SECP256R1())
        else:
            key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        with open(self.path("keys", name + ".pem"), "wb") as f:
            f.write(pem)
        return CryptoSigner(key)

    def signer(self, name: str) -> CryptoSigner:
        with open(self.path("keys", name + ".pem"), "rb") as f:
            return CryptoSigner(serialization.load_pem_private_key(f.read(), None))

    def load(self, role: str) -> Metadata:
        return Metadata.from_file(self.path("state", role + ".json"))

    def write(self, md: Metadata, role: str, signers: list[str]) -> bytes:
        md.signatures.clear()
        for name in signers:
            md.sign(self.signer(name), append=True)
        data = md.to_bytes()
        self.save(data, md, role)
        return data

    def save(self, data: bytes, md: Metadata, role: str) -> None:
        with open(self.path("state", role + ".json"), "wb") as f:
            f.write(data)
        version = md.signed.version
        if role == "timestamp":
            with open(self.path("state", f"timestamp.{version}.json"), "wb") as f:
                f.write(data)
            name = "timestamp.json"
        else:
            name = f"{version}.{role}.json"
        with open(self.path("metadata", name), "wb") as f:
            f.write(data)

    def add_target(self, path: str, data: bytes) -> TargetFile:
        target = TargetFile.from_data(path, data, ["sha256"])
        dirname, sep, basename = path.rpartition("/")
        served = self.path("targets", dirname, f"{target.hashes['sha256']}.{basename}")
        os.makedirs(os.path.dirname(served), exist_ok=True)
        with open(served, "wb") as f:
            f.write(data)
        return target

    def publish_timestamp(self, expires: datetime.datetime | None = None) -> None:
        ts = self.load("timestamp")
        ts.signed.version += 1
        ts.signed.expires = expires or future()
        self.write(ts, "timestamp", ["timestamp"])


def init(repo: Repo) -> None:
    signers = {name: repo.new_key(name) for name in ("root", "timestamp", "snapshot", "targets", "studio")}
    root = Metadata(Root(expires=future(), consistent_snapshot=True))
    for role in ("root", "timestamp", "snapshot", "targets"):
        root.signed.add_key(signers[role].public_key, role)
    studio = Metadata(Targets(expires=future()))
    for path, data in (("studio/a.txt", STUDIO_A), ("other/b.txt", OUTSIDE_B)):
        studio.signed.targets[path] = repo.add_target(path, data)
    targets = Metadata(Targets(expires=future()))
    targets.signed.targets["files/hello.txt"] = repo.add_target("files/hello.txt", HELLO)
    role = DelegatedRole("studio", [], 1, False, paths=["studio/*"])
    targets.signed.delegations = Delegations({}, {"studio": role})
    targets.signed.add_key(signers["studio"].public_key, "studio")
    studio_bytes = repo.write(studio, "studio", ["studio"])
    targets_bytes = repo.write(targets, "targets", ["targets"])
    snapshot = Metadata(Snapshot(expires=future()))
    snapshot.signed.meta["targets.json"] = MetaFile(1, len(targets_bytes), None)
    snapshot.signed.meta["studio.json"] = MetaFile(1, len(studio_bytes), None)
    snapshot_bytes = repo.write(snapshot, "snapshot", ["snapshot"])
    timestamp = Metadata(Timestamp(expires=future()))
    timestamp.signed.snapshot_meta = MetaFile.from_data(1, snapshot_bytes, ["sha256"])
    repo.write(timestamp, "timestamp", ["timestamp"])
    repo.write(root, "root", ["root"])
    shutil.copyfile(repo.path("metadata", "1.root.json"), repo.path("root.json"))


def duplicate_root_key(repo: Repo) -> None:
    root = repo.load("root")
    root.signed.version += 1
    signer = repo.signer("root")
    key = signer.public_key
    duplicate = type(key)("duplicate-" + key.keyid, key.keytype, key.scheme, dict(key.keyval))
    root.signed.keys[duplicate.keyid] = duplicate
    root.signed.roles["root"].keyids.append(duplicate.keyid)
    root.signed.roles["root"].threshold = 2
    root.signatures.clear()
    signature = root.sign(signer)
    root.signatures[duplicate.keyid] = Signature(duplicate.keyid, signature.signature)
    repo.save(root.to_bytes(), root, "root")


def rotate_root(repo: Repo) -> None:
    previous = "root"
    for step, expired in ((1, True), (2, False)):
        name = f"root{step}"
        new = repo.new_key(name)
        root = repo.load("root")
        root.signed.version += 1
        old_key = repo.signer(previous).public_key
        root.signed.revoke_key(old_key.keyid, "root")
        root.signed.add_key(new.public_key, "root")
        root.signed.expires = future(-1) if expired else future()
        repo.write(root, "root", [previous, name])
        previous = name


def key_types(repo: Repo) -> None:
    root = repo.load("root")
    root.signed.version += 1
    for kind in ("rsa", "ecdsa"):
        root.signed.add_key(repo.new_key(kind, kind).public_key, "root")
    root.signed.roles["root"].threshold = 3
    repo.write(root, "root", ["root", "rsa", "ecdsa"])


def key_types_broken(repo: Repo, kind: str) -> None:
    root = repo.load("root")
    root.signed.version += 1
    root.signatures.clear()
    for name in ("root", "rsa", "ecdsa"):
        signer = repo.signer(name)
        if name == kind:
            other = signer.sign(b"another text")
            root.signatures[other.keyid] = other
        else:
            root.sign(signer, append=True)
    repo.save(root.to_bytes(), root, "root")


def rotate_timestamp_key(repo: Repo) -> None:
    root = repo.load("root")
    root.signed.version += 1
    old = repo.signer("timestamp").public_key
    root.signed.revoke_key(old.keyid, "timestamp")
    root.signed.add_key(repo.new_key("timestamp2").public_key, "timestamp")
    repo.write(root, "root", ["root"])
    timestamp = repo.load("timestamp")
    timestamp.signed.version = 1
    repo.write(timestamp, "timestamp", ["timestamp2"])


UNUSUAL_PATH = 'files/caf\u00e9 "quoted" \\ back.txt'


def unusual_text(repo: Repo) -> None:
    targets = repo.load("targets")
    targets.signed.version += 1
    target = repo.add_target(UNUSUAL_PATH, HELLO)
    target.unrecognized_fields["custom"] = {
        "note": 'tab\t, newline\n, quote " and backslash \\, \u00e9 \U0001F600 \u0001 \u2028',
        "n": -12,
        "flags": [True, False, None],
        "\u00e9": {"b": 1, "a": 2, "B": 3},
    }
    targets.signed.targets[UNUSUAL_PATH] = target
    data = repo.write(targets, "targets", ["targets"])
    snapshot = repo.load("snapshot")
    snapshot.signed.version += 1
    snapshot.signed.meta["targets.json"] = MetaFile(targets.signed.version, len(data), None)
    snapshot_bytes = repo.write(snapshot, "snapshot", ["snapshot"])
    timestamp = repo.load("timestamp")
    timestamp.signed.version += 1
    timestamp.signed.snapshot_meta = MetaFile.from_data(snapshot.signed.version, snapshot_bytes, ["sha256"])
    repo.write(timestamp, "timestamp", ["timestamp"])


def publish_targets(repo: Repo, targets: Metadata) -> None:
    """Writes targets v+1 (already changed), then snapshot and timestamp v+1 naming it."""
    targets.signed.version += 1
    data = repo.write(targets, "targets", ["targets"])
    snapshot = repo.load("snapshot")
    snapshot.signed.version += 1
    snapshot.signed.meta["targets.json"] = MetaFile(targets.signed.version, len(data), None)
    snapshot_bytes = repo.write(snapshot, "snapshot", ["snapshot"])
    timestamp = repo.load("timestamp")
    timestamp.signed.version += 1
    timestamp.signed.snapshot_meta = MetaFile.from_data(snapshot.signed.version, snapshot_bytes, ["sha256"])
    repo.write(timestamp, "timestamp", ["timestamp"])


def add_targets(repo: Repo, source: str) -> None:
    targets = repo.load("targets")
    for folder, _, files in os.walk(source):
        for name in sorted(files):
            full = os.path.join(folder, name)
            path = os.path.relpath(full, source).replace(os.sep, "/")
            with open(full, "rb") as f:
                data = f.read()
            targets.signed.targets[path] = repo.add_target(path, data)
            plain = repo.path("targets", path)
            os.makedirs(os.path.dirname(plain), exist_ok=True)
            with open(plain, "wb") as f:
                f.write(data)
    publish_targets(repo, targets)


def publish_snapshot(repo: Repo, targets_version: int | None = None, expires: datetime.datetime | None = None) -> None:
    """Snapshot v+1 (naming the newest targets, or targets_version) and timestamp v+1."""
    snapshot = repo.load("snapshot")
    snapshot.signed.version += 1
    if expires:
        snapshot.signed.expires = expires
    version = targets_version or repo.load("targets").signed.version
    snapshot.signed.meta["targets.json"] = MetaFile(version, None, None)
    snapshot_bytes = repo.write(snapshot, "snapshot", ["snapshot"])
    timestamp = repo.load("timestamp")
    timestamp.signed.version += 1
    timestamp.signed.snapshot_meta = MetaFile.from_data(snapshot.signed.version, snapshot_bytes, ["sha256"])
    repo.write(timestamp, "timestamp", ["timestamp"])


def write_targets(repo: Repo, targets: Metadata, signers: list[str], expires: datetime.datetime | None = None) -> None:
    targets.signed.version += 1
    if expires:
        targets.signed.expires = expires
    repo.write(targets, "targets", signers)


def old_snapshot(repo: Repo) -> None:
    snapshot = repo.load("snapshot")
    old = snapshot.signed.version - 1
    with open(repo.path("metadata", f"{old}.snapshot.json"), "rb") as f:
        data = f.read()
    timestamp = repo.load("timestamp")
    timestamp.signed.version += 1
    timestamp.signed.snapshot_meta = MetaFile.from_data(old, data, ["sha256"])
    repo.write(timestamp, "timestamp", ["timestamp"])


def mix_and_match(repo: Repo) -> None:
    targets = repo.load("targets")
    version = targets.signed.version
    shutil.copyfile(repo.path("metadata", f"{version}.targets.json"), repo.path("metadata", f"{version + 1}.targets.json"))
    publish_snapshot(repo, targets_version=version + 1)


def terminating(repo: Repo, flag: bool) -> None:
    signers = {name: repo.new_key(name) for name in ("first", "second")}
    first = Metadata(Targets(expires=future()))
    second = Metadata(Targets(expires=future()))
    second.signed.targets["shared/x.txt"] = repo.add_target("shared/x.txt", HELLO)
    repo.write(first, "first", ["first"])
    repo.write(second, "second", ["second"])
    targets = repo.load("targets")
    roles = dict(targets.signed.delegations.roles)
    roles["first"] = DelegatedRole("first", [], 1, flag, paths=["shared/*"])
    roles["second"] = DelegatedRole("second", [], 1, False, paths=["shared/*"])
    targets.signed.delegations = Delegations(targets.signed.delegations.keys, roles)
    for name in ("first", "second"):
        targets.signed.add_key(signers[name].public_key, name)
    write_targets(repo, targets, ["targets"])
    snapshot = repo.load("snapshot")
    snapshot.signed.meta["first.json"] = MetaFile(1, None, None)
    snapshot.signed.meta["second.json"] = MetaFile(1, None, None)
    snapshot.signatures.clear()
    snapshot.sign(repo.signer("snapshot"))
    with open(repo.path("state", "snapshot.json"), "wb") as f:
        f.write(snapshot.to_bytes())
    publish_snapshot(repo)


def compromised_online(repo: Repo) -> None:
    targets = repo.load("targets")
    targets.signed.targets["evil/x.txt"] = repo.add_target("evil/x.txt", b"an attacker's target\n")
    write_targets(repo, targets, ["timestamp", "snapshot"])
    publish_snapshot(repo)


def main() -> int:
    folder, action = sys.argv[1], sys.argv[2]
    repo = Repo(folder)
    if action == "init":
        init(repo)
    elif action == "timestamp":
        repo.publish_timestamp()
    elif action == "serve-timestamp":
        shutil.copyfile(repo.path("state", f"timestamp.{sys.argv[3]}.json"), repo.path("metadata", "timestamp.json"))
    elif action == "expired-timestamp":
        repo.publish_timestamp(future(-1))
    elif action == "endless-timestamp":
        with open(repo.path("metadata", "timestamp.json"), "wb") as f:
            f.write(b"{" + b" " * 19_998 + b"}")
    elif action == "duplicate-root-key":
        duplicate_root_key(repo)
    elif action == "rotate-root":
        rotate_root(repo)
    elif action == "key-types":
        key_types(repo)
    elif action == "key-types-broken":
        key_types_broken(repo, sys.argv[3])
    elif action == "rotate-timestamp-key":
        rotate_timestamp_key(repo)
    elif action == "unusual-text":
        unusual_text(repo)
    elif action == "expired-snapshot":
        publish_snapshot(repo, expires=future(-1))
    elif action == "expired-targets":
        write_targets(repo, repo.load("targets"), ["targets"], expires=future(-1))
        publish_snapshot(repo)
    elif action == "old-snapshot":
        old_snapshot(repo)
    elif action == "old-targets":
        publish_snapshot(repo, targets_version=1)
    elif action == "mix-and-match":
        mix_and_match(repo)
    elif action == "terminating":
        terminating(repo, sys.argv[3] == "true")
    elif action == "compromised-online":
        compromised_online(repo)
    elif action == "add-targets":
        add_targets(repo, sys.argv[3])
    elif action == "corrupt-target":
        target = repo.load("targets").signed.targets["files/hello.txt"]
        served = repo.path("targets", "files", f"{target.hashes['sha256']}.hello.txt")
        with open(served, "wb") as f:
            f.write(b"HELLO from an attacker\n"[: len(HELLO)].ljust(len(HELLO), b"!"))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
