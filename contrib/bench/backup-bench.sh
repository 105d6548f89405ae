#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# What backing up a live image costs, measured side by side and
# alternating round by round (the order of the sides reversed every other
# round) on one fully allocated 1 GiB qcow2 of random data, recreated
# from a master copy before every run.
#
# Writes: fio's nbd engine, 4k random writes, iodepth 64, one connection,
# SECONDS per run, against
#   plain    blockport serve IMG
#   bitmap   the same with an enabled persistent bitmap b0 (qemu-img bitmap
#            --add, 64 KiB granularity) that every write sets bits in
#   ctl      blockport serve --control CTL --fleece-dir W IMG, no checkpoint
#            (the live filter passes every request through)
#   view     the same, `blockport ctl CTL checkpoint c1` right before fio
#            starts: the first write to each 64 KiB granule copies it into
#            the fleece first (1 GiB = 16,384 granules)
#   qsd      qemu-storage-daemon, the image's qcow2 node exported as is
#   qsd-cbw  qemu-storage-daemon set up for fleecing as QEMU's
#            docs/interop/bitmaps.rst and block/copy-before-write.c say,
#            all on the command line:
#              file     driver=file, aio=threads, cache.direct=off (the
#                       page cache, as blockport's default writeback)
#              disk     driver=qcow2 over it
#              ffile    driver=file, a fresh empty 1 GiB qcow2 in W, the
#                       same aio and cache
#              fleece   driver=qcow2 over it (64 KiB clusters: the filter
#                       copies 64 KiB granules, as blockport does)
#              cbw      driver=copy-before-write, file=disk, target=fleece,
#                       on-cbw-error=break-snapshot
#              snap     driver=snapshot-access, file=cbw
#            and the NBD exports "" = cbw (writable: fio writes it) and
#            "snap" = snap (read-only: the backup reader's).  The snapshot
#            is the image at the instant the filter is made, which is
#            right before fio starts, as for `view`.
# Round 1 checks that both frozen views still read as the master image
# after the run (qemu-img compare), so both really copied before writing.
#
# Reads: on a fresh server, checkpoint c1 (qsd: the snapshot above), then
# 10% of the image rewritten through the live export (1,638 distinct
# 64 KiB granules, fio randwrite bs=64k), so a tenth of the view reads
# from the fleece; then `nbdcopy URI null:` (its defaults: 4 connections
# when the server offers multi-conn, as both do, 64 requests of 256 KiB)
# of the whole view and of the whole live export, alternating, READS
# times each; MiB/s of each copy.
#
# Per run also the server's CPU seconds (user + system, /proc/PID/stat).
#
# usage: contrib/bench/backup-bench.sh [SECONDS] [ROUNDS] [BLOCKPORT]
#        (READS=N in the environment: copies per export per round, 3)
# Prints IOPS (and MiB/s) per run, then the medians, and the ratios
# round by round with their medians.
# The default (10 s, 3 rounds) takes about 4 minutes.
set -euo pipefail
RT=${1:-10}
ROUNDS=${2:-3}
BP=$(readlink -f "${3:-$(dirname "$0")/../../build/blockport}")
READS=${READS:-3}
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-img qemu-storage-daemon nbdcopy
bench_workdir backup-bench
SOCK=$W/s.sock
CTL=$W/c.sock
IMG=$W/img.qcow2
URI="nbd+unix:///?socket=$SOCK"
random_disk "$W/base.raw" 1024
qemu-img convert -f raw -O qcow2 "$W/base.raw" "$W/master.qcow2"
rm -f "$W/base.raw"
fio_job "$W/write.fio" ioengine=nbd "uri=$URI" rw=randwrite
# 1,638 of the 16,384 granules, each once (fio's random map).
fio_job "$W/dirty.fio" ioengine=nbd "uri=$URI" rw=randwrite bs=64k \
  iodepth=16 time_based=0 number_ios=1638
DIRTY=$((1638 << 16))

# cpu PID: user + system seconds of PID so far.
cpu() {
  awk -v t="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / t}' \
    "/proc/$1/stat"
}

fresh_image() {
  cp "$W/master.qcow2" "$IMG"
}

