"""Cases 1, 2 and 7: one 1 GiB tar pack (4 × 256 MiB of random data), fetched, verified and unpacked.

1. End to end: `packs fetch` against `curl -o` + `openssl dgst -sha256` + `bsdtar -xf`, against the same
   followed by `sync -f` (packs installs durably), and against `aria2c --checksum` + `bsdtar -xf`
   (target: ≤ 0.8 of curl + openssl + bsdtar). One warm-up round first, not counted. With --compare,
   another build of packs alternates with this one.
2. Each stage of that pipeline alone (curl, openssl, bsdtar; and curl to /dev/null, aria2c alone): case 1
   against the slowest stage (the physical limit) and against their sum (no overlap).
7. CPU user+sys seconds per GiB of the runs of cases 1 and 2.
The pack is indexed (`packs manifest`), so packs installs it writing each byte once (no archive kept, issue
29): its wall time against the physical floor of a durable install (issue 48), the slower of the network alone
(`curl -o /dev/null`, case 2) and the disk written as the install writes it (`dd bs=1M oflag=direct conv=fsync`;
target ≤ 1.2; issue 29's floor through the page cache, `curl -o FILE` and `dd conv=fsync`, for information), and the
peak extra disk of one more run, the home's files summed
every 5 ms, against the unpacked size (target ≤ 1.1).
Then two more `packs --json fetch` runs, time-stamping the phase changes (a table of their own). And how
busy packs, nginx and the writeback kept the cores.

Run alone: Benchmarks/run --only 1
"""
import json
import os
import shutil
import subprocess
import time

from harness.measure import GiB, MiB, log
from harness.tables import fmt_runs, median

CASES = (1, 2, 7)
DATA = ("big",)


def run(b):
    big = b.data["big"]
    url = f"{b.base}/big/{big['url']}"
    manifest = f"{b.base}/big/manifest.json"
    sha = big["sha256"]
    size = big["contentLength"]
    content = (4, 4 * 256 * MiB)
    commands = [
        ("packs", lambda w: b.packs_cmd(f"{w}/home", "fetch", manifest, "com.bench.big")),
        ("curl+openssl+bsdtar", lambda w: (
            f"curl -s -f -o {w}/big.tar {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/big.tar | cut -d' ' -f1)\" = {sha} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out")),
        ("aria2c+bsdtar", lambda w: (
            f"aria2c -q --checksum=sha-256={sha} -d {w} -o big.tar {url} && "
            f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out")),
        # packs makes the install durable: the same pipeline, then syncfs of the filesystem,
        # which writes what packs writes (the archive and the content).
        ("curl+openssl+bsdtar+sync", lambda w: (
            f"curl -s -f -o {w}/big.tar {url} && "
            f"[ \"$(openssl dgst -sha256 -r {w}/big.tar | cut -d' ' -f1)\" = {sha} ] && "
            f"mkdir {w}/out && bsdtar -xf {w}/big.tar -C {w}/out && sync -f {w}/out")),
    ]
    commands = b.with_compare(commands, b.compare_commands(manifest, "com.bench.big"))
    log("case 1: 1 GiB pack end to end (one warm-up round, not counted)…")
    served = [os.path.join(b.site, "big", big["url"])]
    warm = size * 2 + 256 * MiB   # the archive and its content
    b.alternate(1, commands, 1, check=b.expect_content(*content), warm_bytes=warm, served=served)
    b.report.raw = [r for r in b.report.raw if r[0] != 1]
    res = b.alternate(1, commands, b.reps, check=b.expect_content(*content), warm_bytes=warm, served=served)
    ours = median([r.wall for r in res["packs"]])
    walls = {name: [r.wall for r in runs] for name, runs in res.items()}
    b.report.row(1, "1 GiB pack, end to end", walls["packs"], "curl + openssl dgst + bsdtar -xf", walls["curl+openssl+bsdtar"], target=0.8)
    b.report.row(1, "1 GiB pack, end to end", walls["packs"], "aria2c --checksum + bsdtar -xf", walls["aria2c+bsdtar"])
    b.report.row(1, "1 GiB pack, end to end (durable)", walls["packs"], "curl + openssl dgst + bsdtar -xf && sync -f",
                 walls["curl+openssl+bsdtar+sync"])
    b.compare_row(1, "1 GiB pack", walls)
    b.results["big"] = res

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
    st = b.alternate(2, stages + peers_alone, b.reps, warm_bytes=size + 256 * MiB, served=served)
    medians = {name: median([r.wall for r in st[name]]) for name, _ in stages}
    slowest = max(medians, key=medians.get)
    for name, _ in stages:
        b.report.rows.append(("2", f"stage alone: {name}", "", "", fmt_runs([r.wall for r in st[name]]), "", "", ""))
    for name, _ in peers_alone:
        what = {"curl -o /dev/null": "the network alone, nothing written",
                "aria2c --checksum alone": "download + its own hash check"}[name]
        b.report.rows.append(("2", f"for reference: {name} ({what})", "", "",
                              fmt_runs([r.wall for r in st[name]]), "", "", ""))
    b.report.row(2, "case 1 ÷ slowest stage alone (the physical limit)", ours, f"{slowest} alone", medians[slowest])
    b.report.row(2, "case 1 ÷ sum of the stages (no overlap at all)", ours, "sum of the three stages", sum(medians.values()))
    b.report.busy_row(1, res["packs"])

    # case 7: CPU seconds per GiB
    gib = size / GiB
    cpu_ours = median([r.cpu for r in res["packs"]]) / gib
    cpu_curl = median([r.cpu for r in st["curl -o file"]]) / gib
    cpu_pipe = median([r.cpu for r in res["curl+openssl+bsdtar"]]) / gib
    cpu_aria = median([r.cpu for r in res["aria2c+bsdtar"]]) / gib
    b.report.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "curl -o file alone", cpu_curl, unit="cpu")
    b.report.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "curl + openssl + bsdtar", cpu_pipe, unit="cpu")
    b.report.row(7, "CPU user+sys s/GiB, case 1", cpu_ours, "aria2c + bsdtar", cpu_aria, unit="cpu")

    # Write once (issue 29): the pack is indexed (`packs manifest`), so its first install keeps no archive. Against
    # the physical floor of a durable install (issue 48): the slower of the network alone (`curl -o /dev/null`,
    # case 2) and the disk written as the install writes it (`dd oflag=direct`, in DirectFile's 1 MiB writes, then
    # fsync). The floor of issue 29, `curl -o FILE` and `dd conv=fsync` through the page cache, is about twice the
    # disk's time here: its ratio is kept as information only.
    floor_runs = b.alternate(1, [
        ("dd oflag=direct conv=fsync", lambda w: ["dd", "if=/dev/zero", f"of={w}/floor", "bs=1M", f"count={content[1] // MiB}",
                                                  "oflag=direct", "conv=fsync", "status=none"]),
        ("dd conv=fsync", lambda w: ["dd", "if=/dev/zero", f"of={w}/floor", "bs=1M", f"count={content[1] // MiB}",
                                     "conv=fsync", "status=none"]),
    ], b.reps, warm_bytes=size + 256 * MiB)
    network = median([r.wall for r in st["curl -o /dev/null"]])
    disk = median([r.wall for r in floor_runs["dd oflag=direct conv=fsync"]])
    b.report.rows.append(("1", "the floor's parts: network alone (curl -o /dev/null) / disk as the install writes it "
                               "(dd bs=1M oflag=direct conv=fsync)", f"{network:.2f} / {disk:.2f} s", "", "", "", "", ""))
    b.report.row(1, "1 GiB indexed tar, written once: ÷ the physical floor", walls["packs"],
                 "max(curl -o /dev/null, dd oflag=direct conv=fsync)", max(network, disk), target=1.2)
    floor = max(median([r.wall for r in floor_runs["dd conv=fsync"]]), median([r.wall for r in st["curl -o file"]]))
    b.report.row(1, "for information, issue 29's floor (page cache): ÷ max(curl -o file, dd conv=fsync)", walls["packs"],
                 "max(curl -o file, dd conv=fsync)", floor)
    b.prepare(warm, served)
    peak = peak_extra_disk(b, manifest, "com.bench.big")
    b.report.row(1, "1 GiB indexed tar: peak extra disk ÷ unpacked size", peak / content[1], "unpacked size", 1.0,
                 target=1.1, unit="ratio")

    # Where packs's time goes: one more run with --json, the phase changes time-stamped here.
    phases = []
    for _ in range(2):
        b.prepare(warm, served)
        phases.append(phase_run(b, manifest, "com.bench.big"))
    b.report.sections.append(phases_table(phases))


