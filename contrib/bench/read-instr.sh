#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Instructions per 4k NBD read, for two blockport binaries (say, before and
# after a change to the request path): each serves a source under
# valgrind's callgrind (which counts instructions: no matter how busy the
# machine, though the server's adaptive read spin still moves the total
# by a percent or two between runs), and a client reads N requests one
# after another.  The count of a run with no requests is taken away, so what is
# left is the cost of the requests alone, for three sources:
#   null    null: (the core and the server, no I/O)
#   raw     a raw file
#   qcow2   a fully allocated qcow2 image
# Worker threads (--aio threads): valgrind does not run io_uring.
# CALLGRIND_ARGS=--toggle-collect=bd_submit counts the core path alone
# (what runs under bd_submit()), which does not vary from run to run.
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
  # shellcheck disable=SC2046 # the source is words on purpose
  callgrind_serve "$bin" -r --aio threads -w 4 $(source_of "$kind")
  /usr/bin/python3 - "$W/s.sock" "$count" <<'EOF'
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
  callgrind_total
}

for kind in null raw qcow2; do
  instr_ab "$A" "$B" "$kind" "$N" reads "$kind"
done
