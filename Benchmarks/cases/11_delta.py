"""Case 11: a delta update. Version 1 of a 1000 MiB zip pack of 2,000 files of 512 KiB is installed (not
timed); then version 2, with 20 files changed (one in each folder), is fetched: by `packs fetch` as a
delta, against `packs fetch --no-delta` (the whole pack; target: ≤ 0.1), and against `zsync -i` from the
old pack file (which only rebuilds the file, no unpack). Also the bytes nginx served for /delta2/d.zip,
as a share of the pack (target for the delta: ≤ 3 %), and packs's peak RSS.

Run alone: Benchmarks/run --only 11
"""
import os
import shutil

from harness import data
from harness.measure import KiB, MiB, Failure, log, sh
from harness.tables import fmt_mib, median

CASES = (11,)


def make_data(b):
    log("data: a 1000 MiB zip pack of 2,000 files and its next version with 20 files changed, indexed…")
    rng = b.rng("delta")
    src = os.path.join(b.src_root, "delta", "com.bench.delta")
    files = [os.path.join(src, "Contents", f"d{i // 100:02d}", f"f{i % 100:02d}.bin") for i in range(2000)]
    for path in files:
        data.random_file(path, 512 * KiB, rng)
    for version, folder in (("1", "delta1"), ("2", "delta2")):
        if version == "2":
            for path in files[37::100]:   # 20 files, one in each folder
                data.random_file(path, 512 * KiB, rng)
        os.makedirs(os.path.join(b.site, folder), exist_ok=True)
        sh([b.packs, "pack", src, "--output", os.path.join(b.site, folder, "d.zip"),
            "--product", "com.bench.delta", "--version", version])
        b.data[folder] = data.manifest(b, folder)["com.bench.delta"]
    shutil.rmtree(src)
    if shutil.which("zsyncmake"):
        sh(["zsyncmake", "-u", f"{b.base}/delta2/d.zip", "-o", os.path.join(b.site, "delta2", "d.zip.zsync"),
            os.path.join(b.site, "delta2", "d.zip")])


def run(b):
    old, new = b.data["delta1"], b.data["delta2"]
    length = new["contentLength"]
    served = {}   # name -> [bytes of /delta2/d.zip the server sent, per run]
    mark = {}

    def setup(work):
        home = f"{work}/home"
        sh(b.packs_cmd(home, "fetch", f"{b.base}/delta1/manifest.json", "com.bench.delta"))
        return home

    def counted(name, make):
        def wrapped(work):
            cmd = make(work)
            # Version 1 was installed long before its update comes: its bytes are on disk, not dirty in the
            # page cache (else the update's first fsync waits for the whole install to be written back).
            os.sync()
            mark[name] = len(b.nginx.log_lines())
            return cmd
        return name, wrapped

    def check(name, work, run):
        sent = 0
        for line in b.nginx.log_lines()[mark[name]:]:
            fields = line.split(" ")
            if fields[0].startswith("/delta2/d.zip") and not fields[0].endswith(".zsync"):
                sent += int(fields[2])
        served.setdefault(name, []).append(sent)
        if name.startswith("packs"):
            out = sh(b.packs_cmd(f"{work}/home", "--json", "content", "com.bench.delta"))
            if '"contentVersion":"2"' not in out.replace(" ", ""):
                raise Failure(f"{name}: version 2 is not installed: {out}")
            sh(b.packs_cmd(f"{work}/home", "verify", "com.bench.delta"))

    commands = [
        counted("packs delta", lambda w: b.packs_cmd(setup(w), "fetch", f"{b.base}/delta2/manifest.json", "com.bench.delta")),
        counted("packs --no-delta", lambda w: b.packs_cmd(setup(w), "fetch", f"{b.base}/delta2/manifest.json", "com.bench.delta", "--no-delta")),
    ]
    zsync = shutil.which("zsync") and os.path.exists(os.path.join(b.site, "delta2", "d.zip.zsync"))
    if zsync:
        def zsync_cmd(work):
            shutil.copy(os.path.join(b.site, "delta1", old["url"]), f"{work}/old.zip")
            return f"cd {work} && zsync -q -i old.zip -o new.zip {b.base}/delta2/d.zip.zsync && [ \"$(openssl dgst -sha256 -r new.zip | cut -d' ' -f1)\" = {new['sha256']} ]"
        commands.append(counted("zsync", zsync_cmd))
    else:
        b.report.notes.append("case 11: zsync is not installed (Debian has it: apt-get install zsync); compared without it.")
    log(f"case 11: delta update of a {length / MiB:.0f} MiB zip, 20 of 2,000 files changed…")
    # Each command's warm-up is the memory it uses: touching and freeing 2 GiB just before a 0.3 s run makes
    # the host take those pages back during the run, and the run's own page faults pay for it (measured here:
    # the delta took 0.30 s after no warm-up, 0.58–0.73 s right after a 2 GiB one).
    warm = {"packs delta": 64 * MiB, "packs --no-delta": 2 * length, "zsync": 2 * length}
    # keep: 2,000 files deleted before a run make every file it creates slow on this journal-less ext4 (see
    # alternate()); the delta, 0.3 s, took twice as long after the previous round's trees were deleted.
    res = b.alternate(11, commands, b.reps, check=check, warm_bytes=warm, keep=True,
                      served=[os.path.join(b.site, "delta2", new["url"])])
    walls = {name: [r.wall for r in runs] for name, runs in res.items()}
    what = f"update, {length / MiB:.0f} MiB zip, 20 of 2,000 files changed"
    b.report.row(11, what, walls["packs delta"], "packs fetch --no-delta (whole pack)", walls["packs --no-delta"], target=0.1)
    if zsync:
        b.report.row(11, what, walls["packs delta"], "zsync -i old pack (file only, no unpack)", walls["zsync"])
    share = median(served["packs delta"]) / length
    b.report.rows.append(("11", "bytes served, share of the pack (median): " + ", ".join(
        f"{n} {median(v) / MiB:.1f} MiB ({median(v) / length:.2%})" for n, v in served.items()),
        f"{share:.2%}", "", "", "", "≤ 3%", "pass" if share <= 0.03 else "**FAIL**"))
    b.report.rows.append(("11", "packs peak RSS, delta (max of runs)", fmt_mib(max(r.rss_kib for r in res["packs delta"])), "", "", "", "", ""))
