#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --config: many exports from one file with their own read-only,
# description, default, allow and require-tls settings; files that cannot
# be used are refused with the line and the reason; SIGHUP reloads it (new
# exports appear, removed ones refuse new clients while a connected client
# carries on, an invalid file or a missing image keeps the old
# configuration, a slow one does not hold up new clients); one image named
# by two exports is opened once; --check-config.
TESTS_DIR=$(cd "$(dirname "$0")" && pwd)
source "$TESTS_DIR/lib.sh"
require_feature tls
require nbdinfo qemu-img qemu-io psktool
require_py_nbd
cd "$T"

# ---- files the server refuses at startup ----

check "an invalid config file is refused at startup with FILE:LINE: reason (exit 1)"
bad() { # bad LINE PATTERN: the file on stdin is refused naming LINE
  local want_line=$1 pattern=$2 rc=0
  cat >bad.conf
  "$BLOCKPORT" serve --unix "$T/x.sock" --config bad.conf 2>err.txt || rc=$?
  [[ $rc -eq 1 ]] || { cat err.txt; fail "exit status $rc, expected 1"; }
  grep -q "bad.conf:$want_line: .*$pattern" err.txt ||
    { cat err.txt; fail "expected 'bad.conf:$want_line: ...$pattern'"; }
  [[ ! -e $T/x.sock ]] || fail "a socket was created for a refused file"
  # --check-config refuses it the same way, and prints no listing.
  rc=0
  "$BLOCKPORT" serve --check-config --config bad.conf >out.txt 2>err.txt || rc=$?
  [[ $rc -eq 1 ]] && grep -q "bad.conf:$want_line: .*$pattern" err.txt &&
    [[ ! -s out.txt ]] || { cat out.txt err.txt; fail "--check-config: exit $rc"; }
}
printf '[export a]\npath = null:1M\nreadonly = yes\n' | bad 3 "unknown key 'readonly'"
printf '[export a]\npath = null:1M\n\n[export a]\npath = null:2M\n' | bad 4 "declared twice"
printf '# no path\n[export a]\nformat = raw\n' | bad 2 "path"
printf 'path = null:1M\n' | bad 1 "outside"
printf '[export a]\npath = null:1M\nread-only = maybe\n' | bad 3 "maybe"
printf '[export a]\npath = null:1M\nallow = 10.0.0.300\n' | bad 3 "10.0.0.300"
# require-tls without TLS on the server is a configuration error too.
printf '[export a]\npath = null:1M\nrequire-tls = yes\n' | bad 1 "requires TLS"
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --config "$T/none.conf" 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "none.conf" err.txt || { cat err.txt; fail "missing file: exit $rc"; }
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --config bad.conf null:1M 2>err.txt || rc=$?
[[ $rc -eq 1 ]] || fail "--config with an IMAGE argument: exit $rc, expected 1"
printf '[export a]\npath = %s/missing.img\n' "$T" >bad.conf
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --config bad.conf 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "missing.img" err.txt ||
  { cat err.txt; fail "missing image: exit $rc, expected 1 naming it"; }
rc=0
"$BLOCKPORT" serve --check-config --config bad.conf >out.txt 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "missing.img" err.txt ||
  { cat err.txt; fail "--check-config, missing image: exit $rc, expected 1"; }
ok "exit status 1 with FILE:LINE: reason, and for an image that cannot be opened"

# ---- a config with every per-export setting ----

mkdir images
qemu-img create -q -f qcow2 images/golden.qcow2 64M
qemu-io -f qcow2 -c 'write -P 0x47 0 1M' images/golden.qcow2 >/dev/null
truncate -s 32M images/scratch.raw
qemu-img create -q -f qcow2 images/frozen.qcow2 16M
qemu-io -f qcow2 -c 'write -P 0x46 0 1M' images/frozen.qcow2 >/dev/null
mkdir psk && psktool -u alice -p psk/keys.psk >/dev/null

cat >exports.conf <<'EOF'
# The test's exports.

[export scratch]
path = images/scratch.raw
description = scratch space
default = yes

[export golden]
path = images/golden.qcow2
format = qcow2
read-only = yes
description = the golden image

[export golden-rw]
path = ./images/../images/golden.qcow2

[export local-only]
path = memory:16M
allow = 127.0.0.1

[export elsewhere]
path = memory:16M
allow = 127.0.0.2/32, ::1

