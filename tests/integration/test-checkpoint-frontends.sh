#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Checkpoints of `mount` and `vhost` (issue 29): with --control and
# --views-unix, the checkpoint verbs take views of the disk (the default
# export "", so views "@NAME") that the same process serves read-only over
# NBD on the --views-unix socket.
#   - mount of a qcow2 image: writes through the mounted file, checkpoint
#     c1, more writes; "@c1" is the image as it was at c1; c2's view offers
#     qemu:dirty-bitmap:c1 marking exactly the 64 KiB granules written in
#     between; release and list; a read-only mount refuses (EROFS);
#   - vhost (no guest: an idle device): the view equals the image, the view
#     socket lists only the views; without --views-unix checkpoint says what
#     to add; kill -9 with a view open leaves no fleece file.
source "$(dirname "$0")/lib.sh"
has_feature fuse || has_feature vhost || skip "blockport was built without FUSE and vhost"
require qemu-img qemu-io
require_py_nbd
cd "$T"
mkdir fleece

ctl() { timeout 60 "$BLOCKPORT" ctl "$T/ctl.sock" "$@"; }
fleece_files() { find fleece -type f | wc -l; }

# expect_ctl_error PATTERN ARGS...: blockport ctl fails naming PATTERN.
expect_ctl_error() {
    local pattern=$1 rc=0
    shift
    ctl "$@" >out.txt 2>err.txt || rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "$pattern" err.txt ||
        fail "ctl $*: expected an error with '$pattern'; got $rc: $(cat out.txt err.txt)"
}

# same_as VIEW FILE: export VIEW of the views socket reads as FILE.
same_as() {
    "$PY" - "$T/views.sock" "$1" "$2" <<'EOF'
import nbd, sys
h = nbd.NBD()
h.set_export_name(sys.argv[2])
h.connect_unix(sys.argv[1])
want = open(sys.argv[3], "rb").read()
if h.get_size() != len(want):
    sys.exit("%s: %d bytes, want %d" % (sys.argv[2], h.get_size(), len(want)))
step = 1 << 20
for off in range(0, len(want), step):
    if h.pread(step, off) != want[off:off + step]:
        sys.exit("%s differs in the MiB at %d" % (sys.argv[2], off))
EOF
}

qemu-img create -q -f qcow2 disk.qcow2 8M
qemu-io -f qcow2 -c 'write -P 0x11 0 1M' disk.qcow2 >/dev/null

MOUNT_PID=
is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
trap 'rc=$?; set +e; is_mounted "$T/mnt" && fusermount3 -u -z "$T/mnt"; (exit $rc); _cleanup' EXIT

# mount_fg OPTIONS...: blockport mount --foreground of disk.qcow2 on mnt
# with the control and views sockets, live once the pid file is there.
mount_fg() {
    rm -f mount.pid
    "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P "$T/mount.pid" \
        --control "$T/ctl.sock" --views-unix "$T/views.sock" \
        --fleece-dir "$T/fleece" --name disk --no-partitions "$@" \
        disk.qcow2 mnt </dev/null >>mount.log 2>&1 &
    MOUNT_PID=$!
    track_pid "$MOUNT_PID"
    wait_file 15 "$T/mount.pid" "$MOUNT_PID" ||
        { cat mount.log; fail "mount not live"; }
}

unmount() {
    fusermount3 -u "$T/mnt" || fail "fusermount3 -u"
    wait_until 30 _pid_gone "$MOUNT_PID" || fail "mount still running"
    local rc=0
    wait "$MOUNT_PID" 2>/dev/null || rc=$?
    [[ $rc -eq 0 ]] || { cat mount.log; fail "mount exited $rc"; }
    [[ ! -e ctl.sock && ! -e views.sock ]] || fail "sockets left after unmount"
    check_sanitizer_reports mount.log
}

check "mount: a view is the disk at its checkpoint; the next one's bitmap"
if ! can_mount; then
    skip_case "no FUSE (in blockport), /dev/fuse or fusermount3"
else
    mkdir mnt
    mount_fg
    # pwrite_granules FILE BYTE G...: 4 KiB of BYTE inside each 64 KiB
    # granule G (at its middle), synced.
    pwrite_granules() {
        "$PY" - "$@" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
for g in sys.argv[3:]:
    os.pwrite(fd, bytes([int(sys.argv[2], 0)]) * 4096, int(g) * 65536 + 30000)
os.fsync(fd)
EOF
    }
    pwrite_granules mnt/disk 0x22 2 40
    ctl checkpoint c1 >c1.json || fail "checkpoint c1"
    grep -q '"view":"@c1"' c1.json || fail "c1: $(cat c1.json)"
    cp mnt/disk at-c1.raw
    pwrite_granules mnt/disk 0x33 0 2 7 100
    same_as @c1 at-c1.raw || fail "@c1 is not the disk as it was at c1"
    ctl checkpoint c2 >c2.json || fail "checkpoint c2"
    grep -q 'qemu:dirty-bitmap:c1' c2.json || fail "c2: $(cat c2.json)"
    "$PY" - "$T/views.sock" <<'EOF' || fail "the dirty bitmap of @c2"
