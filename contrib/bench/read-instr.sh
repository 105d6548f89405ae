#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Instructions per 4k NBD read, for two blockport binaries (say, before and
# after a change to the request path): each serves a source under
# valgrind's callgrind (which counts instructions, the same count on a
# busy or a quiet machine), and a client reads N requests one after
# another.  The count of a run with no requests is taken away, so what is
# left is the cost of the requests alone, for three sources:
#   null    null: (the core and the server, no I/O)
#   raw     a raw file
#   qcow2   a fully allocated qcow2 image
# Worker threads (--aio threads): valgrind does not run io_uring.
#
# usage: contrib/bench/read-instr.sh BLOCKPORT-A BLOCKPORT-B [N]
# Prints instructions per read for each, and B/A.
set -euo pipefail
A=$(readlink -f "$1")
B=$(readlink -f "$2")
N=${3:-4000}
source "$(dirname "$0")/lib.sh"
bench_require valgrind qemu-img qemu-io /usr/bin/python3
bench_workdir read-instr
SOCK=$W/s.sock
qemu-img create -q -f raw "$W/img.raw" 64M
qemu-io -f raw -c "write -P 0x5a 0 64M" "$W/img.raw" >/dev/null
qemu-img create -q -f qcow2 -o preallocation=metadata "$W/img.qcow2" 64M
qemu-io -f qcow2 -c "write -P 0x5a 0 64M" "$W/img.qcow2" >/dev/null

# source_of KIND: what blockport serves.
source_of() {
  case $1 in
  null) echo "null:64M" ;;
  raw) echo "--format raw $W/img.raw" ;;
  qcow2) echo "$W/img.qcow2" ;;
  esac
}

# reads BIN KIND COUNT: the instructions the server ran.
reads() {
  local bin=$1 kind=$2 count=$3
  rm -f "$SOCK" "$W/pid" "$W/cg.out"
  # shellcheck disable=SC2046 # the source is words on purpose
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" \
    "$bin" serve -r --aio threads -w 4 -u "$SOCK" --pid-file "$W/pid" \
    $(source_of "$kind") 2>"$W/vg.log" &
  local vg=$!
  for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.1; done
  /usr/bin/python3 - "$SOCK" "$count" <<'EOF'
import random, sys, nbd
sock, n = sys.argv[1], int(sys.argv[2])
h = nbd.NBD()
h.connect_unix(sock)
blocks = h.get_size() // 4096
rnd = random.Random(1)
for i in range(n):
    h.pread(4096, rnd.randrange(blocks) * 4096)
h.shutdown()
EOF
  kill -TERM "$(cat "$W/pid")"
  wait "$vg" || true
  sed -n 's/^summary: *//p' "$W/cg.out"
}

for kind in null raw qcow2; do
  for side in A B; do
    bin=$A
    [ $side = B ] && bin=$B
    base=$(reads "$bin" $kind 0)
    full=$(reads "$bin" $kind "$N")
    per=$(((full - base) / N))
    eval "PER_$side=$per"
    echo "$kind $side: $per instructions per read ($N reads)"
  done
  awk -v a="$PER_A" -v b="$PER_B" -v k=$kind \
    'BEGIN { printf "%s B/A: %.4f\n", k, b / a }'
done
