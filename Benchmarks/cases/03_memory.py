"""Case 3: peak memory. `packs fetch` of a 256 MiB tar pack (2 × 128 MiB) against curl + `openssl dgst` +
`bsdtar -xf`; packs's peak RSS (target: ≤ 64 MiB), and, when case 1 ran before it, the same for the 1 GiB
pack and how far apart the two are (target: within 10 %: memory does not grow with the pack). The largest
peer process's RSS for reference.

Run alone: Benchmarks/run --only 3 (with --only 1,3 for the 1 GiB comparison)
"""
import os

from harness.measure import MiB, log
from harness.tables import fmt_mib

CASES = (3,)
DATA = ("mid",)


def run(b):
    mid = b.data["mid"]
    url = f"{b.base}/mid/{mid['url']}"
    manifest = f"{b.base}/mid/manifest.json"
    commands = [
        ("packs", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.mid")),
        ("curl+openssl+bsdtar", lambda w: (
            f"curl -s -f -o {w}/mid.tar {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/mid.tar | cut -d' ' -f1)\" = {mid['sha256']} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/mid.tar -C {w}/out")),
    ]
    log("case 3: 256 MiB pack (peak memory)…")
    res = b.alternate(3, commands, b.reps, check=b.expect_content(2, 256 * MiB),
                      warm_bytes=mid["contentLength"] * 2 + 128 * MiB, served=[os.path.join(b.site, "mid", mid["url"])])
    rss_mid = max(r.rss_kib for r in res["packs"])
    big = b.results.pop("big", None)   # case 1's runs, if it ran
    if big:
        rss_big = max(r.rss_kib for r in big["packs"])
        spread = abs(rss_big - rss_mid) / max(rss_big, rss_mid)
        b.report.rows.append(("3", "packs peak RSS (max of runs): 1 GiB pack", fmt_mib(rss_big), "", "", "", "≤ 64 MiB",
                              "pass" if rss_big <= 64 * 1024 else "**FAIL**"))
    b.report.rows.append(("3", "packs peak RSS (max of runs): 256 MiB pack", fmt_mib(rss_mid), "", "", "", "≤ 64 MiB",
                          "pass" if rss_mid <= 64 * 1024 else "**FAIL**"))
    if big:
        b.report.rows.append(("3", "peak RSS, 1 GiB vs 256 MiB", f"{spread * 100:.1f} % apart", "", "", "", "within 10 %",
                              "pass" if spread <= 0.10 else "**FAIL**"))
    b.report.row(3, "256 MiB pack, end to end (for reference)", [r.wall for r in res["packs"]], "curl + openssl dgst + bsdtar -xf",
                 [r.wall for r in res["curl+openssl+bsdtar"]])
    peer_rss = max(r.rss_kib for r in res["curl+openssl+bsdtar"])
    b.report.rows.append(("3", "peak RSS of the largest curl/openssl/bsdtar process, 256 MiB", fmt_mib(peer_rss), "", "", "", "", ""))
