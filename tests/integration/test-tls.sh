#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# TLS (NBD_OPT_STARTTLS) with pre-shared keys and X.509 certificates:
# QEMU and libnbd clients, --tls on|require, wrong keys and untrusted
# certificates refused while the server stays up, nothing of an export in
# the clear under require, nbds:// URIs through the NBD source, and SIGHUP
# reloading the certificates (a CRL, a new CA) for new clients only.
TESTS_DIR=$(cd "$(dirname "$0")" && pwd)
source "$TESTS_DIR/lib.sh"
require_feature tls
require psktool certtool nbdinfo qemu-img qemu-io
require_py_nbd
cd "$T"

# ---- keys and certificates, made fresh for this run ----

mkdir psk badpsk
psktool -u alice -p psk/keys.psk >/dev/null
psktool -u alice -p badpsk/keys.psk >/dev/null # same user, another key
PSK=$T/psk/keys.psk

# cert NAME CA_DIR TEMPLATE...: a key and certificate signed by CA_DIR.
cert() {
  local name=$1 ca=$2
  shift 2
  printf '%s\n' "$@" expiration_days=2 >"$name.info"
  certtool --generate-privkey --outfile "$name-key.pem" 2>/dev/null
  certtool --generate-certificate --load-privkey "$name-key.pem" \
    --load-ca-certificate "$ca/ca-cert.pem" --load-ca-privkey "$ca/ca-key.pem" \
    --template "$name.info" --outfile "$name-cert.pem" 2>/dev/null
}
# ca DIR: a self-signed CA in DIR.
ca() {
  mkdir -p "$1"
  printf '%s\n' "cn = blockport test CA $1" ca cert_signing_key \
    expiration_days=2 >"$1/ca.info"
  certtool --generate-privkey --outfile "$1/ca-key.pem" 2>/dev/null
  certtool --generate-self-signed --load-privkey "$1/ca-key.pem" \
    --template "$1/ca.info" --outfile "$1/ca-cert.pem" 2>/dev/null
}
ca ca
ca otherca
cert server ca "cn = localhost" "dns_name = localhost" \
  "ip_address = 127.0.0.1" tls_www_server encryption_key signing_key
cert client ca "cn = alice" tls_www_client encryption_key signing_key
cert rogue otherca "cn = mallory" tls_www_client encryption_key signing_key
# What the server reads (--tls-certs) and what each client is given.
mkdir srv cli clinocert clirogue cliuntrusting
cp ca/ca-cert.pem server-cert.pem server-key.pem srv/
cp ca/ca-cert.pem cli/ && cp client-cert.pem cli/client-cert.pem &&
  cp client-key.pem cli/client-key.pem
cp ca/ca-cert.pem clinocert/
cp ca/ca-cert.pem clirogue/ && cp rogue-cert.pem clirogue/client-cert.pem &&
  cp rogue-key.pem clirogue/client-key.pem
cp otherca/ca-cert.pem cliuntrusting/
ok "keys and certificates generated"

# ---- clients ----

# The libnbd URI of the running Unix-socket server, with TLS.
psk_uri() { echo "nbds+unix://alice@/?socket=$SOCK&tls-psk-file=${1:-$PSK}"; }
x509_uri() { echo "nbds+unix:///?socket=$SOCK&tls-certificates=$T/$1"; }
# qemu-io through QEMU's TLS: qio_psk DIR CMD... / qio_x509 DIR CMD...
qio_psk() {
  local dir=$1
  shift
  run qemu-io --object "tls-creds-psk,id=t0,endpoint=client,dir=$dir,username=alice" \
    --image-opts "driver=nbd,server.type=unix,server.path=$SOCK,tls-creds=t0" "$@"
}
qio_x509() {
  local dir=$1
  shift
  run qemu-io --object "tls-creds-x509,id=t0,endpoint=client,dir=$T/$dir" \
    --image-opts "driver=nbd,server.type=unix,server.path=$SOCK,tls-creds=t0,tls-hostname=localhost" "$@"
}
# Expect a client command to fail, and the server to survive it.
refused() {
  local what=$1
  shift
  if "$@" >refused.out 2>&1; then
    cat refused.out
    fail "$what: the connection was accepted"
  fi
  server_alive || fail "$what: the server died"
  ok "$what: refused, server still up"
}

