#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport serve --plugin: Debian's nbdkit plugins, unmodified, served by
# blockport.  Each plugin's content (nbdcopy checksum) and extents
# (nbdinfo --map) equal what the same plugin gives under nbdkit: memory
# (after the same writes), data, pattern, sparse-random, null, zero,
# partitioning and file; convert --plugin copies one into an image.  A
# plugin that refuses its configuration, or a plugin that does not exist,
# gives a clear error and a non-zero exit.
source "$(dirname "$0")/lib.sh"
require_feature plugins
require nbdkit nbdinfo nbdcopy qemu-io qemu-img md5sum
PLUGINDIR=/usr/lib/x86_64-linux-gnu/nbdkit/plugins
for p in memory data pattern sparse-random null zero partitioning file; do
    [[ -e $PLUGINDIR/nbdkit-$p-plugin.so ]] || skip "no nbdkit $p plugin"
done
cd "$T"

WRITES=(-c 'write -P 0x11 1000 4k' -c 'write -P 0x22 100k 200k'
        -c 'write -P 0x33 10M 1M' -c 'write -z 10M 64k' -c 'write -P 0x44 30M 2M')

# same_as_nbdkit NAME [qemu-io args...] -- PLUGIN PARAMS...: serve with
# blockport and with nbdkit, apply the same writes (if any) to both, then
# compare content and extents.
same_as_nbdkit() {
    local name=$1 io=()
    shift
    while [[ $1 != -- ]]; do io+=("$1"); shift; done
    shift
    start_server --plugin "$@"
    if [[ ${#io[@]} -gt 0 ]]; then
        run qemu-io -f raw "${io[@]}" "$URI" >/dev/null || fail "$name: writes"
    fi
    nbdcopy "$URI" - | md5sum >bp.sum
    nbdinfo --map "$URI" >bp.map
    stop_server
    {
        echo 'set -e'
        if [[ ${#io[@]} -gt 0 ]]; then
            echo "qemu-io -f raw $(printf '%q ' "${io[@]}") \"\$1\" >/dev/null"
        fi
        echo 'nbdcopy "$1" - | md5sum >kit.sum'
        echo 'nbdinfo --map "$1" >kit.map'
    } >kit.sh
    nbdkit -U - "$@" --run 'bash kit.sh "$uri"' || fail "$name under nbdkit"
    cmp -s bp.sum kit.sum || fail "$name: content differs from nbdkit's"
    diff -u kit.map bp.map || fail "$name: extents differ from nbdkit's"
    ok "$name: $(wc -l <bp.map) extents, content and map equal"
}

check "Debian's plugins: content and extents as under nbdkit"
same_as_nbdkit memory "${WRITES[@]}" -- memory size=64M
same_as_nbdkit data -- data 'data=1 2 3 @1048576 0xff @4194304 ( 0x55 0xAA )*2048' size=8M
same_as_nbdkit pattern -- pattern size=64M
same_as_nbdkit sparse-random -- sparse-random size=64M seed=42
same_as_nbdkit null -- null size=64M
same_as_nbdkit zero -- zero
truncate -s 8M pa.img pb.img
random_file pa.img 1
truncate -s 8M pa.img
same_as_nbdkit partitioning -- partitioning file="$T/pa.img" file="$T/pb.img"
truncate -s 32M f.raw
dd if=/dev/urandom of=f.raw bs=1M seek=3 count=2 conv=notrunc status=none
same_as_nbdkit file -- file file="$T/f.raw"
cp f.raw f2.raw
same_as_nbdkit "file, written" "${WRITES[@]}" -- file file="$T/f2.raw"

check "the plugin's own parameter syntax: the file plugin's magic key"
start_server --plugin file "$T/f.raw" -r
[[ $(nbdinfo --size "$URI") == 33554432 ]] || fail "size of the bare file"
nbdinfo "$URI" | grep -q "is_read_only: true" || fail "-r"
stop_server
ok "file PATH (bare), read-only"

# refused MESSAGE ARGS...: blockport serve ARGS must exit 1 saying MESSAGE.
refused() {
    local msg=$1 rc=0
    shift
    "$BLOCKPORT" serve -u "$T/r.sock" "$@" >err.txt 2>&1 || rc=$?
    [[ $rc -ne 0 ]] || fail "serve $* started"
    grep -qF -- "$msg" err.txt || { cat err.txt; fail "serve $*: no '$msg'"; }
    check_sanitizer_reports err.txt
    ok "exit $rc: $(grep -F -- "$msg" err.txt | head -1)"
}

check "refused configurations: clear messages, non-zero exit"
refused "could not parse size string (lots)" --plugin memory size=lots
refused "configuration refused: size=lots" --plugin memory size=lots
refused "nbdkit plugin 'nosuch'" --plugin nosuch
refused "cannot load nbdkit plugin" --plugin "$T/f.raw"
refused "unknown parameter" --plugin pattern size=1M colour=blue
refused "-D pattern.nosuch=1" -D pattern.nosuch=1 --plugin pattern size=1M

check "convert --plugin: a plugin's disk copied into raw and qcow2 images"
run "$BLOCKPORT" convert -O raw --plugin pattern size=8M "$T/cv.raw" ||
    fail "convert to raw"
nbdkit -U - pattern size=8M --run 'nbdcopy "$uri" -' | cmp - cv.raw ||
    fail "raw copy differs from the plugin's content"
run "$BLOCKPORT" convert -O qcow2 --plugin data 'data=1 2 3 @1048576 0xff' \
    size=4M "$T/cv.qcow2" || fail "convert to qcow2"
[[ $(qemu-img map cv.qcow2 | tail -n +2 | wc -l) -eq 2 ]] ||
    { qemu-img map cv.qcow2; fail "only the data plugin's two extents hold data"; }
nbdkit -U - data 'data=1 2 3 @1048576 0xff' size=4M \
    --run 'qemu-img compare -q -F raw cv.qcow2 "$uri"' || fail "qcow2 copy differs"
ok "pattern to raw, data to qcow2 (its holes left unallocated)"
