"""Case 19: delivery through `packs agent` against in-process (issue 44), with nginx on loopback.

a. One 1 GiB pack (case 1's): `packs fetch --detach` to the agent and waited for on its event stream, against
   `packs fetch` in-process, alternated (target ≤ 1.05 × the in-process wall time); the agent's peak RSS while it
   runs (VmHWM, target ≤ 64 MiB).
b. A client that dies at 30 % of that pack: a `packs watch` following it is SIGKILLed; the agent finishes the pack
   alone; nginx serves ≤ 1.01 × the pack; the next client (`packs content PRODUCT`, through the agent) prints the
   installed folder within 100 ms of starting (process start included).
c. Case 9's catalog of 10,000 tiny packs: `fetch --detach --all` and waited for, against in-process `fetch --all`
   (target ≤ 1.2 ×; the in-process one under `ulimit -n 1024`).
d. A machine's whole queue: the same 10,000 products recorded in 10 homes (100,000 downloads) as background work
   (`POST /v1/fetch` with `"priority": "background"`) while the background window is closed (`packs config
   schedule` set away from now), so that all wait: the agent's
   RSS after (target ≤ 128 MiB), and the time to record each home's 10,000 (linear: the 10th home within 1.25 × the
   1st).

Run alone: Benchmarks/run --only 19
"""
import datetime
import importlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time

from harness.measure import MiB, Failure, log, timed
from harness.tables import median

CASES = (19,)
DATA = ("big",)

agent_case = importlib.import_module("cases.18_agent")
catalog_case = importlib.import_module("cases.09_catalog")


def make_data(b):
    if "catalog10000" not in b.data:
        log("data: a catalog of 10,000 tiny packs (case 9's)…")
        # CASE19_CATALOG=3000 makes a smaller catalog, to study it quicker (the rows still say 10,000).
        b.data["catalog10000"] = catalog_case.make_catalog(b, "catalog10000", int(os.environ.get("CASE19_CATALOG", "10000")))


class Finished:
    """Follows /v1/events on a thread: when each download was first seen finished, and the last bytes of each."""

    def __init__(self, agent):
        self.lock = threading.Lock()
        self.done = {}
        self.bytes = {}
        self.connection = agent_case.UnixConnection(agent.socket, timeout=3600)
        self.stream = agent_case.download_events(agent, self.connection)
        threading.Thread(target=self.follow, daemon=True).start()

    def follow(self):
        for event in self.stream:
            with self.lock:
                self.bytes[event["id"]] = event.get("bytesReceived", 0)
                if event["state"] == "finished":
                    self.done.setdefault(event["id"], time.perf_counter())
                elif event["state"] in ("failed", "cancelled"):
                    self.done.setdefault(event["id"], None)

    def wait(self, ids, timeout, what):
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self.lock:
                if all(i in self.done for i in ids):
                    failed = [i for i in ids if self.done[i] is None]
                    if failed:
                        raise Failure(f"case 19: {what}: {len(failed)} downloads failed or were cancelled")
                    return max(self.done[i] for i in ids)
            time.sleep(0.005)
        with self.lock:
            missing = len([i for i in ids if i not in self.done])
        raise Failure(f"case 19: {what}: {missing} of {len(ids)} downloads not finished after {timeout} s")

    def close(self):
        self.connection.close()


def detach(b, agent, home, manifest, products):
    argv = [b.packs, "--home", home, "--json", "fetch", "--detach", "--socket", agent.socket, manifest, *products]
    p = subprocess.run(argv, capture_output=True, text=True, env=agent.env, timeout=600)
    if p.returncode != 0:
        raise Failure(f"case 19: fetch --detach exited {p.returncode}: {p.stderr[-500:]}")
    # One line per transaction.
    return [d for line in p.stdout.splitlines() if line.strip() for d in json.loads(line)["downloads"]]


def served(b, path, before):
    return sum(int(l.split()[2]) for l in b.nginx.log_lines()[before:] if l.split(" ", 1)[0] == path)