# ---- configuration errors ----

check "TLS options that cannot work are refused at startup"
for args in "--tls on" "--tls require" "--tls-psk $PSK" "--tls maybe --tls-psk $PSK" \
  "--tls on --tls-verify-peer --tls-psk $PSK"; do
  rc=0
  # shellcheck disable=SC2086
  "$BLOCKPORT" serve --unix "$T/x.sock" $args null:1M 2>err.txt || rc=$?
  [[ $rc -eq 1 ]] || { cat err.txt; fail "serve $args: exit $rc, want 1"; }
done
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --tls on --tls-psk "$T/none.psk" null:1M \
  2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q none.psk err.txt || { cat err.txt; fail "missing PSK file: exit $rc"; }
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" --tls on --tls-certs "$T/cli" null:1M \
  2>err.txt || rc=$?
[[ $rc -eq 1 ]] && grep -q server-cert.pem err.txt || { cat err.txt; fail "no server cert: exit $rc"; }
ok "usage errors exit 2, unusable credentials exit 1 naming the file"

# ---- PSK, --tls require ----

check "PSK, --tls require: libnbd and QEMU clients over TLS"
start_server --tls require --tls-psk "$PSK" memory:128M
nbdinfo "$(psk_uri)" >info.txt || fail "nbdinfo over TLS"
grep -q "with TLS" info.txt || { cat info.txt; fail "nbdinfo did not use TLS"; }
grep -q "export-size: 134217728" info.txt || fail "size over TLS"
qio_psk "$T/psk" -c 'write -P 0x5a 1M 8M' -c 'write -P 0x33 20M 64k' >/dev/null ||
  fail "qemu-io write over TLS"
qio_psk "$T/psk" -c 'read -P 0x5a 1M 8M' -c 'read -P 0x33 20M 64k' \
  -c 'read -P 0 0 1M' >/dev/null || fail "qemu-io reads back over TLS"
run qemu-img info --object "tls-creds-psk,id=t0,endpoint=client,dir=$T/psk,username=alice" \
  --image-opts "driver=nbd,server.type=unix,server.path=$SOCK,tls-creds=t0" >qinfo.txt ||
  fail "qemu-img info over TLS"
grep -q "128 MiB" qinfo.txt || { cat qinfo.txt; fail "qemu-img info size"; }
# Many requests in flight, large and small, over one TLS connection.
"$PY" - "$(psk_uri)" <<'EOF' || fail "libnbd parallel I/O over TLS"
import nbd, os, sys
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
assert h.get_tls_negotiated()
blobs = {}
for i in range(64):
    size = 4096 if i % 2 else 1 << 20
    off = 48 * 1024 * 1024 + i * (1 << 20)
    blobs[off] = os.urandom(size)
cookies = [h.aio_pwrite(b, off) for off, b in blobs.items()]
while h.aio_in_flight() > 0:
    h.poll(-1)
bufs = {off: nbd.Buffer(len(b)) for off, b in blobs.items()}
for off, buf in bufs.items():
    h.aio_pread(buf, off)
while h.aio_in_flight() > 0:
    h.poll(-1)
for off, b in blobs.items():
    assert bufs[off].to_bytearray() == b, off
h.flush()
h.shutdown()
EOF
ok "nbdinfo, qemu-img, qemu-io and 128 parallel libnbd requests over TLS"

