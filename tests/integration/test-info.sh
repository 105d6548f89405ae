#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport info: on images made by qemu-img (v2, v3, extended L2, zstd,
# lazy refcounts, refcount widths, a backing chain, snapshots, bitmaps, an
# external data file, a dirty image left by a killed qemu-io), the JSON
# output agrees with `qemu-img info --output=json` and the text output
# holds the lines of `qemu-img info`; corrupt snapshot tables and bitmap
# directories give exit status 1 and a message, never a crash.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T" # relative names, as a user types them

# compare_json IMAGE [ARGS...]: blockport info --json vs qemu-img info.
compare_json() {
    local img=$1
    shift
    "$BLOCKPORT" info --json "$@" "$img" >"$T/ours.json" 2>"$T/ours.err" ||
        { fail_soft "$img: blockport info --json failed: $(cat "$T/ours.err")"; return 0; }
    qemu-img info --output=json "$@" "$img" >"$T/theirs.json" ||
        { fail_soft "$img: qemu-img info failed"; return 0; }
    "$PY" - "$T/ours.json" "$T/theirs.json" <<'PYEOF' || fail_soft "$img $*: JSON differs"
import json, sys
ours, theirs = (json.load(open(f)) for f in sys.argv[1:3])
if not isinstance(ours, list):
    ours, theirs = [ours], [theirs]
assert len(ours) == len(theirs), f"{len(ours)} images, qemu-img has {len(theirs)}"
keys = ["virtual-size", "filename", "cluster-size", "format", "actual-size",
        "dirty-flag", "backing-filename", "full-backing-filename",
        "backing-filename-format", "format-specific", "snapshots"]
bad = 0
for o, t in zip(ours, theirs):
    for k in keys:
        if o.get(k) != t.get(k):
            print(f"  {t.get('filename')}: {k}: ours {o.get(k)!r}, "
                  f"qemu-img {t.get(k)!r}", file=sys.stderr)
            bad += 1
sys.exit(1 if bad else 0)
PYEOF
}

# compare_text IMAGE: every line of `qemu-img info` is in ours.
compare_text() {
    local img=$1 line
    "$BLOCKPORT" info "$img" >"$T/ours.txt" 2>"$T/ours.err" ||
        { fail_soft "$img: blockport info failed: $(cat "$T/ours.err")"; return 0; }
    qemu-img info "$img" >"$T/theirs.txt"
    while IFS= read -r line; do
        grep -qxF -- "$line" "$T/ours.txt" ||
            fail_soft "$img: text output lacks '$line'"
    done <"$T/theirs.txt"
}

check "qcow2 variants made by qemu-img"
qemu-img create -q -f raw base.raw 4M
qemu-img create -q -f qcow2 -o compat=0.10 v2.qcow2 1G
qemu-img create -q -f qcow2 v3.qcow2 10G
qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=32k ext.qcow2 100M
qemu-img create -q -f qcow2 -o compression_type=zstd zstd.qcow2 100M
qemu-img create -q -f qcow2 -o lazy_refcounts=on,refcount_bits=8 lazy.qcow2 3M
qemu-img create -q -f qcow2 -o cluster_size=512,refcount_bits=1 small.qcow2 1M
qemu-img create -q -f qcow2 -o data_file=data.raw datafile.qcow2 8M
qemu-img create -q -f qcow2 -o data_file=data2.raw,data_file_raw=on datafile-raw.qcow2 8M
for img in base.raw v2.qcow2 v3.qcow2 ext.qcow2 zstd.qcow2 lazy.qcow2 \
    small.qcow2 datafile.qcow2 datafile-raw.qcow2; do
    compare_json "$img"
    compare_text "$img"
done
# -f raw on a qcow2 file shows the file itself.
"$BLOCKPORT" info --json -f raw v3.qcow2 | grep -q '"format": "raw"' ||
    fail_soft "-f raw"
ok "variants"

check "backing chain (relative names in a subdirectory)"
mkdir -p sub
qemu-img create -q -f qcow2 -b ../base.raw -F raw sub/mid.qcow2
qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 sub/top.qcow2
qemu-img create -q -f qcow2 -b sub/top.qcow2 -F qcow2 top2.qcow2 8M
qemu-img create -q -f qcow2 -u -b nosuch.qcow2 -F qcow2 missing.qcow2 1M
for img in sub/mid.qcow2 sub/top.qcow2 top2.qcow2 missing.qcow2; do
    compare_json "$img"
    compare_text "$img"
