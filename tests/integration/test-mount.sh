#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount: a qcow2 image and an export of blockport's own server as
# files through FUSE.  Contents equal qemu-img's view; writes of any size
# and alignment land in the image; fio verifies its own writes; partition
# files of MBR and GPT disks (made by sfdisk) equal dd of the whole disk and
# take mkfs.ext4; a punched hole shows in qemu-img map; SEEK_DATA/SEEK_HOLE,
# ENOSPC past the end, clipped reads, stat's size and blocks; read-only
# mounts, mounts over a regular file, the daemon mode; and every way out
# (fusermount3 -u, SIGTERM, SIGINT) flushes and leaves no mount and no
# process.
source "$(dirname "$0")/lib.sh"
require_feature fuse
require fusermount3 qemu-img qemu-io sfdisk fio mkfs.ext4 fsck.ext4 fallocate
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) -eq 0 ]] || skip "needs root (mkfs on files, allow_other)"
cd "$T"

MOUNTS=()
MOUNT_PID=
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
_unmount_all() {
    local m
    for m in "${MOUNTS[@]}"; do
        is_mounted "$m" && { fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m"; }
    done
    return 0
}
# Unmount whatever a failed check left behind, then lib.sh's cleanup.
trap 'rc=$?; set +e; _unmount_all; (exit $rc); _cleanup' EXIT

# mount_fg SOURCE MOUNTPOINT [OPTIONS...]: blockport mount --foreground in
# the background; returns once the pid file says the mount is live.
mount_fg() {
    local src=$1 mnt=$2
    shift 2
    rm -f "$T/mount.pid"
    echo "+ $BLOCKPORT mount --foreground $* $src $mnt" | tee -a "$T/mount.log"
    "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P "$T/mount.pid" "$@" \
        "$src" "$mnt" </dev/null >>"$T/mount.log" 2>&1 &
    MOUNT_PID=$!
    MOUNTS+=("$(readlink -f "$mnt")")
    track_pid "$MOUNT_PID"
    if ! wait_file 15 "$T/mount.pid" "$MOUNT_PID"; then
        _pid_alive "$MOUNT_PID" || { tail -20 "$T/mount.log"; fail "mount of $src exited early"; }
        fail "mount of $src not live after 15 s"
    fi
    is_mounted "$(readlink -f "$mnt")" || fail "pid file written but $mnt is not mounted"
}

# wait_gone PID SECONDS: the process ended; its exit status in GONE_RC.
wait_gone() {
    wait_until "$2" _pid_gone "$1" || fail "process $1 still running after $2 s"
    GONE_RC=0
    wait "$1" 2>/dev/null || GONE_RC=$?
}

# unmount MOUNTPOINT [how]: fusermount3 -u (default) or a signal name; the
# daemon must exit 0 and leave no mount, no pid file, no sanitizer report.
unmount() {
    local mnt how=${2:-fusermount}
    mnt=$(readlink -f "$1")
    if [[ $how == fusermount ]]; then
        fusermount3 -u "$mnt" || fail "fusermount3 -u $mnt"
    else
        kill -"$how" "$MOUNT_PID"
    fi
    wait_gone "$MOUNT_PID" 30
    [[ $GONE_RC -eq 0 ]] || { tail -20 "$T/mount.log"; fail "mount exited $GONE_RC after $how"; }
    ! is_mounted "$mnt" || fail "$mnt still mounted after $how"
    [[ ! -e $T/mount.pid ]] || fail "pid file left behind after $how"
    check_sanitizer_reports "$T/mount.log"
}

# allocated IMAGE: bytes qemu-img map reports as data.
allocated() {
    qemu-img map -U --output=json "$1" | "$PY" -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["data"]))'
}

mkdir -p mnt

check "a qcow2 image: contents, name, size and allocated blocks"
qemu-img create -f qcow2 vm.qcow2 64M >/dev/null
qemu-io -f qcow2 -c 'write -P 0x11 0 1M' -c 'write -P 0x22 5M 128k' \
    -c 'write -z 8M 1M' -c 'write -P 0x33 63M 64k' vm.qcow2 >/dev/null