import nbd, sys
h = nbd.NBD()
h.add_meta_context("qemu:dirty-bitmap:c1")
h.set_export_name("@c2")
h.connect_unix(sys.argv[1])
dirty = set()
def cb(ctx, off, ents, err):
    for i in range(0, len(ents), 2):
        if ents[i + 1] & 1:
            dirty.update(range((off >> 16), (off + ents[i]) >> 16))
        off += ents[i]
h.block_status(h.get_size(), 0, cb)
if dirty != {0, 2, 7, 100}:
    sys.exit("dirty granules %s, want [0, 2, 7, 100]" % sorted(dirty))
print("@c2: qemu:dirty-bitmap:c1 marks granules 0, 2, 7, 100")
EOF
    "$PY" - "$T/views.sock" <<'EOF' || fail "the views listed"
import nbd, sys
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_unix(sys.argv[1])
names = []
h.opt_list(lambda n, d: names.append(n) or 0)
if sorted(names) != ["@c1", "@c2"]:
    sys.exit("listed %s" % names)
EOF
    ctl release c1 | grep -q '"view":"@c1"' || fail "release c1"
    ctl list >list.json
    "$PY" - list.json <<'EOF' || fail "list: $(cat list.json)"
import json, sys
cps = json.load(open(sys.argv[1]))["checkpoints"]
assert [c["name"] for c in cps] == ["c1", "c2"], cps
assert "view" not in cps[0] and cps[1]["view"] == "@c2", cps
assert cps[1]["recording"] and cps[1]["export"] == "", cps
EOF
    unmount
    qemu-img convert -O raw disk.qcow2 after.raw
    cmp -s after.raw at-c1.raw && fail "the writes after c1 did not reach the image"
    ok "@c1 as at c1; c1's bitmap exact; listed, released"

    check "mount: a read-only mount takes no checkpoint"
    mount_fg -r
    expect_ctl_error "read-only" checkpoint c9
    grep -q '"errno":"EROFS"' out.txt || fail "not EROFS: $(cat out.txt)"
    unmount
    ok "refused: read-only"
fi

if has_feature vhost; then
    check "vhost: the view of an idle device, kill -9 leaves no fleece"
    qemu-img convert -O raw disk.qcow2 expect.raw
    start_vhost() {
        rm -f vhost.pid
        "${_env_reset[@]}" "$BLOCKPORT" vhost --socket "$T/vhost.sock" \
            -P "$T/vhost.pid" --control "$T/ctl.sock" "$@" disk.qcow2 \
            </dev/null >>vhost.log 2>&1 &
        VHOST_PID=$!
        track_pid "$VHOST_PID"
        wait_file 15 "$T/vhost.pid" "$VHOST_PID" ||
            { cat vhost.log; fail "vhost did not start"; }
    }
    start_vhost --views-unix "$T/views.sock" --fleece-dir "$T/fleece"
    ctl checkpoint v1 | grep -q '"view":"@v1"' || fail "checkpoint v1"
    same_as @v1 expect.raw || fail "@v1 is not the image"
    ctl list | grep -q '"name":"v1"' || fail "list: no v1"
    kill -KILL "$VHOST_PID"
    wait "$VHOST_PID" 2>/dev/null || true
    wait_until 10 file_unlocked disk.qcow2 || fail "disk.qcow2 still locked after kill -9"
    [[ $(fleece_files) -eq 0 ]] || fail "fleece files left after kill -9"
    ok "@v1 equals the image; no fleece file after kill -9"

    check "vhost without --views-unix: checkpoint says what to add"
    start_vhost
    expect_ctl_error "views-unix" checkpoint v2
    kill -TERM "$VHOST_PID"
    wait_until 30 _pid_gone "$VHOST_PID" || fail "vhost still running"
    rc=0
    wait "$VHOST_PID" 2>/dev/null || rc=$?
    [[ $rc -eq 0 ]] || fail "vhost exited $rc"
    check_sanitizer_reports vhost.log
    ok "refused, naming --views-unix"
else
    skip_case "blockport was built without vhost"
fi
