#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport create: for a matrix of options, the image passes `qemu-img
# check`, `qemu-img info` agrees with the options, qemu-io writes and reads
# it back; blockport serve serves a created image (writes over NBD, then
# `qemu-img check`); preallocation=metadata shows allocated clusters in
# `qemu-img map`; an overlay reads its backing file's data; raw images and
# bad options.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io nbdinfo

# info_field FILE EXPR: a field of `qemu-img info --output=json` (Python
# expression over j).
info_field() {
    qemu-img info --output=json "$1" |
        "$PY" -c "import json,sys; j=json.load(sys.stdin); v=$2; print(str(v).lower() if isinstance(v,bool) else v)"
}

# qio WHAT QEMU-IO-ARGS...: run qemu-io; a failed command or pattern check
# is a (soft) failure.
qio() {
    local what=$1 out rc=0
    shift
    out=$(run qemu-io "$@" 2>&1) || rc=$?
    if [[ $rc != 0 ]] || grep -qiE "fail|error" <<<"$out"; then
        fail_soft "$what: qemu-io exit $rc: $out"
    fi
    return 0
}

expect_field() { # FILE EXPR WANT
    local got
    got=$(info_field "$1" "$2") || { fail_soft "$1: qemu-img info failed"; return; }
    [[ $got == "$3" ]] || fail_soft "$1: $2 is '$got', expected '$3'"
}

check "option matrix: qemu-img check, info, qemu-io"
n=0
for opts in \
    "" \
    "compat=0.10" \
    "compat=0.10,cluster_size=4k" \
    "cluster_size=512" \
    "cluster_size=2M" \
    "cluster_size=16k,extended_l2=on" \
    "extended_l2=on,compression_type=zstd" \
    "lazy_refcounts=on" \
    "refcount_bits=1" "refcount_bits=2" "refcount_bits=4" "refcount_bits=8" \
    "refcount_bits=32" "refcount_bits=64" \
    "refcount_bits=1,cluster_size=512" \
    "compression_type=zstd,lazy_refcounts=on,refcount_bits=64" \
    "preallocation=metadata" \
    "preallocation=metadata,cluster_size=4k,refcount_bits=1" \
    "preallocation=metadata,extended_l2=on" \
    "preallocation=falloc,cluster_size=128k" \
    "preallocation=full,compat=0.10"; do
    n=$((n + 1))
    img=$T/m$n.qcow2
    size=$((64 + n))M
    run "$BLOCKPORT" create -q -f qcow2 ${opts:+-o "$opts"} "$img" "$size" ||
        { fail_soft "create -o '$opts' failed"; continue; }
    run qemu-img check -q "$img" || fail_soft "qemu-img check: -o '$opts'"
    # What qemu-img info should say.
    declare -A want=([cluster_size]=65536 [compat]=1.1 [refcount_bits]=16
                     [extended_l2]=false [compression_type]=zlib
                     [lazy_refcounts]=false)
    IFS=, read -ra kvs <<<"$opts"
    for kv in "${kvs[@]}"; do
        k=${kv%%=*} v=${kv#*=}
        case $v in on) v=true ;; off) v=false ;; esac
        case $k in
        cluster_size)
            case $v in 512) v=512 ;; 4k) v=4096 ;; 16k) v=16384 ;;
            128k) v=131072 ;; 2M) v=2097152 ;; esac ;;
        esac
        want[$k]=$v
    done
    expect_field "$img" 'j["virtual-size"]' $(((64 + n) * 1024 * 1024))
    expect_field "$img" 'j["cluster-size"]' "${want[cluster_size]}"
    expect_field "$img" 'j["format"]' qcow2
    d='j["format-specific"]["data"]'
    expect_field "$img" "$d[\"compat\"]" "${want[compat]}"
    if [[ ${want[compat]} == 1.1 ]]; then
        expect_field "$img" "$d[\"refcount-bits\"]" "${want[refcount_bits]}"
        expect_field "$img" "$d[\"extended-l2\"]" "${want[extended_l2]}"
        expect_field "$img" "$d[\"compression-type\"]" "${want[compression_type]}"
        expect_field "$img" "$d[\"lazy-refcounts\"]" "${want[lazy_refcounts]}"
    fi
    unset want
    qio "write -o '$opts'" -f qcow2 -c "write -P 0x5a 1M 3M" \
        -c "write -P 0x33 60M 1M" "$img"
    qio "read back -o '$opts'" -f qcow2 -c "read -P 0x5a 1M 3M" \
        -c "read -P 0x33 60M 1M" -c "read -P 0 0 1M" "$img"
    run qemu-img check -q "$img" || fail_soft "qemu-img check after writes: -o '$opts'"
    # Our own reader opens it too.
    run "$BLOCKPORT" info "$img" >/dev/null || fail_soft "blockport info: -o '$opts'"
