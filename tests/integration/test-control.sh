#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The control socket (--control PATH, blockport ctl; docs/CONTROL.md):
# serve makes it 0600 and removes it at exit, refuses a live one and
# replaces a stale one; `blockport ctl` prints the answer line and exits 0,
# or 1 with the message on stderr; a raw client sending garbage, a
# non-object, a line over 64 KiB, invalid UTF-8 and NULs, a line in
# pieces, unknown verbs, wrong argument counts, a stalled partial line, a
# 17th client and a client gone mid-line each get the documented JSON
# error or close, and afterwards the server still answers and still
# serves NBD.  mount and vhost take --control too.
source "$(dirname "$0")/lib.sh"
require nbdinfo
cd "$T"

CTL=$T/ctl.sock
# The stall time-out, 30 s in use, made short for this test.
export BLOCKPORT_CONTROL_STALL_MS=1000

########################################################################
check "serve --control: the socket, blockport ctl help and version"
start_server --control "$CTL" memory:16M
[[ -S $CTL ]] || fail "no socket at $CTL"
[[ $(stat -c %a "$CTL") == 600 ]] || fail "mode $(stat -c %a "$CTL"), expected 600"
out=$(run "$BLOCKPORT" ctl "$CTL" version) || fail "ctl version: exit $?"
want=$("$BLOCKPORT" --version | awk 'NR == 1 {print $2}')
[[ $out == "{\"ok\":true,\"version\":\"$want\",\"protocol\":1}" ]] || fail "ctl version: $out"
out=$(run "$BLOCKPORT" ctl "$CTL" help) || fail "ctl help: exit $?"
grep -q '"verb":"help","usage":"help"' <<<"$out" || fail "ctl help: $out"
grep -q '"verb":"version"' <<<"$out" || fail "ctl help: $out"
ok "0600, version $want, help lists help and version"

########################################################################
check "blockport ctl: errors on stderr, exit 1"
rc=0
run "$BLOCKPORT" ctl "$CTL" frobnicate a b >out.txt 2>err.txt || rc=$?
((rc == 1)) || fail "unknown verb: exit $rc"
grep -q '"ok":false' out.txt && grep -q '"errno":"ENOSYS"' out.txt || fail "unknown verb: $(cat out.txt)"
grep -qx "blockport ctl: $CTL: unknown verb 'frobnicate' (try help)" err.txt ||
    fail "unknown verb: stderr $(cat err.txt)"
rc=0
run "$BLOCKPORT" ctl "$CTL" version extra >out.txt 2>err.txt || rc=$?
((rc == 1)) && grep -q "version takes 0 arguments, not 1" err.txt ||
    fail "wrong count: exit $rc, $(cat err.txt)"
rc=0
run "$BLOCKPORT" ctl "$T/nothing.sock" version >out.txt 2>err.txt || rc=$?
((rc == 1)) && grep -q "^blockport ctl: $T/nothing.sock: No such file" err.txt ||
    fail "no socket: exit $rc, $(cat err.txt)"
[[ ! -s out.txt ]] || fail "no socket: something on stdout"
ok "unknown verb, wrong count, no socket"

########################################################################
check "a second process refuses the live socket"
rc=0
run "$BLOCKPORT" serve --unix "$T/sock2" --control "$CTL" memory:1M >out.txt 2>&1 || rc=$?
((rc == 1)) && grep -q "another process is listening there" out.txt ||
    fail "second server: exit $rc, $(cat out.txt)"
[[ -S $CTL ]] || fail "the refused start removed the live socket"
ok "exit 1, the first one's socket kept"

########################################################################
check "a raw client: bad requests get JSON errors, the server stays up"
"$PY" - "$CTL" <<'PYEOF' || fail "raw client checks failed"
import json, socket, sys, time
path = sys.argv[1]

def connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    f = s.makefile("rb")
    g = json.loads(f.readline())
    assert g["protocol"] == 1 and "version" in g["verbs"], g
    return s, f

def close(s, f):
    f.close()  # the socket is closed only once its file is too
    s.close()

