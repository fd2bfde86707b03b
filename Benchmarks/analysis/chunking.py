"""How many bytes case 12's updates (a: 1 % of a 256 MiB file changed in 32 places; d: 4 KiB inserted near the
start of a 64 MiB file) would need under other chunkings than packs's, without rebuilding packs.

A port of Sources/PackDelivery/Support/Chunker.swift (FastCDC with a gear hash and normalized chunking), with
the masks and sizes as parameters. Candidate cut points come from a vectorized hash of the 64 bytes ending at
each position (numpy); the first 63 positions after `minimum` of each chunk, whose hash depends on where
hashing started, are computed exactly, as the Swift code does. With --packs, it first checks that the port
cuts the 256 MiB file exactly as `packs pack` does (its index's chunk sizes).

The data are case 12's (the same seeds, so the same bytes). For each chunking: the file's chunks and their
mean size, and for each update the new chunks (those whose SHA-256 the old version lacks; random data, so
stored ≈ raw) plus the index: as today's JSON (about 148 bytes a chunk: 528,698 bytes for 3,572 chunks) and
compressed with zstd -19 (about 44 bytes a chunk: 156 KB for the same). casync's bytes, measured by case 12,
for comparison: a 6.26 MB (78 chunks, 6.10 MB, and a 0.163 MB .caidx), d 0.231 MB.

Usage: python3 Benchmarks/analysis/chunking.py [--packs PATH_TO_RELEASE_PACKS]   (about a minute, 3 GB of RAM;
needs numpy: apt-get install python3-numpy. Not run by Benchmarks/run.)
"""
import argparse
import bisect
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
M64 = (1 << 64) - 1
JSON_PER_CHUNK, ZSTD_PER_CHUNK = 148, 44


def gear_table():
    """Chunker.gear: SplitMix64 from "PackCDC1"."""
    state, out = 0x5061636B43444331, []
    for _ in range(256):
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append(z ^ (z >> 31))
    return out


GEAR = gear_table()
GEAR_NP = np.array(GEAR, dtype=np.uint64)


def candidates(data, min_lz=12, block=16 << 20):
    """(positions, leading zero bits) of every position whose 64-byte window hash has at least min_lz leading zeros."""
    b = np.frombuffer(data, dtype=np.uint8)
    pos, lzs = [], []
    for start in range(0, len(b), block):
        lo = max(0, start - 63)
        g = GEAR_NP[b[lo:min(len(b), start + block)]]
        h = g.copy()
        for k in range(1, 64):
            h[k:] += g[:-k] << np.uint64(k)
        h = h[start - lo:]
        for i in np.nonzero(h < np.uint64(1 << (64 - min_lz)))[0]:
            pos.append(start + int(i))
            lzs.append(64 - int(h[i]).bit_length())
    return pos, lzs


class CDC:
    """Chunker.cut with strict_bits top bits tested before `average`, loose_bits after (bits ± the normalization
    level: 1 in packs's default, 2 before)."""

    def __init__(self, minimum, average, maximum, strict_bits, loose_bits):
        self.min, self.avg, self.max, self.sb, self.lb = minimum, average, maximum, strict_bits, loose_bits
        self.strict = (M64 << (64 - strict_bits)) & M64
        self.loose = (M64 << (64 - loose_bits)) & M64

    def lengths(self, data, cand):
        pos, lzs = cand
        n, s, out = len(data), 0, []
        while s < n:
            count = n - s
            if count <= self.min:
                out.append(count)
                break
            end = min(count, self.max)
            middle = min(end, self.avg)
            h, cut = 0, None
            for j in range(self.min, min(self.min + 63, end)):   # hash started at `minimum`: exact
                h = ((h << 1) + GEAR[data[s + j]]) & M64
                if h & (self.strict if j < middle else self.loose) == 0:
                    cut = j + 1
                    break
            if cut is None:
                i = bisect.bisect_left(pos, s + self.min + 63)
                while i < len(pos) and pos[i] < s + end:
                    j = pos[i] - s
                    if lzs[i] >= (self.sb if j < middle else self.lb):
                        cut = j + 1
                        break
                    i += 1
            out.append(cut or end)
            s += cut or end
        return out


def random_bytes(rng, n):
    return b"".join(rng.randbytes(min(8 * MiB, n - at)) for at in range(0, n, 8 * MiB))


