#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount against nbdfuse and qemu-storage-daemon's FUSE export,
# side by side in one run.
#
# Workloads (fio, libaio, O_DIRECT, one job, on the mounted file):
#   randrw    4k random read/write 75/25, iodepth 64
#   seqread   1 MiB sequential read, iodepth 8
#   seqwrite  1 MiB sequential write, iodepth 8
# Mounts:
#   over NBD (one blockport server on a Unix socket, serving a 1 GiB raw
#   file from the page cache): blockport mount URI, nbdfuse URI,
#   qemu-storage-daemon --blockdev driver=nbd --export type=fuse;
#   of the file itself: blockport mount FILE, qemu-storage-daemon
#   --blockdev driver=file (nbdfuse cannot open files).
#
# usage: contrib/bench/mount-bench.sh [SECONDS-PER-RUN] [ROUNDS] [BLOCKPORT]
# Rounds alternate the mounts so that a busy machine hurts them alike; the
# figures are the mean over rounds.  Prints IOPS and MiB/s per mount and
# workload, then the ratios the project tracks.  Needs root (FUSE mounts,
# O_DIRECT on FUSE files).  Extra options for blockport mount can be given
# in BP_MOUNT_OPTS.
set -euo pipefail
RT=${1:-10}
ROUNDS=${2:-2}
BP=${3:-$(dirname "$0")/../../build/blockport}
BP=$(readlink -f "$BP")
source "$(dirname "$0")/lib.sh"
bench_require fio nbdfuse qemu-storage-daemon qemu-img fusermount3
bench_workdir mount-bench
MOUNTS=()
bench_cleanup_hook() {
  for m in "${MOUNTS[@]}"; do
    grep -qs " $m fuse" /proc/mounts && fusermount3 -u -z "$m"
  done
  for p in "$W"/*.pid; do [ -s "$p" ] && kill "$(cat "$p" 2>/dev/null)" 2>/dev/null; done
  sleep 0.5
}
RAW=$W/disk.raw
random_disk "$RAW" 1024
# The file rows mount a copy: the server below holds the image's write
# lock, which refuses a second writer of the same file (as QEMU's does).
RAWF=$W/file.raw
cp "$RAW" "$RAWF"
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"
"$BP" serve --unix "$SOCK" "$RAW" 2>"$W/server.log" &
wait_sock "$SOCK"

job() { # workload -> job file
  local o=(ioengine=libaio direct=1)
  case $1 in
    seqread) o+=(rw=read bs=1M iodepth=8) ;;
    seqwrite) o+=(rw=write bs=1M iodepth=8) ;;
  esac
  fio_job "$W/$1.fio" "${o[@]}"
}
WORKLOADS=(randrw seqread seqwrite)
for w in "${WORKLOADS[@]}"; do job "$w"; done

# mount_as NAME -> sets FILE (the mounted disk) and MNT (what to unmount)
mount_as() {
  case $1 in
    blockport-nbd|blockport-file)
      MNT=$W/bp; mkdir -p "$MNT"
      local src=$URI; [ "$1" = blockport-file ] && src=$RAWF
      # shellcheck disable=SC2086
      "$BP" mount ${BP_MOUNT_OPTS:-} --name disk --log-file "$W/bp.log" \
        -P "$W/bp.pid" "$src" "$MNT"
      FILE=$MNT/disk ;;
    nbdfuse)
      MNT=$W/nf; mkdir -p "$MNT"
      nbdfuse -P "$W/nf.pid" "$MNT/disk" "$URI" 2>"$W/nf.log" &
      wait_mount "$MNT"
      FILE=$MNT/disk ;;
    qsd-nbd|qsd-file)
      MNT=$W/q.img; : >"$MNT"
      local dev=(--blockdev "driver=nbd,node-name=d0,server.type=unix,server.path=$SOCK")
      [ "$1" = qsd-file ] && dev=(--blockdev "driver=file,node-name=f0,filename=$RAWF,aio=threads"
                                  --blockdev "driver=raw,node-name=d0,file=f0")
      qemu-storage-daemon "${dev[@]}" --daemonize --pidfile "$W/qsd.pid" \
        --export "type=fuse,id=e0,node-name=d0,mountpoint=$MNT,writable=on" \
        2>"$W/qsd.log"
      wait_mount "$MNT"
      FILE=$MNT ;;
  esac
  MOUNTS+=("$MNT")
}

unmount() { # NAME
  local pidf=$W/bp.pid
  case $1 in nbdfuse) pidf=$W/nf.pid ;; qsd*) pidf=$W/qsd.pid ;; esac
  # qemu-storage-daemon stays (and spins) after its export is unmounted:
  # stop it instead, which unmounts.
  case $1 in
    qsd*) kill "$(cat "$pidf")" ;;
    *) fusermount3 -u "$MNT" ;;
  esac
  for _ in $(seq 200); do
    [ -s "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null || break
    sleep 0.05
  done
  grep -qs " $MNT fuse" /proc/mounts && fusermount3 -u -z "$MNT"
  rm -f "$pidf"
}

declare -A IOPS MIBS
measure() { # name workload: sums over rounds
  fio_run --filename="$FILE" "$W/$2.fio"
  IOPS[$1,$2]=$(( ${IOPS[$1,$2]:-0} + FIO_IOPS ))
  MIBS[$1,$2]=$(( ${MIBS[$1,$2]:-0} + FIO_MIBS ))
}

NAMES=(blockport-nbd nbdfuse qsd-nbd blockport-file qsd-file)
echo "blockport: $BP ($("$BP" --version)); $(nproc) CPUs; $RT s per run, $ROUNDS rounds"
echo "blockport mount options: ${BP_MOUNT_OPTS:-(defaults)}"
for r in $(seq "$ROUNDS"); do
  for name in "${NAMES[@]}"; do
    mount_as "$name"
    for w in "${WORKLOADS[@]}"; do measure "$name" "$w"; done
    unmount "$name"
  done
  echo "round $r done"
done

printf '\n%-16s' mount; printf ' %18s' "${WORKLOADS[@]}"; echo
for name in "${NAMES[@]}"; do
  printf '%-16s' "$name"
  for w in "${WORKLOADS[@]}"; do
    IOPS[$name,$w]=$(( IOPS[$name,$w] / ROUNDS )); MIBS[$name,$w]=$(( MIBS[$name,$w] / ROUNDS ))
    case $w in
      seq*) printf ' %12s MiB/s' "${MIBS[$name,$w]}" ;;
      *) printf ' %13s IOPS' "${IOPS[$name,$w]}" ;;
    esac
  done
  echo
done

echo
printf '%-44s' "ratio"; printf ' %9s' "${WORKLOADS[@]}"; echo
for pair in "blockport-nbd nbdfuse 1.5/1.0" "blockport-nbd qsd-nbd -" "blockport-file qsd-file -"; do
  set -- $pair
  printf '%-44s' "$1 / $2 (target $3)"
  for w in "${WORKLOADS[@]}"; do
    case $w in seq*) printf ' %9s' "$(ratio "${MIBS[$1,$w]}" "${MIBS[$2,$w]}")" ;;
                *) printf ' %9s' "$(ratio "${IOPS[$1,$w]}" "${IOPS[$2,$w]}")" ;; esac
  done
  echo
done
