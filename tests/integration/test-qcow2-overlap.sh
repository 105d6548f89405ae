#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Writes on metadata: qcow2 images whose L1 offset, L1 entries or L2
# entries point into their own metadata, served read-write and written
# over NBD, compared with qemu-io on an identical copy.  Images are made
# with qemu-img/qemu-io and patched with qcow2meta.py (which also tells,
# independently of blockport, which clusters hold metadata).
#
#   match     QEMU refuses the write too ("Preventing invalid write on
#             metadata"): same qemu-io exit status and EIO, both images
#             marked corrupt, the same kind of metadata named, same
#             `qemu-img check` exit status on both copies (and
#             `blockport check` agreeing), identical guest contents, and
#             not one byte of metadata changed.
#   stricter  QEMU lets the write through and damages its metadata (in
#             its default "cached" mode it does not check snapshots' L2
#             tables or bitmap tables, and it lets a wrong reference drop
#             a metadata cluster's refcount to 0): blockport refuses (EIO
#             on the write or the flush), marks the image corrupt and
#             leaves every byte of metadata as it was.
#   far       an L2 table past the end of the file: as allocation reaches
#             it, the same write fails in both.
#   after     a corrupt image is served read-only from then on: writes
#             fail with EPERM, reads go on and match QEMU's copy, one log
#             line; reopening for writing is refused, --readonly works;
#             `blockport check --repair all` mends it and clears the bit
#             as `qemu-img check -r all` does, and the image is writable
#             again without touching the metadata.
#   healthy   images with every kind of metadata (snapshots, bitmaps,
#             extended L2, 512-byte clusters whose refcount table grows,
#             compressed clusters) take a mixed workload exactly as QEMU
#             does and are never found corrupt.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
META=("$PY" "$(cd "$(dirname "$0")" && pwd)/qcow2meta.py")
CS=65536
D=$T/img
mkdir -p "$D"
cd "$T"

# ---------------------------------------------------------------- images

