#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Read-only qcow2: blockport must expose exactly what QEMU reads from a qcow2
# image, and describe it the way QEMU does.  QEMU's own tools are the oracle:
#
#   images   made with qemu-img create / qemu-io / qemu-img convert over a
#            matrix of cluster sizes (512, 4k, 64k, 2M), refcount widths
#            (1, 16, 64), compat 0.10 and 1.1, extended L2 (subclusters),
#            zlib and zstd compression, backing chains of depth 3 (qcow2 and
#            raw bases, relative names in a subdirectory, a backing file
#            shorter than its overlay), internal snapshots, preallocation
#            (metadata, falloc, full), zero clusters (plain and allocated),
#            discards, lazy refcounts (also a dirty image left by a killed
#            writer), external data files (raw and not), a >4 GiB image.
#
# and for every image, served with `blockport serve --readonly IMAGE`:
#
#   (1) the export reads byte-for-byte like `qemu-img convert -O raw IMAGE`
#       (nbdcopy --no-extents, nbdcopy using block status, and a few hundred
#       unaligned preads, many straddling cluster/extent boundaries);
#   (2) base:allocation agrees with `qemu-img map --output=json`;
#   (3) qemu:allocation-depth agrees with qemu-img map's depth/present;
#   (4) for depth-3 chains, the depth values 1/2/3 appear where each layer
#       was written, 0 where nothing was.
#
# Normalisation rules for (2) and (3) (everything else must match exactly):
#   * qemu-img map says data:true zero:true where a cluster is allocated in
#     the image but the host file (or data file) has a hole there (QEMU asks
#     the protocol layer).  Whether the server also looks at the host file
#     is an implementation choice that does not change what is read, so in
#     such ranges the ZERO flag may be set or clear; HOLE must be clear.
#   * QEMU 7.2 does not look at an external data file's allocation at all
#     (qemu-img map says data:true zero:false for every allocated cluster of
#     a data_file image, holes in the data file included).  For images with
#     a data file, ZERO is therefore accepted in such ranges too, provided
#     the range really reads as zeroes (checked against the raw conversion).
#   * Where data:true, HOLE must be clear (fail otherwise).  Where
#     data:false, QEMU reads zeroes and reports HOLE|ZERO; we require the
#     same.  Where zero:false, ZERO must be clear.
#   * qemu-img map reports present:false (depth 0) beyond the end of a
#     backing file that is shorter than its overlay, while qemu-nbd's
#     qemu:allocation-depth reports that backing layer's depth there (QEMU
#     treats "past EOF" of a backing file as allocated zeroes): we answer
#     as qemu-nbd there; elsewhere depth must be qemu-img map's depth + 1
#     where present:true, and 0 where present:false.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io nbdinfo nbdcopy cmp timeout
require_py_nbd

K=1024
M=$((1024 * 1024))
G=$((1024 * M))
D=$T/img
mkdir -p "$D"

# ---------------------------------------------------------------- helpers

# qio IMAGE CMD...: run qemu-io commands on IMAGE (format probed, so the
# backing chain is honoured); a failed command fails the test.
qio() {
    local img=$1 c
    shift
    local -a a=()
    for c in "$@"; do a+=(-c "$c"); done
    if ! timeout 120 qemu-io "${a[@]}" "$img" >"$T/qio.out" 2>&1; then
        cat "$T/qio.out" >&2
        fail "test bug: qemu-io ${a[*]} $img failed"
    fi
}

qcreate() { # qcreate IMAGE SIZE [OPTS]
    local img=$1 size=$2 opts=${3:-}
    local -a o=()
    [[ -n $opts ]] && o=(-o "$opts")
    timeout 120 qemu-img create -q -f qcow2 "${o[@]}" "$img" "$size" ||
        fail "test bug: qemu-img create -f qcow2 ${o[*]} $img $size failed"
}

# A mix of writes that exercises cluster boundaries for cluster size CS in
# an image of SIZE bytes: aligned, sector-aligned across a cluster boundary,
# byte-unaligned, a rewrite of part of an existing cluster, zero writes
# (plain and with unmap) over data and over nothing, a discard, the tail.
std_writes() {
    local img=$1 cs=$2 size=$3
    qio "$img" \
        "write -P 0xa1 0 4096" \
        "write -P 0xa2 $((cs - 512)) 1536" \
        "write -P 0xa3 $((3 * M + 12345)) 7777" \
        "write -P 0xa4 $((4 * M)) $((3 * cs))" \
        "write -P 0xa5 $((4 * M + cs + 1)) 999" \
        "write -P 0xa6 $((6 * M - 3)) 5" \
        "write -z $((4 * M + 2 * cs)) $cs" \
        "write -P 0xa7 $((8 * M)) $((2 * cs))" \
        "write -z -u $((8 * M)) $cs" \
        "write -z $((9 * M)) $((2 * cs))" \
        "write -P 0xa8 $((10 * M)) $((4 * cs))" \
        "discard $((10 * M + cs)) $cs" \
        "write -P 0xa9 $((size - 1000)) 1000"
}

