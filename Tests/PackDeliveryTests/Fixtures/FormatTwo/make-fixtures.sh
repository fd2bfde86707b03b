#!/bin/sh
# Remakes v1/ and v2/ with the previous writer (index format 2):
#   git worktree add --detach ../old 2370989 && (cd ../old && swift build -c release --scratch-path .build-old --product packs)
#   Tests/PackDeliveryTests/Fixtures/FormatTwo/make-fixtures.sh ../old/.build-old/release/packs
set -eu
packs=$1
here=$(cd "$(dirname "$0")" && pwd)
trees=$(mktemp -d)
python3 "$here/make-trees.py" "$trees"
for v in 1 2; do
    rm -rf "$here/v$v" && mkdir -p "$here/v$v"
    "$packs" pack "$trees/v$v" --product com.example.formattwo --version "$v" --output "$here/v$v/pack.tar.zst"
    "$packs" manifest "$here/v$v"
done
# Over 16 MiB, kept xz-compressed (its files share one random block); the tests unpack it with xz -d.
rm -rf "$here/big" && mkdir -p "$here/big"
"$packs" pack "$trees/big" --product com.example.formattwo --version 1 --output "$here/big/pack.tar.zst"
"$packs" manifest "$here/big"
xz -9e "$here/big/pack.tar.zst"
rm -rf "$trees"
