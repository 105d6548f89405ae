#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Broken and hostile qcow2 images.  Images are made with qemu-img/qemu-io and
# then patched (big-endian header fields, see qemu docs/interop/qcow2.rst:
# magic 0, version 4, backing_file_offset 8, backing_file_size 16,
# cluster_bits 20, size 24, crypt_method 32, l1_size 36, l1_table_offset 40,
# refcount_table_offset 48, refcount_table_clusters 56, nb_snapshots 60,
# snapshots_offset 64, incompatible_features 72, compatible_features 80,
# autoclear_features 88, refcount_order 96, header_length 100).
#
# Expectations:
#   refused   `blockport serve --readonly` exits promptly (no hang), with a
#             non-zero status below 128 (no crash signal), no sanitizer
#             report, and a message naming the reason (a regex matched with
#             the temporary directory taken out of the paths; image files
#             have neutral names so they cannot satisfy the match):
#             cluster_bits 8/22/64, unaligned L1 table, L1 table past EOF,
#             l1_size 2^31 / 2^32-1 / 0, absurd sizes, unknown incompatible
#             feature, encryption (AES and LUKS method), versions 1 and 4,
#             unknown compression type, data-file bit without a name,
#             backing file loops (self, two images, below the top), missing
#             backing file, unsupported backing format, backing name too
#             long / past EOF, nbd://, http://, nbdkit: and json: backing names,
#             truncated files (header only, mid-header).
#   corrupt   the corrupt bit (incompatible bit 1): refused without
#             --readonly (message mentions "corrupt"); served with
#             --readonly, read-only (writes fail), reading like the healthy
#             image.
#   eio       served; reading the damaged cluster fails with EIO (or reads
#             zeroes where QEMU does: a data cluster past EOF), the rest
#             reads like the healthy image, block status (both contexts)
#             may fail but must not kill the connection, the server stays
#             up and exits 0 on SIGTERM: L2 entry past EOF, L2 entry
#             unaligned, L1 entry (L2 table offset) unaligned, compressed
#             cluster with a garbage stream or pointing past EOF, extended
#             L2 bitmaps that QEMU calls invalid (subcluster allocated and
#             zero; allocated subclusters in an unallocated cluster).
#   robust    either refused as above, or served with every read either
#             correct (like the healthy image) or failing with EIO; never a
#             crash, hang or sanitizer report: refcount_order 7, unaligned
#             refcount table, absurd header_length, snapshot table past EOF,
#             L1 entry past EOF.
#   Also: a broken magic is not qcow2 (probed as raw): no crash.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io nbdinfo nbdcopy cmp timeout truncate
require_py_nbd
require nbdsh

M=$((1024 * 1024))
CS=65536
SIZE=$((16 * M))
D=$T/img
mkdir -p "$D"
# Seconds a refused image may take to be refused.
REFUSE_TIMEOUT=10

# ---------------------------------------------------------------- images

# The healthy image every case starts from (64k clusters, 16 MiB): data in
# clusters 0, 1, 5, 100-101 and the last one; everything else unallocated.
qemu-img create -q -f qcow2 -o cluster_size=$CS "$D/healthy.qcow2" $SIZE
qemu-io -c "write -P 0x11 0 $CS" -c "write -P 0x22 $CS $CS" \
    -c "write -P 0x55 $((5 * CS)) $CS" -c "write -P 0x64 $((100 * CS)) $((2 * CS))" \
    -c "write -P 0xee $((SIZE - CS)) $CS" "$D/healthy.qcow2" >/dev/null ||
    fail "test bug: qemu-io failed"
qemu-img convert -O raw "$D/healthy.qcow2" "$D/healthy.raw"

# And a compressed one.
"$PY" -c 'import sys
open(sys.argv[1], "wb").write((b"compressible qcow2 cluster " * 40000)[:1 << 20])' "$D/src.raw"
qemu-img convert -c -O qcow2 -o cluster_size=$CS "$D/src.raw" "$D/compressed.qcow2"
qemu-img convert -O raw "$D/compressed.qcow2" "$D/compressed.raw"