IMAGES=()   # names; image path is $D/NAME/image or IMG_PATH[NAME]
declare -A IMG_PATH IMG_FULL IMG_DEPTHS

add_image() { # add_image NAME PATH [full-compare: yes|no]
    IMAGES+=("$1")
    IMG_PATH[$1]=$2
    IMG_FULL[$1]=${3:-yes}
}

# ---------------------------------------------------------------- matrix

# Cluster sizes.
for cs in 512 4096 65536 2097152; do
    n=cluster-$cs
    mkdir -p "$D/$n"
    size=$((16 * M))
    ((cs == 2097152)) && size=$((32 * M))
    qcreate "$D/$n/image" $size "cluster_size=$cs"
    std_writes "$D/$n/image" $cs $size
    add_image $n "$D/$n/image"
done

# Refcount widths (16 is the default, covered above).
for rb in 1 64; do
    n=refcount-$rb
    mkdir -p "$D/$n"
    qcreate "$D/$n/image" $((16 * M)) "refcount_bits=$rb,cluster_size=4096"
    std_writes "$D/$n/image" 4096 $((16 * M))
    add_image $n "$D/$n/image"
done

# compat=0.10 (version 2: no zero clusters; QEMU deallocates or writes zeroes).
for cs in 4096 65536; do
    n=v2-$cs
    mkdir -p "$D/$n"
    qcreate "$D/$n/image" $((16 * M)) "compat=0.10,cluster_size=$cs"
    std_writes "$D/$n/image" $cs $((16 * M))
    add_image $n "$D/$n/image"
done

# compat=1.1 explicitly, 64 MiB, with writes spread across several L2 tables
# (4k clusters: one L2 table covers 2 MiB).
n=v3-64m
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((64 * M)) "compat=1.1,cluster_size=4096"
std_writes "$D/$n/image" 4096 $((64 * M))
qio "$D/$n/image" "write -P 0x31 $((31 * M + 7)) $((2 * M))" \
    "write -P 0x32 $((47 * M - 100)) 200" "write -z $((31 * M + 4096)) $((1 * M))"
add_image $n "$D/$n/image"

# Extended L2 entries: 32 subclusters per cluster.
for cs in 16384 65536 2097152; do
    n=extl2-$cs
    sc=$((cs / 32))
    mkdir -p "$D/$n"
    qcreate "$D/$n/image" $((32 * M)) "extended_l2=on,cluster_size=$cs"
    qio "$D/$n/image" \
        "write -P 0xb1 0 4096" \
        "write -P 0xb2 $((cs + 8192)) 8192" \
        "write -P 0xb3 $((2 * cs + 3 * sc + 100)) 4096" \
        "write -P 0xb4 $((4 * cs)) $cs" \
        "write -z $((4 * cs + sc)) $sc" \
        "write -z -u $((4 * cs + 4 * sc)) $((2 * sc))" \
        "write -z $((6 * cs + 5 * sc)) $sc" \
        "write -z -u $((7 * cs)) $((3 * sc))" \
        "write -P 0xb5 $((7 * cs + sc)) 512" \
        "discard $((4 * cs + 10 * sc)) $((2 * sc))" \
        "write -P 0xb6 $((cs - 1000)) 3000" \
        "write -P 0xb7 $((32 * M - 4096)) 4096"
    add_image $n "$D/$n/image"
done

# Compression: compressible text, incompressible random data, zeroes, and
# a partly compressible cluster; then uncompressed rewrites of parts of
# compressed clusters and a compressed write by qemu-io.
"$PY" - "$D/compress-src.raw" <<'EOF'
import os, sys
M = 1 << 20
with open(sys.argv[1], "wb") as f:
    f.truncate(24 * M)
    f.seek(0)
    f.write((b"blockport qcow2 compressible text 0123456789\n" * 50000)[:3 * M])
    f.seek(5 * M)
    f.write(os.urandom(2 * M + 12345))
    f.seek(9 * M)
    for i in range(512):  # half random, half repetitive, per 4 KiB
        f.write(os.urandom(2048) + bytes([i & 255]) * 2048)
    f.seek(20 * M - 777)
    f.write(os.urandom(777 + 4096))
