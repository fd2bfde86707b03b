"""The servers the cases fetch from: nginx (one configuration, on a free loopback port) and `packs serve`."""
import os
import signal
import socket
import subprocess
import time

from .measure import Failure


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """An nginx of its own, its configuration, pid, logs and temporary folders in `folder`, serving `root`
    on 127.0.0.1. access_log: log every request as "URI status body-bytes "Range"" (see log_lines());
    rlimit_nofile: its worker_rlimit_nofile; locations: more location blocks for the server."""

    def __init__(self, folder, root, connections=1024, keepalive_requests=10000, access_log=True, rlimit_nofile=None,
                 locations=""):
        self.folder, self.root = folder, root
        self.connections, self.keepalive_requests = connections, keepalive_requests
        self.access_log, self.rlimit_nofile, self.locations = access_log, rlimit_nofile, locations
        self.port = None
        self.pid_file = os.path.join(folder, "nginx.pid")
        self.error_log = os.path.join(folder, "error.log")

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def conf(self, port):
        d = self.folder
        user = "user root;\n" if os.geteuid() == 0 else ""
        rlimit = f"worker_rlimit_nofile {self.rlimit_nofile};\n" if self.rlimit_nofile else ""
        if self.access_log:
            access = (f"log_format bench '$request_uri $status $body_bytes_sent \"$http_range\"';\n"
                      f"    access_log {d}/access.log bench;")
        else:
            access = "access_log off;"
        # PACKS_BENCH_NGINX_GZIP=1: JSON (manifests, TUF metadata) sent compressed to clients that offer it.
        gzip = ("\n    gzip on; gzip_types application/json; gzip_min_length 1024;"
                if os.environ.get("PACKS_BENCH_NGINX_GZIP") == "1" else "")
        return f"""{user}worker_processes 1;
{rlimit}daemon on;
pid {self.pid_file};
error_log {self.error_log} warn;
events {{ worker_connections {self.connections}; }}
http {{
    types {{ application/json json; application/x-tar tar; application/gzip gz; }}
    default_type application/octet-stream;{gzip}
    {access}
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    sendfile on;
    tcp_nopush on;
    etag on;
    server_tokens off;
    keepalive_requests {self.keepalive_requests};
    server {{
        listen 127.0.0.1:{port};
        root {self.root};{self.locations}
    }}
}}
"""

    def start(self):
        """Starts nginx (it daemonizes) on a free port, three tries; returns once it answers."""
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.folder, sub), exist_ok=True)
        conf, start_err = os.path.join(self.folder, "nginx.conf"), os.path.join(self.folder, "start.err")
        for _ in range(3):
            port = free_port()
            with open(conf, "w") as f:
                f.write(self.conf(port))
            with open(start_err, "w") as err:
                started = subprocess.run(["/usr/sbin/nginx", "-p", self.folder, "-e", self.error_log, "-c", conf],
                                         stdout=err, stderr=err).returncode == 0
            if not started:
                continue
            for _ in range(50):
                if subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/"]).returncode == 0:
                    self.port = port
                    return
                time.sleep(0.1)
            self.stop()
        errors = ""
        for path in (start_err, self.error_log):
            try:
                with open(path) as f:
                    errors += f.read()
            except OSError:
                pass
        raise Failure(f"nginx did not start:\n{errors}")

    def pid(self):
        try:
            with open(self.pid_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def stop(self):
        """SIGTERM, then SIGKILL if it is still there 5 s later."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def log_lines(self):
        """The access log so far, one line per request that ended."""
        with open(os.path.join(self.folder, "access.log")) as f:
            return f.read().splitlines()


class PacksServe:
    """A fresh `packs serve SITE` on a free loopback port, started and listening."""

    def __init__(self, packs, site, metrics=False):
        self.port = free_port()
        extra = ["--metrics-address", "127.0.0.1:0"] if metrics else []
        self.proc = subprocess.Popen([packs, "serve", site, "--port", str(self.port), "--quiet", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()   # "Serving … (Ctrl-C stops)" once it listens
        if "Serving" not in line:
            self.proc.kill()
            raise Failure(f"packs serve did not start: {line!r}")

    def rss(self):
        """Its resident set now, KiB (0 once it is gone)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
