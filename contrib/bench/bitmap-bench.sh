#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Block status of a persistent dirty bitmap over NBD: the context
# qemu:dirty-bitmap:b0 through `blockport serve -r -B b0` and
# `qemu-nbd -r -B b0`, alternating, round by round.
# Image: 1 TiB qcow2, bitmap b0 (64 KiB granularity) with 1% of its
# granules dirty (167,772 discards of 64 KiB at random places, made with
# qemu-io, about 30 s): about 330,000 extents.
# One round is WALKS walks of the whole image by one python libnbd client
# (block status of 4 GiB - 64 KiB at a time from where the last reply
# ended); both servers' extents are compared after the first round.
#
# usage: contrib/bench/bitmap-bench.sh [ROUNDS] [WALKS] [BLOCKPORT]
# Prints seconds per round and the median ratio qemu-nbd / blockport
# (above 1: blockport is faster).
set -euo pipefail
ROUNDS=${1:-5}
WALKS=${2:-5}
BP=$(readlink -f "${3:-$(dirname "$0")/../../build/blockport}")
PY=/usr/bin/python3 # the one with libnbd's module
source "$(dirname "$0")/lib.sh"
bench_require qemu-nbd qemu-img qemu-io bc
"$PY" -c 'import nbd' || { echo "missing python3 libnbd" >&2; exit 1; }
bench_workdir bitmap-bench

img=$W/big.qcow2
qemu-img create -q -f qcow2 "$img" 1T
qemu-img bitmap --add "$img" b0
{
  RANDOM=7 # seeded in the pipeline's subshell, which bash reseeds
  for ((i = 0; i < 167772; i++)); do
    echo "discard $((((RANDOM * 32768 + RANDOM) % (16 << 20)) << 16)) 64k"
  done
} | qemu-io -f qcow2 "$img" >/dev/null

# walk SOCKET OUT: seconds for WALKS walks; the extents of the last in OUT.
walk() {
  "$PY" - "$1" "$2" "$WALKS" <<'EOF'
import sys, time, nbd
h = nbd.NBD()
h.add_meta_context("qemu:dirty-bitmap:b0")
h.connect_uri("nbd+unix:///?socket=" + sys.argv[1])
size, step = h.get_size(), (4 << 30) - (64 << 10)
t0 = time.monotonic()
for _ in range(int(sys.argv[3])):
    out, off = [], 0
    while off < size:
        got = []
        h.block_status(min(step, size - off), off,
                       lambda m, o, e, err: got.extend(e))
        out.extend(got)
        off += sum(got[0::2])
print("%.3f" % (time.monotonic() - t0))
with open(sys.argv[2], "w") as f:
    f.writelines("%d %d\n" % (out[i], out[i + 1]) for i in range(0, len(out), 2))
h.shutdown()
EOF
}

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

"$BP" serve -r -B b0 -u "$W/b.sock" "$img" 2>/dev/null &
qemu-nbd -r -B b0 -f qcow2 -t -k "$W/q.sock" "$img" &
for _ in $(seq 100); do
  [ -S "$W/b.sock" ] && [ -S "$W/q.sock" ] && break
  sleep 0.1
done
ratios=()
for r in $(seq "$ROUNDS"); do
  if ((r % 2)); then
    b=$(walk "$W/b.sock" "$W/b.ext")
    q=$(walk "$W/q.sock" "$W/q.ext")
  else
    q=$(walk "$W/q.sock" "$W/q.ext")
    b=$(walk "$W/b.sock" "$W/b.ext")
  fi
  # Replies end in different places (at most 16,384 extents from
  # blockport, 131,072 from qemu-nbd): compare the merged runs.
  for f in b q; do
    awk '$2 == v {l += $1; next} NR > 1 {print l, v} {l = $1; v = $2}
         END {print l, v}' "$W/$f.ext" >"$W/$f.runs"
  done
  cmp -s "$W/b.runs" "$W/q.runs" || { echo "the extents differ" >&2; exit 1; }
  ratio=$(echo "scale=2; $q / $b" | bc)
  ratios+=("$ratio")
  echo "round $r: blockport ${b}s qemu-nbd ${q}s ratio $ratio" \
    "($(wc -l <"$W/b.runs") runs)"
done
echo "median qemu-nbd/blockport: $(printf '%s\n' "${ratios[@]}" | median)"