EOF
for ct in zlib zstd; do
    for cs in 4096 65536 2097152; do
        n=compress-$ct-$cs
        mkdir -p "$D/$n"
        if ! qemu-img convert -c -O qcow2 -o "compression_type=$ct,cluster_size=$cs" \
            "$D/compress-src.raw" "$D/$n/image" 2>"$T/conv.err"; then
            if [[ $ct == zstd ]]; then
                skip_case "qemu-img cannot write zstd-compressed qcow2: no zstd images"
                cat "$T/conv.err" >&2
                break
            fi
            cat "$T/conv.err" >&2
            fail "test bug: qemu-img convert -c ($ct) failed"
        fi
        add_image $n "$D/$n/image"
    done
done
n=compress-mixed
mkdir -p "$D/$n"
qemu-img convert -c -O qcow2 -o compression_type=zlib "$D/compress-src.raw" "$D/$n/image"
qio "$D/$n/image" \
    "write -P 0xc1 $((5 * M + 1000)) 3000" \
    "write -z $((M)) $((64 * K))" \
    "discard $((2 * M)) $((64 * K))" \
    "write -c -P 0xc2 $((12 * M)) $((128 * K))" \
    "write -P 0xc3 $((12 * M + 64 * K + 17)) 100"
add_image $n "$D/$n/image"
if qemu-img convert -c -O qcow2 -o compression_type=zstd,extended_l2=on \
    "$D/compress-src.raw" "$D/compress-zstd-extl2.qcow2" 2>/dev/null; then
    qio "$D/compress-zstd-extl2.qcow2" "write -P 0xc4 $((9 * M + 4096)) 2048"
    add_image compress-zstd-extl2 "$D/compress-zstd-extl2.qcow2"
fi

# Backing chains of depth 3 in a subdirectory with relative backing names:
# qcow2 base and raw base.  Offsets written per layer are recorded for (4).
# chain-qcow2: base (depth 3) <- mid (depth 2) <- top (depth 1)
mkdir -p "$D/chain-qcow2/sub"
( cd "$D/chain-qcow2/sub" &&
  qemu-img create -q -f qcow2 base.qcow2 $((32 * M)) &&
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2 &&
  qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 top.qcow2 ) ||
    fail "test bug: creating chain-qcow2 failed"
qio "$D/chain-qcow2/sub/base.qcow2" \
    "write -P 0xd1 0 $((4 * M))" "write -P 0xd2 $((20 * M)) $((M))"
qio "$D/chain-qcow2/sub/mid.qcow2" \
    "write -P 0xd3 $((M)) $((M))" "write -z $((3 * M)) $((128 * K))" \
    "write -P 0xd4 $((10 * M + 5)) 70000"
qio "$D/chain-qcow2/sub/top.qcow2" \
    "write -P 0xd5 $((M + 512 * K)) $((64 * K))" "write -P 0xd6 $((2 * M + 100)) 1" \
    "discard $((20 * M)) $((64 * K))" "write -P 0xd7 $((30 * M)) $((64 * K))"
add_image chain-qcow2 "$D/chain-qcow2/sub/top.qcow2"
#                    offset:expected depth
IMG_DEPTHS[chain-qcow2]="0:3 $((4 * M - 1)):3 $((M)):2 $((M + 512 * K)):1 $((2 * M + 100)):1
    $((3 * M)):2 $((10 * M + 5)):2 $((20 * M)):1 $((20 * M + 64 * K)):3 $((30 * M)):1
    $((5 * M)):0 $((25 * M)):0"

# chain-raw: base.raw (depth 3, also with a hole) <- mid <- top
mkdir -p "$D/chain-raw/sub"
"$PY" - "$D/chain-raw/sub/base.raw" <<'EOF'
import os, sys
M = 1 << 20
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(2 * M))
    f.truncate(16 * M)
    f.seek(12 * M + 3)
    f.write(os.urandom(5000))
EOF
( cd "$D/chain-raw/sub" &&
  qemu-img create -q -f qcow2 -b base.raw -F raw mid.qcow2 &&
  qemu-img create -q -f qcow2 -o cluster_size=4096 -b mid.qcow2 -F qcow2 top.qcow2 ) ||
    fail "test bug: creating chain-raw failed"
