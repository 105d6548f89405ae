#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# An RBD source when the cluster fails, on one throw-away cluster
# (contrib/ceph-cluster.sh): with --rbd-timeout 5, a killed OSD gives the
# NBD client EIO on reads and writes within the timeout and a margin
# (never a hang), the server lives on, and once the OSD is back requests
# succeed again and the data written before is intact; a killed monitor
# stops neither I/O nor the server, and a new server opened meanwhile fails
# within the timeout; a missing pool, image or snapshot, a bad conf path and
# an unreachable monitor each give a clear error and exit 1 in bounded time.
# Skips (77) only without the Ceph packages or qemu-block-extra.
source "$(dirname "$0")/lib.sh"
require_feature rbd
require qemu-io qemu-img
require_qemu_rbd
ceph_cluster_start
cd "$T"
CMD_TIMEOUT=120
SERVER_START_TIMEOUT=60
POOL=$CEPH_POOL
TO=5      # --rbd-timeout
BOUND=30  # seconds an erring request or open may take: TO and a margin

run rbd create "$POOL/img" --size 64M || fail "rbd create"

# qio_timed CMDS...: qemu-io on $URI with one -c per command, killed after
# 2 * BOUND; exit status in QRC, seconds taken in QSECS, output in qio.out.
qio_timed() {
    local c t0
    local -a args=()
    for c in "$@"; do args+=(-c "$c"); done
    t0=$SECONDS
    QRC=0
    timeout --kill-after=5 $((2 * BOUND)) qemu-io -f raw "${args[@]}" "$URI" \
        >qio.out 2>&1 || QRC=$?
    QSECS=$((SECONDS - t0))
}

# qio_ok CMDS...: succeeds, patterns match.
qio_ok() {
    qio_timed "$@"
    [[ $QRC -eq 0 ]] && ! grep -qE 'Pattern verification failed|error' qio.out
}

# expect_eio WHAT CMDS...: qemu-io reports an I/O error within BOUND.
expect_eio() {
    local what=$1
    shift
    qio_timed "$@"
    ((QRC != 124 && QRC != 137)) || fail "$what hung (killed after $QSECS s)"
    grep -q 'Input/output error' qio.out || { cat qio.out; fail "$what: no EIO (exit $QRC)"; }
    ((QSECS <= BOUND)) || fail "$what took $QSECS s (bound $BOUND s)"
    server_alive || fail "the server died after $what"
    ok "$what: EIO after $QSECS s, server alive"
}

# open_fails WHAT PATTERN SPEC [OPTIONS...]: a new server exits 1 within
# BOUND with a message matching PATTERN.
open_fails() {
    local what=$1 pat=$2 spec=$3 t0 rc=0
    shift 3
    t0=$SECONDS
    timeout --kill-after=5 $((2 * BOUND)) "$BLOCKPORT" serve --unix "$T/x.sock" \
        "$@" "$spec" </dev/null >open.log 2>&1 || rc=$?
    local secs=$((SECONDS - t0))
    ((rc != 124 && rc != 137)) || fail "$what: the open hung"
    [[ $rc -eq 1 ]] || { cat open.log; fail "$what: exit $rc, expected 1"; }
    grep -qE "$pat" open.log || { cat open.log; fail "$what: message does not match '$pat'"; }
    ((secs <= BOUND)) || fail "$what: took $secs s (bound $BOUND s)"
    check_sanitizer_reports open.log
    ok "$what ($secs s): $(tail -n1 open.log)"
}

check "a spec naming what does not exist fails clearly"
run rbd snap create "$POOL/img@s1" || fail "rbd snap create"
open_fails "missing pool" "no such pool" "rbd:nopool/img" --rbd-timeout $TO
open_fails "missing image" "no such image" "rbd:$POOL/noimg" --rbd-timeout $TO
open_fails "missing snapshot" "no such image or snapshot" "rbd:$POOL/img@nosnap" --rbd-timeout $TO
open_fails "bad conf path" "cannot read the Ceph configuration $T/nothere.conf" \
    "rbd:$POOL/img:conf=$T/nothere.conf" --rbd-timeout $TO
