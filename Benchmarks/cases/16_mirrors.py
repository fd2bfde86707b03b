"""Case 16: several sources per pack (issue 32), each mirror an nginx of its own on loopback.

16a: the 1 GiB pack from a manifest listing two mirrors; the first is SIGKILLed (master and worker) once `packs
     fetch` reports half the pack: it finishes from the second. Against the same fetch from the second mirror alone,
     uninterrupted (alternated). Targets: ≤ 1 MiB fetched twice (what the second mirror sent, plus the progress reported
     when the first died, minus the pack's size; the report lags the bytes on disk by a few MiB at most, so a value
     ≤ 0 means nothing was fetched twice), ≤ 2 s lost.
16b: the first mirror serves a copy with one byte changed at 70 %: the bytes it sent past the bad byte (how late it
     was caught), what was fetched twice, and `packs verify` of the installed tree (exact). Two counts past the end of
     the bad chunk: the client's (from the `--json` event's error, which names the chunk's pack bytes and the bytes
     received after it) and the server's (its access log: the bytes it wrote, those unread in socket buffers
     included). Also an uninterrupted fetch of the 1 GiB pack with two sources listed (all from the good one), for the
     time and CPU of a change to how such a pack is checked. With --compare, each 16b measurement alternates the other
     packs binary with this one.
16c: 100 small packs (≈ 60 KiB) from [a mirror slow from the first byte, a fast one] against the fast one alone, each
     run on a fresh home (nothing measured yet), alternated. Target ≤ 1.1 ×. The slow mirror is nginx at limit_rate 1m
     with sendfile off and output_buffers 1 8k (and limit_rate_after 0): with sendfile on, nginx sends a 60 KiB file in
     one write before its rate limit applies (0.4 ms by curl); this way one 8 KiB buffer goes at once and the rest at
     1 MiB/s (a 60 KiB file took 51 ms by curl, a 2 MB file 1.75 s).

Run alone: Benchmarks/run --only 16; PACKS_BENCH_16=c Benchmarks/run --only 16 runs 16c alone (no 1 GiB data);
PACKS_BENCH_16=b runs 16b alone.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

from harness import data
from harness.measure import KiB, MiB, Failure, content_bytes, log, timed
from harness.servers import Nginx
from harness.tables import median

CASES = (16,)
ONLY_C = os.environ.get("PACKS_BENCH_16") == "c"
ONLY_B = os.environ.get("PACKS_BENCH_16") == "b"
DATA = () if ONLY_C else ("big",)


def make_data(b):
    if ONLY_B:
        return
    log("data: 100 small packs for case 16 (≈60 KiB each, tar.gz)…")
    rng = b.rng("mirrorsmall")
    for n in range(100):
        sizes = [rng.randint(12, 28) * KiB for _ in range(3)]
        data.make_pack(b, "mirrorsmall", [(f"f{i}.bin", s) for i, s in enumerate(sizes)],
                       f"com.bench.mirrorsmall.{n}", f"ms-{n:03d}.tar.gz", rng)
    b.data["mirrorsmall"] = data.manifest(b, "mirrorsmall")


# nginx's limit_rate from the first byte: without sendfile, through one small buffer (see 16c above).
SLOW_FROM_FIRST_BYTE = "\n        limit_rate_after 0; sendfile off; output_buffers 1 8k;"


def mirror(b, name, root, limit=None):
    """An nginx of its own serving root (with limit_rate when given, from the first byte), started."""
    folder = os.path.join(b.tmp, f"nginx-{name}")
    os.makedirs(folder, exist_ok=True)
    server = Nginx(folder, root, locations=f"\n        limit_rate {limit};{SLOW_FROM_FIRST_BYTE}" if limit else "")
    server.start()
    return server


def sent(server, path):
    """Body bytes server logged for path (requests that ended)."""
    try:
        return sum(int(l.split()[2]) for l in server.log_lines() if l.split(" ", 1)[0] == path)
    except OSError:
        return 0


def reach(server, path):
    """How far into the file at path server wrote, by its last logged request: its Range's first byte (0 without one)
    plus its body bytes (written to the socket, read or not)."""
    lines = [l for l in server.log_lines() if l.split(" ", 1)[0] == path]
    if not lines:
        return 0
    fields = lines[-1].split()
    m = re.search(r"bytes=(\d+)-", lines[-1])
    return (int(m.group(1)) if m else 0) + int(fields[2])


def kill_nginx(server):
    """SIGKILL nginx's master and its workers at once, by their ids: connections are reset mid-body."""
    master = server.pid()
    if master is None:
        return
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == master:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    for pid in [master, *children]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def write_manifest(source, target, mirrors):
    with open(source) as f:
        m = json.load(f)
    m["mirrors"] = mirrors
    with open(target, "w") as f:
        json.dump(m, f)
    return target