qio "$D/chain-raw/sub/mid.qcow2" "write -P 0xe1 $((M)) $((64 * K))" "write -z $((4 * M)) $((M))"
qio "$D/chain-raw/sub/top.qcow2" "write -P 0xe2 $((M + 4096 + 33)) 333" \
    "write -P 0xe3 $((12 * M)) 4096" "write -z -u $((13 * M)) $((8 * K))"
add_image chain-raw "$D/chain-raw/sub/top.qcow2"
IMG_DEPTHS[chain-raw]="0:3 $((M)):2 $((M + 4096 + 33)):1 $((4 * M)):2 $((8 * M)):3
    $((12 * M)):1 $((12 * M + 4096)):3 $((13 * M)):1"

# Overlay larger than its backing file: base 8 MiB, overlay 24 MiB, writes
# straddling the backing's end.
mkdir -p "$D/short-backing/sub"
( cd "$D/short-backing/sub" &&
  qemu-img create -q -f qcow2 -o cluster_size=65536 base.qcow2 $((8 * M)) &&
  qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 $((24 * M)) ) ||
    fail "test bug: creating short-backing failed"
qio "$D/short-backing/sub/base.qcow2" "write -P 0xf1 0 $((8 * M))"
qio "$D/short-backing/sub/top.qcow2" "write -P 0xf2 $((8 * M - 4096)) 8192" \
    "write -P 0xf3 $((16 * M)) 4096" "write -z $((M)) $((64 * K))"
add_image short-backing "$D/short-backing/sub/top.qcow2"
IMG_DEPTHS[short-backing]="0:2 $((M)):1 $((8 * M - 1)):1 $((8 * M)):1 $((16 * M)):1"

# Extended L2 overlay over a qcow2 base (backing named by absolute path):
# subclusters left unallocated in an allocated overlay cluster must read
# from the backing file, zero subclusters must hide it.
mkdir -p "$D/chain-extl2"
qcreate "$D/chain-extl2/base.qcow2" $((16 * M))
qio "$D/chain-extl2/base.qcow2" "write -P 0x91 0 $((8 * M))"
qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=65536 \
    -b "$D/chain-extl2/base.qcow2" -F qcow2 "$D/chain-extl2/top.qcow2"
qio "$D/chain-extl2/top.qcow2" "write -P 0x92 4096 4096" \
    "write -P 0x93 $((64 * K + 2048 * 3 + 5)) 100" \
    "write -z $((128 * K + 2048 * 7)) 2048" "write -z -u $((192 * K)) $((4 * K))" \
    "discard $((256 * K + 2048)) 2048" "write -P 0x94 $((9 * M + 2048)) 2048" \
    "write -z $((10 * M)) 2048"
add_image chain-extl2 "$D/chain-extl2/top.qcow2"
IMG_DEPTHS[chain-extl2]="0:2 4096:1 8192:2 $((64 * K)):2 $((64 * K + 2048 * 3)):1
    $((128 * K + 2048 * 7)):1 $((192 * K)):1 $((9 * M)):0 $((9 * M + 2048)):1 $((10 * M)):1"

# Compressed (zstd) base under a 4k-cluster overlay with partial writes.
mkdir -p "$D/chain-compressed/sub"
qemu-img convert -c -O qcow2 -o compression_type=zstd "$D/compress-src.raw" \
    "$D/chain-compressed/sub/base.qcow2" 2>/dev/null ||
    qemu-img convert -c -O qcow2 "$D/compress-src.raw" "$D/chain-compressed/sub/base.qcow2"
( cd "$D/chain-compressed/sub" &&
  qemu-img create -q -f qcow2 -o cluster_size=4096 -b base.qcow2 -F qcow2 top.qcow2 ) ||
    fail "test bug: creating chain-compressed failed"
qio "$D/chain-compressed/sub/top.qcow2" "write -P 0x95 $((100 * K + 1)) 3" \
    "write -z $((5 * M + 64 * K)) 4096" "write -P 0x96 $((9 * M + 2048)) 4096"
add_image chain-compressed "$D/chain-compressed/sub/top.qcow2"

# Version 2 chain: zero writes in a v2 overlay must still hide the backing.
mkdir -p "$D/chain-v2/sub"
( cd "$D/chain-v2/sub" &&
  qemu-img create -q -f qcow2 -o compat=0.10 base.qcow2 $((16 * M)) &&
  qemu-img create -q -f qcow2 -o compat=0.10 -b base.qcow2 -F qcow2 top.qcow2 ) ||
    fail "test bug: creating chain-v2 failed"
