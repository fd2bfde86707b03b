"""Case 20: store launches (issue 46): a preload released to a crowd, a copy on a USB-like disk as a seed, an offline
export.

a. Launch day. A preload pack (`packs pack --encrypt --releases T`, CASE20_MIB of random data, default 1024, 4 files)
   served by `packs serve --receipt-key --keys`, T a few minutes after the pack is written, on the real clock of
   server and clients (no test clock: a release build has none). Before T one `packs fetch --receipt` downloads the
   ciphertext and exits 75; every other client's home is a copy of that home's state with the ciphertext
   hard-linked (read only: the install decrypts it to a file of its own and unlinks its link, so a link is
   what a separate copy would be, minus the disk). After T:
   - the crowd: CASE20_CLIENTS (default 200) clients each holding a preload start `packs fetch` at once. Their
     pack is a small one (CASE20_CROWD_MIB, default 8 MiB, same key and release), because 200 decrypted installs
     of 1 GiB do not fit on this disk: what the crowd measures (pack bytes after T, the key server under N key
     requests) does not depend on the pack's size. Pack requests in the server's log after T: target 0.
   - the key server alone: the same number of `GET /keys/KEYID` with a receipt, all sent at once (one connection
     each, released together): the time until the last answer, target ≤ 1 s.
   - one client's install of the big preload after T (b.reps clients, alternated with the peers): the wall time
     of `packs fetch`, against `bsdtar -xf` of the same content as a plain tar (made with `packs pack`, no
     encryption; read from the page cache as the ciphertext is) plus one key request (curl): target ≤ 1.2; and,
     for information, against `bsdtar -xf && sync -f` (packs installs durably, bsdtar does not).
b. A copy on a USB-like folder: a v1 tree (CASE20_SEED_MIB, default 512 MiB, 8 files) on a loop-mounted ext4
   image (tmpfs if the loop mount is refused, a plain folder if both are), v2 with 1 % of it changed, a chunked
   tar.zst served by nginx: `packs fetch --seed USB/v1` against the same fetch without a seed, bytes counted from
   nginx's log (the manifest, index and pack ranges): target ≤ 1.5 % of the pack with the seed, and 100 % without.
c. Offline export: the v2 install of (b) exported (`packs export`), installed on a second home by `packs fetch
   EXPORT/manifest.json` under `unshare -n` (no network; nginx stopped is not needed: there is no route): its
   files byte for byte v2's, and `packs verify` passes.

CASE20_PARTS=launch,seed,offline (default: all) runs some of them.

Run alone: Benchmarks/run --only 20 (a debug build: python3 -m harness --packs .build/debug/packs …, see
RESULTS.md)
"""
import datetime
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import threading
import time

from harness import data
from harness.measure import GiB, MiB, Failure, log, sh, timed
from harness.servers import free_port
from harness.tables import median

CASES = (20,)

BIG, CROWD, SEEDED = "com.bench.launch", "com.bench.launch-crowd", "com.bench.seed"
REQUEST = re.compile(r"(GET|HEAD) (\S+) range=\S+ (\d{3}) (\d+) bytes")


def run(b):
    parts = os.environ.get("CASE20_PARTS", "launch,seed,offline").split(",")
    folder = b.fresh("launch")
    try:
        if "launch" in parts:
            launch_day(b, os.path.join(folder, "launch"))
        if "seed" in parts or "offline" in parts:
            seed_and_export(b, os.path.join(folder, "seed"), "offline" in parts)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- a. launch day --------------------------------------------------------------------------------------------

