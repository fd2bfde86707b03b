"""Instructions per request of `packs serve`, with and without `--metrics-address`, counted by callgrind
(user space only), for a machine too busy to time a 3 % difference (Benchmarks/RESULTS.md, case 8).

    python3 Benchmarks/analysis/serve_instructions.py PATH/TO/release/packs [N, default 6000]

Each configuration runs twice under callgrind, answering exactly 400 and then N requests for 64 KiB
ranges at random offsets of a 64 MiB file over 20 keep-alive connections; per request = the difference
of the totals ÷ (N − 400), so the start-up cancels."""
import http.client
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SIZE, RANGE, CONNECTIONS = 64 * 1024 * 1024, 65536, 20
LARGE = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
SHIM = ("#define _GNU_SOURCE\n#include <signal.h>\n#include <dlfcn.h>\n"
        "int sigsuspend(const sigset_t *mask) {\n"
        "    static int (*real)(const sigset_t *);\n"
        "    if (!real) real = (int (*)(const sigset_t *))dlsym(RTLD_NEXT, \"sigsuspend\");\n"
        "    sigset_t copy = *mask;\n    return real(&copy);\n}\n")


def requests(port, n):
    def worker(k):
        conn, rnd = http.client.HTTPConnection("127.0.0.1", port, timeout=300), random.Random(k)
        for _ in range(n // CONNECTIONS):
            start = rnd.randrange(0, SIZE - RANGE)
            conn.request("GET", "/big.bin", headers={"Range": f"bytes={start}-{start + RANGE - 1}"})
            response = conn.getresponse()
            body = response.read()
            assert response.status == 206 and len(body) == RANGE, response.status
        conn.close()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(CONNECTIONS)]
    [t.start() for t in threads]
    [t.join() for t in threads]


def instructions(work, binary, shim, n, metrics):
    out = os.path.join(work, f"callgrind.{n}.{metrics}.out")
    port = 19100 + random.randrange(800)
    args = [binary, "serve", os.path.join(work, "site"), "--port", str(port), "--quiet"]
    if metrics:
        args += ["--metrics-address", "127.0.0.1:0"]
    server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + args,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, LD_PRELOAD=shim))
    for _ in range(600):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
            break
        except OSError:
            time.sleep(0.2)
    requests(port, n)
    server.send_signal(signal.SIGINT)
    server.wait(timeout=300)
    with open(out) as f:
        return int(re.search(r"^summary: (\d+)", f.read(), re.M).group(1))


def main():
    work = tempfile.mkdtemp(prefix="serve-instructions-")
    os.makedirs(os.path.join(work, "site"))
    with open(os.path.join(work, "site", "big.bin"), "wb") as f:
        f.write(os.urandom(SIZE))
    # Valgrind 3.19 cannot read Swift 6.3's DWARF 5; a copy without debug info keeps the symbols.
    binary = os.path.join(work, "packs-nodebug")
    subprocess.run(["objcopy", "--strip-debug", sys.argv[1], binary], check=True)
    with open(os.path.join(work, "shim.c"), "w") as f:
        f.write(SHIM)
    shim = os.path.join(work, "shim.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", os.path.join(work, "shim.c"), "-o", shim, "-ldl"], check=True)
    per = {}
    for metrics in (False, True):
        small, large = (instructions(work, binary, shim, n, metrics) for n in (400, LARGE))
        per[metrics] = (large - small) / (LARGE - 400)
        print(f"{'with' if metrics else 'without'} metrics: {per[metrics]:,.0f} instructions per request")
    print(f"cost of metrics: {100 * (per[True] / per[False] - 1):+.1f} %")


main()
