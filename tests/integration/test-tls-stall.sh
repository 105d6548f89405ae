#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# --handshake-timeout covers the TLS handshake too: a client that sends
# NBD_OPT_STARTTLS, reads the ACK and then stalls inside the TLS
# handshake is cut when the handshake's time is up (not after GnuTLS's
# own 40 s), so with --max-connections 2 two such clients hold the slots
# only that long and a real TLS client gets in after them.
TESTS_DIR=$(cd "$(dirname "$0")" && pwd)
source "$TESTS_DIR/lib.sh"
require_feature tls
require psktool nbdinfo
cd "$T"

mkdir psk
psktool -u alice -p psk/keys.psk >/dev/null
PSK=$T/psk/keys.psk
TIMEOUT=3

psk_uri() { echo "nbds+unix://alice@/?socket=$SOCK&tls-psk-file=$PSK"; }

# stall_tls SOCKET N [partial]: N clients each read the greeting, send the
# client flags and NBD_OPT_STARTTLS, read its ACK and send nothing more
# (with partial: the first 5 bytes of a TLS record, then nothing).  Prints
# "ready" once all N have their ACK, then per client the seconds from its
# connect until the server closed it, or "open" if it did not in 15 s.
stall_tls() {
  "$PY" - "$1" "$2" "${3:-}" <<'PYEOF'
import socket, struct, sys, time
IHAVEOPT, REP_MAGIC, OPT_STARTTLS, REP_ACK = 0x49484156454F5054, 0x3E889045565A9, 5, 1

def recv_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            sys.exit("closed before the STARTTLS reply")
        b += got
    return b

clients = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(15)
    t0 = time.monotonic()
    s.connect(sys.argv[1])
    recv_exact(s, 18)                                # the greeting
    s.sendall(struct.pack(">I", 1))                  # fixed newstyle
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_STARTTLS, 0))
    magic, opt, rtype, length = struct.unpack(">QIII", recv_exact(s, 20))
    if (magic, opt, rtype, length) != (REP_MAGIC, OPT_STARTTLS, REP_ACK, 0):
        sys.exit("STARTTLS reply %x %d %x %d" % (magic, opt, rtype, length))
    if sys.argv[3] == "partial":
        s.sendall(b"\x16\x03\x01\x00\x80")  # a handshake record of 128 bytes
    clients.append((s, t0))
print("ready", flush=True)
for s, t0 in clients:
    try:
        while s.recv(4096):
            pass
        print("%.2f" % (time.monotonic() - t0), flush=True)
    except ConnectionResetError:
        print("%.2f" % (time.monotonic() - t0), flush=True)
    except socket.timeout:
        print("open", flush=True)
PYEOF
}

# within T LIMIT: T is a number of seconds no larger than LIMIT.
within() { [[ $1 != open ]] && awk -v t="$1" -v l="$2" 'BEGIN { exit !(t <= l) }'; }

check "--handshake-timeout $TIMEOUT: a client stalled in the TLS handshake is cut in time"
start_server --tls require --tls-psk "$PSK" --handshake-timeout "$TIMEOUT" memory:16M
stall_tls "$SOCK" 1 >one.out || fail "the stalled client could not start TLS"
t=$(sed -n 2p one.out)
within "$t" $((TIMEOUT + 1)) || fail "stalled TLS client cut after $t s, want <= $((TIMEOUT + 1))"
awk -v t="$t" 'BEGIN { exit !(t >= 2.5) }' || fail "stalled TLS client cut after $t s, before the timeout"
grep -q "handshake timed out" "$T/server.log" || fail "no 'handshake timed out' log line"
stall_tls "$SOCK" 1 partial >partial.out || fail "the second stalled client could not start TLS"
t2=$(sed -n 2p partial.out)
within "$t2" $((TIMEOUT + 1)) || fail "client stalled in a TLS record cut after $t2 s"
nbdinfo --size "$(psk_uri)" >/dev/null || fail "a TLS client after the stalled one"
stop_server
ok "cut after $t s; the server serves on"

check "-c 2: two stalled TLS clients hold the slots only until the timeout"
start_server --tls require --tls-psk "$PSK" --handshake-timeout "$TIMEOUT" -c 2 memory:16M
stall_tls "$SOCK" 2 >two.out &
stall_pid=$!
track_pid "$stall_pid"
wait_file 10 two.out "$stall_pid" || fail "the stalled clients could not start TLS"
held_at=$(date +%s%N)
# Both slots are held: a TLS client is refused at once.
if nbdinfo --size "$(psk_uri)" >/dev/null 2>&1; then
  fail "a third client admitted while two hold the slots"
fi
wait_until $((TIMEOUT + 1)) nbdinfo --size "$(psk_uri)" >/dev/null 2>&1 ||
  fail "no TLS client admitted within $((TIMEOUT + 1)) s of the stalled clients"
waited=$((($(date +%s%N) - held_at) / 1000000))
wait "$stall_pid" || fail "the stalled clients' script failed"
while read -r t; do
  within "$t" $((TIMEOUT + 1)) || fail "a stalled client cut after $t s"
done < <(sed 1d two.out)
stop_server
ok "a TLS client admitted ${waited} ms after the slots were taken"
