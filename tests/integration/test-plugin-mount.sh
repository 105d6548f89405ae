#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport mount --plugin: an nbdkit plugin (Debian's pattern and memory
# plugins) as a file through FUSE.  The pattern plugin's content equals
# what nbdkit serves; writes to the memory plugin read back; unmounting
# unloads the plugin and leaves no process.
source "$(dirname "$0")/lib.sh"
require_feature fuse plugins
require fusermount3 nbdkit nbdcopy md5sum
[[ -c /dev/fuse ]] || skip "no /dev/fuse"
PLUGINDIR=/usr/lib/x86_64-linux-gnu/nbdkit/plugins
[[ -e $PLUGINDIR/nbdkit-pattern-plugin.so ]] || skip "no nbdkit pattern plugin"
cd "$T"
mkdir mnt
trap 'rc=$?; set +e; fusermount3 -u -z "$T/mnt" 2>/dev/null; (exit $rc); _cleanup' EXIT

mount_plugin() {
    rm -f mount.pid
    "$BLOCKPORT" mount --foreground -P mount.pid "$@" mnt >mount.log 2>&1 &
    track_pid $!
    MPID=$!
    wait_file 5 mount.pid $MPID && return 0
    cat mount.log
    fail "mount $* did not come up"
}

unmount_plugin() {
    fusermount3 -u mnt || fail "fusermount3 -u"
    wait "$MPID" || { cat mount.log; fail "mount exited with $?"; }
    check_sanitizer_reports mount.log
}

check "the pattern plugin mounted equals the pattern plugin under nbdkit"
mount_plugin --plugin pattern size=24M
want=$(nbdkit -U - pattern size=24M --run 'nbdcopy "$uri" -' | md5sum)
got=$(md5sum <mnt/pattern)
[[ $got == "$want" ]] || fail "content differs: $got vs $want"
[[ $(stat -c %s mnt/pattern) == 25165824 ]] || fail "size"
unmount_plugin
ok "same bytes, same size"

check "writes to the memory plugin read back, through FUSE"
mount_plugin --plugin memory size=16M -n disk
head -c 3M /dev/urandom >data
dd if=data of=mnt/disk bs=64k seek=16 conv=notrunc,fsync status=none
cmp <(dd if=mnt/disk bs=64k skip=16 count=48 status=none) data ||
    fail "read back differs"
unmount_plugin
ok "3 MiB written and read back"

check "a plugin that refuses its configuration: an error and a non-zero exit"
if "$BLOCKPORT" mount --foreground --plugin memory size=lots mnt 2>err.txt; then
    fail "the mount succeeded"
fi
grep -q "could not parse size string (lots)" err.txt || { cat err.txt; fail "message"; }
ok "$(head -1 err.txt)"