# And one with extended L2 entries (64k clusters, 2k subclusters): cluster
# 2 fully written, cluster 3 only in its first subcluster.
qemu-img create -q -f qcow2 -o cluster_size=$CS,extended_l2=on "$D/extl2.qcow2" $SIZE
qemu-io -c "write -P 0x11 0 $CS" -c "write -P 0x22 $((2 * CS)) $CS" \
    -c "write -P 0x33 $((3 * CS)) 2048" "$D/extl2.qcow2" >/dev/null ||
    fail "test bug: qemu-io failed"
qemu-img convert -O raw "$D/extl2.qcow2" "$D/extl2.raw"

cat >"$T/qpatch.py" <<'EOF'
"""qpatch.py FILE CMD ARGS: patch a qcow2 image in place.

  hdr OFF FMT VALUE      struct.pack_into(">"+FMT, hdr, OFF, VALUE)
  l2 CLUSTER MODE        rewrite the L2 entry of guest cluster CLUSTER
  l1 INDEX MODE          rewrite L1 entry INDEX
     MODE: eof (offset 1 TiB), unaligned (offset + 512)
  bitmap CLUSTER VALUE   OR VALUE into the extended L2 bitmap of CLUSTER
  ceof CLUSTER           point compressed cluster CLUSTER past EOF
  garbage CLUSTER        overwrite the start of compressed cluster CLUSTER's
                         stream with 0xff bytes
  setbacking NAME        store NAME as backing file name in the header
                         cluster (after the header extensions)
"""
import struct, sys

path, cmd, *args = sys.argv[1:]
f = open(path, "r+b")

def get(off, fmt):
    f.seek(off)
    return struct.unpack(">" + fmt, f.read(struct.calcsize(fmt)))[0]

def put(off, fmt, val):
    f.seek(off)
    f.write(struct.pack(">" + fmt, val))

OFF_MASK = 0x00fffffffffffe00
cb = get(20, "I")
ext_l2 = get(72, "Q") & (1 << 4)
esz = 16 if ext_l2 else 8
l2_bits = cb - (4 if ext_l2 else 3)
l1_off = get(40, "Q")

def l2_entry_pos(cluster):
    l1e = get(l1_off + 8 * (cluster >> l2_bits), "Q")
    l2_off = l1e & OFF_MASK
    assert l2_off, "cluster %d has no L2 table" % cluster
    return l2_off + esz * (cluster & ((1 << l2_bits) - 1))

def remap(entry, mode):
    if mode == "eof":
        return (entry & ~OFF_MASK) | (1 << 40)
    if mode == "unaligned":
        assert entry & OFF_MASK, "entry not allocated"
        return (entry & ~OFF_MASK) | ((entry & OFF_MASK) + 512)
    raise SystemExit("bad mode " + mode)

if cmd == "hdr":
    off, fmt, val = int(args[0]), args[1], int(args[2], 0)
    put(off, fmt, val)
elif cmd == "l2":
    pos = l2_entry_pos(int(args[0]))
    e = get(pos, "Q")
    assert e & OFF_MASK and not e & (1 << 62), "cluster not a normal allocated one"
    put(pos, "Q", remap(e, args[1]))
elif cmd == "l1":
    pos = l1_off + 8 * int(args[0])
    put(pos, "Q", remap(get(pos, "Q"), args[1]))
elif cmd == "bitmap":
    assert ext_l2, "not an extended L2 image"
    pos = l2_entry_pos(int(args[0])) + 8
    put(pos, "Q", get(pos, "Q") | int(args[1], 0))
elif cmd == "ceof":
    pos = l2_entry_pos(int(args[0]))
    e = get(pos, "Q")
    assert e & (1 << 62), "cluster is not compressed"
    x = 62 - (cb - 8)
    put(pos, "Q", (e & ~((1 << x) - 1)) | (1 << 40))
elif cmd == "garbage":
    e = get(l2_entry_pos(int(args[0])), "Q")
    assert e & (1 << 62), "cluster is not compressed"
    x = 62 - (cb - 8)
    off = e & ((1 << x) - 1)
    f.seek(off)
    f.write(b"\xff" * 64)
elif cmd == "setbacking":
    name = args[0].encode()
    # Put the name in the last 1 KiB of the header cluster, which qemu-img
    # leaves unused for a fresh image.
    off = (1 << cb) - 1024
    f.seek(off)
    f.write(name)
    put(8, "Q", off)
    put(16, "I", len(name))
