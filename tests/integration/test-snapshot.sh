#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport snapshot against qemu-img snapshot: twin images (data,
# compressed and preallocated zero clusters; a backing chain; extended L2)
# get the same operations, one from each program; both stay clean
# (qemu-img check), hold the same data (qemu-img compare) and list the
# same snapshots; a snapshot keeps its data while blockport serves the
# image and a client writes it; and the refusals match.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T"

# Q and B: the twins.  both ARGS...: qemu-img snapshot ARGS q.qcow2 and
# blockport snapshot ARGS b.qcow2, with the same stderr (prefix aside) and
# exit status.
both() {
    local want got
    want=$(qemu-img snapshot "$@" q.qcow2 2>&1 | grep -v '^Try '
        echo "exit ${PIPESTATUS[0]}")
    got=$("$BLOCKPORT" snapshot "$@" b.qcow2 2>&1 | grep -v '^Try '
        echo "exit ${PIPESTATUS[0]}")
    want=${want//q.qcow2/IMG}
    got=${got//b.qcow2/IMG}
    [[ ${got//blockport snapshot: /qemu-img: } == "$want" ]] ||
        fail "snapshot $*: qemu-img printed:
$want
blockport printed:
$got"
}

# Both clean (no leak, no corruption), equal, and listing the same IDs and
# names.
same() {
    run qemu-img check -q q.qcow2 || fail "$*: qemu-img check q.qcow2"
    run qemu-img check -q b.qcow2 || fail "$*: qemu-img check b.qcow2"
    run qemu-img compare -q q.qcow2 b.qcow2 || fail "$*: the twins differ"
    cmp -s <(qemu-img snapshot -l q.qcow2 | cut -c1-50) \
        <(qemu-img snapshot -l b.qcow2 | cut -c1-50) ||
        fail "$*: the twins list different snapshots"
}

# Each program lists either twin byte for byte alike.
lists_alike() {
    local img
    for img in q.qcow2 b.qcow2; do
        cmp -s <(qemu-img snapshot -l "$img") \
            <("$BLOCKPORT" snapshot -l "$img") ||
            fail "$*: snapshot -l $img differs from qemu-img's"
    done
}

# The data of snapshot $2 of image $1 is the raw file $3.
holds() {
    run qemu-img convert -O raw -l "$2" "$1" got.raw
    cmp -s got.raw "$3" || fail "snapshot $2 of $1 changed"
}

# Write through blockport serve (the writer's copy-on-write of clusters a
# snapshot shares) and, on the other twin, through qemu-io.
write_both() {
    run qemu-io -c "$1" q.qcow2 >/dev/null || fail "qemu-io $1"
    start_server -f qcow2 b.qcow2
    run qemu-io -f raw -c "$1" -c flush "$URI" >/dev/null || fail "nbd $1"
    stop_server
}

scenario() { # scenario IMAGE: the operations on twins of IMAGE
    cp "$1" q.qcow2
    cp "$1" b.qcow2
    both -l
    same "no snapshots"
    both -c s1
    same "create"
    lists_alike "one snapshot"
    run qemu-img convert -O raw q.qcow2 s1.raw
    write_both "write -P 0x33 60k 72k"
    holds b.qcow2 s1 s1.raw
    write_both "write -z 1M 64k"
    holds b.qcow2 s1 s1.raw
    same "writes after a snapshot"
    both -c s2
    both -c s1 # QEMU takes a name twice: ID 3
    lists_alike "three snapshots"
    run qemu-img convert -O raw q.qcow2 s2.raw
    write_both "write -P 0x44 0 200k"
    same "two more snapshots, a write"
    both -a s1 # the first named s1: ID 1
    run qemu-img compare -q b.qcow2 s1.raw || fail "apply s1: not its data"
    same "apply"
    both -d s1
    same "delete"
    lists_alike "two snapshots left"
    both -a 2 # by ID
    run qemu-img compare -q b.qcow2 s2.raw || fail "apply 2: not its data"
    both -d s2
    both -d s1
    same "delete all"
    both -l
}

check "data, compressed and preallocated zero clusters"
run qemu-img create -q -f qcow2 -o cluster_size=4k plain.qcow2 4M
run qemu-io -c "write -P 1 0 256k" -c "write -c -P 2 1M 64k" \
    -c "write -c -P 3 1088k 4k" -c "write -z 64k 16k" plain.qcow2 >/dev/null
qemu-img check plain.qcow2 | grep -q "compressed clusters" ||
    fail "no compressed clusters to snapshot"
scenario plain.qcow2
ok "the twins stay equal and clean"

check "an overlay of a backing file, extended L2"
run qemu-img create -q -f qcow2 base.qcow2 4M
run qemu-io -c "write -P 5 0 4M" base.qcow2 >/dev/null
run qemu-img create -q -f qcow2 -o extended_l2=on -b "$T/base.qcow2" \
    -F qcow2 over.qcow2
run qemu-io -c "write -P 6 8k 8k" -c "write -P 7 3M 100k" over.qcow2 >/dev/null
scenario over.qcow2
ok "the twins stay equal and clean"

check "apply restores the size the snapshot had"
cp plain.qcow2 q.qcow2
cp plain.qcow2 b.qcow2
both -c small
run qemu-img resize -q q.qcow2 6M
run qemu-img resize -q b.qcow2 6M
both -a small
same "apply after a resize"

check "refusals"
cp plain.qcow2 q.qcow2
cp plain.qcow2 b.qcow2
both -a nope
both -d nope
both -d 1 # -d finds names only
both -U -c x
both -l -c x
both -c x -d y
qemu-img create -q -f raw r.img 1M
for op in "-l" "-c x" "-a x" "-d x"; do
    # shellcheck disable=SC2086 # $op is words
    want=$(qemu-img snapshot $op r.img 2>&1 | grep -v -e WARNING -e '^  '
        echo "exit ${PIPESTATUS[0]}")
    # shellcheck disable=SC2086
    got=$("$BLOCKPORT" snapshot $op r.img 2>&1 | grep -v warning
        echo "exit ${PIPESTATUS[0]}")
    [[ ${got//blockport snapshot: /qemu-img: } == "$want" ]] ||
        fail "raw $op: qemu-img: $want; blockport: $got"
done
run qemu-img create -q -f qcow2 -o data_file=d.raw q.qcow2 1M
run qemu-img create -q -f qcow2 -o data_file=d2.raw b.qcow2 1M
both -c x
ok "the same messages and exit statuses"

check "convert -l: a snapshot's data, named as qemu-img names it"
run qemu-img create -q -f qcow2 -b "$T/base.qcow2" -F qcow2 c.qcow2 4M
run qemu-io -c "write -P 8 0 1M" c.qcow2 >/dev/null
run qemu-img snapshot -c s c.qcow2
run qemu-img snapshot -c 7 c.qcow2
run qemu-io -c "write -P 9 512k 1M" c.qcow2 >/dev/null
for l in s 1 7 snapshot.name=s snapshot.id=2 snapshot.id=1,snapshot.name=s \
    nope snapshot.id=2,snapshot.name=s snapshot.foo=1; do
    rm -f want.raw got.raw
    want=$(qemu-img convert -O raw -l "$l" c.qcow2 want.raw 2>&1
        echo "exit $?")
    got=$("$BLOCKPORT" convert -O raw -l "$l" c.qcow2 got.raw 2>&1
        echo "exit $?")
    [[ ${got//blockport convert: /qemu-img: } == "$want" ]] ||
        fail "convert -l $l: qemu-img: $want; blockport: $got"
    [[ ! -e want.raw ]] || cmp -s want.raw got.raw ||
        fail "convert -l $l: not the snapshot's data"
done
want=$(qemu-img convert -O raw -l s r.img o.raw 2>&1; echo "exit $?")
got=$("$BLOCKPORT" convert -O raw -l s r.img o.raw 2>&1; echo "exit $?")
[[ ${got//blockport convert: /qemu-img: } == "$want" ]] ||
    fail "convert -l of a raw image: qemu-img: $want; blockport: $got"
ok "the same data, messages and exit statuses"
