#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport bitmap against qemu-img bitmap on twin copies of the same
# images: every verb and combinations of them, the error cases (exit
# status and message, "qemu-img: " and "blockport bitmap: " taken off),
# then the bitmaps of both copies compared (qemu-img info's name,
# granularity and flags, and each bitmap's dirty map through qemu-nbd -B
# and nbdinfo; blockport info's list too) and both checked by qemu-img
# check.  Also: an inconsistent bitmap, a merge from another image (-b),
# a v2 image, a backing file's name moved by the header extension, a
# locked image, a raw image; a crash at every I/O leaves an image
# qemu-img check accepts (leaks at worst); convert --bitmaps against
# qemu-img convert --bitmaps.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io qemu-nbd nbdinfo
cd "$T"

# names FILE: the bitmaps qemu-img info lists, "name granularity flags".
names() {
    qemu-img info --output=json "$1" | "$PY" -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    print(b["name"], b["granularity"], ",".join(b["flags"]))'
}

# bitmaps FILE: names, then each consistent bitmap's dirty map, from one
# qemu-nbd exporting them all.
bitmaps() {
    local f=$1 n
    names "$f"
    local -a list=() opts=()
    mapfile -t list < <(names "$f" | awk '$3 !~ /in-use/ { print $1 }')
    ((${#list[@]})) || return 0
    for n in "${list[@]}"; do opts+=(-B "$n"); done
    rm -f qn.sock qn.pid
    qemu-nbd -r -t -f qcow2 "${opts[@]}" -k "$T/qn.sock" --pid-file="$T/qn.pid" "$f" &
    local pid=$!
    track_pid "$pid"
    wait_file 10 "$T/qn.pid" "$pid" || fail "qemu-nbd did not start"
    for n in "${list[@]}"; do
        echo "map $n"
        # Retried: the pid file may come before the socket listens.
        wait_until 10 nbdinfo --map="qemu:dirty-bitmap:$n" \
            "nbd+unix:///?socket=$T/qn.sock" 2>nbdinfo.err ||
            { cat nbdinfo.err; fail "nbdinfo --map of bitmap $n"; }
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

# msg FILE: the messages without the program's prefix, node names as the
# image path.
msg() {
    sed -E -e 's/^(qemu-img|blockport bitmap|blockport convert): //' \
        -e "s/persistent in '[^']*'/persistent in NODE/" "$1"
}

# twin IMAGE ARGS... (BITMAP last but for the file, as in the usage): run
# qemu-img bitmap and blockport bitmap on copies; same exit status, same
# messages, same bitmaps, both clean for qemu-img check.  FILE in ARGS
# stands for the copy.
twin() {
    local img=$1 a rcq=0 rcb=0
    shift
    cp --sparse=always "$img" q.qcow2
    cp --sparse=always "$img" b.qcow2
    local -a qa=() ba=()
    for a in "$@"; do
        if [[ $a == FILE ]]; then qa+=(q.qcow2); ba+=(b.qcow2); else qa+=("$a"); ba+=("$a"); fi
    done
    qemu-img bitmap "${qa[@]}" >q.out 2>q.err || rcq=$?
    "$BLOCKPORT" bitmap "${ba[@]}" >b.out 2>b.err || rcb=$?
    grep -qiE 'sanitizer|runtime error' b.err && { cat b.err; fail "sanitizer report: $*"; }
    [[ $rcq == "$rcb" ]] || { cat q.err b.err; fail "bitmap $*: exit $rcb, qemu-img $rcq"; }
    msg q.err | sed 's/q\.qcow2/FILE/g' >q.msg
    msg b.err | sed 's/b\.qcow2/FILE/g' >b.msg
    diff q.msg b.msg >/dev/null || { diff q.msg b.msg; fail "bitmap $*: messages differ"; }
    [[ -z ${TWIN_NO_CHECK:-} ]] || return 0
    run qemu-img check -q b.qcow2 || fail "bitmap $*: qemu-img check"
    bitmaps q.qcow2 >want || fail "bitmaps of qemu-img's copy"
    bitmaps b.qcow2 >got || fail "bitmaps of blockport's copy"
    diff want got || fail "bitmap $*: bitmaps differ from qemu-img's"
    # blockport info lists them as qemu-img info does.
    "$BLOCKPORT" info --output=json b.qcow2 | "$PY" -c '
import json, sys
for b in json.load(sys.stdin)["format-specific"]["data"].get("bitmaps", []):
    print(b["name"], b["granularity"], ",".join(b["flags"]))' >info.got
    names b.qcow2 | diff - info.got || fail "bitmap $*: blockport info differs"
}

# The test image: 64 MiB, an enabled bitmap, a fine one and a disabled
# coarse one, with bits in each.
run qemu-img create -q -f qcow2 base.qcow2 64M
run qemu-img bitmap --add base.qcow2 a
run qemu-img bitmap --add -g 512 base.qcow2 s
run qemu-img bitmap --add -g 1M base.qcow2 d
run qemu-io -c "write 100k 1k" -c "write 5M 300" -c "write 63M 1M" base.qcow2 >/dev/null
run qemu-img bitmap --disable base.qcow2 d
run qemu-io -c "write 30M 64k" base.qcow2 >/dev/null
bitmaps base.qcow2 >maps
[[ $(grep -c " dirty" maps) -ge 6 ]] || fail "the test image's bitmaps hold no bits"

check "each verb, and several in one call, as qemu-img bitmap"
twin base.qcow2 --add FILE new
twin base.qcow2 --add -g 512 FILE new
twin base.qcow2 --add -g 2G FILE new
twin base.qcow2 --add -g 0 --disable FILE new
twin base.qcow2 --remove FILE a
twin base.qcow2 --clear FILE s
twin base.qcow2 --disable FILE a
twin base.qcow2 --enable FILE d
twin base.qcow2 --merge s FILE a
twin base.qcow2 --merge d FILE s
twin base.qcow2 --add -g 128k FILE m --merge s --merge d --disable
twin base.qcow2 --clear FILE a --merge s
twin base.qcow2 --remove FILE a --add -g 4k
twin base.qcow2 --add FILE x --remove
twin base.qcow2 --disable --enable --disable FILE a
twin base.qcow2 --merge a FILE a
twin base.qcow2 --add FILE "$(printf 'n%.0s' {1..1023})"
ok "same bitmaps, same bits, clean"

check "errors: same exit status and message, what came before kept"
for args in "--add FILE a" "--add -g 1000 FILE x" "--add -g 256 FILE x" \
    "--add -g 4G FILE x" "--add -g xx FILE x" "--remove FILE nope" \
    "--clear FILE nope" "--enable FILE nope" "--disable FILE nope" \
    "--merge nope FILE a" "--merge a FILE nope" "-g 64k --remove FILE a" \
    "-b other --remove FILE a" "-F qcow2 --merge a FILE a" "FILE a" \
    "--add FILE" "--add FILE x --merge nope" "--remove FILE a --clear"; do
    # shellcheck disable=SC2086
    twin base.qcow2 $args
done
twin base.qcow2 --add FILE ""
twin base.qcow2 --add FILE "$(printf 'n%.0s' {1..1024})"
ok "refused alike"

check "an inconsistent (in-use) bitmap: only --remove"
cp base.qcow2 inuse.qcow2
# IN_USE set in the directory entry of bitmap s, as a crash leaves it.
"$PY" - inuse.qcow2 s <<'PYEOF' || fail "marking s in use"
import struct, sys
path, name = sys.argv[1], sys.argv[2].encode()
f = open(path, "r+b"); h = f.read(65536)
p = struct.unpack(">I", h[100:104])[0]
while True:
    t, l = struct.unpack(">II", h[p:p + 8])
    if t == 0x23852875:
        nb, _, size, off = struct.unpack(">IIQQ", h[p + 8:p + 32]); break
    p += 8 + ((l + 7) & ~7)
f.seek(off); d = f.read(size); q = 0
for i in range(nb):
    ns, ex = struct.unpack(">HI", d[q + 18:q + 24])
    if d[q + 24:q + 24 + ns] == name:
        fl = struct.unpack(">I", d[q + 12:q + 16])[0] | 1
        f.seek(off + q + 12); f.write(struct.pack(">I", fl)); sys.exit(0)
    q += (24 + ns + ex + 7) & ~7
sys.exit(1)
PYEOF
# Not grep -q: it may leave before the writer is done (pipefail).
names inuse.qcow2 | grep "^s 512 in-use" >/dev/null || fail "s is not in use"
for args in "--clear FILE s" "--enable FILE s" "--disable FILE s" "--merge a FILE s" \
    "--merge s FILE a" "--add FILE s" "--remove FILE s" "--add FILE t --merge s"; do
    # shellcheck disable=SC2086
    twin inuse.qcow2 $args
done
ok "refused as qemu-img refuses, removed as it removes"

check "--merge from another image (-b, -F)"
run qemu-img create -q -f qcow2 other.qcow2 64M
run qemu-img bitmap --add -g 4k other.qcow2 o
run qemu-io -c "write 40M 100k" other.qcow2 >/dev/null
run qemu-img create -q -f qcow2 small.qcow2 32M
run qemu-img bitmap --add small.qcow2 o
twin base.qcow2 --merge o -b other.qcow2 FILE a
twin base.qcow2 --add FILE n --merge o -b other.qcow2 -F qcow2
twin base.qcow2 --merge o -b other.qcow2 -F raw FILE a
twin base.qcow2 --merge nope -b other.qcow2 FILE a
twin base.qcow2 --merge o -b small.qcow2 FILE a
ok "merged alike"

check "no bitmaps yet, a backing file, small clusters, version 2"
run qemu-img create -q -f qcow2 plain.qcow2 64M
twin plain.qcow2 --add FILE x
twin plain.qcow2 --add FILE x --remove
run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 over.qcow2
twin over.qcow2 --add FILE x
twin over.qcow2 --add FILE x --remove
"$BLOCKPORT" bitmap --add over.qcow2 y && "$BLOCKPORT" bitmap --remove over.qcow2 y ||
    fail "add and remove over a backing file"
qemu-img info over.qcow2 | grep -q "^backing file: base.qcow2" || fail "backing file name lost"
run qemu-img compare -q over.qcow2 base.qcow2 || fail "the overlay reads otherwise"
run qemu-img create -q -f qcow2 -o cluster_size=512 c512.qcow2 64M
run qemu-img bitmap --add -g 512 c512.qcow2 f
run qemu-io -c "write 1M 3k" -c "write 60M 1M" c512.qcow2 >/dev/null
twin c512.qcow2 --add FILE x --merge f
twin c512.qcow2 --clear FILE f
twin c512.qcow2 --remove FILE f
run qemu-img create -q -f qcow2 -o compat=0.10 v2.qcow2 64M
twin v2.qcow2 --add FILE x
twin v2.qcow2 --remove FILE x
ok "alike"

check "a locked image, a raw image"
cp base.qcow2 busy.qcow2
qemu-io -c "sleep 60000" busy.qcow2 >/dev/null 2>qemu-io.err &
busy=$!
track_pid "$busy"
wait_until 10 write_locked busy.qcow2 || fail "qemu-io did not lock the image: $(cat qemu-io.err)"
rc=0
"$BLOCKPORT" bitmap --add busy.qcow2 x 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "lock" err || { cat err; fail "a locked image: exit $rc"; }
# SIGKILL: on SIGTERM qemu-io stores its bitmaps as it exits, and under
# load that store has been seen to fail and drop them (its "Some clusters
# may be leaked"), which is qemu-io's doing, not the command's under test.
kill -KILL "$busy"
wait "$busy" 2>/dev/null || true
# The same bitmaps as before (qemu-io, killed, leaves them in use).
after=$(names busy.qcow2) || fail "qemu-img info busy.qcow2"
[[ $(cut -d' ' -f1 <<<"$after") == "$(names base.qcow2 | cut -d' ' -f1)" ]] ||
    fail "a locked image was changed: $after"
run qemu-img create -q -f raw r.raw 1M
rc=0
"$BLOCKPORT" bitmap --add r.raw x 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "persistent bitmaps" err || { cat err; fail "raw --add: exit $rc"; }
rc=0
"$BLOCKPORT" bitmap --remove -f raw r.raw x 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "Dirty bitmap 'x' not found" err || { cat err; fail "raw --remove: exit $rc"; }
ok "refused, the image untouched"

check "crash safety: stopped at any I/O, qemu-img check accepts the image"
# crash_at ARGS...: for N = 0, 1, ...: every I/O from the Nth on fails;
# clean or leaks only, and the image still opens for writing.
crash_at() {
    local n=0 rc rc2
    while :; do
        cp c512.qcow2 crash.qcow2
        rc=0
        BLOCKPORT_FAULTS="op=any,after=$n" "$BLOCKPORT" bitmap "$@" 2>err || rc=$?
        grep -qiE 'sanitizer|runtime error' err && { cat err; fail "sanitizer report at I/O $n"; }
        rc2=0
        qemu-img check -q crash.qcow2 >check.out 2>&1 || rc2=$?
        [[ $rc2 == 0 || $rc2 == 3 ]] || { cat check.out; fail "bitmap $* stopped at I/O $n: not consistent"; }
        [[ $rc == 0 ]] && break
        n=$((n + 1))
        ((n < 300)) || fail "bitmap $* still failing after 300 I/Os"
    done
    echo "  $n I/Os"
}
crash_at --add crash.qcow2 x --merge f --remove
crash_at --remove crash.qcow2 f
ok "consistent at every step"

check "convert --bitmaps as qemu-img convert --bitmaps"
convert_twin() { # ARGS... with SRC DST last but DST as OUT
    local rcq=0 rcb=0
    rm -f cq.qcow2 cb.qcow2 cq.raw cb.raw
    qemu-img convert "${@/OUT/cq.qcow2}" >/dev/null 2>q.err || rcq=$?
    "$BLOCKPORT" convert "${@/OUT/cb.qcow2}" >/dev/null 2>b.err || rcb=$?
    [[ $rcq == "$rcb" ]] || { cat q.err b.err; fail "convert $*: exit $rcb, qemu-img $rcq"; }
    msg q.err | { grep -v "^Try 'blockport" || true; } >q.msg
    msg b.err | { grep -v "^Try 'blockport" || true; } >b.msg
    diff q.msg b.msg || fail "convert $*: messages differ"
    [[ $rcq == 0 ]] || return 0
    run qemu-img check -q cb.qcow2 || fail "convert $*: qemu-img check"
    bitmaps cq.qcow2 >want && bitmaps cb.qcow2 >got || fail "bitmaps of the outputs"
    diff want got || fail "convert $*: bitmaps differ from qemu-img's"
}
convert_twin --bitmaps -O qcow2 base.qcow2 OUT
convert_twin --bitmaps -O qcow2 c512.qcow2 OUT
convert_twin --bitmaps -O qcow2 inuse.qcow2 OUT
[[ -e cb.qcow2 ]] && fail "an inconsistent bitmap: the output was made"
convert_twin --bitmaps --skip-broken-bitmaps -O qcow2 inuse.qcow2 OUT
convert_twin --skip-broken-bitmaps -O qcow2 base.qcow2 OUT
convert_twin --bitmaps -O qcow2 r.raw OUT
convert_twin --bitmaps -O qcow2 -o compat=0.10 base.qcow2 OUT
ok "alike"
