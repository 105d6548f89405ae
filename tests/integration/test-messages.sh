#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The messages of common mistakes name the option or the file that caused
# them (issue 31): a bad --bind, --unix or vhost --socket, before any image is opened; a
# --metrics port equal to the NBD port, in one line; a locked image, with
# -U/--force-share suggested to readers only; an unknown size suffix; a
# missing backing file, with the image that refers to it.
source "$(dirname "$0")/lib.sh"
require qemu-img

cd "$T"

# expect_msg WHAT STATUS PATTERN CMD...: CMD exits STATUS, and its stderr
# matches PATTERN (grep -E).
expect_msg() {
    local what=$1 status=$2 pattern=$3 rc=0
    shift 3
    timeout 30 "$@" >out.txt 2>err.txt </dev/null || rc=$?
    [[ $rc -eq $status ]] || { cat err.txt; fail "$what: exit $rc, expected $status"; }
    grep -qE -- "$pattern" err.txt || { cat err.txt; fail "$what: no '$pattern'"; }
    ok "$what"
}

check "addresses are checked before any image is opened"
expect_msg "--bind" 1 '^blockport: error: --bind 999\.1\.1\.1: ' \
    "$BLOCKPORT" serve --bind 999.1.1.1 missing.qcow2
expect_msg "--unix" 1 '^blockport: error: --unix nodir/s\.sock: no such directory$' \
    "$BLOCKPORT" serve --unix nodir/s.sock missing.qcow2
! grep -q missing.qcow2 err.txt || fail "the image was opened before the socket"
if has_feature vhost; then
    expect_msg "vhost --socket" 1 '^blockport: error: --socket nodir/v\.sock: no such directory$' \
        "$BLOCKPORT" vhost --socket nodir/v.sock missing.qcow2
    ! grep -q missing.qcow2 err.txt || fail "vhost opened the image before the socket"
    # The image's name once, as serve and mount say it.
    expect_msg "vhost, a missing image" 1 '^blockport: error: missing\.qcow2: No such file or directory$' \
        "$BLOCKPORT" vhost --socket v.sock missing.qcow2
fi
ok "the image was not opened"

check "--metrics on the NBD port: one line"
P=$(_free_port)
expect_msg "--metrics" 1 "^blockport: error: --metrics 127\.0\.0\.1:$P: port $P is the NBD port" \
    "$BLOCKPORT" serve --port "$P" --metrics "127.0.0.1:$P" memory:1M
[[ $(wc -l <err.txt) -eq 1 ]] || { cat err.txt; fail "more than one line"; }
ok "one line"

check "an unknown size suffix is named"
for src in memory null; do
    expect_msg "$src:12Q" 1 "$src: invalid size '12Q': unknown suffix 'Q' \(use k, M, G, T, P or E\)" \
        "$BLOCKPORT" serve -u "$T/s.sock" "$src:12Q"
done
# And in a size option: what is wrong, then what would be right.
expect_msg "--l2-cache-size 12Q" 1 "^blockport serve: --l2-cache-size 12Q: unknown suffix 'Q' \(use k, M, G, T, P or E\); expected a size of at least 64K$" \
    "$BLOCKPORT" serve -u "$T/s.sock" --l2-cache-size 12Q null:1M

check "a missing backing file is named with the image that refers to it"
qemu-img create -q -f qcow2 base.qcow2 1M
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
rm base.qcow2
expect_msg "map" 1 'qcow2 top\.qcow2: cannot open backing file base\.qcow2: No such file or directory$' \
    "$BLOCKPORT" map top.qcow2

check "a locked image: -U/--force-share is suggested to readers only"
qemu-img create -q -f qcow2 disk.qcow2 1M
start_server disk.qcow2
hint='Failed to get shared "write" lock: is another process using the image\? \(-U/--force-share reads it all the same\)'
expect_msg "info" 1 "disk\.qcow2: $hint" "$BLOCKPORT" info disk.qcow2
expect_msg "serve -r" 1 "disk\.qcow2: $hint" "$BLOCKPORT" serve -r -u "$T/x.sock" disk.qcow2
expect_msg "convert source" 1 "disk\.qcow2: $hint" \
    "$BLOCKPORT" convert -O raw disk.qcow2 copy.raw
expect_msg "serve (writable)" 1 'disk\.qcow2: Failed to get "write" lock: is another process using the image\?$' \
    "$BLOCKPORT" serve -u "$T/x.sock" disk.qcow2
stop_server
