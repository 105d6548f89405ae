#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Multi-conn consistency: can_multi_conn is advertised, and a write on one
# connection + flush on a second is visible to a read on a third; also with
# many concurrent writers spread across connections.
source "$(dirname "$0")/lib.sh"
require_py_nbd

SIZE=$((64 * 1024 * 1024))
truncate -s $SIZE "$T/disk.img"
# A single worker thread shared by all connections must still make progress.
start_server --workers 1 "$T/disk.img" "mem=memory:$SIZE"

for uri in "$URI" "$(export_uri mem)"; do
    check "multi-conn on $uri: write on 1, flush on 2, read on 3 (x many)"
    run "$PY" - "$uri" <<'EOF' || fail "multi-conn consistency failed on $uri"
import os, random, sys
import nbd

uri = sys.argv[1]
K = 1024
M = 1 << 20

def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    assert h.can_multi_conn(), "NBD_FLAG_CAN_MULTI_CONN not advertised"
    assert h.can_flush(), "flush not advertised"
    return h

c1, c2, c3 = connect(), connect(), connect()
size = c1.get_size()
print("  3 connections, can_multi_conn true, size %d" % size, flush=True)

# 1: simple write/flush/read across three connections, repeated with
# varying offsets and sizes, including unaligned ones.
rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
for i in range(200):
    ln = rnd.choice([1, 512, 4096, 65536, rnd.randrange(1, 256 * K)])
    off = rnd.randrange(0, size - ln)
    data = os.urandom(ln)
    c1.pwrite(data, off)
    c2.flush()
    got = c3.pread(ln, off)
    if got != data:
        raise SystemExit("iteration %d: read on conn 3 after write on 1 + flush on 2 "
                         "differs at %d+%d" % (i, off, ln))
    # rotate roles
    c1, c2, c3 = c2, c3, c1
print("  200 write/flush/read rounds across connections ok", flush=True)

# 2: many in-flight writes on several connections (aio), flush on every
# writer connection's peer, then verify everything from another connection.
writers = [connect() for _ in range(4)]
expect = {}
slot = 256 * K
slots = list(range(size // slot))
rnd.shuffle(slots)
pending = 0
for n, s in enumerate(slots[:128]):
    h = writers[n % len(writers)]
    ln = rnd.randrange(1, slot)
    off = s * slot + rnd.randrange(0, slot - ln + 1)
    data = os.urandom(ln)
    expect[off] = data
    h.aio_pwrite(data, off)
for h in writers:
    while h.aio_in_flight() > 0:
        h.poll(-1)
# Commands completed; now a flush on a *different* connection must make
# all of them visible everywhere.
c1.flush()
reader = connect()
for off, data in expect.items():
    got = reader.pread(len(data), off)
    if got != data:
        raise SystemExit("aio write at %d+%d not visible on another connection" % (off, len(data)))
print("  128 concurrent aio writes on 4 connections visible after a flush elsewhere", flush=True)

# 3: FUA write on one connection, read on another without any flush.
d = os.urandom(8192)
writers[0].pwrite(d, 4096, nbd.CMD_FLAG_FUA)
assert reader.pread(8192, 4096) == d, "FUA write not visible on another connection"
print("  FUA write visible on another connection", flush=True)

# 4: interleaved overlapping writes from two connections: the last
# completed write wins.
for i in range(50):
    off = rnd.randrange(0, size - 8192)
    a, b = os.urandom(8192), os.urandom(8192)
    writers[1].pwrite(a, off)
    writers[2].pwrite(b[:4096], off + 2048)
    writers[3].flush()
    expect_buf = a[:2048] + b[:4096] + a[6144:]
    assert reader.pread(8192, off) == expect_buf, "overlapping writes from two connections wrong at %d" % off
print("  overlapping writes from two connections ordered correctly", flush=True)

for h in [c1, c2, c3, reader] + writers:
    h.shutdown()
EOF
    ok "multi-conn consistent on $uri"
done

check "flushed data from multi-conn writes reached the raw file"
"$PY" - "$URI" "$T/disk.img" <<'EOF' || fail "multi-conn data not in the backing file"
import os, sys, nbd
uri, path = sys.argv[1:3]
hs = [nbd.NBD() for _ in range(3)]
for h in hs:
    h.connect_uri(uri)
d = os.urandom(65536)
hs[0].pwrite(d, 10 << 20)
hs[1].flush()
with open(path, "rb") as f:
    f.seek(10 << 20)
    assert f.read(65536) == d, "data written on conn 1 + flush on conn 2 not in the file"
for h in hs:
    h.shutdown()
print("  ok")
EOF
ok "backing file"

stop_server
echo "PASS"
