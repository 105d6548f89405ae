#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Persistent dirty bitmaps in images blockport writes: the same writes go
# to two identical copies, one through qemu-io (QEMU's own bitmap code),
# one through blockport serve (qemu-io over NBD); afterwards both must
# have the same data, the same bitmaps with the same flags, and the same
# dirty bits (read back with qemu-nbd -B and nbdinfo), and qemu-img check
# must find both clean.  Also: bitmaps are IN_USE while served, bitmaps
# left IN_USE by a crash stay so, a bitmap blockport cannot keep refuses
# writes (not the image), and a dirty lazy-refcounts image with bitmaps is
# repaired when opened for writing.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io qemu-nbd nbdinfo timeout

# bitmaps IMAGE: "name:flags" per bitmap, flags comma-separated.
bitmaps() {
  qemu-img info -U --output=json "$1" | "$PY" -c '
import json, sys
info = json.load(sys.stdin)
data = info.get("format-specific", {}).get("data", {})
for b in data.get("bitmaps", []):
    print("%s:%s:%s" % (b["name"], b["granularity"], ",".join(b["flags"])))'
}

# dirty_map IMAGE NAME: the dirty extents of bitmap NAME, as qemu-nbd
# exports them.
dirty_map() {
  local sock=$T/qnbd.sock pid
  rm -f "$sock"
  qemu-nbd -r -f qcow2 -B "$2" -k "$sock" "$1" &
  pid=$!
  track_pid "$pid"
  wait_until 10 test -S "$sock" || fail "qemu-nbd did not start"
  nbdinfo --map="qemu:dirty-bitmap:$2" "nbd+unix:///?socket=$sock"
  kill "$pid" 2>/dev/null || true # it leaves after one client anyway
  wait "$pid" 2>/dev/null || true
}

# same_bitmaps A B: flags, dirty bits and data agree.
same_bitmaps() {
  [[ "$(bitmaps "$1")" == "$(bitmaps "$2")" ]] ||
    fail "bitmaps differ: $(bitmaps "$1" | tr '\n' ' ') vs $(bitmaps "$2" | tr '\n' ' ')"
  local b
  for b in $(bitmaps "$1" | cut -d: -f1); do
    dirty_map "$1" "$b" >"$T/a.map"
    dirty_map "$2" "$b" >"$T/b.map"
    diff -u "$T/a.map" "$T/b.map" || fail "bitmap $b: dirty bits differ"
  done
  qemu-img compare -q "$1" "$2" || fail "data differs"
}

qemu_clean() {
  local rc=0
  qemu-img check "$1" >"$T/q.txt" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$T/q.txt"; fail "qemu-img check $1: $rc"; }
}

# Write with qemu-io to Q and through blockport to B: the qemu-io -c
# arguments that follow.
write_both() {
  local q=$1 b=$2
  shift 2
  qemu-io -f qcow2 "$@" "$q" >/dev/null || fail "qemu-io on $q"
  start_server "$b"
  run qemu-io -f raw "$@" "$URI" >/dev/null || fail "qemu-io over NBD"
  stop_server
}

W1=(-c 'write -P 3 100k 10k' -c 'write -z 20M 1M' -c 'discard 30M 2M'
  -c 'write -P 4 63M 1M' -c 'write -P 5 40M 4k')
W2=(-c 'write -P 6 100k 64k' -c 'write -P 7 50M 3M' -c 'write -z 60M 64k')

for cs in 65536 4096; do
  check "cluster size $cs: writes through serve keep the bitmaps, as QEMU"
  img=$T/base-$cs.qcow2
  qemu-img create -q -f qcow2 -o cluster_size=$cs "$img" 64M
  qemu-io -f qcow2 -c 'write -P 1 0 1M' "$img" >/dev/null
  qemu-img bitmap --add "$img" b0
  qemu-img bitmap --add --disable "$img" b1
  # 512-byte granularity: 16 KiB of bits, several data clusters at 4k.
  qemu-img bitmap --add -g 512 "$img" b2
  qemu-io -f qcow2 -c 'write -P 2 8M 64k' "$img" >/dev/null
  cp "$img" "$T/q.qcow2"
  cp "$img" "$T/b.qcow2"
  # While served, the enabled bitmaps are marked in use.
  start_server "$T/b.qcow2"
  flags=$(bitmaps "$T/b.qcow2" | tr '\n' ' ')
  # (The default granularity is the cluster size.)
  [[ $flags == "b0:$cs:in-use,auto b1:$cs: b2:512:in-use,auto " ]] ||
    fail "while served: $flags"
  stop_server
  [[ "$(bitmaps "$T/b.qcow2")" == "$(bitmaps "$img")" ]] ||
    fail "after serving: $(bitmaps "$T/b.qcow2" | tr '\n' ' ')"
  write_both "$T/q.qcow2" "$T/b.qcow2" "${W1[@]}"
  qemu_clean "$T/b.qcow2"
  same_bitmaps "$T/q.qcow2" "$T/b.qcow2"
  ok "first session: same bitmaps, dirty bits and data as QEMU"
  # Again: now the bitmaps have data clusters, updated in place.
  write_both "$T/q.qcow2" "$T/b.qcow2" "${W2[@]}"
  qemu_clean "$T/b.qcow2"
  same_bitmaps "$T/q.qcow2" "$T/b.qcow2"
  rc=0
  "$BLOCKPORT" check "$T/b.qcow2" >"$T/bp.txt" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$T/bp.txt"; fail "blockport check: $rc"; }
  ok "second session too; blockport check agrees"