check "--tls require: a plain client gets TLS_REQD and never an export"
refused "nbdinfo without TLS" nbdinfo "nbd+unix:///?socket=$SOCK"
LIBNBD_DEBUG=1 nbdinfo "nbd+unix:///?socket=$SOCK" >dbg.txt 2>&1 || true
grep -q "TLS is required" dbg.txt || { tail dbg.txt; fail "libnbd did not see the TLS_REQD message"; }
refused "qemu-io without TLS" run qemu-io -f raw -c 'read 0 4k' "nbd+unix:///?socket=$SOCK"
"$PY" - "$SOCK" "$TESTS_DIR" <<'EOF' || fail "raw protocol under --tls require"
import sys
sys.path.insert(0, sys.argv[2])
import nbdwire as nw
def client():
    c = nw.Client.unix(sys.argv[1])
    c.handshake()
    return c
with client() as c:
    for name, f in [("LIST", c.opt_list), ("INFO", c.opt_info), ("GO", c.opt_go),
                    ("STRUCTURED_REPLY", c.opt_structured_reply),
                    ("EXTENDED_HEADERS", c.opt_extended_headers),
                    ("LIST_META_CONTEXT", c.opt_list_meta_context)]:
        r = f()
        assert r.type == nw.NBD_REP_ERR_TLS_REQD, (name, r)
    assert not c.structured and not c.transmission
    r = c.opt_abort()
    assert r is not None and r.type == nw.NBD_REP_ACK, r
with client() as c:
    try:
        c.opt_export_name("")
        raise SystemExit("EXPORT_NAME without TLS entered transmission")
    except nw.Closed:
        pass
with client() as c:
    r = c.option(nw.NBD_OPT_STARTTLS, b"x")
    assert r.type == nw.NBD_REP_ERR_INVALID, r
EOF
server_alive || fail "server died"
ok "TLS_REQD for every option, EXPORT_NAME closes, ABORT acked"

check "a wrong PSK and an unknown user are refused; the server stays up"
refused "wrong key" nbdinfo "$(psk_uri "$T/badpsk/keys.psk")"
refused "wrong key (QEMU)" qio_psk "$T/badpsk" -c 'read 0 4k'
sed 's/^alice:/bob:/' psk/keys.psk >bob.psk
refused "unknown user" nbdinfo "nbds+unix://bob@/?socket=$SOCK&tls-psk-file=$T/bob.psk"
grep -q "TLS handshake failed" "$T/server.log" || fail "no log line for the failed handshake"
"$PY" - "$SOCK" "$TESTS_DIR" <<'EOF' || fail "garbage instead of a TLS handshake"
import sys
sys.path.insert(0, sys.argv[2])
import nbdwire as nw
with nw.Client.unix(sys.argv[1]) as c:
    c.handshake()
    assert c.opt_starttls().type == nw.NBD_REP_ACK
    c.send_raw(b"IHAVEOPT" + bytes(200))  # plain NBD where TLS must be
    closed, _ = c.drain_until_closed(wait=10)
    assert closed, "the server kept a connection that failed its TLS handshake"
with nw.Client.unix(sys.argv[1]) as c:  # a client that leaves mid-handshake
    c.handshake()
    assert c.opt_starttls().type == nw.NBD_REP_ACK
EOF
qio_psk "$T/psk" -c 'read -P 0x5a 1M 8M' >/dev/null || fail "good client after bad ones"
ok "refused with a log line; good clients still served"

check "SIGTERM with a TLS client connected: an orderly exit"
"$PY" - "$(psk_uri)" <<'EOF' &
import nbd, sys, time
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
h.pread(4096, 0)
open("idle.ready", "w").close()
time.sleep(30)
EOF
IDLE_PID=$!
track_pid $IDLE_PID
wait_until 10 test -e idle.ready || fail "the idle TLS client did not connect"
stop_server
ok "the server left its idle TLS client and exited 0"
start_server --tls require --tls-psk "$PSK" memory:128M
qio_psk "$T/psk" -c 'write -P 0x5a 1M 8M' -c 'write -P 0x33 20M 64k' >/dev/null ||
  fail "qemu-io write over TLS (restarted server)"

