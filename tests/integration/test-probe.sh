#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Safe probing.  A raw image whose format was guessed refuses, with EPERM,
# a client's write to its first sector that would make the next probe find
# another format (a qcow2 header naming a host file as its backing file),
# and the next start still serves it raw; --format raw lifts the guard.
# Every format qemu-img knows but blockport does not read is refused by
# name, never served as raw; a directory is refused with one message.
source "$(dirname "$0")/lib.sh"
require qemu-img
require_py_nbd
cd "$T"

echo "host secret" >secret.txt
qemu-img create -q -f qcow2 -b "$T/secret.txt" -F raw evil.qcow2 64M
head -c 65536 evil.qcow2 >evil-header.bin
qemu-img create -q -f raw disk.raw 64M

# nbd_write URI FILE OFFSET: write FILE's bytes at OFFSET; prints "ok" or
# the errno name of the error.
nbd_write() {
    "$PY" - "$@" <<'EOF'
import errno, sys, nbd
uri, path, off = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
try:
    h.pwrite(open(path, "rb").read(), off)
    h.flush()
    print("ok")
except nbd.Error as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
h.shutdown()
EOF
}

check "a probed raw image refuses a qcow2 header in its first sector (EPERM)"
start_server disk.raw
grep -q "probing guessed raw" "$T/server.log" || fail "no warning about the guessed format"
ok "warned: $(grep -o 'probing guessed raw.*' "$T/server.log" | head -c 100)"
got=$(nbd_write "$URI" evil-header.bin 0)
[[ $got == EPERM ]] || fail "a whole qcow2 header: $got, expected EPERM"
ok "whole header refused: EPERM"
printf 'QFI\xfb' >magic.bin
printf '\0\0\0\3' >version.bin
got=$(nbd_write "$URI" magic.bin 0)
[[ $got == ok ]] || fail "the magic alone (version 0: not a format) was refused: $got"
got=$(nbd_write "$URI" version.bin 4)
[[ $got == EPERM ]] || fail "the version completing the header: $got, expected EPERM"
ok "piecewise: the magic alone is allowed, the version completing it refused"
printf 'ordinary data' >data.bin
got=$(nbd_write "$URI" data.bin 0)
[[ $got == ok ]] || fail "an ordinary write to sector 0: $got"
got=$(nbd_write "$URI" evil-header.bin 1048576)
[[ $got == ok ]] || fail "a qcow2 header past the first sector: $got"
ok "other writes to sector 0, and headers elsewhere, are allowed"
stop_server

check "the next start still serves raw"
"$BLOCKPORT" info disk.raw | grep -q "file format: raw" || fail "info does not say raw"
start_server disk.raw
size=$("$PY" -c "
import nbd
h = nbd.NBD(); h.connect_uri('$URI'); print(h.get_size()); h.shutdown()")
[[ $size == $((64 << 20)) ]] || fail "size $size: not the raw image"
"$PY" -c "
import nbd
h = nbd.NBD(); h.connect_uri('$URI')
assert h.pread(13, 0) == b'ordinary data', h.pread(13, 0)
h.shutdown()" || fail "contents"
stop_server
ok "raw, 64 MiB, with the allowed writes"

check "--format raw lifts the guard"
: >"$T/server.log"
start_server --format raw disk.raw
grep -q "probing guessed raw" "$T/server.log" && fail "warned although the format was given"
got=$(nbd_write "$URI" evil-header.bin 0)
[[ $got == ok ]] || fail "--format raw: $got"
stop_server
ok "written with --format raw"

check "formats blockport does not read are refused by name"
for fmt in vmdk vhdx vdi vpc qed qcow parallels; do
    qemu-img create -q -f "$fmt" "img.$fmt" 16M 2>/dev/null || {
        fail_soft "qemu-img cannot create $fmt"
        continue
    }
    [[ $fmt == qcow ]] && want="qcow image: not supported" || want="$fmt image: not supported"
    for cmd in "serve -u $T/x.sock" info map "convert -O raw" "mount --foreground"; do
        [[ $cmd != mount* ]] || has_feature fuse || continue
        rc=0
        extra=()
        [[ $cmd == convert* ]] && extra=(out.raw)
        [[ $cmd == mount* ]] && extra=("$T/mnt.file")
        # shellcheck disable=SC2086
        "$BLOCKPORT" $cmd "img.$fmt" "${extra[@]}" >out.txt 2>err.txt </dev/null || rc=$?
        if [[ $rc -ne 1 ]] || ! grep -q "$want; convert it with qemu-img convert" err.txt; then
            cat err.txt
            fail_soft "$fmt with ${cmd%% *}: exit $rc"
        fi
    done
    ok "$fmt: refused by serve, info, map, convert$(has_feature fuse && echo " and mount")"
done
# A LUKS header, by its magic (qemu-img needs a secret to create one).
qemu-img create -q -f raw luks.img 16M
printf 'LUKS\xba\xbe\0\1' | dd of=luks.img conv=notrunc status=none
rc=0
"$BLOCKPORT" serve -u "$T/x.sock" luks.img 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "luks image: not supported" err.txt || { cat err.txt; fail "luks: exit $rc"; }
ok "luks refused"
# An explicit --format raw serves the bytes, as QEMU does.
start_server --format raw --readonly img.vmdk
stop_server
ok "--format raw serves a vmdk file's bytes when asked"

check "a directory is refused everywhere with one message"
mkdir adir
for cmd in "serve -u $T/x.sock" info map check "convert -O raw"; do
    rc=0
    extra=()
    [[ $cmd == convert* ]] && extra=(out.raw)
    # shellcheck disable=SC2086
    "$BLOCKPORT" $cmd adir "${extra[@]}" >out.txt 2>err.txt </dev/null || rc=$?
    [[ $rc -eq 1 ]] && grep -q "adir: not a regular file or block device" err.txt || {
        cat err.txt
        fail_soft "directory with ${cmd%% *}: exit $rc"
    }
done
ok "serve, info, map, check, convert: not a regular file or block device"
