#!/usr/bin/env python3
"""Writes the two content trees of the format-2 fixtures: make-trees.py OUT -> OUT/v1, OUT/v2 (deterministic)."""
import os, random, sys

def lowentropy(rng, size, bits=4):  # zstd keeps about bits / 8 of it
    return bytes(rng.randrange(1 << bits) + 64 for _ in range(size))

def text(n, lines):
    return "".join(f"text {n}, line {i}: a tree, a rock and {i % 13} birds\n" for i in range(lines)).encode()

def write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)

def tree(root, version):
    c = os.path.join(root, "Contents")
    big = bytearray(lowentropy(random.Random(1), 256 << 10))
    if version == 2:
        big[1_000:5_096] = lowentropy(random.Random(2), 4096)       # 4 KiB of its first chunk changed
    write(f"{c}/media/big.bin", bytes(big))
    write(f"{c}/media/log.txt", text(99, 3000))                       # about 200 KiB of text
    for n in range(16):
        size = 1024 + n * 613 % 9 * 1024
        data = lowentropy(random.Random(100 + n + (1000 if version == 2 and n == 3 else 0)), size, bits=3)
        write(f"{c}/small/s{n}.bin", data)
    for n in range(16):
        if version == 2 and n == 9:
            continue                                                  # removed in version 2
        write(f"{c}/text/t{n}.txt", text(n + (500 if version == 2 and n == 5 else 0), 20 + n * 40))
    if version == 2:
        write(f"{c}/small/new.bin", lowentropy(random.Random(77), 7000, bits=3))  # added in version 2
    write(f"{c}/empty", b"")
    write(f"{c}/run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    write(f"{c}/deep/a/b/c.txt", b"deep\n")
    os.makedirs(f"{c}/deep/emptydir", exist_ok=True)
    os.symlink("../run.sh", f"{c}/small/link")

def big(root):
    """Version 1 and 280 files of 64 KiB of one random block after a line naming the file: a pack over 16 MiB (the
    least a first install writes once from chunks) that xz makes small again, the block being the same."""
    tree(root, 1)
    rng = random.Random(5)
    block = bytes(rng.randrange(256) for _ in range(64 << 10))
    for n in range(280):
        write(f"{root}/Contents/data/f{n:03}.bin", f"file {n:04}\n".encode() + block)

for v in (1, 2):
    tree(os.path.join(sys.argv[1], f"v{v}"), v)
big(os.path.join(sys.argv[1], "big"))