# qsd_start: qemu-storage-daemon in front of IMG, set up for fleecing
# (CBW=1) or not.
# shellcheck disable=SC2054 # the commas are QEMU's option syntax
qsd_start() {
  local args=(
    --blockdev "driver=file,node-name=file,filename=$IMG,aio=threads,cache.direct=off"
    --blockdev driver=qcow2,node-name=disk,file=file
    --nbd-server "addr.type=unix,addr.path=$SOCK"
  )
  if [ "${CBW:-0}" = 1 ]; then
    rm -f "$W/fleece.qcow2"
    qemu-img create -q -f qcow2 "$W/fleece.qcow2" 1G
    args+=(
      --blockdev "driver=file,node-name=ffile,filename=$W/fleece.qcow2,aio=threads,cache.direct=off"
      --blockdev driver=qcow2,node-name=fleece,file=ffile
      --blockdev driver=copy-before-write,node-name=cbw,file=disk,target=fleece,on-cbw-error=break-snapshot
      --blockdev driver=snapshot-access,node-name=snap,file=cbw
      --export type=nbd,id=live,node-name=cbw,name=,writable=on
      --export type=nbd,id=view,node-name=snap,name=snap,writable=off
    )
  else
    args+=(--export type=nbd,id=live,node-name=disk,name=,writable=on)
  fi
  start_server "$SOCK" qemu-storage-daemon "${args[@]}"
}

# bp_start: blockport serve with a control socket.
bp_start() {
  start_server "$SOCK" "$BP" serve --unix "$SOCK" --control "$CTL" \
    --fleece-dir "$W" "$IMG"
}

# checkpoint: take c1 and check the answer.
checkpoint() {
  "$BP" ctl "$CTL" checkpoint c1 | grep -q '"ok":true' ||
    { echo "checkpoint failed" >&2; exit 1; }
}

# view_ok: c1 is not broken; its fleece bytes in FLEECE.
view_ok() {
  local l
  l=$("$BP" ctl "$CTL" list)
  grep -q '"broken":false' <<<"$l" || { echo "view broken: $l" >&2; exit 1; }
  FLEECE=$(grep -o '"fleece-bytes":[0-9]*' <<<"$l" | head -n 1 | cut -d: -f2)
}

# same_as_master EXPORT: the export reads as the master image.
same_as_master() {
  qemu-img compare -q -f raw -F qcow2 \
    "nbd+unix:///$1?socket=$SOCK" "$W/master.qcow2" ||
    { echo "export '$1' differs from the image it froze" >&2; exit 1; }
}

# write_run SIDE ROUND: one fio run of the write workload.
write_run() {
  local side=$1 round=$2 note=""
  fresh_image
  case $side in
  plain) start_server "$SOCK" "$BP" serve --unix "$SOCK" "$IMG" ;;
  bitmap)
    qemu-img bitmap --add "$IMG" b0
    start_server "$SOCK" "$BP" serve --unix "$SOCK" "$IMG"
    ;;
  ctl) bp_start ;;
  view) bp_start && checkpoint ;;
  qsd) qsd_start ;;
  qsd-cbw) CBW=1 qsd_start ;;
  esac
  fio_run "$W/write.fio"
  local c
  c=$(cpu "$SERVER_PID")
  if [ "$side" = view ]; then
    view_ok
    note="fleece $((FLEECE >> 20)) MiB"
    [ "$round" = 1 ] && same_as_master @c1
  elif [ "$side" = qsd-cbw ] && [ "$round" = 1 ]; then
    same_as_master snap
  fi
  stop_server
  if [ "$side" = bitmap ]; then
    # b0 was kept, recording, and is consistent (not in use) afterwards.
    qemu-img info "$IMG" | grep -q "in-use" &&
      { echo "bitmap left in use" >&2; exit 1; }
  fi
  RUNS[$side]+="$FIO_IOPS "
  CPUS[$side]+="$c "
  R[$side,$round]=$FIO_IOPS
  # writes per ms of server CPU: steadier than IOPS on a shared machine
  E[$side,$round]=$(awk -v n="$FIO_IOPS" -v t="$RT" -v c="$c" \
    'BEGIN { printf "%.1f", n * t / 1000 / c }')
  printf '%s %-8s %9s IOPS  cpu %5s s  %s\n' "$round" "$side" "$FIO_IOPS" "$c" "$note"
}

