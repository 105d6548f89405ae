#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit-blockport-plugin.so under nbdkit: qcow2 images written through
# nbdkit, checked as test-qcow2-write.sh checks blockport serve: after the
# workload `qemu-img check` finds no corruption and no leak, and `qemu-img
# compare` finds the image equal to a raw shadow that got the same writes.
# Also: multi-conn and block status advertised, parallel fio writes with
# verification over four connections, readonly=true, a bad file name.
source "$(dirname "$0")/lib.sh"
require_feature plugins
require nbdkit nbdinfo qemu-img qemu-io fio
PLUGIN=${BLOCKPORT_NBDKIT_PLUGIN:-$(dirname "$BLOCKPORT")/nbdkit-blockport-plugin.so}
[[ -f $PLUGIN ]] || skip "no $PLUGIN"
cd "$T"

# A sanitizer build of the plugin needs its runtime loaded first in nbdkit.
NBDKIT_ENV=()
if [[ $(nm -D --undefined-only "$PLUGIN") == *__asan_init* ]]; then
    NBDKIT_ENV=(env "LD_PRELOAD=$(gcc -print-file-name=libasan.so)"
                ASAN_OPTIONS=detect_leaks=0)
fi

NBDKIT_PID=
start_nbdkit() {
    rm -f nbdkit.pid nbdkit.sock
    "${NBDKIT_ENV[@]}" nbdkit -f -U "$T/nbdkit.sock" -P "$T/nbdkit.pid" \
        "$PLUGIN" "$@" 2>>nbdkit.log &
    NBDKIT_PID=$!
    track_pid "$NBDKIT_PID"
    wait_file 10 nbdkit.pid "$NBDKIT_PID" || { cat nbdkit.log; fail "nbdkit $* did not start"; }
    URI="nbd+unix:///?socket=$T/nbdkit.sock"
}
stop_nbdkit() {
    kill -TERM "$NBDKIT_PID"
    wait "$NBDKIT_PID" || { cat nbdkit.log; fail "nbdkit exited with $?"; }
    check_sanitizer_reports nbdkit.log
}

CMDS=(-c 'write -P 0x11 1000 4k' -c 'write -P 0x22 100k 200k'
      -c 'write -P 0x33 10M 1M' -c 'write -z 12M 64k' -c 'write -z 13M 1000'
      -c 'write -P 0x44 30M 2M' -c 'write -P 0x55 5000 3000'
      -c 'write -z -u 24M 1M' -c 'write -P 0x66 24M 4k')

workload() {
    local img=$1 shadow=$2 rc=0
    start_nbdkit "file=$img"
    run qemu-io -f raw "${CMDS[@]}" "$URI" >/dev/null || fail "qemu-io on $img"
    qemu-io -f raw "${CMDS[@]}" "$shadow" >/dev/null
    run qemu-img compare -f raw -F raw "$shadow" "$URI" ||
        fail "$img differs from its shadow while served"
    stop_nbdkit
    qemu-img check "$img" >check.txt 2>&1 || rc=$?
    [[ $rc -eq 0 ]] || { cat check.txt; fail "qemu-img check $img: exit $rc"; }
    run qemu-img compare -F raw "$img" "$shadow" ||
        fail "$img differs from its shadow after shutdown"
}

check "qcow2 images written through nbdkit: qemu-io workload, check, compare"
for opts in cluster_size=4096,refcount_bits=1 cluster_size=65536 \
            extended_l2=on compat=0.10; do
    rm -f e.qcow2 shadow.raw
    qemu-img create -f qcow2 -o "$opts" e.qcow2 40M >/dev/null
    truncate -s 40M shadow.raw
    workload e.qcow2 shadow.raw
    ok "$opts"
done

check "an overlay over a raw backing file"
random_file base.raw 32
cp base.raw shadow.raw
truncate -s 40M shadow.raw
qemu-img create -f qcow2 -b base.raw -F raw ov.qcow2 40M >/dev/null
workload ov.qcow2 shadow.raw
ok "overlay"

check "multi-conn and block status: nbdinfo sees them, the map shows holes"
rm -f m.qcow2
qemu-img create -f qcow2 m.qcow2 64M >/dev/null
qemu-io -f qcow2 -c 'write -P 7 1M 1M' m.qcow2 >/dev/null
start_nbdkit "file=$T/m.qcow2"
nbdinfo "$URI" >info.txt
grep -q "can_multi_conn: true" info.txt || { cat info.txt; fail "no multi-conn"; }
grep -q "base:allocation" info.txt || { cat info.txt; fail "no block status"; }
nbdinfo --map "$URI" >map.txt
grep -Eq "^ *1048576 +1048576 +0 +data" map.txt || { cat map.txt; fail "map"; }
grep -Eq "^ *0 +1048576 +3 +hole,zero" map.txt || { cat map.txt; fail "map"; }
ok "$(tr -s ' ' <map.txt | head -3 | paste -sd';')"

check "fio verify over four connections at once"
fio_verify "$URI"
stop_nbdkit
qemu-img check m.qcow2 >check.txt 2>&1 || { cat check.txt; fail "check after fio"; }
ok "verified, and the image checks clean"

check "readonly=true: writes refused, reads served"
start_nbdkit "file=$T/m.qcow2" readonly=true
nbdinfo "$URI" | grep -q "is_read_only: true" || fail "not read-only"
if qemu-io -f raw -c 'write 0 4k' "$URI" >w.txt 2>&1; then fail "write allowed"; fi
run qemu-io -r -f raw -c 'read 1M 1M' "$URI" >/dev/null || fail "read"
stop_nbdkit
ok "read-only"

check "a file that does not exist: nbdkit exits with the plugin's error"
# With ASan preloaded into nbdkit, its exit during configuration hangs in
# libp11-kit's destructor (freelocale); the plain build checks this.
if [[ ${#NBDKIT_ENV[@]} -gt 0 ]]; then
    skip_case "under the sanitizer: the plain build checks it"
    exit 0
fi
if nbdkit -f -U "$T/x.sock" "$PLUGIN" file=nonexistent.qcow2 2>err.txt; then
    fail "nbdkit started"
fi
grep -q "nonexistent" err.txt || { cat err.txt; fail "no message"; }
ok "$(head -1 err.txt)"