done
ok "$n option sets"

check "preallocation=metadata: every cluster allocated in qemu-img map"
run "$BLOCKPORT" create -q -f qcow2 -o preallocation=metadata "$T/pre.qcow2" 10M
qemu-img map --output=json "$T/pre.qcow2" | "$PY" -c '
import json, sys
m = json.load(sys.stdin)
assert sum(e["length"] for e in m if e["data"] and "offset" in e) == 10 << 20, m
' || fail_soft "preallocated clusters missing from qemu-img map"
run qemu-img check "$T/pre.qcow2" | grep -q "100.00% allocated" ||
    fail_soft "qemu-img check does not report 100% allocated"
for mode in falloc full; do
    run "$BLOCKPORT" create -q -f qcow2 -o preallocation=$mode "$T/$mode.qcow2" 8M
    run qemu-img check -q "$T/$mode.qcow2" || fail_soft "check preallocation=$mode"
    blocks=$(stat -c %b "$T/$mode.qcow2")
    ((blocks * 512 >= 8 * 1024 * 1024)) ||
        fail_soft "preallocation=$mode: only $((blocks * 512)) bytes allocated"
done
ok "preallocation"

check "preallocation with extended_l2: reserved clusters, no subcluster allocated, a backing file allowed"
random_file "$T/pbase.raw" 2
for mode in metadata falloc full; do
    for b in "" "-b pbase.raw -F raw"; do
        # shellcheck disable=SC2086 # $b is two options or none
        run "$BLOCKPORT" create -q -f qcow2 -o preallocation=$mode,extended_l2=on $b "$T/pb.qcow2" 2M
        # shellcheck disable=SC2086
        run qemu-img create -q -f qcow2 -o preallocation=$mode,extended_l2=on $b "$T/pq.qcow2" 2M
        diff <(qemu-img map --output=json "$T/pb.qcow2") <(qemu-img map --output=json "$T/pq.qcow2") ||
            fail_soft "preallocation=$mode,extended_l2=on $b: map differs from qemu-img's"
        run qemu-img check -q "$T/pb.qcow2" || fail_soft "check $mode $b"
        run qemu-img compare -q "$T/pb.qcow2" "$T/pq.qcow2" || fail_soft "compare $mode $b"
    done
done
"$BLOCKPORT" create -q -f qcow2 -o preallocation=metadata -b pbase.raw -F raw "$T/pe.qcow2" 2M 2>"$T/err" &&
    fail_soft "preallocation with a backing file but no extended_l2 accepted"
grep -q "only be used at the same time if extended_l2 is on" "$T/err" || fail_soft "message: $(cat "$T/err")"
ok "as qemu-img makes them"

