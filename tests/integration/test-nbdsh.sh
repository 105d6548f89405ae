#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# libnbd (nbdsh / python nbd module) against blockport: structured replies,
# hole chunks in structured reads, base:allocation / qemu:allocation-depth
# block status, FUA, zero/trim/flush/cache, max-size requests, and error
# replies with the right errno (EINVAL, ENOSPC, EPERM).
source "$(dirname "$0")/lib.sh"
require nbdsh
require_py_nbd

MEM_SIZE=$((64 * 1024 * 1024))
FILE_SIZE=$((16 * 1024 * 1024))
truncate -s $FILE_SIZE "$T/disk.img"

start_server "$T/disk.img" "mem=memory:$MEM_SIZE" "nul=null:$((1024 * 1024 * 1024))"
MEM=$(export_uri mem)

check "nbdsh -u URI -c: structured replies negotiated, size, multi-conn"
run nbdsh -u "$URI" \
    -c 'assert h.get_structured_replies_negotiated(), "structured replies not negotiated"' \
    -c "assert h.get_size() == $FILE_SIZE, h.get_size()" \
    -c 'assert h.can_multi_conn()' \
    -c 'assert h.get_protocol() == "newstyle-fixed", h.get_protocol()' ||
    fail "nbdsh -c checks failed"
ok "nbdsh -c"

check "nbdsh reads what nbdsh wrote (separate connections)"
run nbdsh -u "$URI" -c 'h.pwrite(b"blockport" * 100, 12345)' || fail "nbdsh write failed"
run nbdsh -u "$URI" -c 'assert h.pread(900, 12345) == b"blockport" * 100, "readback differs"' ||
    fail "nbdsh readback failed"
ok "readback"

check "python libnbd: structured reads, block status, FUA, zero/trim, max payload"
run "$PY" - "$MEM" "$URI" "$T/disk.img" "$(export_uri nul)" <<'EOF' || fail "python libnbd checks failed"
import errno, os, sys
import nbd

mem_uri, file_uri, file_path = sys.argv[1:4]
M = 1 << 20
K = 1024

def say(msg):
    print("  " + msg, flush=True)

h = nbd.NBD()
h.add_meta_context("base:allocation")
h.add_meta_context("qemu:allocation-depth")
h.connect_uri(mem_uri)
size = h.get_size()
assert h.get_structured_replies_negotiated(), "structured replies not negotiated"
assert h.can_meta_context("base:allocation"), "base:allocation not negotiated"
assert h.can_meta_context("qemu:allocation-depth"), "qemu:allocation-depth not negotiated"
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * M, h.get_block_size(nbd.SIZE_MAXIMUM)
say("structured replies + both meta contexts negotiated, size %d" % size)

# --- structured read over a hole --------------------------------------
data = os.urandom(64 * K)
h.pwrite(data, 1 * M)
chunks = []
def chunk_cb(subbuf, offset, status, error):
    chunks.append((offset, len(subbuf), status, bytes(subbuf)))
    return 0
buf = h.pread_structured(4 * M, 0, chunk_cb)
expect = bytes(1 * M) + data + bytes(3 * M - 64 * K)
assert len(buf) == 4 * M
assert buf == expect, "pread_structured returned wrong data"
chunks.sort()
pos = 0
for off, ln, st, sub in chunks:
    assert st in (nbd.READ_DATA, nbd.READ_HOLE), "unexpected chunk status %d at %d" % (st, off)
    assert off == pos, "chunks not contiguous/overlap: expected %d, got chunk at %d" % (pos, off)
    assert ln > 0, "empty chunk at %d" % off
    assert sub == expect[off:off + ln], "chunk at %d+%d has wrong content" % (off, ln)
    if st == nbd.READ_HOLE:
        assert not (off < 1 * M + 64 * K and 1 * M < off + ln), \
            "hole chunk %d+%d overlaps written data" % (off, ln)
    pos = off + ln
assert pos == 4 * M, "chunks cover %d bytes of %d" % (pos, 4 * M)
holes = [(o, l) for o, l, s, _ in chunks if s == nbd.READ_HOLE]
say("pread_structured: %d chunks, %d hole chunk(s) %s" % (len(chunks), len(holes), holes[:4]))
assert holes, "no NBD_REPLY_TYPE_OFFSET_HOLE chunk in a read over a hole"

# Plain pread agrees.
assert h.pread(4 * M, 0) == expect

# NBD_CMD_FLAG_DF: the reply must not be fragmented: one data chunk.
assert h.can_df(), "DF not advertised"
chunks = []
buf = h.pread_structured(4 * M, 0, chunk_cb, nbd.CMD_FLAG_DF)
assert buf == expect, "DF read returned wrong data"
assert [(o, l, s) for o, l, s, _ in chunks] == [(0, 4 * M, nbd.READ_DATA)], \
    "DF read fragmented: %r" % [(o, l, s) for o, l, s, _ in chunks]