done
compare_json top2.qcow2 --backing-chain
"$BLOCKPORT" info --backing-chain top2.qcow2 >chain.txt ||
    fail_soft "text --backing-chain failed"
for f in top2.qcow2 sub/top.qcow2 sub/mid.qcow2 sub/../base.raw; do
    grep -qxF "image: $f" chain.txt || fail_soft "chain lacks image: $f"
done
# A loop is an error, not a hang.
qemu-img create -q -f qcow2 -u -b loop2.qcow2 -F qcow2 loop1.qcow2 1M
qemu-img create -q -f qcow2 -u -b loop1.qcow2 -F qcow2 loop2.qcow2 1M
rc=0
"$BLOCKPORT" info --backing-chain loop1.qcow2 >/dev/null 2>err || rc=$?
[[ $rc == 1 ]] && grep -q loop err || fail_soft "backing loop: exit $rc"
rc=0
"$BLOCKPORT" info --backing-chain missing.qcow2 >/dev/null 2>err || rc=$?
[[ $rc == 1 && -s err ]] || fail_soft "missing backing file: exit $rc"
ok "backing chain"

check "snapshots, bitmaps, a dirty image"
qemu-img create -q -f qcow2 snap.qcow2 64M
qemu-img snapshot -c first snap.qcow2
qemu-io -c "write -P 1 0 1M" snap.qcow2 >/dev/null
qemu-img snapshot -c "second with spaces" snap.qcow2
qemu-img snapshot -c s3 snap.qcow2
qemu-img snapshot -d s3 snap.qcow2
qemu-img snapshot -c "a-much-longer-snapshot-name-than-the-column-is-wide" snap.qcow2
compare_json snap.qcow2
compare_text snap.qcow2
qemu-img snapshot -l snap.qcow2 | tail -n +2 >theirs-snap.txt
"$BLOCKPORT" info snap.qcow2 | sed -n '/^Snapshot list:/,/^Format/p' |
    sed -e '1d' -e '$d' >ours-snap.txt
diff -u theirs-snap.txt ours-snap.txt || fail_soft "snapshot list differs from qemu-img snapshot -l"
qemu-img create -q -f qcow2 bitmaps.qcow2 64M
qemu-img bitmap --add bitmaps.qcow2 b0
qemu-img bitmap --add -g 128k bitmaps.qcow2 "bitmap one"
qemu-img bitmap --disable bitmaps.qcow2 "bitmap one"
compare_json bitmaps.qcow2
compare_text bitmaps.qcow2
qemu-img create -q -f qcow2 -o lazy_refcounts=on dirty.qcow2 16M
(qemu-io -c "write 0 64k" -c "sigraise 9" dirty.qcow2 || true) >/dev/null 2>&1
if qemu-img info --output=json dirty.qcow2 | grep -q '"dirty-flag": true'; then
    compare_json dirty.qcow2
    compare_text dirty.qcow2
else
    skip_case "qemu-io did not leave a dirty image: no dirty check"
fi
ok "snapshots, bitmaps, dirty"