qemu-img convert -O raw vm.qcow2 expect.raw
mount_fg vm.qcow2 mnt
[[ $(ls mnt) == vm ]] || fail "directory holds '$(ls mnt)', expected 'vm'"
cmp mnt/vm expect.raw || fail "contents differ from qemu-img convert"
[[ $(stat -c %s mnt/vm) -eq $((64 << 20)) ]] || fail "size $(stat -c %s mnt/vm)"
want=$(allocated vm.qcow2)
got=$(($(stat -c %b mnt/vm) * 512))
[[ $got -eq $want ]] || fail "st_blocks: $got bytes allocated, qemu-img map says $want"
ok "cmp equal; $got bytes allocated as qemu-img map says"

check "writes of any size and alignment, reads past the end, ENOSPC"
"$PY" - mnt/vm expect.raw <<'EOF' || fail "byte-level checks"
import errno, os, random, sys
fd = os.open(sys.argv[1], os.O_RDWR)
shadow = os.open(sys.argv[2], os.O_RDWR)
size = os.fstat(fd).st_size
rnd = random.Random(7)
for i in range(300):
    n = rnd.choice([1, 7, 511, 512, 4095, 4096, 65537, 300000, 1 << 20, 3 << 20])
    off = rnd.randrange(0, size - n)
    data = os.urandom(n)
    assert os.pwrite(fd, data, off) == n
    os.pwrite(shadow, data, off)
    assert os.pread(fd, n, off) == data, "read back at %d+%d" % (off, n)
assert os.pread(fd, 4096, size) == b"", "read at the end"
assert len(os.pread(fd, 8192, size - 100)) == 100, "read across the end"
try:
    os.pwrite(fd, b"x", size)
    raise SystemExit("a write past the end succeeded")
except OSError as e:
    assert e.errno == errno.ENOSPC, e
assert os.pwrite(fd, b"y" * 200, size - 100) == 100, "write across the end"
os.pwrite(shadow, b"y" * 100, size - 100)
os.fsync(fd)
print("  300 random writes read back; end-of-disk rules hold")
EOF
cmp mnt/vm expect.raw || fail "mounted file differs from the shadow copy"
unmount mnt SIGTERM
qemu-img compare -f qcow2 -F raw vm.qcow2 expect.raw >/dev/null ||
    fail "image differs from the shadow after SIGTERM"
qemu-img check vm.qcow2 >/dev/null || fail "qemu-img check after writes"
ok "image equals the shadow copy after SIGTERM; qemu-img check clean"

check "fio with verification on the mounted file (4k random, 1M sequential)"
mount_fg vm.qcow2 mnt
# The second 1M pass overwrites clusters the first allocated: the path
# that writes them in the receiving thread.
for job in "randwrite 4k 16" "write 1M 4" "write 1M 4"; do
    set -- $job
    run fio --name=v --filename=mnt/vm --ioengine=libaio --direct=1 --rw=$1 \
        --bs=$2 --iodepth=$3 --size=48M --offset=8M --verify=crc32c \
        --verify_fatal=1 --do_verify=1 --randrepeat=0 --output=fio-$1.txt ||
        { cat fio-$1.txt; fail "fio $1 $2 verify"; }
    grep -q "err= 0" fio-$1.txt || { cat fio-$1.txt; fail "fio $1 reported errors"; }
done
ok "fio randwrite 4k qd16 and write 1M qd4 (twice) verified"

