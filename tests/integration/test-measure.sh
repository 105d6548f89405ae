#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport measure against qemu-img measure: the same figures, text and
# JSON, for sizes and for images (raw with holes, qcow2 with bitmaps, zero
# clusters, a backing chain, compressed clusters), and the same exit status
# when the arguments are wrong.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T"
truncate -s 10000000 r.raw
dd if=/dev/urandom of=r.raw bs=1k seek=3 count=5 conv=notrunc status=none
dd if=/dev/urandom of=r.raw bs=1k seek=5000 count=70 conv=notrunc status=none
run qemu-img create -q -f qcow2 m.qcow2 100M
run qemu-io -c "write 0 1M" -c "write 50M 64k" m.qcow2 >/dev/null
run qemu-img bitmap --add -g 128k m.qcow2 b0
run qemu-img bitmap --add m.qcow2 a-longer-bitmap-name
run qemu-img create -q -f qcow2 -b m.qcow2 -F qcow2 ov.qcow2
run qemu-io -c "write -z 0 64k" -c "write 2M 4k" ov.qcow2 >/dev/null
run qemu-img convert -c -O qcow2 r.raw c.qcow2

same() { # same ARGS...: both programs print the same and exit alike
    local want got
    want=$(qemu-img measure "$@" 2>/dev/null; echo "exit $?")
    got=$("$BLOCKPORT" measure "$@" 2>/dev/null; echo "exit $?")
    [[ $want == "$got" ]] ||
        fail "measure $*: qemu-img printed:
$want
blockport printed:
$got"
}

check "sizes, every output option"
for o in "" "-o cluster_size=4096,compat=0.10" "-o extended_l2=on" \
    "-o refcount_bits=64,cluster_size=2M" "-o preallocation=full" \
    "-o preallocation=metadata"; do
    for size in 0 1G 1.5G 100000000; do
        # shellcheck disable=SC2086 # $o is words
        same -O qcow2 $o --size $size
    done
done
same --size 1G
same -O raw --size 1000
same --output=json -O qcow2 --size 5G
ok "the same figures"

check "images: data, bitmaps, zero clusters, backing chains, compression"
for img in r.raw m.qcow2 ov.qcow2 c.qcow2; do
    for o in "" "-o cluster_size=512" "-o compat=0.10" \
        "-o backing_file=$T/m.qcow2" "-o cluster_size=2M,preallocation=falloc"; do
        # shellcheck disable=SC2086
        same -O qcow2 $o "$img"
        # shellcheck disable=SC2086
        same --output=json -O qcow2 $o "$img"
    done
    same -O raw "$img"
done
same -O qcow2 -f raw m.qcow2
"$BLOCKPORT" measure -O qcow2 m.qcow2 | grep -qx "bitmaps size: 327680" ||
    fail "bitmaps size of two bitmaps (2 x (data + table) + directory = 5 clusters)"
ok "the same figures"

check "bad arguments fail as qemu-img's do"
same -O qcow2
same -O qcow2 --size 1G r.raw
same -O vmdk --size 1G
same -O qcow2 --size 100P
same -O qcow2 -o refcount_bits=8,compat=0.10 --size 1G
same -O qcow2 -o cluster_size=3k --size 1G
same -O raw -o cluster_size=4k --size 1G
same -O qcow2 nonexistent.img
same --output=xml --size 1G
ok "exit status 1, nothing on stdout"
