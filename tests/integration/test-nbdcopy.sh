#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdcopy against blockport: file -> export, export -> file, export ->
# export, single and multi-connection (--connections=4 --requests=64).
source "$(dirname "$0")/lib.sh"
require nbdcopy cmp truncate

MIB=128
SIZE=$((MIB * 1024 * 1024))

# Source: random data with zero runs of different sizes, so nbdcopy's
# zero detection / write-zeroes path is exercised as well.
random_file "$T/src.img" $MIB
dd if=/dev/zero of="$T/src.img" bs=1M seek=10 count=6 conv=notrunc status=none
dd if=/dev/zero of="$T/src.img" bs=4K seek=$((70 * 256 + 3)) count=5 conv=notrunc status=none
fallocate --punch-hole --offset $((100 << 20)) --length $((4 << 20)) "$T/src.img" 2>/dev/null || true

# Destination raw file starts with non-zero junk so skipped zero writes show.
head -c $SIZE /dev/zero | tr '\0' '\125' >"$T/disk.img"

start_server "$T/disk.img" "mem=memory:$SIZE" "mem2=memory:$SIZE"
MEM=$(export_uri mem)
MEM2=$(export_uri mem2)

copy_and_cmp() { # copy_and_cmp DESC OUTFILE nbdcopy-args...
    local desc=$1 out=$2
    shift 2
    check "nbdcopy $desc"
    rm -f "$out"
    run nbdcopy "$@" || fail "nbdcopy $desc failed"
    cmp "$T/src.img" "$out" || fail "nbdcopy $desc: data differs"
    ok "cmp equal"
}

check "nbdcopy file -> raw file export (1 connection)"
run nbdcopy --connections=1 "$T/src.img" "$URI" || fail "nbdcopy file -> export failed"
ok "copied"
copy_and_cmp "raw file export -> file (1 connection)" "$T/out1.img" \
    --connections=1 "$URI" "$T/out1.img"

check "nbdcopy file -> memory export (--connections=4 --requests=64)"
run nbdcopy --connections=4 --requests=64 "$T/src.img" "$MEM" || fail "nbdcopy -> mem failed"
ok "copied"
copy_and_cmp "memory export -> file (--connections=4 --requests=64)" "$T/out2.img" \
    --connections=4 --requests=64 "$MEM" "$T/out2.img"

check "nbdcopy export -> export on the same server (mem -> mem2, 4 connections)"
run nbdcopy --connections=4 --requests=64 --flush "$MEM" "$MEM2" || fail "nbdcopy mem -> mem2 failed"
ok "copied"
copy_and_cmp "mem2 -> file (default settings)" "$T/out3.img" "$MEM2" "$T/out3.img"

check "nbdcopy export -> stdout pipe"
run nbdcopy --connections=2 "$MEM2" - | cmp - "$T/src.img" || fail "nbdcopy to stdout differs"
ok "stream equal"

check "nbdcopy with 64 KiB requests (--request-size=65536 --requests=64) -> export"
# Overwrite the raw export with the same data using many small requests,
# after scribbling over part of it, to get lots of concurrent commands.
run nbdcopy --connections=4 --requests=64 --request-size=65536 "$T/out1.img" "$URI" ||
    fail "nbdcopy small requests failed"
copy_and_cmp "raw export -> file after small-request copy" "$T/out4.img" \
    --connections=4 "$URI" "$T/out4.img"

stop_server

check "raw backing file equals source after server exit"
cmp "$T/src.img" "$T/disk.img" || fail "backing file differs from source"
ok "backing file equal"

check "odd-sized raw file (5 MiB + 12345 bytes): nbdcopy both ways, last byte readable"
# Exported in whole 512-byte sectors, as qemu-nbd exports it: the tail past
# the file's end reads as zeroes.
ODD=$((5 * 1024 * 1024 + 12345))
ROUNDED=$(((ODD + 511) / 512 * 512))
head -c $ODD "$T/src.img" >"$T/odd-src.img"
head -c $ODD /dev/zero >"$T/odd.img"
start_server "$T/odd.img"
sz=$(run nbdinfo --size "$URI")
[[ $sz == "$ROUNDED" ]] || fail "odd-sized export reports size $sz, expected $ROUNDED"
run nbdcopy "$T/odd-src.img" "$URI" || fail "nbdcopy -> odd export failed"
run nbdcopy --connections=2 "$URI" "$T/odd-out.img" || fail "nbdcopy odd export -> file failed"
cmp -n $ODD "$T/odd-src.img" "$T/odd-out.img" || fail "odd-sized export round trip differs"
cmp -i $ODD:0 -n $((ROUNDED - ODD)) "$T/odd-out.img" /dev/zero ||
    fail "the tail past the file's end does not read as zeroes"
if command -v nbdsh >/dev/null; then
    run nbdsh -u "$URI" -c "assert h.pread(1, $ODD - 1) == open('$T/odd-src.img','rb').read()[-1:]" ||
        fail "last byte of the odd-sized export wrong"
else
    skip_case "no nbdsh: the last byte of the odd-sized export is not read alone"
fi
stop_server
cmp "$T/odd-src.img" "$T/odd.img" || fail "odd-sized backing file differs"
ok "odd-sized export"

echo "PASS"
