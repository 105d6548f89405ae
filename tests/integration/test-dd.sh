#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport dd against qemu-img dd: for the same operands both make images
# of the same size and content (qemu-img compare, and the virtual size),
# or both fail and make nothing; qemu-img's quirks included (COUNT counts
# from the input's start, a SKIP past the end makes an empty image, sizes
# are rounded up to whole sectors).
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T"
head -c 1000000 /dev/urandom >in.raw
run qemu-img create -q -f qcow2 in.qcow2 8M
run qemu-io -c "write -P 0xab 0 1M" -c "write -z 2M 64k" -c "write -P 0xcd 3M 5k" \
    in.qcow2 >/dev/null

same() { # same OPERANDS...: the same image, or the same failure
    rm -f want.img got.img
    local qrc=0 brc=0
    qemu-img dd "$@" of=want.img >/dev/null 2>&1 || qrc=$?
    "$BLOCKPORT" dd "$@" of=got.img >/dev/null 2>"$T/dd.err" || brc=$?
    [[ $qrc == "$brc" ]] ||
        fail "dd $*: qemu-img exit $qrc, blockport exit $brc: $(cat "$T/dd.err")"
    if [[ ! -e want.img ]]; then
        [[ ! -e got.img ]] || fail "dd $*: blockport made an image, qemu-img none"
        return
    fi
    run qemu-img compare -q want.img got.img || fail "dd $*: other data"
    local w g
    w=$(qemu-img info --output=json want.img | grep -E '"(virtual-size|format)"')
    g=$(qemu-img info --output=json got.img | grep -E '"(virtual-size|format)"')
    [[ $w == "$g" ]] || fail "dd $*: qemu-img made
$w
blockport made
$g"
}

check "the same images for the same operands"
same if=in.raw
same if=in.raw bs=4k count=10 skip=3
same if=in.raw bs=1000 count=3
same if=in.raw bs=1k count=1000000
same if=in.raw bs=64k count=1k
same -O qcow2 if=in.raw bs=512 skip=10
same -O qcow2 if=in.raw bs=1000 count=3
same if=in.qcow2 bs=1M count=4 skip=1
same -f raw if=in.qcow2 bs=64k count=2
same -O qcow2 if=in.qcow2 bs=64k skip=16
ok "qemu-img compare: identical, same size and format"

check "a skip past the end: an empty image and a warning, as dd(1)"
same if=in.raw bs=1M skip=5
grep -q "cannot skip" "$T/dd.err" || fail "no warning: $(cat "$T/dd.err")"
ok "empty image, exit 0"

check "bad operands fail as qemu-img's do, and make nothing"
same if=in.raw bs=0
same if=in.raw bs=1x
same if=in.raw count=-1
same if=in.raw foo=1
same if=nonexistent.img
same bs=512
ok "exit 1, no image"
