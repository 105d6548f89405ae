#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A qcow2 overlay whose backing file is an NBD export (issue 18, part A):
# golden raw and qcow2 images served read-only by one blockport, overlays
# made by qemu-img and by blockport create over nbd+unix:// and nbd://
# URIs, served by another blockport: reads fall through to the base,
# copy-on-write writes stay in the overlay, QEMU opening the overlay over
# the same URI agrees, info and map follow the chain across the network;
# the same over nbds:// (PSK on a socket, X.509 over TCP); a reader
# streaming the overlay sees no error while the base is killed and stopped.
source "$(dirname "$0")/lib.sh"
require qemu-io qemu-img
cd "$T"

# The golden images: 16 MiB, a pattern everywhere but one hole.
qemu-img create -f raw golden.raw 16M >/dev/null
run qemu-io -f raw -c 'write -P 7 0 8M' -c 'write -P 8 12M 4M' golden.raw \
  >/dev/null || fail "fill golden.raw"
run qemu-img convert -O qcow2 golden.raw golden.qcow2 || fail "golden.qcow2"

# base_up IMAGE [tcp|raw|""] [SERVE-ARGS...]: IMAGE served read-only on its
# own socket (or TCP port; or undecoded, as raw); BASE is its URI, BASE_PID
# its server.
base_up() {
  rm -f "$T/base.pid"
  local listen=(--unix "$T/base.sock")
  BASE="nbd+unix:///?socket=$T/base.sock"
  local fmt=()
  [[ ${2-} == raw ]] && fmt=(-f raw)
  if [[ ${2-} == tcp ]]; then
    BASE_PORT=${BASE_PORT:-$(_free_port)}
    listen=(--bind 127.0.0.1 --port "$BASE_PORT")
    BASE="nbd://127.0.0.1:$BASE_PORT"
  fi
  "$BLOCKPORT" serve --readonly "${listen[@]}" --pid-file "$T/base.pid" "${fmt[@]}" \
    "${@:3}" "$1" 2>>"$T/base.log" &
  BASE_PID=$!
  track_pid $BASE_PID
  wait_file 10 "$T/base.pid" $BASE_PID || { cat "$T/base.log"; fail "base server"; }
}

base_down() {
  kill "$BASE_PID" && wait "$BASE_PID" 2>/dev/null
  BASE_PID=
}

# overlay_case NAME MAKER: MAKER creates ov.qcow2 over $BASE; then reads,
# copy-on-write and a discard through a blockport export of it, and QEMU's
# view of the overlay compared with the expected content.
overlay_case() {
  local name=$1 maker=$2
  check "$name: reads through the overlay are the base's"
  rm -f ov.qcow2
  $maker || fail "create the overlay"
  start_server ov.qcow2
  run qemu-img compare -f raw -F raw "$URI" golden.raw ||
    fail "overlay export differs from the golden image"
  ok "same content"

  check "$name: copy-on-write of partial clusters, and a discard"
  cp golden.raw expect.raw
  run qemu-io -f raw -c 'write -P 9 4096 512' -c 'write -P 10 9M 100K' \
    -c 'discard 13M 64K' "$URI" >/dev/null || fail "writes through the export"
  run qemu-io -f raw -c 'write -P 9 4096 512' -c 'write -P 10 9M 100K' \
    -c 'write -z 13M 64K' expect.raw >/dev/null || fail "expected image"
  run qemu-img compare -f raw -F raw "$URI" expect.raw ||
    fail "export differs after writes"
  stop_server
  qemu_verify ov.qcow2 expect.raw
  ok "COW kept the rest of each cluster; QEMU agrees"
}

# qemu_verify IMAGE EXPECT: QEMU opens the overlay, reaching the base over
# the same URI, and agrees with EXPECT.  QEMU 7.2 knows no nbds:// URI:
# with TLS (QEMU_BACKING set) it reads a copy of the overlay whose backing
# name is the same server as QEMU spells it (json:, tls-creds object t0
# made from QEMU_TLS).
qemu_verify() {
  local img=$1 obj=()
  if [[ -n ${QEMU_BACKING-} ]]; then
    cp "$1" qview.qcow2
    img=qview.qcow2
    obj=(--object "$QEMU_TLS")
    run qemu-img rebase -u -F raw -b "json:$QEMU_BACKING" $img || fail "rebase"
  fi
  run qemu-img compare "${obj[@]}" -F raw $img "$2" ||
    fail "QEMU's view of the overlay differs"
  run qemu-img check "${obj[@]}" $img >/dev/null || fail "qemu-img check"
}

