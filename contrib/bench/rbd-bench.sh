#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# One Ceph RBD image put on the network (issue 15): blockport serve
# (fio's nbd engine) against qemu-nbd with QEMU's rbd driver (the same
# engine), and fio's rbd engine straight on librbd, which is the limit.
#
# The cluster: contrib/ceph-cluster.sh on this host (one monitor, one
# memstore OSD), a 1 GiB image filled with random data first (reads of
# objects never written would cost the OSD nothing).  The workload:
# 4k random 75/25 read/write, total iodepth 64, RT seconds:
#   1 conn   one fio job, iodepth 64: one NBD connection
#   4 conns  four fio jobs, iodepth 16 each: four NBD connections to the
#            one server (multi-conn).  The rbd engine runs one job at
#            iodepth 64 in both rows: four librbd clients on one image
#            would pass its exclusive lock back and forth.
# The servers alternate ROUNDS times; then means and ratios, and the
# largest resident set of the blockport process (VmHWM).  This cluster's
# speed drifts by tens of per cent within minutes, so the ratios are also
# taken round by round, between runs minutes apart, and their median
# printed: a slow round then moves every server of that round alike.
#
# RBD_BENCH_PIN=1 gives the cluster's daemons CPU 0 and everything else
# (fio, the servers) the other CPUs: a gateway whose OSDs run elsewhere,
# as in a deployment, rather than one that takes CPU from its own OSD.
#
# usage: contrib/bench/rbd-bench.sh [ROUNDS] [SECONDS] [BLOCKPORT]
set -euo pipefail
ROUNDS=${1:-3}
RT=${2:-10}
BP=${3:-$(dirname "$0")/../../build/blockport}
BP=$(readlink -f "$BP")
CLUSTER=$(readlink -f "$(dirname "$0")/../ceph-cluster.sh")
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-nbd qemu-img rbd ceph-mon ceph-osd
bench_workdir rbd-bench
bench_cleanup_hook() { "$CLUSTER" stop "$W/ceph" >/dev/null 2>&1; }

"$CLUSTER" start "$W/ceph" --store memstore >/dev/null
NCPU=$(nproc)
PLACEMENT="shared CPUs"
if [ "${RBD_BENCH_PIN:-0}" = 1 ]; then
  ((NCPU >= 2)) || {
    echo "RBD_BENCH_PIN needs 2 CPUs" >&2
    exit 1
  }
  for d in mon.a osd.0; do
    taskset -a -p -c 0 "$(<"$W/ceph/run/$d.pid")" >/dev/null
  done
  taskset -p -c "1-$((NCPU - 1))" $$ >/dev/null # inherited from here on
  PLACEMENT="daemons on CPU 0, the rest on 1-$((NCPU - 1))"
fi
export CEPH_CONF=$W/ceph/ceph.conf
IMG=bench
SPEC=rbd:rbd/$IMG
random_disk "$W/fill.raw" 1024
rbd import --no-progress "$W/fill.raw" "rbd/$IMG"
rm -f "$W/fill.raw"

SOCK=$W/nbd.sock
URI="nbd+unix:///?socket=$SOCK"
fio_job "$W/nbd-1.fio" ioengine=nbd "uri=$URI"
fio_job "$W/nbd-4.fio" ioengine=nbd "uri=$URI" numjobs=4 iodepth=16 \
  group_reporting=1
fio_job "$W/rbd.fio" ioengine=rbd pool=rbd "rbdname=$IMG" clientname=admin

SERVERS=(blockport qemu-nbd fio-rbd)
CONNS=(1 4)
declare -A SUM IOPS
for s in "${SERVERS[@]}"; do for c in "${CONNS[@]}"; do SUM[$s,$c]=0; done; done
HWM=0

# The largest resident set so far of process $1, in KiB.
hwm() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

one() {
  local s=$1 c=$2
  case $s in
    blockport)
      start_server "$SOCK" "$BP" serve --unix "$SOCK" "$SPEC"
      fio_run "$W/nbd-$c.fio"
      local m
      m=$(hwm "$SERVER_PID")
      ((m > HWM)) && HWM=$m
      stop_server ;;
    qemu-nbd)
      start_server "$SOCK" qemu-nbd -k "$SOCK" -f raw -t -e 16 --cache=writeback \
        "$SPEC"
      fio_run "$W/nbd-$c.fio"
      stop_server ;;
    fio-rbd) fio_run "$W/rbd.fio" ;;
  esac
  SUM[$s,$c]=$((SUM[$s,$c] + FIO_IOPS))
  IOPS[$s,$c,$r]=$FIO_IOPS
  printf 'round %d %-10s %d conn %8s IOPS\n' "$r" "$s" "$c" "$FIO_IOPS"
}

echo "blockport: $BP ($("$BP" --version)); $(qemu-nbd --version | head -1)"
echo "$(rbd --version); $NCPU CPUs ($PLACEMENT); $ROUNDS rounds; $RT s per run"
for r in $(seq "$ROUNDS"); do
  for c in "${CONNS[@]}"; do
    # Rotate who goes first, so nobody always runs on a warmer cluster.
    case $((r % 3)) in
      1) order=(blockport qemu-nbd fio-rbd) ;;
      2) order=(qemu-nbd fio-rbd blockport) ;;
      0) order=(fio-rbd blockport qemu-nbd) ;;
    esac
    for s in "${order[@]}"; do one "$s" "$c"; done
  done
done

echo
printf '%-8s %10s %10s %10s %12s %12s\n' conns blockport qemu-nbd fio-rbd \
  "bp/qemu-nbd" "bp/fio-rbd"
for c in "${CONNS[@]}"; do
  printf '%-8s %10d %10d %10d %12s %12s\n' "$c" $((SUM[blockport,$c] / ROUNDS)) \
    $((SUM[qemu-nbd,$c] / ROUNDS)) $((SUM[fio-rbd,$c] / ROUNDS)) \
    "$(ratio "${SUM[blockport,$c]}" "${SUM[qemu-nbd,$c]}")" \
    "$(ratio "${SUM[blockport,$c]}" "${SUM[fio-rbd,$c]}")"
done

# The ratio of $1 to $2 at $3 connections in each round, then their median.
per_round() {
  local r list=()
  for r in $(seq "$ROUNDS"); do
    list+=("$(ratio "${IOPS[$1,$3,$r]}" "${IOPS[$2,$3,$r]}")")
  done
  printf '%s ' "${list[@]}"
  printf '%s\n' "${list[@]}" | sort -n |
    awk '{v[NR] = $1} END {
      m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "(median %.2f)", m }'
}
echo "round by round:"
for c in "${CONNS[@]}"; do
  echo "  $c conn bp/qemu-nbd $(per_round blockport qemu-nbd "$c")"
  echo "  $c conn bp/fio-rbd  $(per_round blockport fio-rbd "$c")"
done
echo "blockport serve: largest resident set $((HWM / 1024)) MiB"
