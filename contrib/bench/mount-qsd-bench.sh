#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount against qemu-storage-daemon's FUSE export on the same
# local image (issue 33): a 1 GiB fully allocated qcow2 and a 1 GiB raw
# file, both of random data, each mounted by one tool at a time.
#
#   blockport mount IMAGE DIR (its defaults: page cache, io_uring or threads)
#   qemu-storage-daemon --blockdev file,aio=threads,cache.direct=off
#     [--blockdev qcow2] --export fuse,writable=on
#
# Workloads (fio, libaio, O_DIRECT on the mounted file, one job):
#   randrw32  4k random read/write 75/25, iodepth 32
#   randrw1   the same at iodepth 1 (the latency path)
#   seqread   1 MiB sequential read, iodepth 8
#   seqwrite  1 MiB sequential write, iodepth 8
# Each round mounts both tools in turn, the order swapped every round.
# Besides IOPS it prints the CPU time the mount process spent per request
# (utime + stime from /proc/PID/stat over the run) and its context
# switches per request (every thread's, from /proc/PID/task/*/status).
#
# usage: contrib/bench/mount-qsd-bench.sh [SECONDS-PER-RUN] [ROUNDS] [BLOCKPORT]
# Needs root (FUSE mounts, O_DIRECT on FUSE files).  BP_MOUNT_OPTS adds
# options to blockport mount; FORMATS and WORKLOADS pick a subset.
set -euo pipefail
RT=${1:-10}
ROUNDS=${2:-2}
BP=$(readlink -f "${3:-$(dirname "$0")/../../build/blockport}")
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-storage-daemon qemu-img fusermount3
bench_workdir mount-qsd-bench
MNT=$W/mnt
bench_cleanup_hook() {
  grep -qs " $MNT fuse" /proc/mounts && fusermount3 -u -z "$MNT"
  grep -qs " $W/q.img fuse" /proc/mounts && fusermount3 -u -z "$W/q.img"
  for p in "$W"/*.pid; do [ -s "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  sleep 0.5
}
read -ra FORMATS <<<"${FORMATS:-qcow2 raw}"
read -ra WORKLOADS <<<"${WORKLOADS:-randrw32 randrw1 seqread seqwrite}"
TOOLS=(blockport qsd)

random_disk "$W/disk.raw" 1024
qemu-img convert -f raw -O qcow2 "$W/disk.raw" "$W/disk.qcow2"
for w in "${WORKLOADS[@]}"; do
  case $w in
    randrw32) fio_job "$W/$w.fio" ioengine=libaio direct=1 iodepth=32 ;;
    randrw1) fio_job "$W/$w.fio" ioengine=libaio direct=1 iodepth=1 ;;
    seqread) fio_job "$W/$w.fio" ioengine=libaio direct=1 rw=read bs=1M iodepth=8 ;;
    seqwrite) fio_job "$W/$w.fio" ioengine=libaio direct=1 rw=write bs=1M iodepth=8 ;;
    *) echo "unknown workload $w" >&2; exit 1 ;;
  esac
done

# mount_as TOOL FORMAT: sets FILE (the mounted disk), PID and PIDFILE.
mount_as() {
  local img=$W/disk.$2
  case $1 in
    blockport)
      mkdir -p "$MNT"
      # shellcheck disable=SC2086 # options, split on purpose
      "$BP" mount ${BP_MOUNT_OPTS:-} -f "$2" --name disk --log-file "$W/bp.log" \
        -P "$W/bp.pid" "$img" "$MNT"
      wait_mount "$MNT"
      FILE=$MNT/disk PIDFILE=$W/bp.pid ;;
    qsd)
      : >"$W/q.img"
      local dev=(--blockdev "driver=file,node-name=f0,filename=$img,aio=threads,cache.direct=off")
      [ "$2" = qcow2 ] && dev+=(--blockdev "driver=qcow2,node-name=d0,file=f0") ||
        dev+=(--blockdev "driver=raw,node-name=d0,file=f0")
      qemu-storage-daemon "${dev[@]}" --daemonize --pidfile "$W/qsd.pid" \
        --export "type=fuse,id=e0,node-name=d0,mountpoint=$W/q.img,writable=on" \
        2>"$W/qsd.log"
      wait_mount "$W/q.img"
      FILE=$W/q.img PIDFILE=$W/qsd.pid ;;
  esac
  PID=$(cat "$PIDFILE")
}

unmount() { # TOOL
  # qemu-storage-daemon stays after its export is unmounted: stop it,
  # which unmounts.
  case $1 in
    qsd) kill "$PID" ;;
    blockport) fusermount3 -u "$MNT" ;;
  esac
  local _
  for _ in $(seq 200); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.05
  done
  rm -f "$PIDFILE"
}

cpu_ticks() { # PID: utime + stime, all threads
  awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}
thread_ticks() { # PID: "NAME TICKS" per thread, digits dropped from names
  local f line
  for f in /proc/"$1"/task/*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    awk '{ n = $0; sub(/^[0-9]+ \(/, "", n); sub(/\) .*/, "", n); gsub(/[0-9]+/, "", n)
           sub(/.*\) /, ""); print n, $12 + $13 }' <<<"$line"
  done
}
ctx_switches() { # PID: voluntary + involuntary, summed over its threads
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'
}

