#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Misbehaving clients must not take the server down: clients that close
# mid-handshake, send garbage during option haggling or after a valid
# handshake, vanish with requests in flight, or stall.  After each case the
# server must still be alive and serve a fresh qemu-img / nbdinfo client,
# and at the end it must still exit 0 on SIGTERM (no crash, no leak report).
source "$(dirname "$0")/lib.sh"
require nbdinfo qemu-img
require_py_nbd

SIZE=$((64 * 1024 * 1024))
random_file "$T/disk.img" 64
cp "$T/disk.img" "$T/orig.img"
start_server "$T/disk.img" "mem=memory:$SIZE"

cat >"$T/evil.py" <<'EOF'
import errno, os, signal, socket, struct, sys, time
import nbd

path, case = sys.argv[1], sys.argv[2]

NBDMAGIC = 0x4e42444d41474943
IHAVEOPT = 0x49484156454f5054
REPMAGIC = 0x3e889045565a9
REQMAGIC = 0x25609513
SIMPLE_REPLY = 0x67446698
OPT_ABORT, OPT_GO = 2, 7
CMD_READ, CMD_WRITE, CMD_DISC = 0, 1, 2

def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s

def recvall(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("EOF after %d of %d bytes" % (len(b), n))
        b += c
    return b

def greeting(s):
    magic, opt, flags = struct.unpack(">QQH", recvall(s, 18))
    assert magic == NBDMAGIC and opt == IHAVEOPT, "bad greeting %x %x" % (magic, opt)
    assert flags & 1, "server is not fixed newstyle (flags %#x)" % flags
    return flags

def send_opt(s, opt, data=b""):
    s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)

def read_rep(s):
    magic, opt, typ, ln = struct.unpack(">QIII", recvall(s, 20))
    assert magic == REPMAGIC, "bad option reply magic %#x" % magic
    return opt, typ, recvall(s, ln)

def handshake(s, name=b""):
    greeting(s)
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    send_opt(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    while True:
        opt, typ, data = read_rep(s)
        assert opt == OPT_GO, "reply for option %d" % opt
        if typ & 0x80000000:
            raise AssertionError("NBD_OPT_GO failed: %#x %r" % (typ, data))
        if typ == 1:  # ACK
            return

def request(s, typ, handle, off, ln, flags=0, payload=b""):
    s.sendall(struct.pack(">IHHQQI", REQMAGIC, flags, typ, handle, off, ln) + payload)

def simple_reply(s):
    magic, err, handle = struct.unpack(">IIQ", recvall(s, 16))
    assert magic == SIMPLE_REPLY, "bad reply magic %#x" % magic
    return err, handle

def expect_close(s, what, timeout=5):
    """The server must close the connection (EOF or reset) promptly."""
    s.settimeout(timeout)
    got = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            got += c
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise SystemExit("%s: server did not close the connection within %ds" % (what, timeout))
    print("  %s: server closed the connection (%d bytes before EOF)" % (what, len(got)))

def say(m):
    print("  " + m, flush=True)

if case == "close-immediately":
    for _ in range(20):
        conn().close()
    say("20 connect+close")
elif case == "close-after-greeting":
    for _ in range(10):
        s = conn(); greeting(s); s.close()
    say("10 closes after the greeting")
elif case == "close-after-flags":
    for _ in range(10):
        s = conn(); greeting(s); s.sendall(struct.pack(">I", 3)); s.close()
    say("10 closes after client flags")
elif case == "partial-option":
    s = conn(); greeting(s); s.sendall(struct.pack(">I", 3))
    s.sendall(struct.pack(">Q", IHAVEOPT) + b"\0\0"); s.close()
    s = conn(); greeting(s); s.sendall(struct.pack(">I", 3))
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, 100) + b"x" * 10); s.close()
    say("closed inside an option header / option payload")
elif case == "bad-client-flags":
    s = conn(); greeting(s)
    s.sendall(struct.pack(">I", 0xfffffff0))
    expect_close(s, "unknown client flags")
elif case == "bad-option-magic":
    s = conn(); greeting(s); s.sendall(struct.pack(">I", 3))
    s.sendall(struct.pack(">QII", 0x1122334455667788, OPT_GO, 0))
    expect_close(s, "bad option magic")