check "nbds+unix:// through the NBD source: a blockport server in front"
BACK_SOCK=$SOCK
"$BLOCKPORT" serve --unix "$T/front.sock" --pid-file "$T/front.pid" \
  "$(psk_uri)" 2>"$T/front.log" &
FRONT_PID=$!
track_pid $FRONT_PID
wait_file 10 "$T/front.pid" $FRONT_PID || { cat "$T/front.log"; fail "front server did not start"; }
FRONT="nbd+unix:///?socket=$T/front.sock"
run qemu-io -f raw -c 'read -P 0x5a 1M 8M' -c 'write -P 0x77 40M 2M' "$FRONT" \
  >/dev/null || fail "I/O through the front server"
qio_psk "$T/psk" -c 'read -P 0x77 40M 2M' >/dev/null ||
  fail "the write through the NBD source did not reach the TLS server"
kill "$FRONT_PID"
wait "$FRONT_PID" || fail "front server exit status"
check_sanitizer_reports "$T/front.log"
run "$BLOCKPORT" convert -O raw "$(psk_uri)" copy.raw || fail "convert from nbds://"
run qemu-io -f raw -c 'read -P 0x77 40M 2M' copy.raw >/dev/null || fail "converted data"
rc=0
"$BLOCKPORT" serve --unix "$T/x.sock" "$(psk_uri "$T/badpsk/keys.psk")" 2>err.txt || rc=$?
[[ $rc -eq 1 ]] || { cat err.txt; fail "nbds:// with a wrong key: exit $rc"; }
ok "serve and convert reach a TLS server through nbds+unix://"

if can_mount && [[ $(id -u) -eq 0 ]]; then
  check "blockport mount of an nbds+unix:// URI"
  MNT=$T/mnt
  mkdir -p "$MNT"
  "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid "$(psk_uri)" \
    "$MNT" </dev/null >mount.log 2>&1 &
  track_pid $!
  wait_file 15 mount.pid $! || { cat mount.log; fail "mount over TLS not live"; }
  cmp -n $((2 << 20)) -i $((40 << 20)):0 "$MNT/disk" <(head -c $((2 << 20)) /dev/zero | tr '\0' 'w') ||
    fail "mounted disk content"
  fusermount3 -u "$MNT" || fail "unmount"
  ok "mounted and read over TLS"
else
  skip_case "no FUSE here (needs it in blockport, /dev/fuse, root, fusermount3): no mount over TLS"
fi

check "blockport vhost of an nbds+unix:// URI (a vhost-user front end in Python)"
"${_env_reset[@]}" "$BLOCKPORT" vhost --socket "$T/vhost.sock" --pid-file vhost.pid \
  --once "$(psk_uri)" </dev/null >vhost.log 2>&1 &
VHOST_PID=$!
track_pid $VHOST_PID
wait_file 10 vhost.pid $VHOST_PID || { cat vhost.log; fail "vhost over TLS did not start"; }
"$PY" - "$T/vhost.sock" "$TESTS_DIR" <<'PYEOF' || { cat vhost.log; fail "vhost I/O over TLS"; }
import sys
sys.path.insert(0, sys.argv[2])
import vhostuser as vu
fe = vu.Frontend(sys.argv[1])
features = fe.negotiate()
fe.set_u64(vu.SET_FEATURES, features)
g = vu.Guest()
q = vu.Queue(g, 0, 128)
fe.set_mem_table(g)
fe.start_queue(q, features)
blk = vu.BlkDriver(q)
sector = (40 << 20) // 512
st, n = blk.run(0, vu.T_IN, sector, nbytes=8192)
assert st == vu.S_OK, st
assert g.read(blk.slot_data(0), 8192) == b"\x77" * 8192, "data read over TLS"
data = bytes(range(256)) * 32
assert blk.run(1, vu.T_OUT, sector + 64, data=data)[0] == vu.S_OK
assert blk.run(2, vu.T_FLUSH, 0)[0] == vu.S_OK
fe.close()
PYEOF
wait "$VHOST_PID" || fail "vhost --once exit status"
qio_psk "$T/psk" -c "read -P 0x77 40M 8k" -c "read -v $(((40 << 20) + 32768)) 16" \
  | grep -q "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f" ||
  fail "the guest's write did not reach the TLS server"
