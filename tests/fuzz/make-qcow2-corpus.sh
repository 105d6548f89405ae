#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Write the seed corpus of fuzz-qcow2: small qcow2 images made by qemu-img
# and qemu-io (version 2 and 3, 512-byte to 64 KiB clusters, extended L2,
# zlib and zstd compression, a backing file with its format, external data
# files, snapshots, bitmaps, zero clusters).
#
#   tests/fuzz/make-qcow2-corpus.sh      # (re)writes tests/fuzz/corpus/qcow2/
#
# Backing and data file names are the ones the fuzz target provides next to
# the image it opens: "base.raw" and "data.raw".
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=$here/corpus/qcow2
for tool in qemu-img qemu-io; do
  command -v $tool >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

io() { # io IMAGE COMMAND...: qemu-io commands on a qcow2 image
  local img=$1
  shift
  local args=()
  for c in "$@"; do args+=(-c "$c"); done
  local log
  log=$(qemu-io -f qcow2 "${args[@]}" "$img" 2>&1) || {
    echo "qemu-io $img: $log" >&2
    exit 1
  }
}

create() { # create NAME SIZE OPTIONS
  qemu-img create -q -f qcow2 -o "$3" "$1" "$2"
}

# A compressible raw source for the compressed images.
qemu-img create -q -f raw src.raw 64k
qemu-io -f raw -c "write -P 0x61 0 8k" -c "write -P 0x00 8k 4k" \
  -c "write -P 0x7e 20k 12k" -c "write -P 0x33 62k 2k" src.raw >/dev/null

create v2-512 256k compat=0.10,cluster_size=512
io v2-512 "write -P 0xaa 0 2k" "write -P 0x55 100k 1k" "write -P 0x11 255k 1k"

create v3-512 256k compat=1.1,cluster_size=512
io v3-512 "write -P 0xaa 0 2k" "write -z 4k 2k" "write -P 0x5a 8k 512" \
  "discard 8k 512" "write -P 0xc3 131071 3"

create v3-4k-refcount64 1M compat=1.1,cluster_size=4k,refcount_bits=64
io v3-4k-refcount64 "write -P 0x01 0 6k" "write -P 0x02 512k 4k" \
  "write -z -u 12k 4k"

create v3-4k-refcount1-lazy 1M cluster_size=4k,refcount_bits=1,lazy_refcounts=on
io v3-4k-refcount1-lazy "write -P 0x77 4k 4k" "write -P 0x78 1020k 4k"

create v3-64k 4M cluster_size=64k
io v3-64k "write -P 0xab 0 64k" "write -P 0xcd 1M 4k" "write -z 2M 64k"

create v2-64k 4M compat=0.10,cluster_size=64k
io v2-64k "write -P 0x12 65000 2000"

create extl2-16k 1M cluster_size=16k,extended_l2=on
io extl2-16k "write -P 0x21 0 512" "write -P 0x22 1536 1024" \
  "write -z 16k 4k" "write -P 0x23 40k 8k" "discard 41k 512"

create extl2-32k 2M cluster_size=32k,extended_l2=on
io extl2-32k "write -P 0x31 1M 1k" "write -z 1052672 1k"

for type in zlib zstd; do
  qemu-img convert -c -O qcow2 -o cluster_size=4k,compression_type=$type \
    src.raw compressed-$type-4k
  qemu-img convert -c -O qcow2 -o cluster_size=512,compression_type=$type \
    src.raw compressed-$type-512
done
qemu-img convert -c -O qcow2 -o cluster_size=16k,extended_l2=on src.raw \
  compressed-extl2-16k
qemu-img convert -c -O qcow2 -o compat=0.10,cluster_size=1k src.raw \
  compressed-v2-1k

qemu-img create -q -f raw base.raw 64k
create backing-raw 128k cluster_size=4k,backing_file=base.raw,backing_fmt=raw
io backing-raw "write -P 0x44 4k 4k" "write -z 16k 4k" "write -P 0x45 100k 1k"
create backing-raw-v2 128k compat=0.10,cluster_size=512,backing_file=base.raw,backing_fmt=raw
io backing-raw-v2 "write -P 0x46 0 1k"

qemu-img create -q -f raw data.raw 256k
create data-file 256k cluster_size=4k,data_file=data.raw
io data-file "write -P 0x51 0 4k" "write -P 0x52 64k 8k" "write -z 128k 4k"
create data-file-raw 256k cluster_size=4k,data_file=data.raw,data_file_raw=on
io data-file-raw "write -P 0x53 8k 4k"
create data-file-extl2 256k cluster_size=16k,extended_l2=on,data_file=data.raw
io data-file-extl2 "write -P 0x54 0 1k" "write -z 16k 2k"

create snapshot 256k cluster_size=4k
io snapshot "write -P 0x61 0 8k"
qemu-img snapshot -c snap1 snapshot
io snapshot "write -P 0x62 4k 4k"

create bitmaps 256k cluster_size=4k
qemu-img bitmap --add bitmaps b0
io bitmaps "write -P 0x71 0 4k"

create prealloc-metadata 64k cluster_size=512,preallocation=metadata

mkdir -p "$out"
rm -f "$out"/*
for f in v2-* v3-* extl2-* compressed-* backing-* data-file* snapshot bitmaps \
  prealloc-*; do
  cp "$f" "$out/$f"
done
echo "$out: $(ls "$out" | wc -l) images, $(du -sh "$out" | cut -f1)"
