#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# --aio io_uring|threads (issue 16).  By default a served image is read and
# written through io_uring: while a client is connected the server holds an
# io_uring descriptor, and the log says nothing about it.  --aio threads
# holds none.  Where the kernel refuses io_uring (here: the sysctl
# kernel.io_uring_disabled=2, as a locked-down host sets it; seccomp looks
# the same to the program) the server says so in one log line and serves
# the same bytes with worker threads: fio verify and qemu-io patterns on
# raw and qcow2, --cache none and writeback.
source "$(dirname "$0")/lib.sh"
require_feature io_uring
require qemu-img qemu-io fio
require_py_nbd
cd "$T"

LINE="io_uring is not available"

# Whether SERVER_PID holds an io_uring descriptor while a client is
# connected (a ring lives while its connection thread serves).
holds_ring() {
    cat >hold.py <<'PY'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(4096, 0)
fds = "/proc/%s/fd" % sys.argv[2]
rings = [f for f in os.listdir(fds)
         if "io_uring" in os.readlink(os.path.join(fds, f))]
h.shutdown()
print(len(rings))
PY
    local n
    n=$("$PY" hold.py "$URI" "$SERVER_PID") || fail "hold.py failed"
    ((n > 0))
}

# The patterns qemu-io writes and reads back through the server.
io_patterns() {
    run qemu-io -f raw \
        -c "write -P 0x5a 0 64k" -c "write -P 0xa5 1M 1M" \
        -c "write -z 4M 256k" -c "write -P 0x11 5000 3000" \
        -c "read -P 0x5a 0 4096" -c "read -P 0xa5 1M 1M" \
        -c "read -P 0 4M 256k" -c "read -P 0x11 5000 3000" \
        -c flush "$URI" >qio.out || { cat qio.out; fail "qemu-io on $1"; }
    qio_completed qio.out 8 || {
        cat qio.out
        fail "qemu-io patterns on $1"
    }
}

SYSCTL=/proc/sys/kernel/io_uring_disabled
OLD=$(cat "$SYSCTL" 2>/dev/null || echo 0)
restore() { echo "$OLD" >"$SYSCTL"; }
if [[ -w $SYSCTL ]]; then
    trap 'rc=$?; restore; (exit $rc); _cleanup' EXIT
    # A host that disables io_uring has it enabled for this test's start.
    [[ $OLD == 0 ]] || echo 0 >"$SYSCTL"
fi

check "the default is io_uring, --aio threads holds no ring"
qemu-img create -q -f raw img 64M
start_server -f raw --cache none "$T/img"
if grep -q "$LINE" "$T/server.log"; then
    stop_server
    skip "io_uring is not available here (seccomp or the kernel), nor can the test enable it"
fi
holds_ring || fail "default --aio: no io_uring descriptor while serving"
! grep -q "$LINE" "$T/server.log" || fail "the log says io_uring is missing"
stop_server
start_server -f raw --cache none --aio threads "$T/img"
! holds_ring || fail "--aio threads: an io_uring descriptor"
stop_server
ok "io_uring by default; none with --aio threads"

check "the config file's aio key, per export"
qemu-img create -q -f raw img2 64M
cat >aio.conf <<EOF
[export ring]
path = img
cache = none
aio = io_uring
[export pool]
path = img2
cache = none
aio = threads
EOF
start_server --aio threads --config "$T/aio.conf"
URI=$(export_uri ring) holds_ring || fail "aio = io_uring: no io_uring descriptor"
URI=$(export_uri pool) && ! holds_ring || fail "aio = threads: an io_uring descriptor"
stop_server
printf '[export x]\npath = img\naio = native\n' >bad.conf
rc=0
"$BLOCKPORT" serve --check-config --config bad.conf >out.txt 2>err.txt || rc=$?
((rc != 0)) && grep -q "aio: 'native' is not io_uring or threads" err.txt ||
    { cat err.txt; fail "aio = native: rc $rc"; }
ok "aio = io_uring and aio = threads per export; a wrong value named"

[[ -w $SYSCTL ]] || skip "cannot set kernel.io_uring_disabled (not root, or a kernel before 6.6)"
restore # the host's setting again, if the test changed it above

# start_refused ARGS...: start a server while the kernel refuses io_uring.
# Only the start needs the refusal (the program tries io_uring once, when
# it opens the first local image): other tests on this machine see it for
# as short a time as possible.
start_refused() {
    echo 2 >"$SYSCTL"
    start_server "$@"
    restore
}

for fmt in raw qcow2; do
    for cache in none writeback; do
        what="$fmt --cache $cache"
        rm -f img
        qemu-img create -q -f "$fmt" img 64M
        for aio in "" "--aio io_uring"; do
            before=$(grep -c "$LINE" "$T/server.log" 2>/dev/null || true)
            # shellcheck disable=SC2086 # $aio is zero or two words
            start_refused -f "$fmt" --cache "$cache" $aio "$T/img"
            n=$(($(grep -c "$LINE" "$T/server.log" || true) - before))
            ((n == 1)) || fail "$what ${aio:-(default)}: $n log lines about io_uring, expected 1"
            ! holds_ring || fail "$what: an io_uring descriptor although the kernel refuses"
            io_patterns "$what"
            fio_verify "$URI"
            stop_server
        done
        [[ $fmt == raw ]] || run qemu-img check -q img || fail "$what: qemu-img check"
        ok "$what: one log line, then worker threads; patterns and fio verify hold"
    done
done