make_qemu() {
  run qemu-img create -f qcow2 -F raw -b "$BASE" ov.qcow2 >/dev/null
}
make_blockport() {
  run "$BLOCKPORT" create -f qcow2 -b "$BASE" -F raw ov.qcow2 >/dev/null
}
# qemu-img cannot open an nbds:// URI (QEMU 7.2), but writes it unchecked.
make_qemu_unsafe() {
  run qemu-img create -f qcow2 -u -F raw -b "$BASE" ov.qcow2 16M >/dev/null
}

base_up golden.raw
overlay_case "qemu-img overlay over nbd+unix, raw base" make_qemu
overlay_case "blockport create over nbd+unix, raw base" make_blockport

check "info --backing-chain and map across the network"
"$BLOCKPORT" info --backing-chain ov.qcow2 >info.txt || { cat info.txt; fail "info"; }
grep -qF "backing file: $BASE" info.txt || { cat info.txt; fail "backing file"; }
grep -qF "(actual path" info.txt && { cat info.txt; fail "a URI is no path"; }
grep -q "^image: $BASE" info.txt || { cat info.txt; fail "chain stops at the URI"; }
"$BLOCKPORT" map --json ov.qcow2 >map.json || fail "map"
qemu-img map --output=json ov.qcow2 >qmap.json || fail "qemu-img map"
"$PY" - map.json qmap.json <<'EOF' || fail "map differs from qemu-img's"
import json, sys
def norm(p):
    out = []
    for e in json.load(open(p)):
        k = (e["depth"], e["zero"], e["data"])
        if out and out[-1][3] == k and out[-1][0] + out[-1][1] == e["start"]:
            out[-1][1] += e["length"]
        else:
            out.append([e["start"], e["length"], None, k])
    return [(s, l, k) for s, l, _, k in out]
a, b = norm(sys.argv[1]), norm(sys.argv[2])
if a != b:
    print("blockport:", a, "\nqemu-img:", b)
    sys.exit(1)
EOF
ok "chain and allocation depth as QEMU reports them"
base_down

base_up golden.qcow2
overlay_case "qemu-img overlay over nbd+unix, qcow2 base served as raw" make_qemu
base_down

check "a source whose data is a qcow2 image (served undecoded): refused clearly"
base_up golden.qcow2 raw
rc=0; "$BLOCKPORT" create -f qcow2 -b "$BASE" ov.qcow2 2>err.txt || rc=$?
[ $rc -ne 0 ] && grep -q "its data is a qcow2 image" err.txt ||
  { cat err.txt; fail "create over qcow2 content: exit $rc"; }
rc=0; "$BLOCKPORT" create -f qcow2 -b "$BASE" -F qcow2 ov.qcow2 2>err.txt || rc=$?
[ $rc -ne 0 ] && grep -q "declared a qcow2 image" err.txt ||
  { cat err.txt; fail "create -F qcow2 over a URI: exit $rc"; }
run qemu-img create -f qcow2 -F qcow2 -b "$BASE" ov.qcow2 >/dev/null ||
  fail "qemu-img create"
rc=0; "$BLOCKPORT" serve --unix "$T/x.sock" ov.qcow2 2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "declared a qcow2 image" err.txt ||
  { cat err.txt; fail "serve of a qcow2-over-NBD overlay: exit $rc"; }
base_down
ok "refused, naming the format"

base_up golden.raw tcp
overlay_case "qemu-img overlay over nbd:// (TCP)" make_qemu
overlay_case "blockport create over nbd:// (TCP)" make_blockport

