"""Case 9: whole catalogs. 1,000 and 10,000 tiny packs (one 160-byte file each, tar) in one `packs fetch
--all` under `ulimit -n 1024` (the default soft limit on most Linux systems), against a script doing the
same job with `curl --parallel --parallel-max 8`, `sha256sum -c` and one `bsdtar -xf` per pack. Checks:
exit 0, every pack installed, ≤ 1.0 of the script, time linear in the number of packs (10,000 ≤ 12 ×
1,000), peak RSS ≤ 96 MiB.

With --compare, another build of packs alternates with this one.

Run alone: Benchmarks/run --only 9
"""
import glob
import hashlib
import io
import json
import os
import shlex
import tarfile

from harness.measure import MiB, Failure, content_bytes, log
from harness.tables import fmt_mib

CASES = (9,)


def make_data(b):
    for n in (1_000, 10_000):
        log(f"data: a catalog of {n:,} tiny packs (tar, one 160-byte file each)…")
        b.data[f"catalog{n}"] = make_catalog(b, f"catalog{n}", n)


def make_catalog(b, name, count):
    """count tiny packs (a ContentInfo.plist and Contents/data.txt each) and their manifest, written
    directly (packs pack per pack would take minutes). Returns {product: content}."""
    folder = os.path.join(b.site, name)
    os.makedirs(folder, exist_ok=True)
    products, index = [], {}
    for i in range(count):
        pid = f"com.bench.{name}.p{i:05d}"
        plist = (f'<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>ContentVersion</key><string>1</string>'
                 f'<key>IAPProductIdentifier</key><string>{pid}</string></dict></plist>').encode()
        data = (f"pack {i}\n" * 20).encode()
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
            for entry, body in (("ContentInfo.plist", plist), ("Contents/data.txt", data)):
                info = tarfile.TarInfo(entry)
                info.size, info.mode = len(body), 0o644
                t.addfile(info, io.BytesIO(body))
        blob = raw.getvalue()
        with open(os.path.join(folder, f"p{i:05d}.tar"), "wb") as f:
            f.write(blob)
        content = {"contentIdentifier": pid, "contentVersion": "1", "url": f"p{i:05d}.tar", "contentLength": len(blob),
                   "sha256": hashlib.sha256(blob).hexdigest(), "unpackedLength": len(plist) + len(data)}
        products.append({"productIdentifier": pid, "contents": [content]})
        index[pid] = content
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"products": products}, f)
    return index


def run(b):
    results = {}
    for n in (1_000, 10_000):
        catalog = b.data[f"catalog{n}"]
        name = f"catalog{n}"
        manifest = f"{b.base}/{name}/manifest.json"
        cfg = os.path.join(b.tmp, f"{name}-curl.cfg")
        sums = os.path.join(b.tmp, f"{name}.sha256")
        with open(cfg, "w") as f, open(sums, "w") as g:
            for content in catalog.values():
                f.write(f'url = "{b.base}/{name}/{content["url"]}"\n')
                g.write(f'{content["sha256"]}  {content["url"]}\n')
        unpack_all = 'for f in *.tar; do mkdir "../out/${f%.tar}" && bsdtar -xf "$f" -C "../out/${f%.tar}" || exit 1; done'
        commands = [
            ("packs", lambda w, manifest=manifest: f"ulimit -n 1024 && exec {shlex.join(b.packs_cmd(f'{w}/home', 'fetch', manifest, '--all'))}"),
            ("curl+sha256sum+bsdtar", lambda w, cfg=cfg, sums=sums: (
                f"ulimit -n 1024 && mkdir -p {w}/dl {w}/out && cd {w}/dl && "
                f"curl -s -f --parallel --parallel-max 8 --remote-name-all -K {cfg} && "
                f"sha256sum -c --quiet {sums} && {unpack_all}")),
        ]
        if b.packs_compare:
            commands = b.with_compare(commands, [("packs (compare)", lambda w, manifest=manifest: (
                f"ulimit -n 1024 && exec {shlex.join(b.packs_cmd(f'{w}/home', 'fetch', manifest, '--all', binary=b.packs_compare))}"))])
        expected = n  # Contents/data.txt of each pack (content_bytes counts what lies under a Contents/ folder)

        def check(who, work, run, expected=expected):
            files, _ = content_bytes(work)
            if files != expected:
                raise Failure(f"case 9: {who}: {files} files under {work}, expected {expected}")
        log(f"case 9: {n:,} packs in one fetch under ulimit -n 1024…")
        reps = 3 if n == 10_000 else max(b.reps, 3)
        results[n] = b.alternate(9, commands, reps, check=check, warm_bytes=256 * MiB, keep=True,
                                 served=glob.glob(os.path.join(b.site, name, "*")))
    small, large = results[1_000], results[10_000]
    t_small = [r.wall for r in small["packs"]]
    t_large = [r.wall for r in large["packs"]]
    b.report.row(9, "1,000 tiny packs, fetch --all, ulimit -n 1024", t_small, "curl --parallel-max 8 + sha256sum + bsdtar",
                 [r.wall for r in small["curl+sha256sum+bsdtar"]], target=1.0)
    b.report.row(9, "10,000 tiny packs, fetch --all, ulimit -n 1024", t_large, "curl --parallel-max 8 + sha256sum + bsdtar",
                 [r.wall for r in large["curl+sha256sum+bsdtar"]], target=1.0)
    b.report.row(9, "linear in the number of packs: 10,000 ÷ 1,000 (packs)", t_large, "packs, 1,000 packs", t_small, target=12)
    for n, result in ((1_000, small), (10_000, large)):
        b.compare_row(9, f"{n:,} tiny packs", {name: [r.wall for r in runs] for name, runs in result.items()})
    rss_small = max(r.rss_kib for r in small["packs"])
    rss_large = max(r.rss_kib for r in large["packs"])
    b.report.rows.append(("9", "packs peak RSS (max of runs): 1,000 and 10,000 packs", f"{fmt_mib(rss_small)}, {fmt_mib(rss_large)}",
                          "", "", f"+{(rss_large - rss_small) / 9_000:.1f} KiB per pack", "≤ 96 MiB", "pass" if rss_large <= 96 * 1024 else "**FAIL**"))