check "a punched hole shows in qemu-img map; SEEK_DATA/SEEK_HOLE follow it"
fallocate --punch-hole --offset 16M --length 4M mnt/vm || fail "punch hole"
fallocate --zero-range --offset 30M --length 1M mnt/vm || fail "zero range"
"$PY" - mnt/vm <<'EOF' || fail "seek and zero checks"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
M = 1 << 20
assert os.pread(fd, 4 * M, 16 * M) == bytes(4 * M), "hole reads as zeroes"
assert os.pread(fd, M, 30 * M) == bytes(M), "zeroed range reads as zeroes"
assert os.lseek(fd, 16 * M, os.SEEK_HOLE) == 16 * M, "SEEK_HOLE at the hole"
assert os.lseek(fd, 16 * M, os.SEEK_DATA) == 20 * M, "SEEK_DATA after the hole"
assert os.lseek(fd, 9 * M, os.SEEK_DATA) == 9 * M, "SEEK_DATA in data"
EOF
sync mnt/vm
unmount mnt SIGINT
qemu-img map -U --output=json vm.qcow2 | "$PY" -c '
import json, sys
M = 1 << 20
for e in json.load(sys.stdin):
    s, t = e["start"], e["start"] + e["length"]
    if s < 20 * M and t > 16 * M and e["data"]:
        raise SystemExit("punched range still holds data: %r" % e)' ||
    fail "the hole is not in qemu-img map"
ok "hole at 16M+4M in qemu-img map; lseek answers from block status"

check "partition files of an MBR disk (primaries and logicals)"
truncate -s 64M mbr.raw
dd if=/dev/urandom of=mbr.raw bs=1M seek=1 count=62 conv=notrunc status=none
printf 'label: dos\nstart=2048, size=20480, type=83\nstart=30000, size=90000, type=5\nstart=32048, size=10000, type=83\nstart=50000, size=20000, type=82\nstart=122880, size=8192, type=7\n' |
    sfdisk -q --no-reread --no-tell-kernel mbr.raw
qemu-img convert -O qcow2 mbr.raw mbr.qcow2
mount_fg mbr.qcow2 mnt --name disk
[[ $(ls mnt | tr '\n' ' ') == "disk disk-p1 disk-p3 disk-p5 disk-p6 " ]] ||
    fail "MBR files: $(ls mnt | tr '\n' ' ')"
# check_parts LABEL RAW: each partition file equals dd of the disk file
# at the bounds sfdisk gives (files for extended partitions do not exist).
check_parts() {
    local n start size
    while read -r n start size; do
        [[ -e mnt/disk-p$n ]] || continue
        dd if=mnt/disk bs=512 skip="$start" count="$size" status=none |
            cmp - "mnt/disk-p$n" || fail "$1 partition $n differs from dd of the disk"
        [[ $(stat -c %s "mnt/disk-p$n") -eq $((size * 512)) ]] || fail "$1 p$n size"
    done < <(sfdisk -d "$2" |
        sed -n 's/^[^ ]*[^0-9]\([0-9]*\) : start= *\([0-9]*\), size= *\([0-9]*\).*/\1 \2 \3/p')
}
check_parts MBR mbr.raw
unmount mnt
ok "disk-p1, p3 (a primary after an extended), p5, p6 equal dd of the disk"

check "partition files of a GPT disk; mkfs.ext4 on one"
truncate -s 64M gpt.raw
printf 'label: gpt\nstart=2048, size=20480\nstart=24576, size=65536, name=data\nstart=100000, size=30000\n' |
    sfdisk -q --no-reread --no-tell-kernel gpt.raw
qemu-img convert -O qcow2 gpt.raw gpt.qcow2
mount_fg gpt.qcow2 mnt --name disk
[[ $(ls mnt | tr '\n' ' ') == "disk disk-p1 disk-p2 disk-p3 " ]] ||
    fail "GPT files: $(ls mnt | tr '\n' ' ')"
check_parts GPT gpt.raw
run mkfs.ext4 -q -F mnt/disk-p2 || fail "mkfs.ext4 on a partition file"
run fsck.ext4 -fn mnt/disk-p2 >/dev/null || fail "fsck of the new file system"
check_parts GPT gpt.raw
unmount mnt
qemu-img convert -O raw gpt.qcow2 gpt-after.raw
dd if=gpt-after.raw bs=512 skip=24576 count=65536 status=none of=p2.img
run fsck.ext4 -fn p2.img >/dev/null || fail "fsck of partition 2 in the image"
ok "disk-p1..p3 equal dd of the disk; ext4 made through disk-p2 is in the image"