def case_data():
    """Case 12's a and d files, old and new (cases/12_chunks.py, make_data)."""
    rng = random.Random("8/chunks-a")
    a_old = random_bytes(rng, 256 * MiB)
    a_new = bytearray(a_old)
    span = round(0.01 * len(a_old) / 32)
    for i in range(32):
        at = i * 8 * MiB + rng.randrange(8 * MiB - span)
        a_new[at:at + span] = rng.randbytes(span)
    rng = random.Random("8/chunks-d")
    d_old = random_bytes(rng, 64 * MiB)
    at = 256 * KiB + 1234
    return {"a": (a_old, bytes(a_new)), "d": (d_old, d_old[:at] + rng.randbytes(4 * KiB) + d_old[at:])}


def check_against_packs(packs, data, cand):
    """packs pack's chunk sizes of the 256 MiB file equal the port's."""
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/p/Contents")
        with open(f"{tmp}/p/Contents/level.dat", "wb") as f:
            f.write(data)
        subprocess.run([packs, "pack", f"{tmp}/p", "--output", f"{tmp}/a.tar.zst"], check=True, stdout=subprocess.DEVNULL)
        # The index is zstd-compressed JSON (plain JSON before indexes were compressed).
        with open(f"{tmp}/a.tar.zst.index.json", "rb") as f:
            raw = f.read()
        if raw.startswith(b"\x28\xb5\x2f\xfd"):
            raw = subprocess.run(["zstd", "-dc"], input=raw, stdout=subprocess.PIPE, check=True).stdout
        index = json.loads(raw)
    sizes = [c["size"] for e in index["entries"] if e["path"].endswith("level.dat") for c in e["chunks"]]
    mine = CDC(16 * KiB, 32 * KiB, 256 * KiB, 16, 14).lengths(data, cand)   # Chunker.standard: level 1
    if mine != sizes:
        sys.exit(f"the port cuts {len(mine)} chunks, packs pack {len(sizes)}: they differ")
    print(f"check: the port cuts the 256 MiB file into the same {len(sizes)} chunks as packs pack\n")


VARIANTS = [   # name, minimum, average, maximum, strict bits, loose bits (average 2^16: bits = 16)
    ("packs before: NC2, 16K/64K/256K", 16 * KiB, 64 * KiB, 256 * KiB, 18, 14),
    ("NC1, 16K/64K/256K", 16 * KiB, 64 * KiB, 256 * KiB, 17, 15),
    ("NC0, 16K/64K/256K", 16 * KiB, 64 * KiB, 256 * KiB, 16, 16),
    ("NC1, 8K/64K/256K", 8 * KiB, 64 * KiB, 256 * KiB, 17, 15),
    ("NC0, 8K/64K/256K", 8 * KiB, 64 * KiB, 256 * KiB, 16, 16),
    ("NC2, 8K/32K/128K (packs pack --chunk-average 32)", 8 * KiB, 32 * KiB, 128 * KiB, 17, 13),
    ("NC1, 16K/32K/128K", 16 * KiB, 32 * KiB, 128 * KiB, 16, 14),
    ("NC1, 8K/32K/128K", 8 * KiB, 32 * KiB, 128 * KiB, 16, 14),
    ("NC1, 8K/32K/256K", 8 * KiB, 32 * KiB, 256 * KiB, 16, 14),
    ("NC1, 16K/32K/256K (packs's default since the index records its level)", 16 * KiB, 32 * KiB, 256 * KiB, 16, 14),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", help="a packs binary: check the port against packs pack first")
    ap.add_argument("--only", help="run only the chunkings whose name contains this text")
    args = ap.parse_args()
    files = case_data()
    cands = {(k, v): candidates(files[k][v]) for k in files for v in (0, 1)}
    if args.packs:
        check_against_packs(args.packs, files["a"][0], cands[("a", 0)])
    print("| chunking | chunks of the 256 MiB file (mean) | a: new chunks | a: + JSON index | a: + zstd index "
          "| d: new chunks | d: + JSON index | d: + zstd index |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, *sizes in VARIANTS:
        if args.only and args.only not in name:
            continue
        cdc = CDC(*sizes)
        cells = []
        for k in ("a", "d"):
            seen, chunks = [], []
            for v in (0, 1):
                data, s, out = files[k][v], 0, []
                for n in cdc.lengths(data, cands[(k, v)]):
                    out.append((hashlib.sha256(data[s:s + n]).digest(), n))
                    s += n
                chunks.append(out)
            have = {h for h, _ in chunks[0]}
            need = {h: n for h, n in chunks[1] if h not in have}
            got = sum(need.values())
            if k == "a":
                cells.append(f"{len(chunks[0])} ({256 * MiB / len(chunks[0]) / KiB:.0f} KiB)")
            cells += [f"{len(need)}: {got / 1e6:.3f} MB", f"{(got + JSON_PER_CHUNK * len(chunks[1])) / 1e6:.3f} MB",
                      f"{(got + ZSTD_PER_CHUNK * len(chunks[1])) / 1e6:.3f} MB"]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