elif case == "huge-option":
    s = conn(); greeting(s); s.sendall(struct.pack(">I", 3))
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, 0xfffffff0))
    s.settimeout(5)
    try:
        opt, typ, data = read_rep(s)
        say("huge option length: reply type %#x" % typ)
        assert typ & 0x80000000, "huge option accepted (reply %#x)" % typ
    except (EOFError, ConnectionResetError):
        say("huge option length: connection closed")
    except socket.timeout:
        say("huge option length: no reply within 5s (server waits for the payload)")
    s.close()
elif case == "opt-abort":
    s = conn(); greeting(s); s.sendall(struct.pack(">I", 3))
    send_opt(s, OPT_ABORT)
    expect_close(s, "NBD_OPT_ABORT")
elif case == "garbage-after-handshake":
    s = conn(); handshake(s)
    request(s, CMD_READ, 0x1234, 0, 512)
    err, h = simple_reply(s)
    assert err == 0 and h == 0x1234, "valid read failed: err %d handle %#x" % (err, h)
    recvall(s, 512)
    s.sendall(b"\xde\xad\xbe\xef" * 7)  # 28 bytes, bad request magic
    expect_close(s, "bad request magic")
elif case == "random-garbage":
    s = conn(); handshake(s)
    try:
        s.sendall(os.urandom(65536))
    except (BrokenPipeError, ConnectionResetError):
        pass
    expect_close(s, "64 KiB of random bytes")
elif case == "unknown-command":
    s = conn(); handshake(s)
    request(s, 0x55, 7, 0, 0)
    s.settimeout(5)
    try:
        err, h = simple_reply(s)
        assert h == 7, "handle %d" % h
        assert err == errno.EINVAL, "unknown command: error %d, expected EINVAL" % err
        request(s, CMD_READ, 8, 4096, 4096)
        err, h = simple_reply(s)
        assert err == 0 and h == 8
        recvall(s, 4096)
        say("unknown command -> EINVAL, connection still usable")
    except (EOFError, ConnectionResetError):
        say("unknown command: server closed the connection")
    s.close()
elif case == "truncated-write":
    s = conn(); handshake(s)
    request(s, CMD_WRITE, 9, 0, 1 << 20, payload=b"y" * 100)
    s.close()
    say("closed in the middle of a 1 MiB write payload")
elif case == "oversized-write":
    s = conn(); handshake(s)
    # 64 MiB payload announced: more than the 32 MiB maximum.
    request(s, CMD_WRITE, 10, 0, 64 << 20, payload=b"z" * 4096)
    s.settimeout(5)
    try:
        err, h = simple_reply(s)
        assert err != 0, "oversized write accepted"
        say("oversized write -> error %d" % err)
    except (EOFError, ConnectionResetError, BrokenPipeError):
        say("oversized write: server closed the connection")
    except socket.timeout:
        say("oversized write: no reply within 5s")
    s.close()
elif case == "reads-not-drained":
    # Pipeline many large reads and never read the replies; then vanish.
    for _ in range(3):
        s = conn(); handshake(s)
        # The server stops reading once its replies back up (flow control),
        # so our sends eventually block: give up after a short timeout.
        s.settimeout(0.5)
        for i in range(200):
            try:
                request(s, CMD_READ, i, (i * (1 << 20)) % (32 << 20), 1 << 20)
            except (BrokenPipeError, ConnectionResetError, socket.timeout):
                break
        s.close()
    say("3 clients queued 200 x 1 MiB reads and vanished without reading")
elif case == "disc":
    s = conn(); handshake(s)
    request(s, CMD_DISC, 11, 0, 0)
    expect_close(s, "NBD_CMD_DISC")
elif case == "vanish-in-flight":
    # A libnbd client with many writes and reads in flight kills itself.
    pid = os.fork()
    if pid == 0:
        try:
            h = nbd.NBD()
            h.connect_uri(sys.argv[3])
            buf = os.urandom(1 << 20)
            for i in range(48):
                h.aio_pwrite(buf, i << 20)
                h.aio_pread(nbd.Buffer(1 << 20), (i + 8) << 20)
            for _ in range(5):
                h.poll(0)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    say("client killed with 96 x 1 MiB requests in flight")
