#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport serve (and mount) of a Ceph RBD image, on one throw-away
# cluster (contrib/ceph-cluster.sh): qemu-io patterns and fio verify
# through NBD; multi-conn (write, flush and read on three connections);
# block status shows the untouched objects as holes; write zeroes, trim and
# FUA; a snapshot served read-only with the data as of the snapshot; two
# servers on one image (the second fails naming the exclusive lock, shares
# read-only, or waits with --rbd-lock wait until the first exits); --cache
# none turning librbd's cache off (its admin socket); the FUSE mount.
# Every write also goes to a raw shadow file, and QEMU's own rbd driver
# (the oracle) finds the image equal to it at the end.
# Skips (77) only without the Ceph packages or qemu-block-extra.
source "$(dirname "$0")/lib.sh"
require_feature rbd
require qemu-io qemu-img nbdinfo nbdsh fio
require_py_nbd
require_qemu_rbd
ceph_cluster_start
cd "$T"
CMD_TIMEOUT=120
SERVER_START_TIMEOUT=60 # librados connects and opens the image first
POOL=$CEPH_POOL

run rbd create "$POOL/img" --size 64M || fail "rbd create"
truncate -s 64M shadow.raw

# qio TARGET CMDS...: qemu-io -f raw with one -c per command; the output in
# qio.out; fails on an error or a pattern mismatch.
qio() {
    local target=$1 c
    shift
    local -a args=()
    for c in "$@"; do args+=(-c "$c"); done
    run qemu-io -f raw "${args[@]}" "$target" >qio.out 2>&1 &&
        ! grep -qE 'Pattern verification failed|error|Error' qio.out ||
        { cat qio.out; fail "qemu-io on $target: $*"; }
}

# both CMDS...: the same writes through NBD and on the shadow.
both() {
    qio "$URI" "$@"
    qio shadow.raw "$@"
}

# same_as_shadow TARGET [SHADOW]: qemu-img compare, raw on both sides.
same_as_shadow() {
    run qemu-img compare -f raw -F raw "$1" "${2:-shadow.raw}" >cmp.out 2>&1 ||
        { cat cmp.out; fail "$1 differs from ${2:-shadow.raw}"; }
}

# launch2 NAME ARGS...: a second server on NAME.sock, pid file NAME.pid,
# log NAME.log; its pid in PID2.
launch2() {
    local name=$1
    shift
    rm -f "$name.pid" "$name.sock"
    echo "+ $BLOCKPORT serve --unix $T/$name.sock --pid-file $T/$name.pid $*" >&2
    "${_env_reset[@]}" "$BLOCKPORT" serve --unix "$T/$name.sock" \
        --pid-file "$T/$name.pid" "$@" </dev/null >"$name.log" 2>&1 &
    PID2=$!
    track_pid "$PID2"
}

# stop2 PID NAME: SIGTERM, exit status 0, no sanitizer report.
stop2() {
    kill -TERM "$1"
    wait_until 30 _pid_gone "$1" || fail "$2 did not exit within 30 s of SIGTERM"
    local rc=0
    wait "$1" || rc=$?
    [[ $rc -eq 0 ]] || { cat "$2.log"; fail "$2 exited with $rc"; }
    check_sanitizer_reports "$2.log"
}

check "qemu-io patterns and fio verify through serve rbd:"
start_server "rbd:$POOL/img"
fio_verify "$URI"
# The shadow starts as what fio left (read through blockport, compared with
# QEMU's rbd driver at the end), then gets the same writes.
run qemu-img convert -f raw -O raw "$URI" shadow.raw || fail "copy for the shadow"
both 'write -P 0x11 0 1M' 'write -P 0x22 3M 2M' 'write -P 0x33 60M 4M' \
    'write -P 0x44 8191k 3k'
qio "$URI" 'read -P 0x11 0 1M' 'read -P 0x22 3M 2M' 'read -P 0x33 60M 4M' \
    'read -P 0x44 8191k 3k'
same_as_shadow "$URI"
ok "patterns and fio's data read back; NBD view equals the shadow"

check "multi-conn: write, flush and read on three connections"
nbdinfo --json "$URI" >info.json
"$PY" -c 'import json,sys; sys.exit(not json.load(open("info.json"))["exports"][0]["can_multi_conn"])' ||
    { cat info.json; fail "can_multi_conn is not true"; }
cat >mc.py <<'EOF'
import nbd, sys
hs = []
for _ in range(3):
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    hs.append(h)
data = bytes([0x5a]) * 65536
hs[0].pwrite(data, 40 << 20)
hs[1].flush()
assert hs[2].pread(65536, 40 << 20) == data, "third connection reads other data"
for h in hs:
    h.shutdown()
