"""Case 8: `packs serve` under load, against nginx serving the same folder. 1,000 wrk connections on
loopback (wrk -t2 -c1000, --load-seconds each run): whole 4 MiB files (target: ≥ 0.8 of nginx's
requests/s), and 64 KiB ranges at random aligned offsets of the same file (target: ≥ 0.5). Each packs run
starts a fresh `packs serve` whose RSS is sampled every 0.2 s, so its RSS at start, peak (target: ≤ 256
MiB) and 10 s after the load (target: ≤ 64 MiB more than at start) are of that run alone. nginx runs
throughout, in a configuration of its own (4096 worker connections, sendfile, ETag). Neither logs
requests. `packs serve --metrics-address` (counting every request, scraped by nobody) runs as a third
server in the same rounds: its requests/s ÷ plain `packs serve`'s is what metrics cost (target: ≥ 0.97).
Runs alternate, the order rotated every round.

Run alone: Benchmarks/run --only 8 [--load-seconds S]
"""
import os
import resource
import shutil
import subprocess
import time

from harness import data
from harness.measure import MiB, Failure, log
from harness.servers import Nginx, PacksServe
from harness.tables import fmt_mib, median

CASES = (8,)


def make_data(b):
    log("data: a 4 MiB file for the server load case…")
    data.random_file(os.path.join(b.site, "load", "pack4m.bin"), 4 * MiB, b.rng("load"))


def run(b):
    wrk = shutil.which("wrk")
    if not wrk:
        raise Failure("wrk is not installed (Debian package wrk)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192 <= hard or soft < hard < 8192:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    site = os.path.join(b.site, "load")
    seconds = b.load_seconds
    lua = os.path.join(b.tmp, "ranges.lua")
    with open(lua, "w") as f:
        f.write("math.randomseed(8)\n"
                "request = function()\n"
                "  local first = math.random(0, 63) * 65536\n"
                "  return wrk.format('GET', '/pack4m.bin', { ['Range'] = 'bytes=' .. first .. '-' .. (first + 65535) })\n"
                "end\n")
    nginx = Nginx(os.path.join(b.tmp, "nginx-load"), site, connections=4096, keepalive_requests=100000, access_log=False,
                  rlimit_nofile=8192)
    nginx.start()
    every_run = []
    try:
        loads = [("whole 4 MiB", []), ("64 KiB ranges", ["-s", lua])]
        commands = [(server, load) for load in loads for server in ("packs", "packs+metrics", "nginx")]
        results = {(server, load[0]): [] for server, load in commands}
        log(f"case 8: packs serve and nginx under wrk -c1000 for {seconds} s, {b.reps} rounds…")
        for r in range(b.reps):
            k = r % len(commands)
            for server, (load, extra) in commands[k:] + commands[:k]:
                run = load_run(b, wrk, server, site, nginx.port, extra, seconds)
                results[(server, load)].append(run)
                log(f"  case 8 round {r} {server:<5} {load:<13} {run['rps']:9.0f} req/s  {run['mib_s']:7.0f} MiB/s  p99 {run['p99']}"
                    f"  errors {run['errors']}" + (f"  rss {run['start'] / 1024:.0f} → peak {run['peak'] / 1024:.0f} → "
                                                    f"{run['after'] / 1024:.0f} MiB 10 s after" if server != "nginx" else ""))
                every_run.append((r, server, load, run))
    finally:
        nginx.stop()
        if every_run:
            b.report.sections.append(runs_table(every_run))
    for load, _ in loads:
        ours = [x["rps"] for x in results[("packs", load)]]
        peer = [x["rps"] for x in results[("nginx", load)]]
        ratio = median(ours) / median(peer) if median(peer) else float("nan")
        target = 0.8 if load.startswith("whole") else 0.5
        b.report.rows.append(("8", f"{load}, 1,000 connections, requests/s (wrk -t2 -c1000 -d{seconds}s)",
                              f"{median(ours):.0f} ({min(ours):.0f}–{max(ours):.0f})", "nginx (sendfile)",
                              f"{median(peer):.0f} ({min(peer):.0f}–{max(peer):.0f})", f"{ratio:.2f}", f"≥ {target}",
                              "pass" if ratio >= target else "**FAIL**"))
        counted = [x["rps"] for x in results[("packs+metrics", load)]]
        cost = median(counted) / median(ours) if median(ours) else float("nan")
        b.report.rows.append(("8", f"{load}: packs serve with --metrics-address, requests/s (same rounds)",
                              f"{median(counted):.0f} ({min(counted):.0f}–{max(counted):.0f})", "packs serve without",
                              f"{median(ours):.0f} ({min(ours):.0f}–{max(ours):.0f})", f"{cost:.3f}", "≥ 0.97",
                              "pass" if cost >= 0.97 else "**FAIL**"))
    packs_runs = [x for (server, _), runs in results.items() if server != "nginx" for x in runs]
    whole = results[("packs", "whole 4 MiB")]
    peak = max(x["peak"] for x in whole)
    b.report.rows.append(("8", "packs serve peak RSS, 1,000 whole-file clients (max of runs)", fmt_mib(peak), "", "", "",
                          "≤ 256 MiB", "pass" if peak <= 256 * 1024 else "**FAIL**"))
    worst = max(x["after"] - x["start"] for x in packs_runs)
    b.report.rows.append(("8", "packs serve RSS 10 s after the load − RSS at start (worst run)", fmt_mib(worst), "", "", "",
                          "≤ 64 MiB", "pass" if worst <= 64 * 1024 else "**FAIL**"))
    errors = sum(x["errors"] for (server, _), runs in results.items() for x in runs if server != "nginx")
    if errors:
        b.report.notes.append(f"case 8: wrk counted {errors} socket errors or non-2xx answers against packs serve.")


def load_run(b, wrk, server, site, nginx_port, extra, seconds):
    """One wrk run; for packs, a fresh `packs serve` whose RSS is sampled every 0.2 s."""
    serve = PacksServe(b.packs, site, metrics=server == "packs+metrics") if server != "nginx" else None
    port = serve.port if serve else nginx_port
    start = serve.rss() if serve else 0
    samples = []
    w = subprocess.Popen([wrk, "-t2", "-c1000", f"-d{seconds}s", "--timeout", "30s", "--latency", *extra,
                          f"http://127.0.0.1:{port}/pack4m.bin"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while w.poll() is None:
        if serve:
            samples.append(serve.rss())
        time.sleep(0.2)
    out = w.stdout.read()
    after = 0
    if serve:
        deadline = time.time() + 10
        while time.time() < deadline:
            samples.append(serve.rss())
            time.sleep(0.2)
        after = serve.rss()
        serve.stop()
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


def runs_table(every_run):
    lines = ["\n### Case 8, every run (wrk -t2 -c1000 --timeout 30s --latency; RSS of the packs serve process)\n",
             "| round | server | load | requests/s | MiB/s | p99 latency | socket errors + non-2xx | RSS start / peak / 10 s after (MiB) |",
             "|---:|---|---|---:|---:|---:|---:|---|"]
    for r, server, load, run in every_run:
        memory = (f"{run['start'] / 1024:.0f} / {run['peak'] / 1024:.0f} / {run['after'] / 1024:.0f}"
                  if server != "nginx" else "")
        lines.append(f"| {r} | {server} | {load} | {run['rps']:.0f} | {run['mib_s']:.0f} | {run['p99']} | {run['errors']} | {memory} |")
    return "\n".join(lines)