check "data_file, data_file_raw: made as qemu-img makes them, written through blockport serve"
# In the images' directory: qemu-img 7.2 opens a data file relative to the
# working directory, blockport (like a backing file) relative to the image.
cd "$T"
for o in data_file=db.data data_file=db.data,data_file_raw=on \
    data_file=db.data,preallocation=full data_file=db.data,data_file_raw=on,extended_l2=on; do
    rm -f db.* dq.*
    run "$BLOCKPORT" create -q -f qcow2 -o "$o" db.qcow2 4M
    run qemu-img create -q -f qcow2 -o "${o//db/dq}" dq.qcow2 4M
    diff <(qemu-img map --output=json db.qcow2) <(qemu-img map --output=json dq.qcow2) ||
        fail_soft "$o: map differs from qemu-img's"
    diff <(qemu-img info db.qcow2 | grep -E "data file raw|extended l2|^virtual size") \
        <(qemu-img info dq.qcow2 | grep -E "data file raw|extended l2|^virtual size") ||
        fail_soft "$o: info differs from qemu-img's"
    [[ $(stat -c %s db.data) == $((4 << 20)) ]] || fail_soft "$o: data file size"
    start_server --format qcow2 "$T/db.qcow2"
    run qemu-io -f raw -c "write -P 3 100k 300k" "$(export_uri "")" >/dev/null
    stop_server
    run qemu-io -c "write -P 3 100k 300k" dq.qcow2 >/dev/null
    run qemu-img check -q db.qcow2 || fail_soft "$o: check"
    run qemu-img compare -q db.qcow2 dq.qcow2 || fail_soft "$o: compare"
done
"$BLOCKPORT" create -q -f qcow2 -o data_file_raw=on dx.qcow2 1M 2>"$T/err" &&
    fail_soft "data_file_raw without data_file accepted"
"$BLOCKPORT" create -q -f qcow2 -o data_file=x.data,compat=0.10 dx.qcow2 1M 2>"$T/err" &&
    fail_soft "data_file with compat=0.10 accepted"
cd - >/dev/null
ok "data files"

check "backing files: -b/-F and -o, size from the backing file, compare"
random_file "$T/base.raw" 4
run "$BLOCKPORT" create -q -f qcow2 -b base.raw -F raw "$T/ov1.qcow2"
expect_field "$T/ov1.qcow2" 'j["virtual-size"]' $((4 * 1024 * 1024))
expect_field "$T/ov1.qcow2" 'j["backing-filename"]' base.raw
expect_field "$T/ov1.qcow2" 'j["backing-filename-format"]' raw
run qemu-img check -q "$T/ov1.qcow2" || fail_soft "check overlay"
run qemu-img compare "$T/base.raw" "$T/ov1.qcow2" || fail_soft "overlay differs from its base"
# A qcow2 base with data, a probed format, and an overlay of the overlay.
run qemu-img create -q -f qcow2 "$T/base.qcow2" 8M
qio "write base" -f qcow2 -c "write -P 0x77 2M 1M" "$T/base.qcow2"
run "$BLOCKPORT" create -q -f qcow2 \
    -o backing_file=base.qcow2,backing_fmt=qcow2,cluster_size=4k "$T/ov2.qcow2" 16M
expect_field "$T/ov2.qcow2" 'j["backing-filename-format"]' qcow2
expect_field "$T/ov2.qcow2" 'j["virtual-size"]' $((16 * 1024 * 1024))
run "$BLOCKPORT" create -q -f qcow2 -b ov2.qcow2 -F qcow2 -o compat=0.10 "$T/ov3.qcow2"
run qemu-img check -q "$T/ov3.qcow2" || fail_soft "check second overlay"
qio "ov3 reads its chain" -f qcow2 -c "read -P 0x77 2M 1M" \
    -c "read -P 0 3M 13M" "$T/ov3.qcow2"
run qemu-img compare -f qcow2 -F qcow2 "$T/base.qcow2" "$T/ov3.qcow2" >/dev/null ||
    fail_soft "qemu-img compare base.qcow2 ov3.qcow2"
ok "backing files"

check "blockport serve serves a created image; writes keep it consistent"
run "$BLOCKPORT" create -q -f qcow2 -o cluster_size=16k,extended_l2=on \
    "$T/served.qcow2" 32M
