#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Instructions per qcow2 write request, for two blockport binaries (say,
# before and after a change to the write path): each serves the image under
# valgrind's callgrind (which counts instructions, the same count on a busy
# or a quiet machine), and a client writes N requests one after another.
# The count of a run with no requests is taken away, so what is left is
# the cost of the requests alone:
#   inplace   4k writes to random clusters of a fully allocated qcow2
#   alloc     4k writes to distinct clusters of a fresh qcow2 (allocation)
# Worker threads (--aio threads): valgrind does not run io_uring.
#
# usage: contrib/bench/qcow2-instr.sh BLOCKPORT-A BLOCKPORT-B [N]
# Prints instructions per request for each, and B/A.
set -euo pipefail
A=$(readlink -f "$1")
B=$(readlink -f "$2")
N=${3:-4000}
source "$(dirname "$0")/lib.sh"
bench_require valgrind qemu-img /usr/bin/python3
bench_workdir qcow2-instr
SOCK=$W/s.sock
qemu-img create -q -f qcow2 "$W/alloc.master" 256M
qemu-img create -q -f qcow2 -o preallocation=metadata "$W/inplace.master" 256M
qemu-io -f qcow2 -c "write -P 0x5a 0 256M" "$W/inplace.master" >/dev/null

# writes BIN WORKLOAD COUNT: the instructions the server ran.
writes() {
  local bin=$1 w=$2 count=$3
  cp "$W/$w.master" "$W/img.qcow2"
  rm -f "$SOCK" "$W/pid" "$W/cg.out"
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" \
    "$bin" serve --aio threads -w 4 -u "$SOCK" --pid-file "$W/pid" \
    "$W/img.qcow2" 2>"$W/vg.log" &
  local vg=$!
  for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.1; done
  /usr/bin/python3 - "$SOCK" "$w" "$count" <<'EOF'
import random, sys, nbd
sock, w, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD()
h.connect_unix(sock)
buf = b"\xa5" * 4096
clusters = h.get_size() // 65536
rnd = random.Random(1)
for i in range(n):
    c = rnd.randrange(clusters) if w == "inplace" else i % clusters
    h.pwrite(buf, c * 65536 + 4096 * (i % 16))
h.flush()
h.shutdown()
EOF
  kill -TERM "$(cat "$W/pid")"
  wait "$vg" || true
  sed -n 's/^summary: *//p' "$W/cg.out"
}

for w in inplace alloc; do
  for side in A B; do
    bin=$A
    [ $side = B ] && bin=$B
    base=$(writes "$bin" $w 0)
    full=$(writes "$bin" $w "$N")
    per=$(((full - base) / N))
    eval "PER_$side=$per"
    echo "$w $side: $per instructions per request ($N requests)"
  done
  awk -v a="$PER_A" -v b="$PER_B" -v w=$w \
    'BEGIN { printf "%s B/A: %.4f\n", w, b / a }'
done
