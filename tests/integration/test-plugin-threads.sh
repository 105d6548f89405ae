#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit thread models under blockport serve, proved with the overlap test
# plugin (tests/plugins/), which records how many of its calls overlap in
# all and on one handle, and how many handles are open at once.  Two
# clients each keep 32 reads in flight:
#   parallel                calls overlap, even on one handle
#   serialize_requests      one call at a time per handle, handles overlap
#   serialize_all_requests  one call at a time, both handles open
#   serialize_connections   one call at a time, one handle at a time (the
#                           second client waits for the first to leave)
# Also: API version 1, a plugin's errno reaching the client (errno and
# nbdkit_set_error), FUA emulated with flush, -D debug flags, list_exports
# as NBD_OPT_LIST, and a plugin refusing to open.
source "$(dirname "$0")/lib.sh"
require_feature plugins
require_py_nbd
require nbdinfo
[[ -f ${OVERLAP_PLUGIN:-} && -f ${OVERLAP_PLUGIN_V1:-} ]] ||
    skip "OVERLAP_PLUGIN/OVERLAP_PLUGIN_V1 not built"
cd "$T"

cat >clients.py <<'PY'
import sys, threading, nbd
uri, export = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
# "together": both connections are open before either sends a request, so
# that their handles overlap however slowly the second thread starts.
together = threading.Barrier(2, timeout=30) if "together" in sys.argv[3:] else None
def client(n):
    h = nbd.NBD()
    h.set_export_name(export)
    h.connect_uri(uri)
    if together:
        together.wait()
    for i in range(32):
        h.aio_pread(nbd.Buffer(4096), (n * 32 + i) * 4096)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    h.shutdown()
ts = [threading.Thread(target=client, args=(n,)) for n in range(2)]
for t in ts: t.start()
for t in ts: t.join()
PY

# stat NAME: a field of the stats the plugin wrote at its last close.
stat() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" stats; }

# model PLUGIN MODEL: run the two clients, leave the stats in ./stats.
# Their connections overlap, except with serialize_connections, where the
# second waits for the first to close.
model() {
    local together=together
    [[ $2 == serialize_connections ]] && together=
    rm -f stats
    start_server --plugin "$1" model="$2" delay=2000 stats="$T/stats"
    run timeout 60 "$PY" clients.py "$URI" "" $together || fail "$2: clients"
    stop_server
    [[ -s stats ]] || fail "$2: no stats"
    echo "  $2: $(cat stats)"
}

check "each thread model is honoured, and no more than asked"
model "$OVERLAP_PLUGIN" parallel
[[ $(stat max_handle) -gt 1 ]] || fail "parallel: calls on one handle never overlapped"
[[ $(stat max_open) -eq 2 ]] || fail "parallel: two handles expected"
model "$OVERLAP_PLUGIN" serialize_requests
[[ $(stat max_handle) -eq 1 ]] || fail "serialize_requests: calls on one handle overlapped"
[[ $(stat max_all) -gt 1 ]] || fail "serialize_requests: the handles' calls never overlapped"
model "$OVERLAP_PLUGIN" serialize_all_requests
[[ $(stat max_all) -eq 1 ]] || fail "serialize_all_requests: calls overlapped"
[[ $(stat max_open) -eq 2 ]] || fail "serialize_all_requests: two handles expected"
model "$OVERLAP_PLUGIN" serialize_connections
[[ $(stat max_all) -eq 1 ]] || fail "serialize_connections: calls overlapped"
[[ $(stat max_open) -eq 1 ]] || fail "serialize_connections: two handles at once"
[[ $(stat calls) -eq 64 ]] || fail "serialize_connections: $(stat calls) calls, not 64"
ok "all four"

check "API version 1: parallel calls, data written and read back"
model "$OVERLAP_PLUGIN_V1" parallel
[[ $(stat max_handle) -gt 1 ]] || fail "v1 parallel: no overlap"
start_server --plugin "$OVERLAP_PLUGIN_V1" delay=0
"$PY" - "$URI" <<'PY' || fail "v1 read back"
import sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 65536, 1 << 20)
h.zero(4096, (1 << 20) + 4096)
d = h.pread(65536, 1 << 20)
assert d[:4096] == b"\x5a" * 4096 and d[4096:8192] == bytes(4096) and \
    d[8192:] == b"\x5a" * (65536 - 8192), "content"
h.flush()
PY
stop_server
ok "v1 pread, pwrite, zero, flush"

check "a plugin's errno reaches the client, its message the log"
start_server --plugin "$OVERLAP_PLUGIN" delay=0 eio_at=8192 enospc_at=65536
"$PY" - "$URI" <<'PY' || fail "errors"
import sys, errno, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
def expect(fn, want):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == want, "got %s, want %s" % (e.errnum, want)
        return
    raise AssertionError("no error")
expect(lambda: h.pread(4096, 8192), errno.EIO)
expect(lambda: h.pwrite(b"x" * 4096, 65536), errno.ENOSPC)
assert h.pread(4096, 0) == bytes(4096)
PY
stop_server
grep -q "read at 8192 fails, as asked" "$T/server.log" || fail "no message in the log"
ok "EIO from errno, ENOSPC from nbdkit_set_error, both logged"

check "FUA without native support: a flush after the write"
rm -f stats
start_server --plugin "$OVERLAP_PLUGIN" delay=0 stats="$T/stats"
"$PY" - "$URI" <<'PY' || fail "fua"
import sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.can_fua()
h.pwrite(b"y" * 4096, 0, nbd.CMD_FLAG_FUA)
h.pwrite(b"y" * 4096, 4096)
h.shutdown()
PY
stop_server
[[ $(stat flushes) -eq 1 ]] || fail "flushes: $(stat flushes)"
ok "one FUA write, one flush"

check "-D NAME.FLAG=N sets the plugin's NAME_debug_FLAG"
rm -f stats
start_server -D overlap.flag=7 --plugin "$OVERLAP_PLUGIN" stats="$T/stats"
nbdinfo --size "$URI" >/dev/null
stop_server
[[ $(stat flag) -eq 7 ]] || fail "flag: $(stat flag)"
ok "overlap_debug_flag = 7"

check "list_exports: NBD_OPT_LIST shows the plugin's exports, each opens"
start_server --plugin "$OVERLAP_PLUGIN" exports=true delay=0
nbdinfo --list --json "$URI" >list.json
"$PY" - <<'PY' || { cat list.json; fail "list"; }
import json
names = [e["export-name"] for e in json.load(open("list.json"))["exports"]]
assert names == ["one", "two"], names
PY
run "$PY" clients.py "$URI" two || fail "export two"
nbdinfo "nbd+unix:///one?socket=$SOCK" | grep -q "description: the first export" ||
    fail "description of one"
stop_server
ok "one, two"

check "a plugin that refuses to open: the client is told, the server goes on"
start_server --plugin "$OVERLAP_PLUGIN" fail=open
if nbdinfo "$URI" >out.txt 2>&1; then fail "open succeeded"; fi
server_alive || fail "the server died"
stop_server
grep -q "refusing to open, as asked" "$T/server.log" || fail "no message"
ok "$(head -1 out.txt)"
