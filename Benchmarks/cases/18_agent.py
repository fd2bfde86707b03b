"""Case 18: `packs agent` under load (issue 44). One agent, 3 homes × 4 packs of 32 MiB from an nginx without
limits, the machine's rate cap at 20 MB/s (`packs config max-rate 20M`), and meanwhile, over the agent's socket:
- the rate cap: the aggregate bytes/s of every 5 s window (from the `download` events' bytesReceived), ±10 %;
- a user-initiated pack added 8 s in: its share of the cap over the next 2 s (target ≥ 50 %);
- API load: `GET /v1/downloads` as fast as one client sends them, for 5 s (target 1,000/s at p99 ≤ 10 ms);
- event latency: pause and resume of one download, 40 times, from the request sent to its event on the stream
  (an upper bound of state change → callback; target median ≤ 10 ms, p99 ≤ 50 ms);
- the agent's peak RSS while it runs (VmHWM, target ≤ 64 MiB) and its RSS idle 5 s after (target ≤ 24 MiB).

Run alone: Benchmarks/run --only 18
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time

from harness.measure import MiB, Failure, log
from harness.tables import median

CASES = (18,)
PACKS = 13          # 12 for the homes, and the user-initiated one added mid-way
CAP = 20_000_000    # bytes/s


def make_data(b):
    if "agent" in b.data:
        return
    from harness.data import make_pack, manifest
    log("data: 13 packs of 32 MiB for the agent (tar)…")
    rng = b.rng("agent")
    for i in range(PACKS):
        make_pack(b, "agent", [("data.bin", 32 * MiB)], f"com.bench.agent.{i:02d}", f"agent{i:02d}.tar", rng)
    b.data["agent"] = manifest(b, "agent")


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Agent:
    def __init__(self, b, folder):
        self.folder = folder
        self.run = os.path.join(folder, "run")
        os.makedirs(self.run, mode=0o700)
        self.socket = os.path.join(self.run, "agent.sock")
        self.env = dict(os.environ, XDG_STATE_HOME=os.path.join(folder, "state"),
                        XDG_CONFIG_HOME=os.path.join(folder, "config"))
        subprocess.run([b.packs, "config", "max-rate", "20M"], env=self.env, check=True, capture_output=True)
        self.log = open(os.path.join(folder, "agent.log"), "w")
        self.process = subprocess.Popen([b.packs, "agent", "--socket", self.socket], env=self.env,
                                        stdout=self.log, stderr=self.log, start_new_session=True)
        self.version = subprocess.run([b.packs, "--version"], capture_output=True, text=True).stdout.split()[-1]
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.request("GET", "/v1/version")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise Failure("case 18: the agent did not answer within 30 s")

    def request(self, method, path, body=None, connection=None):
        own = connection is None
        connection = connection or UnixConnection(self.socket)
        headers = {"Packs-Client-Version": self.version}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        if own:
            connection.close()
        return response.status, answer

    def status_kib(self, field):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def download_events(agent, connection):
    """The `download` events of /v1/events, each as its parsed data, until the stream ends or is closed. The stream
    is open when this returns (events after it are not missed); the events come as the result is iterated."""
    connection.request("GET", "/v1/events", headers={"Packs-Client-Version": agent.version})
    return parse_download_events(connection.getresponse())


def parse_download_events(response):
    kind = None
    try:
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "download":
                yield json.loads(line[6:])
    except (OSError, ValueError, AttributeError):
        return  # the stream closed (AttributeError: http.client's, when close() comes mid-read)


class Events:
    """Follows /v1/events on a thread: each download's last bytesReceived and state, and when each event came."""

    def __init__(self, agent):
        self.lock = threading.Lock()
        self.bytes = {}          # download id -> last bytesReceived
        self.arrivals = []       # (monotonic time, download id, state)
        self.connection = UnixConnection(agent.socket, timeout=600)
        self.stream = download_events(agent, self.connection)
        threading.Thread(target=self.follow, daemon=True).start()

    def follow(self):
        for event in self.stream:
            now = time.monotonic()
            with self.lock:
                self.bytes[event["id"]] = event["bytesReceived"]
                self.arrivals.append((now, event["id"], event["state"]))

    def total(self, ids=None):
        with self.lock:
            return sum(v for k, v in self.bytes.items() if ids is None or k in ids)

    def first_after(self, start, download, states):
        with self.lock:
            for when, id_, state in self.arrivals:
                if when >= start and id_ == download and state in states:
                    return when
        return None


def run(b):
    folder = b.fresh("agent")
    agent = Agent(b, folder)
    try:
        measure(b, agent, folder)
    finally:
        agent.stop()


