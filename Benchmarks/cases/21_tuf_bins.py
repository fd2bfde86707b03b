"""Case 21: a TUF repository of 100,000 products in succinct hash bins (issue 45), served by nginx. The repository is
written by `packs repo` itself: init, `delegate bins --bins 1024` and `add --role bins` of one small manifest a product
(`products/com.bench.pNNNNNN/manifest.json`, ≈ 300 bytes; the repository's size is what matters, not real packs), in
batches of 10,000, then `sign` and `timestamp`. On tmpfs when there is one (each file written is synced) and served
through a symlink under the site. A client (`packs tuf-client`, tuf-conformance's interface over TUFUpdater, metadata
on the data filesystem) then:
- first: refreshes from root version 1 and downloads one product's manifest (bytes and requests from nginx's log,
  wall time);
- nothing changed: refreshes again: the requests and their bytes (target: one request, timestamp.json, ≤ 1 KiB; TUF
  5.3 also asks for the next root version, a 404, on every refresh);
- one product changed: the publisher adds a new manifest of one product (`add`, `sign`, `timestamp`, timed: the
  publisher's cost at this size), and the client downloads it: metadata bytes (target ≤ 64 KiB) and the process's wall
  time (target ≤ 100 ms to verify; the wall time includes the process start, shown apart as `packs tuf-client` exiting on
  a usage error).
With --compare, the client steps run with the other build too (its TUF client). PACKS_BENCH_21_TARGETS_PER_PRODUCT=2 makes
each product two targets, its manifest and its pack (as `packs fetch` looks both up), usually in two bins; a change then
adds both. PACKS_BENCH_21_PRODUCTS and PACKS_BENCH_21_BINS change the size.

Run alone (the harness, with the build at hand; Benchmarks/run builds release first):
  Benchmarks/run --only 21
  PYTHONPATH=Benchmarks python3 -m harness --packs .build/debug/packs --tmp "$(mktemp -d)" --only 21 --reps 3
"""
import hashlib
import json
import os
import shutil
import subprocess
import time

from harness.measure import Failure, KiB, log, sh
from harness.tables import median

CASES = (21,)
PRODUCTS = int(os.environ.get("PACKS_BENCH_21_PRODUCTS", "100000"))
BINS = int(os.environ.get("PACKS_BENCH_21_BINS", "1024"))
# 1: a product is its manifest; 2: its manifest and its pack, each a target (as TUFManifestCheck wants them), in two bins.
PER_PRODUCT = int(os.environ.get("PACKS_BENCH_21_TARGETS_PER_PRODUCT", "1"))
BATCH = 2_000   # paths a `packs repo add`: swift-argument-parser takes time quadratic in a positional array's length (≈ 50 s of 10,000 paths in a debug build)


def product_path(i):
    return f"products/com.bench.p{i:06d}/manifest.json"


def pack_path(i, version):
    return f"products/com.bench.p{i:06d}/pack-{version}.tar"


def product_targets(i, version):
    return [product_path(i)] + ([pack_path(i, version)] if PER_PRODUCT == 2 else [])


def write_product(src, i, version):
    with open(os.path.join(src, product_path(i)), "wb") as f:
        f.write(product_manifest(i, version))
    if PER_PRODUCT == 2:
        with open(os.path.join(src, pack_path(i, version)), "wb") as f:
            f.write(f"pack {i} version {version}\n".encode() * 4)


