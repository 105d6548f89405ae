#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport amend against qemu-img amend on twin qcow2 images: the same
# exit status and messages, then qemu-img check clean on blockport's image,
# qemu-img compare equal and the same format-specific fields of
# `qemu-img info --output=json`.  Where QEMU 7.2 damages its own image (a
# downgrade with bitmaps leaks them; one with zero clusters shared with a
# snapshot overwrites the snapshot's data), blockport's is checked alone.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io jq

cd "$T"

# twin OPTS...: q.qcow2 (qemu-img's) and b.qcow2 (blockport's), 16 MiB
# with data, zero clusters and a hole.
twin() {
    rm -f q.qcow2 b.qcow2
    run qemu-img create -q -f qcow2 "$@" q.qcow2 16M
    run qemu-io -c "write -P 1 0 1M" -c "write -z 1M 1M" -c "write -P 2 4M 64k" \
        -c "write -z -u 8M 64k" q.qcow2 >/dev/null
    cp q.qcow2 b.qcow2
}

fields() { qemu-img info --output=json "$1" | jq -S '."format-specific"'; }

# amend_both ARGS...: the same outcome on both twins.
amend_both() {
    local want got
    # (its encryption options left out: blockport opens no encrypted image)
    want=$(qemu-img amend "$@" q.qcow2 2>&1 | grep -v "^  encrypt\."
        echo "exit ${PIPESTATUS[0]}")
    got=$("$BLOCKPORT" amend "$@" b.qcow2 2>&1; echo "exit $?")
    got=${got//blockport amend: /qemu-img: }
    got=${got//blockport rebase/qemu-img rebase}
    got=${got//"Try 'blockport amend --help'."/"Try 'qemu-img --help' for more information"}
    [[ $want == "$got" ]] || fail "amend $*: qemu-img said:
$want
blockport said:
$got"
}

# same_result [NOCHECK]: blockport's image is clean, reads as qemu-img's
# and has its format-specific fields.
same_result() {
    qemu-img check -q b.qcow2 || fail "qemu-img check of blockport's image"
    [[ ${1:-} == nocheck ]] || qemu-img check -q q.qcow2 ||
        fail "qemu-img check of qemu-img's image"
    qemu-img compare -q q.qcow2 b.qcow2 || fail "the twins differ"
    [[ $(fields q.qcow2) == "$(fields b.qcow2)" ]] ||
        fail "format-specific fields differ: $(fields q.qcow2) / $(fields b.qcow2)"
}

check "compat and lazy_refcounts"
twin
amend_both -o compat=0.10
same_result
amend_both -o compat=1.1
same_result
amend_both -o lazy_refcounts=on
same_result
amend_both -o lazy_refcounts=off,size=32M
same_result
amend_both -o compat=0.10 -o lazy_refcounts=on # refused after nothing
same_result
twin -o compat=0.10
amend_both -o compat=1.1,lazy_refcounts=on
same_result
"$BLOCKPORT" amend -p -o lazy_refcounts=off b.qcow2 | grep -q "(100.00/100%)" ||
    fail "-p: no progress"
[[ -z $("$BLOCKPORT" amend -p -q -o lazy_refcounts=off b.qcow2) ]] ||
    fail "-q: progress"
ok "upgrade, downgrade with zero clusters, lazy refcounts, size"

check "a dirty image with lazy refcounts, made clean"
twin -o lazy_refcounts=on
(qemu-io -c "write -P 5 2M 1M" -c abort q.qcow2 >/dev/null) 2>/dev/null || true
cp q.qcow2 b.qcow2
"$BLOCKPORT" amend -o lazy_refcounts=off b.qcow2 || fail "lazy_refcounts=off"
qemu-img amend -o lazy_refcounts=off q.qcow2 2>/dev/null
same_result
ok "repaired, then lazy refcounts off"

check "refcount_bits, each width"
twin
run qemu-img snapshot -c s1 q.qcow2
run qemu-io -c "write -P 3 0 64k" q.qcow2 >/dev/null
# (qemu-img takes seconds for each width: one, and a refusal)
for bits in 1 64; do
    cp q.qcow2 b.qcow2
    cp q.qcow2 q2.qcow2
    want=$(qemu-img amend -o refcount_bits=$bits q2.qcow2 2>&1; echo "exit $?")
    got=$("$BLOCKPORT" amend -o refcount_bits=$bits b.qcow2 2>&1; echo "exit $?")
    [[ $want == "${got//blockport amend: /qemu-img: }" ]] ||
        fail "refcount_bits=$bits: qemu-img: $want / blockport: $got"
    mv q2.qcow2 q.qcow2
    same_result
done
for bits in 2 8 32 16; do # blockport's alone: each width, and back
    "$BLOCKPORT" amend -o refcount_bits=$bits b.qcow2 || fail "to $bits bits"
    qemu-img check -q b.qcow2 || fail "check at $bits bits"
    qemu-img compare -q q.qcow2 b.qcow2 || fail "data at $bits bits"
    [[ $(fields b.qcow2 | jq -r '.data."refcount-bits"') == "$bits" ]] ||
        fail "refcount_bits=$bits: $(fields b.qcow2)"
done
ok "the same refcounts at 64 bits, 1 refused (a refcount of 2), 2-32 bits"

check "downgrades QEMU damages: blockport's image alone"
twin
run qemu-img bitmap --add b.qcow2 bm
"$BLOCKPORT" amend -o compat=0.10 b.qcow2 || fail "downgrade with a bitmap"
qemu-img check -q b.qcow2 || fail "bitmap clusters leaked"
run qemu-img create -q -f qcow2 base.qcow2 16M
run qemu-io -c "write -P 7 0 16M" base.qcow2 >/dev/null
run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 b.qcow2
run qemu-io -c "write -P 2 4M 64k" -c "write -z -u 8M 64k" b.qcow2 >/dev/null
run qemu-img snapshot -c s1 b.qcow2
run qemu-io -c "write -z 4M 64k" b.qcow2 >/dev/null
"$BLOCKPORT" amend -o compat=0.10 b.qcow2 || fail "downgrade with a snapshot"
qemu-img check -q b.qcow2 || fail "check after the downgrade"
qemu-io -c "read -P 0 4M 64k" -c "read -P 0 8M 64k" -c "read -P 7 9M 64k" \
    b.qcow2 | grep -q "Pattern verification failed" && fail "active image"
run qemu-img snapshot -a s1 b.qcow2
qemu-io -c "read -P 2 4M 64k" b.qcow2 | grep -q "Pattern verification failed" &&
    fail "the snapshot lost its data"
ok "bitmaps freed, snapshot data kept"

check "refusals, with qemu-img's messages and exit status"
twin
amend_both -o compat=0.9
amend_both -o cluster_size=4k
amend_both -o extended_l2=on
amend_both -o preallocation=full
amend_both -o compression_type=zstd
amend_both -o encryption=on
amend_both -o encrypt.new-secret=x
amend_both -o foo=1
amend_both -o lazy_refcounts=maybe
amend_both -o refcount_bits=3
amend_both -o refcount_bits=abc
amend_both -o size=1000
amend_both -o size=abc
amend_both -o data_file=x.raw
amend_both -o data_file_raw=on
amend_both -o backing_file=x.qcow2
amend_both -o refcount_bits=8 -o compat=0.10
amend_both -o help
amend_both -o "?"
amend_both
amend_both -o compat=1.1 extra
amend_both -t bogus -o compat=1.1
same_result
twin -o refcount_bits=8
amend_both -o compat=0.10
twin -o compat=0.10
amend_both -o refcount_bits=8
twin -o extended_l2=on
amend_both -o compat=0.10
twin -o compression_type=zstd
run qemu-io -c "write -c -P 3 12M 64k" q.qcow2 >/dev/null
cp q.qcow2 b.qcow2
amend_both -o compat=0.10
rm -f q.qcow2 b.qcow2 q.raw b.raw
run qemu-img create -q -f qcow2 -o data_file=q.raw q.qcow2 16M
run qemu-img create -q -f qcow2 -o data_file=q.raw b.qcow2 16M
amend_both -o compat=0.10
amend_both -o data_file_raw=off
same_result
run qemu-img create -q -f raw r.raw 1M
want=$(qemu-img amend -f raw -o compat=1.1 r.raw 2>&1; echo "exit $?")
got=$("$BLOCKPORT" amend -f raw -o compat=1.1 r.raw 2>&1; echo "exit $?")
[[ $want == "${got//blockport amend: /qemu-img: }" ]] || fail "raw: $got"
want=$(qemu-img amend -f raw -o help 2>&1; echo "exit $?")
got=$("$BLOCKPORT" amend -f raw -o help 2>&1; echo "exit $?")
[[ $want == "${got//blockport amend: /qemu-img: }" ]] || fail "raw help: $got"
ok "each refused alike"

check "the image's write lock"
twin
qemu-io -c "sleep 60000" q.qcow2 >/dev/null 2>qemu-io.err &
holder=$!
track_pid "$holder"
wait_until 10 write_locked q.qcow2 ||
    fail "qemu-io did not lock the image: $(cat qemu-io.err)"
rc=0
"$BLOCKPORT" amend -o compat=0.10 q.qcow2 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "lock" err || fail "a busy image: exit $rc, $(cat err)"
kill "$holder"
wait "$holder" 2>/dev/null || true
[[ $(fields q.qcow2 | jq -r .data.compat) == 1.1 ]] || fail "a busy image changed"
ok "a busy image is refused, unchanged"
