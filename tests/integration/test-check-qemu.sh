#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport check against qemu-img check on a suite of damaged images.
#
# Every image is made with qemu-img/qemu-io (data, snapshots, persistent
# bitmaps, lazy refcounts left dirty by a kill) and then damaged by a
# script (header fields, refcount table and blocks, refcounts, COPIED
# flags, L1/L2 entries, the corrupt bit, the bitmap directory and tables).
# For each image and each mode (check, -r leaks, -r all), two identical
# copies go one to qemu-img check and one to blockport check; then:
#   - same exit code, and the same verdict lines ("N errors were found",
#     "N leaked clusters were found", "No errors were found");
#   - same result of the repair: qemu-img check of each repaired copy
#     gives the same exit code and names the same problems, if any;
#   - where the repaired copies have no corruption left, both hold the same
#     guest data and the same bitmaps, and where the damage was to
#     metadata only, the guest data is what it was before the damage
#     (qemu-img compare against the undamaged image).
# The few places where blockport deliberately does better than qemu-img
# 7.2 are listed at the end, with what each does.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

D=$T/img
mkdir -p "$D"

cat >"$T/damage.py" <<'PYEOF'
# damage.py IMAGE ACTION ARGS...: patch a qcow2 image (16-bit refcounts).
import struct, sys

M = 0x00fffffffffffe00
BITMAPS = 0x23852875
f = open(sys.argv[1], "r+b")
h = f.read(4096)
cb = struct.unpack(">I", h[20:24])[0]
cs = 1 << cb
l1 = struct.unpack(">Q", h[40:48])[0]
rt = struct.unpack(">Q", h[48:56])[0]


def u64(off):
    f.seek(off)
    return struct.unpack(">Q", f.read(8))[0]


def w64(off, v):
    f.seek(off)
    f.write(struct.pack(">Q", v))


