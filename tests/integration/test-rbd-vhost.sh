#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A guest's disk on Ceph RBD: the TCG guest (contrib/guest/make-guest.sh)
# boots with -device vhost-user-blk-pci attached to `blockport vhost`, which
# forwards over NBD to `blockport serve rbd:POOL/IMG` on a throw-away
# cluster (contrib/ceph-cluster.sh).  The guest runs guest-blk
# (tests/guest/guest-blk.c: O_DIRECT writes of many sizes from four
# processes, zeroes, discards, flushes, a read-back check); afterwards
# QEMU's own rbd driver finds the image equal to what guest-blk produces on
# a plain file.  One boot, to stay short.
# Skips (77) without the Ceph packages, qemu-block-extra, QEMU, a static C
# library or the cached guest kernel.
source "$(dirname "$0")/lib.sh"
require_feature rbd vhost
require qemu-system-x86_64 qemu-img busybox cpio cc
require_qemu_rbd
HERE=$(dirname "$(readlink -f "$0")")
SRC=$(readlink -f "$HERE/../..")
cd "$T"

SEED=21 JOBS=4 OPS=200
cc -std=c17 -O2 -static -o guest-blk "$SRC/tests/guest/guest-blk.c" ||
    skip "no static C library to build the guest workload"
cat >run.sh <<EOF
/payload/guest-blk /dev/vda $SEED $JOBS $OPS
EOF
# The kernel comes from the cache contrib/install-deps.sh fills: tests
# download nothing.
GUEST_CACHE=${GUEST_CACHE:-/tmp/blockport-guest-cache} GUEST_OFFLINE=1 \
    "$SRC/contrib/guest/make-guest.sh" guest guest-blk run.sh >/dev/null ||
    skip "cannot build the test guest (no kernel cached? see contrib/install-deps.sh)"

ceph_cluster_start
SERVER_START_TIMEOUT=60
run rbd create "$CEPH_POOL/img" --size 256M || fail "rbd create"

check "a guest writes, zeroes, discards and verifies its disk on RBD through vhost"
start_server "rbd:$CEPH_POOL/img"
"$BLOCKPORT" vhost --socket "$T/vhost.sock" --connections 4 "$URI" 2>>vhost.log &
VHOST=$!
track_pid $VHOST
wait_until 10 test -S vhost.sock || { cat vhost.log; fail "vhost socket never appeared"; }
timeout 400 qemu-system-x86_64 -accel tcg -m 512 -smp 2 -nographic \
    -no-reboot -kernel guest/vmlinuz -initrd guest/initrd.gz \
    -append "console=ttyS0 quiet panic=-1" \
    -object memory-backend-memfd,id=mem,size=512M,share=on \
    -numa node,memdev=mem \
    -chardev socket,id=c0,path="$T/vhost.sock" \
    -device vhost-user-blk-pci,chardev=c0,num-queues=1 \
    >console.log 2>&1 || true
tr -d '\r' <console.log | grep -o "GUEST.*" >out.txt || true
grep -q "GUEST-BLK OK" out.txt ||
    { cat out.txt; tail -20 vhost.log; tail -20 console.log; fail "the guest saw errors"; }
kill -TERM $VHOST
rc=0
wait $VHOST || rc=$?
[[ $rc -eq 0 ]] || { cat vhost.log; fail "blockport vhost exited with $rc"; }
check_sanitizer_reports vhost.log
stop_server
ok "the guest verified its writes"

check "QEMU's rbd driver finds the image equal to a replay on a file"
truncate -s 256M expect.raw
./guest-blk expect.raw $SEED $JOBS $OPS | grep -q "GUEST-BLK OK" ||
    fail "the replay on a file failed"
run qemu-img compare -f raw -F raw "rbd:$CEPH_POOL/img" expect.raw ||
    fail "the RBD image differs from what the guest wrote"
ok "image equal to the replay"