check_sanitizer_reports vhost.log
ok "a guest's reads and writes through vhost reach the server over TLS"
stop_server

# ---- X.509 ----

check "X.509: QEMU and libnbd clients that trust the CA"
start_server --tls require --tls-certs "$T/srv" memory:16M
qio_x509 clinocert -c 'write -P 0x11 0 1M' -c 'read -P 0x11 0 1M' >/dev/null ||
  fail "qemu-io with tls-creds-x509"
nbdinfo "$(x509_uri clinocert)" | grep -q "with TLS" || fail "nbdinfo with tls-certificates"
ok "served over X.509 TLS"
refused "QEMU not trusting the CA" qio_x509 cliuntrusting -c 'read 0 4k'
stop_server
# libnbd 1.14 checks the server's certificate only when it has a host
# name to check it against: over TCP, not over a Unix socket.
start_server_tcp --tls require --tls-certs "$T/srv" memory:16M
nbdinfo "nbds://127.0.0.1:$PORT/?tls-certificates=$T/clinocert" | grep -q "with TLS" ||
  fail "nbdinfo over TCP with X.509"
refused "libnbd not trusting the CA (TCP)" \
  nbdinfo "nbds://127.0.0.1:$PORT/?tls-certificates=$T/cliuntrusting"
stop_server

check "X.509 with --tls-verify-peer: client certificates"
start_server --tls require --tls-certs "$T/srv" --tls-verify-peer memory:16M
qio_x509 cli -c 'write -P 0x22 0 1M' -c 'read -P 0x22 0 1M' >/dev/null ||
  fail "qemu-io with a client certificate"
nbdinfo "$(x509_uri cli)" | grep -q "with TLS" || fail "nbdinfo with a client certificate"
refused "no client certificate" nbdinfo "$(x509_uri clinocert)"
refused "a certificate from another CA" nbdinfo "$(x509_uri clirogue)"
refused "QEMU with a certificate from another CA" qio_x509 clirogue -c 'read 0 4k'
grep -q "client certificate rejected\|TLS handshake failed" "$T/server.log" ||
  fail "no log line for the rejected certificate"
qio_x509 cli -c 'read -P 0x22 0 1M' >/dev/null || fail "good client afterwards"
ok "only certificates from the CA get in"

check "raw protocol over X.509: STARTTLS twice is INVALID, options start over"
"$PY" - "$SOCK" "$TESTS_DIR" "$T/ca/ca-cert.pem" "$T/cli" <<'EOF' || fail "raw protocol over TLS"
import ssl, sys
sys.path.insert(0, sys.argv[2])
import nbdwire as nw
ctx = ssl.create_default_context(cafile=sys.argv[3])
ctx.load_cert_chain(sys.argv[4] + "/client-cert.pem", sys.argv[4] + "/client-key.pem")
with nw.Client.unix(sys.argv[1]) as c:
    c.handshake()
    assert c.opt_starttls().type == nw.NBD_REP_ACK
    c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
    r = c.opt_starttls()
    assert r.type == nw.NBD_REP_ERR_INVALID, r
    assert c.opt_structured_reply().type == nw.NBD_REP_ACK
    assert c.opt_go("").type == nw.NBD_REP_ACK
    assert c.read(0, 65536).content() == b"\x22" * 65536
    c.disconnect()
EOF
ok "STARTTLS after TLS refused; transmission over TLS"
stop_server

# ---- --tls on ----