run "$BLOCKPORT" create -q -f qcow2 -b base.raw -F raw "$T/served-ov.qcow2" 8M
start_server "served=$T/served.qcow2" "ov=$T/served-ov.qcow2"
qio "over NBD" -f raw -c "write -P 0x42 100k 2M" \
    -c "write -P 0x43 30M 1M" -c "read -P 0x42 100k 2M" \
    "$(export_uri served)"
qio "over NBD (overlay)" -f raw -c "write -P 0x44 1M 64k" \
    -c "read -P 0x44 1M 64k" "$(export_uri ov)"
stop_server
run qemu-img check -q "$T/served.qcow2" || fail_soft "check after serving"
run qemu-img check -q "$T/served-ov.qcow2" || fail_soft "check overlay after serving"
qio "served data" -f qcow2 -c "read -P 0x42 100k 2M" \
    -c "read -P 0x43 30M 1M" "$T/served.qcow2"
qio "served overlay data" -f qcow2 -c "read -P 0x44 1M 64k" \
    "$T/served-ov.qcow2"
# Outside the write, the overlay still reads its (random) backing data.
run qemu-img convert -f qcow2 -O raw "$T/served-ov.qcow2" "$T/ov.raw"
cmp -n $((1024 * 1024)) "$T/base.raw" "$T/ov.raw" ||
    fail_soft "overlay: backing data before the write"
cmp -i $((1024 * 1024 + 65536)) -n $((3 * 1024 * 1024 - 65536)) \
    "$T/base.raw" "$T/ov.raw" || fail_soft "overlay: backing data after the write"
ok "served, written and checked"

check "raw images"
run "$BLOCKPORT" create -q -f raw "$T/r.raw" 10M
[[ $(stat -c %s "$T/r.raw") == 10485760 ]] || fail_soft "raw size"
expect_field "$T/r.raw" 'j["format"]' raw
echo garbage >"$T/r2.raw"
run "$BLOCKPORT" create -q -f raw -o preallocation=full "$T/r2.raw" 1000 # overwrite, rounded up
[[ $(stat -c %s "$T/r2.raw") == 1024 ]] || fail_soft "raw size rounding/overwrite"
cmp -s "$T/r2.raw" <(head -c 1024 /dev/zero) || fail_soft "raw full preallocation"
run "$BLOCKPORT" create -q -f raw -o preallocation=falloc "$T/r3.raw" 4M
(($(stat -c %b "$T/r3.raw") * 512 >= 4 * 1024 * 1024)) || fail_soft "raw falloc"
ok "raw"

check "qemu-img's conventions: -f raw by default, sizes as it reads them, -o help"
run "$BLOCKPORT" create -q "$T/d.img" 1M
expect_field "$T/d.img" 'j["format"]' raw
for sz in 1.5G 1MiB 1KB 1b 1 1000 0.1k 1.3 1e3 " 1G" 1G5 8E 0x1000 1.0 1.5b \
    1.5K 010 -1 "" 1.0001k 2.5T; do
    q=$(qemu-img create -q -f qcow2 "$T/q.qcow2" "$sz" 2>/dev/null &&
        info_field "$T/q.qcow2" 'j["virtual-size"]' || echo refused)
    b=$("$BLOCKPORT" create -q -f qcow2 "$T/b.qcow2" "$sz" 2>/dev/null &&
        info_field "$T/b.qcow2" 'j["virtual-size"]' || echo refused)
    rm -f "$T/q.qcow2" "$T/b.qcow2"
    [[ $q == "$b" ]] || fail_soft "size '$sz': qemu-img $q, blockport $b"