def ask(s, f, data):
    s.sendall(data)
    line = f.readline()
    assert line.endswith(b"\n"), ("no answer line", data[:80], line)
    return json.loads(line)

def expect_error(ans, errno, text, what):
    if ans.get("ok") is not False or ans.get("errno") != errno or text not in ans.get("error", ""):
        sys.exit("%s: %r" % (what, ans))

s, f = connect()
expect_error(ask(s, f, b"garbage\n"), "EINVAL", "malformed request", "garbage")
expect_error(ask(s, f, b"[\"version\"]\n"), "EINVAL", "a request is a JSON object", "an array")
expect_error(ask(s, f, b"{\"args\":[]}\n"), "EINVAL", "no \"verb\"", "no verb")
expect_error(ask(s, f, b"{\"verb\":\"v\xff\xfe\"}\n"), "EINVAL", "invalid UTF-8", "bad UTF-8")
expect_error(ask(s, f, b"\x00\x01\x02{\x00}\n"), "EINVAL", "malformed request", "NULs")
expect_error(ask(s, f, b"{\"verb\":\"a\\u0000b\"}\n"), "EINVAL", "\\u0000", "escaped NUL")
ans = ask(s, f, b"{\"verb\":\"nope\",\"id\":[1,\"x\"]}\n")
expect_error(ans, "ENOSYS", "unknown verb 'nope'", "unknown verb")
assert ans["id"] == [1, "x"], ans
expect_error(ask(s, f, b"{\"verb\":\"help\",\"args\":[\"x\"],\"id\":5}\n"), "EINVAL",
             "help takes 0 arguments, not 1", "wrong count")
# Over 64 KiB: one error, the rest of that line dropped, the next served.
ans = ask(s, f, b"{\"verb\":\"version\",\"pad\":\"" + b"x" * 70000 + b"\"}\n")
expect_error(ans, "EMSGSIZE", "longer than 65536", "huge line")
ans = ask(s, f, b"{\"verb\":\"version\",\"id\":\"after\"}\n")
assert ans["ok"] and ans["id"] == "after", ans
# A line in pieces; a newer client's unknown member; CRLF.
for piece in [b"{\"ver", b"b\":\"vers", b"ion\",\"future\":{\"x\":[]}", b",\"id\":2}\r"]:
    s.sendall(piece)
    time.sleep(0.05)  # separate reads on the server's side
ans = ask(s, f, b"\n")
assert ans["ok"] and ans["id"] == 2 and ans["protocol"] == 1, ans
# Two requests in one send: two answers, in order.
s.sendall(b"{\"verb\":\"version\",\"id\":3}\n{\"verb\":\"help\",\"id\":4}\n")
a, b = json.loads(f.readline()), json.loads(f.readline())
assert a["id"] == 3 and b["id"] == 4 and "verbs" in b, (a, b)
# A partial line that stalls: an ETIMEDOUT error, then the close.
s.sendall(b"{\"verb\":")
t0 = time.monotonic()
expect_error(json.loads(f.readline()), "ETIMEDOUT", "incomplete", "stall")
assert f.readline() == b"", "still open after the stall"
assert time.monotonic() - t0 < 5, "the stall took %.1f s" % (time.monotonic() - t0)
close(s, f)

# Clients that leave mid-line, mid-answer, or right away.
for data in [b"{\"verb\":\"vers", b"\xff" * 100000, b""]:
    s, f = connect()
    if data:
        s.sendall(data)
    close(s, f)
s, f = connect()
s.sendall(b"{\"verb\":\"help\"}\n" * 200)  # answers nobody reads
close(s, f)

def try_connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    f = s.makefile("rb")
    if "protocol" in json.loads(f.readline()):
        return s, f
    close(s, f)
    return None

# At most 16 clients: the 17th gets an EBUSY line and a close.  (The
# clients above leave their slots once the server has seen them go.)
deadline = time.monotonic() + 5
while True:
    held = [try_connect() for _ in range(16)]
    if all(held):
        break
    for c in held:
        if c:
            close(*c)
    assert time.monotonic() < deadline, "16 clients not admitted within 5 s"
    time.sleep(0.05)
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(path)
f = s.makefile("rb")
expect_error(json.loads(f.readline()), "EBUSY", "too many control clients", "17th")
assert f.readline() == b""
close(s, f)
for c in held:
    close(*c)

