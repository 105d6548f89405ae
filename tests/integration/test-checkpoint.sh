#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Checkpoints of a live image (issue 29): `serve --control` and
# `blockport ctl SOCKET checkpoint|release|list`.
#   - ckptcheck.py: a checkpoint taken under four concurrent writers is
#     the image at that instant (a model of acknowledged and later writes);
#     a view stays the image at its checkpoint through writes, zeroes and
#     trims; the next view's qemu:dirty-bitmap:PREV marks exactly the
#     granules changed between the two; list and release;
#   - refusals: a read-only export, bad and duplicate names, an unknown
#     checkpoint; the server keeps serving;
#   - a fleece limit breaks the view (reads EIO, list says why) and never
#     fails a write; on a raw image (bitmaps in memory);
#   - kill -9 with views open: the live image keeps every acknowledged
#     write (qemu-img check, compare), no fleece file is left, and the next
#     server takes checkpoints again;
#   - a qcow2 image keeps the checkpoints' bitmaps (qemu-img info: the
#     latest enabled, the older ones not), so the first checkpoint after a
#     restart offers qemu:dirty-bitmap:PREV marking exactly the granules
#     written since PREV, before and after the restart; an image bitmap of
#     the checkpoint's name is refused; after kill -9 the bitmaps left in
#     use are not resumed (the next checkpoint has no PREV);
#   - a checkpoint of an nbd:// source (the copy-before-write filter over a
#     source that is no file): the view is the source as it was.
source "$(dirname "$0")/lib.sh"
require qemu-img
"$PY" -c 'import nbd' 2>/dev/null || skip "python3 libnbd (nbd module) missing"
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$T"
mkdir fleece

# make_image FILE FMT: 64 MiB whose 4 KiB block B holds (B, 0) repeated.
make_image() {
    "$PY" - pattern.raw <<'EOF'
import struct, sys
with open(sys.argv[1], "wb") as f:
    for b in range(16384):
        f.write(struct.pack("<QQ", b, 0) * 256)
EOF
    qemu-img convert -f raw -O "$2" pattern.raw "$1"
    rm -f pattern.raw
}

ctl() { timeout 60 "$BLOCKPORT" ctl "$T/ctl.sock" "$@"; }

# expect_ctl_error PATTERN ARGS...: blockport ctl fails naming PATTERN.
expect_ctl_error() {
    local pattern=$1 rc=0
    shift
    ctl "$@" >out.txt 2>err.txt || rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "$pattern" err.txt ||
        fail "ctl $*: expected an error with '$pattern'; got $rc: $(cat out.txt err.txt)"
}

fleece_files() { find fleece -type f | wc -l; }

check "a checkpoint under concurrent writers is the image at that instant"
make_image disk.qcow2 qcow2
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
timeout 300 "$PY" "$HERE/ckptcheck.py" "$SOCK" "$T/ctl.sock" "$BLOCKPORT" ||
    fail "ckptcheck.py failed"
ok "views, bitmaps, list and release"

check "refusals leave the server serving"
expect_ctl_error "exists" checkpoint c3
expect_ctl_error "@" checkpoint "a@b"
expect_ctl_error "name" checkpoint ""
expect_ctl_error "long" checkpoint "$(printf 'n%.0s' {1..1024})"
expect_ctl_error "no export" checkpoint x nosuch
expect_ctl_error "no view" release nosuch
"$PY" - "$SOCK" <<'EOF' || fail "the server stopped serving after the refusals"
import nbd, sys
h = nbd.NBD()
h.connect_uri("nbd+unix:///?socket=" + sys.argv[1])
h.pread(4096, 0)
EOF
stop_server
qemu-img check -q disk.qcow2 || fail "qemu-img check after the checkpoints"
[[ $(fleece_files) -eq 0 ]] || fail "fleece files left after a clean stop"
ok "duplicate, '@', empty, too long, unknown export and view: refused"

check "a read-only export takes no checkpoint"
start_server --control "$T/ctl.sock" -r -f qcow2 disk.qcow2
expect_ctl_error "read-only" checkpoint c9
stop_server
ok "refused: read-only"

