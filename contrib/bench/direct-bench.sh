#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Serving with the host page cache out of the way (issue 16): blockport
# serve --cache none (--aio io_uring and --aio threads) against qemu-nbd
# --cache=none (--aio=io_uring and --aio=native) and nbdkit file
# cache=none, with fio on the file itself (direct=1, io_uring and libaio)
# as the limit the device sets, and blockport serving null:1G as the limit
# the NBD client and protocol set on this machine.
#
# The disk: a 1 GiB raw file of random data on the file system of the
# scratch directory (TMPDIR, default /tmp), and the same data as a fully
# allocated qcow2.  Caches are dropped before every run.  Workloads:
#   rand   4k random 75/25 read/write, total iodepth 64, RT seconds:
#          1 conn = one fio job at iodepth 64, 4 conns = four jobs at 16
#          (four NBD connections; four jobs on the file for fio direct)
#   seq    1 MiB sequential read, then write, iodepth 16, one connection
# For each run: IOPS (MiB/s for seq) and CPU per request in microseconds,
# of the server process (/proc/PID/stat) and of fio (time), so that a
# server that is faster only by burning more CPU shows it.
#
# usage: contrib/bench/direct-bench.sh [ROUNDS] [SECONDS] [BLOCKPORT]
set -euo pipefail
ROUNDS=${1:-1}
RT=${2:-10}
BP=${3:-$(dirname "$0")/../../build/blockport}
BP=$(readlink -f "$BP")
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-nbd qemu-img nbdkit
# fio's CPU comes from GNU time (Debian: time), not the shell keyword.
[[ -x /usr/bin/time ]] || { echo "missing /usr/bin/time (apt install time)" >&2; exit 1; }
[[ -w /proc/sys/vm/drop_caches ]] || {
  echo "needs root: caches are dropped before every run" >&2
  exit 1
}
bench_workdir direct-bench

RAW=$W/disk.raw
QCOW2=$W/disk.qcow2
random_disk "$RAW" 1024
qemu-img convert -f raw -O qcow2 "$RAW" "$QCOW2"
SOCK=$W/nbd.sock
URI="nbd+unix:///?socket=$SOCK"

# CPU seconds (user + system) PID has used so far, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
HZ=$(getconf CLK_TCK)

# job NAME WORKLOAD CONNS [KEY=VALUE...]: a fio job file $W/NAME.fio.
job() {
  local name=$1 wl=$2 conns=$3
  shift 3
  local shape=(iodepth=64)
  ((conns == 4)) && shape=(numjobs=4 iodepth=16 group_reporting=1)
  case $wl in
    rand) fio_job "$W/$name.fio" "${shape[@]}" "$@" ;;
    seqread | seqwrite)
      fio_job "$W/$name.fio" "rw=${wl#seq}" bs=1M iodepth=16 "$@" ;;
  esac
}

# measure WORKLOAD CONNS SERVER: one run; sets VAL (IOPS or MiB/s) and
# CPU (server and fio microseconds per request).
measure() {
  local wl=$1 conns=$2 s=$3 spec fmt=raw
  [[ $s == *-qcow2 ]] && fmt=qcow2
  spec=$RAW
  [[ $fmt == qcow2 ]] && spec=$QCOW2
  sync
  echo 3 >/proc/sys/vm/drop_caches
  local srv=0
  case $s in
    fio-uring) job run "$wl" "$conns" ioengine=io_uring direct=1 "filename=$RAW" ;;
    fio-libaio) job run "$wl" "$conns" ioengine=libaio direct=1 "filename=$RAW" ;;
    *)
      case $s in
        blockport-threads*) start_server "$SOCK" "$BP" serve --unix "$SOCK" \
          -f "$fmt" --cache none --aio threads "$spec" ;;
        blockport*) start_server "$SOCK" "$BP" serve --unix "$SOCK" -f "$fmt" \
          --cache none --aio io_uring "$spec" ;;
        null) start_server "$SOCK" "$BP" serve --unix "$SOCK" null:1G ;;
        qemu-uring*) start_server "$SOCK" qemu-nbd -k "$SOCK" -f "$fmt" -t -e 16 \
          --cache=none --aio=io_uring "$spec" ;;
        qemu-native*) start_server "$SOCK" qemu-nbd -k "$SOCK" -f "$fmt" -t \
          -e 16 --cache=none --aio=native "$spec" ;;
        nbdkit*) start_server "$SOCK" nbdkit -f -U "$SOCK" file "file=$spec" \
          cache=none ;;
      esac
      srv=$SERVER_PID
      job run "$wl" "$conns" ioengine=nbd "uri=$URI" ;;
  esac
  local t0=0 tf
  ((srv)) && t0=$(ticks "$srv")
  /usr/bin/time -o "$W/time" -f '%U %S' fio --output-format=terse \
    --terse-version=3 "$W/run.fio" >"$W/out" 2>/dev/null || true
  tf=$(tail -n 1 "$W/time")
  local t1=0
  ((srv)) && { t1=$(ticks "$srv"); stop_server; }
  local out
  out=$(tail -n 1 "$W/out")
  local ios mibs
  ios=$(awk -F';' -v rt="$RT" '{print ($8 + $49) * rt}' <<<"$out")
  mibs=$(awk -F';' '{printf "%.0f", ($7 + $48) / 1024}' <<<"$out")
  if [[ $wl == rand ]]; then
    VAL=$(awk -F';' '{print $8 + $49}' <<<"$out")
  else
    VAL=$mibs
  fi
  CPU=$(awk -v s=$((t1 - t0)) -v hz="$HZ" -v f="$tf" -v n="$ios" 'BEGIN {
    split(f, a, " "); if (n <= 0) { print "n/a n/a"; exit }
    printf "%.0f %.0f", s / hz * 1e6 / n, (a[1] + a[2]) * 1e6 / n }')
}