def peak_extra_disk(b, manifest, product):
    """One `packs fetch` while a thread sums the blocks of every file in its home every 5 ms: the most they
    reached beyond what the home held at the start (archive, index, staging, content and the state database all
    count; a walk of the home rather than statvfs, which other work on a shared filesystem would disturb)."""
    import threading
    home = os.path.join(b.fresh("peak"), "home")
    os.makedirs(home)

    def used():
        total = 0
        for root, _dirs, names in os.walk(home):
            for n in names:
                try:
                    total += os.lstat(os.path.join(root, n)).st_blocks * 512
                except OSError:
                    pass
        return total
    start, peak, done = used(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], used() - start)
            time.sleep(0.005)
    thread = threading.Thread(target=sample)
    thread.start()
    subprocess.run(b.packs_cmd(home, "fetch", manifest, product), check=True)
    done.set()
    thread.join()
    log(f"  case 1 peak extra disk: {peak[0] / MiB:.1f} MiB")
    shutil.rmtree(os.path.dirname(home), ignore_errors=True)
    os.sync()
    return peak[0]


def phase_run(b, manifest, product):
    """One `packs --json fetch`: [(phase, seconds in it)], and the whole run's seconds."""
    home = os.path.join(b.fresh("phases"), "home")
    start = time.perf_counter()
    p = subprocess.Popen([b.packs, "--home", home, "--json", "fetch", manifest, product],
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


def phases_table(runs):
    lines = [f"\n### packs fetch of the 1 GiB pack, by phase ({len(runs)} extra runs with --json, phase changes "
             f"time-stamped as the lines arrive; not in the medians above)\n",
             "| phase | " + " | ".join(f"run {i + 1} (s)" for i in range(len(runs))) + " |",
             "|---|" + "---:|" * len(runs)]
    names = [name for name, _ in runs[0][0]]
    for i, name in enumerate(names):
        cells = [f"{r[0][i][1]:.2f}" if i < len(r[0]) and r[0][i][0] == name else "?" for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| total | " + " | ".join(f"{r[1]:.2f}" for r in runs) + " |")
    return "\n".join(lines)
