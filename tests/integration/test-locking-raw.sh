#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A raw image is locked as QEMU locks raw, compared side by side with the
# QEMU tool that does the same job on the same file.  QEMU's raw format
# passes its user's wishes straight to the file: readers share writes
# (only convert's source refuses a writer), an NBD export refuses resizes,
# qemu-img info takes no lock.  So, beside a qemu-nbd writing the file:
# info, map, compare, serve -r and mount -r are admitted as qemu-img info,
# qemu-img map, qemu-img compare, qemu-nbd -r and qemu-storage-daemon's
# read-only FUSE export are, and convert's source is refused as qemu-img
# convert's is; and a blockport serve -r or mount -r lets a qemu-io writer
# in where qemu-nbd -r or the FUSE export does (and refuses qemu-img
# resize where qemu-nbd -r does).
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io qemu-nbd
cd "$T"

FUSE=1
can_mount && [[ $(id -u) -eq 0 ]] &&
    command -v qemu-storage-daemon >/dev/null || FUSE=

# What became of a command, in OUTCOME: "admitted", or the lock it was
# refused ("Failed to get shared "write" lock"), or its exit and message.
_outcome_of() {
    local rc=$1
    if [[ $rc -eq 0 ]]; then
        OUTCOME=admitted
    else
        OUTCOME=$(grep -o 'Failed to get [a-z]* *"[a-z ]*" lock' err.txt | head -1) ||
            OUTCOME="exit $rc: $(head -c 200 err.txt)"
    fi
}

# tool CMD...: a command that runs and exits.
tool() {
    local rc=0
    timeout 30 "$@" >out.txt 2>err.txt </dev/null || rc=$?
    _outcome_of "$rc"
}

# daemon PIDFILE CMD...: a server or mount; admitted once PIDFILE is
# written (then stopped with SIGTERM, which unmounts a mount).
daemon() {
    local pidf=$1 pid rc=0
    shift
    rm -f "$pidf"
    "$@" >out.txt 2>err.txt </dev/null &
    pid=$!
    track_pid "$pid"
    if wait_file 15 "$pidf" "$pid"; then
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        OUTCOME=admitted
        return
    fi
    wait "$pid" 2>/dev/null || rc=$?
    _outcome_of "$rc"
}

# twin WHAT QEMU-OUTCOME: blockport's OUTCOME must be QEMU's.
twin() {
    if [[ $OUTCOME == "$2" ]]; then
        ok "$1: $OUTCOME, as QEMU"
    else
        fail_soft "$1: blockport $OUTCOME, QEMU $2"
    fi
}

# A holder in the background: HOLDER_PID, ready once PIDFILE is written.
hold() {
    local pidf=$1
    shift
    rm -f "$pidf"
    "$@" >holder.log 2>&1 </dev/null &
    HOLDER_PID=$!
    track_pid "$HOLDER_PID"
    wait_file 15 "$pidf" "$HOLDER_PID" || { cat holder.log; fail "$* did not start"; }
}
unhold() {
    kill "$HOLDER_PID" 2>/dev/null || true
    wait "$HOLDER_PID" 2>/dev/null || true
}

qsd_fuse_ro() { # MOUNTPOINT PIDFILE: QEMU's read-only FUSE export of d.raw
    exec qemu-storage-daemon --pidfile "$2" \
        --blockdev file,node-name=f,filename=d.raw,read-only=on \
        --blockdev raw,node-name=r,file=f,read-only=on \
        --export fuse,id=e,node-name=r,mountpoint="$1"
}

qemu-img create -q -f raw d.raw 16M
qemu-io -f raw -c 'write -P 0x5a 0 1M' d.raw >/dev/null
cp d.raw copy.raw
touch qm bm

check "beside qemu-nbd writing the raw file: each reader as its QEMU twin"
hold q.pid qemu-nbd -f raw -k "$T/q.sock" --pid-file "$T/q.pid" d.raw
for args in "-f raw" ""; do
    tool qemu-img info $args d.raw; q=$OUTCOME
    tool "$BLOCKPORT" info $args d.raw; twin "info ${args:-(probed)}" "$q"
done
tool qemu-img map -f raw d.raw; q=$OUTCOME
tool "$BLOCKPORT" map -f raw d.raw; twin "map" "$q"
tool qemu-img compare -f raw -F raw d.raw copy.raw; q=$OUTCOME
tool "$BLOCKPORT" compare -f raw -F raw d.raw copy.raw; twin "compare" "$q"
tool qemu-img convert -f raw -O raw d.raw q-out.raw; q=$OUTCOME
tool "$BLOCKPORT" convert -f raw -O raw d.raw b-out.raw; twin "convert's source" "$q"
[[ $q != admitted ]] || fail_soft "qemu-img convert admitted: is qemu-nbd writing?"
daemon q2.pid qemu-nbd -r -f raw -k "$T/q2.sock" --pid-file "$T/q2.pid" d.raw; q=$OUTCOME
daemon b2.pid "$BLOCKPORT" serve -r -f raw -u "$T/b2.sock" -P "$T/b2.pid" d.raw
twin "serve -r (qemu-nbd -r)" "$q"
if [[ $FUSE ]]; then
    daemon q3.pid qsd_fuse_ro "$T/qm" "$T/q3.pid"; q=$OUTCOME
    daemon b3.pid "$BLOCKPORT" mount --foreground -r -f raw -P "$T/b3.pid" d.raw "$T/bm"
    twin "mount -r (the FUSE export)" "$q"
else
    skip_case "mount -r: no FUSE, root or qemu-storage-daemon"
fi
unhold

check "a read-only export or mount of a raw file beside a qemu-io writer, qemu-img resize"
# beside HOLDER...: what a writer and a resize (to the same size) meet.
beside() {
    tool qemu-io -f raw -c 'write -P 0x11 0 4k' d.raw
    WRITER=$OUTCOME
    tool qemu-img resize -q -f raw d.raw 16M
    RESIZE=$OUTCOME
}
hold q.pid qemu-nbd -r -f raw -k "$T/q.sock" --pid-file "$T/q.pid" d.raw
beside; qw=$WRITER; qr=$RESIZE
unhold
hold b.pid "$BLOCKPORT" serve -r -f raw -u "$T/b.sock" -P "$T/b.pid" d.raw
beside
unhold
OUTCOME=$WRITER; twin "qemu-io writer beside serve -r (qemu-nbd -r)" "$qw"
OUTCOME=$RESIZE; twin "qemu-img resize beside serve -r (qemu-nbd -r)" "$qr"
if [[ $FUSE ]]; then
    hold q.pid qsd_fuse_ro "$T/qm" "$T/q.pid"
    beside; qw=$WRITER; qr=$RESIZE
    unhold
    hold b.pid "$BLOCKPORT" mount --foreground -r -f raw -P "$T/b.pid" d.raw "$T/bm"
    beside
    unhold
    OUTCOME=$WRITER; twin "qemu-io writer beside mount -r (the FUSE export)" "$qw"
    OUTCOME=$RESIZE; twin "qemu-img resize beside mount -r (the FUSE export)" "$qr"
fi