done
for fmt in qcow2 raw; do
    "$BLOCKPORT" create -f "$fmt" -o help >"$T/help.$fmt" ||
        fail_soft "-f $fmt -o help: exit $?"
    while read -r key; do
        grep -q "^  $key=" "$T/help.$fmt" || fail_soft "-f $fmt -o help lacks $key"
    done < <(qemu-img create -f "$fmt" -o help |
        grep -oE '^  (size|preallocation|cluster_size|compat|refcount_bits|extended_l2|lazy_refcounts|compression_type|backing_file|backing_fmt)=' | sed -E 's/^ +//; s/=$//')
done
# A size of 0: no L1 table, nothing leaked, the file qemu-img makes.
run "$BLOCKPORT" create -q -f qcow2 "$T/z.qcow2" 0
run qemu-img check -q "$T/z.qcow2" || fail_soft "size 0: qemu-img check"
qemu-img create -q -f qcow2 "$T/qz.qcow2" 0
[[ $(stat -c %s "$T/z.qcow2") == $(stat -c %s "$T/qz.qcow2") ]] ||
    fail_soft "size 0: $(stat -c %s "$T/z.qcow2") bytes, qemu-img $(stat -c %s "$T/qz.qcow2")"
"$BLOCKPORT" serve -f qcow2 "$T/z.qcow2" --run 'nbdinfo --size "$uri"' >"$T/z.out" 2>/dev/null ||
    fail_soft "size 0: serving it failed"
[[ $(cat "$T/z.out") == 0 ]] || fail_soft "size 0 served as $(cat "$T/z.out") bytes"
run qemu-img check -q "$T/z.qcow2" || fail_soft "size 0: check after serving"
ok "-f raw by default; sizes accepted and refused as qemu-img does; -o help; size 0"

check "errors: usage and refused options exit 1 (qemu-img's convention), with a message"
expect_rc() { # WANT CMD...
    local want=$1 rc=0
    shift
    "$@" >"$T/out" 2>"$T/err" || rc=$?
    [[ $rc == "$want" ]] || fail_soft "'$*': exit $rc, expected $want"
    [[ $want == 0 || -s $T/err ]] || fail_soft "'$*': no message"
    grep -qiE 'sanitizer|runtime error' "$T/err" && fail_soft "'$*': sanitizer report"
    return 0
}
expect_rc 1 "$BLOCKPORT" create -f vmdk "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 "$T/e.qcow2"
expect_rc 1 "$BLOCKPORT" create -f qcow2 "$T/e.qcow2" 1Q
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o cluster_size=3k "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o cluster_size=4M "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o refcount_bits=3 "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o nosuch=1 "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f raw -o cluster_size=4k "$T/e.raw" 1M
expect_rc 1 "$BLOCKPORT" create -f raw -o preallocation=metadata "$T/e.raw" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o compat=0.10,lazy_refcounts=on "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o compat=0.10,refcount_bits=8 "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o compat=0.10,compression_type=zstd "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o extended_l2=on,cluster_size=4k "$T/e.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o cluster_size=512 "$T/e.qcow2" 1P
expect_rc 1 "$BLOCKPORT" create -f qcow2 -o preallocation=metadata "$T/e.qcow2" 1P
expect_rc 1 "$BLOCKPORT" create -f qcow2 -b nosuch.qcow2 "$T/e.qcow2" 1M
# A backing file without its format, probed or not, as qemu-img 7.2.
expect_rc 1 "$BLOCKPORT" create -f qcow2 -b base.qcow2 "$T/e.qcow2"
grep -q "e.qcow2: backing file specified without backing format (-F); detected format of base.qcow2: qcow2" "$T/err" ||
    fail "no message naming -F: $(cat "$T/err")"
expect_rc 1 "$BLOCKPORT" create -f qcow2 -u -b base.qcow2 "$T/e.qcow2" 8M
expect_rc 1 "$BLOCKPORT" create -f qcow2 -b e2.qcow2 "$T/e2.qcow2" 1M
expect_rc 1 "$BLOCKPORT" create -f raw "$T/nosuchdir/x.raw" 1M
expect_rc 0 "$BLOCKPORT" create --help
ok "errors"