declare -A IOPS MIBS TICKS CTX IOS THREADS
measure() { # TOOL FORMAT WORKLOAD: sums over rounds
  local k=$1,$2,$3 t0 c0 out th0 name n
  t0=$(cpu_ticks "$PID") c0=$(ctx_switches "$PID") th0=$(thread_ticks "$PID")
  out=$(fio --output-format=terse --terse-version=3 --filename="$FILE" \
    "$W/$3.fio" 2>/dev/null | tail -n 1)
  TICKS[$k]=$(( ${TICKS[$k]:-0} + $(cpu_ticks "$PID") - t0 ))
  CTX[$k]=$(( ${CTX[$k]:-0} + $(ctx_switches "$PID") - c0 ))
  # terse v3: 7/8/9 read KiB/s, IOPS, ms; 48/49/50 the same for writes
  IOPS[$k]=$(( ${IOPS[$k]:-0} + $(awk -F';' '{print $8 + $49}' <<<"$out") ))
  MIBS[$k]=$(( ${MIBS[$k]:-0} + $(awk -F';' '{printf "%.0f", ($7 + $48) / 1024}' <<<"$out") ))
  IOS[$k]=$(( ${IOS[$k]:-0} + $(awk -F';' '{printf "%.0f", ($8 * $9 + $49 * $50) / 1000}' <<<"$out") ))
  # Per thread name: ticks now less ticks before (threads that ended
  # during the run are lost, ones born during it count whole).
  while read -r name n; do
    THREADS[$k,$name]=$(( ${THREADS[$k,$name]:-0} + n ))
  done < <({ sed 's/$/ -/' <<<"$th0"; thread_ticks "$PID"; } |
    awk '$3 == "-" { before[$1] += $2; next } { after[$1] += $2 }
         END { for (n in after) print n, after[n] - before[n] }')
}

echo "blockport: $BP ($("$BP" --version | head -n 1)); $(nproc) CPUs; $RT s per run, $ROUNDS rounds"
echo "blockport mount options: ${BP_MOUNT_OPTS:-(defaults)}"
HZ=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
  order=("${TOOLS[@]}")
  ((r % 2 == 0)) && order=("${TOOLS[1]}" "${TOOLS[0]}")
  for f in "${FORMATS[@]}"; do
    for t in "${order[@]}"; do
      mount_as "$t" "$f"
      for w in "${WORKLOADS[@]}"; do measure "$t" "$f" "$w"; done
      unmount "$t"
    done
  done
  echo "round $r done"
done

# us_per_io TOOL,FORMAT,WORKLOAD: CPU microseconds per request
us_per_io() {
  awk -v t="${TICKS[$1]}" -v n="${IOS[$1]}" -v hz="$HZ" \
    'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / hz / n; else print "n/a" }'
}
ctx_per_io() {
  awk -v c="${CTX[$1]}" -v n="${IOS[$1]}" \
    'BEGIN { if (n > 0) printf "%.2f", c / n; else print "n/a" }'
}
printf '\n%-6s %-9s %10s %10s %6s %9s %9s %8s %8s\n' format workload \
  "bp IOPS" "qsd IOPS" ratio "bp us/io" "qsd us/io" "bp cs/io" "qsd cs/io"
for f in "${FORMATS[@]}"; do
  for w in "${WORKLOADS[@]}"; do
    b=blockport,$f,$w q=qsd,$f,$w
    unit=IOPS
    [[ $w == seq* ]] && unit=MiB/s
    if [[ $unit == IOPS ]]; then bv=$((IOPS[$b] / ROUNDS)) qv=$((IOPS[$q] / ROUNDS))
    else bv=$((MIBS[$b] / ROUNDS)) qv=$((MIBS[$q] / ROUNDS)); fi
    printf '%-6s %-9s %10s %10s %6s %9s %9s %8s %8s\n' "$f" "$w" \
      "$bv" "$qv" "$(ratio "$bv" "$qv")" "$(us_per_io "$b")" "$(us_per_io "$q")" \
      "$(ctx_per_io "$b")" "$(ctx_per_io "$q")"
  done
done
echo "(seq rows in MiB/s; ratio = blockport / qemu-storage-daemon)"

echo
echo "CPU microseconds per request, by thread name (threads that ran):"
for f in "${FORMATS[@]}"; do
  for w in "${WORKLOADS[@]}"; do
    for t in "${TOOLS[@]}"; do
      k=$t,$f,$w
      line=""
      for key in "${!THREADS[@]}"; do
        [[ $key == "$k",* ]] || continue
        ((THREADS[$key] > 0)) || continue
        line+=" ${key#"$k",}=$(awk -v t="${THREADS[$key]}" -v n="${IOS[$k]}" -v hz="$HZ" \
          'BEGIN { printf "%.1f", t * 1e6 / hz / n }')"
      done
      printf '%-6s %-9s %-9s%s\n' "$f" "$w" "$t" "$line"
    done
  done
done
