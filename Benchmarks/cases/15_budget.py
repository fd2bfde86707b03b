"""Case 15: a cache budget under on-demand fetches (issue 31). With a budget of BUDGET (1 GiB in the issue;
256 MiB by default here, PACKS_BENCH_BUDGET_MIB sets it), 24 packs totalling 3 × BUDGET are fetched one after
another (`packs fetch … --cache-budget`), each its own command, while `packs lease` holds the first one from
another process. The bytes under the home's Caches/ (st_blocks, downloads, staging and trash included) are sampled
every 100 ms. Checks: the peak never exceeds the budget by more than one pack (the pack being installed); the
leased pack is still installed at the end; nginx sent no pack's bytes twice (its access log, per pack). No peer:
the numbers are bytes, not times.

Run alone: Benchmarks/run --only 15
"""
import os
import signal
import subprocess
import threading
import time

from harness import data
from harness.measure import MiB, Failure, log, sh

CASES = (15,)
COUNT = 24


def budget_bytes():
    return int(os.environ.get("PACKS_BENCH_BUDGET_MIB", "256")) * MiB


def pack_size():
    return 3 * budget_bytes() // COUNT


def make_data(b):
    size = pack_size()
    log(f"data: {COUNT} packs of {size // MiB} MiB (tar) for a {budget_bytes() // MiB} MiB budget…")
    rng = b.rng("budget")
    for i in range(COUNT):
        data.make_pack(b, "budget", [("data.bin", size)], f"com.bench.budget.p{i:02d}", f"p{i:02d}.tar", rng)
    b.data["budget"] = data.manifest(b, "budget")


def disk_use(folder):
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def run(b):
    budget, size = budget_bytes(), pack_size()
    home = b.fresh("budget-home")
    manifest = f"{b.base}/budget/manifest.json"
    products = sorted(b.data["budget"])
    before = len(b.nginx.log_lines())
    sh(b.packs_cmd(home, "fetch", manifest, products[0], "--cache-budget", str(budget)))
    lease = subprocess.Popen([b.packs, "--home", home, "lease", products[0]], stdout=subprocess.PIPE, text=True)
    if not lease.stdout.readline().startswith("leased"):
        raise Failure("case 15: packs lease did not take its lease")
    peak, samples, stop = [0], [0], threading.Event()
    caches = os.path.join(home, "Caches")

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], disk_use(caches))
            samples[0] += 1
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.time()
    try:
        for product in products[1:]:
            sh(b.packs_cmd(home, "fetch", manifest, product, "--cache-budget", str(budget)))
    finally:
        stop.set()
        sampler.join()
        lease.send_signal(signal.SIGTERM)
        lease.wait()
    seconds = time.time() - started
    leased_stays = os.path.isdir(os.path.join(caches, products[0]))
    sent = {}
    for line in b.nginx.log_lines()[before:]:
        uri, status, body = line.split(" ")[:3]
        if uri.startswith("/budget/p") and uri.endswith(".tar"):
            sent[uri] = sent.get(uri, 0) + int(body)
    twice = {uri: n for uri, n in sent.items() if n > size + MiB}
    final = disk_use(caches)
    over = peak[0] - budget
    ok = over <= size + 2 * MiB and leased_stays and not twice and len(sent) == COUNT
    b.report.sections.append(
        f"### Case 15: cache budget\n\n"
        f"{COUNT} packs of {size / MiB:.0f} MiB ({COUNT * size / MiB:.0f} MiB, 3 × the budget) fetched one after another "
        f"with `--cache-budget {budget // MiB}M`, the first leased by another process; {samples[0]} samples of Caches/ "
        f"every 100 ms over {seconds:.1f} s.\n\n"
        f"| budget | one pack | peak | peak − budget | at the end | leased pack stays | packs sent twice | result |\n"
        f"|---|---|---|---|---|---|---|---|\n"
        f"| {budget / MiB:.0f} MiB | {size / MiB:.0f} MiB | {peak[0] / MiB:.1f} MiB | {over / MiB:.1f} MiB | "
        f"{final / MiB:.1f} MiB | {'yes' if leased_stays else 'NO'} | {len(twice)} | {'pass' if ok else '**FAIL**'} |\n")
    if not ok:
        b.report.notes.append(f"BROKEN: case 15: peak {peak[0]} bytes for a budget of {budget} (packs of {size}), "
                              f"leased pack stays: {leased_stays}, sent twice: {twice}, packs fetched: {len(sent)}")
