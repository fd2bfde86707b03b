"""How large case 12f's chunked tar.zst would be with other frame layouts or zstd levels, without rebuilding
packs: a model of `packs pack x.tar.zst` (PackWriter with PackFrameSink: the tar stream of the folder, each
run of tar headers and padding between chunks a zstd frame of its own, each chunk of a file's data a frame,
then the seek table), with the layout and level as parameters.

The mix is case 12f's: all regular files of /usr/share/doc and shared libraries of at most 8 MiB from
/usr/lib/x86_64-linux-gnu, one per inode, in path order, to about 300 MB. Chunks are cut by the port of
Chunker.swift in chunking.py; tar headers are Python's pax headers (packs writes its own pax headers: close,
not byte-equal); each piece is compressed by libzstd (ctypes) at the given level; the seek table is counted at
8 bytes a frame. Checked here against packs pack's real file: 144.73 MB modelled, 144.65 MB real (0.06 %).

Usage: python3 Benchmarks/analysis/frames.py [--packs PATH_TO_RELEASE_PACKS]   (about 3 minutes; needs numpy
and libzstd1; copies the 300 MB mix into a temporary folder; not run by Benchmarks/run)
"""
import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chunking import CDC, KiB, MiB, candidates  # noqa: E402

zstd = ctypes.CDLL("libzstd.so.1")
zstd.ZSTD_createCCtx.restype = ctypes.c_void_p
zstd.ZSTD_compressCCtx.restype = ctypes.c_size_t
zstd.ZSTD_compressCCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
zstd.ZSTD_compressBound.restype = ctypes.c_size_t
zstd.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]
CCTX = ctypes.c_void_p(zstd.ZSTD_createCCtx())
BUFFER = ctypes.create_string_buffer(zstd.ZSTD_compressBound(64 << 20))
SEEK_ENTRY = 8


def compressed(data, level):
    n = zstd.ZSTD_compressCCtx(CCTX, BUFFER, len(BUFFER), data, len(data), level)
    assert not zstd.ZSTD_isError(n)
    return n


def make_mix(mix):
    """Case 12f's selection (cases/12_chunks.py, sizes())."""
    total, seen = 0, set()
    for top, root_dir in (("doc", "/usr/share/doc"), ("lib", "/usr/lib/x86_64-linux-gnu")):
        for root, dirs, files in os.walk(root_dir):
            dirs.sort()
            for n in sorted(files):
                path = os.path.join(root, n)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                st = os.stat(path)
                if top == "lib" and (".so" not in n or st.st_size > 8 * MiB or (st.st_dev, st.st_ino) in seen
                                     or total + st.st_size > 300_000_000):
                    continue
                seen.add((st.st_dev, st.st_ino))
                dest = os.path.join(mix, top, os.path.relpath(path, root_dir))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                try:
                    shutil.copy2(path, dest)
                except OSError:
                    continue
                total += os.path.getsize(dest)


def entries_of(mix, cdc):
    """Per tar entry, in packs's order (sorted paths): (header run bytes, [chunk bytes])."""
    out, pad = [], b""
    for root, dirs, files in os.walk(mix):
        dirs.sort()
        rel = os.path.relpath(root, mix)
        names = ([(rel, None)] if rel != "." else []) + [(os.path.normpath(os.path.join(rel, n)), os.path.join(root, n))
                                                          for n in sorted(files)]
        for path, full in names:
            info = tarfile.TarInfo("Contents/" + path)
            info.mtime = 1767225600
            if full is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                out.append((pad + info.tobuf(format=tarfile.PAX_FORMAT), []))
                pad = b""
                continue
            with open(full, "rb") as f:
                data = f.read()
            info.size, info.mode = len(data), 0o644
            chunks, at = [], 0
            for n in cdc.lengths(data, candidates(data) if len(data) > cdc.min else ([], [])):
                chunks.append(data[at:at + n])
                at += n
            out.append((pad + info.tobuf(format=tarfile.PAX_FORMAT), chunks))
            pad = b"\0" * ((-len(data)) % 512)
    out.append((pad + b"\0" * 1024, []))
    return out


def today(entries, level):
    """Each header run a frame, each chunk a frame."""
    frames = [h for h, _ in entries] + [c for _, cs in entries for c in cs]
    return sum(compressed(f, level) for f in frames), len(frames)


def header_in_first_chunk(entries, level):
    frames = []
    for h, cs in entries:
        frames += [h + cs[0]] + cs[1:] if cs else [h]
    return sum(compressed(f, level) for f in frames), len(frames)