declare -A SUM CPUS
run_row() { # WORKLOAD CONNS SERVER
  measure "$@"
  local k="$1,$2,$3"
  SUM[$k]=$(( ${SUM[$k]:-0} + VAL ))
  CPUS[$k]=$CPU
  printf 'round %d %-8s %d conn %-18s %8s   cpu us/req server %s fio %s\n' \
    "$r" "$1" "$2" "$3" "$VAL" ${CPU}
}

# null: blockport serving no disk at all, the most the NBD client and the
# protocol allow on this machine.
RAND_RAW=(fio-uring fio-libaio blockport blockport-threads qemu-uring
  qemu-native nbdkit null)
RAND_QCOW2=(blockport-qcow2 blockport-threads-qcow2 qemu-uring-qcow2
  qemu-native-qcow2)
SEQ=(fio-uring blockport blockport-threads qemu-uring nbdkit)

echo "blockport: $BP ($("$BP" --version)); $(qemu-nbd --version | head -1);"
echo "$(nbdkit --version); $(fio --version); $(nproc) CPUs; scratch on" \
  "$(df --output=source,fstype "$W" | tail -n 1); $ROUNDS rounds of $RT s"
# DIRECT_BENCH_ONLY=seq: the sequential runs alone (the random table
# then reads n/a).
for r in $(seq "$ROUNDS"); do
  for c in 1 4; do
    [[ ${DIRECT_BENCH_ONLY:-} == seq ]] && break
    for s in "${RAND_RAW[@]}" "${RAND_QCOW2[@]}"; do run_row rand "$c" "$s"; done
  done
  for wl in seqread seqwrite; do
    for s in "${SEQ[@]}"; do run_row "$wl" 1 "$s"; done
  done
done

mean() { echo $(( ${SUM[$1]:-0} / ROUNDS )); }
echo
if [[ ${DIRECT_BENCH_ONLY:-} != seq ]]; then
  echo "4k random 75/25, total iodepth 64 (IOPS; cpu us per request: server/fio)"
  printf '%-20s %12s %12s\n' server "1 conn" "4 conns"
  for s in "${RAND_RAW[@]}" "${RAND_QCOW2[@]}"; do
    printf '%-20s %12s %12s   cpu %s / %s\n' "$s" "$(mean "rand,1,$s")" \
      "$(mean "rand,4,$s")" "${CPUS[rand,4,$s]% *}" "${CPUS[rand,4,$s]#* }"
  done
  echo
  for c in 1 4; do
    lim=$(mean "rand,$c,fio-uring")
    printf '%d conn: blockport/fio-uring %s, blockport/qemu-nbd(io_uring) %s,' \
      "$c" "$(ratio "$(mean "rand,$c,blockport")" "$lim")" \
      "$(ratio "$(mean "rand,$c,blockport")" "$(mean "rand,$c,qemu-uring")")"
    printf ' blockport/qemu-nbd(native) %s, qcow2: blockport/qemu-nbd(io_uring) %s,' \
      "$(ratio "$(mean "rand,$c,blockport")" "$(mean "rand,$c,qemu-native")")" \
      "$(ratio "$(mean "rand,$c,blockport-qcow2")" "$(mean "rand,$c,qemu-uring-qcow2")")"
    printf ' io_uring/threads %s, blockport/null %s\n' \
      "$(ratio "$(mean "rand,$c,blockport")" "$(mean "rand,$c,blockport-threads")")" \
      "$(ratio "$(mean "rand,$c,blockport")" "$(mean "rand,$c,null")")"
  done
fi
echo
echo "1 MiB sequential, iodepth 16, one connection (MiB/s)"
for wl in seqread seqwrite; do
  printf '%-9s' "$wl"
  for s in "${SEQ[@]}"; do printf ' %s %s' "$s" "$(mean "$wl,1,$s")"; done
  printf '   blockport/fio-uring %s\n' \
    "$(ratio "$(mean "$wl,1,blockport")" "$(mean "$wl,1,fio-uring")")"
done