check "corrupt images: exit 1 and a message"
# patch NAME SRC PYTHON: copy SRC to NAME and run PYTHON with d (bytearray
# of the file), be16/be32/be64(off, value) and the header's snapshot
# table offset in so; the result is written back.
patch() {
    local name=$1 src=$2 code=$3
    "$PY" - "$src" "$name" "$code" <<'PYEOF'
import struct, sys
src, dst, code = sys.argv[1:4]
d = bytearray(open(src, "rb").read())
def be16(o, v): d[o:o+2] = struct.pack(">H", v)
def be32(o, v): d[o:o+4] = struct.pack(">I", v)
def be64(o, v): d[o:o+8] = struct.pack(">Q", v)
so = struct.unpack(">Q", d[64:72])[0]
exec(code)
open(dst, "wb").write(d)
PYEOF
}
expect_corrupt() {
    local img=$1 rc=0 args
    for args in "" "--json"; do
        rc=0
        "$BLOCKPORT" info $args "$img" >out 2>err || rc=$?
        if [[ $rc != 1 ]]; then
            fail_soft "$img ($args): exit $rc, expected 1: $(head -c 300 err)"
        elif ! grep -q "$img" err; then
            fail_soft "$img ($args): no message naming the image"
        elif [[ -s out ]]; then
            fail_soft "$img ($args): printed output despite the error"
        fi
        check_sanitizer_reports err
    done
}
patch c-nb-huge.qcow2 snap.qcow2 'be32(60, 0xffffffff)'
patch c-nb-past.qcow2 snap.qcow2 'be32(60, 60000)'
patch c-nb-more.qcow2 snap.qcow2 'be32(60, 4)'
patch c-off-unaligned.qcow2 snap.qcow2 'be64(64, so + 8)'
patch c-off-past.qcow2 snap.qcow2 'be64(64, 1 << 50)'
patch c-id-len.qcow2 snap.qcow2 'be16(so + 12, 0xffff)'
patch c-id-zero.qcow2 snap.qcow2 'be16(so + 12, 0)'
patch c-name-len.qcow2 snap.qcow2 'be16(so + 14, 0xffff); del d[so + 40 + 24 + 20:]'
patch c-extra.qcow2 snap.qcow2 'be32(so + 36, 0xffffffff)'
patch c-extra-big.qcow2 snap.qcow2 'be32(so + 36, 60000)'
patch c-l1-size.qcow2 snap.qcow2 'be32(so + 8, 0x7fffffff)'
patch c-l1-off.qcow2 snap.qcow2 'be64(so, 0x123)'
patch c-truncated.qcow2 snap.qcow2 'del d[so + 30:]'
patch c-nul-name.qcow2 snap.qcow2 'd[so + 40 + 24 + 1] = 0'
patch c-header.qcow2 snap.qcow2 'be32(20, 40)'
patch c-bitmap-dir.qcow2 bitmaps.qcow2 '
import struct
o = struct.unpack(">I", d[100:104])[0]
while True:
    t, l = struct.unpack(">II", d[o:o+8])
    if t == 0x23852875:
        be64(o + 8 + 16, 1 << 48)
        break
    o += 8 + ((l + 7) & ~7)'
patch c-bitmap-name.qcow2 bitmaps.qcow2 '
import struct
o = struct.unpack(">I", d[100:104])[0]
while True:
    t, l = struct.unpack(">II", d[o:o+8])
    if t == 0x23852875:
        dirsz, diroff = struct.unpack(">QQ", d[o+16:o+32])
        be16(diroff + 18, 0xfff0)
        break
    o += 8 + ((l + 7) & ~7)'
head -c 100 snap.qcow2 >c-short.qcow2
n=0
for img in c-*.qcow2; do
    expect_corrupt "$img"
    n=$((n + 1))
done
ok "$n corrupt images refused"

check "usage errors: exit 1 (qemu-img's convention)"
for args in "" "a b" "--output=xml v3.qcow2" "-f vmdk v3.qcow2" "--nosuch v3.qcow2"; do
    rc=0
    # shellcheck disable=SC2086
    "$BLOCKPORT" info $args >/dev/null 2>&1 || rc=$?
    [[ $rc == 1 ]] || fail_soft "info $args: exit $rc, expected 1"
done
rc=0
"$BLOCKPORT" info nosuch.qcow2 >/dev/null 2>err || rc=$?
[[ $rc == 1 && -s err ]] || fail_soft "missing file: exit $rc"
"$BLOCKPORT" info --help | grep -q Usage || fail_soft "--help"
ok "usage"

check "an NBD URI: the guest view, as qemu-img info shows it"
truncate -s 48M nbd.raw
start_server nbd.raw
"$BLOCKPORT" info --json "$URI" >ours.json || fail "info --json of $URI"
qemu-img info --output=json "$URI" >theirs.json
"$PY" - ours.json theirs.json <<'PYEOF' || fail "JSON differs from qemu-img's"
import json, sys
ours, theirs = (json.load(open(f)) for f in sys.argv[1:3])
for k in ("virtual-size", "format", "actual-size"):
    assert ours.get(k) == theirs.get(k), (k, ours.get(k), theirs.get(k))
PYEOF
"$BLOCKPORT" info "$URI" >ours.txt || fail "info of $URI"
qemu-img info "$URI" | grep -v '^image:' >theirs.txt
while IFS= read -r line; do
    grep -qxF -- "$line" ours.txt || fail "text output lacks '$line'"
done <theirs.txt
rc=0; "$BLOCKPORT" info -f qcow2 "$URI" >/dev/null 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "read as raw" err || fail "-f qcow2 of a URI: exit $rc"
stop_server
rc=0; "$BLOCKPORT" info "$URI" >/dev/null 2>err || rc=$?
[[ $rc == 1 && -s err ]] || fail "a URI with no server: exit $rc"
ok "size, format and disk size as qemu-img; no server: exit 1"