check "mount of the overlay: reads, a partial-cluster write, a discard, QEMU agrees"
if can_mount && [[ $(id -u) -eq 0 ]]; then
  MNT=$T/mnt
  mkdir -p "$MNT"
  is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
  trap 'rc=$?; set +e; is_mounted "$MNT" && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT
  rm -f ov.qcow2 mount.pid
  make_blockport || fail "create the overlay"
  "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid ov.qcow2 \
    "$MNT" </dev/null >>mount.log 2>&1 &
  MOUNT_PID=$!
  track_pid $MOUNT_PID
  wait_file 15 mount.pid $MOUNT_PID || { cat mount.log; fail "mount not live"; }
  cmp "$MNT/ov" golden.raw || fail "mounted overlay differs from the base"
  cp golden.raw expect.raw
  head -c 3000 /dev/urandom >piece
  dd if=piece of="$MNT/ov" bs=3000 seek=1 conv=notrunc,fsync status=none ||
    fail "write through the mount"
  dd if=piece of=expect.raw bs=3000 seek=1 conv=notrunc status=none
  # A discard of a whole cluster of base data: zeroes, not the base.
  fallocate -p -o 5M -l 64K "$MNT/ov" || fail "punch a hole through the mount"
  run qemu-io -f raw -c 'write -z 5M 64K' expect.raw >/dev/null || fail "expected"
  cmp "$MNT/ov" expect.raw || fail "mounted overlay after the write and discard"
  fusermount3 -u "$MNT" || fail "unmount"
  wait $MOUNT_PID || fail "mount exited with $?"
  run qemu-img compare -F raw ov.qcow2 expect.raw || fail "QEMU's view after the mount"
  ok "mount reads the base and keeps the write"
else
  echo "  (skipped: needs FUSE in blockport, /dev/fuse, root and fusermount3)"
fi

check "a relative backing file name stays relative to the overlay"
mkdir -p sub
run qemu-img create -f qcow2 -F raw -b ../golden.raw sub/rel.qcow2 >/dev/null
run qemu-img compare -f qcow2 -F raw sub/rel.qcow2 golden.raw >/dev/null
start_server sub/rel.qcow2
run qemu-img compare -f raw -F raw "$URI" golden.raw || fail "relative file"
stop_server
ok "relative to the overlay's directory"

check "the base server restarted during reads"
start_server ov.qcow2
run qemu-io -f raw -c 'read -P 7 6M 1M' "$URI" >/dev/null || fail "first read"
base_down
( sleep 1; exec "$BLOCKPORT" serve --readonly --bind 127.0.0.1 \
    --port "$BASE_PORT" --pid-file "$T/base2.pid" golden.raw 2>>"$T/base.log" ) &
track_pid $!
run qemu-io -f raw -c 'read -P 7 2M 2M' -c 'read -P 8 14M 1M' "$URI" \
  >/dev/null || fail "reads while the base restarts"
stop_server
ok "reads waited for the base and succeeded"

check "a read over unallocated clusters is one request to the base"
if command -v nbdkit >/dev/null; then
  rm -f ov.qcow2 k.log
  nbdkit -U "$T/k.sock" -P "$T/k.pid" --filter=log file golden.raw \
    logfile="$T/k.log" || fail "nbdkit"
  wait_until 10 test -s "$T/k.pid" || fail "nbdkit did not start"
  track_pid "$(cat "$T/k.pid")"
  run qemu-img create -f qcow2 -F raw -b "nbd+unix:///?socket=$T/k.sock" \
    ov.qcow2 >/dev/null || fail "overlay over nbdkit"
  # One allocated cluster, so that the L2 table exists and maps the rest
  # cluster by cluster.
  run qemu-io -f qcow2 -c 'write -P 1 0 4k' ov.qcow2 >/dev/null || fail "write"
  start_server ov.qcow2
  : >k.log
  run qemu-io -f raw -c 'read -P 7 1M 4M' "$URI" >/dev/null || fail "read"
  stop_server
  n=$(grep -ac ' Read id=.*count=' k.log)
  [[ $n -eq 1 ]] || fail "$n requests to the base for 4 MiB (64 clusters)"
  ok "one request for 64 unallocated clusters"

  check "copy-on-write of a partial cluster reads the base once"
  # cow_reads IMAGE OFF LEN: write LEN bytes at OFF through a blockport
  # export of IMAGE (libnbd: exactly that request, no read-modify-write of
  # the client's own) and set READS to the base reads it caused, as
  # "offset+count" in hex.
  cow_reads() {
    start_server "$1"
    : >k.log
    "$PY" - "$URI" "$2" "$3" <<'PYEOF' || fail "write through the export"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * int(sys.argv[3]), int(sys.argv[2]))