qio "$D/chain-v2/sub/base.qcow2" "write -P 0x97 0 $((4 * M))"
qio "$D/chain-v2/sub/top.qcow2" "write -z $((M)) $((128 * K))" "discard $((2 * M)) $((64 * K))" \
    "write -P 0x98 $((3 * M + 7)) 77"
add_image chain-v2 "$D/chain-v2/sub/top.qcow2"

# Virtual size not a multiple of the cluster size, over a backing file
# whose size is not either.
mkdir -p "$D/odd-size"
qcreate "$D/odd-size/base.qcow2" $((5 * M + 3 * 512))
qio "$D/odd-size/base.qcow2" "write -P 0x99 $((5 * M - 4096)) $((4096 + 3 * 512))"
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$D/odd-size/top.qcow2" $((9 * M + 512))
qio "$D/odd-size/top.qcow2" "write -P 0x9a $((9 * M - 1024)) 1536" "write -P 0x9b $((5 * M)) 512"
add_image odd-size "$D/odd-size/top.qcow2"

# Persistent dirty bitmaps (a header extension and an autoclear bit that
# a reader has to skip).
n=bitmaps
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((16 * M))
if qemu-img bitmap --add "$D/$n/image" b0 2>/dev/null; then
    qio "$D/$n/image" "write -P 0x9c $((M)) $((M))"
    qemu-img bitmap --add "$D/$n/image" b1
    add_image $n "$D/$n/image"
else
    skip_case "qemu-img bitmap not available: no image with bitmaps"
fi

# Internal snapshots, with writes, discards and zero writes after them (the
# active L1 then refers to clusters shared with snapshots, refcount > 1).
n=snapshots
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((16 * M)) "cluster_size=4096"
qio "$D/$n/image" "write -P 0x41 0 $((2 * M))" "write -P 0x42 $((8 * M)) $((M))"
qemu-img snapshot -c snap1 "$D/$n/image"
qio "$D/$n/image" "write -P 0x43 $((M)) 4096" "discard $((8 * M)) $((64 * K))" \
    "write -z $((8 * M + 128 * K)) $((64 * K))"
qemu-img snapshot -c snap2 "$D/$n/image"
qio "$D/$n/image" "write -P 0x44 $((512 * K + 1)) 10000" "write -P 0x45 $((12 * M)) $((64 * K))"
add_image $n "$D/$n/image"

# Preallocation.
for pa in metadata falloc full; do
    n=prealloc-$pa
    mkdir -p "$D/$n"
    qcreate "$D/$n/image" $((16 * M)) "preallocation=$pa"
    qio "$D/$n/image" "write -P 0x51 $((M + 3)) 100000" "write -z $((4 * M)) $((64 * K))" \
        "write -z -u $((5 * M)) $((128 * K))" "discard $((6 * M)) $((64 * K))"
    add_image $n "$D/$n/image"
done

# Zero clusters and discards in detail (v3, 64k): zero over data (zero
# allocated), zero over nothing (zero plain), -u unmap, discard of data,
# then data written again over a zero cluster.
n=zeroes
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((16 * M))
qio "$D/$n/image" "write -P 0x61 0 $((4 * M))" \
    "write -z $((64 * K)) $((64 * K))" \
    "write -z -u $((256 * K)) $((128 * K))" \
    "discard $((M)) $((192 * K))" \
    "write -z $((6 * M)) $((M))" \
    "write -z -u $((8 * M)) $((M))" \
    "write -P 0x62 $((6 * M + 64 * K + 10)) 10" \
    "write -z $((2 * M + 100)) 1000" \
    "discard $((3 * M + 100)) 64000"
add_image $n "$D/$n/image"

# Lazy refcounts: a cleanly closed image, and one left dirty by a writer
# that was killed after flushing (the dirty bit is set; reading read-only
# must still work, QEMU reads it too).
n=lazy-refcounts
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((16 * M)) "lazy_refcounts=on"
std_writes "$D/$n/image" 65536 $((16 * M))
add_image $n "$D/$n/image"
n=lazy-dirty
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((16 * M)) "lazy_refcounts=on"
{ timeout 60 qemu-io -c "write -P 0x71 $((M)) $((M))" -c "write -P 0x72 $((5 * M + 1)) 3" \
    -c flush -c "sigraise 9" "$D/$n/image" >/dev/null 2>&1 || true; } 2>/dev/null
