#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# An NBD URI as a source: blockport serving another blockport's export
# (and qemu-nbd's), convert and map reading from a URI; unreachable and
# silent servers are errors, not hangs.
source "$(dirname "$0")/lib.sh"
require qemu-io qemu-img nbdinfo fio
cd "$T"

# The backend: a memory export of a first server, on its own socket.
"$BLOCKPORT" serve --unix "$T/back.sock" --pid-file "$T/back.pid" memory:64M \
  2>"$T/back.log" &
track_pid $!
wait_file 5 "$T/back.pid" $! || fail "the backend did not start"
BACK="nbd+unix:///?socket=$T/back.sock"

check "a blockport export of an nbd+unix:// source: writes reach the backend"
start_server "$BACK"
run qemu-io -f raw -c 'write -P 9 1M 3M' -c 'write -z 10M 1M' "$URI" >/dev/null ||
  fail "write through the front server"
run qemu-io -f raw -c 'read -P 9 1M 3M' "$BACK" >/dev/null || fail "backend lacks the data"
nbdinfo --map "$URI" >map.txt || fail "block status through the front server"
grep -q "1048576 *3145728 *0 *data" map.txt || { cat map.txt; fail "map through the front"; }
ok "data and block status pass through"

check "fio verify, 4 jobs, through the front server"
fio_verify "$URI"
stop_server
ok "verified"

check "convert and map read an NBD URI"
run "$BLOCKPORT" convert -O qcow2 "$BACK" copy.qcow2 || fail "convert from a URI"
run qemu-img compare copy.qcow2 "$BACK" || fail "copy differs"
"$BLOCKPORT" map --json "$BACK" >m.json || fail "map of a URI"
grep -q '"data": true' m.json || fail "map shows no data"
ok "convert and map"

check "an unreachable URI: a clear error, exit 1"
rc=0; "$BLOCKPORT" serve --unix "$T/x.sock" "nbd+unix:///?socket=$T/none.sock" \
  2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "exit $rc"
grep -q "none.sock" err.txt || { cat err.txt; fail "message does not name the URI"; }
ok "refused"

check "a server that accepts and never answers: an error within the connect timeout"
# A Unix socket that is listened on but never served: the handshake stalls.
mute_server "$T/mute.sock"
start=$SECONDS
rc=0; timeout 60 "$BLOCKPORT" serve --unix "$T/x.sock" \
  "nbd+unix:///?socket=$T/mute.sock" 2>err.txt || rc=$?
[ $rc -eq 1 ] || { cat err.txt; fail "exit $rc after $((SECONDS - start)) s, expected 1"; }
grep -q "mute.sock.*no handshake from the server within 10 s" err.txt ||
  { cat err.txt; fail "no clear message"; }
ok "gave up after $((SECONDS - start)) s naming the URI"