def bin_of(path):
    """The bin TUF's succinct_roles sends a path to (the first log2(BINS) bits of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big") >> (32 - (BINS.bit_length() - 1))


def product_manifest(i, version):
    """A product's manifest, as `packs manifest` writes one (its pack is not served: only the target's size matters)."""
    pid = f"com.bench.p{i:06d}"
    return json.dumps({"products": [{"productIdentifier": pid, "contents": [{
        "contentIdentifier": pid, "contentVersion": str(version), "url": f"{pid}-{version}.tar", "contentLength": 10_240 + i,
        "sha256": f"{i:064x}", "unpackedLength": 20_000 + i}]}]}).encode()


def make_data(b):
    root = os.path.join(b.shm or b.tmp, "tuf21")
    keys, src, repo = (os.path.join(root, n) for n in ("keys", "src", "repo"))
    for folder in (keys, src):
        os.makedirs(folder, exist_ok=True)
    log(f"data: a TUF repository of {PRODUCTS:,} product manifests in {BINS:,} hash bins, by packs repo…")
    for name in ("root", "timestamp", "snapshot", "targets", "bins"):
        sh([b.packs, "keygen", os.path.join(keys, name)])
    paths = []
    for i in range(PRODUCTS):
        os.makedirs(os.path.join(src, os.path.dirname(product_path(i))), exist_ok=True)
        write_product(src, i, 1)
        paths += product_targets(i, 1)
    # By bin: each run of `packs repo add` then signs a few bins once, not every bin again.
    paths.sort(key=bin_of)
    key = lambda n: os.path.join(keys, n + ".key")
    timings = {}
    started = time.perf_counter()
    sh([b.packs, "repo", "init", repo, "--root-key", key("root"), "--timestamp-key", key("timestamp"),
        "--snapshot-key", key("snapshot"), "--targets-key", key("targets")])
    sh([b.packs, "repo", "delegate", repo, "bins", "--bins", str(BINS), "--key", key("targets"), "--delegate-key", key("bins")])
    timings["init + delegate --bins"] = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, len(paths), BATCH):
        sh([b.packs, "repo", "add", repo, *(os.path.join(src, p) for p in paths[start:start + BATCH]), "--from", src,
            "--role", "bins", "--key", key("bins")])
    timings[f"add {len(paths):,} targets ({(len(paths) + BATCH - 1) // BATCH} runs, by bin)"] = time.perf_counter() - started
    started = time.perf_counter()
    sh([b.packs, "repo", "sign", repo, "--key", key("snapshot")])
    sh([b.packs, "repo", "timestamp", repo, "--key", key("timestamp")])
    timings["sign + timestamp"] = time.perf_counter() - started
    served = os.path.join(b.site, "tuf21")
    if os.path.realpath(served) != os.path.realpath(repo):
        if os.path.lexists(served):
            os.remove(served)
        os.symlink(repo, served)
    b.data["tuf21"] = {"root": root, "src": src, "repo": repo, "key": key, "timings": timings}
    for what, seconds in timings.items():
        log(f"  packs repo {what}: {seconds:.1f} s")


def metadata_sizes(repo):
    """Bytes of the newest snapshot and of the bins (median, max)."""
    meta = os.path.join(repo, "metadata")
    with open(os.path.join(repo, "metadata", "timestamp.json")) as f:
        snapshot_version = json.load(f)["signed"]["meta"]["snapshot.json"]["version"]
    snapshot = os.path.getsize(os.path.join(meta, f"{snapshot_version}.snapshot.json"))
    state = os.path.join(repo, "state")
    bins = [os.path.getsize(os.path.join(state, n)) for n in os.listdir(state) if n.startswith("bins-")]
    return snapshot, median(bins), max(bins)


class Client:
    """`packs tuf-client` (one build) with its own metadata folder, and what nginx served it."""

    def __init__(self, b, binary, name):
        self.b, self.binary = b, binary
        self.work = b.fresh(f"c21-{name}")
        self.meta, self.out = os.path.join(self.work, "metadata"), os.path.join(self.work, "targets")
        self.url = f"{b.base}/tuf21/metadata/"
        self.targets = f"{b.base}/tuf21/targets/"
        sh([binary, "tuf-client", "--metadata-dir", self.meta, "init", os.path.join(b.data["tuf21"]["repo"], "metadata", "1.root.json")])

    def run(self, *rest):
        """Runs `tuf-client … rest`; returns (wall seconds, [(uri, status, bytes)] nginx served meanwhile)."""
        before = len(self.b.nginx.log_lines())
        cmd = [self.binary, "tuf-client", "--metadata-dir", self.meta, "--metadata-url", self.url, *rest]
        started = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if p.returncode != 0:
            raise Failure(f"case 21: {' '.join(cmd)} exited {p.returncode}: {p.stderr[-600:]}")
        requests = []
        for line in self.b.nginx.log_lines()[before:]:
            uri, status, sent = line.split(" ")[:3]
            requests.append((uri, int(status), int(sent)))
        return wall, requests

    def download(self, *paths):
        names = [a for p in paths for a in ("--target-name", p)]
        return self.run("download", *names, "--target-dir", self.out, "--target-base-url", self.targets)

    def start_seconds(self):
        """The process alone: `packs tuf-client` parsing its arguments and exiting on a usage error (median of 5)."""
        walls = []
        for _ in range(5):
            started = time.perf_counter()
            subprocess.run([self.binary, "tuf-client", "--metadata-dir", self.meta, "none"], capture_output=True)
            walls.append(time.perf_counter() - started)
        return median(walls)


def metadata_bytes(requests):
    return sum(sent for uri, _, sent in requests if "/tuf21/metadata/" in uri)


def show(requests):
    return ", ".join(f"{uri.rsplit('/', 1)[-1]} {status} {sent:,} B" for uri, status, sent in requests)


def run(b):
    data = b.data["tuf21"]
    repo, key = data["repo"], data["key"]
    snapshot, bin_median, bin_max = metadata_sizes(repo)
    clients = [("packs", b.packs)] + ([("packs (compare)", b.packs_compare)] if b.packs_compare else [])
    reps = max(b.reps, 3)
    lines = ["", f"### Case 21: {PRODUCTS:,} products ({PER_PRODUCT} target{'s' if PER_PRODUCT > 1 else ''} each) in {BINS:,} succinct hash bins", "",
             f"Repository written by packs repo ({', '.join(f'{w}: {s:.1f} s' for w, s in data['timings'].items())}); "
             f"snapshot {snapshot:,} B, a bin {bin_median:,.0f} B (median; max {bin_max:,} B).", "",
             "| client | step | wall | requests (file status bytes) | metadata bytes |", "|---|---|---:|---|---:|"]
    changed_version = 1
    versions = {}   # product -> its version, once changed
    publisher = []
    for name, binary in clients:
        client = Client(b, binary, name.replace(" ", "-").replace("(", "").replace(")", ""))
        start = client.start_seconds()
        log(f"case 21 ({name}): first refresh and download of one product…")
        wall, requests = client.download(*product_targets(0, 1))
        lines.append(f"| {name} | first: refresh from root 1, download one product | {wall * 1000:.0f} ms | {show(requests)} | "
                     f"{metadata_bytes(requests):,} |")
        first_bytes = metadata_bytes(requests)
        quiet = []
        for _ in range(reps):
            wall, requests = client.run("refresh")
            quiet.append((wall, requests))
        wall, requests = quiet[len(quiet) // 2]
        lines.append(f"| {name} | nothing changed: refresh | {median([w for w, _ in quiet]) * 1000:.0f} ms | {show(requests)} | "
                     f"{metadata_bytes(requests):,} |")
        changed = []
        for r in range(reps):
            # Products spread over the bins; the client first has each one (its bin) at the old version.
            i = (r + 1) * (PRODUCTS // (reps + 1))
            client.download(*product_targets(i, versions.get(i, 1)))
            changed_version += 1
            versions[i] = changed_version
            write_product(data["src"], i, changed_version)
            started = time.perf_counter()
            sh([b.packs, "repo", "add", repo, *(os.path.join(data["src"], p) for p in product_targets(i, changed_version)),
                "--from", data["src"], "--role", "bins", "--key", key("bins")])
            added = time.perf_counter()
            sh([b.packs, "repo", "sign", repo, "--key", key("snapshot")])
            signed = time.perf_counter()
            sh([b.packs, "repo", "timestamp", repo, "--key", key("timestamp")])
            publisher.append((added - started, signed - added, time.perf_counter() - signed))
            wall, requests = client.download(*product_targets(i, changed_version))
            changed.append((wall, requests))
            log(f"  case 21 {name} round {r}: one product changed: {wall * 1000:.0f} ms, {metadata_bytes(requests):,} B of metadata")
        walls = [w for w, _ in changed]
        worst_bytes = max(metadata_bytes(q) for _, q in changed)
        wall, requests = changed[len(changed) // 2]
        lines.append(f"| {name} | one product changed: refresh, download it ({reps} runs) | {median(walls) * 1000:.0f} ms "
                     f"({min(walls) * 1000:.0f}–{max(walls) * 1000:.0f}) | {show(requests)} | {metadata_bytes(requests):,} |")
        lines.append(f"| {name} | the process alone (tuf-client exiting on a usage error) | {start * 1000:.0f} ms | | |")
        quiet_requests = [q for _, q in quiet]
        most = max(len(q) for q in quiet_requests)
        timestamp_bytes = max(sent for q in quiet_requests for uri, _, sent in q if uri.endswith("/timestamp.json"))
        b.report.rows.append(("21", f"{name}: first refresh from root 1 + one product (its bins)", f"{first_bytes / KiB:.1f} KiB of metadata",
                              "", "", "", "–", ""))
        # TUF 5.3 asks for the next root version on every refresh (a 404 when there is none): the "one request"
        # counts timestamp.json; the probe is shown beside it.
        probes = max(sum(1 for uri, _, _ in q if uri.endswith(".root.json")) for q in quiet_requests)
        b.report.rows.append(("21", f"{name}: nothing changed, refresh: requests besides TUF 5.3's next-root probe "
                                    f"(probes: {probes}, a 404 of {max(s for q in quiet_requests for u, _, s in q if u.endswith('.root.json'))} B)",
                              f"{most - probes}", "", "", "", "1", "pass" if most - probes <= 1 else "**FAIL**"))
        b.report.rows.append(("21", f"{name}: nothing changed, refresh: bytes of timestamp.json", f"{timestamp_bytes} B", "", "", "",
                              "≤ 1 KiB", "pass" if timestamp_bytes <= KiB else "**FAIL**"))
        b.report.rows.append(("21", f"{name}: one of {PRODUCTS:,} products changed: metadata downloaded (worst of {reps})",
                              f"{worst_bytes / KiB:.1f} KiB", "", "", "", "≤ 64 KiB", "pass" if worst_bytes <= 64 * KiB else "**FAIL**"))
        verify = median(walls) - start
        b.report.rows.append(("21", f"{name}: one of {PRODUCTS:,} products changed: refresh, verify, download: process wall "
                                    f"{median(walls) * 1000:.0f} ms − the process alone {start * 1000:.0f} ms",
                              f"{verify * 1000:.0f} ms", "", "", "", "≤ 100 ms", "pass" if verify <= 0.1 else "**FAIL**"))
    adds, signs, stamps = zip(*publisher)
    b.report.rows.append(("21", f"publisher at {PRODUCTS:,} products: packs repo add one / sign / timestamp (medians)",
                          f"{median(adds):.2f} s / {median(signs):.2f} s / {median(stamps):.2f} s", "", "", "", "–", ""))
    b.report.sections.append("\n".join(lines))
    shutil.rmtree(os.path.join(b.runs, "c21-packs"), ignore_errors=True)
