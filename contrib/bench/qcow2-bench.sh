#!/bin/bash
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
W=$(mktemp -d /tmp/qcow2-bench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"
qemu-img create -f raw "$W/base.raw" 1G >/dev/null
dd if=/dev/urandom of="$W/base.raw" bs=1M count=1024 conv=notrunc status=none
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

jobfile() {
  local rw=randrw
  [ "$1" = empty ] || [ "$1" = extl2 ] && rw=randwrite
  cat >"$W/job.fio" <<J
[global]
ioengine=nbd
uri=$URI
rw=$rw
rwmixread=75
bs=4k
iodepth=64
time_based=1
runtime=$RT
size=1G
randrepeat=1
gtod_reduce=1
[t]
J
}

declare -A IOPS
measure() { # name workload cmd...
  local name=$1 w=$2; shift 2
  rm -f "$SOCK"
  "$@" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
  jobfile "$w"
  IOPS[$name,$w]=$(fio --output-format=terse --terse-version=3 "$W/job.fio" 2>/dev/null |
    tail -n 1 | awk -F';' '{print $8+$49}')
  kill $pid; wait $pid 2>/dev/null || true
  printf '%-14s %-8s %9s IOPS\n' "$name" "$w" "${IOPS[$name,$w]}"
}

echo "blockport: $BP; $(nproc) CPUs; $RT s per run"
for w in alloc empty overlay extl2; do
  img=$(make_image $w); measure blockport $w "$BP" serve --unix "$SOCK" "$img"
  img=$(make_image $w); measure qemu-nbd $w qemu-nbd -k "$SOCK" -f qcow2 -t -e 16 "$img"
done
measure blockport raw "$BP" serve --unix "$SOCK" "$W/base.raw"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "n/a" }'; }
echo
echo "alloc:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,alloc]}" "${IOPS[qemu-nbd,alloc]}") (target 2.5)"
echo "alloc:   blockport qcow2 / blockport raw = $(ratio "${IOPS[blockport,alloc]}" "${IOPS[blockport,raw]}") (target 0.85)"
echo "empty:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,empty]}" "${IOPS[qemu-nbd,empty]}") (target 2)"
echo "overlay: blockport / qemu-nbd = $(ratio "${IOPS[blockport,overlay]}" "${IOPS[qemu-nbd,overlay]}")"
echo "extl2:   blockport / qemu-nbd = $(ratio "${IOPS[blockport,extl2]}" "${IOPS[qemu-nbd,extl2]}")"
