"""Case 10: compressed packs of compressible content, unpacked while they download. Three packs of 1 GiB
(4 × 256 MiB) in a tar.zst pack made by `packs pack`:
- mixed: half of each MiB random like textures and audio, half runs and tables;
- text: base64 lines (76 characters of 6 bits each), like logs, scripts and JSON, whose zstd frames decode far
  slower per byte than the mixed content's (issue 48);
- large: the mixed content in chunks of 8 to 64 MiB (`--chunk-average 16384`), for the peak RSS of an install that
  streams every chunk.
For each: `packs fetch` against `curl -o` + `openssl dgst -sha256` + `bsdtar -xf` (target: ≤ 0.6, mixed), and
against the same followed by `sync -f`; its wall time against the physical floor of a durable install (issue 48):
the slower of the network alone (`curl -o /dev/null` of the pack) and the disk written as the install writes it (`dd
bs=1M oflag=direct conv=fsync` of the content), target ≤ 1.3 (issue 29's floor through the page cache, `curl -o FILE`
and `dd conv=fsync`, for information); packs's CPU (user + sys) per GiB of content, against `zstd -dc` of the pack
alone; packs's peak RSS, and how busy packs, nginx and the writeback kept the cores. With --compare, another build of
packs alternates with this one.

Run alone: Benchmarks/run --only 10
"""
import base64
import os
import shutil

from harness import data
from harness.measure import GiB, KiB, MiB, log, sh
from harness.tables import fmt_mib, median

CASES = (10,)
# name, product, content, `packs pack --chunk-average` (KiB; the default, 32, if None)
CONTENTS = (
    ("zst", "com.bench.zst", "mixed", None),
    ("text", "com.bench.text", "text", None),
    # The same mixed content cut into chunks of 8 to 64 MiB (16 MiB on average), each a frame of its own: the peak
    # RSS of an install that streams every chunk (issue 48: ≤ 64 MiB for any pack).
    ("large", "com.bench.large", "mixed, chunks of 8–64 MiB", 16384),
)


def mixed_file(f, rng):
    for _ in range(256):
        # Like game data: half of each MiB incompressible (textures, audio), half runs and tables.
        f.write(rng.randbytes(512 * KiB) + bytes(range(256)) * 2048)


def text_file(f, rng):
    # base64 lines of random bytes: 256 MiB exactly (encodebytes makes lines of 76 characters and a newline).
    left = 256 * MiB
    while left > 0:
        block = base64.encodebytes(rng.randbytes(3 * MiB))
        f.write(block[:left])
        left -= min(left, len(block))


def make_data(b):
    for name, product, kind, average in CONTENTS:
        log(f"data: 1 GiB of compressible content ({kind}: 4 × 256 MiB), tar.zst…")
        rng = b.rng("text" if kind == "text" else "zst")
        src = os.path.join(b.src_root, name, product)
        for i in range(4):
            path = os.path.join(src, "Contents", f"level{i}.dat")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                (text_file if kind == "text" else mixed_file)(f, rng)
        os.makedirs(os.path.join(b.site, name), exist_ok=True)
        sh([b.packs, "pack", src, "--output", os.path.join(b.site, name, f"{name}.tar.zst"),
            "--product", product, "--version", "1", *(["--chunk-average", str(average)] if average else [])])
        shutil.rmtree(src)
        b.data[name] = data.manifest(b, name)[product]


def run(b):
    for name, product, kind, _ in CONTENTS:
        run_one(b, name, product, kind)


