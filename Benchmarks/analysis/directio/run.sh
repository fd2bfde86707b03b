#!/bin/bash
# DirectFile against plain pwrite, 1 GiB of random bytes held in memory (a 64 MiB pool, pieces of 64 KiB..4 MiB from
# unaligned places, like the sink's chunks), each followed by fdatasync; wall, user and sys CPU of the writes alone
# (getrusage). Alternates 3 rounds of: plain, direct (one file, one flush), the same two as the first install's sink
# does them (16 MiB ranges, each opened, written, flushed, synced, closed), and dd oflag=direct / conv=fsync.
# Builds DirectFile.swift from Sources with -O against stubs of FileWriting and DeltaAssembly.writeFailure.
# Usage: Benchmarks/analysis/directio/run.sh [folder on the filesystem to measure, default /tmp]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d "${1:-/tmp}/PackDelivery-directio-XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$here"/{shim.h,module.modulemap} "$work"/
clang -O2 -c "$here/shim.c" -o "$work/shim.o"
swiftc -O -I "$work" "$here/main.swift" "$here/stubs.swift" "$root/Sources/PackDelivery/Delivery/WriteOnce/DirectFile.swift" "$work/shim.o" -o "$work/bench"
F=$work/F
for i in 1 2 3; do
  "$work/bench" plain "$F"
  "$work/bench" direct "$F"
  "$work/bench" plain-ranges "$F"
  "$work/bench" direct-ranges "$F"
  /usr/bin/time -f "dd-direct wall %e user %U sys %S" dd if=/dev/zero of="$F" bs=1M count=1024 oflag=direct conv=fsync status=none; rm -f "$F"
  /usr/bin/time -f "dd-fsync wall %e user %U sys %S" dd if=/dev/zero of="$F" bs=1M count=1024 conv=fsync status=none; rm -f "$F"
done
# The first install's sink writes through DirectFile (ChunkAssembly.write; flushed at each window's end): measured
# end to end by Benchmarks/run --only 1,10.
