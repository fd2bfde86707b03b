"""Case 12: updates and repairs by chunk (issue 29), against casync. Each product is a chunked tar.zst pack
from `packs pack` (its default chunks: 16–256 KiB, 32 KiB on average, normalization level 1; casync keeps its
default, 16–256 KiB and 64 KiB on average; the index is zstd-compressed JSON), served by nginx under
/chunks/; nginx logs every request's $body_bytes_sent, which are added up per run. Version 1 is installed
(not timed) at loopback speed; then, with `limit_rate 12m` switched on for /chunks/, the update is timed:
`packs fetch` of version 2 (by chunk, reusing what is installed) against `casync extract --seed=OLD_TREE`
of version 2's tree (`casync make` of it into a chunk store served by the same nginx; casync 2 from Debian,
chunks zstd-compressed, one request per chunk, one after another). Both trees are then compared with the
version they must be (`diff -r`): a wrong tree breaks the case.
  a. a 256 MiB file of fixed pseudo-random bytes, 1 % of it changed in 32 places: bytes served ≤ 3 % of
     the pack, and ≤ casync's;
  b. 400 files (16–512 KiB, random), 4 of them rewritten: ≤ 2 % of the pack;
  c. one byte flipped in the installed 256 MiB file of (a), its times restored: `packs verify --repair`
     (≤ 1 % of the pack) against `casync extract --seed=DAMAGED_TREE` of version 1;
  d. 4 KiB inserted near the start of a 64 MiB file: ≤ 1 %, and ≤ casync's;
  e. the wall time of each update at 12 MB/s: packs < casync (one whole-pack fetch of (a) at the same rate,
     `packs fetch --no-delta`, for scale);
  f. the size of a chunked tar.zst from `packs pack` against `bsdtar --zstd` at the same level (3), on
     about 300 MB of /usr/share/doc and shared libraries (at most 8 MiB each) from /usr/lib/x86_64-linux-gnu:
     ≤ 1.05; also with other chunk sizes (`--chunk-average`), and the doc and libraries apart, for the trade-off.
Bytes counted are everything the update asked nginx for: packs's manifest, index and pack ranges;
casync's .caidx and chunks. nginx paces a limit_rate response only after each sendfile_max_chunk (2 MiB in
nginx 1.22) it has sent, so a response under 2 MiB goes at loopback speed: the ranges and chunks of these
updates are not slowed, only the whole pack is (22 s). The times then say what each tool costs besides the
bytes, not what a home link's bandwidth and latency would add (the requests are counted for that).

Run alone: Benchmarks/run --only 12
"""
import json
import os
import shutil
import subprocess
import zlib

from harness import data
from harness.measure import KiB, MiB, Failure, log, sh, timed
from harness.tables import median

CASES = (12,)
# CASE12_CHUNK_AVERAGE=KiB packs every version with `packs pack --chunk-average KiB` (each chunk of a large file is a
# zstd frame of its own): the update bytes of other frame sizes, for issue 48's trade-off (RESULTS.md). The
# targets are the default chunks'.
CHUNK_AVERAGE = ["--chunk-average", os.environ["CASE12_CHUNK_AVERAGE"]] if os.environ.get("CASE12_CHUNK_AVERAGE") else []

# Everything under /chunks/ goes at 12 MB/s while the flag file exists (the timed runs), else at loopback
# speed (installing version 1, the seeds): one switch, so that a repair (which fetches from the URLs
# recorded when version 1 was installed) is throttled too.
FLAG = ".link-12m"
NGINX_LOCATION = """
        location /chunks/ {{
            set $chunks_rate 0;
            if (-f {site}/chunks/""" + FLAG + """) {{ set $chunks_rate 12m; }}
            limit_rate $chunks_rate;
        }}"""

PRODUCTS = {"a": "com.bench.chunks.a", "b": "com.bench.chunks.b", "d": "com.bench.chunks.d"}
T_OLD, T_NEW = 1767225600, 1767312000   # the trees' file times: the same for unchanged files in both versions
FLIP_AT = 100 * MiB + 12345             # case c: the byte flipped in the installed 256 MiB file
INSERT_AT = 256 * KiB + 1234            # case d: where the 4 KiB go in


