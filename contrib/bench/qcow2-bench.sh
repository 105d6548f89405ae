#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# qcow2 under blockport serve against qemu-nbd, and against blockport raw,
# side by side in one run.  fio's nbd engine over a Unix socket, the
# project's origin workload (4k random read/write 75/25, iodepth 64):
#   alloc     a fully allocated 1 GiB qcow2 (converted from random data)
#   raw       the same data as a raw file (blockport only: the 0.85x bar)
#   empty     a freshly created 1 GiB qcow2, 4k random writes (allocation)
#   overlay   an empty qcow2 over the raw file as backing, randrw
#   extl2     the same overlay with extended L2 (64 KiB clusters, 2 KiB
#             subclusters), 4k random writes: subcluster allocation
# Each image is recreated before each server so both start from the same
# state.  qemu-nbd runs with -t -e 16 and its default cache (writeback).
#
# usage: contrib/bench/qcow2-bench.sh [SECONDS-PER-RUN] [BLOCKPORT]
set -euo pipefail
RT=${1:-10}
BP=$(readlink -f "${2:-$(dirname "$0")/../../build/blockport}")
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-nbd qemu-img
bench_workdir qcow2-bench
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"
random_disk "$W/base.raw" 1024
qemu-img convert -f raw -O qcow2 "$W/base.raw" "$W/alloc.master"

make_image() { # workload -> path of a fresh image
  case $1 in
    alloc) cp "$W/alloc.master" "$W/img.qcow2" ;;
    raw) echo "$W/base.raw"; return ;;
    empty) rm -f "$W/img.qcow2"; qemu-img create -f qcow2 "$W/img.qcow2" 1G >/dev/null ;;
    overlay) rm -f "$W/img.qcow2"
      qemu-img create -f qcow2 -b "$W/base.raw" -F raw "$W/img.qcow2" 1G >/dev/null ;;
    extl2) rm -f "$W/img.qcow2"
      qemu-img create -f qcow2 -o extended_l2=on -b "$W/base.raw" -F raw \
        "$W/img.qcow2" 1G >/dev/null ;;
  esac
  echo "$W/img.qcow2"
}

declare -A IOPS
measure() { # name workload cmd...
  local name=$1 w=$2 rw=randrw
  shift 2
  [ "$w" = empty ] || [ "$w" = extl2 ] && rw=randwrite
  fio_job "$W/job.fio" ioengine=nbd "uri=$URI" "rw=$rw"
  start_server "$SOCK" "$@"
  fio_run "$W/job.fio"
  stop_server
  IOPS[$name,$w]=$FIO_IOPS
  printf '%-14s %-8s %9s IOPS\n' "$name" "$w" "${IOPS[$name,$w]}"
}

echo "blockport: $BP; $(nproc) CPUs; $RT s per run"
for w in alloc empty overlay extl2; do
  img=$(make_image $w); measure blockport $w "$BP" serve --unix "$SOCK" "$img"
  img=$(make_image $w); measure qemu-nbd $w qemu-nbd -k "$SOCK" -f qcow2 -t -e 16 "$img"
done
measure blockport raw "$BP" serve --unix "$SOCK" "$W/base.raw"

echo
echo "alloc:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,alloc]}" "${IOPS[qemu-nbd,alloc]}") (target 2.5)"
echo "alloc:   blockport qcow2 / blockport raw = $(ratio "${IOPS[blockport,alloc]}" "${IOPS[blockport,raw]}") (target 0.85)"
echo "empty:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,empty]}" "${IOPS[qemu-nbd,empty]}") (target 2)"
echo "overlay: blockport / qemu-nbd = $(ratio "${IOPS[blockport,overlay]}" "${IOPS[qemu-nbd,overlay]}")"
echo "extl2:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,extl2]}" "${IOPS[qemu-nbd,extl2]}")"