def run(b):
    rows = []
    folder = b.fresh("agent-delivery")
    agent = agent_case.Agent(b, folder)
    # No cap for this case: it measures the agent's own cost (case 18 measures the cap).
    subprocess.run([b.packs, "config", "max-rate", "none"], env=agent.env, check=True, capture_output=True)
    try:
        # CASE19_PARTS=big,catalog,queue (default: all) runs some of them, to study one.
        parts = os.environ.get("CASE19_PARTS", "big,catalog,queue").split(",")
        for name, part in (("big", big_pack), ("catalog", catalog), ("queue", whole_queue)):
            if name in parts:
                part(b, agent, folder, rows)
    finally:
        agent.stop()
    b.report.rows += rows
    for row in rows:
        log(f"case 19: {row[1]}: {row[2]} ({row[7]})")


def alternated(b, agent, folder, label, here, detached, timeout, expected=None):
    """The in-process `here` command (argv or shell line, given the home) and `fetch --detach` of `detached` waited
    for on the events, alternated b.reps times; returns (agent walls, in-process walls). The agent's homes stay (it
    serves them; removed with the run's folder), the in-process ones go."""
    agent_walls, here_walls = [], []
    for rep in range(max(1, b.reps)):
        order = ("agent", "here") if rep % 2 == 0 else ("here", "agent")
        for who in order:
            home = os.path.join(folder, f"{label}-{who}-{rep}")
            if who == "here":
                run = timed(here(home), b.tmp, timeout=timeout)
                if run.code != 0:
                    raise Failure(f"case 19: {label} in-process exited {run.code}: {run.err[-500:]}")
                here_walls.append(run.wall)
                subprocess.run(["rm", "-rf", home])
            else:
                events = Finished(agent)
                start = time.perf_counter()
                ids = detach(b, agent, home, *detached)
                if expected is not None and len(ids) != expected:
                    raise Failure(f"case 19: {label}: fetch --detach handed over {len(ids)} downloads of {expected}")
                agent_walls.append(events.wait(ids, timeout, label) - start)
                events.close()
    return agent_walls, here_walls


