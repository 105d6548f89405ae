#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport convert against qemu-img convert on the same inputs, one run:
#   raw -> qcow2      a 1 GiB file, half random data, half holes
#   qcow2 -> raw      the qcow2 made from it by qemu-img
#   qcow2 -> qcow2 -c compressed output (text-like data, so it compresses)
#   and with qemu-img's options: -t none (O_DIRECT output), -o (2M
#   clusters with subclusters, metadata preallocation), -m (requests in
#   flight) with -W, -C (copy offloading)
# Prints seconds per tool and the ratio qemu-img / blockport (higher is
# better for blockport), against qemu-img's default (its output is never
# synced) and against -t writeback (synced at the end, as blockport's is).
# Each blockport output is checked with qemu-img compare.
# usage: contrib/bench/convert-bench.sh [BLOCKPORT]
set -euo pipefail
BP=$(readlink -f "${1:-$(dirname "$0")/../../build/blockport}")
source "$(dirname "$0")/lib.sh"
bench_require qemu-img
bench_workdir convert-bench
cd "$W"
truncate -s 1G in.raw
dd if=/dev/urandom of=in.raw bs=1M count=512 conv=notrunc status=none
qemu-img convert -O qcow2 in.raw in.qcow2
(yes "blockport compresses text like this line, over and over" || true) | head -c 256M >text.raw
truncate -s 512M text.raw
qemu-img convert -O qcow2 text.raw text.qcow2
sync

secs() { # each run starts with no dirty pages left by the one before
  local t0 t1
  sync
  t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}'
}
row() { # name src bp-args... -- qemu-args...
  local name=$1 src=$2 of=$3; shift 3
  rm -f out.*
  local b q w
  # An untimed first run: the first conversion into a new file pays for
  # the file system's block allocation, which would fall on whoever ran
  # first (seen: 1.1 s, then 0.34 s, for the same command).
  "$BP" convert "$@" -O "$of" "$src" "out.$of"
  rm -f out.*
  b=$(secs "$BP" convert "$@" -O "$of" "$src" "out.$of")
  qemu-img compare -q "out.$of" "$src" || { echo "$name: blockport output differs"; exit 1; }
  rm -f out.*
  q=$(secs qemu-img convert "$@" -O "$of" "$src" "out.$of")
  rm -f out.*
  # -t writeback: qemu-img flushes its output at the end, as blockport does.
  w=$(secs qemu-img convert -t writeback "$@" -O "$of" "$src" "out.$of")
  printf '%-20s blockport %5.2f s | qemu-img %5.2f s (ratio %4.2f) | qemu-img -t writeback %5.2f s (ratio %4.2f)\n' \
    "$name" "$b" "$q" "$(awk -v q="$q" -v b="$b" 'BEGIN{print q / b}')" \
    "$w" "$(awk -v q="$w" -v b="$b" 'BEGIN{print q / b}')"
}
row "raw -> qcow2" in.raw qcow2
row "qcow2 -> raw" in.qcow2 raw
row "qcow2 -> qcow2 -c" text.qcow2 qcow2 -c
# qemu-img's options, the same on both sides.
row "raw -> raw -t none" in.raw raw -t none
row "raw -> qcow2 -o 2M,l2" in.raw qcow2 -o cluster_size=2M,extended_l2=on
row "raw -> qcow2 -o pre" in.raw qcow2 -o preallocation=metadata
row "raw -> qcow2 -m 4 -W" in.raw qcow2 -m 4 -W
row "qcow2 -> raw -m 1" in.qcow2 raw -m 1
row "raw -> raw -C" in.raw raw -C
row "qcow2 -> raw -C" in.qcow2 raw -C
