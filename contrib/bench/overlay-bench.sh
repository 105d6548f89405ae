#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A qcow2 overlay whose backing file is an NBD export (issue 18): blockport
# serve against qemu-nbd serving the same overlay, which reaches the base
# with its own NBD client (blockport with the NBD source: 4 connections
# when the base allows multi-conn; QEMU: one).
#
# The base: a 1 GiB random raw file served read-only by one blockport
# serve (on a Unix socket, in the page cache), shared by every run.  The
# overlay: a fresh 64 KiB-cluster qcow2 over that URI before every run.
# Workloads (fio's nbd engine, one connection, iodepth 64):
#   randread   4k random reads: every one goes to the base
#   randwrite  4k random writes, time based: copy-on-write of a cluster
#              from the base at first, in place once it is allocated
#   cow        4k writes 64 KiB apart (rw=write:60k, 16384 writes, not
#              time based): every one a copy-on-write of a fresh cluster
# randread runs a third server too: blockport serve --copy-on-read (each
# cluster read once from the base, then locally).  The servers alternate
# ROUNDS times; then means and ratios.
#
# usage: contrib/bench/overlay-bench.sh [ROUNDS] [SECONDS] [BLOCKPORT]
set -euo pipefail
ROUNDS=${1:-3}
RT=${2:-10}
BP=${3:-$(dirname "$0")/../../build/blockport}
BP=$(readlink -f "$BP")
source "$(dirname "$0")/lib.sh"
bench_require fio qemu-nbd qemu-img
bench_workdir overlay-bench
GOLD=$W/golden.raw
random_disk "$GOLD" 1024
BASE_SOCK=$W/base.sock
BASE="nbd+unix:///?socket=$BASE_SOCK"
SOCK=$W/ov.sock
OV=$W/ov.qcow2
URI="nbd+unix:///?socket=$SOCK"

"$BP" serve --readonly --unix "$BASE_SOCK" -f raw "$GOLD" >/dev/null 2>&1 &
BASE_PID=$!
wait_sock "$BASE_SOCK"

WORKLOADS=(randread randwrite cow)
for w in "${WORKLOADS[@]}"; do
  case $w in
    randread) fio_job "$W/$w.fio" ioengine=nbd "uri=$URI" rw=randread ;;
    randwrite) fio_job "$W/$w.fio" ioengine=nbd "uri=$URI" rw=randwrite ;;
    cow) fio_job "$W/$w.fio" ioengine=nbd "uri=$URI" rw=write:60k \
      time_based=0 runtime=600 ;;
  esac
done

SERVERS=(blockport blockport-cor qemu-nbd)
declare -A SUM
for s in "${SERVERS[@]}"; do
  for w in "${WORKLOADS[@]}"; do SUM[$s,$w]=0; done
done

# one SERVER WORKLOAD: a fresh overlay, the server on it, one fio run.
one() {
  rm -f "$OV"
  qemu-img create -q -f qcow2 -F raw -b "$BASE" "$OV"
  case $1 in
    blockport) start_server "$SOCK" "$BP" serve --unix "$SOCK" "$OV" ;;
    blockport-cor)
      start_server "$SOCK" "$BP" serve --copy-on-read --unix "$SOCK" "$OV" ;;
    qemu-nbd) start_server "$SOCK" qemu-nbd -k "$SOCK" -f qcow2 -t -e 16 "$OV" ;;
  esac
  fio_run "$W/$2.fio"
  stop_server
  kill -0 "$BASE_PID" || { echo "the base server died" >&2; exit 1; }
  SUM[$1,$2]=$((SUM[$1,$2] + FIO_IOPS))
  printf 'round %d %-13s %-9s %9s IOPS\n' "$r" "$1" "$2" "$FIO_IOPS"
}

echo "blockport: $BP ($("$BP" --version)); $(qemu-nbd --version | head -1)"
echo "$(nproc) CPUs; $ROUNDS rounds; $RT s per time-based run"
for r in $(seq "$ROUNDS"); do
  for w in "${WORKLOADS[@]}"; do
    # Alternate which server goes first, so neither always follows the
    # other's page-cache footprint.
    if ((r % 2)); then order=(blockport qemu-nbd); else order=(qemu-nbd blockport); fi
    [[ $w == randread ]] && order+=(blockport-cor)
    for s in "${order[@]}"; do one "$s" "$w"; done
  done
done

echo
printf '%-10s %12s %12s %s\n' workload blockport qemu-nbd "blockport / qemu-nbd"
for w in "${WORKLOADS[@]}"; do
  printf '%-10s %12d %12d %s\n' "$w" $((SUM[blockport,$w] / ROUNDS)) \
    $((SUM[qemu-nbd,$w] / ROUNDS)) "$(ratio "${SUM[blockport,$w]}" "${SUM[qemu-nbd,$w]}")"
done
printf '%-10s %12d %12s %s (--copy-on-read)\n' randread \
  $((SUM[blockport-cor,randread] / ROUNDS)) "" \
  "$(ratio "${SUM[blockport-cor,randread]}" "${SUM[qemu-nbd,randread]}")"
