"""Case 10: a compressed pack of compressible content, unpacked while it downloads. 1 GiB of content (4 ×
256 MiB, half of each MiB random like textures and audio, half runs and tables) in a tar.zst pack, by
`packs fetch` against `curl -o` + `openssl dgst -sha256` + `bsdtar -xf` (target: ≤ 0.6), and against the
same followed by `sync -f`. packs's peak RSS, and how busy packs, nginx and the writeback kept the cores.
With --compare, another build of packs alternates with this one.

Run alone: Benchmarks/run --only 10
"""
import os
import shutil

from harness import data
from harness.measure import GiB, KiB, MiB, log, sh
from harness.tables import fmt_mib, median

CASES = (10,)


def make_data(b):
    log("data: 1 GiB of compressible content (4 × 256 MiB, half random), tar.zst…")
    rng = b.rng("zst")
    src = os.path.join(b.src_root, "zst", "com.bench.zst")
    for i in range(4):
        path = os.path.join(src, "Contents", f"level{i}.dat")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            for _ in range(256):
                # Like game data: half of each MiB incompressible (textures, audio), half runs and tables.
                f.write(rng.randbytes(512 * KiB) + bytes(range(256)) * 2048)
    os.makedirs(os.path.join(b.site, "zst"), exist_ok=True)
    sh([b.packs, "pack", src, "--output", os.path.join(b.site, "zst", "zst.tar.zst"),
        "--product", "com.bench.zst", "--version", "1"])
    shutil.rmtree(src)
    b.data["zst"] = data.manifest(b, "zst")["com.bench.zst"]


def run(b):
    zst = b.data["zst"]
    url = f"{b.base}/zst/{zst['url']}"
    manifest = f"{b.base}/zst/manifest.json"
    commands = [
        ("packs", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.zst")),
        ("curl+openssl+bsdtar", lambda w: (
            f"curl -s -f -o {w}/zst.tar.zst {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out")),
        ("curl+openssl+bsdtar+sync", lambda w: (
            f"curl -s -f -o {w}/zst.tar.zst {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out && sync -f {w}/out")),
    ]
    commands = b.with_compare(commands, b.compare_commands(manifest, "com.bench.zst"))
    log(f"case 10: {zst['contentLength'] / MiB:.0f} MiB tar.zst of 1 GiB compressible content…")
    served = [os.path.join(b.site, "zst", zst["url"])]
    res = b.alternate(10, commands, b.reps, check=b.expect_content(4, GiB),
                      warm_bytes=zst["contentLength"] + GiB + 256 * MiB, served=served)
    walls = {name: [r.wall for r in runs] for name, runs in res.items()}
    what = f"tar.zst, {zst['contentLength'] / MiB:.0f} MiB pack → 1 GiB"
    b.report.row(10, what, walls["packs"], "curl + openssl dgst + bsdtar -xf", walls["curl+openssl+bsdtar"], target=0.6)
    b.report.row(10, what + " (durable)", walls["packs"], "curl + openssl dgst + bsdtar -xf && sync -f", walls["curl+openssl+bsdtar+sync"])
    b.compare_row(10, what, walls)
    # Write once (issue 29): the pack is indexed (`packs pack`), so its first install keeps no archive. Against the
    # physical floor of a durable install, measured in the same run: the slower of the download alone (`curl -o`) and
    # writing the content with fsync (`dd … conv=fsync`), alternated.
    floor_runs = b.alternate(10, [
        ("curl -o", lambda w: ["curl", "-s", "-f", "-o", f"{w}/zst.tar.zst", url]),
        ("dd conv=fsync", lambda w: ["dd", "if=/dev/zero", f"of={w}/floor", "bs=1M", f"count={GiB // MiB}", "conv=fsync",
                                     "status=none"]),
    ], b.reps, warm_bytes=zst["contentLength"] + 256 * MiB, served=served)
    floor_walls = {name: median([r.wall for r in runs]) for name, runs in floor_runs.items()}
    b.report.row(10, what + ", written once: ÷ the floor", walls["packs"],
                 f"max(curl -o {floor_walls['curl -o']:.2f} s, dd conv=fsync {floor_walls['dd conv=fsync']:.2f} s)",
                 max(floor_walls.values()), target=1.1)
    # As in case 1: the same ratio against `dd`'s fastest run, as its runs spread widely.
    fastest = max(min(r.wall for r in floor_runs["dd conv=fsync"]), floor_walls["curl -o"])
    b.report.row(10, what + ", written once: ÷ the floor with dd's fastest run", walls["packs"],
                 f"max(curl -o, fastest dd conv=fsync {min(r.wall for r in floor_runs['dd conv=fsync']):.2f} s)", fastest)
    b.report.rows.append(("10", "packs peak RSS (max of runs)", fmt_mib(max(r.rss_kib for r in res["packs"])), "", "", "", "≤ 64 MiB", ""))
    b.report.busy_row(10, res["packs"])
