"""Case 19d (a machine's whole queue through the agent) alone, with glibc's heap at the moment the case reads the RSS.

    python3 Benchmarks/analysis/queue_alone.py PACKS TMP [COUNT]      (TMP: an empty folder, removed by the caller)

It runs the case's own `whole_queue` (cases/19_agent_delivery.py) with its `Agent`, on a catalog of COUNT tiny packs
(default 10,000) written by case 9's `make_catalog` and given as a file:// manifest: no nginx, as nothing downloads
(the window is closed). When the case reads the agent's RSS, this prints VmRSS, RssAnon and RssFile, the agent's
`malloc_stats()` totals (through gdb; they go to the agent's log), and, with TRIM=1 in the environment, RssAnon after
a `malloc_trim(0)`. Used for Benchmarks/RESULTS.md, "Case 19d: the windowed queue".
"""
import importlib
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
packs, tmp = sys.argv[1], sys.argv[2]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 10000


class Bench:
    """What make_catalog, Agent and whole_queue read of the harness's Bench."""


b = Bench()
b.packs, b.site, b.data = packs, os.path.join(tmp, "site"), {}
b.data["catalog10000"] = importlib.import_module("cases.09_catalog").make_catalog(b, "catalog10000", count)
b.base = "file://" + b.site
case = importlib.import_module("cases.19_agent_delivery")
folder = os.path.join(tmp, "agent")
os.makedirs(folder)
agent = case.agent_case.Agent(b, folder)
subprocess.run([packs, "config", "max-rate", "none"], env=agent.env, check=True, capture_output=True)


def gdb(call):
    subprocess.run(["gdb", "-p", str(agent.process.pid), "-batch", "-ex", call], capture_output=True)


def heap(label):
    gdb("call (void)malloc_stats()")
    time.sleep(0.5)
    agent.log.flush()
    with open(os.path.join(folder, "agent.log"), errors="replace") as f:
        lines = f.read().splitlines()
    at = max((n for n, line in enumerate(lines) if line.startswith("Total (incl. mmap)")), default=len(lines) - 3)
    print(label, " ".join(line.strip() for line in lines[at:at + 3]), flush=True)


status_kib = agent.status_kib
sampled = []


def sampling_status_kib(field):
    # whole_queue reads VmRSS, then RssAnon: the heap is read right after, before the status requests that follow.
    if field == "RssAnon" and not sampled:
        sampled.append(True)
        print("at the RSS sample:", {f: round(status_kib(f) / 1024, 1) for f in ("VmRSS", "RssAnon", "RssFile")}, flush=True)
        heap("heap at the RSS sample:")
        if os.environ.get("TRIM"):
            gdb("call (int)malloc_trim(0)")
            print("after malloc_trim(0):", {f: round(status_kib(f) / 1024, 1) for f in ("VmRSS", "RssAnon")}, flush=True)
    return status_kib(field)


agent.status_kib = sampling_status_kib
rows = []
try:
    case.whole_queue(b, agent, folder, rows)
    for row in rows:
        print(row[1], row[2], row[5], row[7], flush=True)
    heap("heap after the status requests:")
finally:
    agent.stop()
