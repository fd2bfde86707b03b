#!/usr/bin/env python3
"""PackDelivery against curl, aria2c and bsdtar: the measuring half of Benchmarks/run.

Benchmarks/run installs the tools, builds packs, starts nginx over TMP/site and calls this with the
port. Everything here is written under TMP and the --shm folder (random data, homes, outputs). Each
measured command runs under /usr/bin/time -f "%e %U %S %M" (wall time is taken here with
perf_counter); the commands of one case run alternately, the order rotated each round, and their
medians are compared.
"""
import argparse
import glob
import json
import os
import random
import resource
import shlex
import shutil
import socket
import signal
import statistics
import subprocess
import sys
import time

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


class Failure(Exception):
    pass


class Run:
    def __init__(self, wall, user, sys_, rss_kib, code, out, err):
        self.wall, self.user, self.sys, self.rss_kib, self.code, self.out, self.err = wall, user, sys_, rss_kib, code, out, err
        self.other = float("nan")   # CPU seconds used meanwhile by anything but the run and nginx
        self.nginx = 0.0            # CPU seconds nginx used meanwhile

    @property
    def cpu(self):
        return self.user + self.sys


TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds():
    """CPU seconds all CPUs spent busy since boot (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def nginx_seconds(tmp):
    """CPU seconds used so far by nginx's master and workers."""
    total = 0.0
    try:
        with open(os.path.join(tmp, "nginx", "nginx.pid")) as f:
            master = f.read().strip()
    except OSError:
        return 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid == master or fields[1] == master:   # fields[1] is the parent pid
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def timed(cmd, tmp, timeout=900, env=None):
    """Runs cmd (a list, or a string for bash -c) under /usr/bin/time; returns a Run."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else cmd
    time_file = os.path.join(tmp, "time.out")
    busy0, nginx0 = busy_seconds(), nginx_seconds(tmp)
    start = time.perf_counter()
    try:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "-o", time_file] + argv,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"timed out after {timeout} s: {shlex.join(argv)}\nstdout: {e.stdout!r}\nstderr: {e.stderr!r}")
    wall = time.perf_counter() - start
    busy1, nginx1 = busy_seconds(), nginx_seconds(tmp)
    with open(time_file) as f:
        fields = f.read().strip().splitlines()[-1].split()
    run = Run(wall, float(fields[1]), float(fields[2]), int(fields[3]), p.returncode,
              p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
    run.nginx = nginx1 - nginx0
    run.other = max(0.0, (busy1 - busy0) - run.cpu - run.nginx)
    return run


def content_bytes(folder):
    """Files and bytes under any Contents/ folder below `folder` (what a pack unpacks to)."""
    files = total = 0
    for root, _dirs, names in os.walk(folder):
        if "/Contents" not in root + "/":
            continue
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files += 1
                total += os.path.getsize(path)
    return files, total


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(values):
    return statistics.median(values) if values else float("nan")


def fmt_s(seconds):
    return f"{seconds:.2f} s" if seconds >= 0.995 else f"{seconds * 1000:.0f} ms"


def fmt_runs(values):
    """Seconds of several runs: the median, then min–max, in one unit."""
    if len(values) < 2:
        return fmt_s(median(values))
    if median(values) >= 0.995:
        return f"{median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"
    return f"{median(values) * 1000:.0f} ms ({min(values) * 1000:.0f}–{max(values) * 1000:.0f})"


def fmt_mib(kib):
    return f"{kib / 1024:.1f} MiB"


class Bench:
    def __init__(self, args):
        self.packs = args.packs
        self.packs_compare = args.packs_compare or None
        self.tmp = args.tmp
        self.site = os.path.join(args.tmp, "site")
        self.runs = os.path.join(args.tmp, "runs")
        self.port = args.port
        self.base = f"http://127.0.0.1:{args.port}"
        self.access_log = args.access_log
        self.reps = args.reps
        self.only = set(args.only.split(",")) if args.only else None
        self.warm = args.warm
        self.shm = args.shm or None
        # The packs' source folders are made on tmpfs when there is one: deleting tens of thousands of
        # files on the data filesystem would slow the unpack case down (see keep= in alternate()).
        self.src_root = os.path.join(self.shm or self.tmp, "src")
        self.deferred = []   # run folders kept until all cases are done
        self.rows = []      # the summary table
        self.raw = []       # every run, for the appendix
        self.notes = []     # anything broken or surprising
        self.rng = random.Random(8)
        self.load_seconds = args.load_seconds
        self.load_raw = []   # case 8's runs
        os.makedirs(self.runs, exist_ok=True)

    def wants(self, case):
        return self.only is None or str(case) in self.only

    # ---- data ----------------------------------------------------------------------------------

    def random_file(self, path, size):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 8 * MiB)
                f.write(self.rng.randbytes(n))
                left -= n

    def sh(self, argv, **kw):
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
        if p.returncode != 0:
            raise Failure(f"{shlex.join(argv)} exited {p.returncode}:\n{p.stdout.decode()}{p.stderr.decode()}")
        return p.stdout.decode()

    def make_pack(self, name, files, product, output_name, version="1"):
        """files: list of (relative path under Contents/, size). Writes site/NAME/OUTPUT_NAME."""
        src = os.path.join(self.src_root, name, product)
        for rel, size in files:
            self.random_file(os.path.join(src, "Contents", rel), size)
        os.makedirs(os.path.join(self.site, name), exist_ok=True)
        out = os.path.join(self.site, name, output_name)
        self.sh([self.packs, "pack", src, "--output", out, "--product", product, "--version", version])
        shutil.rmtree(src)
        return out

    def make_catalog(self, name, count):
        """count tiny packs (a ContentInfo.plist and Contents/data.txt each) and their manifest, written
        directly (packs pack per pack would take minutes). Returns {product: content}."""
        import hashlib, io, tarfile
        folder = os.path.join(self.site, name)
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

    def manifest(self, name):
        self.sh([self.packs, "manifest", os.path.join(self.site, name)])
        with open(os.path.join(self.site, name, "manifest.json")) as f:
            m = json.load(f)
        return {p["productIdentifier"]: p["contents"][0] for p in m["products"]}

    def make_data(self):
        t0 = time.time()
        self.data = {}
        if self.wants(1) or self.wants(2) or self.wants(3) or self.wants(7):
            log("data: 1 GiB pack (4 × 256 MiB, tar)…")
            self.make_pack("big", [(f"part{i}.bin", 256 * MiB) for i in range(4)], "com.bench.big", "big.tar")
            self.data["big"] = self.manifest("big")["com.bench.big"]
        if self.wants(3) or self.wants(5):
            log("data: 256 MiB pack (2 × 128 MiB, tar)…")
            self.make_pack("mid", [(f"part{i}.bin", 128 * MiB) for i in range(2)], "com.bench.mid", "mid.tar")
            self.data["mid"] = self.manifest("mid")["com.bench.mid"]
        if self.wants(4):
            log("data: 200 small packs (≈60 KiB each, tar.gz)…")
            for n in range(200):
                sizes = [self.rng.randint(12, 28) * KiB for _ in range(3)]
                self.make_pack("small", [(f"f{i}.bin", s) for i, s in enumerate(sizes)],
                               f"com.bench.small.{n}", f"small-{n:03d}.tar.gz")
            self.data["small"] = self.manifest("small")
        if self.wants(6):
            log("data: 10,000 files of 1–8 KiB (tar.gz), and a one-file pack…")
            files = [(f"d{i // 100:02d}/f{i % 100:02d}.bin", self.rng.randint(1 * KiB, 8 * KiB)) for i in range(10_000)]
            self.make_pack("unpack", files, "com.bench.unpack", "unpack.tar.gz")
            self.data["unpack"] = self.manifest("unpack")["com.bench.unpack"]
            self.make_pack("tiny", [("one.bin", 1 * KiB)], "com.bench.tiny", "tiny.tar.gz")
            self.data["tiny"] = self.manifest("tiny")["com.bench.tiny"]
        if self.wants(9):
            for n in (1_000, 10_000):
                log(f"data: a catalog of {n:,} tiny packs (tar, one 160-byte file each)…")
                self.data[f"catalog{n}"] = self.make_catalog(f"catalog{n}", n)
        if self.wants(10):
            log("data: 1 GiB of compressible content (4 × 256 MiB, half random), tar.zst…")
            src = os.path.join(self.src_root, "zst", "com.bench.zst")
            for i in range(4):
                path = os.path.join(src, "Contents", f"level{i}.dat")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    for _ in range(256):
                        # Like game data: half of each MiB incompressible (textures, audio), half runs and tables.
                        f.write(self.rng.randbytes(512 * KiB) + bytes(range(256)) * 2048)
            os.makedirs(os.path.join(self.site, "zst"), exist_ok=True)
            self.sh([self.packs, "pack", src, "--output", os.path.join(self.site, "zst", "zst.tar.zst"),
                     "--product", "com.bench.zst", "--version", "1"])
            shutil.rmtree(src)
            self.data["zst"] = self.manifest("zst")["com.bench.zst"]
        if self.wants(11):
            log("data: a 1000 MiB zip pack of 2,000 files and its next version with 20 files changed, indexed…")
            src = os.path.join(self.src_root, "delta", "com.bench.delta")
            files = [os.path.join(src, "Contents", f"d{i // 100:02d}", f"f{i % 100:02d}.bin") for i in range(2000)]
            for path in files:
                self.random_file(path, 512 * KiB)
            for version, folder in (("1", "delta1"), ("2", "delta2")):
                if version == "2":
                    for path in files[37::100]:   # 20 files, one in each folder
                        self.random_file(path, 512 * KiB)
                os.makedirs(os.path.join(self.site, folder), exist_ok=True)
                self.sh([self.packs, "pack", src, "--output", os.path.join(self.site, folder, "d.zip"),
                         "--product", "com.bench.delta", "--version", version])
                self.data[folder] = self.manifest(folder)["com.bench.delta"]
            shutil.rmtree(src)
            if shutil.which("zsyncmake"):
                self.sh(["zsyncmake", "-u", f"{self.base}/delta2/d.zip", "-o", os.path.join(self.site, "delta2", "d.zip.zsync"),
                         os.path.join(self.site, "delta2", "d.zip")])
        if self.wants(8):
            log("data: a 4 MiB file for the server load case…")
            self.random_file(os.path.join(self.site, "load", "pack4m.bin"), 4 * MiB)
        if getattr(self, "profile", False):
            log("data: 64 MiB pack for callgrind…")
            self.make_pack("prof", [(f"part{i}.bin", 16 * MiB) for i in range(4)], "com.bench.prof", "prof.tar")
            self.data["prof"] = self.manifest("prof")["com.bench.prof"]
        shutil.rmtree(self.src_root, ignore_errors=True)
        # Every served file is read once now, so that all runs read it from the page cache.
        for path in glob.glob(os.path.join(self.site, "*", "*")):
            with open(path, "rb") as f:
                while f.read(8 * MiB):
                    pass
        log(f"data ready in {time.time() - t0:.0f} s")

    # ---- running alternately --------------------------------------------------------------------

    def fresh(self, label):
        path = os.path.join(self.runs, label)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def prepare(self, warm_bytes, served):
        """Just before a measured run: read the served files (so that they are in the page cache even
        if DAMON paged them out), then touch and free warm_bytes of memory. In this Firecracker VM free
        pages are reported back to the host (virtio-balloon free page reporting), and writing a GiB of
        page cache into pages the host took back costs 1.2–2.7 s of sys time instead of ≈0.45 s: touching
        the memory first gives every run the same, bare-metal-like page supply."""
        buffer = bytearray(8 * MiB)
        for path in served:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass
        if self.warm and warm_bytes:
            block = bytearray(warm_bytes)   # zero-filled: every page is touched
            del block

    def alternate(self, case, commands, reps, check=None, warm_bytes=0, served=(), keep=False):
        """commands: list of (name, make(workdir) -> cmd). Runs them round-robin, reps rounds, the
        order rotated by one every round. Returns {name: [Run]}. warm_bytes: one size for all, or a
        dict {name: bytes} (see prepare()).

        keep: leave each run's output in place until every case is done, instead of deleting it
        before the next run. For outputs of thousands of files: this ext4 has no journal, and without
        one ext4 will not reuse an inode freed less than 60 s ago (300 s while its inode table block
        is dirty; ialloc.c, recently_deleted()), checking every such inode on each allocation: right
        after 10,000 files were deleted, creating 10,000 more took 3–7 s instead of 0.5 s, at random."""
        results = {name: [] for name, _ in commands}
        for r in range(reps):
            k = r % len(commands)
            order = list(enumerate(commands))
            if r % 2 == 1 and any(name == "packs (compare)" for name, _ in commands):
                # The two builds of packs run back to back; which goes first alternates, so that each follows
                # the same runs as often (with a fixed cyclic order one always followed the other, and came
                # out ≈ 8 % slower whichever build it was).
                a, b = (i for i, (name, _) in enumerate(commands) if name in ("packs", "packs (compare)"))
                order[a], order[b] = order[b], order[a]
            for index, (name, make) in order[k:] + order[:k]:
                work = self.fresh(f"c{case}-{index}-{r}")
                cmd = make(work)
                self.prepare(warm_bytes.get(name, 0) if isinstance(warm_bytes, dict) else warm_bytes, served)
                run = timed(cmd, self.tmp)
                if run.code != 0:
                    raise Failure(f"case {case}, {name}, round {r}: exit {run.code}\ncommand: {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n"
                                  f"stdout: {run.out[-2000:]}\nstderr: {run.err[-2000:]}")
                if check:
                    check(name, work, run)
                results[name].append(run)
                self.raw.append((case, name, r, run))
                log(f"  case {case} round {r} {name:<18} {run.wall:7.3f} s  cpu {run.cpu:6.2f} s  rss {run.rss_kib / 1024:7.1f} MiB"
                    f"  other cpu {run.other:5.2f} s")
                if keep:
                    self.deferred.append(work)
                else:
                    shutil.rmtree(work, ignore_errors=True)
                os.sync()
        return results

    def expect_content(self, expected_files, expected_bytes):
        def check(name, work, run):
            files, total = content_bytes(work)
            if (files, total) != (expected_files, expected_bytes):
                raise Failure(f"{name}: unpacked {files} files / {total} bytes under {work}, expected {expected_files} / {expected_bytes}")
        return check

    def row(self, case, what, ours, peer_name, peer, target=None, unit="s"):
        """ours and peer: a number, or a list of runs' values (shown as median, then min–max)."""
        def value(v):
            return median(v) if isinstance(v, list) else v

        def show(v):
            one = fmt_s if unit == "s" else (lambda x: f"{x:.2f}")
            if isinstance(v, list) and len(v) > 1:
                if unit == "s":
                    return fmt_runs(v)
                return f"{one(median(v))} ({one(min(v))}–{one(max(v))})"
            return one(value(v))
        ratio = value(ours) / value(peer) if value(peer) else float("nan")
        verdict = ""
        if target is not None:
            verdict = "pass" if ratio <= target else "**FAIL**"
        self.rows.append((str(case), what, show(ours), peer_name, show(peer), f"{ratio:.2f}",
                          f"≤ {target}" if target is not None else "–", verdict))
        return ratio

    def packs_cmd(self, home, *rest, binary=None):
        return [binary or self.packs, "--home", home, "--quiet", *rest]

    def compare_commands(self, manifest, product):
        """With --compare: the same fetch by another build of packs, alternated with this one's."""
        if not self.packs_compare:
            return []
        return [("packs (compare)", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, product, binary=self.packs_compare))]

    @staticmethod
    def with_compare(commands, compare):
        """The compare command right after packs (alternate() swaps the two every other round)."""
        return commands[:1] + compare + commands[1:]

    def compare_row(self, case, what, walls):
        if "packs (compare)" in walls:
            self.row(case, what + ": this build ÷ the --compare build", walls["packs"], "packs (compare)", walls["packs (compare)"])

    # ---- case 1 (and 2, 3, 7): one 1 GiB pack ----------------------------------------------------

    def case_big(self):
        big = self.data["big"]
        url = f"{self.base}/big/{big['url']}"
        manifest = f"{self.base}/big/manifest.json"
        sha = big["sha256"]
        size = big["contentLength"]
        content = (4, 4 * 256 * MiB)
        commands = [
            ("packs", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.big")),
            ("curl+openssl+bsdtar", lambda w: (
                f"curl -s -f -o {w}/big.tar {url} && "
                f"[ \"$(openssl dgst -sha256 -r {w}/big.tar | cut -d' ' -f1)\" = {sha} ] && "
                f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out")),
            ("aria2c+bsdtar", lambda w: (
                f"aria2c -q --checksum=sha-256={sha} -d {w} -o big.tar {url} && "
                f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out")),
            # packs makes the install durable (issue 12): the same pipeline, then syncfs of the filesystem,
            # which writes what packs writes (the archive and the content).
            ("curl+openssl+bsdtar+sync", lambda w: (
                f"curl -s -f -o {w}/big.tar {url} && "
                f"[ \"$(openssl dgst -sha256 -r {w}/big.tar | cut -d' ' -f1)\" = {sha} ] && "
                f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out && sync -f {w}/out")),
        ]
        commands = self.with_compare(commands, self.compare_commands(manifest, "com.bench.big"))
        log("case 1: 1 GiB pack end to end (one warm-up round, not counted)…")
        served = [os.path.join(self.site, "big", big["url"])]
        warm = size * 2 + 256 * MiB   # the archive and its content
        self.alternate(1, commands, 1, check=self.expect_content(*content), warm_bytes=warm, served=served)
        self.raw = [r for r in self.raw if r[0] != 1]
        res = self.alternate(1, commands, self.reps, check=self.expect_content(*content), warm_bytes=warm, served=served)
        ours = median([r.wall for r in res["packs"]])
        walls = {name: [r.wall for r in runs] for name, runs in res.items()}
        self.row(1, "1 GiB pack, end to end", walls["packs"], "curl + openssl dgst + bsdtar -xf", walls["curl+openssl+bsdtar"], target=0.8)
        self.row(1, "1 GiB pack, end to end", walls["packs"], "aria2c --checksum + bsdtar -xf", walls["aria2c+bsdtar"])
        self.row(1, "1 GiB pack, end to end (durable)", walls["packs"], "curl + openssl dgst + bsdtar -xf && sync -f",
                 walls["curl+openssl+bsdtar+sync"])
        self.compare_row(1, "1 GiB pack", walls)
        self.big_results = res

        # case 2: each stage alone
        log("case 2: each stage alone…")
        archive = served[0]
        stages = [
            ("curl -o file", lambda w: ["curl", "-s", "-f", "-o", f"{w}/big.tar", url]),
            ("openssl dgst -sha256", lambda w: ["openssl", "dgst", "-sha256", archive]),
            ("bsdtar -xf", lambda w: f"mkdir {w}/out && bsdtar -xf {archive} -C {w}/out"),
        ]
        peers_alone = [
            ("curl -o /dev/null", lambda w: ["curl", "-s", "-f", "-o", "/dev/null", url]),
            ("aria2c --checksum alone", lambda w: ["aria2c", "-q", f"--checksum=sha-256={sha}", "-d", w, "-o", "big.tar", url]),
        ]
        st = self.alternate(2, stages + peers_alone, self.reps, warm_bytes=size + 256 * MiB, served=served)
        medians = {name: median([r.wall for r in st[name]]) for name, _ in stages}
        slowest = max(medians, key=medians.get)
        for name, _ in stages:
            self.rows.append(("2", f"stage alone: {name}", "", "", fmt_runs([r.wall for r in st[name]]), "", "", ""))
        for name, _ in peers_alone:
            what = {"curl -o /dev/null": "the network alone, nothing written",
                    "aria2c --checksum alone": "download + its own hash check"}[name]
            self.rows.append(("2", f"for reference: {name} ({what})", "", "",
                              fmt_runs([r.wall for r in st[name]]), "", "", ""))
        self.row(2, "case 1 ÷ slowest stage alone (the physical limit)", ours, f"{slowest} alone", medians[slowest])
        self.row(2, "case 1 ÷ sum of the stages (no overlap at all)", ours, "sum of the three stages", sum(medians.values()))
        self.stage_medians = medians
        self.stage_results = st
        self.busy_row(1, res["packs"])

        # case 7: CPU seconds per GiB
        gib = size / GiB
        cpu_ours = median([r.cpu for r in res["packs"]]) / gib
        cpu_curl = median([r.cpu for r in st["curl -o file"]]) / gib
        cpu_pipe = median([r.cpu for r in res["curl+openssl+bsdtar"]]) / gib
        cpu_aria = median([r.cpu for r in res["aria2c+bsdtar"]]) / gib
        self.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "curl -o file alone", cpu_curl, unit="cpu")
        self.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "curl + openssl + bsdtar", cpu_pipe, unit="cpu")
        self.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "aria2c + bsdtar", cpu_aria, unit="cpu")

        # Where packs's time goes: one more run with --json, the phase changes time-stamped here.
        self.phases_big = []
        for _ in range(2):
            self.prepare(warm, served)
            self.phases_big.append(self.phase_run(manifest, "com.bench.big"))

    def phase_run(self, manifest, product):
        home = os.path.join(self.fresh("phases"), "home")
        start = time.perf_counter()
        p = subprocess.Popen([self.packs, "--home", home, "--json", "fetch", manifest, product],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in p.stdout:
            t = time.perf_counter() - start
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") != "download":
                continue
            key = event.get("phase") or event.get("state")
            if not seen or seen[-1][0] != key:
                seen.append((key, t))
        p.wait()
        end = time.perf_counter() - start
        shutil.rmtree(os.path.dirname(home), ignore_errors=True)
        os.sync()
        spans = []
        previous_name, previous_t = "start-up (process start → first download event)", 0.0
        for name, t in seen:
            spans.append((previous_name, t - previous_t))
            previous_name, previous_t = name, t
        spans.append((f"{previous_name} → exit", end - previous_t))
        return spans, end

    # ---- how busy the machine was: CPU-bound or waiting ---------------------------------------------

    def busy_row(self, case, runs):
        """The share of all cores that packs, nginx and the kernel's writeback kept busy during packs's runs
        (medians). Near 100 % the fetch is bound by the CPU it needs: overlapping its stages better cannot make
        it faster, only doing less work can."""
        cores = os.cpu_count() or 1
        own = median([r.cpu for r in runs])
        nginx = median([r.nginx for r in runs])
        other = median([r.other for r in runs])
        wall = median([r.wall for r in runs])
        self.rows.append((str(case), f"packs: CPU of packs {own:.2f} s + nginx {nginx:.2f} s + other (writeback) {other:.2f} s "
                                     f"over {wall:.2f} s × {cores} cores", f"{(own + nginx + other) / (wall * cores):.0%} busy",
                          "", "", "", "", ""))

    # ---- case 10: a compressed pack of compressible content (issue 14) ---------------------------

    def case_zst(self):
        zst = self.data["zst"]
        url = f"{self.base}/zst/{zst['url']}"
        manifest = f"{self.base}/zst/manifest.json"
        commands = [
            ("packs", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.zst")),
            ("curl+openssl+bsdtar", lambda w: (
                f"curl -s -f -o {w}/zst.tar.zst {url} && "
                f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
                f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out")),
            ("curl+openssl+bsdtar+sync", lambda w: (
                f"curl -s -f -o {w}/zst.tar.zst {url} && "
                f"[ \"$(openssl dgst -sha256 -r {w}/zst.tar.zst | cut -d' ' -f1)\" = {zst['sha256']} ] && "
                f"mkdir {w}/out && bsdtar -xf {w}/zst.tar.zst -C {w}/out && sync -f {w}/out")),
        ]
        commands = self.with_compare(commands, self.compare_commands(manifest, "com.bench.zst"))
        log(f"case 10: {zst['contentLength'] / MiB:.0f} MiB tar.zst of 1 GiB compressible content…")
        served = [os.path.join(self.site, "zst", zst["url"])]
        res = self.alternate(10, commands, self.reps, check=self.expect_content(4, GiB),
                             warm_bytes=zst["contentLength"] + GiB + 256 * MiB, served=served)
        walls = {name: [r.wall for r in runs] for name, runs in res.items()}
        what = f"tar.zst, {zst['contentLength'] / MiB:.0f} MiB pack → 1 GiB"
        self.row(10, what, walls["packs"], "curl + openssl dgst + bsdtar -xf", walls["curl+openssl+bsdtar"], target=0.6)
        self.row(10, what + " (durable)", walls["packs"], "curl + openssl dgst + bsdtar -xf && sync -f", walls["curl+openssl+bsdtar+sync"])
        self.compare_row(10, what, walls)
        self.rows.append(("10", "packs peak RSS (max of runs)", fmt_mib(max(r.rss_kib for r in res["packs"])), "", "", "", "≤ 64 MiB", ""))
        self.busy_row(10, res["packs"])

    # ---- case 11: delta update ------------------------------------------------------------------

    def case_delta(self):
        """Issue 17: version 1 of a 1000 MiB zip of 2,000 files is installed (not timed); then version 2, with 20
        files changed, is fetched as a delta, as a whole pack (--no-delta), and by zsync from the old pack file."""
        old, new = self.data["delta1"], self.data["delta2"]
        length = new["contentLength"]
        served = {}   # name -> [bytes of /delta2/d.zip the server sent, per run]
        mark = {}

        def setup(work):
            home = f"{work}/home"
            self.sh(self.packs_cmd(home, "fetch", f"{self.base}/delta1/manifest.json", "com.bench.delta"))
            return home

        def counted(name, make):
            def wrapped(work):
                cmd = make(work)
                # Version 1 was installed long before its update comes: its bytes are on disk, not dirty in the
                # page cache (else the update's first fsync waits for the whole install to be written back).
                os.sync()
                mark[name] = len(self.log_lines())
                return cmd
            return name, wrapped

        def check(name, work, run):
            sent = 0
            for line in self.log_lines()[mark[name]:]:
                fields = line.split(" ")
                if fields[0].startswith("/delta2/d.zip") and not fields[0].endswith(".zsync"):
                    sent += int(fields[2])
            served.setdefault(name, []).append(sent)
            if name.startswith("packs"):
                out = self.sh(self.packs_cmd(f"{work}/home", "--json", "content", "com.bench.delta"))
                if '"contentVersion":"2"' not in out.replace(" ", ""):
                    raise Failure(f"{name}: version 2 is not installed: {out}")
                self.sh(self.packs_cmd(f"{work}/home", "verify", "com.bench.delta"))

        commands = [
            counted("packs delta", lambda w: self.packs_cmd(setup(w), "fetch", f"{self.base}/delta2/manifest.json", "com.bench.delta")),
            counted("packs --no-delta", lambda w: self.packs_cmd(setup(w), "fetch", f"{self.base}/delta2/manifest.json", "com.bench.delta", "--no-delta")),
        ]
        zsync = shutil.which("zsync") and os.path.exists(os.path.join(self.site, "delta2", "d.zip.zsync"))
        if zsync:
            def zsync_cmd(work):
                shutil.copy(os.path.join(self.site, "delta1", old["url"]), f"{work}/old.zip")
                return f"cd {work} && zsync -q -i old.zip -o new.zip {self.base}/delta2/d.zip.zsync && [ \"$(openssl dgst -sha256 -r new.zip | cut -d' ' -f1)\" = {new['sha256']} ]"
            commands.append(counted("zsync", zsync_cmd))
        else:
            self.notes.append("case 11: zsync is not installed (Debian has it: apt-get install zsync); compared without it.")
        log(f"case 11: delta update of a {length / MiB:.0f} MiB zip, 20 of 2,000 files changed…")
        # Each command's warm-up is the memory it uses: touching and freeing 2 GiB just before a 0.3 s run makes
        # the host take those pages back during the run, and the run's own page faults pay for it (measured here:
        # the delta took 0.30 s after no warm-up, 0.58–0.73 s right after a 2 GiB one).
        warm = {"packs delta": 64 * MiB, "packs --no-delta": 2 * length, "zsync": 2 * length}
        # keep: 2,000 files deleted before a run make every file it creates slow on this journal-less ext4 (see
        # alternate()); the delta, 0.3 s, took twice as long after the previous round's trees were deleted.
        res = self.alternate(11, commands, self.reps, check=check, warm_bytes=warm, keep=True,
                             served=[os.path.join(self.site, "delta2", new["url"])])
        walls = {name: [r.wall for r in runs] for name, runs in res.items()}
        what = f"update, {length / MiB:.0f} MiB zip, 20 of 2,000 files changed"
        self.row(11, what, walls["packs delta"], "packs fetch --no-delta (whole pack)", walls["packs --no-delta"], target=0.1)
        if zsync:
            self.row(11, what, walls["packs delta"], "zsync -i old pack (file only, no unpack)", walls["zsync"])
        share = median(served["packs delta"]) / length
        self.rows.append(("11", "bytes served, share of the pack (median): " + ", ".join(
            f"{n} {median(v) / MiB:.1f} MiB ({median(v) / length:.2%})" for n, v in served.items()),
            f"{share:.2%}", "", "", "", "≤ 3%", "pass" if share <= 0.03 else "**FAIL**"))
        self.rows.append(("11", "packs peak RSS, delta (max of runs)", fmt_mib(max(r.rss_kib for r in res["packs delta"])), "", "", "", "", ""))

    # ---- case 3: peak memory --------------------------------------------------------------------

    def case_memory(self):
        mid = self.data["mid"]
        url = f"{self.base}/mid/{mid['url']}"
        manifest = f"{self.base}/mid/manifest.json"
        commands = [
            ("packs", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.mid")),
            ("curl+openssl+bsdtar", lambda w: (
                f"curl -s -f -o {w}/mid.tar {url} && "
                f"[ \"$(openssl dgst -sha256 -r {w}/mid.tar | cut -d' ' -f1)\" = {mid['sha256']} ] && "
                f"mkdir {w}/out && bsdtar -xf {w}/mid.tar -C {w}/out")),
        ]
        log("case 3: 256 MiB pack (peak memory)…")
        res = self.alternate(3, commands, self.reps, check=self.expect_content(2, 256 * MiB),
                             warm_bytes=mid["contentLength"] * 2 + 128 * MiB, served=[os.path.join(self.site, "mid", mid["url"])])
        rss_mid = max(r.rss_kib for r in res["packs"])
        big = getattr(self, "big_results", None)
        if big:
            rss_big = max(r.rss_kib for r in big["packs"])
            spread = abs(rss_big - rss_mid) / max(rss_big, rss_mid)
            self.rows.append(("3", "packs peak RSS (max of runs): 1 GiB pack", fmt_mib(rss_big), "", "", "", "≤ 64 MiB",
                              "pass" if rss_big <= 64 * 1024 else "**FAIL**"))
        self.rows.append(("3", "packs peak RSS (max of runs): 256 MiB pack", fmt_mib(rss_mid), "", "", "", "≤ 64 MiB",
                          "pass" if rss_mid <= 64 * 1024 else "**FAIL**"))
        if big:
            self.rows.append(("3", "peak RSS, 1 GiB vs 256 MiB", f"{spread * 100:.1f} % apart", "", "", "", "within 10 %",
                              "pass" if spread <= 0.10 else "**FAIL**"))
        ours = median([r.wall for r in res["packs"]])
        self.row(3, "256 MiB pack, end to end (for reference)", [r.wall for r in res["packs"]], "curl + openssl dgst + bsdtar -xf",
                 [r.wall for r in res["curl+openssl+bsdtar"]])
        peer_rss = max(r.rss_kib for r in res["curl+openssl+bsdtar"])
        self.rows.append(("3", "peak RSS of the largest curl/openssl/bsdtar process, 256 MiB", fmt_mib(peer_rss), "", "", "", "", ""))
        self.__dict__.pop("big_results", None)

    # ---- case 4: 200 small packs in one fetch ---------------------------------------------------

    def case_small(self):
        small = self.data["small"]
        ids = sorted(small, key=lambda p: int(p.rsplit(".", 1)[1]))
        manifest = f"{self.base}/small/manifest.json"
        cfg = os.path.join(self.tmp, "small-curl.cfg")
        with open(cfg, "w") as f:
            for pid in ids:
                f.write(f'url = "{self.base}/small/{small[pid]["url"]}"\n')
        sums = os.path.join(self.tmp, "small.sha256")
        with open(sums, "w") as f:
            for pid in ids:
                f.write(f'{small[pid]["sha256"]}  {small[pid]["url"]}\n')
        aria_list = os.path.join(self.tmp, "small-aria2.txt")
        with open(aria_list, "w") as f:
            for pid in ids:
                f.write(f'{self.base}/small/{small[pid]["url"]}\n  checksum=sha-256={small[pid]["sha256"]}\n')
        unpack_all = 'for f in *.tar.gz; do mkdir "../out/${f%.tar.gz}" && bsdtar -xf "$f" -C "../out/${f%.tar.gz}" || exit 1; done'
        commands = [
            ("packs -c4", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, *ids)),
            ("packs -c8", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, *ids, "--concurrency", "8")),
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
        res = self.alternate(4, commands, self.reps, check=check, warm_bytes=128 * MiB, keep=True,
                             served=glob.glob(os.path.join(self.site, "small", "*")))
        m = {name: [r.wall for r in runs] for name, runs in res.items()}
        self.row(4, "200 × 60 KiB packs, --concurrency 4 (default)", m["packs -c4"], "curl --parallel-max 8 + sha256sum + bsdtar", m["curl -Z 8"], target=1.0)
        self.row(4, "200 × 60 KiB packs, --concurrency 4 (default)", m["packs -c4"], "aria2c -j8 (checksum=) + bsdtar", m["aria2c -j8"], target=1.0)
        self.row(4, "200 × 60 KiB packs, --concurrency 8", m["packs -c8"], "curl --parallel-max 8 + sha256sum + bsdtar", m["curl -Z 8"], target=1.0)
        self.row(4, "200 × 60 KiB packs, --concurrency 8", m["packs -c8"], "aria2c -j8 (checksum=) + bsdtar", m["aria2c -j8"], target=1.0)
        cpu = {name: median([r.cpu for r in runs]) for name, runs in res.items()}
        self.rows.append(("4", "CPU user+sys (median): " + ", ".join(f"{n} {c:.2f} s" for n, c in cpu.items()), "", "", "", "", "", ""))

    # ---- case 5: resume waste -------------------------------------------------------------------

    def log_lines(self):
        with open(self.access_log) as f:
            return f.read().splitlines()

    def socket_queues(self):
        """Bytes queued on the loopback connections to nginx right now: (server send queue, client
        receive queue), from /proc/net/tcp (hex "tx_queue:rx_queue")."""
        send = receive = 0
        try:
            with open("/proc/net/tcp") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local_port = int(fields[1].split(":")[1], 16)
                    remote_port = int(fields[2].split(":")[1], 16)
                    tx, rx = (int(x, 16) for x in fields[4].split(":"))
                    if local_port == self.port:
                        send += tx
                    elif remote_port == self.port:
                        receive += rx
        except OSError:
            pass
        return send, receive

    def kill_at_half(self, argv, partial_glob, size):
        """Starts argv, SIGKILLs it once a file matching partial_glob holds half of size bytes.
        Returns (bytes when killed, queued bytes (send, receive) just before, bytes on disk after)."""
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        killed_at, queues = None, (0, 0)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            parts = glob.glob(partial_glob)
            have = 0
            if parts:
                try:
                    have = os.path.getsize(parts[0])
                except OSError:
                    pass
            if have >= size // 2:
                queues = self.socket_queues()
                os.kill(p.pid, signal.SIGKILL)
                killed_at = have
                break
            time.sleep(0.002)
        p.wait()
        if killed_at is None:
            raise Failure(f"{shlex.join(argv)} ended (exit {p.returncode}) before half of the file arrived:\n{p.stderr.read().decode()}")
        parts = glob.glob(partial_glob)
        return killed_at, queues, (os.path.getsize(parts[0]) if parts else 0)

    def case_resume(self):
        mid = self.data["mid"]
        size = mid["contentLength"]
        manifest = f"{self.base}/slow/manifest.json"
        path = f"/slow/{mid['url']}"
        url = self.base + path
        wastes = {"packs": [], "curl -C -": []}
        log("case 5: SIGKILL at half of a rate-limited (64 MiB/s) 256 MiB download, then resume…")
        for r in range(max(self.reps, 5)):
            order = ["packs", "curl -C -"] if r % 2 == 0 else ["curl -C -", "packs"]
            for who in order:
                work = self.fresh(f"c5-{r}-{who[:4]}")
                before = len(self.log_lines())
                if who == "packs":
                    home = os.path.join(work, "home")
                    killed_at, queues, on_disk = self.kill_at_half(
                        self.packs_cmd(home, "fetch", manifest, "com.bench.mid"),
                        os.path.join(home, "Caches", ".packdelivery", "downloads", "*.pack"), size)
                    run = timed(self.packs_cmd(home, "resume"), self.tmp, timeout=300)
                    if run.code != 0:
                        raise Failure(f"case 5 round {r}: packs --home H resume exited {run.code}\nstdout: {run.out}\nstderr: {run.err}")
                    files, total = content_bytes(os.path.join(home, "Caches"))
                    if (files, total) != (2, 256 * MiB):
                        status = subprocess.run([self.packs, "--home", home, "status"], stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT).stdout.decode()
                        raise Failure(f"case 5 round {r}: after resume {files} files / {total} bytes installed; packs status:\n{status}")
                else:
                    target = os.path.join(work, "mid.tar")
                    killed_at, queues, on_disk = self.kill_at_half(["curl", "-s", "-f", "-o", target, url], target, size)
                    run = timed(["curl", "-s", "-f", "-C", "-", "-o", target, url], self.tmp, timeout=300)
                    digest = self.sh(["openssl", "dgst", "-sha256", "-r", target]).split()[0]
                    if run.code != 0 or digest != mid["sha256"]:
                        raise Failure(f"case 5 round {r}: curl -C - exited {run.code}, sha256 {digest}\n{run.err}")
                # nginx logs a request when it ends; the killed one ends when nginx notices the reset.
                lines = []
                for _ in range(100):
                    lines = [l for l in self.log_lines()[before:] if l.split(" ", 1)[0] == path]
                    if len(lines) >= 2:
                        break
                    time.sleep(0.1)
                sent = sum(int(l.split()[2]) for l in lines)
                ranges = [l.split('"')[1] for l in lines]
                waste = sent - size
                wastes[who].append(waste)
                detail = (f"killed with {killed_at} B on disk ({on_disk} after exit); queued just before the kill: nginx send "
                          f"{queues[0]} B, client receive {queues[1]} B; requests {len(lines)}, ranges {ranges}; "
                          f"nginx sent {sent} B; waste {waste} B")
                log(f"  case 5 round {r} {who}: {detail}")
                self.raw.append((5, f"{who} resume — {detail}", r, run))
                shutil.rmtree(work, ignore_errors=True)
                os.sync()
        for who, values in wastes.items():
            w = median(values)
            self.rows.append(("5", f"resume waste, {who}: nginx body bytes − pack size (all runs: "
                              + ", ".join(f"{x / KiB:.0f} KiB" for x in values) + ")",
                              f"{w / MiB:.2f} MiB" if who == "packs" else "", "" if who == "packs" else "curl, then curl -C -",
                              "" if who == "packs" else f"{w / MiB:.2f} MiB", "",
                              "≤ 1 MiB" if who == "packs" else "", ("pass" if w <= MiB else "**FAIL**") if who == "packs" else ""))

    # ---- case 6: unpack only --------------------------------------------------------------------

    def case_unpack(self):
        unpack = self.data["unpack"]
        archive = os.path.join(self.site, "unpack", unpack["url"])
        manifest = "file://" + os.path.join(self.site, "unpack", "manifest.json")
        tiny_manifest = "file://" + os.path.join(self.site, "tiny", "manifest.json")

        def commands(where):
            """where(work) -> the folder the outputs go to (the run folder, or one on tmpfs)."""
            return [
                ("packs fetch file://", lambda w: self.packs_cmd(f"{where(w)}/home", "fetch", manifest, "com.bench.unpack")),
                ("bsdtar -xf", lambda w: f"mkdir -p {where(w)}/out && bsdtar -xf {archive} -C {where(w)}/out"),
                # The same, made durable: packs syncs what it installs (issue 12); bsdtar does not.
                ("bsdtar -xf && sync", lambda w: f"mkdir -p {where(w)}/out && bsdtar -xf {archive} -C {where(w)}/out && sync"),
                ("curl file:// → /dev/null", lambda w: ["curl", "-s", "-o", "/dev/null", "file://" + archive]),
                ("packs fetch 1-file pack", lambda w: self.packs_cmd(f"{where(w)}/home", "fetch", tiny_manifest, "com.bench.tiny")),
            ]

        def check(where):
            def run_check(name, work, run):
                files, _ = content_bytes(where(work))
                want = {"packs fetch file://": 10_000, "bsdtar -xf": 10_000, "bsdtar -xf && sync": 10_000, "packs fetch 1-file pack": 1}.get(name)
                if want is not None and files != want:
                    raise Failure(f"{name}: {files} files unpacked, expected {want}")
                if where(work) != work:
                    shutil.rmtree(where(work), ignore_errors=True)
            return run_check

        variants = [("6", "ext4 (the data's filesystem)", lambda w: w, max(self.reps, 7))]
        if self.shm:
            variants.append(("6b", "tmpfs (/dev/shm: the unpacker's own cost, without ext4 and the VM)",
                             lambda w: os.path.join(self.shm, os.path.basename(w)), max(self.reps, 5)))
        for case, fs, where, reps in variants:
            log(f"case {case}: unpack 10,000 small files on {fs.split(' ')[0]}…")
            res = self.alternate(case, commands(where), reps, check=check(where), warm_bytes=256 * MiB, served=[archive],
                                 keep=(case == "6"))
            m = {name: [r.wall for r in runs] for name, runs in res.items()}
            self.row(case, f"10,000 files (1–8 KiB), tar.gz, on {fs}: packs fetch of a file:// manifest (durable install)",
                     m["packs fetch file://"], "bsdtar -xf (not synced)", m["bsdtar -xf"], target=1.3 if case == "6" else None)
            self.row(case, "… the same", m["packs fetch file://"], "bsdtar -xf && sync", m["bsdtar -xf && sync"])
            adjusted = median(m["packs fetch file://"]) - median(m["packs fetch 1-file pack"])
            self.row(case, "… minus packs's fixed cost (median fetch of a 1-file pack, file://)", adjusted, "bsdtar -xf",
                     median(m["bsdtar -xf"]))
            self.rows.append((case, f"for scale: curl file:// of the {unpack['contentLength'] / MiB:.0f} MiB pack to /dev/null "
                              f"{fmt_s(median(m['curl file:// → /dev/null']))}; packs fetch of a 1-file pack "
                              f"{fmt_s(median(m['packs fetch 1-file pack']))}", "", "", "", "", "", ""))

    # ---- case 9: whole catalogs (issue 13) ------------------------------------------------------

    def case_catalog(self):
        """1,000 and 10,000 tiny packs in one `packs fetch --all` under `ulimit -n 1024` (the default soft
        limit on most Linux systems), against a script doing the same job with curl --parallel, sha256sum
        and one bsdtar per pack. Checks: exit 0, every pack installed, time linear in the number of packs
        (10,000 ≤ 12 × 1,000), peak RSS ≤ 96 MiB, and ≤ 1.0 of the script."""
        results = {}
        for n in (1_000, 10_000):
            catalog = self.data[f"catalog{n}"]
            name = f"catalog{n}"
            manifest = f"{self.base}/{name}/manifest.json"
            cfg = os.path.join(self.tmp, f"{name}-curl.cfg")
            sums = os.path.join(self.tmp, f"{name}.sha256")
            with open(cfg, "w") as f, open(sums, "w") as g:
                for content in catalog.values():
                    f.write(f'url = "{self.base}/{name}/{content["url"]}"\n')
                    g.write(f'{content["sha256"]}  {content["url"]}\n')
            unpack_all = 'for f in *.tar; do mkdir "../out/${f%.tar}" && bsdtar -xf "$f" -C "../out/${f%.tar}" || exit 1; done'
            commands = [
                ("packs", lambda w, manifest=manifest: f"ulimit -n 1024 && exec {shlex.join(self.packs_cmd(f'{w}/home', 'fetch', manifest, '--all'))}"),
                ("curl+sha256sum+bsdtar", lambda w, cfg=cfg, sums=sums: (
                    f"ulimit -n 1024 && mkdir -p {w}/dl {w}/out && cd {w}/dl && "
                    f"curl -s -f --parallel --parallel-max 8 --remote-name-all -K {cfg} && "
                    f"sha256sum -c --quiet {sums} && {unpack_all}")),
            ]
            expected = n  # Contents/data.txt of each pack (content_bytes counts what lies under a Contents/ folder)

            def check(who, work, run, expected=expected):
                files, _ = content_bytes(work)
                if files != expected:
                    raise Failure(f"case 9: {who}: {files} files under {work}, expected {expected}")
            log(f"case 9: {n:,} packs in one fetch under ulimit -n 1024…")
            reps = 3 if n == 10_000 else max(self.reps, 3)
            results[n] = self.alternate(9, commands, reps, check=check, warm_bytes=256 * MiB, keep=True,
                                        served=glob.glob(os.path.join(self.site, name, "*")))
        small, large = results[1_000], results[10_000]
        t_small = [r.wall for r in small["packs"]]
        t_large = [r.wall for r in large["packs"]]
        self.row(9, "1,000 tiny packs, fetch --all, ulimit -n 1024", t_small, "curl --parallel-max 8 + sha256sum + bsdtar",
                 [r.wall for r in small["curl+sha256sum+bsdtar"]], target=1.0)
        self.row(9, "10,000 tiny packs, fetch --all, ulimit -n 1024", t_large, "curl --parallel-max 8 + sha256sum + bsdtar",
                 [r.wall for r in large["curl+sha256sum+bsdtar"]], target=1.0)
        self.row(9, "linear in the number of packs: 10,000 ÷ 1,000 (packs)", t_large, "packs, 1,000 packs", t_small, target=12)
        rss_small = max(r.rss_kib for r in small["packs"])
        rss_large = max(r.rss_kib for r in large["packs"])
        self.rows.append(("9", "packs peak RSS (max of runs): 1,000 and 10,000 packs", f"{fmt_mib(rss_small)}, {fmt_mib(rss_large)}",
                          "", "", f"+{(rss_large - rss_small) / 9_000:.1f} KiB per pack", "≤ 96 MiB", "pass" if rss_large <= 96 * 1024 else "**FAIL**"))

    # ---- case 8: packs serve under load, against nginx (issue 16) --------------------------------

    def case_server_load(self):
        """1,000 wrk connections on loopback against `packs serve` and against nginx serving the same
        folder: whole 4 MiB files, and 64 KiB ranges at random aligned offsets of the same file.
        Each packs run starts a fresh `packs serve` (so its RSS at start, peak and 10 s after the
        load are of that run alone); nginx runs throughout, in a configuration of its own (4096
        worker connections, sendfile, ETag). Neither logs requests. Runs alternate, the order
        rotated every round."""
        wrk = shutil.which("wrk")
        if not wrk:
            raise Failure("wrk is not installed (Debian package wrk)")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 8192 <= hard or soft < hard < 8192:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
        site = os.path.join(self.site, "load")
        seconds = self.load_seconds
        lua = os.path.join(self.tmp, "ranges.lua")
        with open(lua, "w") as f:
            f.write("math.randomseed(8)\n"
                    "request = function()\n"
                    "  local first = math.random(0, 63) * 65536\n"
                    "  return wrk.format('GET', '/pack4m.bin', { ['Range'] = 'bytes=' .. first .. '-' .. (first + 65535) })\n"
                    "end\n")
        nginx_dir = os.path.join(self.tmp, "nginx-load")
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(nginx_dir, sub), exist_ok=True)
        nginx_port = free_port()
        user = "user root;\n" if os.geteuid() == 0 else ""
        with open(os.path.join(nginx_dir, "nginx.conf"), "w") as f:
            f.write(f"""{user}worker_processes 1;
worker_rlimit_nofile 8192;
daemon on;
pid {nginx_dir}/nginx.pid;
error_log {nginx_dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    access_log off;
    client_body_temp_path {nginx_dir}/client_body;
    proxy_temp_path {nginx_dir}/proxy;
    fastcgi_temp_path {nginx_dir}/fastcgi;
    uwsgi_temp_path {nginx_dir}/uwsgi;
    scgi_temp_path {nginx_dir}/scgi;
    sendfile on;
    tcp_nopush on;
    etag on;
    server_tokens off;
    keepalive_requests 100000;
    server {{ listen 127.0.0.1:{nginx_port}; root {site}; }}
}}
""")
        self.sh(["/usr/sbin/nginx", "-p", nginx_dir, "-e", os.path.join(nginx_dir, "error.log"), "-c", os.path.join(nginx_dir, "nginx.conf")])
        try:
            for _ in range(50):
                if subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{nginx_port}/pack4m.bin"]).returncode == 0:
                    break
                time.sleep(0.1)
            loads = [("whole 4 MiB", []), ("64 KiB ranges", ["-s", lua])]
            commands = [(server, load) for load in loads for server in ("packs", "nginx")]
            results = {(server, load[0]): [] for server, load in commands}
            log(f"case 8: packs serve and nginx under wrk -c1000 for {seconds} s, {self.reps} rounds…")
            for r in range(self.reps):
                k = r % len(commands)
                for server, (load, extra) in commands[k:] + commands[:k]:
                    run = self.load_run(wrk, server, site, nginx_port, extra, seconds)
                    results[(server, load)].append(run)
                    log(f"  case 8 round {r} {server:<5} {load:<13} {run['rps']:9.0f} req/s  {run['mib_s']:7.0f} MiB/s  p99 {run['p99']}"
                        f"  errors {run['errors']}" + (f"  rss {run['start'] / 1024:.0f} → peak {run['peak'] / 1024:.0f} → "
                                                        f"{run['after'] / 1024:.0f} MiB 10 s after" if server == "packs" else ""))
                    self.load_raw.append((r, server, load, run))
        finally:
            try:
                with open(os.path.join(nginx_dir, "nginx.pid")) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        for load, _ in loads:
            ours = [x["rps"] for x in results[("packs", load)]]
            peer = [x["rps"] for x in results[("nginx", load)]]
            ratio = median(ours) / median(peer) if median(peer) else float("nan")
            target = 0.8 if load.startswith("whole") else 0.5
            self.rows.append(("8", f"{load}, 1,000 connections, requests/s (wrk -t2 -c1000 -d{seconds}s)",
                              f"{median(ours):.0f} ({min(ours):.0f}–{max(ours):.0f})", "nginx (sendfile)",
                              f"{median(peer):.0f} ({min(peer):.0f}–{max(peer):.0f})", f"{ratio:.2f}", f"≥ {target}",
                              "pass" if ratio >= target else "**FAIL**"))
        packs_runs = [x for (server, _), runs in results.items() if server == "packs" for x in runs]
        whole = results[("packs", "whole 4 MiB")]
        peak = max(x["peak"] for x in whole)
        self.rows.append(("8", "packs serve peak RSS, 1,000 whole-file clients (max of runs)", fmt_mib(peak), "", "", "",
                          "≤ 256 MiB", "pass" if peak <= 256 * 1024 else "**FAIL**"))
        worst = max(x["after"] - x["start"] for x in packs_runs)
        self.rows.append(("8", "packs serve RSS 10 s after the load − RSS at start (worst run)", fmt_mib(worst), "", "", "",
                          "≤ 64 MiB", "pass" if worst <= 64 * 1024 else "**FAIL**"))
        errors = sum(x["errors"] for (server, _), runs in results.items() for x in runs if server == "packs")
        if errors:
            self.notes.append(f"case 8: wrk counted {errors} socket errors or non-2xx answers against packs serve.")

    def load_run(self, wrk, server, site, nginx_port, extra, seconds):
        """One wrk run; for packs, a fresh `packs serve` whose RSS is sampled every 0.2 s."""
        proc = None
        if server == "packs":
            port = free_port()
            proc = subprocess.Popen([self.packs, "serve", site, "--port", str(port), "--quiet"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            line = proc.stdout.readline()   # "Serving … (Ctrl-C stops)" once it listens
            if "Serving" not in line:
                proc.kill()
                raise Failure(f"packs serve did not start: {line!r}")
        else:
            port = nginx_port

        def rss():
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return 0
        start = rss() if proc else 0
        samples = []
        w = subprocess.Popen([wrk, "-t2", "-c1000", f"-d{seconds}s", "--timeout", "30s", "--latency", *extra,
                              f"http://127.0.0.1:{port}/pack4m.bin"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while w.poll() is None:
            if proc:
                samples.append(rss())
            time.sleep(0.2)
        out = w.stdout.read()
        after = 0
        if proc:
            deadline = time.time() + 10
            while time.time() < deadline:
                samples.append(rss())
                time.sleep(0.2)
            after = rss()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if w.returncode != 0 or "Requests/sec" not in out:
            raise Failure(f"wrk against {server} failed ({w.returncode}):\n{out[-2000:]}")

        def field(prefix):
            line = next((l for l in out.splitlines() if l.strip().startswith(prefix)), "")
            return line.split()[1:] if line else []
        rps = float(field("Requests/sec:")[0])
        transfer = field("Transfer/sec:")[0]
        scale = {"KB": 1 / 1024, "MB": 1, "GB": 1024}
        mib_s = next((float(transfer[:-2]) * v for k, v in scale.items() if transfer.endswith(k)), float("nan"))
        p99 = (field("99%") or ["?"])[0]
        errors = 0
        for l in out.splitlines():
            if "Socket errors" in l:
                errors += sum(int(x.strip(",")) for x in l.split() if x.strip(",").isdigit())
            if "Non-2xx" in l:
                errors += int(l.split()[-1])
        return {"rps": rps, "mib_s": mib_s, "p99": p99, "errors": errors, "start": start,
                "peak": max(samples) if samples else 0, "after": after}

    # ---- profile --------------------------------------------------------------------------------

    def profile_run(self):
        manifest = f"{self.base}/prof/manifest.json"
        work = self.fresh("profile")
        out = os.path.join(self.tmp, "callgrind.out")
        log("profile: packs fetch of a 64 MiB pack under callgrind…")
        # Valgrind 3.19 (Debian 12) cannot read the DWARF 5 that Swift 6.3 writes ("unhandled dwarf2 abbrev
        # form code 0x25", then it gives up): profile a copy without debug info; the symbol table stays.
        binary = os.path.join(self.tmp, "packs-nodebug")
        self.sh(["objcopy", "--strip-debug", self.packs, binary])
        # Valgrind 3.19's rt_sigsuspend wrapper writes into the caller's mask, and libdispatch's main
        # thread (dispatchMain → _dispatch_sigsuspend) passes a const one in read-only memory: valgrind
        # dies with SIGSEGV ("the 'impossible' happened"). A preloaded sigsuspend hands it a copy.
        shim_c, shim = os.path.join(self.tmp, "sigsuspend-shim.c"), os.path.join(self.tmp, "sigsuspend-shim.so")
        with open(shim_c, "w") as f:
            f.write("#define _GNU_SOURCE\n#include <signal.h>\n#include <dlfcn.h>\n"
                    "int sigsuspend(const sigset_t *mask) {\n"
                    "    static int (*real)(const sigset_t *);\n"
                    "    if (!real) real = (int (*)(const sigset_t *))dlsym(RTLD_NEXT, \"sigsuspend\");\n"
                    "    sigset_t copy = *mask;\n    return real(&copy);\n}\n")
        self.sh(["gcc", "-shared", "-fPIC", "-O1", shim_c, "-o", shim, "-ldl"])
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                            binary, "--home", f"{work}/home", "--quiet", "fetch", manifest, "com.bench.prof"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, LD_PRELOAD=shim))
        if p.returncode != 0:
            print(f"\nNOTE: the callgrind run exited {p.returncode}:\n```\n{p.stderr[-3000:]}\n```")
            return
        for inclusive, top in (("no", 30), ("yes", 40)):
            text = subprocess.run(["callgrind_annotate", f"--inclusive={inclusive}", out],
                                  stdout=subprocess.PIPE, text=True).stdout
            demangler = shutil.which("swift-demangle")
            if demangler:
                text = subprocess.run([demangler, "--simplified"], input=text, stdout=subprocess.PIPE, text=True).stdout
            text = text.splitlines()
            title = "exclusive" if inclusive == "no" else "inclusive"
            print(f"\n## callgrind: packs fetch of a 64 MiB tar pack, {title} instructions (top {top})\n\n```")
            # The header, then the first `top` function lines.
            header = next((i for i, l in enumerate(text) if "file:function" in l), 0)
            print("\n".join(text[:header + 2 + top]))
            print("```")

    def perf_run(self):
        """callgrind sees neither the kernel (most of the time here) nor SHA-NI (valgrind hides it, so
        OpenSSL takes its slower path): also sample the real run, kernel included, with perf."""
        if not shutil.which("perf"):
            print("\nNOTE: perf is not installed (linux-perf); no kernel-inclusive profile.")
            return
        name = "big" if "big" in self.data else "prof"
        manifest = f"{self.base}/{name}/manifest.json"
        product = f"com.bench.{name}"
        work = self.fresh("perf")
        data = os.path.join(self.tmp, "perf.data")
        pack = self.data[name]
        log(f"profile: packs fetch of the {pack['contentLength'] / MiB:.0f} MiB pack under perf record -e cpu-clock…")
        self.prepare(pack["contentLength"] * 2 + 256 * MiB, [os.path.join(self.site, name, pack["url"])])
        time_file = os.path.join(self.tmp, "perf-time.out")
        p = subprocess.run(["perf", "record", "-q", "-o", data, "-F", "999", "-e", "cpu-clock", "--",
                            "/usr/bin/time", "-f", "%e %U %S", "-o", time_file,
                            self.packs, "--home", f"{work}/home", "--quiet", "fetch", manifest, product],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            print(f"\nNOTE: perf record exited {p.returncode}:\n```\n{p.stderr[-2000:]}\n```")
            return
        with open(time_file) as f:
            wall, user, sys_ = (float(x) for x in f.read().split()[-3:])
        samples = subprocess.run(["perf", "script", "-i", data, "-F", "period"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True).stdout.count("\n")
        print(f"\nperf run: {wall:.2f} s wall, {user:.2f} s user + {sys_:.2f} s sys by rusage; perf sampled "
              f"{samples / 999:.2f} CPU-seconds ({samples} samples at 999 Hz). CPU time that rusage counts beyond the sampled "
              f"seconds is time the guest's perf cannot see (in a VM: the vCPU stalled in the hypervisor, e.g. while it "
              f"faults in guest pages).")
        for sort, top in (("dso", 12), ("pid,dso", 12), ("dso,sym", 25)):
            text = subprocess.run(["perf", "report", "-i", data, "--no-children", "-g", "none", "--sort", sort, "--stdio"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
            demangler = shutil.which("swift-demangle")
            if demangler:
                text = subprocess.run([demangler, "--simplified"], input=text, stdout=subprocess.PIPE, text=True).stdout
            lines = [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
            print(f"\n## perf (cpu-clock, 999 Hz, kernel included): packs fetch of the {pack['contentLength'] / MiB:.0f} MiB pack, "
                  f"by {sort.replace('pid', 'thread').replace(',', ' and ')} (top {top})\n\n```")
            print("\n".join(lines[:top]))
            print("```")
        shutil.rmtree(work, ignore_errors=True)

    # ---- report ---------------------------------------------------------------------------------

    def report(self):
        print("\n## Results (medians, then min–max of the runs; ratios are of the medians, PackDelivery ÷ peer)\n")
        print("| case | what | PackDelivery | peer | peer | ratio | target | result |")
        print("|---|---|---:|---|---:|---:|---|---|")
        for row in self.rows:
            print("| " + " | ".join(row) + " |")
        if getattr(self, "phases_big", None):
            runs = self.phases_big
            print(f"\n### packs fetch of the 1 GiB pack, by phase ({len(runs)} extra runs with --json, phase changes "
                  f"time-stamped as the lines arrive; not in the medians above)\n")
            print("| phase | " + " | ".join(f"run {i + 1} (s)" for i in range(len(runs))) + " |")
            print("|---|" + "---:|" * len(runs))
            names = [name for name, _ in runs[0][0]]
            for i, name in enumerate(names):
                cells = [f"{r[0][i][1]:.2f}" if i < len(r[0]) and r[0][i][0] == name else "?" for r in runs]
                print(f"| {name} | " + " | ".join(cells) + " |")
            print("| total | " + " | ".join(f"{r[1]:.2f}" for r in runs) + " |")
        if self.load_raw:
            print("\n### Case 8, every run (wrk -t2 -c1000 --timeout 30s --latency; RSS of the packs serve process)\n")
            print("| round | server | load | requests/s | MiB/s | p99 latency | socket errors + non-2xx | RSS start / peak / 10 s after (MiB) |")
            print("|---:|---|---|---:|---:|---:|---:|---|")
            for r, server, load, run in self.load_raw:
                memory = (f"{run['start'] / 1024:.0f} / {run['peak'] / 1024:.0f} / {run['after'] / 1024:.0f}"
                          if server == "packs" else "")
                print(f"| {r} | {server} | {load} | {run['rps']:.0f} | {run['mib_s']:.0f} | {run['p99']} | {run['errors']} | {memory} |")
        print("\n### Every run\n")
        print("Other CPU: CPU seconds the rest of the machine used during the run (all CPUs' busy time minus the "
              "run's own user+sys and nginx's). Kernel threads working for the run count here too: writeback, and "
              "(with the memory warm-up) the guest reporting the touched-and-freed memory back to the hypervisor "
              "while the run leaves it unused. Several seconds with --no-warm means something else was running.\n")
        print("| case | command | round | wall s | user s | sys s | max RSS MiB | other CPU s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for case, name, r, run in self.raw:
            print(f"| {case} | {name} | {r} | {run.wall:.3f} | {run.user:.2f} | {run.sys:.2f} | {run.rss_kib / 1024:.1f} | {run.other:.2f} |")
        disturbed = [(case, name, r, run) for case, name, r, run in self.raw if run.other > max(0.5, 0.25 * run.wall)]
        if disturbed:
            print(f"\nWARNING: {len(disturbed)} of {len(self.raw)} runs had other CPU > max(0.5 s, 25 % of the wall "
                  f"time) (other work on the machine, or free page reporting after the warm-up): "
                  + ", ".join(f"case {c} {n} round {r} ({run.other:.1f} s)" for c, n, r, run in disturbed[:12]))
        for note in self.notes:
            print(f"\nNOTE: {note}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--access-log", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--packs-compare", default="", help="another packs binary, alternated with --packs in cases 1 and 10")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--only", default="")
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--shm", default="", help="a folder on tmpfs for case 6b (removed by the caller)")
    ap.add_argument("--load-seconds", type=int, default=10, help="how long each wrk run of case 8 lasts")
    args = ap.parse_args()
    bench = Bench(args)
    bench.profile = bool(args.profile)
    started = time.time()
    bench.make_data()
    cases = [((1, 2, 7), bench.case_big), ((3,), bench.case_memory), ((4,), bench.case_small),
             ((5,), bench.case_resume), ((6,), bench.case_unpack), ((8,), bench.case_server_load), ((9,), bench.case_catalog),
             ((10,), bench.case_zst), ((11,), bench.case_delta)]
    for numbers, case in cases:
        if not any(bench.wants(n) for n in numbers):
            continue
        try:
            case()
        except Failure as e:
            # Reported precisely, and the other cases still run.
            bench.notes.append(f"BROKEN: {e}")
            log(f"BROKEN: {e}")
    for folder in bench.deferred:
        shutil.rmtree(folder, ignore_errors=True)
    bench.report()
    if bench.profile:
        bench.profile_run()
        bench.perf_run()
    print(f"\n(total {time.time() - started:.0f} s)")
    return 1 if any(n.startswith("BROKEN") for n in bench.notes) else 0


if __name__ == "__main__":
    sys.exit(main())