check "--tls on: plain and TLS clients of one server"
start_server --tls on --tls-psk "$PSK" --tls-certs "$T/srv" memory:16M
run qemu-io -f raw -c 'write -P 0x44 0 2M' "$URI" >/dev/null || fail "plain write"
qio_psk "$T/psk" -c 'read -P 0x44 0 2M' -c 'write -P 0x55 4M 1M' >/dev/null ||
  fail "PSK client reads the plain write"
qio_x509 clinocert -c 'read -P 0x55 4M 1M' >/dev/null || fail "X.509 client"
run qemu-io -f raw -c 'read -P 0x55 4M 1M' "$URI" >/dev/null || fail "plain read"
nbdinfo "$URI" | grep -q "without TLS" || fail "plain nbdinfo"
nbdinfo "$(psk_uri)" | grep -q "with TLS" || fail "TLS nbdinfo"
stop_server
ok "both served"

# ---- nothing in the clear under require (TCP through a recording proxy) ----

check "--tls require over TCP: no export data crosses unencrypted"
"$PY" -c '
import sys
block = b"BLOCKPORT-TLS-SECRET-" + b"S" * (4096 - 21)
open(sys.argv[1], "wb").write(block * 1024)' secret.raw
start_server_tcp --tls require --tls-psk "$PSK" secret.raw
cat >proxy.py <<'EOF'
import socket, sys, threading
lport_file, port, cap = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock = threading.Lock()
out = open(cap, "ab")
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(16)
open(lport_file, "w").write(str(ls.getsockname()[1]))
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            with lock:
                out.write(d)
                out.flush()
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
while True:
    c, _ = ls.accept()
    s = socket.create_connection(("127.0.0.1", port))
    threading.Thread(target=pipe, args=(c, s), daemon=True).start()
    threading.Thread(target=pipe, args=(s, c), daemon=True).start()
EOF
"$PY" proxy.py pport "$PORT" capture.bin &
track_pid $!
wait_file 5 pport $! || fail "the proxy did not start"
PPORT=$(cat pport)
refused "plain nbdinfo over TCP" nbdinfo "nbd://127.0.0.1:$PPORT"
refused "plain qemu-img over TCP" run qemu-img convert -O raw "nbd://127.0.0.1:$PPORT" plain.raw
run qemu-img convert --object "tls-creds-psk,id=t0,endpoint=client,dir=$T/psk,username=alice" \
  --image-opts "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PPORT,tls-creds=t0" \
  -O raw tls.raw || fail "qemu-img convert over TLS through the proxy"
cmp tls.raw secret.raw || fail "data read over TLS differs"
run qemu-io --object "tls-creds-psk,id=t0,endpoint=client,dir=$T/psk,username=alice" \
  --image-opts "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PPORT,tls-creds=t0" \
  -c 'write -P 0x5a 0 1M' >/dev/null || fail "write over TLS through the proxy"
# The proxy records what it relays before passing it on, so all of it is
# there already; the wait only makes that explicit.
captured() { (($(stat -c %s capture.bin) > 5 * 1024 * 1024)); }
wait_until 5 captured || fail "the proxy captured only $(stat -c %s capture.bin) bytes"
"$PY" - capture.bin <<'EOF' || fail "export data seen in the clear"
import sys
cap = open(sys.argv[1], "rb").read()
assert len(cap) > 5 * 1024 * 1024, "the proxy saw only %d bytes" % len(cap)
for needle in (b"BLOCKPORT-TLS-SECRET", b"S" * 64, b"Z" * 64):
    assert needle not in cap, needle
print("captured %d bytes, none of them export data" % len(cap))
EOF
stop_server
ok "5 MiB crossed the proxy, all of it encrypted"

check "SIGHUP reloads the X.509 credentials; connected clients keep theirs"
# bob: a second client of the CA, to be revoked; carol: a client of the CA
# the server moves to.
cert bob ca "cn = bob" tls_www_client encryption_key signing_key
mkdir clibob && cp ca/ca-cert.pem clibob/ && cp bob-cert.pem clibob/client-cert.pem &&
  cp bob-key.pem clibob/client-key.pem
