"""What every case works with: the binaries, folders and server of this run, the report, and alternate(),
which runs the commands of one case round-robin so that they are measured under the same conditions."""
import os
import random
import shlex
import shutil

from .measure import MiB, Failure, content_bytes, log, timed
from .tables import Report


class Bench:
    def __init__(self, args, nginx):
        self.packs = args.packs
        self.packs_compare = args.packs_compare or None
        self.tmp = args.tmp
        self.site = os.path.join(args.tmp, "site")
        self.runs = os.path.join(args.tmp, "runs")
        self.nginx = nginx                 # serves self.site; see harness/servers.py
        self.port = nginx.port
        self.base = nginx.base
        self.reps = args.reps
        self.only = set(args.only.split(",")) if args.only else None
        self.warm = args.warm
        self.shm = args.shm or None
        self.profile = bool(args.profile)
        self.load_seconds = args.load_seconds
        # The packs' source folders are made on tmpfs when there is one: deleting tens of thousands of
        # files on the data filesystem would slow the unpack case down (see keep= in alternate()).
        self.src_root = os.path.join(self.shm or self.tmp, "src")
        self.data = {}       # data set name -> its manifest entry (or entries), see harness/data.py
        self.results = {}    # what a case leaves for a later one (case 3 compares with case 1's runs)
        self.deferred = []   # run folders kept until all cases are done
        self.report = Report()
        os.makedirs(self.runs, exist_ok=True)

    def wants(self, case):
        return self.only is None or str(case) in self.only

    @staticmethod
    def rng(name):
        """The random numbers of one data set: the same bytes whichever cases run."""
        return random.Random(f"8/{name}")

    def packs_cmd(self, home, *rest, binary=None):
        return [binary or self.packs, "--home", home, "--quiet", *rest]

    # ---- running alternately --------------------------------------------------------------------

    def fresh(self, label):
        path = os.path.join(self.runs, label)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def prepare(self, warm_bytes, served):
        """Just before a measured run: read the served files (so that they are in the page cache even
        if DAMON paged them out), then touch and free warm_bytes of memory. In this Firecracker VM free
        pages are reported back to the host (virtio-balloon free page reporting), and writing a GiB of
        page cache into pages the host took back costs 1.2–2.7 s of sys time instead of ≈0.45 s: touching
        the memory first gives every run the same, bare-metal-like page supply."""
        buffer = bytearray(8 * MiB)
        for path in served:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass
        if self.warm and warm_bytes:
            block = bytearray(warm_bytes)   # zero-filled: every page is touched
            del block

    def alternate(self, case, commands, reps, check=None, warm_bytes=0, served=(), keep=False):
        """commands: list of (name, make(workdir) -> cmd). Runs them round-robin, reps rounds, the
        order rotated by one every round. Returns {name: [Run]}. warm_bytes: one size for all, or a
        dict {name: bytes} (see prepare()).

        keep: leave each run's output in place until every case is done, instead of deleting it
        before the next run. For outputs of thousands of files: this ext4 has no journal, and without
        one ext4 will not reuse an inode freed less than 60 s ago (300 s while its inode table block
        is dirty; ialloc.c, recently_deleted()), checking every such inode on each allocation: right
        after 10,000 files were deleted, creating 10,000 more took 3–7 s instead of 0.5 s, at random."""
        results = {name: [] for name, _ in commands}
        for r in range(reps):
            k = r % len(commands)
            order = list(enumerate(commands))
            if r % 2 == 1 and any(name == "packs (compare)" for name, _ in commands):
                # The two builds of packs run back to back; which goes first alternates, so that each follows
                # the same runs as often (with a fixed cyclic order one always followed the other, and came
                # out ≈ 8 % slower whichever build it was).
                a, b = (i for i, (name, _) in enumerate(commands) if name in ("packs", "packs (compare)"))
                order[a], order[b] = order[b], order[a]
            for index, (name, make) in order[k:] + order[:k]:
                work = self.fresh(f"c{case}-{index}-{r}")
                cmd = make(work)
                self.prepare(warm_bytes.get(name, 0) if isinstance(warm_bytes, dict) else warm_bytes, served)
                run = timed(cmd, self.tmp)
                if run.code != 0:
                    raise Failure(f"case {case}, {name}, round {r}: exit {run.code}\ncommand: {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n"
                                  f"stdout: {run.out[-2000:]}\nstderr: {run.err[-2000:]}")
                if check:
                    check(name, work, run)
                results[name].append(run)
                self.report.raw.append((case, name, r, run))
                log(f"  case {case} round {r} {name:<18} {run.wall:7.3f} s  cpu {run.cpu:6.2f} s  rss {run.rss_kib / 1024:7.1f} MiB"
                    f"  other cpu {run.other:5.2f} s")
                if keep:
                    self.deferred.append(work)
                else:
                    shutil.rmtree(work, ignore_errors=True)
                os.sync()
        return results

    @staticmethod
    def expect_content(expected_files, expected_bytes):
        """A check for alternate(): the run unpacked exactly this many files and bytes."""
        def check(name, work, run):
            files, total = content_bytes(work)
            if (files, total) != (expected_files, expected_bytes):
                raise Failure(f"{name}: unpacked {files} files / {total} bytes under {work}, expected {expected_files} / {expected_bytes}")
        return check

    # ---- --compare: another build of packs, alternated with this one -----------------------------

    def compare_commands(self, manifest, product):
        """With --compare: the same fetch by another build of packs, alternated with this one's."""
        if not self.packs_compare:
            return []
        return [("packs (compare)", lambda w: self.packs_cmd(f"{w}/home", "fetch", manifest, product, binary=self.packs_compare))]

    @staticmethod
    def with_compare(commands, compare):
        """The compare command right after packs (alternate() swaps the two every other round)."""
        return commands[:1] + compare + commands[1:]

    def compare_row(self, case, what, walls):
        if "packs (compare)" in walls:
            self.report.row(case, what + ": this build ÷ the --compare build", walls["packs"], "packs (compare)", walls["packs (compare)"])