check "the fleece limit breaks the view, never a write (raw image)"
make_image disk.raw raw
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" \
    --fleece-limit 1M -f raw disk.raw
ctl checkpoint full >/dev/null
"$PY" - "$SOCK" <<'EOF' || fail "writes past the fleece limit"
import nbd, sys
h = nbd.NBD()
h.connect_uri("nbd+unix:///?socket=" + sys.argv[1])
for i in range(40):  # 40 granules of 64 KiB: 2.5 MiB to copy aside
    h.pwrite(b"\xab" * 4096, i * (1 << 20))
h.flush()
v = nbd.NBD()
v.connect_uri("nbd+unix:///@full?socket=" + sys.argv[1])
try:
    v.pread(4096, 0)
    sys.exit("a broken view still reads")
except nbd.Error as e:
    if e.errno != "EIO":
        sys.exit("a broken view reads %s, not EIO" % e.errno)
EOF
ctl list >list.json
grep -q '"broken":true' list.json && grep -q 'fleece limit' list.json ||
    fail "list does not say the view broke: $(cat list.json)"
stop_server
ok "view broken with EIO and a reason; every write succeeded"

check "kill -9 with views open: the image is whole, no fleece is left"
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
ctl checkpoint k1 >/dev/null
ctl checkpoint k2 >/dev/null
qemu-io -f raw -c 'write -P 0x5a 1M 3M' -c flush "$URI" >/dev/null ||
    fail "write through the server"
[[ $(fleece_files) -eq 0 ]] || fail "a fleece file is visible in --fleece-dir"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=
wait_until 10 file_unlocked disk.qcow2 || fail "disk.qcow2 still locked after kill -9"
[[ $(fleece_files) -eq 0 ]] || fail "fleece files left after kill -9"
KILLED_CHECK=0
qemu-img check -q disk.qcow2 || KILLED_CHECK=$?
[[ $KILLED_CHECK -eq 0 || $KILLED_CHECK -eq 3 ]] ||
    fail "qemu-img check after kill -9: $KILLED_CHECK"
qemu-io -f qcow2 -c 'read -P 0x5a 1M 3M' disk.qcow2 >/dev/null ||
    fail "the flushed write was lost"
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
ctl checkpoint k3 >/dev/null
stop_server
ok "flushed data kept, no fleece file, checkpoints again after a restart"

# bitmap_flags IMAGE NAME: the flags qemu-img info gives bitmap NAME
# ("in-use auto", "" for none, "missing" without such a bitmap).
bitmap_flags() {
    qemu-img info -U --output=json "$1" | "$PY" -c '
import json, sys
d = json.load(sys.stdin).get("format-specific", {}).get("data", {})
f = [b["flags"] for b in d.get("bitmaps", []) if b["name"] == sys.argv[1]]
print(" ".join(f[0]) if f else "missing")' "$2"
}

# dirty_granules VIEW CTX: the 64 KiB granules context CTX of export VIEW
# marks, space-separated.
dirty_granules() {
    "$PY" - "$SOCK" "$1" "$2" <<'EOF'
import nbd, sys
sock, view, ctx = sys.argv[1:4]
h = nbd.NBD()
h.add_meta_context(ctx)
h.set_export_name(view)
h.connect_uri("nbd+unix:///%s?socket=%s" % (view, sock))
size, off, got = h.get_size(), 0, []
while off < size:
    ext = []
    h.block_status(size - off, off,
                   lambda m, o, e, err: ext.extend(e) if m == ctx else 0)
    for i in range(0, len(ext), 2):
        if ext[i + 1] & 1:
            got += range(off >> 16, (off + ext[i] + 65535) >> 16)
        off += ext[i]
print(" ".join(map(str, sorted(set(got)))))
EOF
}

expect_flags() {
    local got
    got=$(bitmap_flags p.qcow2 "$1")
    [[ $got == "$2" ]] || fail "bitmap $1 has flags '$got', expected '$2'"
}

