#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# fio inside a test guest (QEMU, TCG) on a disk that reaches one image
# through three paths, side by side in one run:
#   vhost     blockport vhost (vhost-user-blk, 4 NBD connections) in front
#             of blockport serve
#   qemu-nbd  QEMU's built-in NBD client (-drive file=nbd+unix://...) in
#             front of the same blockport serve
#   qsd       qemu-storage-daemon's vhost-user-blk export of the image
# The workload is the project's origin: 4k random read/write 75/25,
# iodepth 64, O_DIRECT, libaio, one job.  Guest-side IOPS are printed, and
# the ratios vhost/qemu-nbd (target 1.5) and vhost/qsd (target 1).
#
# With LATENCY_MS=N the server's storage answers every read and write N ms
# late (fault injection's delay, 64 workers): a disk across a network,
# where keeping many requests in flight is what counts.  qsd exports the
# image directly and sees no added latency.
#
# usage: [LATENCY_MS=N] contrib/bench/vhost-bench.sh [SECONDS-PER-RUN] [BLOCKPORT]
set -euo pipefail
RT=${1:-20}
HERE=$(dirname "$(readlink -f "$0")")
BP=$(readlink -f "${2:-$HERE/../../build/blockport}")
source "$HERE/lib.sh"
bench_require qemu-system-x86_64 qemu-storage-daemon qemu-img fio
bench_workdir vhost-bench

# The guest: fio and a script that runs it on /dev/vda.
cat >"$W/run.sh" <<EOF
/payload/fio --name=t --filename=/dev/vda --ioengine=libaio --direct=1 \
  --rw=randrw --rwmixread=75 --bs=4k --iodepth=64 --time_based=1 \
  --runtime=$RT --size=900M --randrepeat=1 --gtod_reduce=1 \
  --output-format=terse --terse-version=3 >/tmp/fio.out 2>&1
awk -F';' '{print "FIO-IOPS", \$8, \$49}' /tmp/fio.out
EOF
GUEST_CACHE=${GUEST_CACHE:-/tmp/blockport-guest-cache} \
  "$HERE/../guest/make-guest.sh" "$W/guest" "$(command -v fio)" "$W/run.sh"

random_disk "$W/disk.raw" 1024

guest() { # DISK-ARGS...: boot, print "read write" IOPS
  timeout $((RT + 120)) qemu-system-x86_64 -accel tcg -m 512 -nographic \
    -no-reboot -kernel "$W/guest/vmlinuz" -initrd "$W/guest/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1" \
    -object memory-backend-memfd,id=mem,size=512M,share=on \
    -numa node,memdev=mem "$@" >"$W/console.log" 2>&1 || true
  awk '/FIO-IOPS/ {print $2, $3; found=1} END {if (!found) print "0 0"}' \
    "$W/console.log" | tr -d '\r'
}

serve() {
  rm -f "$W/nbd.sock"
  if [ -n "${LATENCY_MS:-}" ]; then
    BLOCKPORT_FAULTS="op=read,err=none,delay=$LATENCY_MS;op=write,err=none,delay=$LATENCY_MS" \
      "$BP" serve --workers 64 --unix "$W/nbd.sock" "$W/disk.raw" 2>"$W/serve.log" &
  else
    "$BP" serve --unix "$W/nbd.sock" "$W/disk.raw" 2>"$W/serve.log" &
  fi
  SERVE=$!
  wait_sock "$W/nbd.sock"
}

declare -A IOPS
report() { # name "read write"
  local r w
  read -r r w <<<"$2"
  IOPS[$1]=$((r + w))
  printf '%-10s read %7s  write %7s  total %7s IOPS\n' "$1" "$r" "$w" "${IOPS[$1]}"
}

echo "blockport: $BP; $(nproc) CPUs; $RT s per run; guest under TCG;" \
  "added storage latency: ${LATENCY_MS:-0} ms"
serve
if "$BP" vhost --help >/dev/null 2>&1; then
  rm -f "$W/vhost.sock"
  "$BP" vhost --socket "$W/vhost.sock" --nbd-connections 4 \
    "nbd+unix:///?socket=$W/nbd.sock" 2>"$W/vhost.log" &
  VHOST=$!
  wait_sock "$W/vhost.sock"
  report vhost "$(guest -chardev socket,id=c0,path="$W/vhost.sock" \
    -device vhost-user-blk-pci,chardev=c0)"
  kill $VHOST; wait $VHOST 2>/dev/null || true
else
  echo "vhost      (blockport has no vhost command yet)"
  IOPS[vhost]=0
fi
report qemu-nbd "$(guest -drive "file=nbd+unix:///?socket=$W/nbd.sock,format=raw,if=virtio,cache=none")"
kill $SERVE; wait $SERVE 2>/dev/null || true

rm -f "$W/qsd.sock"
qemu-storage-daemon \
  --blockdev "driver=file,node-name=f,filename=$W/disk.raw,cache.direct=off" \
  --export "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path=$W/qsd.sock,writable=on" \
  2>"$W/qsd.log" &
QSD=$!
wait_sock "$W/qsd.sock"
report qsd "$(guest -chardev socket,id=c0,path="$W/qsd.sock" \
  -device vhost-user-blk-pci,chardev=c0)"
kill $QSD; wait $QSD 2>/dev/null || true

echo
echo "vhost / qemu-nbd = $(ratio "${IOPS[vhost]}" "${IOPS[qemu-nbd]}") (target 1.5)"
echo "vhost / qsd      = $(ratio "${IOPS[vhost]}" "${IOPS[qsd]}") (target 1.0)"
