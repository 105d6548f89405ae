#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The image tools on Ceph RBD images, one throw-away cluster for every
# case, QEMU's own rbd driver (qemu-img, qemu-io) as the oracle: create
# (object size, refusals), info (as qemu-img info shows it, plus RBD's
# features and snapshots).  Skips (77) only without the Ceph packages or
# qemu-block-extra.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io rbd
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