h.shutdown()
PYEOF
    stop_server
    READS=$({ grep -a ' Read id=' k.log || true; } | sed 's/.*offset=\(0x[0-9a-f]*\) count=\(0x[0-9a-f]*\).*/\1+\2/' |
      tr '\n' ' ')
    READS=${READS% }
    run qemu-io -f raw -c "write -P 0x5a $2 $3" expect.raw >/dev/null || fail "expected"
  }
  cow_case() { # IMAGE OFF LEN WANT WHAT
    cow_reads "$1" "$2" "$3"
    [[ $READS == "$4" ]] || fail "$5: base reads '$READS', want '$4'"
  }
  cp golden.raw expect.raw
  qemu-io -f raw -c 'write -P 1 0 4k' expect.raw >/dev/null
  cow_case ov.qcow2 $((1024 * 1024 + 8192)) 4096 "0x100000+0x10000" \
    "4 KiB into a 64 KiB cluster"
  run qemu-img compare -F raw ov.qcow2 expect.raw || fail "overlay content"
  ok "one read of the whole cluster"

  rm -f ovx.qcow2
  cp golden.raw expect.raw
  run "$BLOCKPORT" create -f qcow2 -o extended_l2=on -F raw \
    -b "nbd+unix:///?socket=$T/k.sock" ovx.qcow2 >/dev/null || fail "create"
  # 2 KiB subclusters: a write inside one reads its head and tail at once;
  # one covering whole subclusters reads nothing; one spanning three
  # partly reads the first and last in one request.
  cow_case ovx.qcow2 $((2048 * 1024 + 100)) 512 "0x200000+0x800" \
    "512 bytes inside a subcluster"
  cow_case ovx.qcow2 $((3072 * 1024 + 8192)) 4096 "" "whole subclusters"
  cow_case ovx.qcow2 $((4096 * 1024 + 1000)) 4096 "0x400000+0x1800" \
    "4 KiB across three subclusters"
  run qemu-img compare -F raw ovx.qcow2 expect.raw || fail "extended L2 overlay content"
  run qemu-img check ovx.qcow2 >/dev/null || fail "qemu-img check"
  ok "extended L2: what the subclusters need, in one read"

  check "--copy-on-read: what was read from the base is read locally next"
  # base_reads OFF LEN...: read each range through the export and set READS
  # to the base reads they caused, as in cow_reads.
  base_reads() {
    : >k.log
    "$PY" - "$URI" "$@" <<'PYEOF' || fail "reads through the export"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
want = open("golden.raw", "rb").read()
args = [int(a) for a in sys.argv[2:]]
for off, n in zip(args[::2], args[1::2]):
    assert h.pread(n, off) == want[off:off + n], off
h.shutdown()
PYEOF
    READS=$({ grep -a ' Read id=' k.log || true; } | tr -d '\0' |
      sed 's/.*offset=\(0x[0-9a-f]*\) count=\(0x[0-9a-f]*\).*/\1+\2/' | tr '\n' ' ')
    READS=${READS% }
  }
  rm -f ovc.qcow2
  run "$BLOCKPORT" create -f qcow2 -F raw -b "nbd+unix:///?socket=$T/k.sock" \
    ovc.qcow2 >/dev/null || fail "create"
  start_server --copy-on-read ovc.qcow2
  # 4 KiB inside a cluster: the whole cluster, once; a read across four
  # clusters (partly covering the last): one request for all four.
  base_reads $((1024 * 1024 + 8192)) 4096
  [[ $READS == "0x100000+0x10000" ]] || fail "first read: base reads '$READS'"
  base_reads $((1024 * 1024 + 8192)) 4096 $((1024 * 1024)) 65536
  [[ -z $READS ]] || fail "second read: base reads '$READS'"
  base_reads $((2048 * 1024 + 1000)) $((3 * 65536 + 100))
  [[ $READS == "0x200000+0x40000" ]] || fail "read across clusters: base reads '$READS'"
  base_reads $((2048 * 1024)) $((4 * 65536))
  [[ -z $READS ]] || fail "read again: base reads '$READS'"
  stop_server
  run qemu-img compare -F raw ovc.qcow2 golden.raw || fail "overlay content"
  run qemu-img check ovc.qcow2 >/dev/null || fail "qemu-img check"
  qemu-img map --output=json ovc.qcow2 >cmap.json
  "$PY" - cmap.json <<'PYEOF' || fail "allocation after copy-on-read"
