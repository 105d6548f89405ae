#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# An NBD URI as a source when its server misbehaves: multi-conn, requests
# failing within --nbd-timeout while the server is gone, reconnection when
# it returns, writes sent again after a loss (the replay log), requests in
# flight at the loss, a server that hangs, and a prompt close.  A front `blockport serve` fronts
# a backend on back.sock; requests go through the front.
source "$(dirname "$0")/lib.sh"
require ss nbdkit
require_py_nbd
cd "$T"
TMO=3 # --nbd-timeout of the front server
BACK="nbd+unix:///?socket=$T/back.sock"
BACK_PID=

wait_pid_file() { # FILE PID
  wait_file 10 "$1" "$2" && return 0
  _pid_alive "$2" || fail "backend died at start: $(tail -3 "$T/back.log")"
  fail "backend did not start"
}

start_back() { # SIZE: a blockport memory export
  rm -f "$T/back.pid"
  "$BLOCKPORT" serve --unix "$T/back.sock" --pid-file "$T/back.pid" \
    "memory:$1" 2>>"$T/back.log" &
  BACK_PID=$!
  track_pid $BACK_PID
  wait_pid_file "$T/back.pid" $BACK_PID
}

start_nbdkit() { # ARGS...: nbdkit serving a 64M memory disk on back.sock
  rm -f "$T/back.pid" "$T/back.sock"
  nbdkit -f -U "$T/back.sock" -P "$T/back.pid" "$@" 2>>"$T/back.log" &
  BACK_PID=$!
  track_pid $BACK_PID
  wait_pid_file "$T/back.pid" $BACK_PID
}

kill_back() {
  kill -KILL $BACK_PID
  wait $BACK_PID 2>/dev/null || true
}

back_conns() { ss -xp | grep -c "pid=$BACK_PID," || true; }

# One request through the front on a fresh connection.  Prints
# "ok SECONDS [BYTE]" (BYTE: the value of every byte read) or
# "error SECONDS MESSAGE".
cat >op.py <<'EOF'
import nbd, sys, time
uri, op, *a = sys.argv[1:]
h = nbd.NBD()
h.connect_uri(uri)
t = time.monotonic()
try:
    extra = ""
    if op == "read":
        buf = h.pread(int(a[1]), int(a[0]))
        extra = " %d" % buf[0] if buf == bytes([buf[0]]) * len(buf) else " mixed"
    elif op == "write":
        h.pwrite(bytes([int(a[2])]) * int(a[1]), int(a[0]))
    elif op == "flush":
        h.flush()
    print("ok %.2f%s" % (time.monotonic() - t, extra))
except nbd.Error as e:
    print("error %.2f %s" % (time.monotonic() - t, e))
EOF
op() { timeout 60 "$PY" op.py "$URI" "$@"; }

expect_ok() { # WHAT OP ARGS...: succeeds (BYTE is checked by the caller)
  local what=$1 r
  shift
  r=$(op "$@") || fail "$what: no answer within 60 s"
  [[ $r == ok* ]] || fail "$what: $r"
  echo "$r"
}

expect_error_within() { # MAX-SECONDS WHAT OP ARGS...
  local max=$1 what=$2 r
  shift 2
  r=$(op "$@") || fail "$what: no answer within 60 s"
  [[ $r == error* ]] || fail "$what: expected an error, got: $r"
  awk -v t="$(cut -d' ' -f2 <<<"$r")" -v m="$max" 'BEGIN{exit !(t <= m)}' ||
    fail "$what: failed only after ${r#error } s (limit $max)"
  echo "$r"
}

check "multi-conn: 4 connections to a multi-conn backend, fio verify on them"
start_back 64M
start_server --nbd-timeout $TMO "$BACK"
[ "$(back_conns)" -eq 4 ] || fail "$(back_conns) connections to the backend"
fio_verify "$URI"
ok "4 connections; fio verify with 4 jobs"