def grouped(small, limit):
    """Whole files under `small` bytes share frames of at most `limit` with their headers (a delta fetches the
    frame); a larger file's header run goes into its first chunk's frame."""
    def layout(entries, level):
        frames, group = [], b""
        for h, cs in entries:
            size = sum(len(c) for c in cs)
            if size < small:
                if group and len(group) + len(h) + size > limit:
                    frames.append(group)
                    group = b""
                group += h + b"".join(cs)
            else:
                if group:
                    frames.append(group)
                    group = b""
                frames += [h + cs[0]] + cs[1:]
        if group:
            frames.append(group)
        return sum(compressed(f, level) for f in frames), len(frames)
    return layout


LAYOUTS = [
    ("today: each header run and each chunk a frame", today, 3),
    ("the header run in its file's first chunk's frame", header_in_first_chunk, 3),
    ("files < 16 KiB grouped in frames ≤ 64 KiB", grouped(16 * KiB, 64 * KiB), 3),
    ("files < 64 KiB grouped in frames ≤ 256 KiB", grouped(64 * KiB, 256 * KiB), 3),
    ("today", today, 5),
    ("today", today, 7),
    ("today", today, 9),
    ("files < 64 KiB grouped in frames ≤ 256 KiB", grouped(64 * KiB, 256 * KiB), 5),
    ("files < 64 KiB grouped in frames ≤ 256 KiB", grouped(64 * KiB, 256 * KiB), 7),
]

# Larger groups (issue 29, round three): how far grouping alone goes at bsdtar's level.
GROUPS = [
    ("today: each header run and each chunk a frame", today, 3),
    ("files < 64 KiB grouped in frames ≤ 256 KiB", grouped(64 * KiB, 256 * KiB), 3),
    ("files < 128 KiB grouped in frames ≤ 512 KiB", grouped(128 * KiB, 512 * KiB), 3),
    ("files < 256 KiB grouped in frames ≤ 1 MiB", grouped(256 * KiB, 1 * MiB), 3),
    ("files < 1 MiB grouped in frames ≤ 4 MiB", grouped(1 * MiB, 4 * MiB), 3),
    ("files < 64 KiB grouped in frames ≤ 256 KiB", grouped(64 * KiB, 256 * KiB), 4),
    ("files < 256 KiB grouped in frames ≤ 1 MiB", grouped(256 * KiB, 1 * MiB), 4),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", help="a packs binary: also pack the mix for real, to check the model")
    ap.add_argument("--chunks", type=int, default=64, choices=(32, 64),
                    help="average chunk in KiB: 64 (round one's default, NC2) or 32 (today's Chunker.standard, NC1)")
    ap.add_argument("--groups", action="store_true", help="the larger groups (GROUPS) instead of LAYOUTS")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mix = os.path.join(tmp, "mix")
        make_mix(mix)
        bsdtar = {}
        for level in (3, 4, 5, 7, 9):
            subprocess.run(["bsdtar", "--zstd", "--options", f"zstd:compression-level={level}", "-cf", f"{tmp}/b.tar.zst",
                            "-C", mix, "."], check=True)
            bsdtar[level] = os.path.getsize(f"{tmp}/b.tar.zst")
        print("bsdtar --zstd: " + ", ".join(f"level {k} {v / 1e6:.2f} MB" for k, v in bsdtar.items()))
        if args.packs:
            subprocess.run([args.packs, "pack", mix, "--output", f"{tmp}/p.tar.zst"], check=True, stdout=subprocess.DEVNULL)
            print(f"packs pack (level 3, 64 KiB chunks): {os.path.getsize(f'{tmp}/p.tar.zst') / 1e6:.2f} MB")
        cdc = CDC(16 * KiB, 64 * KiB, 256 * KiB, 18, 14) if args.chunks == 64 else CDC(16 * KiB, 32 * KiB, 256 * KiB, 16, 14)
        entries = entries_of(mix, cdc)
    print(f"\n| frame layout (packs's {args.chunks} KiB chunks) | zstd level | frames | size | ÷ bsdtar level 3 | ÷ bsdtar, same level |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, layout, level in GROUPS if args.groups else LAYOUTS:
        size, frames = layout(entries, level)
        size += SEEK_ENTRY * frames
        print(f"| {name} | {level} | {frames} | {size / 1e6:.2f} MB | {size / bsdtar[3]:.3f} | {size / bsdtar[level]:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
