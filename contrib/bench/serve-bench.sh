#!/bin/bash
# blockport serve against nbdkit and qemu-nbd, side by side in one run.
#
# Workloads (fio's nbd engine over a Unix socket):
#   randrw-1c   4k random read/write 75/25, iodepth 64, 1 connection
#   randrw-4c   the same on 4 connections (4 fio jobs, iodepth 64 each)
#   seqread     1 MiB sequential read, iodepth 8
#   seqwrite    1 MiB sequential write, iodepth 8
# Servers: blockport null / nbdkit null, blockport raw / nbdkit file /
# qemu-nbd raw, all on the same 1 GiB file in the page cache.
#
# usage: contrib/bench/serve-bench.sh [SECONDS-PER-RUN] [BLOCKPORT]
# Prints IOPS and MiB/s per server and workload, then the ratios the
# project tracks.  Numbers move ±20% between runs: compare within a run.
set -euo pipefail
RT=${1:-10}
BP=${2:-$(dirname "$0")/../../build/blockport}
BP=$(readlink -f "$BP")
for t in fio nbdkit qemu-nbd qemu-img; do
  command -v $t >/dev/null || { echo "missing $t" >&2; exit 1; }
done
W=$(mktemp -d /tmp/serve-bench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
RAW=$W/disk.raw
qemu-img create -f raw "$RAW" 1G >/dev/null
dd if=/dev/urandom of="$RAW" bs=1M count=1024 conv=notrunc status=none
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"

job() { # workload -> job file
  local rw=randrw bs=4k depth=64 jobs=1
  case $1 in
    randrw-1c) ;;
    randrw-4c) jobs=4 ;;
    seqread) rw=read bs=1M depth=8 ;;
    seqwrite) rw=write bs=1M depth=8 ;;
  esac
  cat > "$W/$1.fio" <<J
[global]
ioengine=nbd
uri=$URI
rw=$rw
rwmixread=75
bs=$bs
iodepth=$depth
numjobs=$jobs
time_based=1
runtime=$RT
size=1G
randrepeat=1
gtod_reduce=1
group_reporting=1
[test]
J
}
WORKLOADS=(randrw-1c randrw-4c seqread seqwrite)
for w in "${WORKLOADS[@]}"; do job "$w"; done

declare -A IOPS MIBS
measure() { # server-name workload
  local out
  out=$(fio --output-format=terse --terse-version=3 "$W/$2.fio" 2>/dev/null | tail -n 1)
  # terse v3: field 7 read bw KiB/s, 8 read IOPS, 48 write bw, 49 write IOPS
  IOPS[$1,$2]=$(awk -F';' '{print $8+$49}' <<<"$out")
  MIBS[$1,$2]=$(awk -F';' '{printf "%.0f", ($7+$48)/1024}' <<<"$out")
  printf '%-20s %-10s %9s IOPS %7s MiB/s\n' "$1" "$2" "${IOPS[$1,$2]}" "${MIBS[$1,$2]}"
}
run_server() { # name cmd...
  local name=$1; shift
  for w in "${WORKLOADS[@]}"; do
    rm -f "$SOCK"
    "$@" >/dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
    measure "$name" "$w"
    kill $pid; wait $pid 2>/dev/null || true
  done
}

echo "blockport: $BP ($("$BP" --version)); $(nproc) CPUs; $RT s per run"
run_server "blockport-null" "$BP" serve --unix "$SOCK" null:1G
run_server "nbdkit-null" nbdkit -U "$SOCK" -f null 1G
run_server "blockport-raw" "$BP" serve --unix "$SOCK" "$RAW"
run_server "nbdkit-file" nbdkit -U "$SOCK" -f file "$RAW"
run_server "qemu-nbd-raw" qemu-nbd -k "$SOCK" -f raw -t -e 16 "$RAW"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "n/a" }'; }
echo
printf '%-34s' "ratio"; printf ' %10s' "${WORKLOADS[@]}"; echo
for pair in "blockport-null nbdkit-null 1.2" "blockport-raw nbdkit-file 1.25" "blockport-raw qemu-nbd-raw 2"; do
  set -- $pair
  printf '%-34s' "$1 / $2 (target $3)"
  for w in "${WORKLOADS[@]}"; do
    case $w in seq*) printf ' %10s' "$(ratio "${MIBS[$1,$w]}" "${MIBS[$2,$w]}")" ;;
                *) printf ' %10s' "$(ratio "${IOPS[$1,$w]}" "${IOPS[$2,$w]}")" ;; esac
  done
  echo
done
