#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Two blockport binaries (say, before and after a change to the qcow2
# write path) on qcow2-bench.sh's workloads, interleaved so that a busy
# machine slows both alike:
#   alloc   a fully allocated 1 GiB qcow2, 4k randrw 75/25 (in-place writes)
#   empty   a fresh 1 GiB qcow2, 4k random writes (allocation)
# fio's nbd engine, iodepth 64, one connection; each image recreated
# before each run.
#
# usage: contrib/bench/qcow2-ab.sh BLOCKPORT-A BLOCKPORT-B [SECONDS] [ROUNDS]
# Prints IOPS per round, then the median of each.
set -euo pipefail
A=$(readlink -f "$1")
B=$(readlink -f "$2")
RT=${3:-10}
ROUNDS=${4:-4}
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-img
bench_workdir qcow2-ab
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"
random_disk "$W/base.raw" 1024
qemu-img convert -f raw -O qcow2 "$W/base.raw" "$W/alloc.master"

declare -A RUNS
for round in $(seq "$ROUNDS"); do
  for w in alloc empty; do
    for side in A B; do
      if [ $w = alloc ]; then
        cp "$W/alloc.master" "$W/img.qcow2"
        rw=randrw
      else
        rm -f "$W/img.qcow2"
        qemu-img create -f qcow2 "$W/img.qcow2" 1G >/dev/null
        rw=randwrite
      fi
      bin=$A
      [ $side = B ] && bin=$B
      fio_job "$W/job.fio" ioengine=nbd "uri=$URI" "rw=$rw"
      start_server "$SOCK" "$bin" serve --unix "$SOCK" "$W/img.qcow2"
      fio_run "$W/job.fio"
      stop_server
      RUNS[$w,$side]+="$FIO_IOPS "
      printf '%s %-6s %s %9s IOPS\n' "$round" "$w" "$side" "$FIO_IOPS"
    done
  done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {
  print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
echo
for w in alloc empty; do
  a=$(median <<<"${RUNS[$w,A]}")
  b=$(median <<<"${RUNS[$w,B]}")
  printf '%-6s median A %9s  B %9s  B/A %s\n' "$w" "$a" "$b" "$(ratio "$b" "$a")"
done