say("DF read: a single data chunk")

# --- block status ------------------------------------------------------
def block_status_all(handle, start, length, flags=0):
    """Walk [start, start+length) collecting extents per context."""
    res = {}
    pos = start
    while pos < start + length:
        got = {}
        def cb(ctx, offset, entries, err):
            assert offset == pos, "extent callback offset %d != request %d" % (offset, pos)
            got.setdefault(ctx, []).extend(
                (entries[i], entries[i + 1]) for i in range(0, len(entries), 2))
            return 0
        handle.block_status(start + length - pos, pos, cb, flags)
        assert "base:allocation" in got, "no base:allocation extents (got %r)" % list(got)
        adv = sum(l for l, _ in got["base:allocation"])
        assert adv > 0, "zero-length base:allocation reply"
        for ctx, ext in got.items():
            o = pos
            for l, f in ext:
                assert l > 0, "zero-length extent in %s" % ctx
                res.setdefault(ctx, []).append((o, l, f))
                o += l
        pos += min(adv, start + length - pos)
    return res

bs = block_status_all(h, 0, size)
alloc = bs["base:allocation"]
assert "qemu:allocation-depth" in bs, "no qemu:allocation-depth extents"
say("base:allocation: %s" % alloc[:6])
for o, l, f in alloc:
    assert f & ~3 == 0, "unknown base:allocation flags %#x" % f
    if o < 1 * M + 64 * K and 1 * M < o + l:
        assert f & 2 == 0, "written data at 1M reported ZERO (extent %d+%d flags %d)" % (o, l, f)
    if o + l <= 1 * M:
        assert f & 2, "untouched [0,1M) reported non-zero (extent %d+%d flags %d)" % (o, l, f)
# Coverage of the whole export in base:allocation.
pos = 0
for o, l, f in alloc:
    assert o == pos
    pos = o + l
assert pos >= size, "base:allocation covers %d of %d" % (pos, size)

# REQ_ONE: exactly one extent per context.
got = {}
def cb1(ctx, offset, entries, err):
    got[ctx] = list(entries)
    return 0