check "--nbd-connections 2: two connections"
"$BLOCKPORT" serve --unix "$T/two.sock" --nbd-connections 2 "$BACK" \
  2>two.log &
two=$!
track_pid $two
wait_until 5 test -S "$T/two.sock" || fail "the second front did not start"
[ "$(back_conns)" -eq 6 ] || fail "$(back_conns) connections, expected 4 + 2"
kill $two
wait $two || fail "the second front exited with $?"
ok "two more"

check "a killed backend: requests fail within the timeout, the front lives"
expect_ok "write before the loss" write 0 4096 7 >/dev/null
expect_ok "flush before the loss" flush >/dev/null
kill_back
r=$(expect_error_within $((TMO + 2)) "read with no backend" read 0 4096)
echo "  $r"
expect_error_within $((TMO + 3)) "write with no backend" write 0 4096 1 \
  >/dev/null
server_alive || fail "the front server died"
grep -q "connection [0-3] lost" "$T/server.log" || fail "no log of the loss"
ok "failed in time"

check "the backend back on the same socket: requests succeed again"
start_back 64M
r=$(expect_ok "read after the restart" read 0 4096)
echo "  $r"
[[ $r == *" 0" ]] || fail "a new memory backend should read zeroes: $r"
expect_ok "write after the restart" write 8192 4096 3 >/dev/null
r=$(expect_ok "read back" read 8192 4096)
[[ $r == *" 3" ]] || fail "read back $r"
grep -q "re-established" "$T/server.log" || fail "no log of the reconnection"
ok "reconnected"

check "unflushed writes are sent again to a restarted backend"
expect_ok "unflushed write" write 0 4096 5 >/dev/null
kill_back
start_back 64M
expect_ok "the flush after the loss" flush >/dev/null
r=$(expect_ok "read back" read 0 4096)
[[ $r == *" 5" ]] || fail "the write was not sent again: $r"
r=$(expect_ok "read back" read 8192 4096)
[[ $r == *" 3" ]] || fail "the earlier write was not sent again: $r"
grep -q "sent 2 acknowledged writes" "$T/server.log" || fail "no log of the replay"
ok "replayed; nothing lost"

check "an export whose size changed is refused until it is back"
kill_back
start_back 32M
expect_error_within $((TMO + 3)) "read from a resized export" read 0 4096 \
  >/dev/null
grep -q "the export came back as another (33554432 bytes" "$T/server.log" ||
  fail "no log of the size change"
kill_back
mark=$(wc -l <"$T/server.log")
start_back 64M
# Requests fail at once until a connection finds the right export again.
wait_until 10 eval 'tail -n +$((mark + 1)) "$T/server.log" | grep re-established >/dev/null' ||
  fail "no reconnection to the right export"
expect_ok "read once the size is right" read 0 4096 >/dev/null
ok "refused, then accepted"

# in_backend OP: the backend (nbdkit -v) has logged OP since line $mark of
# back.log: the request is in flight there, held by the delay filter.
in_backend() { tail -n +$((mark + 1)) "$T/back.log" | grep "delay: $1 " >/dev/null; }

