"""Case 5: resume waste. A 256 MiB download from nginx, rate-limited to 64 MiB/s, is SIGKILLed once half of
it is on disk and then resumed: `packs fetch` then `packs resume`, against `curl -o` then `curl -C -`. The
waste is what nginx sent (its access log) beyond the pack's size (target for packs: ≤ 1 MiB, median). The
kill lands mid-burst, so what sat in the socket buffers (read from /proc/net/tcp just before it) is logged
with every run.

Run alone: Benchmarks/run --only 5
"""
import glob
import os
import shlex
import shutil
import signal
import subprocess
import time

from harness.measure import KiB, MiB, Failure, content_bytes, log, sh, timed
from harness.tables import median

CASES = (5,)
DATA = ("mid",)

# The 256 MiB pack again, rate-limited so that a kill lands mid-transfer.
NGINX_LOCATION = """
        location /slow/ {{
            alias {site}/mid/;
            limit_rate 67108864;
        }}"""


def socket_queues(port):
    """Bytes queued on the loopback connections to nginx right now: (server send queue, client
    receive queue), from /proc/net/tcp (hex "tx_queue:rx_queue")."""
    send = receive = 0
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                local_port = int(fields[1].split(":")[1], 16)
                remote_port = int(fields[2].split(":")[1], 16)
                tx, rx = (int(x, 16) for x in fields[4].split(":"))
                if local_port == port:
                    send += tx
                elif remote_port == port:
                    receive += rx
    except OSError:
        pass
    return send, receive


def kill_at_half(b, argv, partial_glob, size):
    """Starts argv, SIGKILLs it once a file matching partial_glob holds half of size bytes.
    Returns (bytes when killed, queued bytes (send, receive) just before, bytes on disk after)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at, queues = None, (0, 0)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        parts = glob.glob(partial_glob)
        have = 0
        if parts:
            try:
                have = os.path.getsize(parts[0])
            except OSError:
                pass
        if have >= size // 2:
            queues = socket_queues(b.port)
            os.kill(p.pid, signal.SIGKILL)
            killed_at = have
            break
        time.sleep(0.002)
    p.wait()
    if killed_at is None:
        raise Failure(f"{shlex.join(argv)} ended (exit {p.returncode}) before half of the file arrived:\n{p.stderr.read().decode()}")
    parts = glob.glob(partial_glob)
    return killed_at, queues, (os.path.getsize(parts[0]) if parts else 0)


def run(b):
    mid = b.data["mid"]
    size = mid["contentLength"]
    manifest = f"{b.base}/slow/manifest.json"
    path = f"/slow/{mid['url']}"
    url = b.base + path
    wastes = {"packs": [], "curl -C -": []}
    log("case 5: SIGKILL at half of a rate-limited (64 MiB/s) 256 MiB download, then resume…")
    for r in range(max(b.reps, 5)):
        order = ["packs", "curl -C -"] if r % 2 == 0 else ["curl -C -", "packs"]
        for who in order:
            work = b.fresh(f"c5-{r}-{who[:4]}")
            before = len(b.nginx.log_lines())
            if who == "packs":
                home = os.path.join(work, "home")
                killed_at, queues, on_disk = kill_at_half(
                    b, b.packs_cmd(home, "fetch", manifest, "com.bench.mid"),
                    os.path.join(home, "Caches", ".packdelivery", "downloads", "*.pack"), size)
                run = timed(b.packs_cmd(home, "resume"), b.tmp, timeout=300)
                if run.code != 0:
                    raise Failure(f"case 5 round {r}: packs --home H resume exited {run.code}\nstdout: {run.out}\nstderr: {run.err}")
                files, total = content_bytes(os.path.join(home, "Caches"))
                if (files, total) != (2, 256 * MiB):
                    status = subprocess.run([b.packs, "--home", home, "status"], stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT).stdout.decode()
                    raise Failure(f"case 5 round {r}: after resume {files} files / {total} bytes installed; packs status:\n{status}")
            else:
                target = os.path.join(work, "mid.tar")
                killed_at, queues, on_disk = kill_at_half(b, ["curl", "-s", "-f", "-o", target, url], target, size)
                run = timed(["curl", "-s", "-f", "-C", "-", "-o", target, url], b.tmp, timeout=300)
                digest = sh(["openssl", "dgst", "-sha256", "-r", target]).split()[0]
                if run.code != 0 or digest != mid["sha256"]:
                    raise Failure(f"case 5 round {r}: curl -C - exited {run.code}, sha256 {digest}\n{run.err}")
            # nginx logs a request when it ends; the killed one ends when nginx notices the reset.
            lines = []
            for _ in range(100):
                lines = [l for l in b.nginx.log_lines()[before:] if l.split(" ", 1)[0] == path]
                if len(lines) >= 2:
                    break
                time.sleep(0.1)
            sent = sum(int(l.split()[2]) for l in lines)
            ranges = [l.split('"')[1] for l in lines]
            waste = sent - size
            wastes[who].append(waste)
            detail = (f"killed with {killed_at} B on disk ({on_disk} after exit); queued just before the kill: nginx send "
                      f"{queues[0]} B, client receive {queues[1]} B; requests {len(lines)}, ranges {ranges}; "
                      f"nginx sent {sent} B; waste {waste} B")
            log(f"  case 5 round {r} {who}: {detail}")
            b.report.raw.append((5, f"{who} resume — {detail}", r, run))
            shutil.rmtree(work, ignore_errors=True)
            os.sync()
    for who, values in wastes.items():
        w = median(values)
        b.report.rows.append(("5", f"resume waste, {who}: nginx body bytes − pack size (all runs: "
                              + ", ".join(f"{x / KiB:.0f} KiB" for x in values) + ")",
                              f"{w / MiB:.2f} MiB" if who == "packs" else "", "" if who == "packs" else "curl, then curl -C -",
                              "" if who == "packs" else f"{w / MiB:.2f} MiB", "",
                              "≤ 1 MiB" if who == "packs" else "", ("pass" if w <= MiB else "**FAIL**") if who == "packs" else ""))
