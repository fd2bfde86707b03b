"""Cases 6 and 6b: unpacking alone. `packs fetch` of a file:// manifest whose tar.gz pack holds 10,000
files of 1–8 KiB (a durable install), against `bsdtar -xf` of the same archive (target: ≤ 1.3 on ext4),
and against `bsdtar -xf && sync`; also that minus packs's fixed cost (the fetch of a 1-file pack), and
`curl file://` of the archive to /dev/null for scale. 6 writes to the data's filesystem (ext4 here), 6b
to tmpfs (/dev/shm: the unpacker's own cost, without ext4 and the VM).

Run alone: Benchmarks/run --only 6
"""
import os
import shutil

from harness import data
from harness.measure import KiB, MiB, Failure, content_bytes, log
from harness.tables import fmt_s, median

CASES = (6,)


def make_data(b):
    log("data: 10,000 files of 1–8 KiB (tar.gz), and a one-file pack…")
    rng = b.rng("unpack")
    files = [(f"d{i // 100:02d}/f{i % 100:02d}.bin", rng.randint(1 * KiB, 8 * KiB)) for i in range(10_000)]
    data.make_pack(b, "unpack", files, "com.bench.unpack", "unpack.tar.gz", rng)
    b.data["unpack"] = data.manifest(b, "unpack")["com.bench.unpack"]
    data.make_pack(b, "tiny", [("one.bin", 1 * KiB)], "com.bench.tiny", "tiny.tar.gz", rng)
    b.data["tiny"] = data.manifest(b, "tiny")["com.bench.tiny"]


def run(b):
    unpack = b.data["unpack"]
    archive = os.path.join(b.site, "unpack", unpack["url"])
    manifest = "file://" + os.path.join(b.site, "unpack", "manifest.json")
    tiny_manifest = "file://" + os.path.join(b.site, "tiny", "manifest.json")

    def commands(where):
        """where(work) -> the folder the outputs go to (the run folder, or one on tmpfs)."""
        return [
            ("packs fetch file://", lambda w: b.packs_cmd(f"{where(w)}/home", "fetch", manifest, "com.bench.unpack")),
            ("bsdtar -xf", lambda w: f"mkdir -p {where(w)}/out && bsdtar -xf {archive} -C {where(w)}/out"),
            # The same, made durable: packs syncs what it installs; bsdtar does not.
            ("bsdtar -xf && sync", lambda w: f"mkdir -p {where(w)}/out && bsdtar -xf {archive} -C {where(w)}/out && sync"),
            ("curl file:// → /dev/null", lambda w: ["curl", "-s", "-o", "/dev/null", "file://" + archive]),
            ("packs fetch 1-file pack", lambda w: b.packs_cmd(f"{where(w)}/home", "fetch", tiny_manifest, "com.bench.tiny")),
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

    variants = [("6", "ext4 (the data's filesystem)", lambda w: w, max(b.reps, 7))]
    if b.shm:
        variants.append(("6b", "tmpfs (/dev/shm: the unpacker's own cost, without ext4 and the VM)",
                         lambda w: os.path.join(b.shm, os.path.basename(w)), max(b.reps, 5)))
    for case, fs, where, reps in variants:
        log(f"case {case}: unpack 10,000 small files on {fs.split(' ')[0]}…")
        res = b.alternate(case, commands(where), reps, check=check(where), warm_bytes=256 * MiB, served=[archive],
                          keep=(case == "6"))
        m = {name: [r.wall for r in runs] for name, runs in res.items()}
        b.report.row(case, f"10,000 files (1–8 KiB), tar.gz, on {fs}: packs fetch of a file:// manifest (durable install)",
                     m["packs fetch file://"], "bsdtar -xf (not synced)", m["bsdtar -xf"], target=1.3 if case == "6" else None)
        b.report.row(case, "… the same", m["packs fetch file://"], "bsdtar -xf && sync", m["bsdtar -xf && sync"])
        adjusted = median(m["packs fetch file://"]) - median(m["packs fetch 1-file pack"])
        b.report.row(case, "… minus packs's fixed cost (median fetch of a 1-file pack, file://)", adjusted, "bsdtar -xf",
                     median(m["bsdtar -xf"]))
        b.report.rows.append((case, f"for scale: curl file:// of the {unpack['contentLength'] / MiB:.0f} MiB pack to /dev/null "
                              f"{fmt_s(median(m['curl file:// → /dev/null']))}; packs fetch of a 1-file pack "
                              f"{fmt_s(median(m['packs fetch 1-file pack']))}", "", "", "", "", "", ""))
