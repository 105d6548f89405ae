#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# qemu-img against blockport: info, convert in both directions, compare,
# over nbd+unix:// and nbd:// (TCP).
source "$(dirname "$0")/lib.sh"
require qemu-img cmp truncate

MIB=64
SIZE=$((MIB * 1024 * 1024))

# Source image: random data with an explicitly zero-filled region and a
# sparse hole, so zero detection / write-zeroes paths are exercised too.
random_file "$T/src.img" $MIB
dd if=/dev/zero of="$T/src.img" bs=1M seek=8 count=4 conv=notrunc status=none
fallocate --punch-hole --offset $((20 << 20)) --length $((3 << 20)) "$T/src.img" 2>/dev/null ||
    dd if=/dev/zero of="$T/src.img" bs=1M seek=20 count=3 conv=notrunc status=none
# A few odd bytes right after the hole so an off-by-one shows up.
printf '\xde\xad\xbe\xef' | dd of="$T/src.img" bs=1 seek=$((23 << 20)) conv=notrunc status=none

json_field() { # json_field FILE KEY
    "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

########################################################################
# The server gets its own copy so that local qemu-img opens of src.img never
# contend for image locks with the server.
cp "$T/src.img" "$T/srv.img"

check "qemu-img info over nbd+unix reports the export size"
start_server --format raw "$T/srv.img"
run qemu-img info --output=json -f raw "$URI" >"$T/info.json"
cat "$T/info.json"
vs=$(json_field "$T/info.json" virtual-size)
[[ $vs == "$SIZE" ]] || fail "qemu-img info virtual-size $vs, expected $SIZE"
ok "virtual-size $vs"

check "qemu-img convert nbd -> raw file is byte-identical"
run qemu-img convert -p -f raw -O raw "$URI" "$T/out.img" >/dev/null
cmp "$T/src.img" "$T/out.img" || fail "converted image differs from source"
ok "cmp equal"

check "qemu-img compare nbd vs file: equal -> exit 0"
run qemu-img compare -f raw -F raw "$URI" "$T/src.img" ||
    fail "qemu-img compare reported a difference (or error) for identical data"
ok "identical"

check "qemu-img compare nbd vs modified file: differs -> exit 1"
cp "$T/src.img" "$T/bad.img"
printf '\x00\x01' | dd of="$T/bad.img" bs=1 seek=$((SIZE - 4097)) conv=notrunc status=none
cmp -s "$T/src.img" "$T/bad.img" && fail "test bug: bad.img not modified"
rc=0
run qemu-img compare -f raw -F raw "$URI" "$T/bad.img" || rc=$?
[[ $rc -eq 1 ]] || fail "qemu-img compare on differing images exited $rc, expected 1"
ok "difference detected"
stop_server

########################################################################
check "qemu-img convert -n raw file -> nbd (raw file export), then compare"
truncate -s $SIZE "$T/dst.img"
start_server "$T/dst.img"
run qemu-img convert -n -f raw -O raw "$T/src.img" "$URI"
run qemu-img compare -f raw -F raw "$URI" "$T/src.img" ||
    fail "export differs from source after convert -n"
ok "compare over nbd equal"
stop_server
cmp "$T/src.img" "$T/dst.img" || fail "backing file differs from source after server exit"
ok "backing file equal after SIGTERM"

########################################################################
check "qemu-img convert -n into a pre-filled file export writes zeroes correctly"
# Destination initially full of non-zero data: the zero/hole regions of the
# source must be zeroed, not skipped.
head -c $SIZE /dev/zero | tr '\0' '\377' >"$T/dst2.img"
start_server "$T/dst2.img"
run qemu-img convert -n -f raw -O raw "$T/src.img" "$URI"
run qemu-img compare -f raw -F raw "$URI" "$T/src.img" ||
    fail "export differs from source (zero regions not written?)"
stop_server
cmp "$T/src.img" "$T/dst2.img" || fail "pre-filled backing file differs from source"
ok "pre-filled destination equal"

########################################################################
check "TCP (nbd://127.0.0.1:PORT): info, convert both ways, compare"
start_server_tcp "$T/srv.img" "copy=memory:$SIZE"
echo "URI=$URI"
run qemu-img info --output=json -f raw "$URI" >"$T/info2.json"
vs=$(json_field "$T/info2.json" virtual-size)
[[ $vs == "$SIZE" ]] || fail "TCP: virtual-size $vs, expected $SIZE"
ok "TCP virtual-size $vs"
run qemu-img convert -f raw -O raw "$URI" "$T/out2.img"
cmp "$T/src.img" "$T/out2.img" || fail "TCP: converted image differs"
ok "TCP nbd -> file equal"
run qemu-img compare -f raw -F raw "$URI" "$T/src.img" || fail "TCP: compare failed"
ok "TCP compare equal"
COPY_URI=$(export_uri copy)
run qemu-img convert -n -f raw -O raw "$T/src.img" "$COPY_URI"
run qemu-img compare -f raw -F raw "$COPY_URI" "$T/src.img" ||
    fail "TCP: memory export differs after convert -n"
ok "TCP file -> memory export equal"
run qemu-img compare -f raw -F raw "$COPY_URI" "$URI" ||
    fail "TCP: compare export vs export failed"
ok "TCP export vs export equal"
stop_server

echo "PASS"