[export secret]
path = memory:8M
require-tls = yes
EOF
start_server_tcp --tls on --tls-psk "$T/psk/keys.psk" --config exports.conf
LOG=$T/server.log
# more_logged N PATTERN: the server log has more than N lines matching.
more_logged() { (($(grep -c "$2" "$LOG") > $1)); }

check "nbdinfo --list: what this client may use, with descriptions"
run nbdinfo --list --json "$URI" >list.json || fail "nbdinfo --list"
"$PY" - list.json <<'EOF' || fail "export list wrong (see above)"
import json, sys
d = json.load(open(sys.argv[1]))
names = {e["export-name"]: e for e in d["exports"]}
want = {"scratch", "golden", "golden-rw", "local-only"}
assert set(names) == want, sorted(names)
assert names["scratch"]["description"] == "scratch space", names["scratch"]
assert names["golden"]["description"] == "the golden image"
assert names["golden"]["is_read_only"] is True
assert names["golden-rw"]["is_read_only"] is False
print("listed:", sorted(names))
EOF
ok "listed all but 'elsewhere' (127.0.0.2 only) and 'secret' (TLS only)"

check "the default export is the one marked default = yes"
run nbdinfo --size "$URI" >size.txt || fail "nbdinfo default export"
[[ $(cat size.txt) == 33554432 ]] || fail "default export size $(cat size.txt)"
ok "default export is scratch"

