#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Write the seed corpus of fuzz-qcow2-info: small qcow2 images made by
# qemu-img with what `blockport info` reads (snapshots, bitmaps, a backing
# file and its format, an external data file), with 512-byte clusters so
# that the tables lie in the first few KiB.
#
#   tests/fuzz/make-qcow2-info-corpus.sh  # (re)writes corpus/qcow2-info/
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=$here/corpus/qcow2-info
command -v qemu-img >/dev/null || { echo "qemu-img is needed" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

c=cluster_size=512
qemu-img create -q -f raw base.raw 1M
qemu-img create -q -f qcow2 -o $c snapshots 1M
qemu-img snapshot -c first snapshots
qemu-img snapshot -c "second with spaces" snapshots
qemu-img create -q -f qcow2 -o $c,compat=0.10 snapshots-v2 1M
qemu-img snapshot -c only snapshots-v2
qemu-img create -q -f qcow2 -o $c bitmaps 1M
qemu-img bitmap --add bitmaps b0
qemu-img bitmap --add -g 128k bitmaps "bitmap one"
qemu-img bitmap --disable bitmaps "bitmap one"
qemu-img snapshot -c s1 bitmaps
qemu-img create -q -f qcow2 -o $c,lazy_refcounts=on,refcount_bits=8 \
  -b base.raw -F raw backing 1M
qemu-img create -q -f qcow2 -o $c,data_file=data.raw,data_file_raw=on \
  data-file 1M
qemu-img create -q -f qcow2 -o cluster_size=16k,extended_l2=on,compression_type=zstd \
  extl2-zstd 1M
rm -rf "$out"
mkdir -p "$out"
for f in snapshots snapshots-v2 bitmaps backing data-file extl2-zstd; do
  cp "$f" "$out/$f"
done
ls -l "$out"
