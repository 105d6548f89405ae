#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount of an NBD export that refuses anything but whole 4 KiB
# blocks of at most 64 KiB (nbdkit's blocksize-policy filter with the error
# policy): writes, zeroes and punched holes of any size and alignment still
# work, by splitting and read-modify-write, and concurrent small writes that
# share blocks (fio, 1 KiB, queue depth 32, verified) lose nothing.
source "$(dirname "$0")/lib.sh"
require_feature fuse
require fusermount3 nbdkit nbdinfo fio fallocate
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) -eq 0 ]] || skip "needs root"
[[ -e /usr/lib/x86_64-linux-gnu/nbdkit/filters/nbdkit-blocksize-policy-filter.so ]] ||
    nbdkit --dump-plugin memory --filter=blocksize-policy >/dev/null 2>&1 ||
    skip "nbdkit has no blocksize-policy filter"
cd "$T"

MNT=$(readlink -f .)/mnt
mkdir -p "$MNT"
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT

SOCK=$T/nbdkit.sock
nbdkit -f -U "$SOCK" -P nbdkit.pid --filter=blocksize-policy memory 64M \
    blocksize-minimum=4096 blocksize-preferred=65536 blocksize-maximum=65536 \
    blocksize-error-policy=error >nbdkit.log 2>&1 &
track_pid $!
wait_file 10 nbdkit.pid $! || { cat nbdkit.log; fail "nbdkit did not start"; }
URI="nbd+unix:///?socket=$SOCK"
nbdinfo "$URI" | grep -q 'block_size_minimum: 4096' || fail "nbdkit does not advertise 4k blocks"

"${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid "$URI" "$MNT" \
    </dev/null >>mount.log 2>&1 &
MOUNT_PID=$!
track_pid "$MOUNT_PID"
wait_file 15 mount.pid "$MOUNT_PID" || { cat mount.log; fail "mount not live"; }

check "writes, zeroes and holes of any alignment over 4k-only, 64k-max blocks"
"$PY" - "$MNT/disk" <<'EOF' || fail "byte-level checks"
import os, random, sys, ctypes
fd = os.open(sys.argv[1], os.O_RDWR)
size = os.fstat(fd).st_size
shadow = bytearray(size)
libc = ctypes.CDLL(None, use_errno=True)
rnd = random.Random(11)
for i in range(400):
    n = rnd.choice([1, 100, 4095, 4096, 4097, 70000, 1 << 20, 1234567])
    off = rnd.randrange(0, size - n)
    op = rnd.randrange(4)
    if op < 2:
        data = os.urandom(n)
        assert os.pwrite(fd, data, off) == n
        shadow[off:off + n] = data
    elif op == 2:
        mode = rnd.choice([0x03, 0x10])  # PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE
        if libc.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(n)) != 0:
            raise SystemExit("fallocate %#x %d+%d: errno %d" % (mode, off, n, ctypes.get_errno()))
        shadow[off:off + n] = bytes(n)
    else:
        assert os.pread(fd, n, off) == bytes(shadow[off:off + n]), "read %d+%d" % (off, n)
os.fsync(fd)
assert os.pread(fd, size, 0) == bytes(shadow), "the whole disk"
print("  400 operations match the shadow copy")
EOF
ok "every operation matched a shadow copy"

check "concurrent 1 KiB writes sharing blocks (fio verify, iodepth 32)"
run fio --name=a --filename="$MNT/disk" --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=1k --iodepth=32 --size=8M --offset=32M \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --output=fio.txt ||
    { cat fio.txt; fail "fio 1k randwrite verify"; }
grep -q "err= 0" fio.txt || { cat fio.txt; fail "fio reported errors"; }
ok "verified"

fusermount3 -u "$MNT"
wait_until 10 _pid_gone "$MOUNT_PID" || fail "mount still running after unmount"
wait "$MOUNT_PID" || fail "mount exited with status $?"
check_sanitizer_reports mount.log
! grep -qi "error" mount.log || { cat mount.log; fail "errors in the mount's log"; }
ok "clean unmount, no errors logged"