make() { # NAME CREATE-OPTIONS SIZE QEMU-IO-COMMANDS...
    local name=$1 opts=$2 size=$3
    shift 3
    qemu-img create -q -f qcow2 -o "$opts" "$D/$name.qcow2" "$size"
    [[ $# -eq 0 ]] || qemu-io "$@" "$D/$name.qcow2" >/dev/null ||
        fail "test bug: qemu-io on $name"
}
make plain cluster_size=$CS 16M -c "write -P 0x11 0 64k" \
    -c "write -P 0x22 64k 64k" -c "write -c -P 0x66 192k 64k"
make snap cluster_size=$CS 16M -c "write -P 0x11 0 64k" -c "write -P 0x22 64k 64k"
qemu-img snapshot -c s1 "$D/snap.qcow2"
qemu-io -c "write -P 0x33 0 64k" "$D/snap.qcow2" >/dev/null
make bitmap cluster_size=$CS 16M -c "write -P 0x11 0 64k"
qemu-img bitmap --add "$D/bitmap.qcow2" b0
qemu-img bitmap --add -g 4096 "$D/bitmap.qcow2" b1
make extl2 cluster_size=$CS,extended_l2=on 16M -c "write -P 0x11 0 64k" \
    -c "write -P 0x22 64k 2k"
make v2 cluster_size=$CS,compat=0.10 16M -c "write -P 0x11 0 64k"
make big cluster_size=$CS 1G -c "write -P 0x11 0 64k"
make small cluster_size=512 64M
make richx cluster_size=$CS,extended_l2=on 16M -c "write -P 0x11 0 256k"
qemu-img snapshot -c s1 "$D/richx.qcow2"

layout() { eval "$("${META[@]}" layout "$D/$1.qcow2")"; }

# ---------------------------------------------------------------- helpers

# qemu_side IMG CMD...: qemu-io straight on IMG; status in QRC.
qemu_side() {
    local img=$1
    shift
    QRC=0
    run qemu-io "$@" "$img" >q.out 2>&1 || QRC=$?
}

# nbd_side IMG CMD...: IMG served read-write, qemu-io over NBD; status in
# BRC.  The server must survive; an image found corrupt fails its final
# flush, and so the server's exit status (1).
nbd_side() {
    local img=$1
    shift
    rm -f "$T/server.log"
    start_server "$img"
    BRC=0
    run qemu-io -f raw "$@" "$URI" >b.out 2>&1 || BRC=$?
    server_alive || fail "server died"
    STOP_EXPECT=$(grep -q "marking image as corrupt" "$T/server.log" &&
        echo 1 || echo 0) stop_server
    mv "$T/server.log" b.log
}

corrupt_bit() { # IMG -> 1 if qemu-img info says corrupt
    qemu-img info "$1" 2>/dev/null | grep -c "corrupt: true" || true
}

check_rc() { # TOOL IMG -> exit status of `TOOL check IMG`
    local rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    echo $rc
}

# prepare BASE POKE...: o.qcow2 (the patched image), q.qcow2 and b.qcow2
# (copies for QEMU and blockport).
prepare() {
    local base=$1
    shift
    cp "$D/$base.qcow2" o.qcow2
    [[ $# -eq 0 ]] || "${META[@]}" poke o.qcow2 "$@"
    cp o.qcow2 q.qcow2
    cp o.qcow2 b.qcow2
}

# Our side of every refusal: the image is marked corrupt (version 3),
# one log line says why, and no metadata byte changed (but the ranges
# OFF+LEN given: the bad entry itself, which a stricter case may have
# replaced before the refusal).
refused_here() { # NAME v2|v3 [OFF+LEN...]
    local name=$1 v=$2
    shift 2
    [[ $v == v2 || $(corrupt_bit b.qcow2) == 1 ]] ||
        fail_soft "$name: blockport did not mark the image corrupt"
    [[ $(grep -c "marking image as corrupt" b.log) == 1 ]] ||
        fail_soft "$name: not exactly one log line about it"
    "${META[@]}" same o.qcow2 b.qcow2 "$@" >same.out ||
        fail_soft "$name: blockport changed metadata: $(cat same.out)"
}

# match NAME BASE "QEMU-IO-CMD" POKE...
match() {
    local name=$1 base=$2 cmd=$3 v=v3
    shift 3
    check "match: $name"
    [[ $base == v2 ]] && v=v2
    prepare "$base" "$@"
    qemu_side q.qcow2 -c "$cmd"
    nbd_side b.qcow2 -c "$cmd"
    grep -q "Preventing invalid write on metadata" q.out ||
        fail "test bug: $name: QEMU did not refuse: $(cat q.out)"
    [[ $QRC == "$BRC" ]] || fail_soft "$name: qemu-io exit $QRC, over NBD $BRC"
    grep -q "write failed: Input/output error" b.out ||
        fail_soft "$name: no EIO over NBD: $(cat b.out)"
    local kind
    kind=$(sed -n 's/.*(overlaps with \([^)]*\)).*/\1/p' q.out | head -1)
    grep -qF "overlaps with $kind" b.log ||
        fail_soft "$name: QEMU names '$kind', blockport: $(grep corrupt b.log)"
    [[ $(corrupt_bit q.qcow2) == "$(corrupt_bit b.qcow2)" ]] ||
        fail_soft "$name: corrupt bit differs"
    refused_here "$name" $v
    "${META[@]}" same o.qcow2 q.qcow2 >/dev/null ||
        [[ $base == bitmap ]] || # QEMU flags the bitmaps in use
        fail "test bug: $name: QEMU changed metadata"
    if [[ $base != bitmap ]]; then
        # (blockport invalidates bitmaps when it opens an image for
        # writing, so their clusters are leaks to qemu-img check.)
        local qc bc mine
        qc=$(check_rc qemu-img check q.qcow2)
        bc=$(check_rc qemu-img check b.qcow2)
        mine=$(check_rc "$BLOCKPORT" check b.qcow2)
        [[ $qc == "$bc" && $bc == "$mine" ]] ||
            fail_soft "$name: check exit: qemu copy $qc, ours $bc, blockport check $mine"
        qemu-img compare -q q.qcow2 b.qcow2 ||
            fail_soft "$name: guest contents differ"
    fi
    ok "$name: refused as QEMU refuses ($kind), metadata intact"
}

# stricter NAME BASE "QEMU-IO-CMD" POKE: one poke, an L2 or L1 entry,
# which blockport may have pointed away from the metadata before refusing
# to free what it pointed at.
stricter() {
    local name=$1 base=$2 cmd=$3 poke=$4 qs=0
    check "stricter: $name"
    prepare "$base" "$poke"
    qemu_side q.qcow2 -c "$cmd"
    nbd_side b.qcow2 -c "$cmd"
    "${META[@]}" same o.qcow2 q.qcow2 >qsame.out || qs=1
    grep -q "marking image as corrupt" b.log ||
        fail_soft "$name: blockport let it through: $(cat b.out)"
    refused_here "$name" v3 "${poke%%=*}+8"
    local qc
    qc=$(check_rc qemu-img check q.qcow2)
    ok "$name: refused; QEMU: exit $QRC, corrupt bit $(corrupt_bit q.qcow2), check $qc, metadata changed: $qs $(head -1 qsame.out)"
}

# ---------------------------------------------------------------- match

layout plain
match "L2 entry into the refcount table" plain "write -P 0x44 0 4k" \
    "$L2=COPIED|$RT"
match "L2 entry into a refcount block" plain "write -P 0x44 4k 4k" \
    "$L2=COPIED|$RB"
match "L2 entry into the active L1 table" plain "write -P 0x44 0 64k" \
    "$L2=COPIED|$L1"
match "L2 entry into its own L2 table" plain "write -P 0x44 0 512" \
    "$L2=COPIED|$L2"
match "L2 entry into its own L2 table, zero write" plain "write -z 68k 4k" \
    "$((L2 + 8))=COPIED|$L2"
match "L1 entry into the refcount table" plain "write -P 0x44 1M 4k" \
    "$L1=COPIED|$RT"
match "L1 entry into the active L1 table" plain "write -P 0x44 1M 4k" \
    "$L1=COPIED|$L1"
match "L1 table at the refcount table's offset" plain "write -P 0x44 0 4k" \
    "40=$RT"
layout snap
match "L2 entry into the snapshot table" snap "write -P 0x44 0 4k" \
    "$L2=COPIED|$SNAPT"
match "L2 entry into a snapshot's L1 table" snap "write -P 0x44 0 4k" \
    "$L2=COPIED|$SL1"
layout bitmap
match "L2 entry into the bitmap directory" bitmap "write -P 0x44 0 4k" \
    "$L2=COPIED|$BMDIR"
layout extl2
match "extended L2: in place, into the refcount table" extl2 \
    "write -P 0x44 0 4k" "$L2=COPIED|$RT" "$((L2 + 8))=0xffffffff"
match "extended L2: new subclusters, into the refcount table" extl2 \
    "write -P 0x44 68k 4k" "$((L2 + 16))=COPIED|$RT" "$((L2 + 24))=1"
layout v2
match "version 2: L2 entry into the refcount table" v2 "write -P 0x44 0 4k" \
    "$L2=COPIED|$RT"

# ---------------------------------------------------------------- stricter

layout plain
stricter "shared L2 entry into the L1 table, overwritten" plain \
    "write -P 0x44 0 4k" "$L2=$L1"
stricter "shared L2 entry into the L1 table, discarded" plain \
    "discard 0 64k" "$L2=$L1"
stricter "shared L2 entry into a refcount block, zeroed" plain \
    "write -z 0 64k" "$L2=$RB"
stricter "L1 entry into a refcount block" plain "write -P 0x44 0 4k" \
    "$L1=COPIED|$RB"
layout snap
stricter "L2 entry into a snapshot's L2 table" snap "write -P 0x44 0 4k" \
    "$L2=COPIED|$SL2"
layout bitmap
stricter "L2 entry into a bitmap table" bitmap "write -P 0x44 0 4k" \
    "$L2=COPIED|$BMT"

# ---------------------------------------------------------------- far

check "far: an L2 table past the end of the file"
layout big
prepare big "$((L1 + 8))=COPIED|$((16 * CS))"
cmds=()
for k in $(seq 1 20); do cmds+=(-c "write -P 0x55 $((k * CS)) 64k"); done
qemu_side q.qcow2 "${cmds[@]}"
nbd_side b.qcow2 "${cmds[@]}"
nq=$(grep -c "^wrote" q.out || true)
nb=$(grep -c "^wrote" b.out || true)
[[ $nq == "$nb" && $nq -lt 20 ]] ||
    fail_soft "far: QEMU wrote $nq clusters, blockport $nb"
[[ $(corrupt_bit b.qcow2) == 1 && $(corrupt_bit q.qcow2) == 1 ]] ||
    fail_soft "far: not marked corrupt"
[[ $(check_rc qemu-img check q.qcow2) == $(check_rc qemu-img check b.qcow2) ]] ||
    fail_soft "far: check exit differs"
qemu-img compare -q q.qcow2 b.qcow2 || fail_soft "far: guest contents differ"
ok "far: both stop after $nb writes"

# ---------------------------------------------------------------- after

check "after: writes refused, reads go on, one log line"
layout plain
prepare plain "$L2=COPIED|$RT" "$((L2 + 8))=COPIED|$L1"
qemu_side q.qcow2 -c "write -P 0x44 0 4k"
rm -f "$T/server.log"
start_server b.qcow2
run qemu-io -f raw -c "write -P 0x44 0 4k" "$URI" >b1.out 2>&1 || true
grep -q "Input/output error" b1.out || fail "no EIO: $(cat b1.out)"
# A second bad cluster and a healthy one: refused alike, not logged again.
for off in 64k 1M; do
    run qemu-io -f raw -c "write -P 0x45 $off 4k" "$URI" >b2.out 2>&1 || true
    grep -q "Operation not permitted" b2.out ||
        fail "write at $off after corruption: $(cat b2.out)"
done
run qemu-img convert -f raw -O raw "$URI" served.raw
qemu-img convert -O raw q.qcow2 qemu.raw
cmp -s served.raw qemu.raw || fail "reads differ from QEMU's copy"
server_alive || fail "server died"
STOP_EXPECT=1 stop_server
[[ $(grep -c "marking image as corrupt" "$T/server.log") == 1 ]] ||
    fail "expected one log line: $(grep corrupt "$T/server.log")"
"${META[@]}" same o.qcow2 b.qcow2 || fail "metadata changed"
ok "EIO, then EPERM; reads as QEMU's copy; logged once; metadata intact"

check "after: reopening for writing is refused, --readonly serves"
rc=0
timeout 10 "$BLOCKPORT" serve --unix "$T/refused.sock" b.qcow2 >open.out 2>&1 ||
    rc=$?
[[ $rc -ne 0 && $rc -lt 124 ]] && grep -q "corrupt" open.out ||
    fail "opening a corrupt image for writing: exit $rc: $(cat open.out)"
start_server --readonly b.qcow2
run qemu-img convert -f raw -O raw "$URI" ro.raw
cmp -s ro.raw qemu.raw || fail "read-only reads differ"
stop_server
ok "refused: $(grep -m1 corrupt open.out); read-only works"

check "after: check --repair all clears the bit, as qemu-img check -r all"
qc=$(check_rc qemu-img check q.qcow2)
mine=$(check_rc "$BLOCKPORT" check b.qcow2)
[[ $qc == "$mine" && $qc == 2 ]] || fail "check exit: qemu-img $qc, blockport $mine"
qr=$(check_rc qemu-img check -r all q.qcow2)
br=$(check_rc "$BLOCKPORT" check --repair all b.qcow2)
[[ $qr == 0 && $br == 0 ]] || fail "repair exit: qemu-img $qr, blockport $br"
[[ $(corrupt_bit q.qcow2) == 0 && $(corrupt_bit b.qcow2) == 0 ]] ||
    fail "the corrupt bit stayed"
[[ $(check_rc qemu-img check b.qcow2) == 0 ]] || fail "not clean after repair"
ok "both repaired, bit cleared, qemu-img check clean"

check "after: the repaired image is writable, and no write lands on metadata"
# Either repair counts the bad references (a refcount of 2 clears COPIED,
# so writes there copy the cluster elsewhere); blockport's also moves the
# refcount table, leaving the old one's cluster to the guest.  Whatever
# the repaired image's metadata is, the writes leave its header, L1 and
# refcount tables alone, and change L2 entries and refcounts only as any
# write does.
cp b.qcow2 o.qcow2
eval "$("${META[@]}" layout o.qcow2)"
qemu_side q.qcow2 -c "write -P 0x46 0 4k" -c "write -P 0x47 64k 4k"
nbd_side b.qcow2 -c "write -P 0x46 0 4k" -c "write -P 0x47 64k 4k"
[[ $QRC == 0 && $BRC == 0 ]] || fail "writes after repair: $(cat b.out)"
"${META[@]}" same o.qcow2 b.qcow2 "$L2+$CS" "$RB+$CS" ||
    fail "a write landed on the header, L1 or refcount table"
[[ $(corrupt_bit b.qcow2) == 0 ]] || fail "marked corrupt again"
qemu-img compare -q q.qcow2 b.qcow2 || fail "guest contents differ"
[[ $(check_rc qemu-img check b.qcow2) == 0 ]] || fail "check after writes"
ok "written as QEMU writes, metadata untouched"

# ---------------------------------------------------------------- healthy

# healthy BASE QEMU-IO-COMMANDS...: the same workload straight and over
# NBD: both succeed, identical guest contents, nothing found corrupt.
healthy() {
    local base=$1
    shift
    check "healthy: $base"
    prepare "$base"
    qemu_side q.qcow2 "$@"
    nbd_side b.qcow2 "$@"
    [[ $QRC == 0 && $BRC == 0 ]] || fail "$base: exit $QRC/$BRC: $(cat b.out)"
    ! grep -q "corrupt" b.log || fail "$base: $(grep corrupt b.log)"
    [[ $(corrupt_bit b.qcow2) == 0 ]] || fail "$base: marked corrupt"
    qemu-img compare -q q.qcow2 b.qcow2 || fail "$base: guest contents differ"
    local bc
    bc=$(check_rc qemu-img check b.qcow2)
    # A bitmap image loses its bitmaps to blockport: leaks (3), no errors.
    [[ $bc == 0 || ($base == bitmap && $bc == 3) ]] ||
        fail "$base: qemu-img check exit $bc"
    ok "$base: as QEMU, check exit $bc"
}
work=(-c "write -P 0x71 0 8k" -c "write -P 0x72 60k 8k" -c "write -P 0x73 1M 200k"
    -c "write -z 4k 64k" -c "discard 128k 64k" -c "write -P 0x74 192k 4k"
    -c "write -P 0x75 0 3k" -c "write -z 2M 1M")
healthy plain "${work[@]}"
healthy snap "${work[@]}"
healthy bitmap "${work[@]}"
healthy extl2 "${work[@]}"
healthy richx "${work[@]}"
healthy small -c "write -P 0x11 0 20M" -c "write -P 0x22 30M 1M" \
    -c "write -z 1M 2M" -c "discard 5M 1M" -c "write -P 0x33 100k 3k"