EOF
run "$PY" mc.py "$URI" || fail "multi-conn write/flush/read"
qio shadow.raw 'write -P 0x5a 40M 64k'
ok "can_multi_conn; the third connection reads what the first wrote"

check "write zeroes, trim and FUA"
both 'write -P 0x77 12M 1M' 'write -z 12M 256k' 'discard 12800k 256k' \
    'write -f -P 0x66 13M 64k'
qio "$URI" 'read -P 0 12M 256k' 'read -P 0x77 12544k 256k' \
    'read -P 0 12800k 256k' 'read -P 0x77 13056k 256k' 'read -P 0x66 13M 64k'
ok "zeroed and trimmed ranges read zeroes, the FUA write its data"

check "block status: untouched objects are holes"
run rbd create "$POOL/map" --size 64M || fail "rbd create map"
# A second export of the same server would do; a second server is simpler.
launch2 map "rbd:$POOL/map"
wait_file 60 map.pid "$PID2" || { cat map.log; fail "server of map did not start"; }
MAPURI="nbd+unix:///?socket=$T/map.sock"
qio "$MAPURI" 'write -P 1 0 4k' 'write -P 2 8M 4k' 'write -P 3 33M 64k'
run nbdinfo --map --json "$MAPURI" >map.json || fail "nbdinfo --map"
"$PY" - map.json <<'EOF' || { cat map.json; fail "block status"; }
import json, sys
M = 1 << 20
written = [(0, 4096), (8 * M, 4096), (33 * M, 65536)]
ext = json.load(open(sys.argv[1]))
assert sum(e["length"] for e in ext) == 64 * M, "map does not cover 64M"
for e in ext:
    a, b = e["offset"], e["offset"] + e["length"]
    hit = any(o < b and a < o + n for o, n in written)
    # Untouched 4 MiB objects are hole,zero (type 3); written ones data.
    if hit:
        assert e["type"] & 1 == 0, "written range reported as hole: %r" % e
    elif not any(o // (4 * M) == a // (4 * M) for o, n in written):
        assert e["type"] == 3, "untouched object not hole,zero: %r" % e
holes = sum(e["length"] for e in ext if e["type"] == 3)
assert holes >= 52 * M, "only %d bytes of holes" % holes
print("holes: %d MiB" % (holes // M))
EOF
stop2 "$PID2" map
ok "only the written objects are data"

check "a snapshot is served read-only with the data as of the snapshot"
# The server holds the exclusive lock: librbd asks it to take the snapshot.
run rbd snap create "$POOL/img@s1" || fail "rbd snap create while serving"
cp shadow.raw shadow-s1.raw
both 'write -P 0x88 0 64k' 'write -P 0x99 50M 1M'
launch2 snap "rbd:$POOL/img@s1"
wait_file 60 snap.pid "$PID2" || { cat snap.log; fail "server of img@s1 did not start"; }
SNAPURI="nbd+unix:///?socket=$T/snap.sock"
nbdinfo --json "$SNAPURI" >info.json
"$PY" -c 'import json,sys; sys.exit(not json.load(open("info.json"))["exports"][0]["is_read_only"])' ||
    { cat info.json; fail "the snapshot's export is not read-only"; }
rc=0
timeout 60 qemu-io -f raw -c 'write -P 1 0 4k' "$SNAPURI" >qio.out 2>&1 || rc=$?
[[ $rc -ne 0 ]] && grep -qiE 'read-only|not permitted|permission denied' qio.out ||
    { cat qio.out; fail "qemu-io could write to the snapshot (exit $rc)"; }
# qemu-io refuses to open it for writing; a client that sends the write
# anyway (libnbd, strict mode off) must get EPERM back.
cat >rowrite.py <<'EOF'
import errno, nbd, sys
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
try:
    h.pwrite(b"\1" * 4096, 0)
    sys.exit("the write to the snapshot succeeded")
except nbd.Error as e:
    # libnbd gives the errno's name (or, in older versions, its number).
    name = errno.errorcode.get(e.errno, e.errno)
    assert name in ("EPERM", "EROFS"), "errno %r" % e.errno
    print(name)
EOF
errname=$(run "$PY" rowrite.py "$SNAPURI") || fail "write to the snapshot"
same_as_shadow "$SNAPURI" shadow-s1.raw
same_as_shadow "rbd:$POOL/img@s1" shadow-s1.raw
stop2 "$PID2" snap
ok "is_read_only; qemu-io refused, an NBD write got $errname; snapshot equals the shadow of its time"

check "a second writer fails naming the exclusive lock"
t0=$SECONDS
launch2 second "rbd:$POOL/img"
wait_until 30 _pid_gone "$PID2" || fail "a second writer still runs after 30 s"
secs=$((SECONDS - t0))
rc=0
wait "$PID2" || rc=$?
[[ $rc -ne 0 ]] || fail "the second writer exited 0"
grep -q 'exclusive lock' second.log || { cat second.log; fail "no word of the exclusive lock"; }
[[ ! -s second.pid ]] || fail "the second writer wrote its pid file"
ok "exit $rc after $secs s: $(grep -o 'the image is in use.*' second.log | head -1)"

check "a read-only second server shares the image"
launch2 ro -r "rbd:$POOL/img"
wait_file 60 ro.pid "$PID2" || { cat ro.log; fail "the read-only server did not start"; }
same_as_shadow "nbd+unix:///?socket=$T/ro.sock"
stop2 "$PID2" ro
ok "reads the same data as the writer serves"

check "--cache none turns librbd's cache off; the spec's rbd_cache wins"
# cache_is WANT SERVE-ARGS... -- SPEC-OPTS: a read-only server with those
# arguments and an admin socket; fails unless librbd's rbd_cache in it is
# WANT.
cache_is() {
    local want=$1 args=() got
    shift
    while [[ $1 != -- ]]; do args+=("$1"); shift; done
    rm -f "$T/c.asok"
    launch2 c -r "${args[@]}" "rbd:$POOL/img:admin_socket=$T/c.asok$2"
    wait_file 60 c.pid "$PID2" || { cat c.log; fail "the server with ${args[*]} did not start"; }
    timeout 20 ceph --admin-daemon "$T/c.asok" config get rbd_cache >asok.out 2>&1 ||
        { cat asok.out; fail "no admin socket for ${args[*]}"; }
    stop2 "$PID2" c
    got=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["rbd_cache"])' asok.out) ||
        { cat asok.out; fail "unreadable admin socket answer"; }
    [[ $got == "$want" ]] || fail "serve ${args[*]} (spec options '$2'): rbd_cache is $got, not $want"
}
cache_is true -- ""                    # the Ceph configuration's default
cache_is false --cache none -- ""
cache_is false --cache directsync -- ""
cache_is true --cache writethrough -- ""
cache_is true --cache none -- ":rbd_cache=true" # the spec wins
ok "as qemu-nbd --cache with QEMU's rbd driver"

check "--rbd-lock wait serves once the first server exits"
launch2 waiter --rbd-lock wait "rbd:$POOL/img"
WAITER=$PID2
# While the first runs, the waiter must neither serve nor give up.
if wait_file 8 waiter.pid "$WAITER"; then
    fail "the waiter serves while the first server holds the lock"
fi
_pid_alive "$WAITER" || { cat waiter.log; fail "the waiter exited"; }
both 'write -P 0xab 20M 1M'
stop_server
wait_file 60 waiter.pid "$WAITER" || { cat waiter.log; fail "the waiter did not serve within 60 s of the first's exit"; }
URI="nbd+unix:///?socket=$T/waiter.sock"
both 'write -P 0xcd 21M 1M'
same_as_shadow "$URI"
stop2 "$WAITER" waiter
ok "waited, then served and wrote"

check "blockport mount rbd: (FUSE)"
if ! can_mount; then
    skip_case "no FUSE (in blockport), /dev/fuse or fusermount3"
else
    mkdir mnt
    is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
    trap 'rc=$?; set +e; is_mounted "$T/mnt" && fusermount3 -u -z "$T/mnt"; (exit $rc); _cleanup' EXIT
    "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P "$T/mount.pid" \
        -n disk "rbd:$POOL/img" "$T/mnt" </dev/null >mount.log 2>&1 &
    MPID=$!
    track_pid "$MPID"
    wait_file 60 mount.pid "$MPID" || { cat mount.log; fail "mount not live within 60 s"; }
    [[ $(stat -c %s mnt/disk) -eq $((64 << 20)) ]] || fail "mnt/disk has size $(stat -c %s mnt/disk)"
    random_file chunk 3
    for f in mnt/disk shadow.raw; do
        dd if=chunk of="$f" bs=4k seek=$((30 * 256 - 3)) conv=notrunc,fsync status=none ||
            fail "dd to $f"
    done
    cmp mnt/disk shadow.raw || fail "the mounted file differs from the shadow"
    fusermount3 -u "$T/mnt" || fail "fusermount3 -u"
    wait_until 30 _pid_gone "$MPID" || fail "mount still runs after fusermount3 -u"
    rc=0
    wait "$MPID" || rc=$?
    [[ $rc -eq 0 ]] || { cat mount.log; fail "mount exited $rc"; }
    check_sanitizer_reports mount.log
    ok "dd and cmp through the mounted file"
fi

check "QEMU's rbd driver finds the image equal to the shadow"
same_as_shadow "rbd:$POOL/img"
ok "image intact after every case"
