#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport compare against qemu-img compare on the same pairs of images:
# the same result line and exit status for identical images, a difference
# (reported by its sector), sizes that differ with zeroes or data past the
# end, strict mode (size, allocation, the whole block status: a sparse
# raw file against a preallocated one or zero clusters), raw against qcow2, a qcow2 whose
# data is in its backing file, an NBD URI, -q, and an image that cannot be
# opened (exit 2).
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

# same_as_qemu ARGS...: both tools print the same and exit the same.
same_as_qemu() {
    local want got qrc=0 brc=0
    want=$(qemu-img compare "$@" 2>/dev/null) || qrc=$?
    got=$("$BLOCKPORT" compare "$@" 2>err) || brc=$?
    [[ $got == "$want" && $brc == "$qrc" ]] || {
        cat err
        fail "compare $*: blockport said '$got' ($brc), qemu-img '$want' ($qrc)"
    }
    ok "compare $*: ${got:-(nothing)} ($brc)"
}

random_file base.raw 4
cp base.raw same.raw
qemu-img convert -q -f raw -O qcow2 base.raw base.qcow2
same_as_qemu base.raw same.raw
same_as_qemu -f raw -F qcow2 base.raw base.qcow2
same_as_qemu -s -f raw -F qcow2 base.raw base.qcow2

cp base.raw diff.raw
printf 'Z' | dd of=diff.raw bs=1 seek=1234567 conv=notrunc status=none
same_as_qemu base.raw diff.raw
same_as_qemu -q base.raw diff.raw
qemu-img convert -q -f raw -O qcow2 diff.raw diff.qcow2
same_as_qemu -F qcow2 base.raw diff.qcow2

# Sizes: zeroes past the end are the same unless -s; data is not.
cp base.raw big.raw
truncate -s 6M big.raw
same_as_qemu base.raw big.raw
same_as_qemu big.raw base.raw
same_as_qemu -s base.raw big.raw
printf 'Q' | dd of=big.raw bs=1 seek=$((5 << 20)) conv=notrunc status=none
same_as_qemu base.raw big.raw

# Allocation: an unallocated qcow2 and a raw file of zeroes.
truncate -s 4M zero.raw
qemu-img create -q -f qcow2 empty.qcow2 4M
same_as_qemu zero.raw empty.qcow2
same_as_qemu -s zero.raw empty.qcow2
qemu-img create -q -f qcow2 zeroed.qcow2 4M
qemu-io -f qcow2 -c "write -z 0 1M" -c "write -P 0 1M 1M" zeroed.qcow2 >/dev/null
same_as_qemu -s empty.qcow2 zeroed.qcow2
same_as_qemu empty.qcow2 zeroed.qcow2

# Strict mode compares the whole block status, as qemu-img's does: equal
# data stored differently differs (a sparse raw file against a
# preallocated one, zero clusters against a dense raw file), and so does
# a run that reaches the end against one that does not (a hole to the end
# against a hole followed by written zeroes); the first such offset is
# reported.
truncate -s 4M sparse.raw
qemu-img create -q -f raw -o preallocation=full full.raw 4M
qemu-img create -q -f raw -o preallocation=falloc falloc.raw 4M
same_as_qemu -s -f raw -F raw sparse.raw full.raw
same_as_qemu -s -f raw -F raw full.raw falloc.raw
same_as_qemu -f raw -F raw sparse.raw full.raw
qemu-img create -q -f qcow2 zc.qcow2 4M
qemu-io -f qcow2 -c "write -z 0 4M" zc.qcow2 >/dev/null
same_as_qemu -s -f qcow2 -F raw zc.qcow2 full.raw
same_as_qemu -s -f qcow2 -F raw zc.qcow2 sparse.raw
cp sparse.raw midzero.raw
dd if=/dev/zero of=midzero.raw bs=64k count=8 seek=16 conv=notrunc status=none
same_as_qemu -s -f raw -F raw sparse.raw midzero.raw
# Holes at the same places, then data in one where the other has a hole.
cp sparse.raw mid1.raw
dd if=base.raw of=mid1.raw bs=1M count=1 seek=1 conv=notrunc status=none
cp mid1.raw mid2.raw
dd if=/dev/zero of=mid2.raw bs=1M count=1 seek=2 conv=notrunc status=none
same_as_qemu -s -f raw -F raw mid1.raw mid2.raw
cp --sparse=always mid1.raw mid1-copy.raw
same_as_qemu -s -f raw -F raw mid1.raw mid1-copy.raw
# QEMU's qcow2 answers within one L2 table (2 MiB with 4 KiB clusters): its
# first run of data then stops short of the end where the raw one does not.
qemu-img convert -q -f raw -O qcow2 -o cluster_size=4k base.raw c4k.qcow2
same_as_qemu -s -f qcow2 -F raw c4k.qcow2 base.raw
same_as_qemu -s -f qcow2 -F qcow2 c4k.qcow2 c4k.qcow2

# A backing chain: the overlay's data is its backing file's.
qemu-img create -q -f qcow2 -b base.raw -F raw over.qcow2 4M
qemu-io -f qcow2 -c "write -P 0x33 2M 4k" over.qcow2 >/dev/null
same_as_qemu -f raw -F qcow2 base.raw over.qcow2
cp base.raw patched.raw
qemu-io -f raw -c "write -P 0x33 2M 4k" patched.raw >/dev/null
same_as_qemu -f raw -F qcow2 patched.raw over.qcow2

# An image that cannot be opened: exit 2 and the reason on stderr.
same_as_qemu base.raw missing.raw
grep -q "missing.raw" err || fail "no reason for the missing image"

# An NBD URI on either side.
start_server -f raw -r "$T/diff.raw"
rc=0
out=$("$BLOCKPORT" compare -F raw base.raw "$URI") || rc=$?
[[ $out == "Content mismatch at offset 1234432!" && $rc == 1 ]] ||
    fail "against $URI: '$out' ($rc)"
rc=0
out=$("$BLOCKPORT" compare -f raw -F raw diff.raw "$URI") || rc=$?
[[ $out == "Images are identical." && $rc == 0 ]] ||
    fail "against $URI: '$out' ($rc)"
stop_server
ok "an NBD URI compares like a file"