def measure(b, agent, folder):
    products = sorted(b.data["agent"])
    manifest = f"{b.base}/agent/manifest.json"
    events = Events(agent)
    homes = [os.path.join(folder, f"home{i}") for i in range(3)]
    ids = []
    started = time.monotonic()
    for i, home in enumerate(homes):
        status, answer = agent.request("POST", "/v1/fetch", {
            "home": home, "manifest": manifest, "products": products[i * 4:(i + 1) * 4], "priority": "background"})
        if status != 202:
            raise Failure(f"case 18: POST /v1/fetch answered {status}: {answer[:300]}")
        ids += [d for t in json.loads(answer)["transactions"] for d in t["downloads"]]

    # Samples of the aggregate bytes, every 250 ms, until all 13 packs are in.
    samples = []
    target_total = PACKS * 32 * MiB
    load = {}
    latencies = []
    # RSS is the agent's own memory (anonymous) plus the pages of its binary and libraries it has mapped (file): the
    # peak of each while it runs, sampled with the bytes, for the row that splits them.
    peaks = {}

    def sampler():
        while time.monotonic() - started < 120:
            samples.append((time.monotonic() - started, events.total()))
            for field in ("RssAnon", "RssFile"):
                peaks[field] = max(peaks.get(field, 0), agent.status_kib(field))
            if events.total() >= target_total:
                return
            time.sleep(0.25)

    sampling = threading.Thread(target=sampler)
    sampling.start()

    # 3 s in: API load for 5 s, one client on one connection.
    time.sleep(3)
    connection = UnixConnection(agent.socket)
    times = []
    end = time.monotonic() + 5
    while time.monotonic() < end:
        t0 = time.monotonic()
        status, _ = agent.request("GET", f"/v1/downloads?home={homes[0]}", connection=connection)
        times.append(time.monotonic() - t0)
        if status != 200:
            raise Failure(f"case 18: GET /v1/downloads answered {status}")
    connection.close()
    times.sort()
    load["count"] = len(times)
    load["p99"] = times[int(len(times) * 0.99)]
    load["median"] = median(times)

    # 8 s in: a user-initiated pack; its bytes over the next 2 s.
    time.sleep(max(0, 8 - (time.monotonic() - started)))
    status, answer = agent.request("POST", "/v1/fetch", {
        "home": homes[0], "manifest": manifest, "products": [products[12]], "priority": "userInitiated"})
    if status != 202:
        raise Failure(f"case 18: POST /v1/fetch (userInitiated) answered {status}: {answer[:300]}")
    urgent = json.loads(answer)["transactions"][0]["downloads"][0]
    added = time.monotonic()
    time.sleep(1.0)
    one_second = events.total({urgent})
    time.sleep(1.0)
    share = (events.total({urgent}) - one_second) / CAP

    # Event latency: pause and resume one of home 2's downloads, 20 times each.
    victim = ids[8]
    for i in range(40):
        action = "pause" if i % 2 == 0 else "resume"
        t0 = time.monotonic()
        status, _ = agent.request("POST", f"/v1/downloads/{victim}/{action}", {"home": homes[2]})
        states = ("paused",) if action == "pause" else ("waiting", "active")
        arrived = None
        while arrived is None and time.monotonic() - t0 < 2:
            arrived = events.first_after(t0, victim, states)
            time.sleep(0.0005)
        if arrived is not None:
            latencies.append(arrived - t0)
        time.sleep(0.05)

    sampling.join()
    peak = agent.status_kib("VmHWM")
    finished = time.monotonic() - started
    if events.total() < target_total:
        raise Failure(f"case 18: only {events.total() / MiB:.0f} of {target_total / MiB:.0f} MiB arrived in 120 s")
    time.sleep(5)
    idle = agent.status_kib("VmRSS")
    idle_anon, idle_file = agent.status_kib("RssAnon"), agent.status_kib("RssFile")

    # Every 5 s window from 2 s in to the last full one before the last pack's tail (demand above the cap).
    busy_until = next((t for t, total in samples if total >= target_total * 0.9), finished)
    windows = []
    for start_t, start_bytes in samples:
        if start_t < 2 or start_t + 5 > busy_until:
            continue
        later = [(t, v) for t, v in samples if t >= start_t + 5]
        if later:
            t, v = later[0]
            windows.append((v - start_bytes) / (t - start_t))
    worst = max((abs(w - CAP) / CAP for w in windows), default=float("nan"))
    latencies.sort()
    lat_median = median(latencies) * 1000 if latencies else float("nan")
    lat_p99 = latencies[int(len(latencies) * 0.99)] * 1000 if latencies else float("nan")
    rate = load["count"] / 5
    rows = [
        ("18", f"rate cap 20 MB/s, 3 homes × 4 downloads: {len(windows)} windows of 5 s",
         f"{min(windows) / 1e6:.1f}–{max(windows) / 1e6:.1f} MB/s" if windows else "no window", "", "", "",
         "±10 %", "pass" if worst <= 0.10 else "**FAIL**"),
        ("18", "a userInitiated pack added mid-way: its share of the cap in its 2nd second", f"{share * 100:.0f} %",
         "", "", "", "≥ 50 % within 2 s", "pass" if share >= 0.5 else "**FAIL**"),
        ("18", "GET /v1/downloads, one client, 5 s, while 12 download",
         f"{rate:.0f}/s, median {load['median'] * 1000:.2f} ms, p99 {load['p99'] * 1000:.2f} ms", "", "", "",
         "1,000/s at p99 ≤ 10 ms", "pass" if rate >= 1000 and load["p99"] <= 0.010 else "**FAIL**"),
        ("18", f"event latency, request → event on the stream ({len(latencies)} of 40)",
         f"median {lat_median:.1f} ms, p99 {lat_p99:.1f} ms", "", "", "", "≤ 10 / ≤ 50 ms",
         "pass" if lat_median <= 10 and lat_p99 <= 50 else "**FAIL**"),
        ("18", "the agent's RSS: peak while running / idle 5 s after",
         f"{peak / 1024:.1f} / {idle / 1024:.1f} MiB", "", "", "", "≤ 64 / ≤ 24 MiB",
         "pass" if peak <= 64 * 1024 and idle <= 24 * 1024 else "**FAIL**"),
        ("18", "for information, that RSS split: its own memory (RssAnon) / mapped code and data (RssFile), peak; idle",
         f"{peaks.get('RssAnon', 0) / 1024:.1f} / {peaks.get('RssFile', 0) / 1024:.1f} MiB; "
         f"{idle_anon / 1024:.1f} / {idle_file / 1024:.1f} MiB", "", "", "", "", ""),
    ]
    b.report.rows += rows
    for row in rows:
        log(f"case 18: {row[1]}: {row[2]} ({row[7]})")
    log(f"case 18: all {PACKS} packs in {finished:.1f} s ({target_total / finished / 1e6:.1f} MB/s overall)")