done

check "bitmaps left in use by a crash stay in use (inconsistent), as QEMU leaves them"
img=$T/crash.qcow2
qemu-img create -q -f qcow2 "$img" 64M
qemu-img bitmap --add "$img" b0
start_server "$img"
run qemu-io -f raw -c 'write -P 1 0 1M' -c flush "$URI" >/dev/null
STOP_EXPECT=137 stop_server KILL
[[ "$(bitmaps "$img")" == "b0:65536:in-use,auto" ]] ||
  fail "after a crash: $(bitmaps "$img")"
cp "$img" "$T/crash-q.qcow2"
write_both "$T/crash-q.qcow2" "$img" -c 'write -P 2 2M 64k'
[[ "$(bitmaps "$img")" == "$(bitmaps "$T/crash-q.qcow2")" ]] ||
  fail "flags: $(bitmaps "$img") vs QEMU's $(bitmaps "$T/crash-q.qcow2")"
qemu_clean "$img"
qemu-img compare -q "$img" "$T/crash-q.qcow2" || fail "data differs"
ok "still in use, image clean"

check "a bitmap blockport cannot keep consistent: writes refused with the reason, reads served"
img=$T/bad.qcow2
qemu-img create -q -f qcow2 "$img" 64M
qemu-img bitmap --add "$img" b0
qemu-io -f qcow2 -c 'write -P 1 0 1M' "$img" >/dev/null
# b0's data cluster gets refcount 2.
"$PY" - "$img" <<'PYEOF'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(4096)
cs = 1 << struct.unpack(">I", h[20:24])[0]
rt = struct.unpack(">Q", h[48:56])[0]
off = struct.unpack(">I", h[100:104])[0]
while True:
    t, l = struct.unpack(">II", h[off:off + 8])
    if t == 0x23852875:
        d = struct.unpack(">Q", h[off + 24:off + 32])[0]
        break
    off += 8 + ((l + 7) & ~7)
f.seek(d); table = struct.unpack(">Q", f.read(8))[0]
f.seek(table); data = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
assert data, "no data cluster"
f.seek(rt); blk = struct.unpack(">Q", f.read(8))[0]
f.seek(blk + (data // cs) * 2); f.write(struct.pack(">H", 2))
PYEOF
cp "$img" "$T/bad.orig"
rc=0
timeout 10 "$BLOCKPORT" serve --unix "$T/bad.sock" "$img" >"$T/bad.log" 2>&1 || rc=$?
[[ $rc -ne 0 && $rc -lt 124 ]] || fail "serve: exit $rc"
grep -q "bitmap 'b0'" "$T/bad.log" && grep -q -- "--readonly" "$T/bad.log" ||
  { cat "$T/bad.log"; fail "no reason given"; }
cmp -s "$img" "$T/bad.orig" || fail "the refused image was modified"
start_server --readonly "$img"
run qemu-io -f raw -r -c 'read -P 1 0 1M' "$URI" >/dev/null || fail "read-only"
stop_server
ok "refused with the reason, image untouched, served read-only"

check "a dirty lazy-refcounts image with bitmaps is repaired when opened for writing"
img=$T/dirty.qcow2
qemu-img create -q -f qcow2 -o lazy_refcounts=on "$img" 64M
qemu-img bitmap --add "$img" b0
qemu-img bitmap --add --disable "$img" b1
qemu-io -f qcow2 -c 'write -P 4 0 3M' -c 'write -P 5 10M 64k' -c flush \
  -c 'sigraise 9' "$img" >/dev/null 2>&1 || true
qemu-img info --output=json "$img" | grep -q '"dirty-flag": true' ||
  skip "qemu-io left no dirty image"
cp "$img" "$T/dirty-q.qcow2"
write_both "$T/dirty-q.qcow2" "$img" -c 'write -P 6 20M 1M'
grep -q "repairing the refcounts" "$T/server.log" || fail "no repair logged"
qemu-img info --output=json "$img" | grep -q '"dirty-flag": true' &&
  fail "still dirty"
qemu_clean "$img"
[[ "$(bitmaps "$img")" == "$(bitmaps "$T/dirty-q.qcow2")" ]] ||
  fail "flags: $(bitmaps "$img") vs QEMU's $(bitmaps "$T/dirty-q.qcow2")"
qemu-img compare -q "$img" "$T/dirty-q.qcow2" || fail "data differs"
ok "repaired, written, bitmaps as QEMU leaves them"
