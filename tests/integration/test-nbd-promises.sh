#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# What the NBD source promises a daemon (issue 18): a relative socket= path
# still reaches the server after the mount daemon changed directory, so the
# mount recovers once a stopped server resumes.
source "$(dirname "$0")/lib.sh"
require fusermount3 python3
require_feature fuse
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) -eq 0 ]] || skip "needs root"
cd "$T"

TMO=3
MNT=$T/mnt
mkdir -p "$MNT"
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT

# io OFFSET: one 4k O_DIRECT read of the disk; prints "ok" or the errno
# name, and the seconds it took.
cat >io.py <<'PY'
import errno, mmap, os, sys, time
buf = mmap.mmap(-1, 4096)
t = time.monotonic()
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
    os.preadv(fd, [buf], int(sys.argv[2]))
    os.close(fd)
    r = "ok"
except OSError as e:
    r = errno.errorcode.get(e.errno, str(e.errno))
print(r, "%.1f" % (time.monotonic() - t))
PY
io() { timeout 60 "$PY" io.py "$MNT/disk" "$1" || echo "hung 60"; }
reads_ok() { local r s; read -r r s < <(io $((7 << 20))) && [[ $r == ok ]]; }

random_file disk.raw 32
start_server disk.raw # on $T/server.sock, our directory

check "a daemon mount of a relative socket= path recovers after a pause"
rm -f mount.pid
"${_env_reset[@]}" "$BLOCKPORT" mount -P "$T/mount.pid" --log-file "$T/mount.log" \
  --nbd-timeout $TMO --nbd-connections 1 \
  "nbd+unix:///?socket=${SOCK##*/}" "$MNT" </dev/null ||
  fail "mount failed: $(tail -3 mount.log)"
MOUNT_PID=$(cat mount.pid)
track_pid "$MOUNT_PID"
[[ $(readlink "/proc/$MOUNT_PID/cwd") == / ]] ||
  skip "the daemon did not change directory: nothing to test"
cmp "$MNT/disk" disk.raw || fail "contents before the pause"
kill -STOP "$SERVER_PID"
read -r r secs < <(io $((5 << 20)))
[[ $r == EIO ]] || fail "a read from the stopped server gave $r after $secs s"
kill -CONT "$SERVER_PID"
wait_until 15 reads_ok ||
  fail "no recovery 15 s after SIGCONT: $(tail -3 mount.log)"
cmp "$MNT/disk" disk.raw || fail "contents after the pause"
grep -q "socket=$T/" mount.log || fail "the logged URI is not absolute"
ok "EIO after $secs s while stopped, reads again after SIGCONT"

fusermount3 -u "$MNT"
wait_until 10 _pid_gone "$MOUNT_PID" || fail "mount process still running"
check_sanitizer_reports mount.log
stop_server

check "an EIO while reading the partition table is tried again"
require nbdkit
# a disk whose MBR holds one Linux partition at 1 MiB, 2 MiB long
"$PY" - <<'PY'
import struct
d = bytearray(8 << 20)
d[446:462] = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", 2048, 4096)
d[510:512] = b"\x55\xaa"
open("mbr.raw", "wb").write(d)
PY
touch err.flag # reads fail with EIO while it exists
nbdkit -f -U "$T/err.sock" --filter=error file mbr.raw error-pread=EIO \
  error-pread-rate=100% error-pread-file="$T/err.flag" 2>err.log &
track_pid $!
wait_until 10 test -S "$T/err.sock" || fail "nbdkit did not start"
"${_env_reset[@]}" "$BLOCKPORT" mount --foreground --nbd-timeout 10 \
  "nbd+unix:///?socket=$T/err.sock" "$MNT" </dev/null >mount2.log 2>&1 &
MOUNT_PID=$!
track_pid $MOUNT_PID
table_retried() { grep -q "reading the partition table.*trying again" mount2.log; }
wait_until 10 table_retried || fail "no retry of the table: $(tail -3 mount2.log)"
rm err.flag
wait_until 10 test -e "$MNT/disk-p1" ||
  fail "no partition file after the retry: $(tail -3 mount2.log)"
cmp <(head -c 2M "$MNT/disk-p1") <(tail -c +$((1048577)) mbr.raw | head -c 2M) ||
  fail "the partition's contents"
fusermount3 -u "$MNT"
wait_until 10 _pid_gone "$MOUNT_PID" || fail "mount process still running"
check_sanitizer_reports mount2.log
ok "mounted with its partition once the reads worked"

check "a local image's EIO in the partition table fails the mount at once"
# The retry above is for sources whose EIO may pass; a file's does not.
cp mbr.raw local.raw
start=$(date +%s%N)
BLOCKPORT_FAULTS="op=read,from=0,to=512" "${_env_reset[@]}" "$BLOCKPORT" \
  mount --foreground --nbd-timeout 10 -f raw local.raw "$MNT" </dev/null \
  >mount3.log 2>&1 &
MOUNT_PID=$!
track_pid $MOUNT_PID
wait_until 15 _pid_gone "$MOUNT_PID" ||
  fail "the mount is still running 15 s later: $(tail -3 mount3.log)"
secs=$((($(date +%s%N) - start) / 1000000))
is_mounted "$MNT" && fail "mounted despite the failed table read"
grep -q "reading the partition table.*Input/output error" mount3.log ||
  fail "no clear message: $(tail -3 mount3.log)"
grep -q "trying again" mount3.log && fail "a local EIO was retried"
((secs < 5000)) || fail "the mount took $secs ms to fail (retried?)"
cmp local.raw mbr.raw || fail "the image changed"
check_sanitizer_reports mount3.log
ok "failed in $secs ms: $(grep -m1 'partition table' mount3.log)"