h.block_status(4 * M, 0, cb1, nbd.CMD_FLAG_REQ_ONE)
for ctx, ents in got.items():
    assert len(ents) == 2, "REQ_ONE: %s returned %d extents" % (ctx, len(ents) // 2)
    assert ents[0] <= 4 * M, "REQ_ONE: extent length %d exceeds request" % ents[0]
say("block status REQ_ONE: %r" % got)

# --- FUA write ---------------------------------------------------------
assert h.can_fua(), "FUA not advertised"
fua = os.urandom(128 * K)
h.pwrite(fua, 2 * M + 512, nbd.CMD_FLAG_FUA)
assert h.pread(128 * K, 2 * M + 512) == fua, "FUA write read back differs"
say("FUA write on memory export read back")

# --- zero / trim / flush / cache --------------------------------------
h.pwrite(b"\xff" * (256 * K), 5 * M)
h.zero(64 * K, 5 * M + 64 * K)
got = h.pread(256 * K, 5 * M)
assert got == b"\xff" * (64 * K) + bytes(64 * K) + b"\xff" * (128 * K), "write_zeroes wrong"
h.zero(4096, 5 * M + 200 * K, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096, 5 * M + 200 * K) == bytes(4096), "write_zeroes NO_HOLE wrong"
if h.can_fast_zero():
    h.pwrite(b"\xee" * (64 * K), 5 * M + 128 * K)
    h.zero(64 * K, 5 * M + 128 * K, nbd.CMD_FLAG_FAST_ZERO)
    assert h.pread(64 * K, 5 * M + 128 * K) == bytes(64 * K), "fast zero wrong"
h.trim(64 * K, 6 * M)
h.flush()
if h.can_cache():
    h.cache(1 * M, 0)
say("zero, trim, flush%s ok" % (", cache" if h.can_cache() else ""))

# --- maximum payload ---------------------------------------------------
big = os.urandom(32 * M)
h.pwrite(big, 16 * M)
assert h.pread(32 * M, 16 * M) == big, "32 MiB read back differs"
say("32 MiB write + read ok")
h.shutdown()

# --- FUA on a raw file: data is in the file when the reply arrives ------
h = nbd.NBD()
h.connect_uri(file_uri)
d = os.urandom(64 * K)
h.pwrite(d, 3 * M, nbd.CMD_FLAG_FUA)
with open(file_path, "rb") as f:
    f.seek(3 * M)
    assert f.read(64 * K) == d, "FUA write not in the backing file after the reply"
d2 = os.urandom(4096)
h.pwrite(d2, 7 * M)
h.flush()
with open(file_path, "rb") as f:
    f.seek(7 * M)
    assert f.read(4096) == d2, "flushed write not in the backing file"
say("FUA / flush on raw file visible in the backing file")
h.shutdown()

# --- null: export: writes discarded, reads zero, all hole|zero ----------
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri(sys.argv[4])
size = h.get_size()
h.pwrite(b"x" * 4096, 4096)
assert h.pread(8192, 0) == bytes(8192), "null: export did not read back zeroes"
got = []
h.block_status(min(size, 1 << 30), 0, lambda c, o, e, err: got.extend(e) or 0)
assert got and all(got[i + 1] & 2 for i in range(0, len(got), 2)), \
    "null: export extents not all ZERO: %r" % got[:8]
say("null: export reads zeroes after a write; extents %r" % got[:4])
h.shutdown()
EOF
ok "structured reads / block status / FUA"

check "error replies (strict mode off): EINVAL read past end, ENOSPC write past end"
run "$PY" - "$MEM" <<'EOF' || fail "error reply checks failed"
import errno, sys
import nbd
h = nbd.NBD()
h.set_strict_mode(0)
h.add_meta_context("base:allocation")
h.connect_uri(sys.argv[1])
assert h.can_meta_context("base:allocation")
size = h.get_size()

def expect_err(what, fn, *errnos):
    try:
        fn()
    except nbd.Error as e:
        if e.errnum not in errnos:
            raise SystemExit("%s: errno %s (%s), expected %s" % (
                what, e.errnum, errno.errorcode.get(e.errnum, "?"),
                "/".join(errno.errorcode[x] for x in errnos)))
        print("  %s -> %s (%s)" % (what, errno.errorcode[e.errnum], e.string), flush=True)
        return
    raise SystemExit("%s: succeeded, expected %s" % (
        what, "/".join(errno.errorcode[x] for x in errnos)))

expect_err("read past end", lambda: h.pread(4096, size), errno.EINVAL)
expect_err("read straddling end", lambda: h.pread(4096, size - 2048), errno.EINVAL)
expect_err("read far past end", lambda: h.pread(512, 1 << 62), errno.EINVAL)
expect_err("write past end", lambda: h.pwrite(b"x" * 4096, size), errno.ENOSPC)
expect_err("write straddling end", lambda: h.pwrite(b"y" * 4096, size - 1024), errno.ENOSPC)
expect_err("write_zeroes past end", lambda: h.zero(4096, size), errno.ENOSPC, errno.EINVAL)
expect_err("trim past end", lambda: h.trim(4096, size), errno.EINVAL, errno.ENOSPC)
expect_err("block_status past end",
           lambda: h.block_status(4096, size, lambda *a: 0), errno.EINVAL)
# The straddling write must not have written the in-range part... at least
# the connection must still be in sync and usable:
h.pwrite(b"z" * 512, size - 512)
assert h.pread(512, size - 512) == b"z" * 512, "connection unusable after errors"
print("  connection still usable after errors", flush=True)
h.shutdown()
EOF
ok "EINVAL / ENOSPC"
stop_server

check "--readonly server: write -> EPERM (strict mode off), reads still work"
start_server --readonly "$T/disk.img"
run "$PY" - "$URI" <<'EOF' || fail "readonly error checks failed"
import errno, sys
import nbd
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
assert h.is_read_only(), "read-only flag not set"
def expect_err(what, fn, *errnos):
    try:
        fn()
    except nbd.Error as e:
        if e.errnum not in errnos:
            raise SystemExit("%s: errno %s (%s), expected %s" % (
                what, e.errnum, errno.errorcode.get(e.errnum, "?"),
                "/".join(errno.errorcode[x] for x in errnos)))
        print("  %s -> %s" % (what, errno.errorcode[e.errnum]), flush=True)
        return
    raise SystemExit("%s: succeeded on a read-only export" % what)
before = h.pread(4096, 0)
expect_err("write", lambda: h.pwrite(b"w" * 4096, 0), errno.EPERM)
# FUA is not necessarily advertised on a read-only export, so EINVAL (flag
# not valid) is as acceptable as EPERM here.
expect_err("write FUA", lambda: h.pwrite(b"w" * 4096, 0, nbd.CMD_FLAG_FUA), errno.EPERM, errno.EINVAL)
expect_err("write_zeroes", lambda: h.zero(4096, 0), errno.EPERM, errno.EINVAL)
expect_err("trim", lambda: h.trim(4096, 0), errno.EPERM, errno.EINVAL)
assert h.pread(4096, 0) == before, "read-only export content changed"
if h.can_flush():
    h.flush()  # flush is allowed on read-only exports
print("  reads + flush still work", flush=True)
h.shutdown()
EOF
ok "EPERM on read-only"
stop_server

echo "PASS"
