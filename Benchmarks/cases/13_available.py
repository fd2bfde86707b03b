"""Case 13: ensureAvailable of an installed pack, in catalogs of 1,000 and 10,000 installed packs (case 9's tiny
tar packs, fetched once). `packs --verbose use PRODUCT` times the library call alone (its process start and queue
open are not the call) and prints `packs: ensureAvailable took N ms`; 20 products spread over the catalog, each
asked once. Target: every call < 5 ms (one indexed query a pack, no request: nginx's request count is checked to
stay the same).

Run alone: Benchmarks/run --only 13
"""
import importlib
import os
import re
import subprocess

from harness.measure import Failure, log
from harness.tables import median

CASES = (13,)
catalog = importlib.import_module("cases.09_catalog")  # its catalogs of tiny packs


def make_data(b):
    for n in (1_000, 10_000):
        if f"catalog{n}" not in b.data:
            log(f"data: a catalog of {n:,} tiny packs (tar, one 160-byte file each)…")
            b.data[f"catalog{n}"] = catalog.make_catalog(b, f"catalog{n}", n)


def run(b):
    for n in (1_000, 10_000):
        name = f"catalog{n}"
        products = sorted(b.data[name])
        home = os.path.join(b.fresh(f"available{n}"), "home")
        log(f"case 13: fetching the {n:,}-pack catalog once…")
        subprocess.run(["bash", "-c", "ulimit -n 1024 && exec \"$@\"", "_",
                        *b.packs_cmd(home, "fetch", f"{b.base}/{name}/manifest.json", "--all")], check=True)
        before = len(b.nginx.log_lines())
        times = []
        for product in products[:: max(1, len(products) // 20)][:20]:
            out = subprocess.run([b.packs, "--home", home, "--verbose", "use", product], capture_output=True, text=True)
            if out.returncode != 0:
                raise Failure(f"case 13: packs use {product} exited {out.returncode}: {out.stderr[-400:]}")
            found = re.search(r"ensureAvailable took ([0-9.]+) ms", out.stderr)
            if not found:
                raise Failure(f"case 13: no timing line from packs use {product}: {out.stderr[-400:]}")
            times.append(float(found.group(1)))
        if len(b.nginx.log_lines()) != before:
            raise Failure("case 13: packs use of installed packs sent requests")
        worst = max(times)
        b.report.rows.append(("13", f"ensureAvailable of an installed pack, {n:,} packs installed (20 calls)",
                              f"median {median(times):.2f} ms, max {worst:.2f} ms", "", "", "", "< 5 ms",
                              "pass" if worst < 5 else "**FAIL**"))
