#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The image tools on Ceph RBD images, one throw-away cluster for every
# case, QEMU's own rbd driver (qemu-img, qemu-io) as the oracle: create
# (object size, refusals), info (as qemu-img info shows it, plus RBD's
# features and snapshots), convert file -> RBD (sparse, -p), RBD -> raw and
# qcow2, RBD -> RBD, each compared with the source and with qemu-img
# convert's result; map as qemu-img map; resize and check as qemu-img's; an
# RBD export in --config.  Skips (77) only without the Ceph packages or
# qemu-block-extra.
source "$(dirname "$0")/lib.sh"
require_feature rbd
require qemu-img qemu-io rbd script
require_qemu_rbd
ceph_cluster_start
CMD_TIMEOUT=90
P=$CEPH_POOL

# json_field JSON-FILE EXPR: a Python expression over j, the parsed file.
json_field() {
    "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}

check "create makes an RBD image with the cluster's default features"
run "$BLOCKPORT" create "rbd:$P/c1" 24M >"$T/out" || fail "create rbd:$P/c1"
grep -q "Formatting 'rbd:$P/c1', fmt=raw size=25165824" "$T/out" ||
    fail "create printed: $(cat "$T/out")"
run rbd info --format json "$P/c1" >"$T/c1.json" || fail "rbd info c1"
[[ $(json_field "$T/c1.json" 'j["size"]') == 25165824 ]] ||
    fail "size: $(cat "$T/c1.json")"
json_field "$T/c1.json" '"exclusive-lock" in j["features"]' | grep -q True ||
    fail "no exclusive-lock: $(cat "$T/c1.json")"
run qemu-io -f raw -c 'write -P 0x5a 1M 64k' -c 'read -P 0x5a 1M 64k' \
    "rbd:$P/c1" >"$T/qio.out" || fail "qemu-io on the new image"
ok "24 MiB, exclusive-lock, qemu-io writes and reads it"

check "create -o cluster_size sets the object size"
run "$BLOCKPORT" create -f raw -o cluster_size=1M "rbd:$P/c2" 8M >/dev/null ||
    fail "create -o cluster_size=1M"
run rbd info --format json "$P/c2" >"$T/c2.json" || fail "rbd info c2"
[[ $(json_field "$T/c2.json" 'j["object_size"]') == 1048576 ]] ||
    fail "object size: $(cat "$T/c2.json")"
ok "1 MiB objects"

check "create refuses what it cannot make, and leaves the image alone"
qemu-io -f raw -c 'write -P 0x77 0 64k' "rbd:$P/c2" >/dev/null ||
    fail "qemu-io write c2"
refuse() { # refuse WHY-REGEX ARGS...
    local why=$1
    shift
    if run "$BLOCKPORT" create "$@" >"$T/out" 2>&1; then
        fail "create $* succeeded"
    fi
    grep -qE "$why" "$T/out" || fail "create $*: $(cat "$T/out")"
}
refuse "already exists" "rbd:$P/c2" 16M
refuse "already exists" -o cluster_size=4M "rbd:$P/c2" 16M
refuse "qcow2 .*RBD" -f qcow2 "rbd:$P/q1" 16M
refuse "cluster_size .*4k to 32M" -o cluster_size=64M "rbd:$P/c3" 16M
refuse "cluster_size .*4k to 32M" -o cluster_size=2k "rbd:$P/c3" 16M
refuse "backing file" -b "$T/base.img" "rbd:$P/c3" 16M
refuse "no such pool" "rbd:nopool/c3" 16M
refuse "no size" "rbd:$P/c3"
rbd info "$P/c2" | grep -q "order 20" || fail "c2 changed"
qemu-io -f raw -c 'read -P 0x77 0 64k' "rbd:$P/c2" >"$T/qio.out" ||
    fail "c2 data lost"
if rbd info "$P/q1" >/dev/null 2>&1 || rbd info "$P/c3" >/dev/null 2>&1; then
    fail "a refused create left an image"
fi
ok "clear errors, c2 intact, nothing left behind"

check "info shows what qemu-img info shows, and RBD's own facts"
run rbd snap create "$P/c1@s1" >/dev/null 2>&1 || fail "rbd snap create"
run rbd resize --size 32M "$P/c1" >/dev/null 2>&1 || fail "rbd resize"
run qemu-img info --output=json "rbd:$P/c1" >"$T/q.json" || fail "qemu-img info"
run "$BLOCKPORT" info --output=json "rbd:$P/c1" >"$T/b.json" ||
    fail "blockport info"
for f in 'j["virtual-size"]' 'j["format"]' 'j["cluster-size"]' \
    'j["dirty-flag"]' \
    '[(s["id"], s["name"], s["vm-state-size"]) for s in j["snapshots"]]'; do
    q=$(json_field "$T/q.json" "$f") b=$(json_field "$T/b.json" "$f")
    [[ $q == "$b" ]] || fail "info $f: qemu-img '$q', blockport '$b'"
done
[[ $(json_field "$T/b.json" 'j["snapshots"][0]["vm-state-size"]') == 25165824 ]] ||
    fail "snapshot size: $(cat "$T/b.json")"
rbd_features=$(json_field "$T/c1.json" '",".join(j["features"])')
[[ $(json_field "$T/b.json" '",".join(j["format-specific"]["data"]["features"])') == "$rbd_features" ]] ||
    fail "features: $(cat "$T/b.json")"
[[ $(json_field "$T/b.json" 'j["format-specific"]["data"]["order"]') == 22 ]] ||
    fail "order: $(cat "$T/b.json")"
run "$BLOCKPORT" info "rbd:$P/c1" >"$T/b.txt" || fail "info (human)"
for l in "file format: raw" "virtual size: 32 MiB (33554432 bytes)" \
    "cluster_size: 4194304" "features: ${rbd_features//,/, }" \
    "object size: 4 MiB" "order: 22"; do
    grep -qF "$l" "$T/b.txt" || fail "no '$l' in: $(cat "$T/b.txt")"
done
grep -qE '^s1 +s1 +24 MiB' "$T/b.txt" || fail "no snapshot s1: $(cat "$T/b.txt")"
run "$BLOCKPORT" info "rbd:$P/c1@s1" >"$T/s.txt" || fail "info of the snapshot"
grep -qF "virtual size: 24 MiB" "$T/s.txt" || fail "snapshot: $(cat "$T/s.txt")"
if run "$BLOCKPORT" info "rbd:$P/none" >"$T/out" 2>&1; then
    fail "info of a missing image succeeded"
fi
grep -q "no such image" "$T/out" || fail "info of a missing image: $(cat "$T/out")"
ok "fields agree with qemu-img; features, order, snapshots"

check "convert a mostly empty raw file into a new RBD image: sparse, as qemu-img"
run qemu-img create -f raw "$T/src.raw" 100M >/dev/null || fail "qemu-img create"
# Data at 0 and 50M, zeroes written at 10M (allocated in the file, but
# nothing to write), a partial object at the end.
run qemu-io -f raw -c 'write -P 0x11 0 1M' -c 'write -P 0 10M 8M' \
    -c 'write -P 0x22 50M 3M' -c 'write -P 0x33 99M 1M' "$T/src.raw" \
    >/dev/null || fail "qemu-io src.raw"
run qemu-img convert -O qcow2 "$T/src.raw" "$T/src.qcow2" || fail "qcow2 src"
# -p under a terminal (script), to see the progress display too.
run script -qec "$BLOCKPORT convert -p -O raw $T/src.raw rbd:$P/v1" \
    "$T/typescript" >"$T/p.out" 2>&1 || { cat "$T/p.out"; fail "convert -> rbd"; }
grep -q '100.00/100%' "$T/p.out" || fail "no progress shown: $(cat "$T/p.out")"
run qemu-img compare -f raw -F raw "$T/src.raw" "rbd:$P/v1" ||
    fail "src.raw and rbd:$P/v1 differ"
run qemu-img convert -O raw "$T/src.raw" "rbd:$P/q1" || fail "qemu-img convert"
run qemu-img compare -f raw -F raw "rbd:$P/q1" "rbd:$P/v1" ||
    fail "differs from qemu-img convert's image"
run "$BLOCKPORT" convert -O raw "$T/src.qcow2" "rbd:$P/v2" ||
    fail "convert qcow2 -> rbd"
run qemu-img compare -f raw -F raw "$T/src.raw" "rbd:$P/v2" ||
    fail "qcow2 -> rbd differs"
# 4 of 25 objects hold data (0, 48M-56M, 96M-100M): 16 MiB used; the
# zeroes at 10M-18M (objects 2-4) are not written.
for img in v1 v2; do
    used=$(rbd du --format json "$P/$img" | "$PY" -c \
        'import json,sys; print(json.load(sys.stdin)["images"][0]["used_size"])')
    ((used <= 16 << 20)) || fail "$img: $used bytes used, expected at most 16 MiB"
done
ok "identical to the source and to qemu-img convert's; 16 of 100 MiB used"

check "convert RBD -> raw, qcow2 and RBD, compared with qemu-img convert"
run "$BLOCKPORT" convert -O raw "rbd:$P/v1" "$T/out.raw" || fail "rbd -> raw"
run "$BLOCKPORT" convert -f raw -O qcow2 "rbd:$P/v1" "$T/out.qcow2" ||
    fail "rbd -> qcow2"
run "$BLOCKPORT" convert -O raw "rbd:$P/v1" "rbd:$P/v3" || fail "rbd -> rbd"
run qemu-img convert -f raw -O qcow2 "rbd:$P/v1" "$T/qemu.qcow2" ||
    fail "qemu-img convert rbd -> qcow2"
for out in "$T/out.raw" "$T/out.qcow2" "rbd:$P/v3"; do
    run qemu-img compare -f raw "$T/src.raw" "$out" || fail "$out differs"
    run qemu-img compare "$T/qemu.qcow2" "$out" ||
        fail "$out differs from qemu-img convert's"
done
# Sparse: the raw file as sparse as qemu-img's, the qcow2 as small.
run qemu-img convert -f raw -O raw "rbd:$P/v1" "$T/qemu.raw" || fail "qemu raw"
for f in raw qcow2; do
    ours=$(du -k "$T/out.$f" | cut -f1) theirs=$(du -k "$T/qemu.$f" | cut -f1)
    ((ours <= theirs + 64)) || fail "out.$f uses $ours KiB, qemu-img's $theirs"
done
ok "raw, qcow2 and RBD copies equal the source and qemu-img's, as sparse"

check "convert reads a snapshot, and refuses an existing or a qcow2 RBD target"
run rbd snap create "$P/v1@snap" >/dev/null 2>&1 || fail "snap create"
run qemu-io -f raw -c 'write -P 0x44 0 1M' "rbd:$P/v1" >/dev/null ||
    fail "write after the snapshot"
run "$BLOCKPORT" convert -O raw "rbd:$P/v1@snap" "$T/snap.raw" ||
    fail "convert the snapshot"
run qemu-img compare -f raw -F raw "$T/src.raw" "$T/snap.raw" ||
    fail "the snapshot's copy differs from the source"
if run "$BLOCKPORT" convert -O raw "$T/src.raw" "rbd:$P/v3" 2>"$T/err"; then
    fail "convert over an existing image succeeded"
fi
grep -q "already exists" "$T/err" || fail "existing: $(cat "$T/err")"
run qemu-img compare -f raw -F raw "$T/src.raw" "rbd:$P/v3" ||
    fail "the existing image changed"
if run "$BLOCKPORT" convert -O qcow2 "$T/src.raw" "rbd:$P/v4" 2>"$T/err"; then
    fail "convert -O qcow2 to RBD succeeded"
fi
grep -q "qcow2 on RBD is not supported" "$T/err" || fail "qcow2: $(cat "$T/err")"
! rbd info "$P/v4" >/dev/null 2>&1 || fail "a refused convert left rbd:$P/v4"
ok "snapshot copied; refusals clear, nothing overwritten or left"

check "map shows the holes and data qemu-img map shows"
# With fast-diff, both report whole 4 MiB objects: compare the ranges.
ranges() { "$PY" -c '
import json, sys
for e in json.load(sys.stdin):
    print(e["start"], e["length"], e["data"], e["zero"], e.get("offset"))'; }
run qemu-img map --output=json "rbd:$P/v3" | ranges >"$T/qmap" || fail "qemu-img map"
run "$BLOCKPORT" map --json "rbd:$P/v3" | ranges >"$T/bmap" || fail "blockport map"
diff "$T/qmap" "$T/bmap" || fail "maps differ (qemu-img, blockport)"
grep -q True "$T/bmap" && grep -q "False True" "$T/bmap" ||
    fail "no data or no hole in: $(cat "$T/bmap")"
run "$BLOCKPORT" map "rbd:$P/v3" >"$T/bmap.txt" || fail "map (human)"
grep -qE "^0x3000000 +0x800000 +0x3000000 +rbd:$P/v3" "$T/bmap.txt" ||
    fail "human map: $(cat "$T/bmap.txt")"
ok "same ranges; human output names the image"

check "resize grows and shrinks an RBD image as qemu-img resize does"
rbd_size() { rbd info --format json "$P/$1" | json_field /dev/stdin 'j["size"]'; }
run "$BLOCKPORT" create "rbd:$P/r1" 16M >/dev/null || fail "create r1"
run qemu-io -f raw -c 'write -P 0x5a 14M 2M' "rbd:$P/r1" >/dev/null ||
    fail "qemu-io write r1"
run "$BLOCKPORT" resize "rbd:$P/r1" +16M >"$T/out" || fail "resize +16M"
grep -qx "Image resized." "$T/out" || fail "resize printed: $(cat "$T/out")"
[[ $(rbd_size r1) == 33554432 ]] || fail "size after +16M: $(rbd_size r1)"
run qemu-io -f raw -c 'read -P 0x5a 14M 2M' -c 'read -P 0 16M 16M' \
    "rbd:$P/r1" >"$T/qio.out" || fail "qemu-io read r1"
! grep -q "Pattern verification failed" "$T/qio.out" ||
    fail "after growing: $(cat "$T/qio.out")"
# Refused, each leaving the size alone: a shrink without --shrink, a
# preallocation (as QEMU's rbd driver), a snapshot, an image in use.
if run "$BLOCKPORT" resize "rbd:$P/r1" 8M >"$T/out" 2>&1; then
    fail "a shrink without --shrink succeeded"
fi
grep -q -- "--shrink" "$T/out" || fail "shrink refusal: $(cat "$T/out")"
if run "$BLOCKPORT" resize --preallocation=full "rbd:$P/r1" +1M \
    >"$T/out" 2>&1; then
    fail "--preallocation=full on RBD succeeded"
fi
grep -q "preallocation" "$T/out" || fail "prealloc refusal: $(cat "$T/out")"
run rbd snap create "$P/r1@s" >/dev/null 2>&1 || fail "rbd snap create r1@s"
if run "$BLOCKPORT" resize "rbd:$P/r1@s" +1M >"$T/out" 2>&1; then
    fail "resizing a snapshot succeeded"
fi
grep -q "read-only" "$T/out" || fail "snapshot refusal: $(cat "$T/out")"
start_server "rbd:$P/r1"
if run "$BLOCKPORT" resize "rbd:$P/r1" +1M >"$T/out" 2>&1; then
    fail "resizing a served image succeeded"
fi
grep -q "exclusive lock" "$T/out" || fail "in-use refusal: $(cat "$T/out")"
stop_server
[[ $(rbd_size r1) == 33554432 ]] || fail "a refusal changed the size"
run "$BLOCKPORT" resize --shrink "rbd:$P/r1" 15728640 >/dev/null ||
    fail "resize --shrink"
[[ $(rbd_size r1) == 15728640 ]] || fail "size after shrink: $(rbd_size r1)"
run qemu-io -f raw -c 'read -P 0x5a 14M 1M' "rbd:$P/r1" >"$T/qio.out" &&
    ! grep -q "Pattern verification failed" "$T/qio.out" ||
    fail "a byte before the new end changed"
ok "grown (zeroes added), shrunk with --shrink, refusals leave it alone"

check "check says an RBD image has no metadata to check, as qemu-img check"
q=0 b=0
run qemu-img check "rbd:$P/r1" >/dev/null 2>&1 || q=$?
run "$BLOCKPORT" check "rbd:$P/r1" >"$T/out" 2>&1 || b=$?
[[ $b == 63 && $q == 63 ]] || fail "exit status $b (qemu-img: $q)"
grep -q "no image metadata" "$T/out" || fail "check said: $(cat "$T/out")"
ok "exit status 63, as qemu-img's"

check "an export in --config whose path is rbd:POOL/IMAGE"
mkdir -p "$T/conf"
cat >"$T/conf/exports.conf" <<CONF
[export disk]
path = rbd:$P/v3
[export snap]
path = rbd:$P/v1@snap
CONF
# Not a relative file path: no file of that name in the config's folder.
start_server --config "$T/conf/exports.conf"
run qemu-io -f raw -c 'read -P 0x11 0 1M' -c 'read -P 0x22 50M 3M' \
    -c 'write -P 0x55 4M 64k' -c 'read -P 0x55 4M 64k' \
    "$(export_uri disk)" >"$T/qio.out" || fail "qemu-io on export disk"
run qemu-io -r -f raw -c 'read -P 0x11 0 1M' "$(export_uri snap)" \
    >"$T/qio2.out" || fail "qemu-io on export snap"
! grep -q "Pattern verification failed" "$T/qio.out" "$T/qio2.out" ||
    fail "wrong data: $(cat "$T/qio.out" "$T/qio2.out")"
stop_server
run qemu-io -f raw -c 'read -P 0x55 4M 64k' "rbd:$P/v3" >"$T/qio.out" &&
    ! grep -q "Pattern verification failed" "$T/qio.out" ||
    fail "the write through the config export is not in the image"
ok "served from the cluster, written and read with qemu-io"
