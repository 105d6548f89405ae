#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Start-up and command-line error handling: bad invocations exit non-zero
# promptly, write no pid file and leave no socket behind; an existing
# regular file at the --unix path is never destroyed; a stale socket left by
# a killed server is reused; a TCP port in use is reported, not hung on, and
# ends the start even when only one of its addresses (IPv4, IPv6, --metrics)
# is taken.
source "$(dirname "$0")/lib.sh"
require nbdinfo truncate
require_py_nbd

# expect_startup_failure DESC ARGS...: run `blockport serve ARGS...`, which
# must exit non-zero within 10 s; its status is left in STARTUP_RC, its
# output in $T/err.out.
STARTUP_RC=
expect_startup_failure() {
    local desc=$1 rc=0
    shift
    check "startup error: $desc"
    echo "+ $BLOCKPORT serve $*" >&2
    timeout -s KILL 10 "$BLOCKPORT" serve "$@" </dev/null >"$T/err.out" 2>&1 || rc=$?
    sed 's/^/    | /' "$T/err.out"
    [[ $rc -ne 137 ]] || fail "$desc: server still running after 10 s (expected to exit with an error)"
    [[ $rc -ne 0 ]] || fail "$desc: exit status 0, expected an error"
    [[ -s $T/err.out ]] || fail "$desc: no error message printed"
    if grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$T/err.out"; then
        fail_soft "$desc: sanitizer report on the error path (see above)"
    fi
    STARTUP_RC=$rc
    ok "exit status $rc"
}

truncate -s 16M "$T/disk.img"

expect_startup_failure "image file does not exist" \
    --unix "$T/s1" --pid-file "$T/p1" "$T/does-not-exist.img"
[[ ! -e $T/p1 ]] || fail_soft "pid file written although start-up failed"
[[ ! -e $T/s1 ]] || fail_soft "socket $T/s1 left behind after a failed start-up"
ok "no pid file, no socket left"

expect_startup_failure "no image" --unix "$T/s2"
expect_startup_failure "invalid memory: size" --unix "$T/s3" "memory:12xyz"
expect_startup_failure "invalid null: size" --unix "$T/s3" "null:"
expect_startup_failure "duplicate export names" --unix "$T/s3" "a=memory:1M" "a=memory:2M"
expect_startup_failure "unknown option" --no-such-option --unix "$T/s3" "memory:1M"
expect_startup_failure "unsupported --format" --unix "$T/s3" --format qcow2 "$T/disk.img"
[[ ! -e $T/s3 ]] || fail_soft "socket $T/s3 left behind after failed start-ups"
ok "no socket left behind by argument errors"

expect_startup_failure "pid file in a missing directory" \
    --unix "$T/s4" --pid-file "$T/no-such-dir/pid" "memory:1M"
[[ ! -e $T/s4 ]] || fail_soft "socket $T/s4 left behind after the pid file could not be written"
ok "socket check done"

check "startup error: TCP port already in use"
"$PY" - >"$T/port.txt" <<'EOF' &
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(30)
EOF
holder=$!
track_pid $holder
wait_file 5 "$T/port.txt" $holder || true
busy=$(cat "$T/port.txt")
[[ -n $busy ]] || fail "could not reserve a port"
expect_startup_failure "port $busy busy" --bind 127.0.0.1 --port "$busy" --pid-file "$T/p5" "memory:1M"
[[ ! -e $T/p5 ]] || fail_soft "pid file written although bind failed"
kill "$holder"
wait "$holder" 2>/dev/null || true

# hold ADDR: another program listens on ADDR (IPv6 ones v6-only), on a port
# the kernel picks: HELD.
hold() {
    rm -f "$T/held.port"
    "$PY" - "$1" >"$T/held.port" <<'EOF' &
import socket, sys, time
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam)
if fam == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(60)
EOF
    HOLDER=$!
    track_pid "$HOLDER"
    wait_file 5 "$T/held.port" "$HOLDER" || true
    HELD=$(cat "$T/held.port")
    [[ -n $HELD ]] || fail "could not listen on $1"
}
have_ipv6() {
    "$PY" -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null
}