else:
    raise SystemExit("bad command " + cmd)
EOF

qpatch() { "$PY" "$T/qpatch.py" "$@" || fail "test bug: qpatch $*"; }

# mk NAME [SOURCE]: a copy of the healthy (or SOURCE) image, in $img.  Files
# get neutral names (case-N.qcow2): the refusal messages name the file, and
# a name like "corrupt-bit" would satisfy the keyword match by itself.
NCASE=0
mk() {
    NCASE=$((NCASE + 1))
    cp "$D/${2:-healthy}.qcow2" "$D/case-$NCASE.qcow2"
    echo "case-$NCASE.qcow2: $1" >>"$D/cases.txt"
    img=$D/case-$NCASE.qcow2
}

# ---------------------------------------------------------------- checks

# try_serve IMAGE [serve options...]: run the server on IMAGE for at most
# REFUSE_TIMEOUT seconds.  Sets TRY_RC (exit status, or "up" if it started
# serving) and TRY_OUT (its output file).
try_serve() {
    local img=$1 pid
    shift
    TRY_OUT=$T/try.log
    rm -f "$T/try.sock" "$T/try.pid"
    "$BLOCKPORT" serve --unix "$T/try.sock" --pid-file "$T/try.pid" "$@" "$img" \
        </dev/null >"$TRY_OUT" 2>&1 &
    pid=$!
    TRY_RC=hang
    if wait_file "$REFUSE_TIMEOUT" "$T/try.pid" $pid; then
        TRY_RC=up
    elif _pid_gone $pid; then
        TRY_RC=0
        wait $pid || TRY_RC=$?
        return
    fi
    kill -TERM $pid 2>/dev/null || true
    wait_until 2 _pid_gone $pid || kill -KILL $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
}

# Did the refused server exit cleanly, naming REGEX?  Returns 1 (and
# records the failure) otherwise.
check_refused() {
    local what=$1 regex=$2
    case $TRY_RC in
    up)
        fail_soft "$what: server started serving; expected a refusal matching /$regex/"
        return 1 ;;
    hang)
        fail_soft "$what: server neither started nor exited within ${REFUSE_TIMEOUT}s"
        return 1 ;;
    0)
        fail_soft "$what: server exited with status 0; expected a refusal"
        return 1 ;;
    esac
    if ((TRY_RC >= 128)); then
        sed 's/^/    /' "$TRY_OUT" | tail -n 30 >&2
        fail_soft "$what: server died with status $TRY_RC (signal $((TRY_RC - 128)))"
        return 1
    fi
    if grep -qE 'ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:' "$TRY_OUT"; then
        sed 's/^/    /' "$TRY_OUT" | head -n 40 >&2
        fail_soft "$what: sanitizer report"
        return 1
    fi
    # Match the message with paths (temporary directory) taken out.
    sed -e "s|$T|<tmp>|g" "$TRY_OUT" >"$TRY_OUT.msg"
    if ! grep -qiE "$regex" "$TRY_OUT.msg"; then
        sed 's/^/    /' "$TRY_OUT" >&2
        fail_soft "$what: refusal message does not match /$regex/"
        return 1
    fi
    ok "$what: refused (status $TRY_RC): $(grep -iE "$regex" "$TRY_OUT.msg" | head -n 1)"
}

