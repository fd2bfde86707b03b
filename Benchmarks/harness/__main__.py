"""PackDelivery against curl, aria2c, bsdtar, zsync and nginx: the measuring half of Benchmarks/run.

Benchmarks/run installs the tools, builds packs and makes the temporary folders (it removes them, and
stops the nginx servers by their pid files, on exit), then calls this. This starts nginx over TMP/site
on a free loopback port, makes the data of the chosen cases, runs them (cases/NN_name.py, in order),
and prints the report. Everything here is written under TMP and the --shm folder (random data, homes,
outputs). The commands of one case run alternately, the order rotated each round, and their medians are
compared.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

import cases

from . import data, profile
from .bench import Bench
from .measure import Failure, log
from .servers import Nginx


def main():
    ap = argparse.ArgumentParser(prog="python3 -m harness", description="Called by Benchmarks/run; see there.")
    ap.add_argument("--packs", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--packs-compare", default="", help="another packs binary, alternated with --packs in cases 1, 9 and 10")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--only", default="")
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--shm", default="", help="a folder on tmpfs for case 6b (removed by the caller)")
    ap.add_argument("--load-seconds", type=int, default=10, help="how long each wrk run of case 8 lasts")
    args = ap.parse_args()
    modules = cases.modules()
    site = os.path.join(args.tmp, "site")
    os.makedirs(site, exist_ok=True)
    nginx = Nginx(os.path.join(args.tmp, "nginx"), site,
                  locations="".join(getattr(m, "NGINX_LOCATION", "").format(site=site) for m in modules))
    try:
        nginx.start()
    except Failure as e:
        log(e)
        return 1
    try:
        where = subprocess.run(["df", "-h", "--output=target", args.tmp], stdout=subprocess.PIPE, text=True).stdout
        log(f"nginx {nginx.pid()} on 127.0.0.1:{nginx.port}; data in {args.tmp} ({where.splitlines()[-1].strip()})")
        bench = Bench(args, nginx)
        started = time.time()
        chosen = [m for m in modules if any(bench.wants(n) for n in m.CASES)]
        data.make(bench, chosen)
        for case in chosen:
            try:
                case.run(bench)
            except Failure as e:
                # Reported precisely, and the other cases still run.
                bench.report.notes.append(f"BROKEN: {e}")
                log(f"BROKEN: {e}")
        for folder in bench.deferred:
            shutil.rmtree(folder, ignore_errors=True)
        bench.report.print()
        if bench.profile:
            profile.callgrind(bench)
            profile.perf(bench)
        print(f"\n(total {time.time() - started:.0f} s)")
        return 1 if bench.report.broken() else 0
    finally:
        nginx.stop()


if __name__ == "__main__":
    sys.exit(main())
