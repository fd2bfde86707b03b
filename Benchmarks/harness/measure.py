"""Timing and resource measurement: one command under /usr/bin/time, and the CPU that nginx and the rest
of the machine used meanwhile.

Each measured command runs under /usr/bin/time -f "%e %U %S %M" (wall time is taken here with
perf_counter).
"""
import os
import shlex
import subprocess
import sys
import time

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


class Failure(Exception):
    """A case broke: reported precisely in the notes, and the other cases still run."""


class Run:
    def __init__(self, wall, user, sys_, rss_kib, code, out, err):
        self.wall, self.user, self.sys, self.rss_kib, self.code, self.out, self.err = wall, user, sys_, rss_kib, code, out, err
        self.other = float("nan")   # CPU seconds used meanwhile by anything but the run and nginx
        self.nginx = 0.0            # CPU seconds nginx used meanwhile

    @property
    def cpu(self):
        return self.user + self.sys


TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds():
    """CPU seconds all CPUs spent busy since boot (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def nginx_seconds(tmp):
    """CPU seconds used so far by nginx's master and workers (the nginx of TMP/nginx)."""
    total = 0.0
    try:
        with open(os.path.join(tmp, "nginx", "nginx.pid")) as f:
            master = f.read().strip()
    except OSError:
        return 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid == master or fields[1] == master:   # fields[1] is the parent pid
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def timed(cmd, tmp, timeout=900, env=None):
    """Runs cmd (a list, or a string for bash -c) under /usr/bin/time; returns a Run."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else cmd
    time_file = os.path.join(tmp, "time.out")
    busy0, nginx0 = busy_seconds(), nginx_seconds(tmp)
    start = time.perf_counter()
    try:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", "-o", time_file] + argv,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"timed out after {timeout} s: {shlex.join(argv)}\nstdout: {e.stdout!r}\nstderr: {e.stderr!r}")
    wall = time.perf_counter() - start
    busy1, nginx1 = busy_seconds(), nginx_seconds(tmp)
    with open(time_file) as f:
        fields = f.read().strip().splitlines()[-1].split()
    run = Run(wall, float(fields[1]), float(fields[2]), int(fields[3]), p.returncode,
              p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
    run.nginx = nginx1 - nginx0
    run.other = max(0.0, (busy1 - busy0) - run.cpu - run.nginx)
    return run


def sh(argv, **kw):
    """Runs argv (not measured); its stdout, or Failure with its output if it exits non-zero."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    if p.returncode != 0:
        raise Failure(f"{shlex.join(argv)} exited {p.returncode}:\n{p.stdout.decode()}{p.stderr.decode()}")
    return p.stdout.decode()


def content_bytes(folder):
    """Files and bytes under any Contents/ folder below `folder` (what a pack unpacks to)."""
    files = total = 0
    for root, _dirs, names in os.walk(folder):
        if "/Contents" not in root + "/":
            continue
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files += 1
                total += os.path.getsize(path)
    return files, total