ca newca
cert newserver newca "cn = localhost" "dns_name = localhost" \
  "ip_address = 127.0.0.1" tls_www_server encryption_key signing_key
cert carol newca "cn = carol" tls_www_client encryption_key signing_key
mkdir clicarol && cp newca/ca-cert.pem clicarol/ &&
  cp carol-cert.pem clicarol/client-cert.pem && cp carol-key.pem clicarol/client-key.pem
mkdir srv2 && cp ca/ca-cert.pem server-cert.pem server-key.pem srv2/
start_server --tls require --tls-certs "$T/srv2" --tls-verify-peer memory:16M
# hup_and_wait N: SIGHUP, then wait for the Nth reload line in the log.
reloads_logged() {
  (($(grep -c "reloaded the TLS\|credentials cannot be loaded" "$T/server.log") >= $1))
}
hup_and_wait() {
  kill -HUP "$SERVER_PID"
  wait_until 10 reloads_logged "$1" || fail "no reload logged after SIGHUP"
}
# bob connects now and stays connected over the reloads.
"$PY" - "$SOCK" "$T/clibob" "$T/bob.ready" "$T/bob.go" >bob.out 2>&1 <<'EOF' &
import nbd, os, sys, time
sock, certs, ready, go = sys.argv[1:]
h = nbd.NBD()
h.set_tls(nbd.TLS_REQUIRE)
h.set_tls_certificates(certs)
h.connect_unix(sock)
h.pwrite(b"B" * 4096, 0)
open(ready, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(go):
    assert time.monotonic() < deadline, "never told to go on"
    time.sleep(0.05)
assert h.pread(4096, 0) == b"B" * 4096
h.shutdown()
print("bob's connection carried on")
EOF
BOB=$!
wait_until 10 test -e bob.ready || { cat bob.out; fail "bob did not connect"; }
# Revoke bob.  Until the reload, the server does not know.
printf '%s\n' crl_next_update=2 crl_number=1 >crl.info
certtool --generate-crl --load-ca-privkey ca/ca-key.pem --load-ca-certificate ca/ca-cert.pem \
  --load-certificate bob-cert.pem --template crl.info --outfile srv2/ca-crl.pem 2>/dev/null
nbdinfo "$(x509_uri clibob)" >/dev/null || fail "bob refused before the reload"
hup_and_wait 1
refused "bob's certificate, revoked by the reloaded CRL" nbdinfo "$(x509_uri clibob)"
grep -q "client certificate rejected: .*revoked" "$T/server.log" ||
  fail "bob was not refused as revoked"
nbdinfo "$(x509_uri cli)" >/dev/null || fail "alice refused after the CRL reload"
# A key file that cannot be read: the reload is refused, the old
# credentials (with the CRL) stay.
cp srv2/server-key.pem key.bak
: >srv2/server-key.pem
hup_and_wait 2
grep -q "TLS credentials cannot be loaded; keeping the current ones" "$T/server.log" ||
  fail "the failed reload is not logged"
nbdinfo "$(x509_uri cli)" >/dev/null || fail "alice refused after a failed reload"
refused "bob after a failed reload" nbdinfo "$(x509_uri clibob)"
# Move to the new CA: its clients get in, the old CA's do not.
refused "carol before the move" nbdinfo "$(x509_uri clicarol)"
cp newca/ca-cert.pem srv2/ca-cert.pem
cp newserver-cert.pem srv2/server-cert.pem && cp newserver-key.pem srv2/server-key.pem
rm srv2/ca-crl.pem
hup_and_wait 3
nbdinfo "$(x509_uri clicarol)" >/dev/null || fail "carol refused after the move"
refused "alice after the move to the new CA" nbdinfo "$(x509_uri cli)"
touch bob.go
wait "$BOB" || { cat bob.out; fail "bob's connection did not survive the reloads"; }
cat bob.out
stop_server
ok "CRL, failed reload and CA change applied to new clients only"
