#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport resize against qemu-img resize on copies of the same images:
# raw and qcow2 (small clusters so the L1 table grows over several
# clusters, extended L2, version 2, 1-bit refcounts, an external data file,
# an internal snapshot), absolute and relative sizes, --shrink, and
# --preallocation; each result checked by qemu-img check and compared with
# qemu-img's.  What a grown image shows is zeroes (also over a longer
# backing file, and over the old tail of a shrunken cluster).  Errors: no
# --shrink, sizes that are not, an inconsistent bitmap, an image in use.
# Persistent bitmaps, enabled and disabled, follow the size as qemu-img's
# do (their contents compared through qemu-nbd's dirty-bitmap context).  And
# crash safety: the process stopped at every one of its I/Os in turn
# (BLOCKPORT_FAULTS) leaves an image that qemu-img check finds consistent,
# with the data below both sizes intact.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

# both FILE ARGS...: resize a copy of FILE with qemu-img and FILE itself
# with blockport; both succeed, and the results read the same.
both() {
    local f=$1
    shift
    cp --sparse=always "$f" "q-$f"
    [[ ! -e data.bin ]] || cp --sparse=always data.bin q-data.bin
    run qemu-img resize -q "q-$f" "$@" >/dev/null 2>&1 || fail "qemu-img resize $* failed"
    local rc=0
    "$BLOCKPORT" resize "$f" "$@" >out 2>err || rc=$?
    [[ $rc == 0 ]] || { cat err; fail "resize $f $*: exit $rc"; }
    grep -qx "Image resized." out || fail "resize $*: no 'Image resized.' line"
    # Only the probe's warning (qemu-img prints one too).
    ! grep -v "probing guessed raw" err || fail "resize $*: a message on success"
    [[ $f == *.raw ]] || run qemu-img check -q "$f" || fail "qemu-img check after resize $*"
    local a b
    a=$(qemu-img info --output=json "$f" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
    b=$(qemu-img info --output=json "q-$f" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
    [[ $a == "$b" ]] || fail "resize $*: size $a, qemu-img made $b"
    run qemu-img compare -q "$f" "q-$f" || fail "resize $*: content differs from qemu-img's"
}

check "raw: grow, relative sizes, --shrink, preallocation"
random_file r.raw 1
both r.raw 3M
both r.raw +1536K
both r.raw --shrink -- -4M
[[ $(stat -c %s r.raw) == $((512 * 1024)) ]] || fail "raw size $(stat -c %s r.raw)"
both r.raw --preallocation=full 2M
(($(stat -c %b r.raw) * 512 >= 2 << 20)) || fail "full preallocation left holes"
both r.raw --preallocation=falloc 3M
(($(stat -c %b r.raw) * 512 >= 3 << 20)) || fail "falloc preallocation left holes"
"$BLOCKPORT" resize -f raw --preallocation=metadata r.raw 4M 2>err && fail "metadata accepted for raw"
grep -q "no metadata to preallocate" err || fail "message: $(cat err)"
ok "raw"

# The qcow2 images: OPTIONS for create, then grow (the L1 table too) and
# shrink (L2 tables dropped), with data in the part that stays.
check "qcow2: grow and shrink as qemu-img does"
n=0
for opts in "cluster_size=65536" "cluster_size=4096" "cluster_size=16k,extended_l2=on" \
    "compat=0.10,cluster_size=4096" "refcount_bits=1,cluster_size=4096" \
    "data_file=data.bin,cluster_size=4096" "data_file=data.bin,data_file_raw=on"; do
    rm -f q.qcow2 data.bin q-data.bin
    run qemu-img create -q -f qcow2 -o "$opts" q.qcow2 2M
    run qemu-io -c "write -P 5 0 2M" q.qcow2 >/dev/null
    both q.qcow2 3G
    run qemu-io -c "write -P 6 2G 1M" q.qcow2 >/dev/null
    cp q.qcow2 q-q.qcow2 # the write above, on both
    both q.qcow2 +8M
    both q.qcow2 --shrink 1M
    run qemu-io -c "read -P 5 0 1M" q.qcow2 | grep -q "^read" || fail "$opts: data lost"
    both q.qcow2 4M
    n=$((n + 1))
done
ok "$n kinds of image"

check "qcow2 preallocation on growing: metadata, falloc, full"
for mode in metadata falloc full; do
    for opts in "cluster_size=65536" "extended_l2=on"; do
        rm -f p.qcow2
        run qemu-img create -q -f qcow2 -o "$opts" p.qcow2 1M
        both p.qcow2 --preallocation=$mode 6M
        diff <(qemu-img map --output=json p.qcow2 | sed 's/"offset": [0-9]*//') \
            <(qemu-img map --output=json q-p.qcow2 | sed 's/"offset": [0-9]*//') ||
            fail "preallocation=$mode ($opts): allocation differs from qemu-img's"
    done
done
ok "the same allocation as qemu-img's"

check "what growing adds reads as zeroes: a longer backing file, the tail of a shrunken cluster"
run qemu-img create -q -f qcow2 base.qcow2 4M
run qemu-io -c "write -P 7 0 4M" base.qcow2 >/dev/null
run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 ov.qcow2 1M
both ov.qcow2 4M
run qemu-io -c "read -P 7 0 1M" -c "read -P 0 1M 3M" ov.qcow2 | grep -c "^read" | grep -qx 2 ||
    fail "backing data past the old end shows through"
rm -f t.qcow2
run qemu-img create -q -f qcow2 t.qcow2 1M
run qemu-io -c "write -P 5 0 1M" t.qcow2 >/dev/null
run "$BLOCKPORT" resize -q --shrink t.qcow2 $((512 * 1024 + 512))
run "$BLOCKPORT" resize -q t.qcow2 1M
run qemu-io -c "read -P 5 0 $((512 * 1024 + 512))" -c "read -P 0 $((512 * 1024 + 512)) $((512 * 1024 - 512))" \
    t.qcow2 | grep -c "^read" | grep -qx 2 || fail "the old tail of the last cluster shows through"
run qemu-img check -q t.qcow2 || fail "check"
ok "zeroes"

check "an internal snapshot stays whole through grow and shrink"
rm -f s.qcow2
run qemu-img create -q -f qcow2 s.qcow2 4M
run qemu-io -c "write -P 1 0 4M" s.qcow2 >/dev/null
run qemu-img snapshot -c snap s.qcow2
both s.qcow2 64M
both s.qcow2 --shrink 1M
run qemu-img snapshot -a snap s.qcow2
run qemu-io -c "read -P 1 0 4M" s.qcow2 | grep -q "^read" || fail "snapshot data lost"
run qemu-img check -q s.qcow2 || fail "check after applying the snapshot"
ok "snapshot"

check "errors: exit 1 with a message, the image untouched"
run qemu-img create -q -f qcow2 e.qcow2 4M
run qemu-io -c "write -P 9 0 4M" e.qcow2 >/dev/null
cp e.qcow2 e0.qcow2
refuse() { # MESSAGE ARGS...
    local msg=$1 rc=0
    shift
    "$BLOCKPORT" resize "$@" >out 2>err || rc=$?
    [[ $rc == 1 ]] || fail "resize $*: exit $rc, expected 1"
    grep -q -- "$msg" err || fail "resize $*: expected '$msg', got: $(cat err)"
    grep -q "^blockport resize: " err || fail "resize $*: message not prefixed"
    cmp -s e.qcow2 e0.qcow2 || fail "resize $* changed the image"
}
refuse "Use the --shrink option" e.qcow2 1M
refuse "must be positive" --shrink e.qcow2 -- -4M
refuse "must be positive" --shrink e.qcow2 0
refuse "multiple of 512" e.qcow2 +1000
refuse "expected a size" e.qcow2 12X
refuse "expected a size" e.qcow2 1MiB
refuse "expected an image and a size" e.qcow2
refuse "nosuch.qcow2" nosuch.qcow2 1M
refuse "preallocation" --preallocation=sometimes e.qcow2 8M
refuse "growing only" --shrink --preallocation=full e.qcow2 1M
# An inconsistent bitmap (left in use by a process that died) is refused,
# as qemu-img refuses it.
run qemu-img bitmap --add e.qcow2 bm0
qemu-io -c "write 0 4k" -c "sigraise 9" e.qcow2 >/dev/null 2>&1 || true
qemu-img info e.qcow2 | grep -q "in-use" || fail "qemu-io left no bitmap in use"
cp e.qcow2 e0.qcow2
refuse "bitmap 'bm0' is inconsistent and cannot be used" e.qcow2 8M
run qemu-img bitmap --remove e.qcow2 bm0
cp e.qcow2 e0.qcow2
start_server e.qcow2
refuse "lock" e.qcow2 8M
stop_server
"$BLOCKPORT" resize nbd://localhost:1/x 8M 2>err && fail "an NBD URI was resized"
ok "refused"

# bitmaps FILE: each bitmap's dirty map (qemu-nbd -B, nbdinfo --map), and
# its name, granularity and flags.
bitmaps() {
    local f=$1 n
    qemu-img info --output=json "$f" | "$PY" -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    print(b["name"], b["granularity"], ",".join(b["flags"]))'
    for n in $(qemu-img info --output=json "$f" | "$PY" -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    print(b["name"])'); do
        rm -f qn.sock qn.pid
        qemu-nbd -r -f qcow2 -B "$n" -k "$T/qn.sock" --pid-file="$T/qn.pid" "$f" &
        local pid=$!
        track_pid "$pid"
        wait_file 10 "$T/qn.pid" "$pid" || fail "qemu-nbd did not start"
        # Retried: the pid file may come before the socket listens.
        wait_until 10 nbdinfo --map="qemu:dirty-bitmap:$n" \
            "nbd+unix:///?socket=$T/qn.sock" 2>nbdinfo.err ||
            { cat nbdinfo.err; fail "nbdinfo --map of bitmap $n"; }
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
}

# both_bitmaps FILE STEPS...: each step a size, "-SIZE" for --shrink SIZE;
# blockport and qemu-img resize copies of FILE; the images must check
# clean and keep the same data and the same bitmaps.
both_bitmaps() {
    local f=$1 step
    shift
    cp "$f" b-bp.qcow2
    cp "$f" b-q.qcow2
    for step in "$@"; do
        local o=()
        [[ $step == -* ]] && o=(--shrink) && step=${step#-}
        run qemu-img resize -q "${o[@]}" b-q.qcow2 "$step" || fail "qemu-img resize $step"
        run "$BLOCKPORT" resize -q "${o[@]}" b-bp.qcow2 "$step" || fail "resize $step"
    done
    run qemu-img check -q b-bp.qcow2 || fail "resize $*: qemu-img check"
    run qemu-img compare -q b-bp.qcow2 b-q.qcow2 || fail "resize $*: data differs"
    bitmaps b-q.qcow2 >want || fail "bitmaps of qemu-img's copy"
    bitmaps b-bp.qcow2 >got || fail "bitmaps of blockport's copy"
    diff want got || fail "resize $*: bitmaps differ from qemu-img's"
}

check "persistent bitmaps follow the size, as qemu-img's"
if command -v qemu-nbd >/dev/null && command -v nbdinfo >/dev/null; then
    # 64 KiB clusters: an enabled bitmap, and a disabled one holding bits.
    run qemu-img create -q -f qcow2 bm.qcow2 64M
    run qemu-img bitmap --add -g 65536 bm.qcow2 on
    run qemu-img bitmap --add -g 131072 bm.qcow2 off
    run qemu-io -c "write -P 1 0 1M" -c "write -P 2 60M 4M" -c "write -P 3 63M 100k" bm.qcow2 >/dev/null
    run qemu-img bitmap --disable bm.qcow2 off
    run qemu-io -c "write -P 4 30M 64k" bm.qcow2 >/dev/null
    bitmaps bm.qcow2 >maps || fail "bitmaps of the test image"
    [[ $(grep -c " dirty" maps) -ge 2 ]] || fail "the test image's bitmaps hold no bits"
    both_bitmaps bm.qcow2 +10M
    both_bitmaps bm.qcow2 -40M
    # Ends inside a bit and inside a data cluster; bits past them cleared.
    both_bitmaps bm.qcow2 -63500K
    both_bitmaps bm.qcow2 -1M 64M
    both_bitmaps bm.qcow2 +3G
    # 512-byte clusters: tables over several clusters move, data clusters
    # past the end are freed.
    run qemu-img create -q -f qcow2 -o cluster_size=512 bs.qcow2 256M
    run qemu-img bitmap --add -g 512 bs.qcow2 fine
    run qemu-io -c "write -P 5 0 64k" -c "write -P 6 255M 1M" -c "write 100M 3k" bs.qcow2 >/dev/null
    both_bitmaps bs.qcow2 +100M
    both_bitmaps bs.qcow2 -1M
    both_bitmaps bs.qcow2 -200M +56M
    ok "bitmaps as qemu-img leaves them"
else
    skip_case "qemu-nbd or nbdinfo missing"
fi

# crash_at OPTS SIZE WRITES ARGS...: for N = 0, 1, ...: a fresh image of
# SIZE made with OPTS, 1 MiB of pattern at 0 and the qemu-io WRITES, then
# resize ARGS with every I/O from the Nth on failing, as if the process had
# died there; the image must stay consistent and keep the data below both
# sizes.  Stops once a resize gets through.
crash_at() {
    local opts=$1 size=$2 writes=$3 n=0 rc rc2
    shift 3
    while :; do
        rm -f c.qcow2
        run qemu-img create -q -f qcow2 -o "$opts" c.qcow2 "$size"
        [[ -z ${CRASH_BITMAP:-} ]] || run qemu-img bitmap --add -g 512 c.qcow2 bm
        run qemu-io -c "write -P 4 0 1M" -c "$writes" c.qcow2 >/dev/null
        rc=0
        BLOCKPORT_FAULTS="op=any,after=$n" "$BLOCKPORT" resize -q "$@" >/dev/null 2>err || rc=$?
        grep -qiE 'sanitizer|runtime error' err && { cat err; fail "sanitizer report at I/O $n"; }
        rc2=0
        qemu-img check -q c.qcow2 >check.out 2>&1 || rc2=$?
        # 0: clean, 3: leaked clusters only.
        [[ $rc2 == 0 || $rc2 == 3 ]] || { cat check.out; fail "resize $* stopped at I/O $n: image not consistent"; }
        qemu-io -c "read -P 4 0 1M" c.qcow2 | grep -q "^read" ||
            fail "resize $* stopped at I/O $n: data lost"
        [[ $rc == 0 ]] && break
        n=$((n + 1))
        ((n < 400)) || fail "resize $* still failing after 400 I/Os"
    done
    echo "  $n I/Os"
}

check "crash safety: stopped at any I/O, grow (L1 table moved) and shrink leave a consistent image"
crash_at cluster_size=4096 2M "write -P 4 1M 4k" c.qcow2 3G
# Clusters unmapped and an L2 table (2 MiB of 4 KiB clusters) dropped.
crash_at cluster_size=4096 4M "write -P 4 3M 64k" --shrink c.qcow2 1M
crash_at cluster_size=16k,extended_l2=on 2M "write -P 4 1M 4k" c.qcow2 1G
# With a persistent bitmap whose table moves (512-byte clusters).
CRASH_BITMAP=1 crash_at cluster_size=512 1M "write -P 4 512k 4k" c.qcow2 2M
CRASH_BITMAP=1 crash_at cluster_size=512 2M "write -P 4 1536k 4k" --shrink c.qcow2 1M
ok "consistent at every step"