import json, sys
local = [(e["start"], e["length"]) for e in json.load(open(sys.argv[1]))
         if e["depth"] == 0]
assert local == [(0x100000, 0x10000), (0x200000, 0x40000)], local
PYEOF
  # Reads copying clusters while writes land in the same clusters: no
  # write is overwritten by a copy of the base read before it.
  rm -f ovs.qcow2
  run "$BLOCKPORT" create -f qcow2 -F raw -b "nbd+unix:///?socket=$T/k.sock" \
    ovs.qcow2 >/dev/null || fail "create"
  start_server --copy-on-read ovs.qcow2
  "$PY" - "$URI" <<'PYEOF' || fail "reads and writes racing"
import random, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
want = bytearray(open("golden.raw", "rb").read())
rnd = random.Random(18)
slots = rnd.sample(range(128 * 16), 1024)  # distinct 4 KiB pieces of 8 MiB
bufs = []
for i, slot in enumerate(slots):
    while h.aio_in_flight() >= 64:
        h.poll(-1)
    off = slot * 4096
    cluster = off // 65536 * 65536
    rb = nbd.Buffer(65536)
    bufs.append(rb)
    h.aio_pread(rb, cluster)
    data = bytes([i % 250 + 1]) * 4096
    h.aio_pwrite(data, off)
    want[off:off + 4096] = data
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
h.shutdown()
open("race-expect.raw", "wb").write(want)
PYEOF
  stop_server
  run qemu-img compare -F raw ovs.qcow2 race-expect.raw || fail "a write was lost to a copy"
  run qemu-img check ovs.qcow2 >/dev/null || fail "qemu-img check after the race"

  # Off by default.
  start_server ovc.qcow2
  base_reads $((5 * 1024 * 1024)) 4096
  base_reads $((5 * 1024 * 1024)) 4096
  [[ $READS == "0x500000+0x1000" ]] || fail "without the option: base reads '$READS'"
  stop_server
  ok "one base read per cluster, then none; QEMU agrees"
  kill "$(cat "$T/k.pid")"
else
  echo "  (skipped: no nbdkit)"
fi

check "the base server killed (-9) and stopped (SIGSTOP) under a streaming reader"
base_up golden.raw
rm -f ov.qcow2 progress stop
make_blockport || fail "create the overlay"
start_server ov.qcow2
# The reader streams the whole overlay in 1 MiB reads, checks every byte
# against the golden image, and counts its reads in `progress`.
"$PY" - "$URI" golden.raw progress stop <<'PYEOF' >reader.log 2>&1 &
import os, sys, nbd
uri, golden, progress, stop = sys.argv[1:]
want = open(golden, "rb").read()
h = nbd.NBD()
h.connect_uri(uri)
n = 0
while not os.path.exists(stop):
    for off in range(0, len(want), 1 << 20):
        if h.pread(1 << 20, off) != want[off:off + (1 << 20)]:
            sys.exit("wrong data at %d" % off)
        n += 1
        with open(progress + ".tmp", "w") as f:
            f.write("%d\n" % n)
        os.replace(progress + ".tmp", progress)
h.shutdown()
PYEOF
READER=$!
track_pid $READER
reads() { cat progress 2>/dev/null || echo 0; }
reads_past() { (($(reads) >= $1)); }
wait_until 60 reads_past 16 || { cat reader.log; fail "the reader did not start"; }
for round in 1 2; do
  kill -9 "$BASE_PID"
  wait "$BASE_PID" 2>/dev/null || true
  at_kill=$(reads)
  sleep 1 # the base's downtime, not a wait for a condition
  during=$(($(reads) - at_kill))
  ((during <= 1)) || fail "$during reads done while the base was down: not reading it?"
  base_up golden.raw
  wait_until 60 reads_past $(($(reads) + 16)) || { cat reader.log; fail "no reads after restart $round"; }