check "read-only export refuses writes; the writable one shares its image"
"$PY" - "$(export_uri golden)" <<'EOF' || fail "golden accepted a write"
import errno, nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
assert h.is_read_only()
h.set_strict_mode(0)  # send the write anyway: the server must refuse it
try:
    h.pwrite(b"x" * 4096, 0)
    sys.exit("write succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
EOF
run qemu-io -f raw -c 'write -P 0x77 1M 1M' "$(export_uri golden-rw)" >/dev/null ||
  fail "write to golden-rw"
# One device: the read-only export sees the write at once (two opens of
# the qcow2 would each cache their own L2 tables).
run qemu-io -r -f raw -c 'read -P 0x47 0 1M' -c 'read -P 0x77 1M 1M' \
  "$(export_uri golden)" >/dev/null || fail "golden does not see golden-rw's write"
[[ $(grep -c "golden.qcow2" "$LOG") -eq 1 ]] ||
  { grep golden.qcow2 "$LOG"; fail "golden.qcow2 was opened more than once"; }
ok "writes refused on golden; golden-rw's data seen through golden; opened once"

check "--check-config beside the running server: every export, images opened read-only"
check_args=(serve --check-config --tls on --tls-psk "$T/psk/keys.psk" --port 1
  --config exports.conf)
"$BLOCKPORT" "${check_args[@]}" >check.txt 2>err.txt ||
  { cat check.txt err.txt; fail "--check-config of the file the server runs"; }
cat check.txt
grep -q "^exports.conf: ok, 6 exports$" check.txt || fail "no 'ok, 6 exports' line"
for want in "'scratch': raw .*images/scratch.raw, 33554432 bytes, writable, default$" \
    "'golden': qcow2 .*golden.qcow2, 67108864 bytes, read-only$" \
    "'golden-rw': qcow2 .*golden.qcow2, 67108864 bytes, writable$" \
    "'elsewhere': memory memory:16M, 16777216 bytes, writable, 2 allow rules$" \
    "'secret': memory memory:8M, 8388608 bytes, writable, TLS required$"; do
  grep -q "  export $want" check.txt || fail "no line matching: export $want"
done
[[ ! -s err.txt ]] || { cat err.txt; fail "--check-config wrote to stderr"; }
if command -v strace >/dev/null; then
  # Once more under strace for the open flags (LeakSanitizer cannot run
  # under ptrace; the run above was leak-checked).
  ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
    strace -f -qq -e trace=open,openat -o "$T/check.trace" \
    "$BLOCKPORT" "${check_args[@]}" >/dev/null 2>err.txt ||
    { cat err.txt; fail "--check-config under strace"; }
  grep -q 'golden.qcow2", O_RDONLY' "$T/check.trace" ||
    { grep golden "$T/check.trace"; fail "golden.qcow2 not opened read-only"; }
  ! grep -E '(golden.qcow2|scratch.raw)", O_(WRONLY|RDWR)' "$T/check.trace" ||
    fail "--check-config opened an image for writing"
  echo "  (strace: images opened O_RDONLY only)"
else
  skip_case "no strace: the open flags of --check-config are not checked"
fi
# The server's writer is undisturbed: a write after the check lands.
run qemu-io -f raw -c 'write -P 0x79 2M 1M' "$(export_uri golden-rw)" >/dev/null ||
  fail "write to golden-rw after the check"
run qemu-io -r -f raw -c 'read -P 0x79 2M 1M' "$(export_uri golden)" >/dev/null ||
  fail "golden does not see the write made after the check"
# Without TLS on, the same file is bad (export 'secret' requires TLS).
rc=0
"$BLOCKPORT" serve --check-config --config exports.conf >out.txt 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "exports.conf:[0-9]*: export 'secret' requires TLS" err.txt ||
  { cat err.txt; fail "--check-config without --tls: exit $rc, expected 1"; }
ok "listed as configured; read-only opens; the server's writes carry on"

# wire SOURCE_ADDR NAME...: from SOURCE_ADDR, LIST, then INFO for each NAME.
wire() {
  local src=$1
  shift
  "$PY" - "$PORT" "$src" "$@" <<'EOF'
import os, socket, sys
sys.path.insert(0, os.environ["TESTS_DIR"])
import nbdwire
port, src, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind((src, 0))
s.connect(("127.0.0.1", port))
c = nbdwire.Client(s)
c.handshake()
print("listed", " ".join(sorted(n for n, _ in c.opt_list().exports)))
for n in names:
    r = c.opt_info(n)
    print(n, nbdwire.rep_name(r.type))
c.opt_abort()
EOF
}
export TESTS_DIR

check "allow lists: 'elsewhere' is refused with NBD_REP_ERR_POLICY from 127.0.0.1, served to 127.0.0.2"
wire 127.0.0.1 elsewhere local-only >wire1.txt || { cat wire1.txt; fail "nbdwire from 127.0.0.1"; }
grep -q "^elsewhere ERR_POLICY" wire1.txt || { cat wire1.txt; fail "elsewhere not refused"; }
grep -q "^local-only ACK" wire1.txt || { cat wire1.txt; fail "local-only refused"; }
wire 127.0.0.2 elsewhere local-only >wire2.txt || { cat wire2.txt; fail "nbdwire from 127.0.0.2"; }
grep -q "^elsewhere ACK" wire2.txt || { cat wire2.txt; fail "elsewhere refused to 127.0.0.2"; }
grep -q "^local-only ERR_POLICY" wire2.txt || { cat wire2.txt; fail "local-only served to 127.0.0.2"; }
grep -q "^listed elsewhere golden golden-rw scratch$" wire2.txt ||
  { cat wire2.txt; fail "LIST from 127.0.0.2"; }
ok "per-export allow lists decide, by client address"

check "require-tls: plaintext clients get NBD_REP_ERR_TLS_REQD, TLS clients are served"
wire 127.0.0.1 secret >wire3.txt || { cat wire3.txt; fail "nbdwire secret"; }
grep -q "^secret ERR_TLS_REQD" wire3.txt || { cat wire3.txt; fail "secret served in the clear"; }
run nbdinfo --size "nbds://alice@127.0.0.1:$PORT/secret?tls-psk-file=$T/psk/keys.psk" >size.txt ||
  fail "secret over TLS"
run nbdinfo --list --json "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$T/psk/keys.psk" >list-tls.json ||
  fail "nbdinfo --list over TLS"
grep -q '"export-name": "secret"' list-tls.json || fail "secret not listed over TLS"
[[ $(cat size.txt) == 8388608 ]] || fail "secret size $(cat size.txt)"
run nbdinfo --size "$(export_uri golden)" >/dev/null || fail "golden in the clear"
ok "TLS-only export needs STARTTLS; the others do not"

# ---- reload ----

check "SIGHUP: a connected client of a removed export carries on"
run qemu-io -f raw -c 'write -P 0x5c 0 4M' "$(export_uri local-only)" >/dev/null ||
  fail "write local-only"
# A client that holds a connection to 'scratch' across the reload.
mkfifo go
"$PY" - "$PORT" <<'EOF' >holder.txt 2>&1 &
import nbd, sys
h = nbd.NBD()
h.set_export_name("scratch")
h.connect_tcp("127.0.0.1", sys.argv[1])
h.pwrite(b"\x42" * 65536, 0)
print("connected", flush=True)
open("go").read()              # wait for the reload
h.pwrite(b"\x43" * 65536, 65536)
assert h.pread(65536, 0) == b"\x42" * 65536
h.flush()
h.shutdown()
print("done", flush=True)
EOF
HOLDER=$!
track_pid $HOLDER
wait_until 10 grep -q connected holder.txt || { cat holder.txt; fail "holder did not connect"; }

cat >exports.conf <<'EOF'
[export golden]
path = images/golden.qcow2
read-only = yes

[export local-only]
path = memory:16M
allow = 127.0.0.1
description = still here

[export fresh]
path = null:1G
default = yes

[export frozen]
path = images/frozen.qcow2
read-only = yes
EOF
kill -HUP "$SERVER_PID"
wait_until 10 grep -q "reloaded" "$LOG" || true
grep -q "reloaded.*4 exports.*added: 'fresh' 'frozen'.*removed: 'scratch' 'golden-rw' 'elsewhere' 'secret'" "$LOG" ||
  { tail -5 "$LOG"; fail "no reload logged"; }
echo go >go
wait $HOLDER || { cat holder.txt; fail "the connected client failed after the reload"; }
grep -q done holder.txt || fail "holder did not finish"
ok "the client of removed export 'scratch' finished its work"

check "after the reload: new exports offered, removed ones refused"
run nbdinfo --list --json "$URI" >list2.json || fail "nbdinfo --list after reload"
"$PY" - list2.json <<'EOF' || fail "export list after reload wrong"
import json, sys
names = {e["export-name"]: e for e in json.load(open(sys.argv[1]))["exports"]}
assert set(names) == {"golden", "local-only", "fresh", "frozen"}, sorted(names)
assert names["local-only"]["description"] == "still here"
EOF
if run nbdinfo --size "$(export_uri scratch)" >/dev/null 2>&1; then
  fail "removed export 'scratch' still accepts clients"
fi
[[ $(run nbdinfo --size "$URI") == 1073741824 ]] || fail "default export is not 'fresh'"
# The memory disk kept its data: same name, same path, same device.
run qemu-io -f raw -c 'read -P 0x5c 0 4M' "$(export_uri local-only)" >/dev/null ||
  fail "local-only lost its data over the reload"
# scratch.raw got both of the holder's writes.
cmp -n 65536 images/scratch.raw <(head -c 65536 /dev/zero | tr '\0' '\102') ||
  fail "scratch.raw first 64k"
cmp -i 65536:0 -n 65536 images/scratch.raw <(head -c 65536 /dev/zero | tr '\0' '\103') ||
  fail "scratch.raw second 64k"
ok "fresh offered and default; scratch refused; local-only kept its data"

check "an invalid file on SIGHUP is logged with its line; the old exports stay"
printf '[export golden]\npath = images/golden.qcow2\nbogus = 1\n' >exports.conf
kill -HUP "$SERVER_PID"
wait_until 10 grep -q "keeping the current configuration" "$LOG" || true
grep -q "exports.conf:3: unknown key 'bogus'" "$LOG" || { tail -5 "$LOG"; fail "no line-numbered error"; }
grep -q "keeping the current configuration" "$LOG" || fail "reload failure not logged"
server_alive || fail "server died on an invalid reload"
[[ $(run nbdinfo --size "$URI") == 1073741824 ]] || fail "old default export gone"
run qemu-io -f raw -c 'read -P 0x5c 0 4M' "$(export_uri local-only)" >/dev/null ||
  fail "local-only changed after a refused reload"
ok "refused; still serving golden, local-only and fresh"

check "a reload naming an image that cannot be opened keeps the old exports"
n=$(grep -c "keeping the current configuration" "$LOG")
printf '[export new]\npath = %s/nope.qcow2\n' "$T" >exports.conf
kill -HUP "$SERVER_PID"
wait_until 10 more_logged $n "keeping the current" || true
grep -q "nope.qcow2" "$LOG" || fail "the missing image is not named"
run nbdinfo --size "$(export_uri golden)" >/dev/null || fail "golden gone after a failed reload"
ok "refused; golden still served"

check "a reload waiting on a silent nbd:// server does not hold up new clients"
# A socket listened on and never answered: opening it takes the whole
# connect timeout (10 s).
mute_server "$T/mute.sock"
n=$(grep -c "keeping the current configuration" "$LOG")
printf '[export slow]\npath = nbd+unix:///?socket=%s/mute.sock\n' "$T" >exports.conf
kill -HUP "$SERVER_PID"
# The reload is under way once its connection to the silent server is in.
wait_until 10 test -s "$T/mute.sock.accepted" || fail "the reload did not reach mute.sock"
timeout 5 nbdinfo --size "$(export_uri golden)" >/dev/null ||
  fail "a new client waited for the reload"
(($(grep -c "keeping the current configuration" "$LOG") == n)) ||
  fail "the reload was over before the client came: nothing was shown"
wait_until 20 more_logged $n "keeping the current" || fail "the reload never gave up"
grep -q "mute.sock.*no handshake from the server" "$LOG" || fail "the reason is not logged"
ok "a client served during the reload; the reload gave up and changed nothing"

check "read-only to writable while a reader is connected waits for it"
cat >exports.conf <<'EOF'
[export golden]
path = images/golden.qcow2

[export frozen]
path = images/frozen.qcow2
EOF
rm -f go && mkfifo go
"$PY" - "$PORT" <<'EOF' >reader.txt 2>&1 &
import nbd, sys
h = nbd.NBD()
h.set_export_name("frozen")
h.connect_tcp("127.0.0.1", sys.argv[1])
print("connected", flush=True)
open("go").read()
assert h.pread(4096, 0) == b"\x46" * 4096
h.shutdown()
EOF
READER=$!
track_pid $READER
wait_until 10 grep -q connected reader.txt || { cat reader.txt; fail "reader did not connect"; }
n=$(grep -c "keeping the current configuration" "$LOG")
kill -HUP "$SERVER_PID"
wait_until 10 more_logged $n "keeping the current" || true
grep -q "open read-only for connected clients" "$LOG" || { tail -5 "$LOG"; fail "conflict not explained"; }
echo go >go
wait $READER || { cat reader.txt; fail "reader failed"; }
kill -HUP "$SERVER_PID"
wait_until 10 grep -q "reloaded.*2 exports;" "$LOG" || { tail -5 "$LOG"; fail "reload after the reader left"; }
run qemu-io -f raw -c 'write -P 0x99 2M 64k' "$(export_uri golden)" >/dev/null ||
  fail "golden not writable after the reload"
run qemu-io -f raw -c 'read -P 0x46 0 1M' -c 'write -P 0x98 1M 64k' \
  "$(export_uri frozen)" >/dev/null || fail "frozen not writable after the reload"
ok "refused while read by a client; accepted once it left; now writable"

stop_server
run qemu-img check -q images/golden.qcow2 || fail "qemu-img check golden.qcow2"
run qemu-img check -q images/frozen.qcow2 || fail "qemu-img check frozen.qcow2"
qemu-io -f qcow2 -c 'read -P 0x46 0 1M' -c 'read -P 0x98 1M 64k' \
  images/frozen.qcow2 >/dev/null || fail "frozen.qcow2 content"
qemu-io -f qcow2 -c 'read -P 0x47 0 1M' -c 'read -P 0x77 1M 1M' \
  -c 'read -P 0x99 2M 64k' images/golden.qcow2 >/dev/null || fail "golden.qcow2 content"
ok "golden.qcow2 and frozen.qcow2 clean and hold every write"

check "--readonly-export naming no export of the file is an error, at start and on SIGHUP"
printf '[export ro]\npath = memory:1M\ndefault = yes\n\n[export rw]\npath = memory:1M\n' >exports.conf
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --readonly-export nosuch --config exports.conf 2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q "readonly-export 'nosuch': no such export in exports.conf" err.txt ||
  { cat err.txt; fail "start: exit $rc, expected 1 and the name"; }
[[ ! -e $T/x.sock ]] || fail "a socket was created for a refused start"
rc=0
"$BLOCKPORT" serve --check-config --readonly-export nosuch --config exports.conf >out.txt 2>err.txt ||
  rc=$?
[[ $rc -eq 1 ]] && grep -q "'nosuch'" err.txt || { cat err.txt; fail "--check-config: exit $rc, expected 1"; }
# "" is the default export, whatever its name.
start_server --readonly-export "" --config exports.conf
nbdinfo --json "$(export_uri ro)" | grep -q '"is_read_only": true' ||
  fail "--readonly-export '' left the default export 'ro' writable"
nbdinfo --json "$(export_uri rw)" | grep -q '"is_read_only": false' || fail "rw is read-only"
n=$(grep -c "keeping the current configuration" "$LOG" || true)
printf '[export ro]\npath = memory:1M\n\n[export rw]\npath = memory:1M\n' >exports.conf
kill -HUP "$SERVER_PID"
wait_until 10 more_logged $n "keeping the current" || true
grep -q "readonly-export '': no default export in exports.conf" "$LOG" ||
  { tail -5 "$LOG"; fail "the reload did not name the option"; }
server_alive || fail "the server died on the reload"
nbdinfo --json "$(export_uri ro)" | grep -q '"is_read_only": true' ||
  fail "'ro' writable after a refused reload"
stop_server
ok "exit 1 (--check-config: 2); the refused reload kept 'ro' read-only"

check "--metrics over a reload: counters kept by name, a removed export's info series dropped"
printf '[export m1]\npath = memory:8M\n\n[export m2]\npath = null:8M\n' >exports.conf
for attempt in 1 2 3 4 5; do
  MPORT=$(_free_port)
  _launch --unix "$T/sock" -- --metrics "127.0.0.1:$MPORT" --config exports.conf
  _wait_started && break
  ((attempt < 5)) || fail "could not start the server with --metrics"
done
SOCK=$T/sock
scrape() { "$PY" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "http://127.0.0.1:$MPORT/metrics"; }
run qemu-io -f raw -c 'write -P 1 0 1M' "$(export_uri m1)" >/dev/null || fail "write m1"
printf '[export m1]\npath = memory:8M\n\n[export m3]\npath = null:8M\n' >exports.conf
kill -HUP "$SERVER_PID"
wait_until 10 grep -q "reloaded.*added: 'm3'" "$LOG" || { tail -5 "$LOG"; fail "metrics server did not reload"; }
scrape >metrics.txt || fail "scrape"
for want in 'blockport_exports 2' 'blockport_export_info{export="m1"} 1' \
  'blockport_export_info{export="m3"} 1' \
  'blockport_written_bytes_total{export="m1"} 1048576'; do
  grep -qxF "$want" metrics.txt || { grep -E 'exports|export_info|written' metrics.txt; fail "missing: $want"; }
done
# *_info series stay 1 and go away with their export (Prometheus' rule).
! grep -q 'blockport_export_info{export="m2"}' metrics.txt || fail "m2's info series kept"
stop_server
ok "export_info follows the configuration; m1's counters survived the reload"

if fio --enghelp=nbd >/dev/null 2>&1; then
  check "20 reloads while fio writes and verifies a qcow2 export: in-flight work untouched"
  qemu-img create -q -f qcow2 images/busy.qcow2 64M
  conf() { # conf N: the busy export, plus one that changes every reload
    printf '[export busy]\npath = images/busy.qcow2\n\n[export churn-%s]\npath = memory:1M\n' "$1"
  }
  conf 0 >exports.conf
  : >"$LOG" # count this server's reloads only
  start_server --config exports.conf
  cat >busy.fio <<EOF2
[global]
ioengine=nbd
uri=nbd+unix:///busy?socket=$SOCK
rw=randwrite
bsrange=4k-256k
size=32M
iodepth=16
verify=crc32c
verify_fatal=1
[w1]
offset=0
[w2]
offset=32M
EOF2
  (timeout --kill-after=5 120 fio --output-format=terse busy.fio >fio.out 2>&1; echo "rc=$?" >>fio.out) &
  FIO=$!
  track_pid $FIO
  # Reload once fio's writes land, and each time after the last reload
  # (signals sent close together may arrive as one).
  empty=$(stat -c %s images/busy.qcow2)
  wait_until 30 eval '(($(stat -c %s images/busy.qcow2) > empty))' ||
    { cat fio.out; fail "fio wrote nothing"; }
  during=0
  for i in $(seq 1 20); do
    conf "$i" >exports.conf
    _pid_alive $FIO && during=$i
    kill -HUP "$SERVER_PID"
    wait_until 10 more_logged $((i - 1)) "reloaded.*added: 'churn-" ||
      { grep reloaded "$LOG"; fail "reload $i not logged"; }
  done
  echo "  $during of the 20 reloads began while fio ran"
  wait $FIO || true
  grep -q "^rc=0$" fio.out || { cat fio.out; fail "fio failed across reloads"; }
  stop_server
  run qemu-img check -q images/busy.qcow2 || fail "qemu-img check busy.qcow2"
  ok "fio verified every write; $(grep -c reloaded "$LOG") reloads logged; image clean"
else
  skip_case "fio has no nbd engine: no reloads under fio"
fi