class KeyServer:
    """`packs serve SITE --receipt-key STORE.pub --keys KEYS` on a free port, its request log in a file."""

    def __init__(self, b, site, store_pub, keys, log_file):
        self.port = free_port()
        self.log_file = log_file
        self.err = open(log_file, "w")
        self.proc = subprocess.Popen([b.packs, "serve", site, "--port", str(self.port), "--receipt-key", store_pub,
                                      "--keys", keys], stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.proc.stdout.readline()
        if "Serving" not in line:
            self.stop()
            raise Failure(f"case 20: packs serve --keys did not start: {line!r}")

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def requests(self, since=0):
        """(method, path, status, bytes) of each request logged, from line `since` on; and the number of lines."""
        with open(self.log_file) as f:
            lines = f.read().splitlines()
        found = [m.groups() for m in map(REQUEST.search, lines[since:]) if m]
        return [(m, p, int(s), int(n)) for m, p, s, n in found], len(lines)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def copy_home(source, target):
    """A copy of a home's state: every file copied, except large ones outside the state database (the ciphertext),
    hard-linked."""
    for root, dirs, names in os.walk(source):
        rel = os.path.relpath(root, source)
        os.makedirs(os.path.join(target, rel), exist_ok=True)
        for name in names:
            src, dst = os.path.join(root, name), os.path.join(target, rel, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            elif os.path.getsize(src) >= MiB and ".sqlite" not in name and not name.endswith(("-wal", "-shm")):
                os.link(src, dst)
            else:
                shutil.copy2(src, dst)


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_burst(base, key_id, receipt, n):
    """n `GET /keys/KEY_ID` sent at once, one connection each: (seconds from their release to the last answer,
    statuses)."""
    barrier = threading.Barrier(n + 1)
    statuses, done = [None] * n, [0.0] * n

    def one(i):
        connection = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=60)
        connection.connect()
        barrier.wait()
        try:
            connection.request("GET", f"/keys/{key_id}", headers={"Authorization": f"Bearer {receipt}"})
            response = connection.getresponse()
            response.read()
            statuses[i] = response.status
        except OSError as e:
            statuses[i] = str(e)
        done[i] = time.perf_counter()
        connection.close()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return max(done) - start, statuses


def tree_digests(folder):
    """{relative path: SHA-256} of the regular files under folder."""
    result = {}
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(8 * MiB):
                        h.update(chunk)
                result[os.path.relpath(path, folder)] = h.hexdigest()
    return result


def installed_folder(b, home, product):
    return sh([b.packs, "--home", home, "content", product]).strip()


def launch_day(b, folder):
    clients = int(os.environ.get("CASE20_CLIENTS", "200"))
    size = int(os.environ.get("CASE20_MIB", "1024")) * MiB
    crowd_size = int(os.environ.get("CASE20_CROWD_MIB", "8")) * MiB
    reps = max(1, b.reps)
    site, keys, src, plain = (os.path.join(folder, n) for n in ("site", "keys", "src", "plain"))
    for d in (site, keys, plain):
        os.makedirs(d)
    sh([b.packs, "keygen", "--preload", os.path.join(keys, "launch")])
    sh([b.packs, "keygen", os.path.join(folder, "store")])
    receipt = sh([b.packs, "receipt", "--key", os.path.join(folder, "store.key"), "--product", BIG, "--product", CROWD,
                  "--subject", "bench", "--expires", "2h"]).strip()
    receipt_file = os.path.join(folder, "receipt")
    with open(receipt_file, "w") as f:
        f.write(receipt)
    log(f"case 20a: {size / MiB:.0f} MiB preload and a {crowd_size / MiB:.0f} MiB one for {clients} clients…")
    rng = b.rng("launch")
    for i in range(4):
        data.random_file(os.path.join(src, "big", "Contents", f"part{i}.bin"), size // 4, rng)
    data.random_file(os.path.join(src, "crowd", "Contents", "crowd.bin"), crowd_size, rng)
    sh([b.packs, "pack", os.path.join(src, "big"), "--output", os.path.join(plain, "launch.tar"), "--product", BIG,
        "--version", "1"])
    # The release: far enough for the packs to be written and the ciphertext fetched before it.
    release = time.time() + int(os.environ.get("CASE20_LEAD", str(60 + int(150 * size / GiB))))
    release = float(int(release) + 1)
    key_file = os.path.join(keys, "launch.preloadkey")
    for name, product in (("big", BIG), ("crowd", CROWD)):
        sh([b.packs, "pack", os.path.join(src, name), "--output", os.path.join(site, f"{name}.tar"), "--product", product,
            "--version", "1", "--encrypt", key_file, "--releases", iso(release)])
    expected_big = tree_digests(os.path.join(src, "big", "Contents"))
    expected_crowd = tree_digests(os.path.join(src, "crowd", "Contents"))
    shutil.rmtree(src)
    sh([b.packs, "manifest", site])
    with open(os.path.join(site, "manifest.json")) as f:
        manifest_json = json.load(f)
    key_id = next(c["preload"]["keyID"] for p in manifest_json["products"] for c in p["contents"] if "preload" in c)
    server = KeyServer(b, site, os.path.join(folder, "store.pub"), keys, os.path.join(folder, "serve.log"))
    try:
        manifest = f"{server.base}/manifest.json"

        def fetch(home, product):
            return b.packs_cmd(home, "fetch", manifest, product, "--receipt", receipt_file)
        # Before T: one client of each pack downloads the ciphertext, then the others' homes are copies.
        first = {}
        for name, product in (("big", BIG), ("crowd", CROWD)):
            home = os.path.join(folder, f"{name}-first")
            run = timed(fetch(home, product), b.tmp)
            if run.code != 75:
                raise Failure(f"case 20a: the preload fetch of {product} before its release exited {run.code}, not 75: "
                              f"{run.err[-800:]}")
            first[name] = (home, run.wall)
        if time.time() >= release:
            raise Failure(f"case 20a: the preloads were not in before the release; raise CASE20_LEAD")
        crowd_homes = [os.path.join(folder, "crowd", f"h{i}") for i in range(clients)]
        big_homes = [os.path.join(folder, "big", f"h{i}") for i in range(reps)]
        for home in crowd_homes:
            copy_home(first["crowd"][0], home)
        for home in big_homes:
            copy_home(first["big"][0], home)
        before_release, log_lines = server.requests()
        early_keys = [r for r in before_release if r[1].startswith("/keys/")]
        wait = release - time.time()
        log(f"case 20a: ciphertext in ({first['big'][1]:.1f} s for the big one); {clients} homes ready; release in "
            f"{wait:.0f} s")
        if wait > 0:
            time.sleep(wait + 0.5)

        # The crowd, all at once.
        start = time.perf_counter()
        procs = [subprocess.Popen(fetch(home, CROWD), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for home in crowd_homes]
        codes = [p.wait(timeout=1800) for p in procs]
        crowd_wall = time.perf_counter() - start
        failed = [(i, c, procs[i].stderr.read().decode()[-300:]) for i, c in enumerate(codes) if c != 0]
        for p in procs:
            p.stderr.close()
        if failed:
            raise Failure(f"case 20a: {len(failed)} of {clients} crowd clients failed, first: {failed[0]}")
        crowd_content = tree_digests(os.path.join(installed_folder(b, crowd_homes[0], CROWD), "Contents"))
        wrong = [h for h in crowd_homes[1:] if os.path.getsize(
            os.path.join(installed_folder(b, h, CROWD), "Contents", "crowd.bin")) != crowd_size]
        if crowd_content != expected_crowd or wrong:
            raise Failure(f"case 20a: {len(wrong)} crowd installs are not the pack's content")
        after, log_lines = server.requests(log_lines)
        crowd_keys = [r for r in after if r[1].startswith("/keys/")]
        shutil.rmtree(os.path.join(folder, "crowd"), ignore_errors=True)

        # The key server alone: as many key requests, all sent at once.
        bursts = []
        for _ in range(reps):
            seconds, statuses = key_burst(server.base, key_id, receipt, clients)
            if any(s != 200 for s in statuses):
                raise Failure(f"case 20a: key burst answers: {sorted(set(map(str, statuses)))}")
            bursts.append(seconds)
        _, log_lines = server.requests(log_lines)

        # One client's install of the big preload after T, alternated with bsdtar -xf of the plain pack and one key
        # request.
        walls, bsdtar, synced, key_walls, big_keys = [], [], [], [], []
        plain_tar = os.path.join(plain, "launch.tar")
        for r in range(reps):
            order = ["packs", "bsdtar", "bsdtar+sync"]
            for who in order[r % 3:] + order[:r % 3]:
                b.prepare(size + 256 * MiB, [plain_tar] if who != "packs" else [])
                if who == "packs":
                    _, since = server.requests()
                    run = timed(fetch(big_homes[r], BIG), b.tmp)
                    if run.code != 0:
                        raise Failure(f"case 20a: the release install exited {run.code}: {run.err[-800:]}")
                    walls.append(run.wall)
                    b.report.raw.append((20, "packs fetch (released preload)", r, run))
                    big_keys += [x for x in server.requests(since)[0] if x[1].startswith("/keys/")]
                elif who == "bsdtar+sync":
                    out = b.fresh(f"c20-bsdtar-sync-{r}")
                    run = timed(f"bsdtar -xf {plain_tar} -C {out} && sync -f {out}", b.tmp)
                    synced.append(run.wall)
                    b.report.raw.append((20, "bsdtar -xf && sync -f (plain tar)", r, run))
                    shutil.rmtree(out, ignore_errors=True)
                else:
                    out = b.fresh(f"c20-bsdtar-{r}")
                    run = timed(["bsdtar", "-xf", plain_tar, "-C", out], b.tmp)
                    bsdtar.append(run.wall)
                    b.report.raw.append((20, "bsdtar -xf (plain tar)", r, run))
                    shutil.rmtree(out, ignore_errors=True)
                    key = timed(["curl", "-s", "-f", "-o", "/dev/null", "-H", f"Authorization: Bearer {receipt}",
                                 f"{server.base}/keys/{key_id}"], b.tmp)
                    if key.code != 0:
                        raise Failure(f"case 20a: curl of the key exited {key.code}")
                    key_walls.append(key.wall)
                os.sync()
            if tree_digests(os.path.join(installed_folder(b, big_homes[r], BIG), "Contents")) != expected_big:
                raise Failure("case 20a: the release install is not the pack's content")
            shutil.rmtree(big_homes[r], ignore_errors=True)
        after_big, _ = server.requests(log_lines)
        pack_after = [r for r in after + after_big if r[1].endswith(".tar")]
    finally:
        server.stop()

    rows = b.report.rows
    pack_bytes = sum(r[3] for r in pack_after)
    rows.append(("20a", f"launch day: pack requests after the release, {clients} clients holding a "
                        f"{crowd_size / MiB:.0f} MiB preload and {reps} holding the {size / MiB:.0f} MiB one",
                 f"{len(pack_after)} ({pack_bytes} bytes)", "", "", "", "0", "pass" if not pack_after else "**FAIL**"))
    ok_keys = sum(1 for r in crowd_keys if r[2] == 200)
    rows.append(("20a", f"launch day: the crowd's key requests (one per client; {len(early_keys)} before the release), "
                        f"all {clients} installed in {crowd_wall:.1f} s from T",
                 f"{ok_keys} × 200 of {len(crowd_keys)}", "", "", "", f"{clients} × 200",
                 "pass" if ok_keys == clients == len(crowd_keys) and not early_keys else "**FAIL**"))
    burst = median(bursts)
    rows.append(("20a", f"the key server: {clients} GET /keys/ with a receipt sent at once, until the last answer",
                 f"{burst * 1000:.0f} ms", "", "", "", "≤ 1 s", "pass" if burst <= 1.0 else "**FAIL**"))
    floor = median(bsdtar) + median(key_walls)
    ratio = median(walls) / floor
    rows.append(("20a", f"a client's install of the released {size / MiB:.0f} MiB preload (decrypt + install, "
                        f"{len(big_keys)} key requests in {reps} installs) ÷ bsdtar -xf of the plain tar + one key request",
                 f"{median(walls):.2f} s", "bsdtar -xf + curl key",
                 f"{median(bsdtar):.2f} + {median(key_walls) * 1000:.0f} ms", f"{ratio:.2f}", "≤ 1.2",
                 "pass" if ratio <= 1.2 else "**FAIL**"))
    durable = median(walls) / (median(synced) + median(key_walls))
    rows.append(("20a", "the same ÷ bsdtar -xf && sync -f + one key request (packs installs durably; for information)",
                 f"{median(walls):.2f} s", "bsdtar -xf && sync -f + curl key",
                 f"{median(synced):.2f} + {median(key_walls) * 1000:.0f} ms", f"{durable:.2f}", "–", ""))
    for row in rows[-5:]:
        log(f"case 20: {row[1]}: {row[2]} ({row[7]})")


# ---- b. a seed on a USB-like disk, c. an offline export -------------------------------------------------------

def mount_usb(folder, size):
    """A second filesystem at folder: an ext4 image on a loop device, else tmpfs, else none (a plain folder).
    Returns what it is, and how to unmount it."""
    os.makedirs(folder)
    image = folder + ".img"
    try:
        with open(image, "wb") as f:
            f.truncate(size)
        sh(["mkfs.ext4", "-q", "-F", image])
        sh(["mount", "-o", "loop", image, folder])
        return "ext4 on a loop device", lambda: (subprocess.run(["umount", folder]), os.unlink(image))
    except Failure as e:
        log(f"case 20b: no loop mount ({str(e).strip()[:200]}); trying tmpfs")
        os.path.exists(image) and os.unlink(image)
    try:
        sh(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder])
        return "tmpfs", lambda: subprocess.run(["umount", folder])
    except Failure:
        return "a plain folder (mount refused)", lambda: None


def served_bytes(b, prefix, since):
    lines = b.nginx.log_lines()[since:]
    return sum(int(l.split()[2]) for l in lines if l.split(" ", 1)[0].startswith(prefix)), len(lines) + since


def seed_and_export(b, folder, offline):
    size = int(os.environ.get("CASE20_SEED_MIB", "512")) * MiB
    files = 8
    v1, v2 = os.path.join(folder, "v1"), os.path.join(folder, "v2")
    rng = b.rng("launch-seed")
    log(f"case 20b: a {size / MiB:.0f} MiB v1 tree and a v2 with 1 % changed…")
    for i in range(files):
        data.random_file(os.path.join(v1, "Contents", f"f{i}.bin"), size // files, rng)
    shutil.copytree(v1, v2)
    # 1 %: a run of new bytes in the middle of the first file.
    with open(os.path.join(v2, "Contents", "f0.bin"), "r+b") as f:
        f.seek(size // files // 3)
        f.write(rng.randbytes(size // 100))
    name = "launch-seed"
    site = os.path.join(b.site, name)
    os.makedirs(site, exist_ok=True)
    sh([b.packs, "pack", v2, "--output", os.path.join(site, "v2.tar.zst"), "--product", SEEDED, "--version", "2"])
    pack_length = data.manifest(b, name)[SEEDED]["contentLength"]
    manifest = f"{b.base}/{name}/manifest.json"
    usb = os.path.join(folder, "usb")
    kind, unmount = mount_usb(usb, size + size // 5 + 64 * MiB)
    rows = []
    try:
        shutil.copytree(v1, os.path.join(usb, "v1"))
        shutil.rmtree(v1)
        os.sync()
        expected = tree_digests(os.path.join(v2, "Contents"))
        shares = {"seed": [], "none": []}
        walls = {"seed": [], "none": []}
        kept_home = None
        for r in range(max(1, b.reps)):
            for who in (("seed", "none") if r % 2 == 0 else ("none", "seed")):
                home = os.path.join(folder, f"home-{who}-{r}")
                extra = ["--seed", os.path.join(usb, "v1")] if who == "seed" else []
                _, since = served_bytes(b, "/", 0)
                run = timed(b.packs_cmd(home, "fetch", manifest, SEEDED, *extra), b.tmp)
                if run.code != 0:
                    raise Failure(f"case 20b: fetch ({who}) exited {run.code}: {run.err[-800:]}")
                b.report.raw.append((20, f"packs fetch v2 ({'--seed on ' + kind if who == 'seed' else 'no seed'})", r, run))
                got, _ = served_bytes(b, f"/{name}/", since)
                installed = tree_digests(os.path.join(installed_folder(b, home, SEEDED), "Contents"))
                if installed != expected:
                    raise Failure(f"case 20b: the install ({who}) is not v2's files")
                shares[who].append(got / pack_length)
                walls[who].append(run.wall)
                if who == "seed" and kept_home is None:
                    kept_home = home
                else:
                    shutil.rmtree(home, ignore_errors=True)
        seed_share, none_share = median(shares["seed"]), median(shares["none"])
        rows.append(("20b", f"v2 ({pack_length / MiB:.0f} MiB chunked tar.zst, 1 % changed) with --seed of the v1 tree on "
                            f"{kind}: bytes served by nginx ÷ the pack ({median(walls['seed']):.2f} s)",
                     f"{seed_share * 100:.2f} %", "no seed", f"{none_share * 100:.1f} % ({median(walls['none']):.2f} s)",
                     f"{seed_share / none_share:.3f}", "≤ 1.5 % (100 % without)",
                     "pass" if seed_share <= 0.015 and none_share >= 0.99 else "**FAIL**"))
        if offline:
            rows.append(offline_export(b, folder, kept_home, expected))
    finally:
        unmount()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    b.report.rows += rows
    for row in rows:
        log(f"case 20: {row[1]}: {row[2]} ({row[7]})")


def offline_export(b, folder, home, expected):
    export = os.path.join(folder, "export")
    sh([b.packs, "--home", home, "export", SEEDED, "--to", export])
    second = os.path.join(folder, "home-offline")
    isolated = subprocess.run(["unshare", "-n", "--", "true"]).returncode == 0
    command = b.packs_cmd(second, "fetch", os.path.join(export, "manifest.json"), SEEDED)
    run = timed((["unshare", "-n", "--"] if isolated else []) + command, b.tmp)
    if run.code != 0:
        raise Failure(f"case 20c: the offline install exited {run.code}: {run.err[-800:]}")
    b.report.raw.append((20, "packs fetch EXPORT/manifest.json (unshare -n)", 0, run))
    exact = tree_digests(os.path.join(installed_folder(b, second, SEEDED), "Contents")) == expected
    verify = subprocess.run([b.packs, "--home", second, "verify", SEEDED], capture_output=True).returncode
    where = "in a network namespace with no route (unshare -n)" if isolated else "WITH the network (unshare -n refused)"
    return ("20c", f"an export installed on a second home {where}: exact files, packs verify exit {verify} "
                   f"({run.wall:.2f} s)", "exact" if exact else "DIFFERENT", "", "", "", "exact, verify 0",
            "pass" if exact and verify == 0 and isolated else "**FAIL**")
