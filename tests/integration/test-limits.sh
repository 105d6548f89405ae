#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Limits and access control of `blockport serve`: a client that stalls or
# trickles bytes in the handshake is cut at --handshake-timeout; an idle
# client at --idle-timeout (one with requests in flight is not idle);
# --allow admits TCP clients by address and refuses the rest at accept,
# before any thread is spent; --unix-mode sets the socket's permissions;
# --readonly-export protects the export it names (the default export for
# "", an nbdkit plugin's listed ones too) and a name that is no export is
# a usage error, as every usage error of serve exits 1.  After each, the
# server serves a fresh client.
source "$(dirname "$0")/lib.sh"
require nbdinfo
cd "$T"
truncate -s 16M disk.img

# stalled URI-SOCKET MODE: connect, send according to MODE, print how many
# seconds until the server closed the connection.
stalled() {
  "$PY" - "$1" "$2" <<'PYEOF'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
t0 = time.time()
s.settimeout(30)
s.recv(18)                       # the greeting
if sys.argv[2] == "trickle":
    s.settimeout(0.5)
    flags = b"\0\0\0\1"          # fixed newstyle, one byte at a time
    try:
        for b in (flags + b"IHAVEOPT") * 100:
            s.send(bytes([b]))
            try:
                if s.recv(1) == b"":
                    break
            except socket.timeout:
                pass
    except (BrokenPipeError, ConnectionResetError):
        pass
else:
    s.settimeout(30)
    try:
        s.recv(1)
    except ConnectionResetError:
        pass
print("%.1f" % (time.time() - t0))
PYEOF
}

check "--handshake-timeout 2: a silent client and a trickling one are cut"
start_server --handshake-timeout 2 disk.img
t=$(stalled "$SOCK" silent)
awk -v t="$t" 'BEGIN { exit !(t >= 1.5 && t < 10) }' || fail "silent client cut after $t s"
t=$(stalled "$SOCK" trickle)
awk -v t="$t" 'BEGIN { exit !(t >= 1.5 && t < 10) }' || fail "trickling client cut after $t s"
grep -q "handshake timed out" "$T/server.log" || fail "no log line"
nbdinfo --size "$URI" >/dev/null || fail "a fresh client after the timeouts"
stop_server
ok "cut after about 2 s; the server serves on"

check "--idle-timeout 2: an idle client is closed, a busy one is not"
start_server --idle-timeout 2 disk.img
"$PY" - "$URI" <<'PYEOF' || fail "idle timeout"
import sys, time, nbd
busy = nbd.NBD()
busy.connect_uri(sys.argv[1])
idle = nbd.NBD()
idle.connect_uri(sys.argv[1])
# The busy client keeps sending for 4 s: never idle for 2.
t0 = time.time()
while time.time() - t0 < 4:
    busy.pread(4096, 0)
    time.sleep(0.2)
busy.pread(4096, 0)
try:
    idle.pread(4096, 0)
    sys.exit("the idle client was not closed")
except nbd.Error:
    pass
PYEOF
grep -q "idle for 2 s; closing" "$T/server.log" || fail "no log line"
stop_server
ok "the idle client closed, the busy one served"

check "--allow: TCP clients by address"
start_server_tcp --allow 10.0.0.0/8 --allow 192.168.0.0/16 disk.img
nbdinfo --size "$URI" >/dev/null 2>&1 && fail "127.0.0.1 admitted"
grep -q "not in --allow" "$T/server.log" || fail "no log line"
server_alive || fail "server died"
stop_server
start_server_tcp --allow 10.0.0.0/8 --allow 127.0.0.0/8 disk.img
nbdinfo --size "$URI" >/dev/null || fail "127.0.0.1 refused"
stop_server
rc=0; "$BLOCKPORT" serve --port 0 --allow 10.0.0.0/33 disk.img 2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "bad prefix" err.txt || { cat err.txt; fail "bad CIDR: exit $rc"; }
ok "refused outside the list, admitted inside; a bad CIDR is a usage error"

check "--unix-mode 0600"
start_server --unix-mode 0600 disk.img
[ "$(stat -c %a "$SOCK")" = 600 ] || fail "mode $(stat -c %a "$SOCK")"
nbdinfo --size "$URI" >/dev/null || fail "the owner cannot connect"
stop_server
ok "socket mode 600"

check "--readonly-export: one export read-only, the others writable"
require qemu-io
truncate -s 16M disk2.img
start_server --readonly-export ro rw=disk.img ro=disk2.img
run qemu-io -f raw -c 'write -P 5 0 64k' "$(export_uri rw)" >/dev/null ||
  fail "write to the writable export"
out=$(qemu-io -f raw -c 'write -P 5 0 64k' "$(export_uri ro)" 2>&1) &&
  ! grep -qi "fail\|error\|denied" <<<"$out" && fail "write to the read-only export passed"
nbdinfo --json "$(export_uri ro)" | grep -q '"is_read_only": true' ||
  fail "the read-only export does not say so"
stop_server
cmp -n 65536 disk2.img /dev/zero || fail "the read-only export was written"
ok "writes refused on ro only"

check "--readonly-export: a name that is no export is a usage error"
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --readonly-export r0 rw=disk.img ro=disk2.img \
  2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "readonly-export 'r0': no such export" err.txt ||
  { cat err.txt; fail "a misspelt name: exit $rc, expected 1"; }
[ ! -e "$T/x.sock" ] || fail "a socket was created for a refused start"
ok "exit status 1, nothing served"

check "--readonly-export '': the default export, whatever its name"
start_server --readonly-export "" first=disk.img second=disk2.img
nbdinfo --json "$(export_uri first)" | grep -q '"is_read_only": true' ||
  fail "the default export 'first' is writable"
nbdinfo --json "$(export_uri second)" | grep -q '"is_read_only": false' ||
  fail "'second' is read-only"
stop_server
ok "'first' read-only, 'second' writable"

if [[ -n ${OVERLAP_PLUGIN:-} && -e ${OVERLAP_PLUGIN:-} ]]; then
  check "--readonly-export: an nbdkit plugin's listed exports, one by one"
  start_server --readonly-export one --plugin "$OVERLAP_PLUGIN" exports=true delay=0
  nbdinfo --json "$(export_uri one)" | grep -q '"is_read_only": true' ||
    fail "listed export 'one' is writable"
  nbdinfo --json "$(export_uri two)" | grep -q '"is_read_only": false' ||
    fail "listed export 'two' is read-only"
  stop_server
  rc=0
  "$BLOCKPORT" serve --unix "$T/x.sock" --readonly-export three \
    --plugin "$OVERLAP_PLUGIN" exports=true delay=0 2>err.txt || rc=$?
  [ $rc -eq 1 ] && grep -q "readonly-export 'three': no such export" err.txt ||
    { cat err.txt; fail "a name the plugin does not list: exit $rc, expected 1"; }
  ok "'one' read-only, 'two' writable; an unlisted name refused"
else
  skip_case "OVERLAP_PLUGIN not built: no --readonly-export of a plugin's exports"
fi

check "serve's usage errors exit 1"
for args in "--no-such-option memory:1M" "--max-requests 0 memory:1M" \
  "--port 70000 memory:1M" "--tls maybe memory:1M" ""; do
  rc=0
  # shellcheck disable=SC2086
  "$BLOCKPORT" serve --unix "$T/x.sock" $args >/dev/null 2>err.txt || rc=$?
  [ $rc -eq 1 ] || { cat err.txt; fail "serve $args: exit $rc, expected 1"; }
done
ok "exit status 1"
