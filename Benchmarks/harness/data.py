"""Making the served data: packs of random content under TMP/site (made with `packs pack`, so their
manifests are the real thing), the data sets several cases share, and reading it all once so that every
run reads it from the page cache. A case's own data is made by its make_data()."""
import glob
import json
import os
import shutil
import time

from .measure import MiB, log, sh


def random_file(path, size, rng):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(rng.randbytes(n))
            left -= n


def make_pack(b, name, files, product, output_name, rng, version="1"):
    """files: list of (relative path under Contents/, size). Writes site/NAME/OUTPUT_NAME."""
    src = os.path.join(b.src_root, name, product)
    for rel, size in files:
        random_file(os.path.join(src, "Contents", rel), size, rng)
    os.makedirs(os.path.join(b.site, name), exist_ok=True)
    out = os.path.join(b.site, name, output_name)
    sh([b.packs, "pack", src, "--output", out, "--product", product, "--version", version])
    shutil.rmtree(src)
    return out


def manifest(b, name):
    """Writes site/NAME/manifest.json (packs manifest); returns {product: its content entry}."""
    sh([b.packs, "manifest", os.path.join(b.site, name)])
    with open(os.path.join(b.site, name, "manifest.json")) as f:
        m = json.load(f)
    return {p["productIdentifier"]: p["contents"][0] for p in m["products"]}


# ---- data sets shared by several cases (a case names those it needs in DATA) ---------------------

def make_big(b):
    log("data: 1 GiB pack (4 × 256 MiB, tar)…")
    make_pack(b, "big", [(f"part{i}.bin", 256 * MiB) for i in range(4)], "com.bench.big", "big.tar", b.rng("big"))
    b.data["big"] = manifest(b, "big")["com.bench.big"]


def make_mid(b):
    log("data: 256 MiB pack (2 × 128 MiB, tar)…")
    make_pack(b, "mid", [(f"part{i}.bin", 128 * MiB) for i in range(2)], "com.bench.mid", "mid.tar", b.rng("mid"))
    b.data["mid"] = manifest(b, "mid")["com.bench.mid"]


def make_prof(b):
    log("data: 64 MiB pack for callgrind…")
    make_pack(b, "prof", [(f"part{i}.bin", 16 * MiB) for i in range(4)], "com.bench.prof", "prof.tar", b.rng("prof"))
    b.data["prof"] = manifest(b, "prof")["com.bench.prof"]


SHARED = {"big": make_big, "mid": make_mid}


def make(b, cases):
    """The data of these case modules (shared sets first), and of --profile."""
    t0 = time.time()
    for name, maker in SHARED.items():
        if any(name in getattr(case, "DATA", ()) for case in cases):
            maker(b)
    for case in cases:
        if hasattr(case, "make_data"):
            case.make_data(b)
    if b.profile:
        make_prof(b)
    shutil.rmtree(b.src_root, ignore_errors=True)
    # Every served file is read once now, so that all runs read it from the page cache.
    for path in glob.glob(os.path.join(b.site, "*", "*")):
        if not os.path.isfile(path):   # case 12 keeps its versions and casync's store in folders of their own
            continue
        with open(path, "rb") as f:
            while f.read(8 * MiB):
                pass
    log(f"data ready in {time.time() - t0:.0f} s")