# Incompatible feature bit 0 (dirty) must be set, else the case is moot.
dirty=$("$PY" -c 'import struct,sys; f=open(sys.argv[1],"rb"); f.seek(72); print(struct.unpack(">Q", f.read(8))[0] & 1)' "$D/$n/image")
if [[ $dirty == 1 ]]; then
    add_image $n "$D/$n/image"
else
    skip_case "qemu-io did not leave the lazy-refcounts image dirty"
fi

# External data file (raw and not raw).  The data file is named by absolute
# path: QEMU 7.2 resolves a relative data file name against its working
# directory, not the image's directory.
for raw in on off; do
    n=datafile-raw-$raw
    mkdir -p "$D/$n"
    if qemu-img create -q -f qcow2 \
        -o "data_file=$D/$n/image.data,data_file_raw=$raw" "$D/$n/image" $((16 * M)) 2>"$T/df.err"; then
        std_writes "$D/$n/image" 65536 $((16 * M))
        add_image $n "$D/$n/image"
    else
        skip_case "qemu-img cannot create data_file images:"
        cat "$T/df.err" >&2
    fi
done

# Beyond 4 GiB (L1 index > 0 for 64k clusters only past 512 MiB... and
# offsets that do not fit in 32 bits).  Only spot reads and maps.
n=large
mkdir -p "$D/$n"
qcreate "$D/$n/image" $((6 * G))
qio "$D/$n/image" "write -P 0x81 0 4096" "write -P 0x82 $((4 * G - 2048)) 4096" \
    "write -P 0x83 $((5 * G + 12345)) 70000" "write -z $((4 * G + 64 * K)) $((64 * K))" \
    "write -P 0x84 $((6 * G - 512)) 512"
add_image $n "$D/$n/image" no

# ---------------------------------------------------------------- checker

cat >"$T/qcheck.py" <<'EOF'
"""Compare a blockport export with QEMU's view of the same image.

argv: raw qmap nmap dmap chain uri size full depths
"""
import json, os, random, sys
import nbd

raw, qmap_f, nmap_f, dmap_f, chain_f, uri, size, full, depths = sys.argv[1:10]
size = int(size)
errors = []

def err(msg):
    errors.append(msg)

def nbd_ranges(path, what):
    ents = json.load(open(path))
    out, pos = [], 0
    for e in ents:
        s, l, t = e["offset"], e["length"], e["type"]
        if s != pos:
            err("%s: extents not contiguous at %d (next starts at %d)" % (what, pos, s))
            return out
        if l <= 0:
            err("%s: extent of length %d at %d" % (what, l, s))
            return out
        out.append((s, s + l, t))
        pos = s + l
    if pos != size:
        err("%s: extents cover [0,%d), export size is %d" % (what, pos, size))
    return out

qmap = []
for e in json.load(open(qmap_f)):
    qmap.append((e["start"], e["start"] + e["length"], e))
nmap = nbd_ranges(nmap_f, "base:allocation")
dmap = nbd_ranges(dmap_f, "qemu:allocation-depth")

chain = json.load(open(chain_f))
has_data_file = bool(chain[0].get("format-specific", {}).get("data", {}).get("data-file"))
# Sizes of the backing layers, top first: layer i has NBD depth i+1.
layer_sizes = [c["virtual-size"] for c in chain]

bounds = {0, size}
for lst in (qmap, nmap, dmap):
    for s, e, _ in lst:
        bounds.add(min(s, size)); bounds.add(min(e, size))
for ls in layer_sizes:
    if ls < size:
        bounds.add(ls)
bounds = sorted(bounds)

def find(lst, off):
    lo, hi = 0, len(lst)
    while lo < hi:
        mid = (lo + hi) // 2
        if lst[mid][1] <= off:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(lst) and lst[lo][0] <= off < lst[lo][1]:
        return lst[lo]
    return None

fraw = open(raw, "rb")

def raw_is_zero(s, e):
    while s < e:
        n = min(e - s, 1 << 22)
        b = os.pread(fraw.fileno(), n, s)
        if len(b) != n:
            return False
        if b.count(0) != n:
            return False
        s += n
    return True