# copy_mibs EXPORT: MiB/s of one nbdcopy of the whole export to null:.
copy_mibs() {
  local t0 t1
  t0=$(date +%s.%N)
  nbdcopy "nbd+unix:///$1?socket=$SOCK" null:
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", 1024 / (b - a) }'
}

# read_round SERVER ROUND: blockport or qsd, a view with 10% of the image
# rewritten since, then the view and the live export read alternately.
read_round() {
  local srv=$1 round=$2 view i m a b
  fresh_image
  if [ "$srv" = bp ]; then
    bp_start && checkpoint
    view=@c1
  else
    CBW=1 qsd_start
    view=snap
  fi
  fio --output-format=terse "$W/dirty.fio" >/dev/null
  if [ "$srv" = bp ]; then
    view_ok
    [ "$FLEECE" = "$DIRTY" ] ||
      { echo "fleece $FLEECE bytes, not $DIRTY" >&2; exit 1; }
  fi
  a=$srv-view b=$srv-live
  ((round % 2)) || { a=$srv-live b=$srv-view; }
  for i in $(seq "$READS"); do
    for s in $a $b; do
      if [ "$s" = "$srv-view" ]; then m=$(copy_mibs "$view"); else m=$(copy_mibs ""); fi
      RUNS[$s]+="$m "
      R[$s,$round]+="$m "
      printf '%s %-8s %9s MiB/s\n' "$round" "$s" "$m"
    done
  done
  stop_server
}

SIDES=(plain bitmap ctl view qsd qsd-cbw)
declare -A RUNS CPUS R E
for round in $(seq "$ROUNDS"); do
  order=("${SIDES[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((i = ${#SIDES[@]} - 1; i >= 0; i--)); do order+=("${SIDES[i]}"); done
  fi
  for side in "${order[@]}"; do write_run "$side" "$round"; done
  if ((round % 2)); then
    read_round bp "$round"
    read_round qsd "$round"
  else
    read_round qsd "$round"
    read_round bp "$round"
  fi
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {
  print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
declare -A M
echo
for side in "${SIDES[@]}"; do
  M[$side]=$(median <<<"${RUNS[$side]}")
  printf '%-8s median %9s IOPS  cpu %5s s\n' "$side" "${M[$side]}" \
    "$(median <<<"${CPUS[$side]}")"
done
for side in bp-live bp-view qsd-live qsd-view; do
  M[$side]=$(median <<<"${RUNS[$side]}")
  printf '%-8s median %9s MiB/s\n' "$side" "${M[$side]}"
done

# Ratios within each round (its sides ran within a minute of each other,
# so a load that comes and goes between rounds cancels), then their
# median; for writes also the same ratio of writes per ms of server CPU.
echo
printf '%-40s %-6s %-28s %s\n' ratio median rounds "per server CPU ms (median)"
r() {
  local a=$2 b=$3 k va vb q=() e=()
  for k in $(seq "$ROUNDS"); do
    va=$(median <<<"${R[$a,$k]}") vb=$(median <<<"${R[$b,$k]}")
    q+=("$(ratio "$va" "$vb")")
    [ -z "${E[$a,$k]:-}" ] || e+=("$(ratio "${E[$a,$k]}" "${E[$b,$k]}")")
  done
  printf '%-40s %-6.2f %-28s %4s%s\n' "$1" "$(median <<<"${q[*]}")" "${q[*]}" \
    "$( ((${#e[@]})) && printf '%.2f' "$(median <<<"${e[*]}")")" "${4:-}"
}
r "bitmap / plain (4k randwrite)" bitmap plain "  (target >= 0.97)"
r "view / ctl (checkpoint open)" view ctl "  (target >= 0.7)"
r "ctl / plain (live filter passthrough)" ctl plain
r "view / qsd-cbw (view open)" view qsd-cbw "  (target >= 1)"
r "qsd-cbw / qsd (qsd's own fleecing)" qsd-cbw qsd
r "plain / qsd (no view)" plain qsd
r "bp-view / bp-live (nbdcopy MiB/s)" bp-view bp-live "  (target >= 0.8)"
r "qsd-view / qsd-live (nbdcopy MiB/s)" qsd-view qsd-live
r "bp-view / qsd-view (nbdcopy MiB/s)" bp-view qsd-view