def tree(b, name):
    """The product folder of version `name` (say "a1"), holding Contents/ (what casync archives)."""
    return os.path.join(b.tmp, "chunks", name, PRODUCTS[name[0]])


def stamp_folders(folder, t):
    for root, dirs, _files in os.walk(folder):
        for n in dirs:
            os.utime(os.path.join(root, n), (t, t))
    os.utime(folder, (t, t))


def random_bytes(rng, n):
    """n random bytes, made 8 MiB at a time (randbytes takes at most 2^31 bits), as data.random_file does."""
    return b"".join(rng.randbytes(min(8 * MiB, n - at)) for at in range(0, n, 8 * MiB))


def write(path, content, t):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)
    os.utime(path, (t, t))


def make_data(b):
    log("data: case 12: a 256 MiB file with 1% changed in 32 places, 400 files with 4 changed, 4 KiB inserted in 64 MiB…")
    # a: 256 MiB, then 32 places of 1/32 of 1 % each, one in each 8 MiB.
    rng = b.rng("chunks-a")
    old = random_bytes(rng, 256 * MiB)
    new = bytearray(old)
    span = round(0.01 * len(old) / 32)
    for i in range(32):
        at = i * 8 * MiB + rng.randrange(8 * MiB - span)
        new[at:at + span] = rng.randbytes(span)
    write(os.path.join(tree(b, "a1"), "Contents", "level.dat"), old, T_OLD)
    write(os.path.join(tree(b, "a2"), "Contents", "level.dat"), new, T_NEW)
    del old, new
    # b: 400 files in 20 folders, 16–512 KiB; version 2 rewrites 4 of them (same sizes).
    rng = b.rng("chunks-b")
    sizes = [rng.randint(16 * KiB, 512 * KiB) for _ in range(400)]
    for i, size in enumerate(sizes):
        content = rng.randbytes(size)
        rel = os.path.join("Contents", f"d{i // 20:02d}", f"f{i % 20:02d}.bin")
        write(os.path.join(tree(b, "b1"), rel), content, T_OLD)
        write(os.path.join(tree(b, "b2"), rel), rng.randbytes(size) if i % 100 == 37 else content,
              T_NEW if i % 100 == 37 else T_OLD)
    # d: 64 MiB, then 4 KiB inserted near its start.
    rng = b.rng("chunks-d")
    old = random_bytes(rng, 64 * MiB)
    write(os.path.join(tree(b, "d1"), "Contents", "movie.bin"), old, T_OLD)
    write(os.path.join(tree(b, "d2"), "Contents", "movie.bin"), old[:INSERT_AT] + rng.randbytes(4 * KiB) + old[INSERT_AT:], T_NEW)
    del old
    for name in ("a1", "a2", "b1", "b2", "d1", "d2"):
        stamp_folders(os.path.join(tree(b, name), "Contents"), T_OLD)   # files' times are set above
    # The packs, one folder (and manifest) per version, as case 11.
    for name in ("a1", "a2", "b1", "b2", "d1", "d2"):
        folder = os.path.join(b.site, "chunks", name)
        os.makedirs(folder, exist_ok=True)
        sh([b.packs, "pack", tree(b, name), "--output", os.path.join(folder, f"{name[0]}.tar.zst"),
            "--product", PRODUCTS[name[0]], "--version", name[1], *CHUNK_AVERAGE])
        b.data[f"chunks-{name}"] = data.manifest(b, f"chunks/{name}")[PRODUCTS[name[0]]]
    # casync: one store for all, an archive index per tree it extracts (version 1 of a for the repair).
    cas = os.path.join(b.site, "chunks", "cas")
    os.makedirs(cas, exist_ok=True)
    for name in ("a1", "a2", "b2", "d2"):
        sh(["casync", "make", "--compression=zstd", f"--store={cas}/store", f"{cas}/{name}.caidx",
            os.path.join(tree(b, name), "Contents")])