# ok_if_clean N MSG: print ok MSG unless failures were recorded since the
# count was N.
ok_if_clean() {
    [[ ${#_SOFT_FAILURES[@]} -eq $1 ]] && ok "$2"
    return 0
}

expect_refused() { # expect_refused WHAT REGEX IMAGE [serve options]
    local what=$1 regex=$2 img=$3
    shift 3
    check "$what: refused"
    try_serve "$img" "$@"
    check_refused "$what" "$regex" || true
}

# The python side of the "served" checks, run in nbdsh (which has h and
# nbd).  Environment: URI, RAW (what QEMU reads from the healthy image),
# SPEC (OFF:LEN:EXPECT ..., EXPECT = good | eio | any: good or EIO), GOOD
# (offset of a readable 512 bytes, or "none").
cat >"$T/served.py" <<'EOF'
import errno, os, sys
h.add_meta_context("base:allocation")
h.add_meta_context("qemu:allocation-depth")
h.connect_uri(os.environ["URI"])
raw = open(os.environ["RAW"], "rb").read()
errs = []
for item in os.environ["SPEC"].split():
    off, ln, want = item.split(":")
    off, ln = int(off), int(ln)
    try:
        got = h.pread(ln, off)
    except nbd.Error as ex:
        if want in ("eio", "any") and ex.errnum == errno.EIO:
            print("  pread(%d, %d): EIO as expected" % (ln, off))
        else:
            errs.append("pread(%d, %d) failed: %s (errnum %s), expected %s"
                        % (ln, off, ex, ex.errnum, want))
        continue
    if want == "eio":
        errs.append("pread(%d, %d) succeeded, expected EIO (got %s...)"
                    % (ln, off, got[:8].hex()))
    elif want == "zero":
        if got != bytes(ln):
            errs.append("pread(%d, %d) returned data, expected zeroes"
                        % (ln, off))
    elif got != raw[off:off + ln]:
        errs.append("pread(%d, %d) returned data differing from the healthy image"
                    % (ln, off))
# Block status over everything, in chunks: an error is acceptable, a dead
# connection is not.
def cb(metacontext, offset, entries, err):
    return 0
size = h.get_size()
for off in range(0, size, 1 << 20):
    try:
        h.block_status(min(1 << 20, size - off), off, cb)
    except nbd.Error as ex:
        print("  block_status at %d: %s (acceptable)" % (off, ex))
good = os.environ.get("GOOD", "0")
try:
    if good != "none" and h.pread(512, int(good)) != raw[int(good):int(good) + 512]:
        errs.append("read at %s after the damaged reads returned wrong data" % good)
except nbd.Error as ex:
    errs.append("read at %s after the damaged reads failed: %s" % (good, ex))
if not h.aio_is_ready() and not h.aio_is_processing():
    errs.append("connection no longer usable")
if errs:
    for e in errs:
        print("    " + e, file=sys.stderr)
    sys.exit(1)
EOF

# expect_served WHAT IMAGE RAW SPEC: served read-only, reads per SPEC.
served_check() {
    local what=$1 img=$2 raw=$3 spec=$4
    : >"$T/server.log"
    start_server --readonly "$img"
    if ! URI=$URI RAW=$raw SPEC=$spec GOOD=${GOOD:-0} run nbdsh -c "exec(open('$T/served.py').read())"; then
        fail_soft "$what: reads over the damaged image were not as expected"
    fi
    # A second connection still works.
    if ! run nbdinfo --size "$URI" >/dev/null; then
        fail_soft "$what: server no longer accepts connections"
    fi
    if ! server_alive; then
        local rc=0
        wait "$SERVER_PID" || rc=$?
        SERVER_PID=
        tail -n 40 "$T/server.log" >&2
        check_sanitizer_reports "$T/server.log"
        fail_soft "$what: server died (status $rc)"
        return
    fi
    stop_server
}

expect_eio() { # expect_eio WHAT IMAGE RAW SPEC
    local nf=${#_SOFT_FAILURES[@]}
    check "$1: served, damaged cluster reads fail with EIO"
    try_serve "$2" --readonly
    if [[ $TRY_RC != up ]]; then
        sed 's/^/    /' "$TRY_OUT" >&2
        fail_soft "$1: server did not start (status $TRY_RC); expected it to serve and fail reads of the damaged cluster only"
        return
    fi
    served_check "$@"
    ok_if_clean "$nf" "$1"
}

expect_robust() { # expect_robust WHAT REGEX IMAGE RAW SPEC
    local what=$1 regex=$2 img=$3 raw=$4 spec=$5 nf=${#_SOFT_FAILURES[@]}
    check "$what: refused, or served with correct data / EIO"
    try_serve "$img" --readonly
    if [[ $TRY_RC == up ]]; then
        served_check "$what" "$img" "$raw" "$spec"
        ok_if_clean "$nf" "$what: served"
    else
        check_refused "$what" "$regex" || true
    fi
}

# Reads covering every interesting cluster of the healthy image.
good_spec() {
    local c s=""
    for c in 0 1 2 5 50 100 101 $((SIZE / CS - 1)); do
        s+=" $((c * CS)):$CS:${1:-good} $((c * CS + 1000)):3000:${1:-good}"
    done
    echo "$s"
}

# ---------------------------------------------------------------- cases

# Sanity: the healthy image is served, and reads right, else nothing below
# means anything.
check "healthy image is served"
try_serve "$D/healthy.qcow2" --readonly
[[ $TRY_RC == up ]] || { cat "$TRY_OUT" >&2; fail "blockport does not serve a healthy qcow2 image read-only"; }
served_check healthy "$D/healthy.qcow2" "$D/healthy.raw" "$(good_spec)"
[[ ${#_SOFT_FAILURES[@]} -eq 0 ]] || fail "the healthy image does not read right"

# --- refused: header fields
mk cluster-bits-8;  qpatch "$img" hdr 20 I 8
expect_refused "cluster_bits 8" 'cluster' "$img" --readonly
mk cluster-bits-22; qpatch "$img" hdr 20 I 22
expect_refused "cluster_bits 22" 'cluster' "$img" --readonly
mk cluster-bits-64; qpatch "$img" hdr 20 I 64
expect_refused "cluster_bits 64" 'cluster' "$img" --readonly

mk l1-unaligned; l1=$("$PY" -c 'import struct,sys; f=open(sys.argv[1],"rb"); f.seek(40); print(struct.unpack(">Q",f.read(8))[0])' "$img")
qpatch "$img" hdr 40 Q $((l1 + 8))
expect_refused "l1_table_offset unaligned" 'l1' "$img" --readonly
mk l1-past-eof; qpatch "$img" hdr 40 Q $((1 << 40))
expect_refused "l1_table_offset past end of file" 'l1|end of file|eof|beyond|past|truncat' "$img" --readonly
mk l1-size-huge; qpatch "$img" hdr 36 I $((1 << 31))
expect_refused "l1_size 2^31" 'l1' "$img" --readonly
mk l1-size-max; qpatch "$img" hdr 36 I $((0xffffffff))
expect_refused "l1_size 2^32-1" 'l1' "$img" --readonly
mk l1-size-0; qpatch "$img" hdr 36 I 0
expect_refused "l1_size 0 (too small for the size)" 'l1|size' "$img" --readonly

mk size-2e62; qpatch "$img" hdr 24 Q $((1 << 62))
expect_refused "size 2^62 (L1 too small)" 'size|l1|large' "$img" --readonly
mk size-max; qpatch "$img" hdr 24 Q 0xffffffffffffffff
expect_refused "size 2^64-1" 'size|l1|large' "$img" --readonly
# Size and L1 consistent, but beyond what any L1 may address (2^31 entries
# of 64k clusters of 8k entries = 2^60 bytes... pick 2^63 - 512).
mk size-2e63; qpatch "$img" hdr 24 Q $(((1 << 63) - 512))
expect_refused "size 2^63-512" 'size|l1|large' "$img" --readonly

mk incompat-bit20; qpatch "$img" hdr 72 Q $((1 << 20))
expect_refused "unknown incompatible feature bit 20" 'incompatible|feature|unsupported|unknown' "$img" --readonly

mk crypt-aes; qpatch "$img" hdr 32 I 1
expect_refused "crypt_method 1 (AES)" 'encrypt' "$img" --readonly
mk crypt-luks; qpatch "$img" hdr 32 I 2
expect_refused "crypt_method 2 (LUKS)" 'encrypt' "$img" --readonly

mk bad-magic; qpatch "$img" hdr 0 I 0x51464a00
check "bad magic: not probed as qcow2"
# With the magic broken it is a raw image to the prober; serving it as raw
# is correct, so only make sure nothing crashes.
try_serve "$img" --readonly
[[ $TRY_RC == up || ( $TRY_RC =~ ^[0-9]+$ && $TRY_RC -lt 128 ) ]] ||
    fail_soft "bad magic: server status $TRY_RC"
mk version-4; qpatch "$img" hdr 4 I 4
expect_refused "version 4" 'version' "$img" --readonly
mk version-1; qpatch "$img" hdr 4 I 1
expect_refused "version 1 (qcow, not qcow2)" 'qcow image: not supported' "$img" --readonly

# --- refused: truncated files
hlen=$("$PY" -c 'import struct,sys; f=open(sys.argv[1],"rb"); f.seek(100); print(struct.unpack(">I",f.read(4))[0])' "$D/healthy.qcow2")
mk truncated-header-only; truncate -s "$hlen" "$img"
expect_refused "truncated to the header ($hlen bytes)" 'l1|trunc|end of file|eof|short|beyond|past|refcount' "$img" --readonly
mk truncated-mid-header; truncate -s 50 "$img"
expect_refused "truncated inside the header (50 bytes)" 'trunc|header|short|end of file|eof|small|not a qcow2' "$img" --readonly

# --- refused: backing files
mkdir -p "$D/chain"
qemu-img create -q -f qcow2 "$D/chain/self.qcow2" $SIZE
qemu-img rebase -u -b self.qcow2 -F qcow2 "$D/chain/self.qcow2"
expect_refused "backing file is the image itself" 'loop' "$D/chain/self.qcow2" --readonly
qemu-img create -q -f qcow2 -u -b b.qcow2 -F qcow2 "$D/chain/a.qcow2" $SIZE
qemu-img create -q -f qcow2 -u -b a.qcow2 -F qcow2 "$D/chain/b.qcow2" $SIZE
expect_refused "two-image backing loop" 'loop' "$D/chain/a.qcow2" --readonly
qemu-img create -q -f qcow2 -u -b c.qcow2 -F qcow2 "$D/chain/three-a.qcow2" $SIZE
qemu-img create -q -f qcow2 -u -b three-a.qcow2 -F qcow2 "$D/chain/c.qcow2" $SIZE
qemu-img create -q -f qcow2 -u -b c.qcow2 -F qcow2 "$D/chain/top.qcow2" $SIZE
expect_refused "backing loop below the top image" 'loop' "$D/chain/top.qcow2" --readonly
qemu-img create -q -f qcow2 -u -b missing.qcow2 -F qcow2 "$D/chain/orphan.qcow2" $SIZE
expect_refused "missing backing file" 'backing|missing|no such file' "$D/chain/orphan.qcow2" --readonly
# Backing names that are not local files: an NBD URI opens through the NBD
# source (nothing listens here: refused naming it); other URIs and QEMU
# json: descriptions made from a header never open anything.
qemu-img create -q -f qcow2 -u -b 'nbd://127.0.0.1:9/x' -F raw "$D/chain/uri.qcow2" $SIZE
expect_refused "unreachable nbd:// backing" 'cannot open backing file nbd://127.0.0.1:9/x' \
  "$D/chain/uri.qcow2" --readonly
qemu-img create -q -f qcow2 -u -b 'http://127.0.0.1:9/x' -F raw "$D/chain/http.qcow2" $SIZE
expect_refused "http:// backing name" 'neither a local file nor a source' \
  "$D/chain/http.qcow2" --readonly
# A plugin spec would load code: as a backing name it is only a file name.
qemu-img create -q -f qcow2 -u -b 'nbdkit:memory' -F raw "$D/chain/plugin.qcow2" $SIZE
expect_refused "nbdkit: backing name" 'cannot open backing file .*nbdkit:memory: No such file' \
  "$D/chain/plugin.qcow2" --readonly
qemu-img create -q -f qcow2 -u -b 'json:{"driver":"raw","file":{"driver":"file","filename":"/etc/passwd"}}' \
  -F raw "$D/chain/json.qcow2" $SIZE
expect_refused "json: backing name" 'neither a local file nor a source' "$D/chain/json.qcow2" --readonly

# --- corrupt bit
mk corrupt-bit; qpatch "$img" hdr 72 Q 2
expect_refused "corrupt bit, writable" 'corrupt' "$img"
nf=${#_SOFT_FAILURES[@]}
check "corrupt bit, --readonly: served read-only, reads like the healthy image"
try_serve "$img" --readonly
if [[ $TRY_RC != up ]]; then
    sed 's/^/    /' "$TRY_OUT" >&2
    fail_soft "corrupt bit: not served with --readonly (status $TRY_RC)"
else
    : >"$T/server.log"
    start_server --readonly "$img"
    run nbdcopy --no-extents "$URI" - >"$T/corrupt.copy" || fail_soft "corrupt bit: nbdcopy failed"
    cmp "$D/healthy.raw" "$T/corrupt.copy" ||
        fail_soft "corrupt bit: export differs from the healthy image"
    run nbdsh -u "$URI" -c '
import errno
assert h.is_read_only(), "export is not read-only"
try:
    h.pwrite(b"x" * 512, 0)
    raise SystemExit("write to the corrupt image succeeded")
except nbd.Error as ex:
    print("  write refused: %s" % ex)
' || fail_soft "corrupt bit: export writable or write not refused"
    stop_server
    ok_if_clean "$nf" "corrupt bit served read-only"
fi

# --- served, EIO on the damaged cluster only
# spec_eio CLUSTER[=KIND]...: those clusters eio (or KIND: zero), good
# elsewhere.
spec_eio() {
    local c s="" bad
    for c in 0 1 2 5 50 100 101 $((SIZE / CS - 1)); do
        bad=good
        for b in "$@"; do
            [[ ${b%=*} == "$c" ]] && bad=eio && [[ $b == *=* ]] && bad=${b#*=}
        done
        s+=" $((c * CS)):$CS:$bad $((c * CS + 1000)):3000:$bad"
    done
    # A read spanning a good and the damaged cluster fails as a whole.
    [[ $1 == *=* ]] || s+=" $(($1 * CS - 512)):1024:eio"
    echo "$s"
}
# A data cluster past EOF reads as zeroes, as QEMU's file layer pads reads
# past the end of the file.
mk l2-past-eof; qpatch "$img" l2 5 eof
expect_eio "L2 entry of cluster 5 points past EOF" "$img" "$D/healthy.raw" "$(spec_eio 5=zero)"
mk l2-unaligned; qpatch "$img" l2 5 unaligned
expect_eio "L2 entry of cluster 5 unaligned" "$img" "$D/healthy.raw" "$(spec_eio 5)"
mk l2-both; qpatch "$img" l2 1 unaligned; qpatch "$img" l2 101 eof
expect_eio "L2 entries of clusters 1 (unaligned) and 101 (past EOF)" "$img" "$D/healthy.raw" "$(spec_eio 1 101=zero)"
# L1 entry 0 unaligned: the whole first L2 range (8192 clusters = all
# 16 MiB with 64k clusters) is unreadable.  All reads must fail.
mk l1-entry-unaligned; qpatch "$img" l1 0 unaligned
nf=${#_SOFT_FAILURES[@]}
check "L1 entry unaligned: served, reads of its range fail with EIO"
try_serve "$img" --readonly
if [[ $TRY_RC != up ]]; then
    sed 's/^/    /' "$TRY_OUT" >&2
    fail_soft "L1 entry unaligned: server did not start (status $TRY_RC)"
else
    : >"$T/server.log"
    start_server --readonly "$img"
    RAW=$D/healthy.raw SPEC="0:$CS:eio $((5 * CS + 7)):100:eio" run nbdsh -u "$URI" -c "
import errno, os
raw = open(os.environ['RAW'], 'rb').read()
for item in os.environ['SPEC'].split():
    off, ln, _ = item.split(':'); off, ln = int(off), int(ln)
    try:
        h.pread(ln, off)
        raise SystemExit('pread(%d, %d) succeeded, expected EIO' % (ln, off))
    except nbd.Error as ex:
        assert ex.errnum == errno.EIO, 'pread(%d, %d): %s, expected EIO' % (ln, off, ex)
print('  reads fail with EIO')
" || fail_soft "L1 entry unaligned: reads not failing with EIO"
    run nbdinfo --size "$URI" >/dev/null || fail_soft "L1 entry unaligned: server unreachable"
    stop_server
    ok_if_clean "$nf" "L1 entry unaligned"
fi

# Compressed cluster 3 with a garbage stream.
mk compressed-garbage compressed; qpatch "$img" garbage 3
spec="0:$CS:good $((2 * CS)):$CS:good $((3 * CS)):$CS:eio $((3 * CS + 100)):10:eio $((4 * CS)):$CS:good"
expect_eio "compressed cluster 3 with a garbage stream" "$img" "$D/compressed.raw" "$spec"

# Compressed cluster 3 whose descriptor points past EOF.
mk compressed-past-eof compressed; qpatch "$img" ceof 3
expect_eio "compressed cluster 3 points past EOF" "$img" "$D/compressed.raw" "$spec"

# Extended L2: a subcluster both allocated and zero (invalid per spec; QEMU
# fails the read with EIO), and allocation bits on an unallocated cluster.
# QEMU (7.2, verified with qemu-io) treats the whole cluster as invalid in
# both cases, not just the offending subcluster.
spec="0:$CS:good $((2 * CS)):2048:eio $((2 * CS + 5 * 2048)):2048:eio $((3 * CS)):2048:good
      $((3 * CS + 4096)):100:good $((7 * CS)):2048:eio $((7 * CS + 4096)):100:eio $((8 * CS)):$CS:good"
mk extl2-alloc-and-zero extl2; qpatch "$img" bitmap 2 $((1 << (32 + 5)))
qpatch "$img" bitmap 7 1
expect_eio "extended L2: subcluster allocated and zero; allocated subcluster in an unallocated cluster" \
    "$img" "$D/extl2.raw" "$spec"

# Compression type byte 7 (unknown) with the compression incompatible bit.
mk compression-type-7; qpatch "$img" hdr 72 Q $((1 << 3)); qpatch "$img" hdr 104 B 7
expect_refused "unknown compression type 7" 'compression' "$img" --readonly
# External data file bit without a data file name.
mk data-file-no-name; qpatch "$img" hdr 72 Q $((1 << 2))
expect_refused "external data file bit without a name" 'data.?file|external' "$img" --readonly
# Backing file of a format blockport does not read.
qemu-img create -q -f qcow2 -u -b other.img -F vmdk "$D/chain/odd-backed.qcow2" $SIZE
qemu-img create -q -f raw "$D/chain/other.img" $SIZE
expect_refused "backing format vmdk" 'format|vmdk' "$D/chain/odd-backed.qcow2" --readonly

# --- robust: refused or served correctly
mk refcount-order-7; qpatch "$img" hdr 96 I 7
expect_robust "refcount_order 7" 'refcount' "$img" "$D/healthy.raw" "$(good_spec)"
mk refcount-table-unaligned
rt=$("$PY" -c 'import struct,sys; f=open(sys.argv[1],"rb"); f.seek(48); print(struct.unpack(">Q",f.read(8))[0])' "$img")
qpatch "$img" hdr 48 Q $((rt + 8))
expect_robust "refcount table unaligned" 'refcount' "$img" "$D/healthy.raw" "$(good_spec)"
mk header-length-huge; qpatch "$img" hdr 100 I $((0x7fff0000))
expect_robust "header_length 0x7fff0000" 'header' "$img" "$D/healthy.raw" "$(good_spec)"
mk header-length-small; qpatch "$img" hdr 100 I 50
expect_robust "header_length 50" 'header' "$img" "$D/healthy.raw" "$(good_spec)"
mk backing-name-long; qpatch "$img" setbacking "$(printf 'x%.0s' {1..1000})"; qpatch "$img" hdr 16 I 4000
expect_refused "backing_file_size 4000" 'backing' "$img" --readonly
mk backing-name-past-eof; qpatch "$img" hdr 8 Q $((1 << 40)); qpatch "$img" hdr 16 I 10
expect_refused "backing file name past EOF" 'backing|end of file|eof|beyond|past|trunc' "$img" --readonly
mk snapshots-past-eof; qpatch "$img" hdr 60 I 1000; qpatch "$img" hdr 64 Q $((1 << 40))
expect_robust "snapshot table past EOF (1000 snapshots)" 'snapshot' "$img" "$D/healthy.raw" "$(good_spec)"
mk l1-entry-past-eof; qpatch "$img" l1 0 eof
# (QEMU reads zeroes there: its file layer pads reads past EOF.  Losing a
# whole L2 table silently is not acceptable for us: refuse or EIO.  All of
# the 16 MiB is behind L1 entry 0, so no read can succeed.)
GOOD=none expect_robust "L1 entry points past EOF" 'l1|l2|corrupt' "$img" "$D/healthy.raw" "$(good_spec any)"

echo "done"