pserve() {
    start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 p.qcow2
}

check "qcow2 keeps the checkpoints' bitmaps: an incremental across a restart"
qemu-img create -q -f qcow2 p.qcow2 16M
pserve
ctl checkpoint c1 >/dev/null
qemu-io -f raw -c 'write 0 4k' "$URI" >/dev/null || fail "write"
stop_server
expect_flags c1 auto
pserve
ctl checkpoint c2 >ans.json
grep -q '"qemu:dirty-bitmap:c1"' ans.json ||
    fail "c2 after a restart offers no bitmap c1: $(cat ans.json)"
qemu-io -f raw -c 'write 1M 4k' "$URI" >/dev/null || fail "write"
stop_server
expect_flags c1 ""
expect_flags c2 auto
qemu-img check -q p.qcow2 || fail "qemu-img check after two checkpoints"
pserve
expect_ctl_error "bitmap 'c1'" checkpoint c1
qemu-io -f raw -c 'write 3145738 100' -c 'write -z 8M 128k' "$URI" >/dev/null ||
    fail "write"
ctl checkpoint c3 >ans.json
grep -q '"qemu:dirty-bitmap:c2"' ans.json ||
    fail "c3 offers no bitmap c2: $(cat ans.json)"
got=$(dirty_granules @c3 qemu:dirty-bitmap:c2)
[[ $got == "16 48 128 129" ]] ||
    fail "@c3's bitmap c2 marks granules '$got', expected '16 48 128 129'"
ok "c1 stopped, c2 recording in the image; @c3's c2 marks exactly the writes since c2"

check "kill -9: the bitmaps left in use are not resumed"
ctl checkpoint c4 >/dev/null
qemu-io -f raw -c 'write 2M 4k' -c flush "$URI" >/dev/null || fail "write"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=
wait_until 10 file_unlocked p.qcow2 || fail "p.qcow2 still locked after kill -9"
expect_flags c4 "in-use auto"
pserve
ctl checkpoint c5 >ans.json
grep -q 'qemu:dirty-bitmap:' ans.json &&
    fail "c5 after kill -9 offers a bitmap: $(cat ans.json)"
stop_server
expect_flags c5 auto
expect_flags c4 "in-use auto"
qemu-img check -q p.qcow2 || fail "qemu-img check after kill -9 and a restart"
ok "c4 inconsistent, c5 without a previous checkpoint"

check "a checkpoint of an nbd:// source: the filter over a non-file source"
require qemu-io
qemu-img create -q -f raw nb.raw 4M
qemu-io -f raw -c 'write -P 0x11 0 2M' nb.raw >/dev/null || fail "write nb.raw"
cp nb.raw nb-before.raw
rm -f nbbase.pid
"$BLOCKPORT" serve --unix "$T/nbbase.sock" --pid-file "$T/nbbase.pid" -f raw \
    nb.raw 2>>nbbase.log &
NBBASE_PID=$!
track_pid "$NBBASE_PID"
wait_file 10 "$T/nbbase.pid" "$NBBASE_PID" || { cat nbbase.log; fail "base server"; }
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" \
    "nbd+unix:///?socket=$T/nbbase.sock"
ctl checkpoint n1 >/dev/null
qemu-io -f raw -c 'write -P 0x22 512k 1M' -c flush "$URI" >/dev/null ||
    fail "write through the server"
qemu-img compare -q -f raw -F raw "nbd+unix:///@n1?socket=$SOCK" nb-before.raw ||
    fail "view @n1 is not the source at n1"
qemu-io -f raw -r -c 'read -P 0x22 512k 1M' "$URI" >/dev/null ||
    fail "the live export lost the write"
stop_server
kill "$NBBASE_PID" && wait "$NBBASE_PID" 2>/dev/null
qemu-io -f raw -r -c 'read -P 0x22 512k 1M' nb.raw >/dev/null ||
    fail "the write did not reach the nbd:// source"
ok "view @n1 as it was, writes reached the source"
