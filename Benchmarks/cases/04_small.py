"""Case 4: 200 small packs (three files of 12–28 KiB each, tar.gz) in one `packs fetch`, with the default
--concurrency 4 and with 8, against `curl --parallel --parallel-max 8` + `sha256sum -c` + one `bsdtar -xf`
per pack (target: ≤ 0.7, issue 29), and against `aria2c -j8` (with checksum=) + the same unpacking (target: ≤ 1.0).

Run alone: Benchmarks/run --only 4
"""
import glob
import os

from harness import data
from harness.measure import KiB, MiB, Failure, content_bytes, log
from harness.tables import median

CASES = (4,)


def make_data(b):
    log("data: 200 small packs (≈60 KiB each, tar.gz)…")
    rng = b.rng("small")
    for n in range(200):
        sizes = [rng.randint(12, 28) * KiB for _ in range(3)]
        data.make_pack(b, "small", [(f"f{i}.bin", s) for i, s in enumerate(sizes)],
                       f"com.bench.small.{n}", f"small-{n:03d}.tar.gz", rng)
    b.data["small"] = data.manifest(b, "small")


def run(b):
    small = b.data["small"]
    ids = sorted(small, key=lambda p: int(p.rsplit(".", 1)[1]))
    manifest = f"{b.base}/small/manifest.json"
    cfg = os.path.join(b.tmp, "small-curl.cfg")
    with open(cfg, "w") as f:
        for pid in ids:
            f.write(f'url = "{b.base}/small/{small[pid]["url"]}"\n')
    sums = os.path.join(b.tmp, "small.sha256")
    with open(sums, "w") as f:
        for pid in ids:
            f.write(f'{small[pid]["sha256"]}  {small[pid]["url"]}\n')
    aria_list = os.path.join(b.tmp, "small-aria2.txt")
    with open(aria_list, "w") as f:
        for pid in ids:
            f.write(f'{b.base}/small/{small[pid]["url"]}\n  checksum=sha-256={small[pid]["sha256"]}\n')
    unpack_all = 'for f in *.tar.gz; do mkdir "../out/${f%.tar.gz}" && bsdtar -xf "$f" -C "../out/${f%.tar.gz}" || exit 1; done'
    commands = [
        ("packs -c4", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, *ids)),
        ("packs -c8", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, *ids, "--concurrency", "8")),
        ("curl -Z 8", lambda w: (
            f"mkdir -p {w}/dl {w}/out && cd {w}/dl && "
            f"curl -s -f --parallel --parallel-max 8 --remote-name-all -K {cfg} && "
            f"sha256sum -c --quiet {sums} && {unpack_all}")),
        ("aria2c -j8", lambda w: (
            f"mkdir -p {w}/dl {w}/out && aria2c -q -j8 -i {aria_list} -d {w}/dl && cd {w}/dl && {unpack_all}")),
    ]
    total_files = 3 * len(ids)   # each small pack holds three files
    log("case 4: 200 small packs in one fetch…")

    def check(name, work, run):
        files, _ = content_bytes(work)
        if files != total_files:
            raise Failure(f"{name}: {files} files unpacked under {work}, expected {total_files}")
    res = b.alternate(4, commands, b.reps, check=check, warm_bytes=128 * MiB, keep=True,
                      served=glob.glob(os.path.join(b.site, "small", "*")))
    m = {name: [r.wall for r in runs] for name, runs in res.items()}
    b.report.row(4, "200 × 60 KiB packs, --concurrency 4 (default)", m["packs -c4"], "curl --parallel-max 8 + sha256sum + bsdtar", m["curl -Z 8"], target=0.7)
    b.report.row(4, "200 × 60 KiB packs, --concurrency 4 (default)", m["packs -c4"], "aria2c -j8 (checksum=) + bsdtar", m["aria2c -j8"], target=1.0)
    b.report.row(4, "200 × 60 KiB packs, --concurrency 8", m["packs -c8"], "curl --parallel-max 8 + sha256sum + bsdtar", m["curl -Z 8"], target=0.7)
    b.report.row(4, "200 × 60 KiB packs, --concurrency 8", m["packs -c8"], "aria2c -j8 (checksum=) + bsdtar", m["aria2c -j8"], target=1.0)
    cpu = {name: median([r.cpu for r in runs]) for name, runs in res.items()}
    b.report.rows.append(("4", "CPU user+sys (median): " + ", ".join(f"{n} {c:.2f} s" for n, c in cpu.items()), "", "", "", "", "", ""))