check "in flight at the loss: a write and a read are sent again"
# nbdkit from here on, with the front restarted: a backend with other
# export flags is another export, which the front refuses.
stop_server
kill_back
start_nbdkit -v --filter=delay memory 64M rdelay=3 wdelay=3
start_server --nbd-timeout $TMO "$BACK"
expect_ok "flush on the slow backend" flush >/dev/null
mark=$(wc -l <"$T/back.log")
op write 0 4096 9 >w.out &
wpid=$!
wait_until 10 in_backend pwrite || fail "the write never reached the backend"
kill_back
start_nbdkit memory 64M # the same flags, without the delay
wait $wpid || true
r=$(cat w.out)
[[ $r == ok* ]] || fail "a write in flight at the loss was not sent again: $r"
r=$(expect_ok "read back" read 0 4096)
[[ $r == *" 9" ]] || fail "read back $r"
# Flushed, so that nothing is sent again to the slow backend next.
expect_ok "flush" flush >/dev/null
kill_back
start_nbdkit -v --filter=delay memory 64M rdelay=3 wdelay=3
expect_ok "flush on the slow backend" flush >/dev/null
mark=$(wc -l <"$T/back.log")
op read 0 4096 >r.out &
rpid=$!
wait_until 10 in_backend pread || fail "the read never reached the backend"
kill_back
start_nbdkit memory 64M
wait $rpid || true
r=$(cat r.out)
[[ $r == ok* ]] || fail "a read in flight at the loss was not sent again: $r"
ok "write: $(cut -d' ' -f1,2 w.out) s; read: $r s"

check "a backend that hangs (SIGSTOP): requests fail, then recover"
expect_ok "read before the stop" read 0 4096 >/dev/null
kill -STOP $BACK_PID
# The bound: the time-out from submission plus one reconnection attempt
# (1 s), not a second time-out after the hang is found.
r=$(expect_error_within $((TMO + 2)) "read from a stopped backend" \
  read 0 4096)
echo "  $r"
grep -q "no reply for $TMO s" "$T/server.log" ||
  fail "no log of the hung connection"
kill -CONT $BACK_PID
expect_ok "read after SIGCONT" read 0 4096 >/dev/null
ok "dropped the hung connections and reconnected"

check "a non-multi-conn backend: one connection, with a warning"
stop_server
kill_back
start_nbdkit --filter=multi-conn memory 64M multi-conn-mode=disable
start_server --nbd-connections 4 "$BACK"
[ "$(back_conns)" -eq 1 ] || fail "$(back_conns) connections"
grep -q "does not advertise multi-conn" "$T/server.log" || fail "no warning"
ok "one connection"
stop_server

check "a client that leaves gives up its requests waiting for a lost backend"
kill_back
start_back 64M
start_server --nbd-timeout 60 "$BACK"
expect_ok "read" read 0 4096 >/dev/null
kill_back
# A read that waits for the backend, then the client is gone without
# NBD_CMD_DISC: the front cancels the read rather than hold it 60 s.
timeout 20 "$PY" - "$URI" <<'EOF'
import nbd, os, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.aio_pread(nbd.Buffer(4096), 0)
h.poll(300)  # the request is out; its answer would take the time-out
os._exit(0)
EOF
wait_until 10 grep -q "read at 0: cancelled: the client is gone" "$T/server.log" ||
  fail "the read of a vanished client was not cancelled"
server_alive || fail "the front server died"
stop_server
start_back 64M
ok "cancelled"

# close_promptly STATUS: SIGTERM the front, expect STATUS within 3 s.
close_promptly() {
  local t0=$SECONDS rc=0
  kill -TERM "$SERVER_PID"
  wait_until 3 _pid_gone "$SERVER_PID" ||
    fail "the front did not exit within 3 s of SIGTERM"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=
  check_sanitizer_reports "$T/server.log"
  [ $rc -eq "$1" ] || fail "exit status $rc, expected $1"
  echo "  exited with $rc after $((SECONDS - t0)) s"
}

check "closing with a dead backend is prompt"
kill_back
start_back 64M
start_server --nbd-timeout 30 "$BACK"
expect_ok "write" write 0 4096 1 >/dev/null
expect_ok "flush" flush >/dev/null
kill_back
close_promptly 0
start_back 64M
start_server --nbd-timeout 30 "$BACK"
expect_ok "write" write 0 4096 1 >/dev/null
kill_back
close_promptly 1
grep -q "final flush failed" "$T/server.log" ||
  fail "unflushed writes to a dead backend should fail the final flush"
ok "prompt; unflushed writes reported"
check_sanitizer_reports "$T/back.log"
