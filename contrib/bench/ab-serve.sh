#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Two blockport binaries (before and after a change) serving the same
# file, run alternately, so that a change on the request path is told
# from the machine's noise: ROUNDS rounds of the origin workload (4k
# random read/write 75/25, iodepth 64, fio's nbd engine, one connection)
# against each, then both means and their ratio.
#
# usage: contrib/bench/ab-serve.sh OLD NEW [ROUNDS] [SECONDS] [SERVE-ARGS...]
# SERVE-ARGS go before the image (for example --format raw); the image is
# a 1 GiB random raw file (or qcow2 with AB_FORMAT=qcow2), in the page cache.
set -euo pipefail
OLD=$(readlink -f "$1")
NEW=$(readlink -f "$2")
ROUNDS=${3:-3}
RT=${4:-6}
shift $(($# < 4 ? $# : 4))
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-img
bench_workdir ab-serve
IMG=$W/disk.raw
random_disk "$IMG" 1024
if [ "${AB_FORMAT:-raw}" = qcow2 ]; then
  qemu-img convert -O qcow2 "$IMG" "$W/disk.qcow2"
  IMG=$W/disk.qcow2
fi
SOCK=$W/s.sock
fio_job "$W/job.fio" ioengine=nbd "uri=nbd+unix:///?socket=$SOCK"

declare -A SUM=([old]=0 [new]=0)
for r in $(seq "$ROUNDS"); do
  for which in old new; do
    bin=$OLD
    [ $which = new ] && bin=$NEW
    start_server "$SOCK" "$bin" serve --unix "$SOCK" "$@" "$IMG"
    fio_run "$W/job.fio"
    stop_server
    SUM[$which]=$((SUM[$which] + FIO_IOPS))
    printf 'round %d %-4s %9s IOPS\n' "$r" "$which" "$FIO_IOPS"
  done
done
printf 'mean old %d, new %d IOPS; new / old %s\n' $((SUM[old] / ROUNDS)) \
  $((SUM[new] / ROUNDS)) "$(ratio "${SUM[new]}" "${SUM[old]}")"