nseg = 0
relaxed = {"zero-data": 0, "eof-depth": 0, "data-file-zero": 0}
for s, e in zip(bounds, bounds[1:]):
    if s >= e:
        continue
    nseg += 1
    q = find(qmap, s)
    nf = find(nmap, s)
    dp = find(dmap, s)
    if q is None:
        err("qemu-img map does not cover %d (test bug)" % s)
        continue
    q = q[2]
    where = "[%d, %d) (qemu-img map: %s)" % (s, e, json.dumps(q, sort_keys=True))
    if nf is not None:
        flags = nf[2]
        hole, zero = bool(flags & 1), bool(flags & 2)
        if q["data"]:
            if hole:
                err("%s: QEMU says data, base:allocation says HOLE (flags %d)" % (where, flags))
            if not q["zero"] and zero:
                if has_data_file and raw_is_zero(s, e):
                    relaxed["data-file-zero"] += 1  # QEMU ignores data file holes
                else:
                    err("%s: QEMU says data, not zero; base:allocation says ZERO (flags %d)"
                        % (where, flags))
            if q["zero"] and zero != q["zero"]:
                relaxed["zero-data"] += 1   # host-file hole under allocated cluster
        else:
            if not hole:
                err("%s: QEMU says no data (reads as zeroes), base:allocation lacks HOLE"
                    " (flags %d)" % (where, flags))
            if q["zero"] and not zero:
                err("%s: QEMU says zero, base:allocation lacks ZERO (flags %d)" % (where, flags))
            if not q["zero"] and zero:
                err("%s: QEMU says not zero, base:allocation says ZERO (flags %d)"
                    % (where, flags))
        if zero and not raw_is_zero(s, e):
            err("%s: ZERO flag set but QEMU does not read zeroes there" % where)
    if dp is not None:
        depth = dp[2]
        if q["present"]:
            want = {q["depth"] + 1}
        else:
            want = {0}
            # Past the end of a (shorter) backing layer: qemu-nbd reports
            # that layer's depth, qemu-img map reports absent; NBD clients
            # get qemu-nbd's answer.
            for i in range(1, len(layer_sizes)):
                if layer_sizes[i] <= s:
                    want = {i + 1}
                    break
        if depth not in want:
            err("%s: qemu:allocation-depth %d, expected %s"
                % (where, depth, " or ".join(map(str, sorted(want)))))
        elif len(want) > 1 and depth != 0:
            relaxed["eof-depth"] += 1

# (4) explicit depth expectations.
for item in depths.split():
    off, want = map(int, item.split(":"))
    dp = find(dmap, off)
    if dp is None:
        err("no qemu:allocation-depth extent covers %d" % off)
    elif dp[2] != want:
        err("qemu:allocation-depth at %d is %d, expected %d (layer written there)"
            % (off, dp[2], want))

# Reads: unaligned, random and around every extent boundary either side
# reports, compared with the raw conversion.
h = nbd.NBD()
h.connect_uri(uri)
if h.get_size() != size:
    err("export size %d, qemu-img says %d" % (h.get_size(), size))
if not h.is_read_only():
    err("export served with --readonly does not advertise read-only")
rnd = random.Random(size ^ len(qmap))
reads = []
for s, _, _ in qmap + nmap:
    for d in (-1, -4097, 0, 511):
        o = s + d
        if 0 <= o < size:
            reads.append((o, min(size - o, rnd.choice([1, 3, 512, 4099, 70001]))))
for _ in range(300):
    o = rnd.randrange(size)
    reads.append((o, min(size - o, rnd.choice([1, 17, 511, 4097, 65535, 131073, 2100000]))))
reads.append((size - 1, 1))
reads.append((0, min(size, 4 << 20)))
if full != "yes":
    # Spot-check the data QEMU reports, in full.
    for s, e, q in qmap:
        if q["data"]:
            for o in range(s, e, 4 << 20):
                reads.append((o, min(e - o, 4 << 20)))
bad_reads = 0
for o, l in reads:
    try:
        got = h.pread(l, o)
    except nbd.Error as ex:
        err("pread(%d, %d) failed: %s" % (l, o, ex))
        bad_reads += 1
        if bad_reads > 5:
            break
        continue
    want = os.pread(fraw.fileno(), l, o)
    if got != want:
        i = next(i for i in range(l) if got[i] != want[i])
        err("pread(len %d, off %d) differs from qemu-img convert at offset %d:"
            " got 0x%02x, QEMU 0x%02x" % (l, o, o + i, got[i], want[i]))
        bad_reads += 1
        if bad_reads > 5:
            break
h.shutdown()

print("  %d segments, %d reads; relaxed: %s" % (nseg, len(reads), relaxed))
if errors:
    for m in errors[:25]:
        print("    " + m, file=sys.stderr)
    if len(errors) > 25:
        print("    ... and %d more" % (len(errors) - 25), file=sys.stderr)
    sys.exit(1)
