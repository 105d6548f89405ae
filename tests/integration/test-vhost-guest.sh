#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# End to end under QEMU (TCG): a Debian guest (contrib/guest/make-guest.sh)
# boots with -device vhost-user-blk-pci attached to `blockport vhost`, which
# forwards over NBD to `blockport serve` on a qcow2 image.  The guest runs
# guest-blk (tests/guest/guest-blk.c): writes of many sizes and offsets with
# O_DIRECT from four processes, zeroes, discards, flushes, and a read-back
# check.  Afterwards qemu-img check finds the image clean and qemu-img
# compare finds it equal to what guest-blk produces on a plain file.
# Three runs: one queue; two queues; one queue with the NBD server
# restarted while the guest is writing.
source "$(dirname "$0")/lib.sh"
require qemu-system-x86_64 qemu-img busybox cpio cc
HERE=$(dirname "$(readlink -f "$0")")
SRC=$(readlink -f "$HERE/../..")
cd "$T"

cc -std=c17 -O2 -static -o guest-blk "$SRC/tests/guest/guest-blk.c" ||
  skip "no static C library to build the guest workload"

# make_guest SEED JOBS OPS: an initramfs running guest-blk on /dev/vda.
make_guest() {
  cat >run.sh <<EOF
echo "GUEST: queues \$(ls /sys/block/vda/mq 2>/dev/null | wc -l)"
/payload/guest-blk /dev/vda $1 $2 $3
EOF
  # The kernel comes from the cache contrib/install-deps.sh fills: tests
  # download nothing.
  GUEST_CACHE=${GUEST_CACHE:-/tmp/blockport-guest-cache} GUEST_OFFLINE=1 \
    "$SRC/contrib/guest/make-guest.sh" guest guest-blk run.sh >/dev/null ||
    skip "cannot build the test guest (no kernel cached? see contrib/install-deps.sh)"
}

# boot QUEUES: run the guest against vhost.sock; console in console.log.
boot() {
  timeout 300 qemu-system-x86_64 -accel tcg -m 512 -smp 2 -nographic \
    -no-reboot -kernel guest/vmlinuz -initrd guest/initrd.gz \
    -append "console=ttyS0 quiet panic=-1" \
    -object memory-backend-memfd,id=mem,size=512M,share=on \
    -numa node,memdev=mem \
    -chardev socket,id=c0,path="$T/vhost.sock",reconnect=1 \
    -device vhost-user-blk-pci,chardev=c0,num-queues="$1" \
    >console.log 2>&1 || true
  tr -d '\r' <console.log | grep -o "GUEST.*" || true
}

start_vhost() {
  rm -f vhost.sock
  "$BLOCKPORT" vhost --socket "$T/vhost.sock" --queues 2 --connections 4 \
    --pid-file "$T/vhost.pid" "$URI" 2>>"$T/vhost.log" &
  VHOST=$!
  track_pid $VHOST
  wait_until 5 test -S vhost.sock || fail "vhost socket never appeared"
}

stop_vhost() {
  kill -TERM $VHOST
  local rc=0
  wait $VHOST || rc=$?
  [ $rc -eq 0 ] || { cat vhost.log; fail "blockport vhost exited with $rc"; }
  check_sanitizer_reports "$T/vhost.log"
}

# verify SEED JOBS OPS: the image against a replay on a file.
verify() {
  local rc=0
  qemu-img check disk.qcow2 >check.txt 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat check.txt; fail "qemu-img check: exit $rc"; }
  rm -f expect.raw
  truncate -s 256M expect.raw
  ./guest-blk expect.raw "$1" "$2" "$3" | grep -q "GUEST-BLK OK" ||
    fail "the replay on a file failed"
  run qemu-img compare -f qcow2 -F raw disk.qcow2 expect.raw ||
    fail "the image differs from what the guest wrote"
}

# one_run QUEUES SEED OPS [restart]
one_run() {
  local queues=$1 seed=$2 ops=$3 restart=${4:-}
  rm -f disk.qcow2
  qemu-img create -f qcow2 disk.qcow2 256M >/dev/null
  make_guest "$seed" 4 "$ops"
  start_server disk.qcow2
  start_vhost
  if [ -n "$restart" ]; then
    local empty
    empty=$(stat -c %s disk.qcow2)
    boot "$queues" >out.txt &
    local guest=$!
    track_pid $guest
    # Restart once the guest's writes have begun to land in the image.
    wait_until 240 eval '(($(stat -c %s disk.qcow2) > empty))' ||
      { cat console.log; fail "the guest wrote nothing"; }
    stop_server # drains: nothing in flight is lost
    start_server disk.qcow2
    wait $guest
  else
    boot "$queues" >out.txt
  fi
  grep -q "GUEST-BLK OK" out.txt || { cat out.txt; tail -20 vhost.log; fail "the guest saw errors"; }
  grep -q "GUEST: queues $queues" out.txt || { cat out.txt; fail "the guest does not see $queues queues"; }
  stop_vhost
  stop_server
  verify "$seed" 4 "$ops"
}

check "one queue: writes, zeroes, discards and flushes from a guest"
one_run 1 11 200
ok "guest verified; image clean and equal to the replay"

check "two queues"
one_run 2 12 200
ok "guest verified over two queues; image clean and equal"

check "the NBD server restarted while the guest writes"
one_run 1 13 600 restart
grep -q "reconnect" vhost.log || { cat vhost.log; fail "no reconnection logged"; }
ok "no error reached the guest; image clean and equal"
