#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount of an NBD export whose server goes away: operations fail
# with EIO within --timeout instead of hanging their callers, the mount
# stays, and it works again once the server is back.  Both a killed server
# (the socket closes) and a stopped one (silence) are tried.
source "$(dirname "$0")/lib.sh"
require_feature fuse
require fusermount3 python3
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
[[ $(id -u) -eq 0 ]] || skip "needs root"
cd "$T"

TIMEOUT=3
MNT=$(readlink -f .)/mnt
mkdir -p "$MNT"
MOUNT_PID=
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT

random_file disk.raw 32
start_server disk.raw

rm -f mount.pid
"${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid --timeout $TIMEOUT \
    "$URI" "$MNT" </dev/null >>mount.log 2>&1 &
MOUNT_PID=$!
track_pid "$MOUNT_PID"
wait_file 15 mount.pid "$MOUNT_PID" || { cat mount.log; fail "mount not live"; }
cmp "$MNT/disk" disk.raw || fail "contents before the outage"

# io OP OFFSET: one 4k O_DIRECT read or write of the disk; prints "ok" or
# the errno name, and the seconds it took.
cat >io.py <<'EOF'
import errno, mmap, os, sys, time
path, op, off = sys.argv[1], sys.argv[2], int(sys.argv[3])
buf = mmap.mmap(-1, 4096)
t = time.monotonic()
try:
    fd = os.open(path, (os.O_RDWR if op == "write" else os.O_RDONLY) | os.O_DIRECT)
    if op == "write":
        buf.write(b"\x5a" * 4096)
        os.pwritev(fd, [buf], off)
    else:
        os.preadv(fd, [buf], off)
    os.close(fd)
    r = "ok"
except OSError as e:
    r = errno.errorcode.get(e.errno, str(e.errno))
print(r, "%.1f" % (time.monotonic() - t))
EOF
io() { timeout 60 "$PY" io.py "$MNT/disk" "$1" "$2" || echo "hung 60"; }

# outage HOW: with the server gone or silent, reads and writes fail with
# EIO within the timeout plus one reconnection attempt (1 s), plus slack.
outage() {
    local op r secs
    for op in read write; do
        read -r r secs < <(io $op $((5 << 20)))
        [[ $r == EIO ]] || fail "$1: $op gave '$r' after ${secs}s, expected EIO"
        awk -v s="$secs" -v t=$TIMEOUT 'BEGIN {exit !(s <= t + 2)}' ||
            fail "$1: $op took ${secs}s to fail (timeout $TIMEOUT s)"
        ok "$1: $op fails with EIO after ${secs}s"
    done
    _pid_alive "$MOUNT_PID" || fail "$1: the mount process died"
    is_mounted "$MNT" || fail "$1: the mount is gone"
}

# recovery: within 20 s of the server's return, I/O works again and the
# disk reads what the image holds.
reads_ok() {
    local r secs
    read -r r secs < <(io read $((7 << 20))) && [[ $r == ok ]]
}

recovery() {
    local r secs
    wait_until 20 reads_ok || fail "$1: no recovery 20 s after the server returned"
    read -r r secs < <(io write $((9 << 20)))
    [[ $r == ok ]] || fail "$1: write after recovery: $r"
    sync "$MNT/disk"
    cmp "$MNT/disk" disk.raw || fail "$1: contents after recovery"
    ok "$1: reads and writes work again; the disk equals the image"
}

check "the server is killed, then started again"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=
outage "killed server"
start_server disk.raw
recovery "killed server"

check "the server stops answering (SIGSTOP), then goes on"
kill -STOP "$SERVER_PID"
outage "silent server"
kill -CONT "$SERVER_PID"
recovery "silent server"

check "unmount after the outages"
fusermount3 -u "$MNT"
wait_until 10 _pid_gone "$MOUNT_PID" || fail "mount process still running"
wait "$MOUNT_PID" || fail "mount exited with status $?"
! is_mounted "$MNT" || fail "still mounted"
check_sanitizer_reports mount.log
stop_server
ok "clean exit, no mount left"