# The slots free as the clients leave.
deadline = time.monotonic() + 5
while not (c := try_connect()):
    assert time.monotonic() < deadline, "no slot free 5 s after the clients left"
    time.sleep(0.05)
s, f = c
assert ask(s, f, b"{\"verb\":\"version\"}\n")["ok"]
print("raw client: all cases answered as documented")
PYEOF
out=$(run "$BLOCKPORT" ctl "$CTL" version) || fail "ctl version after the raw client: exit $?"
run nbdinfo --size "$URI" | grep -qx 16777216 || fail "nbdinfo after the raw client"
ok "every case a JSON error or a close; version and NBD still answered"

########################################################################
check "the socket is removed at exit; a stale one is replaced"
stop_server
[[ ! -e $CTL ]] || fail "$CTL left behind"
"$PY" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$CTL"
[[ -S $CTL ]] || fail "could not make a stale socket"
start_server --control "$CTL" memory:1M
run "$BLOCKPORT" ctl "$CTL" version >/dev/null || fail "ctl version on the replaced socket"
stop_server
[[ ! -e $CTL ]] || fail "$CTL left behind"
: >"$T/plain"
rc=0
run "$BLOCKPORT" serve --unix "$T/sock3" --control "$T/plain" memory:1M >out.txt 2>&1 || rc=$?
((rc == 1)) && grep -q "exists and is not a socket" out.txt || fail "a plain file: exit $rc, $(cat out.txt)"
[[ -f $T/plain ]] || fail "the plain file was removed"
ok "removed at exit, stale socket replaced, a plain file left alone"

########################################################################
check "mount --control"
if ! can_mount; then
    skip_case "no FUSE (in blockport), /dev/fuse or fusermount3: mount --control not tried"
else
    mkdir mnt
    rm -f mount.pid
    "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P "$T/mount.pid" \
        --control mctl.sock memory:4M mnt </dev/null >>mount.log 2>&1 &
    MOUNT_PID=$!
    track_pid "$MOUNT_PID"
    wait_file 10 mount.pid "$MOUNT_PID" || { cat mount.log; fail "the mount did not start"; }
    [[ $(stat -c %a mctl.sock) == 600 ]] || fail "mount's socket mode"
    run "$BLOCKPORT" ctl mctl.sock version >/dev/null || fail "ctl version to mount"
    fusermount3 -u mnt
    wait_until 10 _pid_gone "$MOUNT_PID" || fail "mount did not exit"
    rc=0
    wait "$MOUNT_PID" || rc=$?
    ((rc == 0)) || { cat mount.log; fail "mount exited $rc"; }
    [[ ! -e mctl.sock ]] || fail "mount left its control socket"
    ok "mount answers version and removes its socket"
fi

########################################################################
if has_feature vhost; then
    check "vhost --control"
    rm -f vhost.pid
    "${_env_reset[@]}" "$BLOCKPORT" vhost --socket "$T/vhost.sock" -P "$T/vhost.pid" \
        --control "$T/vctl.sock" memory:1M </dev/null >>vhost.log 2>&1 &
    VHOST_PID=$!
    track_pid "$VHOST_PID"
    wait_file 10 vhost.pid "$VHOST_PID" || { cat vhost.log; fail "vhost did not start"; }
    [[ $(stat -c %a "$T/vctl.sock") == 600 ]] || fail "vhost's socket mode"
    run "$BLOCKPORT" ctl "$T/vctl.sock" version >/dev/null || fail "ctl version to vhost"
    kill -TERM "$VHOST_PID"
    wait_until 10 _pid_gone "$VHOST_PID" || fail "vhost did not exit"
    rc=0
    wait "$VHOST_PID" || rc=$?
    ((rc == 0)) || { cat vhost.log; fail "vhost exited $rc"; }
    [[ ! -e $T/vctl.sock ]] || fail "vhost left its control socket"
    ok "vhost answers version and removes its socket"
else
    skip_case "blockport was built without vhost"
fi
