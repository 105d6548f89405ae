#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Block status over a whole large qcow2: `nbdinfo --map` through
# `blockport serve -r` and `qemu-nbd -r`, alternating, round by round.
# Images (4 TiB virtual, 64 KiB clusters, made with qemu-img and qemu-io):
#   scattered   2,000 data clusters at random places: ~1,600 L2 tables, most
#               of their entries unallocated
#   sparse      50 data clusters at random places
#   extl2       as scattered, with extended L2 entries
# Both servers answer the same map (compared); the time is nbdinfo's whole
# walk.
#
# usage: contrib/bench/blockstatus-bench.sh [ROUNDS] [BLOCKPORT]
# Prints seconds per round and the median ratio qemu-nbd / blockport
# (above 1: blockport is faster).
set -euo pipefail
ROUNDS=${1:-5}
BP=$(readlink -f "${2:-$(dirname "$0")/../../build/blockport}")
source "$(dirname "$0")/lib.sh"
bench_require nbdinfo qemu-nbd qemu-img qemu-io
bench_workdir blockstatus-bench

# image NAME COUNT [OPTIONS]: a 4 TiB qcow2 with COUNT data clusters.
image() {
  local f=$W/$1.qcow2 args=() i off
  qemu-img create -q -f qcow2 -o "cluster_size=65536${3:+,$3}" "$f" 4T
  RANDOM=7
  for ((i = 0; i < $2; i++)); do
    off=$(((RANDOM * 32768 + RANDOM) % (64 * 1024 * 1024)))
    args+=(-c "write -P $((i % 250 + 1)) $((off * 65536)) 64k")
  done
  qemu-io -f qcow2 "${args[@]}" "$f" >/dev/null
}

# walk SOCKET OUT: seconds for one nbdinfo --map.
walk() {
  local s e
  s=$(date +%s%N)
  nbdinfo --map "nbd+unix:///?socket=$1" >"$2"
  e=$(date +%s%N)
  echo "scale=3; ($e - $s) / 1000000000" | bc
}

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

image scattered 2000
image sparse 50
image extl2 2000 extended_l2=on
for img in scattered sparse extl2; do
  rm -f "$W"/*.sock
  "$BP" serve -r -u "$W/b.sock" "$W/$img.qcow2" 2>/dev/null &
  bp=$!
  qemu-nbd -r -f qcow2 -t -k "$W/q.sock" "$W/$img.qcow2" &
  qn=$!
  for _ in $(seq 100); do
    [ -S "$W/b.sock" ] && [ -S "$W/q.sock" ] && break
    sleep 0.1
  done
  ratios=()
  for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then
      b=$(walk "$W/b.sock" "$W/b.map")
      q=$(walk "$W/q.sock" "$W/q.map")
    else
      q=$(walk "$W/q.sock" "$W/q.map")
      b=$(walk "$W/b.sock" "$W/b.map")
    fi
    cmp -s "$W/b.map" "$W/q.map" || { echo "$img: the maps differ" >&2; exit 1; }
    ratio=$(echo "scale=2; $q / $b" | bc)
    ratios+=("$ratio")
    echo "$img round $r: blockport ${b}s qemu-nbd ${q}s ratio $ratio"
  done
  echo "$img median qemu-nbd/blockport: $(printf '%s\n' "${ratios[@]}" | median)"
  kill "$bp" "$qn"
  wait "$bp" "$qn" 2>/dev/null || true
done
