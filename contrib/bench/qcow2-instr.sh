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
qemu-img create -q -f qcow2 "$W/alloc.master" 256M
qemu-img create -q -f qcow2 -o preallocation=metadata "$W/inplace.master" 256M
qemu-io -f qcow2 -c "write -P 0x5a 0 256M" "$W/inplace.master" >/dev/null

# writes BIN WORKLOAD COUNT: the instructions the server ran.
writes() {
  local bin=$1 w=$2 count=$3
  cp "$W/$w.master" "$W/img.qcow2"
  callgrind_serve "$bin" --aio threads -w 4 "$W/img.qcow2"
  /usr/bin/python3 - "$W/s.sock" "$w" "$count" <<'EOF'
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
  callgrind_total
}

for w in inplace alloc; do
  instr_ab "$A" "$B" "$w" "$N" writes "$w"
done