def l2_entry_at(guest):
    per = cs // 8
    return (u64(l1 + (guest // per) * 8) & M) + (guest % per) * 8


def set_rc(cluster, v):
    per = cs // 2
    blk = u64(rt + (cluster // per) * 8)
    f.seek(blk + (cluster % per) * 2)
    f.write(struct.pack(">H", v))


def bitmaps_ext():
    off = struct.unpack(">I", h[100:104])[0]
    while True:
        t, l = struct.unpack(">II", h[off:off + 8])
        if t == BITMAPS:
            return off + 8
        if t == 0:
            sys.exit("no bitmaps extension")
        off += 8 + ((l + 7) & ~7)


def bitmap_table(i):
    d = u64(bitmaps_ext() + 16)
    pos = d
    for _ in range(i):
        f.seek(pos + 18)
        n = struct.unpack(">H", f.read(2))[0]
        pos += (24 + n + 7) & ~7
    return u64(pos)


act = sys.argv[2]
a = [int(x, 0) & 0xffffffffffffffff for x in sys.argv[3:]]  # bash: 1 << 63 < 0
if act == "hdr64":
    w64(a[0], a[1])
elif act == "hdr32":
    f.seek(a[0])
    f.write(struct.pack(">I", a[1]))
elif act == "incompat-or":
    w64(72, u64(72) | a[0])
elif act == "reftable":
    w64(rt + a[0] * 8, a[1])
elif act == "rc":
    set_rc(a[0], a[1])
elif act == "rc-guest":
    set_rc((u64(l2_entry_at(a[0])) & M) >> cb, a[1])
elif act == "rc-l2":
    set_rc((u64(l1) & M) >> cb, a[0])
elif act == "rc-refblock":
    set_rc(u64(rt) >> cb, a[0])
elif act == "l2-xor":
    w64(l2_entry_at(a[0]), u64(l2_entry_at(a[0])) ^ a[1])
elif act == "l1-xor":
    w64(l1 + a[0] * 8, u64(l1 + a[0] * 8) ^ a[1])
elif act == "grow-leak":
    f.seek(0, 2)
    end = (f.tell() + cs - 1) // cs * cs
    f.truncate(end + cs)
    set_rc(end // cs, 1)
elif act == "bitmap-entry":
    t = bitmap_table(a[0]) + a[1] * 8
    w64(t, u64(t) ^ a[2])
elif act == "bitmap-data-rc":
    set_rc((u64(bitmap_table(a[0])) & M) >> cb, a[1])
elif act == "snap-l1":  # the first snapshot's L1 table offset
    w64(struct.unpack(">Q", h[64:72])[0], a[0])
elif act == "snap-l1-on-l2":  # the first snapshot's L1 table: L1[0]'s L2
    w64(struct.unpack(">Q", h[64:72])[0], u64(l1) & M)
elif act == "snap-hdr32":  # a 32-bit field of the first snapshot's entry
    f.seek(struct.unpack(">Q", h[64:72])[0] + a[0])
    f.write(struct.pack(">I", a[1]))
elif act == "snap-l1-xor":
    so = struct.unpack(">Q", h[64:72])[0]
    w64(so, u64(so) ^ a[0])
elif act == "bitmap-count":
    f.seek(bitmaps_ext())
    f.write(struct.pack(">I", a[0]))
else:
    sys.exit("unknown action " + act)
PYEOF

damage() { "$PY" "$T/damage.py" "$@" || fail "test bug: damage.py $*"; }

# ---------------------------------------------------------------- bases

M1=$((1 << 20))
# plain: 32 MiB, 64k clusters, data in the first MiB and at 4 MiB.
qemu-img create -q -f qcow2 "$D/plain" 32M
qemu-io -f qcow2 -c "write -P 1 0 $M1" -c 'write -P 2 4M 64k' "$D/plain" \
  >/dev/null || fail "test bug: qemu-io"
# bitmaps: the same, with an enabled, a disabled and a fine-grained bitmap
# holding bits (data clusters in their tables).
cp "$D/plain" "$D/bitmaps"
qemu-img bitmap --add "$D/bitmaps" b0
qemu-img bitmap --add --disable "$D/bitmaps" b1
qemu-img bitmap --add -g 4096 "$D/bitmaps" b2
qemu-io -f qcow2 -c 'write -P 3 8M 128k' "$D/bitmaps" >/dev/null
# snapshots: clusters shared by two L1 tables.
cp "$D/plain" "$D/snapshots"
qemu-img snapshot -c s1 "$D/snapshots"
qemu-io -f qcow2 -c 'write -P 4 512k 1M' "$D/snapshots" >/dev/null
# zsnap: the same with zeroes for data, which read as empty tables.
qemu-img create -q -f qcow2 "$D/zsnap" 32M
qemu-io -f qcow2 -c "write -P 0 0 $M1" "$D/zsnap" >/dev/null
qemu-img snapshot -c s1 "$D/zsnap"
qemu-io -f qcow2 -c 'write -P 0 512k 1M' "$D/zsnap" >/dev/null
# extl2: extended L2 entries, a partly written cluster.
qemu-img create -q -f qcow2 -o extended_l2=on "$D/extl2" 32M
qemu-io -f qcow2 -c 'write -P 5 0 100k' -c 'write -P 6 2M 4k' "$D/extl2" \
  >/dev/null
# compressed: every cluster compressed.
"$PY" -c 'import sys
open(sys.argv[1], "wb").write((b"compressible qcow2 cluster " * 40000)[:1 << 20])' \
  "$D/src.raw"
qemu-img convert -c -O qcow2 "$D/src.raw" "$D/compressed"
# small: 512-byte clusters (many refcount blocks).
qemu-img create -q -f qcow2 -o cluster_size=512 "$D/small" 8M
qemu-io -f qcow2 -c 'write -P 7 0 300k' -c 'write -P 8 5M 64k' "$D/small" \
  >/dev/null
# dirty: lazy refcounts, with a bitmap, killed after a flush.
qemu-img create -q -f qcow2 -o lazy_refcounts=on "$D/dirty" 32M
qemu-img bitmap --add "$D/dirty" b0
qemu-io -f qcow2 -c "write -P 9 0 3M" -c 'write -P 10 10M 64k' -c flush \
  -c 'sigraise 9' "$D/dirty" >/dev/null 2>&1 || true
qemu-img info --output=json "$D/dirty" | grep -q '"dirty-flag": true' ||
  skip "qemu-io left no dirty image"

# ---------------------------------------------------------------- cases

verdict() {
  grep -E "errors were found|leaked clusters were found|No errors were found" \
    "$1" || true
}

# One image in one mode.
run_mode() {
  local name=$1 img=$2 data_same=$3 base=$4 mode=$5
  local q=$T/q.qcow2 b=$T/b.qcow2 qrc=0 brc=0 qa=0 ba=0
  cp "$img" "$q"
  cp "$img" "$b"
  local -a opt=()
  [[ -n $mode ]] && opt=(-r "$mode")
  qemu-img check "${opt[@]}" "$q" >"$T/q.out" 2>"$T/q.err" || qrc=$?
  "$BLOCKPORT" check "${opt[@]}" "$b" >"$T/b.out" 2>"$T/b.err" || brc=$?
  check_sanitizer_reports "$T/b.err"
  local what="$name (${mode:-check})"
  if [[ $qrc -ne $brc ]]; then
    cat "$T/q.out" "$T/q.err" "$T/b.out" "$T/b.err"
    fail_soft "$what: exit $brc, qemu-img $qrc"
    return
  fi
  if [[ -z $mode && "$(verdict "$T/q.out")" != "$(verdict "$T/b.out")" ]]; then
    fail_soft "$what: verdict '$(verdict "$T/b.out")', qemu-img's '$(verdict "$T/q.out")'"
  fi
  qemu-img check "$q" >"$T/qafter.out" 2>&1 || qa=$?
  qemu-img check "$b" >"$T/after.out" 2>&1 || ba=$?
  if [[ $qa -ne $ba ]]; then
    cat "$T/after.out"
    fail_soft "$what: after repair qemu-img check says $ba, $qa for qemu-img's repair"
    return
  fi
  # What is left wrong is the same, cluster by cluster (with NO_WORSE set,
  # where qemu-img's repair fails half-way: nothing more than in its image).
  local more
  more=$(comm -13 <(grep -E '^(ERROR|Leaked)' "$T/qafter.out" | sort) \
    <(grep -E '^(ERROR|Leaked)' "$T/after.out" | sort))
  if [[ -n ${NO_WORSE:-} ]]; then
    [[ -z $more ]] ||
      fail_soft "$what: after the repair, not in qemu-img's repaired image: $more"
  elif ! diff -u <(grep -E '^(ERROR|Leaked)' "$T/qafter.out") \
    <(grep -E '^(ERROR|Leaked)' "$T/after.out"); then
    fail_soft "$what: qemu-img check finds other problems after the repair"
  fi
  # Data and bitmaps, where the repaired image has no corruption left.
  if [[ $ba -eq 0 || $ba -eq 3 ]]; then
    qemu-img compare -q "$q" "$b" ||
      fail_soft "$what: guest data differs from qemu-img's repair"
    local qb bb
    qb=$(qemu-img info -U --output=json "$q" 2>&1 | grep -A12 '"bitmaps"' || true)
    bb=$(qemu-img info -U --output=json "$b" 2>&1 | grep -A12 '"bitmaps"' || true)
    [[ $qb == "$bb" ]] || fail_soft "$what: bitmaps differ after repair"
    if [[ $data_same == yes && $ba -eq 0 ]]; then
      qemu-img compare -q "$base" "$b" ||
        fail_soft "$what: guest data changed by the repair"
    fi
  fi
  ok "$what: exit $brc, after repair $ba"
}

# case NAME BASE DATA_SAME [ACTION ARGS... [-- ACTION ARGS...]...]
case_() {
  local name=$1 base=$D/$2 data_same=$3
  shift 3
  local img=$D/case.qcow2
  cp "$base" "$img"
  local -a step=()
  while [[ $# -gt 0 ]]; do
    if [[ $1 == -- ]]; then
      damage "$img" "${step[@]}"
      step=()
    else
      step+=("$1")
    fi
    shift
  done
  [[ ${#step[@]} -gt 0 ]] && damage "$img" "${step[@]}"
  local mode
  for mode in "" leaks all; do
    run_mode "$name" "$img" "$data_same" "$base" "$mode"
  done
}

check "clean images"
case_ "clean" plain yes
case_ "clean, with bitmaps" bitmaps yes
case_ "clean, with a snapshot" snapshots yes
case_ "clean, extended L2" extl2 yes
case_ "clean, 512-byte clusters" small yes
case_ "clean, compressed" compressed yes

check "leaks"
case_ "a leaked cluster at the end of the file" plain yes grow-leak
case_ "leak, with bitmaps" bitmaps yes grow-leak
case_ "refcount 2, one reference, COPIED clear (a leak)" plain yes \
  rc-guest 0 2 -- l2-xor 0 $((1 << 63))
case_ "a refcount past the end of the file (not looked at)" plain yes rc 400 1
case_ "bitmap data cluster with refcount 2" bitmaps yes bitmap-data-rc 0 2
case_ "stale bitmaps (autoclear bit cleared): their clusters leak" bitmaps yes \
  hdr64 88 0
case_ "leak, 512-byte clusters" small yes grow-leak

check "COPIED against the stored refcount"
case_ "refcount 2, one reference, COPIED set (error and leak)" plain yes \
  rc-guest 0 2
case_ "COPIED clear on a data cluster with refcount 1" plain yes \
  l2-xor 1 $((1 << 63))
case_ "COPIED clear on an L2 table (L1 entry)" plain yes l1-xor 0 $((1 << 63))
case_ "COPIED wrong and a leak" plain yes \
  l2-xor 1 $((1 << 63)) -- grow-leak

check "refcounts below the references"
case_ "refcount 0 under a data cluster" plain yes rc-guest 0 0
case_ "refcount 0 under an L2 table" plain yes rc-l2 0
case_ "refcount 0 under a refcount block" plain yes rc-refblock 0
case_ "refcount 1 under a cluster a snapshot shares" snapshots yes rc-guest 2 1
case_ "refcount 0 under a data cluster, extended L2" extl2 yes rc-guest 0 0
case_ "refcount 0, 512-byte clusters" small yes rc-guest 3 0

check "refcount table damage"
case_ "refcount table offset zeroed" plain yes hdr64 48 0
case_ "refcount table offset past the end of the file" plain yes \
  hdr64 48 $((64 << 20))
case_ "refcount table of 0 clusters" plain yes hdr32 56 0
case_ "refcount table of 3 clusters (runs over other metadata)" plain yes \
  hdr32 56 3
case_ "refcount table entry past the end of the file" plain yes \
  reftable 0 $((1 << 28))
case_ "refcount table entry zeroed" plain yes reftable 0 0

check "the corrupt bit"
case_ "corrupt bit on a clean image" plain yes incompat-or 2
case_ "corrupt bit and a leak" plain yes incompat-or 2 -- grow-leak
case_ "corrupt bit and a refcount 0" plain yes incompat-or 2 -- rc-guest 0 0
case_ "corrupt bit and a wrong COPIED" plain yes \
  incompat-or 2 -- l2-xor 1 $((1 << 63))

check "dirty lazy refcounts (with a bitmap left in use)"
case_ "dirty image" dirty yes

check "L1 and L2 entries, compressed clusters, snapshot tables"
case_ "L2 entry past the end of the file" plain no \
  l2-xor 0 $((0x50000 ^ 0x300000))
case_ "L2 entry unaligned" plain no l2-xor 0 0x200
case_ "L2 entry with reserved bits" plain no l2-xor 2 0x100
case_ "L1 entry with reserved bits" plain no l1-xor 0 0x100
# (-r all makes it a plain zero cluster, as qemu-img does.)
case_ "zero cluster preallocated at an unaligned offset" plain no \
  l2-xor 3 0x201

case_ "COPIED set on a compressed cluster" compressed no l2-xor 1 $((1 << 63))
case_ "compressed cluster past the end of the file" compressed no \
  l2-xor 1 $((1 << 28))
case_ "snapshot L1 table unaligned" snapshots no snap-l1-xor 0x200
case_ "snapshot L1 table past the end of the file" snapshots no \
  snap-l1 $((1 << 28))
# Tables past the end of the file read as zeroes, as in QEMU: an empty L1
# table (everything it held leaks), a snapshot table that -r all drops
# (qemu-img writes its empty entry back; its clusters leak either way).
case_ "L1 table past the end of the file" plain no hdr64 40 $((1 << 28))
case_ "snapshot table past the end of the file" snapshots yes \
  hdr64 64 $((1 << 28))
# 1 MiB of extra data in an entry (over QEMU's 1 KiB): the table cannot be
# read, the check stops (qemu-img -r all tries and fails: 1 all along).
case_ "snapshot with 1 MiB of extra data" snapshots no snap-hdr32 36 $((1 << 20))
# COPIED repairs that would write over other metadata: qemu-img's overlap
# checks refuse the write and its -r all fails (1), its image marked
# corrupt and its refcount repairs lost (not the L1 entry's COPIED flag);
# blockport sees it coming and writes nothing.  A snapshot L1 table too
# large (QEMU's overlap checks take it whole: it covers the L2 table):
case_ "snapshot L1 table too large" snapshots no snap-hdr32 8 $((0x10000000))
# A snapshot L1 table on the active L2 table:
NO_WORSE=1 case_ "snapshot L1 table on the active L2 table" zsnap no \
  snap-l1-on-l2

check "header fields (the image does not open: 1 from both)"
case_ "cluster_bits 8" plain no hdr32 20 8
case_ "L1 table offset unaligned" plain no hdr64 40 $((0x30200))
case_ "refcount table too large" plain no hdr32 56 100000
case_ "unknown incompatible feature" plain no incompat-or $((1 << 40))

check "bitmap directory and tables (QEMU cannot open the image: 1 from both)"
case_ "bitmap table entry with reserved bits" bitmaps no bitmap-entry 0 0 2
case_ "more bitmaps in the directory than the header names" bitmaps no \
  bitmap-count 2

check "where blockport does better than qemu-img 7.2"
# leaks_untouched NAME IMAGE: -r leaks cannot rebuild the refcounts: both
# exit 1, and blockport leaves the image as it was.  (qemu-img opens it
# read-write first, and with persistent bitmaps stores them back at close
# into clusters its broken refcounts call free: guest data is overwritten.)
leaks_untouched() {
  local name=$1 img=$2 rc=0 qrc=0
  cp "$img" "$T/b.qcow2"
  cp "$img" "$T/q.qcow2"
  qemu-img check -r leaks "$T/q.qcow2" >/dev/null 2>&1 || qrc=$?
  "$BLOCKPORT" check -r leaks "$T/b.qcow2" >"$T/b.out" 2>&1 || rc=$?
  [[ $rc -eq 1 && $qrc -eq 1 ]] || fail_soft "$name (leaks): exit $rc, qemu-img $qrc"
  cmp -s "$img" "$T/b.qcow2" || fail_soft "$name (leaks): image modified"
  ok "$name (leaks): exit 1, image untouched"
}
# better NAME BASE ACTION ARGS...: check as qemu-img; -r leaks leaves the
# image untouched; -r all must leave it clean with its data and bitmaps.
better() {
  local name=$1 base=$D/$2 img=$D/case.qcow2 rc=0 qrc=0
  shift 2
  cp "$base" "$img"
  damage "$img" "$@"
  run_mode "$name" "$img" yes "$base" ""
  leaks_untouched "$name" "$img"
  cp "$img" "$T/b.qcow2"
  cp "$img" "$T/q.qcow2"
  qemu-img check -r all "$T/q.qcow2" >/dev/null 2>&1 || qrc=$?
  "$BLOCKPORT" check -r all "$T/b.qcow2" >"$T/b.out" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$T/b.out"; fail_soft "$name, -r all: $rc"; }
  rc=0
  qemu-img check "$T/b.qcow2" >/dev/null 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || fail_soft "$name, -r all: qemu-img check says $rc"
  qemu-img compare -q "$base" "$T/b.qcow2" || fail_soft "$name: data changed"
  [[ "$(qemu-img info "$base" 2>&1 | grep -A20 bitmaps:)" == \
    "$(qemu-img info "$T/b.qcow2" 2>&1 | grep -A20 bitmaps:)" ]] ||
    fail_soft "$name: bitmaps changed"
  ok "$name (all): repaired, clean, data intact (qemu-img: $qrc)"
}
# A used cluster with refcount 0 in an image with bitmaps: check and
# -r all as qemu-img; -r leaks (which cannot rebuild) must not write.
img=$D/case.qcow2
cp "$D/bitmaps" "$img"
damage "$img" rc-guest 0 0
for mode in "" all; do
  run_mode "refcount 0 under a data cluster, with bitmaps" "$img" yes \
    "$D/bitmaps" "$mode"
done
leaks_untouched "refcount 0 under a data cluster, with bitmaps" "$img"
# A refcount table entry that is not cluster aligned: qemu-img check
# stops with 1 (it cannot read the refcounts), and so does blockport; with
# -r all qemu-img starts a rebuild, then marks the image corrupt half-way
# and fails with 1, leaving leaks; blockport rebuilds the structure.
better "unaligned refcount table entry" plain reftable 0 $((0x20200))
# A damaged refcount table in an image with bitmaps: qemu-img check -r all
# cannot even open the image (setting the bitmaps in use trips its overlap
# check on the bogus refcount blocks), fails with 1 and leaves the image
# marked corrupt, its bitmaps dropped; blockport check does not touch the
# bitmaps, rebuilds the refcounts and keeps them.
better "refcount table offset zeroed, with bitmaps" bitmaps hdr64 48 0
