#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
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
source "$(dirname "$0")/lib.sh"
bench_require fio nbdkit qemu-nbd qemu-img
bench_workdir serve-bench
RAW=$W/disk.raw
random_disk "$RAW" 1024
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"

job() { # workload -> job file
  local o=(ioengine=nbd "uri=$URI" group_reporting=1)
  case $1 in
    randrw-4c) o+=(numjobs=4) ;;
    seqread) o+=(rw=read bs=1M iodepth=8) ;;
    seqwrite) o+=(rw=write bs=1M iodepth=8) ;;
  esac
  fio_job "$W/$1.fio" "${o[@]}"
}
WORKLOADS=(randrw-1c randrw-4c seqread seqwrite)
for w in "${WORKLOADS[@]}"; do job "$w"; done

declare -A IOPS MIBS
run_server() { # name cmd...
  local name=$1 w
  shift
  for w in "${WORKLOADS[@]}"; do
    start_server "$SOCK" "$@"
    fio_run "$W/$w.fio"
    stop_server
    IOPS[$name,$w]=$FIO_IOPS MIBS[$name,$w]=$FIO_MIBS
    printf '%-20s %-10s %9s IOPS %7s MiB/s\n' "$name" "$w" "$FIO_IOPS" "$FIO_MIBS"
  done
}

echo "blockport: $BP ($("$BP" --version)); $(nproc) CPUs; $RT s per run"
run_server "blockport-null" "$BP" serve --unix "$SOCK" null:1G
run_server "nbdkit-null" nbdkit -U "$SOCK" -f null 1G
run_server "blockport-raw" "$BP" serve --unix "$SOCK" "$RAW"
run_server "nbdkit-file" nbdkit -U "$SOCK" -f file "$RAW"
run_server "qemu-nbd-raw" qemu-nbd -k "$SOCK" -f raw -t -e 16 "$RAW"

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
