#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A raw file whose size is not a multiple of 512 (1000 bytes, 1 MiB + 3)
# has the size QEMU gives it, rounded up to 512, side by side with QEMU's
# tools on the same file: info's virtual size (human and JSON), map (the
# rounded tail a zero run past the data), an export's size (nbdinfo),
# convert's copy (the tail read as zeroes), and resize: relative sizes
# count from the rounded size, the same size rounds the file up, a size
# between the file's and the rounded one needs --shrink.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-nbd nbdinfo
cd "$T"

# same WHAT QEMU BLOCKPORT: two outputs must be equal.
same() {
    if [[ $2 == "$3" ]]; then
        ok "$1: $(head -c 120 <<<"$2" | tr '\n' ' ')"
    else
        fail_soft "$1: QEMU '$2', blockport '$3'"
    fi
}

for size in 1000 $((1048576 + 3)); do
    check "a raw file of $size bytes"
    head -c "$size" /dev/urandom >odd.raw
    same "info" "$(qemu-img info -f raw odd.raw | grep '^virtual size')" \
        "$("$BLOCKPORT" info -f raw odd.raw | grep '^virtual size')"
    same "info --json" "$(qemu-img info --output=json -f raw odd.raw | grep -o '"virtual-size": [0-9]*')" \
        "$("$BLOCKPORT" info --json -f raw odd.raw | grep -o '"virtual-size": [0-9]*')"
    same "map --output=json" "$(qemu-img map --output=json -f raw odd.raw)" \
        "$("$BLOCKPORT" map --output=json -f raw odd.raw)"
    same "map" "$(qemu-img map -f raw odd.raw)" "$("$BLOCKPORT" map -f raw odd.raw)"
    same "export size (qemu-nbd -r, serve -r)" \
        "$(nbdinfo --size -- [ qemu-nbd -r -f raw odd.raw ])" \
        "$("$BLOCKPORT" serve -r -f raw odd.raw --run 'nbdinfo --size "$uri"' 2>serve.log)"
    qemu-img convert -f raw -O raw odd.raw q.raw
    "$BLOCKPORT" convert -f raw -O raw odd.raw b.raw
    same "convert's copy (size)" "$(stat -c %s q.raw)" "$(stat -c %s b.raw)"
    cmp q.raw b.raw && ok "convert's copies are equal (the tail reads as zeroes)" ||
        fail_soft "convert's copies differ"
done

check "resize of a 1000-byte raw file"
# resize ARGS...: both tools on their own copy; the exit, output and size.
resize() {
    local qrc=0 brc=0 q b
    head -c 1000 /dev/urandom >q.raw
    cp q.raw b.raw
    q=$(qemu-img resize "${@:1:$#-1}" q.raw -- "${!#}" 2>&1) || qrc=$?
    b=$("$BLOCKPORT" resize "${@:1:$#-1}" b.raw -- "${!#}" 2>&1) || brc=$?
    # Messages carry the tool's name.
    same "resize $*" "$qrc $(stat -c %s q.raw) ${q//qemu-img/TOOL}" \
        "$brc $(stat -c %s b.raw) ${b//blockport resize/TOOL}"
}
resize -f raw +0
resize -f raw +1000
resize -f raw 1001
resize -f raw --shrink 1001
resize -f raw --shrink -24
resize -f raw 2000