check "every listen address must bind: a port taken on IPv4 or IPv6 alone"
for addr in 0.0.0.0 ::; do
    if ! have_ipv6; then
        echo "  (no IPv6 here: the IPv6 wildcard is left out, nothing to test)"
        break
    fi
    hold "$addr"
    expect_startup_failure "port $HELD taken on $addr only" \
        --port "$HELD" --pid-file "$T/p9" "memory:1M"
    [[ $STARTUP_RC -eq 1 ]] || fail "exit status $STARTUP_RC, expected 1"
    grep -q -- "--port $HELD: cannot listen on .*: Address already in use" "$T/err.out" ||
        fail "no message naming the address"
    ! grep -q "info: ready" "$T/err.out" || fail "ready although $addr is taken"
    [[ ! -e $T/p9 ]] || fail "pid file written although $addr is taken"
    kill "$HOLDER"
    wait "$HOLDER" 2>/dev/null || true
done
ok "exit status 1, nothing served"

check "--metrics on the NBD port: exit status 1, nothing served"
for bind in "" 127.0.0.1; do
    P=$(_free_port)
    expect_startup_failure "--metrics 127.0.0.1:$P, NBD on ${bind:-*}:$P" \
        ${bind:+--bind "$bind"} --port "$P" --metrics "127.0.0.1:$P" \
        --pid-file "$T/p10" "memory:1M"
    [[ $STARTUP_RC -eq 1 ]] || fail "exit status $STARTUP_RC, expected 1"
    grep -q "port $P is the NBD port" "$T/err.out" || fail "no clear message"
    ! grep -q "info: ready" "$T/err.out" || fail "ready with --metrics on the NBD port"
    [[ ! -e $T/p10 ]] || fail "pid file written"
done
ok "refused"

check "without --bind: IPv4 and IPv6 on one port"
P=$(_free_port)
_launch --port "$P" -- "memory:1M"
_wait_started || fail "the server did not start on port $P"
run nbdinfo --size "nbd://127.0.0.1:$P" | grep -qx 1048576 || fail "IPv4"
if have_ipv6; then
    run nbdinfo --size "nbd://[::1]:$P" | grep -qx 1048576 || fail "IPv6"
fi
stop_server
ok "served on both"

check "an existing regular file at the --unix path is not destroyed"
printf 'precious data\n' >"$T/notasocket"
rc=0
timeout -s TERM 5 "$BLOCKPORT" serve --unix "$T/notasocket" --pid-file "$T/p6" "memory:1M" \
    >"$T/err.out" 2>&1 || rc=$?
sed 's/^/    | /' "$T/err.out"
[[ -f $T/notasocket ]] || fail_soft "--unix PATH: existing regular file was removed/replaced"
[[ $(cat "$T/notasocket" 2>/dev/null) == "precious data" ]] || fail_soft "--unix PATH: regular file was modified"
[[ $rc -ne 124 && $rc -ne 0 ]] || fail_soft "--unix PATH on a regular file: server did not refuse to start (status $rc)"
rm -f "$T/notasocket"
ok "regular file check done (status $rc)"

check "a stale socket left by a killed server is reused"
start_server "$T/disk.img"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=
[[ -S $T/sock ]] || echo "  (killed server left no socket; nothing stale to test)"
start_server "$T/disk.img"
sz=$(run nbdinfo --size "$URI")
[[ $sz == $((16 * 1024 * 1024)) ]] || fail "restarted server reports size $sz"
ok "restarted on the stale socket path"
stop_server

check "a valid invocation with (nearly) every option works"
start_server --readonly --workers 3 --max-connections 5 --max-requests 16 \
    --max-inflight-bytes 8M --verbose "main=$T/disk.img" "m=memory:1M" "n=null:1M"
run nbdinfo --list "$URI" >/dev/null || fail "nbdinfo --list failed"
grep -q . "$T/server.log" || fail "--verbose produced no log output"
stop_server

check "--format raw applies to files and still accepts memory:SIZE / null:SIZE"
start_server --format raw "main=$T/disk.img"
run nbdinfo --size "$URI" >/dev/null || fail "nbdinfo failed (--format raw, file)"
stop_server
rc=0
timeout -s TERM 5 "$BLOCKPORT" serve --unix "$T/s8" --pid-file "$T/p8" --format raw \
    "main=$T/disk.img" "m=memory:1M" "n=null:1M" >"$T/err.out" 2>&1 || rc=$?
sed 's/^/    | /' "$T/err.out"
# Status 124: still running when timeout sent SIGTERM = it started fine.
[[ $rc -eq 124 ]] || fail_soft "--format raw with memory:/null: images refused to start (status $rc)"

echo "PASS"