elif case == "stalled-handshakes":
    # Many clients stall mid-handshake; meanwhile a real client must work.
    held = []
    for i in range(40):
        s = conn()
        if i % 2:
            greeting(s)
            s.sendall(struct.pack(">I", 3))
        held.append(s)
    h = nbd.NBD()
    h.connect_uri(sys.argv[3])
    h.pread(4096, 0)
    h.shutdown()
    say("libnbd client served while 40 clients stall in the handshake")
    for s in held:
        s.close()
else:
    raise SystemExit("unknown case " + case)
EOF

alive_and_serving() {
    server_alive || fail "server died after case '$1'"
    local sz
    sz=$(run nbdinfo --size "$URI") || fail "nbdinfo failed after case '$1'"
    [[ $sz == "$SIZE" ]] || fail "nbdinfo --size $sz after case '$1'"
    run qemu-img info -f raw "$(export_uri mem)" >/dev/null || fail "qemu-img info failed after case '$1'"
    ok "server alive, nbdinfo + qemu-img work after '$1'"
}

for c in close-immediately close-after-greeting close-after-flags partial-option \
    bad-client-flags bad-option-magic huge-option opt-abort \
    garbage-after-handshake random-garbage unknown-command truncated-write \
    oversized-write reads-not-drained disc vanish-in-flight stalled-handshakes; do
    check "misbehaving client: $c"
    run "$PY" "$T/evil.py" "$SOCK" "$c" "$URI" || fail "case $c failed"
    alive_and_serving "$c"
done

check "several clients killed with requests in flight, concurrently"
pids=()
for i in 1 2 3 4 5; do
    timeout 60 "$PY" "$T/evil.py" "$SOCK" vanish-in-flight "$(export_uri mem)" &
    pids+=($!)
    track_pid $!
done
for p in "${pids[@]}"; do
    wait "$p" || fail "a concurrent vanish-in-flight client failed"
done
alive_and_serving "concurrent vanish-in-flight"

check "data of the default export is intact (nothing above wrote to it except truncated/oversized writes)"
# vanish-in-flight wrote complete 1 MiB blocks to the first 48 MiB of the
# default export; compare the untouched tail only, plus make sure reads work.
run qemu-img compare -U -f raw -F raw "$URI" "$T/disk.img" ||
    fail "export content differs from its backing file as seen by qemu-img"
cmp -s -i $((48 << 20)) "$T/disk.img" "$T/orig.img" ||
    fail "bytes beyond 48 MiB of the default export changed"
ok "content consistent"

stop_server

########################################################################
check "--max-connections 2: a third client is refused promptly, a slot frees up after a disconnect"
start_server --max-connections 2 "memory:$SIZE"
run "$PY" - "$URI" <<'EOF' || fail "max-connections behaviour wrong"
import subprocess, sys, time
import nbd
uri = sys.argv[1]
held = []
for i in range(2):
    h = nbd.NBD(); h.connect_uri(uri); h.pread(512, 0); held.append(h)
print("  2 clients connected", flush=True)
t0 = time.time()
third = nbd.NBD()
try:
    third.connect_uri(uri)
    third.pread(512, 0)
    raise SystemExit("third client was served despite --max-connections 2")
except nbd.Error as e:
    print("  third client refused after %.2fs: %s" % (time.time() - t0, e), flush=True)
if time.time() - t0 > 10:
    raise SystemExit("refusal took too long")
held.pop().shutdown()
deadline = time.time() + 5
while True:
    try:
        h = nbd.NBD(); h.connect_uri(uri); h.pread(512, 0); h.shutdown()
        break
    except nbd.Error as e:
        if time.time() > deadline:
            raise SystemExit("no slot after a client disconnected: %s" % e)
        time.sleep(0.1)
print("  new client served after one disconnected", flush=True)
held.pop().shutdown()
EOF
server_alive || fail "server died in the max-connections test"
ok "max-connections enforced"
stop_server
echo "PASS"
