#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Block status: nbdinfo --map (base:allocation) over a sparse raw file must
# agree with qemu-img map on the file itself; ZERO-flagged extents must read
# as zeroes; qemu:allocation-depth covers the export; a memory: export is
# all zero when fresh and written ranges are reported as data.
source "$(dirname "$0")/lib.sh"
require nbdinfo qemu-img qemu-io truncate fallocate dd
require_py_nbd

MIB=64
SIZE=$((MIB * 1024 * 1024))
F=$T/sparse.img
K=1024
M=$((1024 * 1024))

truncate -s $SIZE "$F"
# put OFFSET LENGTH: random data at OFFSET (64 KiB granularity)
put() {
    dd if=/dev/urandom of="$F" bs=64K seek=$(($1 / (64 * K))) count=$(($2 / (64 * K))) \
        conv=notrunc status=none
}
put 0 $M
put $((5 * M)) $((320 * K))
put $((20 * M)) $((4 * M))
put $((40 * M + 64 * K)) $((64 * K))
put $((63 * M)) $M
# allocated, but written with zeroes
dd if=/dev/zero of="$F" bs=64K seek=$((30 * M / (64 * K))) count=16 conv=notrunc status=none
# hole punched in the middle of a data run
fallocate --punch-hole --offset $((21 * M)) --length $M "$F" ||
    skip "fallocate --punch-hole not supported on this filesystem"
sync "$F" 2>/dev/null || sync
[[ $(stat -c %s "$F") -eq $SIZE ]] || fail "test bug: file size changed"

run qemu-img map --output=json -f raw "$F" >"$T/qemu-map.json"

# Python helpers shared by the checks below.
cat >"$T/maplib.py" <<'EOF'
import json

def merge(ranges):
    out = []
    for s, l, d in ranges:
        if l == 0:
            continue
        if out and out[-1][2] == d and out[-1][0] + out[-1][1] == s:
            out[-1][1] += l
        else:
            out.append([s, l, d])
    return out

def contiguous(ranges, size, what):
    pos = 0
    for s, l, *_ in ranges:
        if s != pos:
            raise SystemExit("%s: gap/overlap at %d (next extent starts at %d)" % (what, pos, s))
        if l <= 0:
            raise SystemExit("%s: extent with length %d at %d" % (what, l, s))
        pos = s + l
    if pos != size:
        raise SystemExit("%s: extents cover [0,%d), export size %d" % (what, pos, size))

def nbd_map(path):
    ents = json.load(open(path))
    return [(e["offset"], e["length"], e["type"]) for e in ents]

def qemu_map(path):
    ents = json.load(open(path))
    return [(e["start"], e["length"], bool(e["data"])) for e in ents]

def fmt(ranges):
    return "\n".join("    %10d +%-10d %s" % (s, l, "data" if d else "hole|zero")
                     for s, l, d in ranges)
EOF

start_server "$F" "mem=memory:$SIZE"

check "nbdinfo --map (base:allocation) agrees with qemu-img map on the raw file"
run nbdinfo --map --json "$URI" >"$T/nbd-map.json" || fail "nbdinfo --map failed"
PYTHONPATH=$T "$PY" - "$T/nbd-map.json" "$T/qemu-map.json" $SIZE "$F" <<'EOF' || fail "map mismatch"
import sys
from maplib import *
nbdf, qf, size, img = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
raw = nbd_map(nbdf)
contiguous(raw, size, "nbdinfo --map")
for s, l, t in raw:
    if t not in (0, 1, 2, 3):
        raise SystemExit("unexpected base:allocation flags %d at %d" % (t, s))
# data = the HOLE bit is clear (an allocated range, even if it reads as zero)
n = merge([(s, l, not (t & 1)) for s, l, t in raw])
q = merge(qemu_map(qf))
contiguous(q, size, "qemu-img map")
print("  nbdinfo --map (merged):\n" + fmt(n))
print("  qemu-img map (merged):\n" + fmt(q))
if n != q:
    raise SystemExit("base:allocation disagrees with qemu-img map")
# Every extent flagged ZERO must really read as zeroes.
with open(img, "rb") as f:
    for s, l, t in raw:
        if t & 2:
            f.seek(s)
            left = l
            while left:
                chunk = f.read(min(left, 1 << 20))
                if chunk.count(0) != len(chunk):
                    raise SystemExit("extent at %d+%d flagged ZERO but file has non-zero data" % (s, l))
                left -= len(chunk)
# Known data ranges must be reported as data (not HOLE, not ZERO).
M = 1 << 20
for s, l in ((0, M), (5 * M, 320 * 1024), (20 * M, M), (22 * M, 2 * M),
             (40 * M + 65536, 65536), (63 * M, M)):
    for es, el, t in raw:
        if es < s + l and s < es + el and t != 0:
            raise SystemExit("data range %d+%d overlaps extent %d+%d type %d" % (s, l, es, el, t))
# The punched hole must not be reported as data.
for es, el, t in raw:
    if es < 22 * M and 21 * M < es + el and not (t & 1):
        raise SystemExit("punched hole 21M+1M reported as data (extent %d+%d type %d)" % (es, el, t))
EOF
ok "maps agree"

