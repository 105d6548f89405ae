#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Signal handling: SIGTERM/SIGINT make the server exit 0 (idle, with an idle
# client connected, and under load), the unix socket is removed, the pid
# file holds the server pid, acknowledged writes survive the shutdown.
source "$(dirname "$0")/lib.sh"
require nbdcopy nbdinfo truncate
require_py_nbd

# after_exit_checks: socket gone, pid file sane (removed, or still holding
# the pid of the server that just exited).
after_exit_checks() {
    local oldpid=$1
    if [[ -n $SOCK ]]; then
        [[ ! -e $SOCK ]] || fail "unix socket $SOCK still exists after the server exited"
        ok "unix socket removed"
    fi
    if [[ -e $T/pid ]]; then
        local c
        c=$(tr -d '[:space:]' <"$T/pid")
        [[ $c == "$oldpid" ]] || fail "pid file left behind with '$c' (server pid was $oldpid)"
        ok "pid file left in place with the old pid"
    else
        ok "pid file removed"
    fi
}

########################################################################
check "idle server: pid file holds the server pid; SIGTERM -> exit 0"
truncate -s 64M "$T/disk.img"
start_server "$T/disk.img"
pid=$(tr -d '[:space:]' <"$T/pid")
[[ $pid == "$SERVER_PID" ]] || fail "pid file has '$pid', server pid is $SERVER_PID"
kill -0 "$pid" || fail "pid $pid from the pid file is not running"
ok "pid file = $pid"
run nbdinfo --size "$URI" >/dev/null || fail "nbdinfo failed"
stop_server TERM
after_exit_checks "$pid"

########################################################################
check "idle server: SIGINT -> exit 0"
start_server "$T/disk.img"
pid=$SERVER_PID
stop_server INT
after_exit_checks "$pid"

########################################################################
check "SIGTERM with an idle client connected: server still exits promptly"
start_server "$T/disk.img"
pid=$SERVER_PID
"$PY" - "$URI" >"$T/idle.out" 2>&1 <<'EOF' &
import sys, time, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pread(512, 0)
print("connected", flush=True)
time.sleep(60)
EOF
idle_pid=$!
track_pid $idle_pid
wait_until 10 grep -q connected "$T/idle.out" || { cat "$T/idle.out"; fail "idle client did not connect"; }
SERVER_STOP_TIMEOUT=15 stop_server TERM
after_exit_checks "$pid"
kill "$idle_pid" 2>/dev/null || true
wait "$idle_pid" 2>/dev/null || true

########################################################################
check "SIGTERM with clients stalled mid-handshake: server still exits promptly"
start_server "$T/disk.img"
pid=$SERVER_PID
"$PY" - "$SOCK" >"$T/stall.out" 2>&1 <<'EOF' &
import socket, sys, time
held = []
for i in range(4):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    if i % 2:
        s.recv(18)          # read the greeting, then say nothing
    held.append(s)
print("stalled", flush=True)
time.sleep(60)
EOF
stall_pid=$!
track_pid $stall_pid
wait_until 10 grep -q stalled "$T/stall.out" || { cat "$T/stall.out"; fail "stalling clients did not connect"; }
SERVER_STOP_TIMEOUT=15 stop_server TERM
after_exit_checks "$pid"
kill "$stall_pid" 2>/dev/null || true
wait "$stall_pid" 2>/dev/null || true

########################################################################
SIZE=$((256 * 1024 * 1024))
random_file "$T/src.img" 128
# The shutdown races with the clients: repeat a few times (timing bugs).
for round in 1 2 3; do
check "SIGTERM under load, round $round (nbdcopy x4 connections + acked-write tracker): exit 0 within 20 s, acked writes persisted"
# Nothing of the last round may answer for this one: the writer's output
# is made anew (its redirection may come after the first look at it) and
# only this round's lines of the server's log count.
rm -f "$T/big.img" "$T/acked.txt" "$T/writer.out"
truncate -s $SIZE "$T/big.img"
log_start=$(($(wc -l <"$T/server.log" 2>/dev/null || echo 0) + 1))
start_server --verbose "$T/big.img" "mem=memory:$SIZE"
pid=$SERVER_PID

# Writer: 64 KiB writes with a per-block pattern, 16 in flight, never
# rewriting a block; logs every acknowledged write.
"$PY" - "$URI" "$T/acked.txt" >"$T/writer.out" 2>&1 <<'EOF' &
import sys, nbd
uri, log = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
BS = 65536
nblocks = size // BS
out = open(log, "w", buffering=1)
pending = []
nxt = 0
acked = 0
try:
    while True:
        while len(pending) < 16 and nxt < nblocks:
            pat = (nxt % 251) + 1
            c = h.aio_pwrite(bytes([pat]) * BS, nxt * BS)
            pending.append((c, nxt))
            nxt += 1
        if not pending:
            break
        h.poll(-1)
        still = []
        for c, blk in pending:
            if h.aio_command_completed(c):
                out.write("%d\n" % blk)
                acked += 1
                if acked == 32:
                    print("running", flush=True)
            else:
                still.append((c, blk))
        pending = still