def fetch_killing_at_half(b, home, manifest, product, size, victim):
    """`packs --json fetch`, SIGKILLing victim once the download reports half the pack. Returns (Run-like wall,
    bytes reported when killed)."""
    argv = [b.packs, "--home", home, "--json", "fetch", manifest, product]
    start = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at = None
    for line in p.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if killed_at is None and event.get("event") == "download" and event.get("phase") == "downloading" \
                and event.get("progress", 0) >= 0.5:
            kill_nginx(victim)
            killed_at = int(event["progress"] * size)
    err = p.stderr.read()
    code = p.wait()
    wall = time.time() - start
    if code != 0 or killed_at is None:
        raise Failure(f"case 16a: packs fetch exited {code}, killed at {killed_at}\n{err[-2000:]}")
    return wall, killed_at


def run(b):
    if ONLY_C:
        return run_c(b, os.path.join(b.tmp, "c16"))
    big = b.data["big"]
    size = big["contentLength"]
    site_big = os.path.join(b.site, "big")
    source_manifest = os.path.join(site_big, "manifest.json")
    path = "/" + big["url"]
    work = os.path.join(b.tmp, "c16")
    os.makedirs(work, exist_ok=True)

    if ONLY_B:
        return run_b(b, work)

    # 16a: the first mirror dies at half.
    log("case 16a: 1 GiB from two mirrors, the first SIGKILLed at half…")
    second = mirror(b, "second", site_big)
    twice, walls_failover, walls_direct = [], [], []
    try:
        direct = write_manifest(source_manifest, os.path.join(work, "direct.json"), [f"{second.base}/"])
        for r in range(b.reps):
            order = ["failover", "direct"] if r % 2 == 0 else ["direct", "failover"]
            for who in order:
                home = b.fresh(f"c16a-{r}-{who}")
                b.prepare(0, [os.path.join(site_big, big["url"])])
                before = sent(second, path)
                if who == "direct":
                    run_ = timed(b.packs_cmd(os.path.join(home, "home"), "fetch", direct, "com.bench.big"), b.tmp)
                    if run_.code != 0:
                        raise Failure(f"case 16a direct: exit {run_.code}\n{run_.err[-2000:]}")
                    walls_direct.append(run_.wall)
                    log(f"  case 16a round {r} direct   {run_.wall:7.3f} s")
                else:
                    first = mirror(b, f"first-{r}", site_big)
                    manifest = write_manifest(source_manifest, os.path.join(work, f"failover-{r}.json"),
                                              [f"{first.base}/", f"{second.base}/"])
                    try:
                        wall, killed_at = fetch_killing_at_half(b, os.path.join(home, "home"), manifest, "com.bench.big", size, first)
                    finally:
                        kill_nginx(first)
                    from_second = sent(second, path) - before
                    walls_failover.append(wall)
                    twice.append(from_second + killed_at - size)
                    log(f"  case 16a round {r} failover {wall:7.3f} s  killed at {killed_at} B reported; second sent {from_second} B; "
                        f"fetched twice {(from_second + killed_at - size) / KiB:.0f} KiB")
                    shutil.rmtree(first.folder, ignore_errors=True)
                files, total = content_bytes(os.path.join(home, "home", "Caches"))
                if total < size // 2:
                    raise Failure(f"case 16a {who}: {files} files / {total} bytes installed")
                shutil.rmtree(home, ignore_errors=True)
                os.sync()
        lost = median(walls_failover) - median(walls_direct)
        w = median(twice)
        b.report.rows.append(("16a", "first mirror SIGKILLed at 50 % of 1 GiB: fetched twice, as the second mirror's bytes − (size − "
                              "progress reported at the kill; it lags what is on disk, so ≤ 0 reads as nothing twice); all runs: "
                              + ", ".join(f"{x / KiB:.0f} KiB" for x in twice) + ")",
                              f"{w / MiB:.2f} MiB", "", "", "", "≤ 1 MiB", "pass" if w <= MiB else "**FAIL**"))
        b.report.rows.append(("16a", f"  time lost vs the second mirror alone, uninterrupted (medians {median(walls_failover):.2f} s "
                              f"vs {median(walls_direct):.2f} s)", f"{lost:.2f} s", "", "", "", "≤ 2 s",
                              "pass" if lost <= 2 else "**FAIL**"))

    finally:
        second.stop()

    run_b(b, work)
    run_c(b, work)