check "nbdinfo --map --totals sums to the export size"
run nbdinfo --map --totals --json "$URI" >"$T/totals.json" || fail "nbdinfo --map --totals failed"
"$PY" -c '
import json, sys
t = json.load(open(sys.argv[1]))
total = sum(e["size"] for e in t)
print("totals:", [(e["type"], e["size"], e.get("percent")) for e in t])
assert total == int(sys.argv[2]), "totals sum %d != %s" % (total, sys.argv[2])
' "$T/totals.json" $SIZE || fail "totals wrong"
ok "totals"

check "nbdinfo --map=qemu:allocation-depth covers the whole export"
run nbdinfo --map=qemu:allocation-depth --json "$URI" >"$T/depth.json" ||
    fail "nbdinfo --map=qemu:allocation-depth failed"
PYTHONPATH=$T "$PY" - "$T/depth.json" $SIZE <<'EOF' || fail "allocation-depth map wrong"
import sys
from maplib import *
raw = nbd_map(sys.argv[1])
contiguous(raw, int(sys.argv[2]), "qemu:allocation-depth")
for s, l, t in raw:
    if t != 1:
        # a raw file provides every byte itself, holes included: depth 1
        # everywhere, as qemu-nbd -A reports
        raise SystemExit("unexpected allocation depth %r at %d" % (t, s))
print("  %d extents, depths %s" % (len(raw), sorted(set(t for _, _, t in raw))))
EOF
ok "allocation-depth"

check "memory: export: all ZERO when fresh"
MEM=$(export_uri mem)
run nbdinfo --map --json "$MEM" >"$T/mem0.json" || fail "nbdinfo --map on mem failed"
PYTHONPATH=$T "$PY" - "$T/mem0.json" $SIZE <<'EOF' || fail "fresh memory export not all zero"
import sys
from maplib import *
raw = nbd_map(sys.argv[1])
contiguous(raw, int(sys.argv[2]), "mem")
bad = [(s, l, t) for s, l, t in raw if not (t & 2)]
if bad:
    raise SystemExit("fresh memory export has non-ZERO extents: %r" % bad[:5])
print("  %d extent(s), all zero; types %s" % (len(raw), sorted(set(t for *_, t in raw))))
EOF
ok "fresh memory export is zero"

check "memory: export: written range reported as data, the rest stays zero"
run qemu-io -f raw -c "write -q -P 0x7e $((8 * M)) $M" -c "write -q -P 0x01 $((SIZE - 512)) 512" "$MEM" ||
    fail "qemu-io write on mem failed"
run nbdinfo --map --json "$MEM" >"$T/mem1.json" || fail "nbdinfo --map on mem failed"
PYTHONPATH=$T "$PY" - "$T/mem1.json" $SIZE <<'EOF' || fail "memory export map wrong after write"
import sys
from maplib import *
size = int(sys.argv[2])
M = 1 << 20
raw = nbd_map(sys.argv[1])
contiguous(raw, size, "mem")
print("  " + ", ".join("%d+%d:%d" % e for e in raw))
written = [(8 * M, M), (size - 512, 512)]
for s, l, t in raw:
    for ws, wl in written:
        if s < ws + wl and ws < s + l and (t & 3):
            raise SystemExit("written range %d+%d overlaps extent %d+%d with flags %d" % (ws, wl, s, l, t))
# Outside the written ranges (rounded out to 1 MiB), zero is expected.
for s, l, t in raw:
    if s + l <= 7 * M or (s >= 10 * M and s + l <= size - M):
        if not (t & 2):
            raise SystemExit("untouched extent %d+%d reported as non-zero (%d)" % (s, l, t))
EOF
ok "memory export map"

stop_server

check "qemu:allocation-depth of backing chains with shorter backing files, as qemu-nbd says"
require qemu-nbd
# base (1M) <- mid (2M) <- top (4M), and top2 (2M) over base alone.
run qemu-img create -q -f qcow2 "$T/base.qcow2" 1M
run qemu-io -c "write -P 1 0 64k" "$T/base.qcow2" >/dev/null
run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$T/mid.qcow2" 2M
run qemu-io -c "write -P 2 1536k 64k" "$T/mid.qcow2" >/dev/null
run qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$T/top.qcow2" 4M
run qemu-io -c "write -P 3 3M 64k" "$T/top.qcow2" >/dev/null
run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$T/top2.qcow2" 2M
for img in top top2 mid; do
    qemu-nbd -r -t -k "$T/qn.sock" -f qcow2 -A "$T/$img.qcow2" &
    qpid=$!
    track_pid $qpid
    wait_until 10 test -S "$T/qn.sock" || fail "qemu-nbd did not start"
    want=$(nbdinfo --map=qemu:allocation-depth "nbd+unix:///?socket=$T/qn.sock")
    kill $qpid
    wait $qpid 2>/dev/null || true
    rm -f "$T/qn.sock"
    start_server -r --format qcow2 "$T/$img.qcow2"
    got=$(nbdinfo --map=qemu:allocation-depth "$(export_uri "")")
    stop_server
    [[ $got == "$want" ]] || fail "$img: allocation-depth differs from qemu-nbd's:
$got
-- qemu-nbd:
$want"
done
ok "the same as qemu-nbd"
echo "PASS"