except nbd.Error as e:
    print("writer stopped: %s" % e, flush=True)
print("acked %d blocks, issued %d" % (acked, nxt), flush=True)
EOF
writer_pid=$!
track_pid $writer_pid
timeout 120 nbdcopy --connections=4 --requests=64 "$T/src.img" "$(export_uri mem)" >"$T/copy.out" 2>&1 &
copy_pid=$!
track_pid $copy_pid
round_log() { tail -n "+$log_start" "$T/server.log"; }
copying() { round_log | grep -q "): export 'mem'"; }
wait_until 5 grep -qs running "$T/writer.out" || { cat "$T/writer.out"; fail "writer did not start"; }
# And nbdcopy is copying: it has chosen its export (--verbose logs it).
wait_until 10 copying || { cat "$T/copy.out"; fail "nbdcopy did not connect"; }
server_alive || fail "server died under load"
SERVER_STOP_TIMEOUT=20 stop_server TERM
after_exit_checks "$pid"
wait "$writer_pid" || true
copy_rc=0
wait "$copy_pid" || copy_rc=$?
cat "$T/writer.out"
echo "nbdcopy exit status $copy_rc (either is fine: it may have finished first)"
"$PY" - "$T/acked.txt" "$T/big.img" <<'EOF' || fail "acknowledged writes missing after SIGTERM"
import sys
acked = [int(x) for x in open(sys.argv[1]) if x.strip()]
BS = 65536
bad = []
with open(sys.argv[2], "rb") as f:
    for blk in acked:
        f.seek(blk * BS)
        pat = (blk % 251) + 1
        if f.read(BS) != bytes([pat]) * BS:
            bad.append(blk)
print("  %d acknowledged 64 KiB writes checked in the backing file, %d bad" % (len(acked), len(bad)))
if not acked:
    raise SystemExit("no write was acknowledged: test did not exercise anything")
if bad:
    raise SystemExit("acknowledged blocks missing/wrong: %r" % bad[:10])
EOF
ok "acknowledged writes persisted"
done

########################################################################
check "SIGINT under load (nbdcopy reading) -> exit 0"
start_server --verbose "$T/big.img"
pid=$SERVER_PID
timeout 120 nbdcopy --connections=4 --requests=64 "$URI" "$T/copyout.img" >"$T/copy2.out" 2>&1 &
copy_pid=$!
track_pid $copy_pid
wait_until 10 grep -q "): export ''" "$T/server.log" ||
  { cat "$T/copy2.out"; fail "nbdcopy did not connect"; }
server_alive || fail "server died under read load"
stop_server INT
after_exit_checks "$pid"
wait "$copy_pid" || true

########################################################################
check "TCP server: SIGTERM -> exit 0 and the port is closed"
start_server_tcp "$T/disk.img"
pid=$SERVER_PID
port=$PORT
run nbdinfo --size "$URI" >/dev/null || fail "nbdinfo over TCP failed"
stop_server TERM
"$PY" -c '
import socket, sys
s = socket.socket()
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except ConnectionRefusedError:
    sys.exit(0)
sys.exit("port still accepting connections after exit")
' "$port" || fail "TCP port $port still open after the server exited"
ok "port $port closed"

check "SIGTERM: a request that arrives after it is answered ESHUTDOWN, not executed"
truncate -s 4M "$T/sd.img"
start_server "$T/sd.img"
"$PY" - "$URI" "$SERVER_PID" <<'PYEOF' || fail "ESHUTDOWN not seen"
import errno, os, signal, sys, time, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"a" * 4096, 0)
h.flush()
os.kill(int(sys.argv[2]), signal.SIGTERM)
# Shutdown has begun once a harmless read is refused with ESHUTDOWN.
deadline = time.monotonic() + 10
while True:
    try:
        h.pread(512, 0)
    except nbd.Error as e:
        if e.errno not in (errno.ESHUTDOWN, "ESHUTDOWN"):
            sys.exit("read after SIGTERM: errno %s, want ESHUTDOWN" % e.errno)
        break
    if time.monotonic() > deadline:
        sys.exit("reads still served 10 s after SIGTERM")
    time.sleep(0.01)
try:
    h.pwrite(b"b" * 4096, 0)
    sys.exit("a write after SIGTERM was executed")
except nbd.Error as e:
    if e.errno not in (errno.ESHUTDOWN, "ESHUTDOWN"):  # a name in python3-nbd
        sys.exit("errno %s, want ESHUTDOWN" % e.errno)
h.shutdown()
PYEOF
wait_until 5 _pid_gone "$SERVER_PID" || fail "server still running after its client left"
wait "$SERVER_PID" || fail "server exit status $?"
SERVER_PID=
# The accepted write is there, the refused one is not.
head -c 4096 "$T/sd.img" | cmp -s - <(printf 'a%.0s' {1..4096}) ||
    fail "the accepted write is not there, or the refused one landed"
ok "ESHUTDOWN; the write did not land; the server exited 0 once the client left"

echo "PASS"