done
kill -STOP "$BASE_PID"
at_stop=$(reads)
sleep 2 # the base stopped, not a wait for a condition
(($(reads) - at_stop <= 1)) || fail "reads went on while the base was stopped"
kill -CONT "$BASE_PID"
wait_until 60 reads_past $(($(reads) + 16)) || { cat reader.log; fail "no reads after SIGCONT"; }
touch stop
wait $READER || { cat reader.log; fail "the reader saw an error"; }
stop_server
base_down
ok "$(reads) reads, all correct, through two kills and a stop of the base"

# ---- nbds:// backing: the golden image served with TLS ----
if has_feature tls && command -v psktool >/dev/null && command -v certtool >/dev/null; then
  mkdir -p tls/psk tls/ca tls/srv tls/cli tls/other
  psktool -u alice -p tls/psk/keys.psk >/dev/null
  printf '%s\n' "cn = test CA" ca cert_signing_key expiration_days=2 >tls/ca.info
  printf '%s\n' "cn = localhost" "ip_address = 127.0.0.1" tls_www_server \
    encryption_key signing_key expiration_days=2 >tls/srv.info
  certtool --generate-privkey --outfile tls/ca/ca-key.pem 2>/dev/null
  certtool --generate-self-signed --load-privkey tls/ca/ca-key.pem \
    --template tls/ca.info --outfile tls/ca/ca-cert.pem 2>/dev/null
  certtool --generate-privkey --outfile tls/srv/server-key.pem 2>/dev/null
  certtool --generate-certificate --load-privkey tls/srv/server-key.pem \
    --load-ca-certificate tls/ca/ca-cert.pem --load-ca-privkey tls/ca/ca-key.pem \
    --template tls/srv.info --outfile tls/srv/server-cert.pem 2>/dev/null
  cp tls/ca/ca-cert.pem tls/srv/ && cp tls/ca/ca-cert.pem tls/cli/
  # A CA that did not sign the server's certificate.
  certtool --generate-privkey --outfile tls/other/ca-key.pem 2>/dev/null
  certtool --generate-self-signed --load-privkey tls/other/ca-key.pem \
    --template tls/ca.info --outfile tls/other/ca-cert.pem 2>/dev/null

  base_up golden.raw "" --tls require --tls-psk "$T/tls/psk/keys.psk"
  BASE="nbds+unix://alice@/?socket=$T/base.sock&tls-psk-file=$T/tls/psk/keys.psk"
  QEMU_TLS="tls-creds-psk,id=t0,endpoint=client,dir=$T/tls/psk,username=alice"
  QEMU_BACKING='{"file": {"driver": "nbd", "tls-creds": "t0", "server":
    {"type": "unix", "path": "'$T/base.sock'"}}}'
  overlay_case "blockport create over nbds+unix:// (PSK)" make_blockport
  overlay_case "qemu-img overlay over nbds+unix:// (PSK)" make_qemu_unsafe
  base_down

  BASE_PORT=
  base_up golden.raw tcp --tls require --tls-certs "$T/tls/srv"
  BASE="nbds://127.0.0.1:$BASE_PORT/?tls-certificates=$T/tls/cli"
  QEMU_TLS="tls-creds-x509,id=t0,endpoint=client,dir=$T/tls/cli"
  QEMU_BACKING='{"file": {"driver": "nbd", "tls-creds": "t0", "server":
    {"type": "inet", "host": "127.0.0.1", "port": "'$BASE_PORT'"}}}'
  overlay_case "blockport create over nbds:// (X.509)" make_blockport
  check "nbds:// backing whose server the client does not trust: refused"
  rm -f ov2.qcow2
  run qemu-img create -f qcow2 -u -F raw \
    -b "nbds://127.0.0.1:$BASE_PORT/?tls-certificates=$T/tls/other" ov2.qcow2 16M >/dev/null
  rc=0; timeout 60 "$BLOCKPORT" serve --unix "$T/x.sock" ov2.qcow2 2>err.txt || rc=$?
  [[ $rc -eq 1 ]] && grep -q "cannot open backing file" err.txt ||
    { cat err.txt; fail "serve over an untrusted TLS base: exit $rc"; }
  ok "refused with the reason"
  base_down
  unset QEMU_BACKING QEMU_TLS
else
  skip_case "nbds:// backing: needs TLS in blockport, psktool and certtool"
fi