check "an export of blockport's own server (nbd+unix)"
qemu-img convert -O raw vm.qcow2 vm-now.raw
start_server vm.qcow2
mount_fg "$URI" mnt
[[ $(ls mnt) == disk ]] || fail "NBD export '' should be 'disk', got '$(ls mnt)'"
cmp mnt/disk vm-now.raw || fail "NBD mount differs from qemu-img convert"
run fio --name=n --filename=mnt/disk --ioengine=libaio --direct=1 --rw=randrw \
    --bs=4k --iodepth=32 --size=16M --offset=40M --verify=crc32c --verify_fatal=1 \
    --output=fio-nbd.txt || { cat fio-nbd.txt; fail "fio over NBD"; }
head -c 3M /dev/urandom >blob
dd if=blob of=mnt/disk bs=1M seek=$((777 << 10)) oflag=seek_bytes conv=notrunc status=none
unmount mnt
stop_server
qemu-img convert -O raw vm.qcow2 vm-after.raw
cmp -n $((3 << 20)) -i 0:$((777 << 10)) blob vm-after.raw || fail "dd through NBD not in the image"
ok "cmp equal; fio verified; dd landed in the image"

check "read-only mounts"
mount_fg vm.qcow2 mnt --readonly
[[ $(stat -c %a mnt/vm) == 400 ]] || fail "read-only mode $(stat -c %a mnt/vm)"
if echo x | dd of=mnt/vm conv=notrunc status=none 2>/dev/null; then
    fail "a write to a read-only mount succeeded"
fi
cmp mnt/vm vm-after.raw || fail "read-only contents"
unmount mnt
ok "writes refused, contents intact"

check "over a regular file"
touch disk.img
mount_fg vm.qcow2 disk.img
[[ $(stat -c %s disk.img) -eq $((64 << 20)) ]] || fail "file mount size"
cmp disk.img vm-after.raw || fail "file mount contents"
unmount disk.img SIGTERM
[[ $(stat -c %s disk.img) -eq 0 ]] || fail "the file under the mount changed"
ok "the disk over disk.img; the file is untouched afterwards"

check "daemon mode: returns once live, pid file, log file, SIGTERM"
rm -f d.pid
"${_env_reset[@]}" "$BLOCKPORT" mount -P d.pid --log-file "$T/daemon.log" \
    vm.qcow2 mnt || fail "daemon mount"
MOUNTS+=("$(readlink -f mnt)")
[[ -s d.pid ]] || fail "no pid file when mount returned"
MOUNT_PID=$(cat d.pid)
cmp mnt/vm vm-after.raw || fail "daemon mount contents"
kill -TERM "$MOUNT_PID"
wait_until 10 _pid_gone "$MOUNT_PID" || fail "daemon still running after SIGTERM"
! is_mounted "$(readlink -f mnt)" || fail "daemon left its mount"
[[ ! -e d.pid ]] || fail "daemon left its pid file"
grep -q "mounted vm.qcow2" daemon.log || fail "nothing in the daemon's log file"
check_sanitizer_reports daemon.log
rc=0; "$BLOCKPORT" mount /nonexistent.qcow2 mnt 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q nonexistent err.txt || fail "a failing daemon: exit $rc, $(cat err.txt)"
ok "parent returned with the mount live; SIGTERM unmounted; errors reach the caller"

check "a killed mount process leaves no dead mount (auto_unmount)"
mount_fg vm.qcow2 mnt
kill -KILL "$MOUNT_PID"
wait_gone "$MOUNT_PID" 10
unmounted() { ! is_mounted "$(readlink -f mnt)"; }
wait_until 10 unmounted || fail "SIGKILL left a dead mount"
ok "the mount went with the process"