def run_one(b, name, product, kind):
    zst = b.data[name]
    url = f"{b.base}/{name}/{zst['url']}"
    manifest = f"{b.base}/{name}/manifest.json"
    archive = os.path.join(b.site, name, zst["url"])
    commands = [
        ("packs", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, product)),
        ("curl+openssl+bsdtar", lambda w: (
            f"curl -s -f -o {w}/zst.tar.zst {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out")),
        ("curl+openssl+bsdtar+sync", lambda w: (
            f"curl -s -f -o {w}/zst.tar.zst {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out && sync -f {w}/out")),
    ]
    commands = b.with_compare(commands, b.compare_commands(manifest, product))
    log(f"case 10 ({kind}): {zst['contentLength'] / MiB:.0f} MiB tar.zst of 1 GiB compressible content…")
    served = [archive]
    res = b.alternate(10, commands, b.reps, check=b.expect_content(4, GiB),
                      warm_bytes=zst["contentLength"] + GiB + 256 * MiB, served=served)
    walls = {name: [r.wall for r in runs] for name, runs in res.items()}
    what = f"tar.zst ({kind}), {zst['contentLength'] / MiB:.0f} MiB pack → 1 GiB"
    b.report.row(10, what, walls["packs"], "curl + openssl dgst + bsdtar -xf", walls["curl+openssl+bsdtar"],
                 target=0.6 if kind == "mixed" else None)
    b.report.row(10, what + " (durable)", walls["packs"], "curl + openssl dgst + bsdtar -xf && sync -f", walls["curl+openssl+bsdtar+sync"])
    b.compare_row(10, what, walls)
    # Write once (issue 29): the pack is indexed (`packs pack`), so its first install keeps no archive. Against the
    # physical floor of a durable install (issue 48), measured in the same run, alternated: the slower of the network
    # alone (`curl -o /dev/null`) and the disk written as the install writes it (`dd oflag=direct`, then fsync). The
    # floor of issue 29, `curl -o FILE` and `dd conv=fsync` through the page cache, for information only.
    floor_runs = b.alternate(10, [
        ("curl -o /dev/null", lambda w: ["curl", "-s", "-f", "-o", "/dev/null", url]),
        ("dd oflag=direct conv=fsync", lambda w: ["dd", "if=/dev/zero", f"of={w}/floor", "bs=1M", f"count={GiB // MiB}",
                                                  "oflag=direct", "conv=fsync", "status=none"]),
        ("curl -o file", lambda w: ["curl", "-s", "-f", "-o", f"{w}/zst.tar.zst", url]),
        ("dd conv=fsync", lambda w: ["dd", "if=/dev/zero", f"of={w}/floor", "bs=1M", f"count={GiB // MiB}", "conv=fsync",
                                     "status=none"]),
        ("zstd -dc", lambda w: f"zstd -q -dc {archive} > /dev/null"),
    ], b.reps, warm_bytes=zst["contentLength"] + 256 * MiB, served=served)
    floor_walls = {name: median([r.wall for r in runs]) for name, runs in floor_runs.items()}
    network, disk = floor_walls["curl -o /dev/null"], floor_walls["dd oflag=direct conv=fsync"]
    b.report.rows.append(("10", f"the floor's parts ({kind}): network alone (curl -o /dev/null) / disk as the install "
                                "writes it (dd bs=1M oflag=direct conv=fsync)", f"{network:.2f} / {disk:.2f} s",
                          "", "", "", "", ""))
    b.report.row(10, what + ", written once: ÷ the physical floor", walls["packs"],
                 "max(curl -o /dev/null, dd oflag=direct conv=fsync)", max(network, disk), target=1.3)
    b.report.row(10, what + ", for information, issue 29's floor (page cache)", walls["packs"],
                 f"max(curl -o file {floor_walls['curl -o file']:.2f} s, dd conv=fsync {floor_walls['dd conv=fsync']:.2f} s)",
                 max(floor_walls["curl -o file"], floor_walls["dd conv=fsync"]))
    # CPU (user + sys) per GiB of content: what decoding, hashing and writing the content cost packs, against zstd
    # decoding the pack alone (one thread, nothing hashed or written).
    cpu = [r.cpu for r in res["packs"]]
    b.report.row(10, f"CPU user+sys s/GiB, tar.zst ({kind})", cpu, "zstd -dc > /dev/null (decoding alone)",
                 [r.cpu for r in floor_runs["zstd -dc"]], unit="cpu")
    b.report.rows.append(("10", f"packs peak RSS ({kind}, max of runs)", fmt_mib(max(r.rss_kib for r in res["packs"])),
                          "", "", "", "≤ 64 MiB", ""))
    b.report.busy_row(10, res["packs"])