def served_since(b, mark):
    """{kind: [requests, bytes]} of the /chunks/ requests logged after line `mark`."""
    kinds = {}
    for line in b.nginx.log_lines()[mark:]:
        uri, _status, sent = line.split(" ")[:3]
        if not uri.startswith("/chunks/"):
            continue
        kind = ("manifest" if uri.endswith("manifest.json") else "index" if uri.endswith(".index.json")
                else "caidx" if uri.endswith(".caidx") else "chunks" if uri.endswith(".cacnk") else "pack")
        k = kinds.setdefault(kind, [0, 0])
        k[0] += 1
        k[1] += int(sent)
    return kinds


def total(kinds):
    return sum(v[1] for v in kinds.values())


def delta_stats(out):
    """The last `delta` (or `deltaFallback`) a `--json` run printed, if any."""
    found = {}
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            for key in ("delta", "deltaFallback"):
                if key in event:
                    found[key] = event[key]
    return found


def same_tree(expected, got, what):
    p = subprocess.run(["diff", "-r", "-q", expected, got], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise Failure(f"case 12, {what}: the tree differs from the one expected ({expected} vs {got}):\n{p.stdout[-2000:]}")


def run(b):
    flag = os.path.join(b.site, "chunks", FLAG)
    cas = f"{b.base}/chunks/cas"
    measured = {}   # (case letter, command name) -> [{kind: [requests, bytes]}, …]
    stats = {}      # (case letter, command name) -> packs's delta / deltaFallback of the last run
    mark = {}

    def link(on):
        if on:
            open(flag, "w").close()
        elif os.path.exists(flag):
            os.remove(flag)

    def install(work, name):
        home = f"{work}/home"
        sh(b.packs_cmd(home, "fetch", f"{b.base}/chunks/{name}/manifest.json", PRODUCTS[name[0]]))
        return home

    def start(key):
        """Just before the timed command: everything installed is on disk, the log marked, the link slow."""
        os.sync()
        mark[key] = len(b.nginx.log_lines())
        link(True)

    def packs_update(letter, *extra):
        def make(work):
            link(False)
            home = install(work, f"{letter}1")
            start((letter, "packs"))
            return [b.packs, "--home", home, "--json", "fetch", f"{b.base}/chunks/{letter}2/manifest.json", PRODUCTS[letter], *extra]
        return make

    def casync_update(letter, seed_name, index_name):
        def make(work):
            link(False)
            seed = os.path.join(tree(b, seed_name), "Contents")
            if letter == "c":   # the damaged tree: version 1 with the same byte flipped as in packs's install
                seed = f"{work}/old"
                subprocess.run(["cp", "-a", "--reflink=auto", os.path.join(tree(b, "a1"), "Contents"), seed], check=True)
                flip(os.path.join(seed, "level.dat"))
            start((letter, "casync"))
            return ["casync", "extract", f"--store={cas}/store/", f"--seed={seed}", f"{cas}/{index_name}.caidx", f"{work}/out"]
        return make

    def flip(path):
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(FLIP_AT)
            byte = f.read(1)
            f.seek(FLIP_AT)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def packs_repair(work):
        link(False)
        home = install(work, "a1")
        contents = json.loads(sh(b.packs_cmd(home, "--json", "content", PRODUCTS["a"])).splitlines()[0])["contentURL"]
        flip(os.path.join(contents, "Contents", "level.dat"))
        start(("c", "packs"))
        return [b.packs, "--home", home, "--json", "verify", PRODUCTS["a"], "--repair"]

    def checker(letter, version):
        expected = os.path.join(tree(b, version), "Contents")

        def check(name, work, run):
            link(False)
            tool = "casync" if name.startswith("casync") else "packs"
            measured.setdefault((letter, name), []).append(served_since(b, mark[(letter, tool)]))
            if tool == "casync":
                same_tree(expected, f"{work}/out", f"{letter}, {name}")
                return
            stats[(letter, name)] = delta_stats(run.out)
            home = f"{work}/home"
            info = json.loads(sh(b.packs_cmd(home, "--json", "content", PRODUCTS["a" if letter == "c" else letter])).splitlines()[0])
            if info["contentVersion"] != version[1]:
                raise Failure(f"case 12, {letter}, {name}: version {info['contentVersion']} is installed, not {version[1]}")
            same_tree(expected, os.path.join(info["contentURL"], "Contents"), f"{letter}, {name}")
            sh(b.packs_cmd(home, "verify", PRODUCTS["a" if letter == "c" else letter]))
        return check

    plan = [   # letter, what, packs command, casync command, the version both must end with, target share
        ("a", "256 MiB file, 1% changed in 32 places", packs_update("a"), casync_update("a", "a1", "a2"), "a2", 0.03),
        ("b", "400 files, 4 changed", packs_update("b"), casync_update("b", "b1", "b2"), "b2", 0.02),
        ("c", "repair: 1 byte flipped in the installed 256 MiB file", packs_repair, casync_update("c", "a1", "a1"), "a1", 0.01),
        ("d", "4 KiB inserted near the start of a 64 MiB file", packs_update("d"), casync_update("d", "d1", "d2"), "d2", 0.01),
    ]
    walls = {}
    try:
        for letter, what, packs_make, casync_make, version, _share in plan:
            log(f"case 12{letter}: {what}…")
            res = b.alternate(f"12{letter}", [("packs", packs_make), ("casync", casync_make)], b.reps,
                              check=checker(letter, version))
            walls[letter] = {name: [r.wall for r in runs] for name, runs in res.items()}
        log("case 12e: the whole pack of (a) at 12 MB/s, for scale…")
        res = b.alternate("12e", [("packs --no-delta", packs_update("a", "--no-delta"))], 1, check=checker("a", "a2"))
        whole = [r.wall for r in res["packs --no-delta"]]
    finally:
        link(False)

    rows = []
    for letter, what, _p, _c, version, share in plan:
        pack = b.data[f"chunks-{version}"]["contentLength"]
        ours = median([total(k) for k in measured[(letter, "packs")]])
        theirs = median([total(k) for k in measured[(letter, "casync")]])
        b.report.rows.append((f"12{letter}", f"{what}: bytes served to packs, share of the {pack / 1e6:.0f} MB tar.zst pack",
                              f"{ours / 1e6:.2f} MB ({ours / pack:.2%})", "", "", "", f"≤ {share:.0%}",
                              "pass" if ours <= share * pack else "**FAIL**"))
        b.report.rows.append((f"12{letter}", f"{what}: bytes served, packs ÷ casync",
                              f"{ours / 1e6:.2f} MB", "casync extract --seed (.caidx + chunks)", f"{theirs / 1e6:.2f} MB",
                              f"{ours / theirs:.2f}", "≤ 1.0" if letter in "ad" else "–",
                              ("pass" if ours <= theirs else "**FAIL**") if letter in "ad" else ""))
        for name in ("packs", "casync"):
            kinds = measured[(letter, name)][-1]
            rows.append(f"| {letter} | {name} | " + ", ".join(f"{k} {v[0]} req {v[1] / 1e6:.3f} MB" for k, v in sorted(kinds.items()))
                        + f" | {total(kinds) / 1e6:.3f} MB | {total(kinds) / pack:.2%} | "
                        + (json.dumps(stats.get((letter, name), {}), sort_keys=True) if name == "packs" else "") + " |")
    for letter, what, *_ in plan:
        b.report.row(f"12e", f"{letter}: {what}, wall time at limit_rate 12m", walls[letter]["packs"],
                     "casync extract --seed", walls[letter]["casync"], target=1.0)
    b.report.row("12e", "a: update by chunk ÷ the whole pack (packs fetch --no-delta), both at 12m", walls["a"]["packs"],
                 "packs fetch --no-delta", whole)
    analysis = [where_bytes_go(b, letter, measured) for letter, *_ in plan]
    b.report.sections.append(
        "\n### Case 12: where packs's bytes go, against casync's (last round)\n\n"
        "Chunks needed: the new version's chunks whose SHA-256 no installed chunk has (for the repair: the chunk "
        "holding the flipped byte), at their stored length; ranges: what packs fetched of the pack, chunks less than "
        "64 KiB apart in one range (DeltaPlan.coalesceGap), so the bytes between them too. The index is served as "
        "packs pack wrote it (zstd -19 of its JSON; plain JSON before indexes were compressed); its JSON, and gzip -9 "
        "of the JSON, for comparison.\n\n"
        "| case | index as served (its JSON, gzip -9 of it) | chunks needed (stored) | ranges fetched | ranges − needed | casync .caidx | casync chunks |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n" + "\n".join(analysis) + "\n")
    b.report.sections.append(
        "\n### Case 12: what each update asked nginx for (last round)\n\n"
        "| case | tool | requests and bytes by kind | total | share of the pack | packs's `delta` (--json) |\n"
        "|---|---|---|---:|---:|---|\n" + "\n".join(rows) + "\n")
    sizes(b)


def index_json(index_path):
    """An index file's JSON: the file as it is, or decompressed when it is zstd (as packs pack writes them)."""
    with open(index_path, "rb") as f:
        raw = f.read()
    if raw.startswith(b"\x28\xb5\x2f\xfd"):
        raw = subprocess.run(["zstd", "-dc"], input=raw, stdout=subprocess.PIPE, check=True).stdout
    return raw


def chunks_of(index_path):
    """The chunks of a pack's index: [(file path, chunk)], in the pack's order."""
    index = json.loads(index_json(index_path))
    return [(e["path"], c) for e in index["entries"] for c in e.get("chunks") or []]


def where_bytes_go(b, letter, measured):
    """One row of the analysis: what packs needed and fetched, the index's size as JSON and compressed, casync's."""
    new_name, old_name = ("a1", "a1") if letter == "c" else (f"{letter}2", f"{letter}1")
    new_index = os.path.join(b.site, "chunks", new_name, f"{new_name[0]}.tar.zst.index.json")
    old_index = os.path.join(b.site, "chunks", old_name, f"{old_name[0]}.tar.zst.index.json")
    if letter == "c":   # the one chunk of level.dat holding the flipped byte
        at, needed = 0, []
        for path, chunk in chunks_of(new_index):
            if path == "Contents/level.dat":
                if at <= FLIP_AT < at + chunk["size"]:
                    needed.append(chunk)
                at += chunk["size"]
    else:
        have = {c["sha256"] for _p, c in chunks_of(old_index)}
        needed = list({c["sha256"]: c for _p, c in chunks_of(new_index) if c["sha256"] not in have}.values())
    served, raw = os.path.getsize(new_index), index_json(new_index)
    gz = len(zlib.compress(raw, 9))
    ours, theirs = measured[(letter, "packs")][-1], measured[(letter, "casync")][-1]
    # Slices of one shared frame (index format 3, zstd-frame-slice) give the same range: each frame counts once.
    stored = sum({(c["offset"], c["length"]): c["length"] for c in needed}.values())
    ranges = ours.get("pack", [0, 0])
    caidx, chunks = theirs.get("caidx", [0, 0]), theirs.get("chunks", [0, 0])
    return (f"| {letter} | {served / 1e6:.3f} MB ({len(raw) / 1e6:.3f}, {gz / 1e6:.3f}) | {len(needed)}: {stored / 1e6:.3f} MB | "
            f"{ranges[0]}: {ranges[1] / 1e6:.3f} MB | {(ranges[1] - stored) / 1e6:+.3f} MB | {caidx[1] / 1e6:.3f} MB | "
            f"{chunks[0]}: {chunks[1] / 1e6:.3f} MB |")


def sizes(b):
    """f: a chunked tar.zst from packs pack against bsdtar --zstd at level 3, on ~300 MB of real files."""
    log("case 12f: packs pack against bsdtar --zstd on /usr/share/doc and shared libraries…")
    mix = os.path.join(b.tmp, "chunks", "mix")
    total_bytes = 0
    seen = set()
    # Regular files only (a symlink that leaves the folder is refused by packs pack), in a fixed order; shared
    # libraries of at most 8 MiB, each once (libLLVM's two 110 MB files would otherwise be two thirds of the
    # libraries, and Mesa's drivers are one file under many names), until the whole is about 300 MB.
    for top, root_dir in (("doc", "/usr/share/doc"), ("lib", "/usr/lib/x86_64-linux-gnu")):
        for root, dirs, files in os.walk(root_dir):
            dirs.sort()
            for n in sorted(files):
                path = os.path.join(root, n)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                st = os.stat(path)
                if top == "lib" and (".so" not in n or st.st_size > 8 * MiB or (st.st_dev, st.st_ino) in seen
                                     or total_bytes + st.st_size > 300_000_000):
                    continue
                seen.add((st.st_dev, st.st_ino))
                dest = os.path.join(mix, top, os.path.relpath(path, root_dir))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                try:
                    shutil.copy2(path, dest)
                except OSError:
                    continue
                total_bytes += os.path.getsize(dest)
    files = sum(len(f) for _r, _d, f in os.walk(mix))
    out = os.path.join(b.tmp, "chunks", "f")
    os.makedirs(out, exist_ok=True)
    bsd = timed(["bsdtar", "--zstd", "--options", "zstd:compression-level=3", "-cf", f"{out}/mix-bsdtar.tar.zst", "-C", mix, "."], b.tmp)
    if bsd.code != 0:
        raise Failure(f"case 12f: bsdtar exited {bsd.code}: {bsd.err[-2000:]}")
    theirs = os.path.getsize(f"{out}/mix-bsdtar.tar.zst")
    rows = []
    for average in (32, 64, 128, 256, 1024):
        pack = f"{out}/mix-{average}.tar.zst"
        run = timed([b.packs, "pack", mix, "--output", pack, "--chunk-average", str(average)], b.tmp)
        if run.code != 0:
            raise Failure(f"case 12f: packs pack --chunk-average {average} exited {run.code}: {run.err[-2000:]}")
        ours, index = os.path.getsize(pack), os.path.getsize(pack + ".index.json")
        check = subprocess.run(f"zstd -dc {pack} | tar -tf - | wc -l", shell=True, stdout=subprocess.PIPE, text=True)
        default = average == 32
        if average in (32, 1024):   # the default and the largest in the summary; every size in the section
            b.report.rows.append(("12f", f"size of a chunked tar.zst (chunks {average // 2}–{average * 8} KiB"
                                  f"{', the default' if default else ''}) on {total_bytes / 1e6:.0f} MB, {files} files"
                                  f" (index {index / 1e6:.2f} MB more)",
                                  f"{ours / 1e6:.1f} MB", "bsdtar --zstd, level 3", f"{theirs / 1e6:.1f} MB", f"{ours / theirs:.3f}",
                                  "≤ 1.05", "pass" if ours <= 1.05 * theirs else "**FAIL**"))
        rows.append(f"| {average} KiB | {ours / 1e6:.2f} MB | {ours / theirs:.3f} | {index / 1e6:.2f} MB | {run.wall:.1f} s |"
                    f" {check.stdout.strip()} |")
        os.remove(pack)
        os.remove(pack + ".index.json")
    # Where the difference comes from: the small text files, or the libraries (default chunks).
    split = []
    for part in ("doc", "lib"):
        sh(["bsdtar", "--zstd", "--options", "zstd:compression-level=3", "-cf", f"{out}/{part}-bsdtar.tar.zst", "-C",
            os.path.join(mix, part), "."])
        sh([b.packs, "pack", os.path.join(mix, part), "--output", f"{out}/{part}.tar.zst"])
        part_files = sum(len(f) for _r, _d, f in os.walk(os.path.join(mix, part)))
        ours, theirs_part = os.path.getsize(f"{out}/{part}.tar.zst"), os.path.getsize(f"{out}/{part}-bsdtar.tar.zst")
        split.append(f"{part} alone ({part_files} files): {ours / 1e6:.2f} MB ÷ {theirs_part / 1e6:.2f} MB = {ours / theirs_part:.3f}")
    b.report.sections.append(
        f"\n### Case 12f: pack size against chunk size ({total_bytes / 1e6:.0f} MB, {files} files; "
        f"bsdtar --zstd level 3: {theirs / 1e6:.2f} MB in {bsd.wall:.1f} s)\n\n"
        "| average chunk | tar.zst | ÷ bsdtar | index (.index.json) | packs pack time | entries listed by zstd -d \\| tar -t |\n"
        "|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\nWith the default chunks, "
        + "; ".join(split) + ".\n")
    shutil.rmtree(mix, ignore_errors=True)