def big_pack(b, agent, folder, rows):
    big = b.data["big"]
    manifest = f"{b.base}/big/manifest.json"
    agent_walls, here_walls = alternated(
        b, agent, folder, "big", lambda home: b.packs_cmd(home, "fetch", manifest, "com.bench.big"),
        (manifest, ["com.bench.big"]), 600)
    peak = agent.status_kib("VmHWM")
    ratio = median(agent_walls) / median(here_walls)
    rows.append(("19", "1 GiB pack through the agent (fetch --detach, waited for on the events) ÷ in-process fetch",
                 f"{median(agent_walls):.2f} s", "in-process", f"{median(here_walls):.2f} s", f"{ratio:.2f}", "≤ 1.05",
                 "pass" if ratio <= 1.05 else "**FAIL**"))
    rows.append(("19", "the agent's peak RSS (VmHWM) after the 1 GiB runs", f"{peak / 1024:.1f} MiB", "", "", "", "≤ 64 MiB",
                 "pass" if peak <= 64 * 1024 else "**FAIL**"))

    # b. A client following the download dies at 30 %; the agent finishes alone.
    home = os.path.join(folder, "big-quit")
    events = Finished(agent)
    before = len(b.nginx.log_lines())
    watch = subprocess.Popen([b.packs, "--home", home, "--json", "watch", "--socket", agent.socket], env=agent.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids = detach(b, agent, home, manifest, ["com.bench.big"])
    deadline = time.perf_counter() + 300
    while time.perf_counter() < deadline and events.bytes.get(ids[0], 0) < 0.3 * big["contentLength"]:
        time.sleep(0.005)
    watch.send_signal(signal.SIGKILL)
    watch.wait()
    at = events.bytes.get(ids[0], 0) / big["contentLength"]
    events.wait(ids, 600, "the 1 GiB pack after its client died")
    events.close()
    bytes_served = served(b, f"/big/{big['url']}", before)
    start = time.perf_counter()
    content = subprocess.run([b.packs, "--home", home, "content", "com.bench.big", "--socket", agent.socket],
                             capture_output=True, text=True, env=agent.env)
    next_launch = time.perf_counter() - start
    if content.returncode != 0 or "/" not in content.stdout:
        raise Failure(f"case 19: packs content after the agent finished exited {content.returncode}: {content.stderr}")
    share = bytes_served / big["contentLength"]
    rows.append(("19", f"a client killed at {at * 100:.0f} % of the 1 GiB pack: nginx served ÷ the pack",
                 f"{share:.3f}", "", "", "", "≤ 1.01", "pass" if share <= 1.01 else "**FAIL**"))
    rows.append(("19", "the next client's `packs content` through the agent, process start included",
                 f"{next_launch * 1000:.0f} ms", "", "", "", "≤ 100 ms", "pass" if next_launch <= 0.1 else "**FAIL**"))


def catalog(b, agent, folder, rows):
    manifest = f"{b.base}/catalog10000/manifest.json"
    agent_walls, here_walls = alternated(
        b, agent, folder, "catalog",
        lambda home: f"ulimit -n 1024 && exec {shlex.join(b.packs_cmd(home, 'fetch', manifest, '--all'))}",
        (manifest, ["--all"]), 1800, expected=len(b.data["catalog10000"]))
    ratio = median(agent_walls) / median(here_walls)
    rows.append(("19", "10,000 tiny packs through the agent (fetch --detach, waited for) ÷ in-process fetch --all",
                 f"{median(agent_walls):.1f} s", "in-process", f"{median(here_walls):.1f} s", f"{ratio:.2f}", "≤ 1.2",
                 "pass" if ratio <= 1.2 else "**FAIL**"))


def whole_queue(b, agent, folder, rows):
    products = sorted(b.data["catalog10000"])
    manifest = f"{b.base}/catalog10000/manifest.json"
    # A window that excludes now: from 3 hours on, for 2 hours (local time).
    now = datetime.datetime.now()
    opens, closes = now + datetime.timedelta(hours=3), now + datetime.timedelta(hours=5)
    window = f"{opens:%H:%M}-{closes:%H:%M}"
    subprocess.run([b.packs, "config", "schedule", window], env=agent.env, check=True, capture_output=True)
    seconds = []
    try:
        for i in range(10):
            home = os.path.join(folder, f"queue-{i}")
            start = time.perf_counter()
            status, answer = agent.request("POST", "/v1/fetch", {
                "home": home, "manifest": manifest, "products": products, "priority": "background"})
            seconds.append(time.perf_counter() - start)
            log(f"case 19: home {i}: recorded in {seconds[-1]:.1f} s, agent RSS {agent.status_kib('VmRSS') / 1024:.1f} MiB")
            if status != 202:
                raise Failure(f"case 19: home {i}: POST /v1/fetch answered {status}: {answer[:300]}")
            ids = [d for t in json.loads(answer)["transactions"] for d in t["downloads"]]
            if len(ids) != len(products):
                raise Failure(f"case 19: home {i}: {len(ids)} downloads recorded of {len(products)}")
        time.sleep(2)
        rss = agent.status_kib("VmRSS")
        log(f"case 19: 100,000 queued: RssAnon {agent.status_kib('RssAnon') / 1024:.1f} MiB, "
            f"RssFile {agent.status_kib('RssFile') / 1024:.1f} MiB")
        for i in range(10):
            status, answer = agent.request("GET", f"/v1/downloads?home={os.path.join(folder, f'queue-{i}')}")
            states = {d["state"] for t in json.loads(answer)["transactions"] for d in t["downloads"]}
            if status != 200 or states - {"waiting", "paused"}:
                raise Failure(f"case 19: home {i}: a download runs outside the window: {sorted(states)}")
    finally:
        subprocess.run([b.packs, "config", "schedule", "none"], env=agent.env, capture_output=True)
    growth = seconds[-1] / seconds[0]
    rows.append(("19", "100,000 downloads queued over 10 homes: the agent's RSS", f"{rss / 1024:.1f} MiB", "", "", "",
                 "≤ 128 MiB", "pass" if rss <= 128 * 1024 else "**FAIL**"))
    rows.append(("19", "recording 10,000 downloads in the 1st / 10th home (fetch --detach)",
                 f"{seconds[0]:.1f} / {seconds[-1]:.1f} s", "", "", f"{growth:.2f}", "≤ 1.25 (linear)",
                 "pass" if growth <= 1.25 else "**FAIL**"))
