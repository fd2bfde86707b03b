"""Case 17: a restore of 100 products while 50 prefetch packs are queued (issue 31). A product `com.bench.od.game`
has an essential pack, 50 prefetch packs and 5 on-demand packs; 100 products `com.bench.od.r000`… have one pack
each (128 KiB tars). One `packs fetch --restore MANIFEST com.bench.od.game r000 … r099` (the game first, so that
in arrival order its 50 prefetch packs come before the 100 restore packs; concurrency 4) runs against an nginx of
its own that logs when each request started ($msec − $request_time) and sends at 512 KiB/s per request (sendfile
off, so that limit_rate applies to small files), so each pack takes ~0.25 s. Checks, from nginx's access log:
no prefetch request starts between the first and the last restore request's start, and at most 3 before the
first (admitted to free slots before the restore's transactions were recorded; in arrival order all 50 would): every
restore download starts before any remaining prefetch download. The on-demand packs transfer 0 bytes (no request)
until `packs use` asks for one, which is then sent whole while the other four stay at 0.

Run alone: Benchmarks/run --only 17 --reps 1
"""
import json
import os

from harness import data
from harness.measure import Failure, log, sh
from harness.servers import Nginx

CASES = (17,)
GAME = "com.bench.od.game"
PREFETCH, ON_DEMAND, RESTORES = 50, 5, 100
SIZE = 128 << 10
CONCURRENCY = 4  # packs's default


class TimedNginx(Nginx):
    """The harness's nginx, logging each request's start (s since the epoch) and sending at 512 KiB/s."""

    def conf(self, port):
        conf = super().conf(port)
        timed = conf.replace('"$http_range"\';', '"$http_range" $msec $request_time\';')
        if timed == conf:
            raise Failure("case 17: the harness's nginx log format changed; cannot log request starts")
        return timed


def make_data(b):
    log(f"data: a product of 1 essential, {PREFETCH} prefetch and {ON_DEMAND} on-demand packs, "
        f"{RESTORES} one-pack products ({SIZE >> 10} KiB tars)…")
    rng = b.rng("ondemand")
    names = ["a"] + [f"p{i:02d}" for i in range(PREFETCH)] + [f"q{i}" for i in range(ON_DEMAND)]
    for name in names:
        data.make_pack(b, "ondemand", [("data.bin", SIZE)], GAME, f"{name}.tar", rng)
    for i in range(RESTORES):
        data.make_pack(b, "ondemand", [("data.bin", SIZE)], f"com.bench.od.r{i:03d}", f"r{i:03d}.tar", rng)
    data.manifest(b, "ondemand")
    path = os.path.join(b.site, "ondemand", "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    for product in manifest["products"]:
        for content in product["contents"]:
            stem = content["url"].rsplit(".", 1)[0]
            if stem.startswith("p"):
                content["delivery"] = "prefetch"
            elif stem.startswith("q"):
                content["delivery"] = "onDemand"
    with open(path, "w") as f:
        json.dump(manifest, f)
    b.data["ondemand"] = sorted(p["productIdentifier"] for p in manifest["products"] if p["productIdentifier"] != GAME)


def starts(nginx):
    """(start time, uri, body bytes) of each logged request, in the order they started."""
    rows = []
    for line in nginx.log_lines():
        parts = line.split(" ")
        uri, body, msec, took = parts[0], int(parts[2]), float(parts[-2]), float(parts[-1])
        rows.append((round(msec - took, 3), uri, body))
    return sorted(rows, key=lambda r: r[0])


def run(b):
    nginx = TimedNginx(b.fresh("ondemand-nginx"), b.site,
                       locations="\n        location / { sendfile off; limit_rate 512k; }")
    nginx.start()
    try:
        home = os.path.join(b.fresh("ondemand-home"), "home")
        manifest = f"{nginx.base}/ondemand/manifest.json"
        log(f"case 17: a restore of {RESTORES} products behind a product with {PREFETCH} prefetch packs…")
        sh(b.packs_cmd(home, "fetch", "--restore", manifest, GAME, *b.data["ondemand"]))
        order = starts(nginx)
        kinds = []
        for _, uri, _ in order:
            name = uri.rsplit("/", 1)[-1]
            kinds.append(name[0] if name.endswith(".tar") else "-")
        restore_at = [i for i, k in enumerate(kinds) if k == "r"]
        prefetch_at = [i for i, k in enumerate(kinds) if k == "p"]
        if len(restore_at) != RESTORES:
            raise Failure(f"case 17: {len(restore_at)} restore requests, not {RESTORES}")
        first, last = restore_at[0], restore_at[-1]
        before = sum(1 for i in prefetch_at if i < first)
        between = sum(1 for i in prefetch_at if first < i < last)
        after = sum(1 for i in prefetch_at if i > last)
        on_demand_sent = sum(body for _, uri, body in order if uri.rsplit("/", 1)[-1].startswith("q"))
        on_demand_requests = sum(1 for k in kinds if k == "q")

        asked = f"{GAME}.q2"
        sh(b.packs_cmd(home, "use", GAME, asked))
        sent = {}
        for _, uri, body in starts(nginx):
            name = uri.rsplit("/", 1)[-1]
            if name.startswith("q"):
                sent[name] = sent.get(name, 0) + body
        asked_sent, others_sent = sent.get("q2.tar", 0), sum(v for k, v in sent.items() if k != "q2.tar")
        asked_size = os.path.getsize(os.path.join(b.site, "ondemand", "q2.tar"))
    finally:
        nginx.stop()
    # The game's transaction is recorded first: its essential pack and up to 3 prefetch packs may take the 4 free slots
    # before the restore's transactions are recorded. Any other prefetch pack started before the last restore pack is
    # one that was still queued (in arrival order, all 50 would come first).
    order_ok = before + between <= CONCURRENCY - 1 and between == 0
    bytes_ok = on_demand_sent == 0 and on_demand_requests == 0 and asked_sent == asked_size and others_sent == 0
    b.report.rows.append(("17", f"restore of {RESTORES} products, {PREFETCH} prefetch packs queued: prefetch requests "
                          f"started before the last restore request (of them, after the first)",
                          f"{before + between} ({between})", "", "", "", f"≤ {CONCURRENCY - 1} (0)",
                          "pass" if order_ok else "**FAIL**"))
    b.report.rows.append(("17", f"{ON_DEMAND} on-demand packs: bytes sent until asked; then the one asked for, the others",
                          f"{on_demand_sent} B; {asked_sent} B of {asked_size}, {others_sent} B", "", "", "",
                          "0; whole, 0", "pass" if bytes_ok else "**FAIL**"))
    b.report.sections.append(
        f"### Case 17: restore before prefetch, on demand untouched\n\n"
        f"One `packs fetch --restore` of `{GAME}` ({PREFETCH} prefetch, {ON_DEMAND} on-demand packs) then {RESTORES} "
        f"one-pack products, {SIZE >> 10} KiB each, at 512 KiB/s per request, concurrency 4; order by request start "
        f"($msec − $request_time) in nginx's access log.\n\n"
        f"| requests | prefetch started before the first restore | between first and last restore | after the last "
        f"| on-demand bytes before `packs use` | asked pack / others after |\n"
        f"|---|---|---|---|---|---|\n"
        f"| {len(order)} | {before} | {between} | {after} | {on_demand_sent} | {asked_sent} / {others_sent} |\n")
    if not (order_ok and bytes_ok):
        b.report.notes.append(f"BROKEN: case 17: start order {''.join(kinds)}; on-demand sent {sent}")