open_fails "unreachable monitor" "cannot connect to the Ceph cluster" \
    "rbd:$POOL/img:mon_host=127.0.0.1\\:1" --rbd-timeout 3

check "a killed OSD: EIO within the timeout, no hang, service resumes"
start_server --rbd-timeout $TO "rbd:$POOL/img"
qio_ok 'write -P 0x11 0 8M' 'write -P 0x12 32M 4M' 'read -P 0x11 0 8M' ||
    { cat qio.out; fail "write before the kill"; }
# lock_holder FILE: the locker and address of the image's lock ("client.N
# ADDR"); librbd renews the lock's cookie when it re-establishes its watch.
lock_holder() {
    run rbd lock ls "$POOL/img" >lock.txt || fail "rbd lock ls"
    awk '$2 == "auto" {print $1, $NF}' lock.txt >"$1"
    [[ -s $1 ]] || { cat lock.txt; fail "the server holds no lock"; }
}
lock_holder lock-before.txt
ceph_cluster kill-osd
# Objects that do not exist read as zeroes from the object map alone; 32M
# exists, and librbd caches no reads.
expect_eio "read" 'read 32M 64k'
expect_eio "write and flush" 'write -P 0x22 40M 64k' 'flush'
ceph_cluster start-osd || fail "start-osd"
wait_until 90 qio_ok 'read -P 0x11 0 8M' ||
    { cat qio.out; cat "$T/server.log"; fail "reads do not succeed again within 90 s of the OSD's return"; }
qio_ok 'write -P 0x33 40M 64k' 'flush' 'read -P 0x33 40M 64k' ||
    { cat qio.out; fail "write after the OSD's return"; }
ok "reads and writes succeed again; the data written before is intact"
# The server's lock outlived the outage: the same holder, and another
# writer is still refused.
lock_holder lock-after.txt
cmp -s lock-before.txt lock-after.txt ||
    { cat lock-before.txt lock-after.txt; fail "the lock changed hands"; }
open_fails "a second writer after the outage" "exclusive lock" "rbd:$POOL/img" --rbd-timeout $TO

check "a killed monitor: I/O goes on or fails with EIO, never hangs"
ceph_cluster kill-mon
qio_timed 'read -P 0x11 0 8M' 'write -P 0x44 44M 64k' 'flush' 'read -P 0x44 44M 64k'
((QRC != 124 && QRC != 137)) || fail "I/O hung with the monitor down"
((QSECS <= BOUND)) || fail "I/O took $QSECS s with the monitor down"
server_alive || fail "the server died with the monitor down"
if [[ $QRC -eq 0 ]] && ! grep -qE 'Pattern verification failed|error' qio.out; then
    ok "I/O goes on without the monitor ($QSECS s)"
    MON_IO=ok
else
    grep -q 'Input/output error' qio.out || { cat qio.out; fail "neither success nor EIO"; }
    ok "EIO after $QSECS s"
fi
open_fails "a new server while the monitor is down" "cannot connect to the Ceph cluster" \
    "rbd:$POOL/img" -r --rbd-timeout $TO
ceph_cluster start-mon || fail "start-mon"
wait_until 90 qio_ok 'read -P 0x11 0 8M' 'write -P 0x55 48M 64k' 'flush' ||
    { cat qio.out; fail "I/O does not succeed within 90 s of the monitor's return"; }
ok "I/O works after the monitor's return"
stop_server

check "QEMU's rbd driver reads what the server wrote"
cmds=(-c 'read -P 0x11 0 8M' -c 'read -P 0x12 32M 4M' -c 'read -P 0x33 40M 64k' -c 'read -P 0x55 48M 64k')
[[ ${MON_IO:-} == ok ]] && cmds+=(-c 'read -P 0x44 44M 64k')
run qemu-io -f raw -r "${cmds[@]}" "rbd:$POOL/img" >qio.out 2>&1 &&
    ! grep -q 'Pattern verification failed' qio.out || { cat qio.out; fail "data lost"; }
ok "the image holds every acknowledged write"