# The error of a source's bad chunk, in the `--json` download event: its pack bytes and what the client received after it.
BAD_CHUNK = re.compile(r"pack bytes (\d+)\.\.<(\d+); (\d+) bytes after it received")


def fetch_json(b, home, manifest, product, binary):
    """`packs --json fetch` (timed); returns (Run, the bad chunk's (start, end, received after it) or None)."""
    run_ = timed([binary, "--home", home, "--json", "fetch", manifest, product], b.tmp)
    found = None
    for line in run_.out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        error = event.get("error") or {}
        m = BAD_CHUNK.search(error.get("message", "") if isinstance(error, dict) else "")
        if m and found is None:
            found = tuple(int(x) for x in m.groups())
    return run_, found


def run_b(b, work):
    """16b: a corrupted first mirror; and a 1 GiB fetch with two sources listed, uninterrupted."""
    big = b.data["big"]
    size = big["contentLength"]
    site_big = os.path.join(b.site, "big")
    source_manifest = os.path.join(site_big, "manifest.json")
    path = "/" + big["url"]
    os.makedirs(work, exist_ok=True)
    binaries = [("packs", b.packs)] + ([("packs (compare)", b.packs_compare)] if b.packs_compare else [])
    second = mirror(b, "second-b", site_big)
    try:
        log("case 16b: the first mirror serves one changed byte at 70 %…")
        bad_root = os.path.join(b.tmp, "c16-bad")
        os.makedirs(bad_root, exist_ok=True)
        shutil.copy(os.path.join(site_big, big["url"]), os.path.join(bad_root, big["url"]))
        index_name = big["index"]["url"]
        shutil.copy(os.path.join(site_big, index_name), os.path.join(bad_root, index_name))
        at = size * 7 // 10
        with open(os.path.join(bad_root, big["url"]), "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))
        bad = mirror(b, "bad", bad_root)
        try:
            manifest = write_manifest(source_manifest, os.path.join(work, "corrupt.json"), [f"{bad.base}/", f"{second.base}/"])
            # Two sources listed, the first good: every byte from it, checked as with any pack of several sources.
            both_good = write_manifest(source_manifest, os.path.join(work, "two-listed.json"), [f"{second.base}/", f"{bad.base}/"])
            stats = {name: {"past": [], "doubled": [], "client": [], "server": [], "walls": []} for name, _ in binaries}
            for r in range(max(1, b.reps)):
                for name, binary in (binaries if r % 2 == 0 else binaries[::-1]):
                    home = os.path.join(b.fresh(f"c16b-{r}"), "home")
                    before_bad, before_good = sent(bad, path), sent(second, path)
                    run_, chunk = fetch_json(b, home, manifest, "com.bench.big", binary)
                    if run_.code != 0:
                        raise Failure(f"case 16b {name}: exit {run_.code}\n{run_.err[-2000:]}")
                    verify = timed(b.packs_cmd(home, "verify", binary=binary), b.tmp)
                    if verify.code != 0:
                        raise Failure(f"case 16b {name}: packs verify exited {verify.code}: the installed tree is not exact\n{verify.err}")
                    from_bad, from_good = sent(bad, path) - before_bad, sent(second, path) - before_good
                    st = stats[name]
                    st["past"].append(from_bad - at)
                    st["doubled"].append(from_bad + from_good - size)
                    # How far into the pack the bad mirror wrote: its last request's range start plus the bytes it sent.
                    reached = reach(bad, path)
                    if chunk:
                        st["client"].append(chunk[2])
                        st["server"].append(reached - chunk[1])
                    shutil.rmtree(os.path.dirname(home), ignore_errors=True)
                    where = (f"bad chunk {chunk[0]}..<{chunk[1]}, past its end: client {chunk[2] / KiB:.0f} KiB, server "
                             f"{(reached - chunk[1]) / KiB:.0f} KiB" if chunk else "no chunk named")
                    last = [l for l in bad.log_lines() if l.split(" ", 1)[0] == path][-1:]
                    if last:
                        where += f"; its last request: {last[0]}"
                    log(f"  case 16b round {r} {name:<16} {run_.wall:.2f} s; bad mirror sent {from_bad} B ({(from_bad - at) / KiB:.0f} KiB "
                        f"past the bad byte), good {from_good} B; {where}; verify ok")
                    # Uninterrupted, two sources listed: the whole pack from the good one.
                    home = os.path.join(b.fresh(f"c16b-t{r}"), "home")
                    b.prepare(0, [os.path.join(site_big, big["url"])])
                    run_ = timed(b.packs_cmd(home, "fetch", both_good, "com.bench.big", binary=binary), b.tmp)
                    if run_.code != 0:
                        raise Failure(f"case 16b two listed {name}: exit {run_.code}\n{run_.err[-2000:]}")
                    st["walls"].append(run_.wall)
                    log(f"  case 16b round {r} {name:<16} two sources listed, uninterrupted: {run_.wall:.2f} s  cpu {run_.cpu:.2f} s  "
                        f"other cpu {run_.other:.2f} s")
                    shutil.rmtree(os.path.dirname(home), ignore_errors=True)
                    os.sync()
            for name, _ in binaries:
                st = stats[name]
                past = median(st["past"])
                client = ", ".join(f"{x / KiB:.0f}" for x in st["client"]) or "not named"
                server = ", ".join(f"{x / KiB:.0f}" for x in st["server"]) or "—"
                b.report.rows.append((f"16b {name}", "corrupted first mirror (1 byte at 70 % of 1 GiB): bytes it sent past the bad byte / "
                                      f"fetched twice; past the bad chunk's end, client / server (KiB, each run): {client} / {server}; "
                                      "packs verify exact",
                                      f"{past / MiB:.2f} MiB / {median(st['doubled']) / MiB:.2f} MiB", "", "", "",
                                      "≤ 1 chunk", "pass" if past <= 256 * KiB else "**FAIL**"))
                b.report.rows.append((f"16b {name}", "  1 GiB with two sources listed, uninterrupted (median; each run: "
                                      + ", ".join(f"{w:.2f}" for w in st["walls"]) + ")",
                                      f"{median(st['walls']):.2f} s", "", "", "", "", ""))
        finally:
            bad.stop()
    finally:
        second.stop()


def run_c(b, work):
    """16c: a slow mirror listed first beside a fast one."""
    os.makedirs(work, exist_ok=True)
    log("case 16c: 100 small packs from [slow (limit_rate 1m from the first byte), fast] vs fast alone…")
    small = b.data["mirrorsmall"]
    site_small = os.path.join(b.site, "mirrorsmall")
    ids = sorted(small, key=lambda p: int(p.rsplit(".", 1)[1]))
    slow = mirror(b, "slow", site_small, limit="1m")
    fast = mirror(b, "fast", site_small)
    try:
        src = os.path.join(site_small, "manifest.json")
        both = write_manifest(src, os.path.join(work, "small-both.json"), [f"{slow.base}/", f"{fast.base}/"])
        alone = write_manifest(src, os.path.join(work, "small-fast.json"), [f"{fast.base}/"])
        commands = [
            ("slow+fast", lambda w: b.packs_cmd(f"{w}/home", "fetch", both, *ids)),
            ("fast alone", lambda w: b.packs_cmd(f"{w}/home", "fetch", alone, *ids)),
        ]
        def check(name, work, run):
            files, _ = content_bytes(work)
            if files != 3 * len(ids):
                raise Failure(f"case 16c {name}: {files} files unpacked under {work}, expected {3 * len(ids)}")
        res = b.alternate(16, commands, b.reps, check=check, keep=True)
        m = {name: [r.wall for r in runs] for name, runs in res.items()}
        b.report.row(16, "100 × 60 KiB packs from [slow 1 MiB/s from the first byte, fast], fresh home", m["slow+fast"], "the fast mirror alone",
                     m["fast alone"], target=1.1)
        slow_packs = len([l for l in slow.log_lines() if l.split()[0].endswith(".tar.gz")])
        b.report.rows.append(("16c", f"packs the slow mirror served, over {b.reps} runs of 100: {slow_packs}", "", "", "", "", "", ""))
    finally:
        slow.stop()
        fast.stop()