EOF

# ---------------------------------------------------------------- driver

# Can blockport open IMAGE at all?  Started by hand (not start_server) so
# that a refusal is recorded and the rest of the matrix still runs.
probe_serve() {
    local img=$1 rc=0
    rm -f "$T/probe.sock" "$T/probe.pid"
    "$BLOCKPORT" serve --readonly --unix "$T/probe.sock" --pid-file "$T/probe.pid" "$img" \
        </dev/null >"$T/probe.log" 2>&1 &
    local pid=$!
    if wait_file 10 "$T/probe.pid" $pid; then
        kill -TERM $pid
        wait $pid || rc=$?
        ((rc == 0)) || { cat "$T/probe.log" >&2; fail_soft "probe server for $img exited $rc on SIGTERM"; }
        check_sanitizer_reports "$T/probe.log"
        return 0
    fi
    kill -KILL $pid 2>/dev/null || true
    wait $pid || rc=$?
    echo "  blockport refused $img (exit status $rc):" >&2
    sed 's/^/    /' "$T/probe.log" >&2
    check_sanitizer_reports "$T/probe.log"
    return 1
}

# Start/stop the server for one image, keeping the log per image.
verify_image() {
    local n=$1 img=${IMG_PATH[$1]} full=${IMG_FULL[$1]} w=$T/work/$1 failed=0
    mkdir -p "$w"
    check "$n: blockport reads $(basename "$img") like QEMU"
    qemu-img info --backing-chain --output=json "$img" >"$w/info.json"
    # A single object when there is no backing file; make it a list.
    "$PY" -c 'import json,sys
d = json.load(open(sys.argv[1]))
json.dump(d if isinstance(d, list) else [d], open(sys.argv[1], "w"))' "$w/info.json"
    local size
    size=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["virtual-size"])' "$w/info.json")
    timeout 300 qemu-img convert -O raw "$img" "$w/raw" || fail "test bug: qemu-img convert $n"
    timeout 120 qemu-img map --output=json "$img" >"$w/qmap.json" || fail "test bug: qemu-img map $n"

    if ! probe_serve "$img"; then
        fail_soft "$n: blockport refused to serve a valid qcow2 image ($img)"
        return
    fi
    : >"$T/server.log"
    start_server --readonly "$img"

    run nbdinfo --map --json "$URI" >"$w/nmap.json" ||
        { fail_soft "$n: nbdinfo --map failed"; failed=1; echo '[]' >"$w/nmap.json"; }
    run nbdinfo --map=qemu:allocation-depth --json "$URI" >"$w/dmap.json" ||
        { fail_soft "$n: nbdinfo --map=qemu:allocation-depth failed"; failed=1; echo '[]' >"$w/dmap.json"; }

    if [[ $full == yes ]]; then
        # Plain reads of everything, and a copy driven by block status
        # (that one trusts the ZERO/HOLE flags, so it also catches extents
        # wrongly reported as zero).
        local mode
        for mode in --no-extents ""; do
            if ! run nbdcopy $mode "$URI" - >"$w/copy" 2>"$w/copy.err"; then
                cat "$w/copy.err" >&2
                fail_soft "$n: nbdcopy $mode failed"
                failed=1
            elif ! cmp "$w/raw" "$w/copy" >&2; then
                fail_soft "$n: nbdcopy $mode of the export differs from qemu-img convert -O raw"
                failed=1
            fi
            rm -f "$w/copy"
        done
    fi

    if ! PYTHONPATH=$T run "$PY" "$T/qcheck.py" "$w/raw" "$w/qmap.json" "$w/nmap.json" \
        "$w/dmap.json" "$w/info.json" "$URI" "$size" "$full" "$(tr -s ' \n' '  ' <<<"${IMG_DEPTHS[$n]:-}")"; then
        fail_soft "$n: block status / reads disagree with QEMU (see above; image recipe in $0)"
        failed=1
    fi

    if ! server_alive; then
        local rc=0
        wait "$SERVER_PID" || rc=$?
        SERVER_PID=
        fail_soft "$n: server died while serving $img (exit status $rc)"
        tail -n 40 "$T/server.log" >&2
        check_sanitizer_reports "$T/server.log"
    else
        stop_server
    fi
    ((failed == 0)) && ok "$n"
    rm -rf "$w"
}

mkdir -p "$T/work"
echo "images: ${IMAGES[*]}"
for n in "${IMAGES[@]}"; do
    verify_image "$n"
done
