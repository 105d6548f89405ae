#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The throw-away Ceph cluster (contrib/ceph-cluster.sh) the RBD tests stand
# on: QEMU's own rbd driver writes and reads back an image; the data
# survives a killed and restarted OSD and monitor; stop leaves no daemon.
# Skips (77) only without the Ceph packages or qemu-block-extra.
source "$(dirname "$0")/lib.sh"
require qemu-io
require_qemu_rbd
ceph_cluster_start
# shellcheck disable=SC2034 # read by run (lib.sh)
CMD_TIMEOUT=60

IMG=rbd:$CEPH_POOL/t:conf=$CEPH_CONF
run rbd create "$CEPH_POOL/t" --size 64M || fail "rbd create"

# Patterns on both sides of the 4 MiB object boundaries.
write_patterns() {
    run qemu-io -f raw -c 'write -P 0x11 0 1M' -c 'write -P 0x22 3M 2M' \
        -c 'write -P 0x33 60M 4M' "$IMG" >/dev/null
}

# qemu-io of some versions exits 0 after a failed pattern check: grep too.
verify_patterns() {
    if ! run qemu-io -f raw -c 'read -P 0x11 0 1M' -c 'read -P 0 1M 2M' \
        -c 'read -P 0x22 3M 2M' -c 'read -P 0 5M 55M' \
        -c 'read -P 0x33 60M 4M' "$IMG" >"$T/qio.out" 2>&1 ||
        grep -q 'Pattern verification failed' "$T/qio.out"; then
        cat "$T/qio.out"
        fail "read back after $1"
    fi
}

check "qemu-io writes to rbd: and reads back"
write_patterns || fail "qemu-io write"
verify_patterns "the writes"
ok "patterns read back"

check "the data survives a killed OSD"
ceph_cluster kill-osd
if ceph_cluster status 2>/dev/null; then
    fail "status says usable with the OSD killed"
fi
ceph_cluster start-osd || fail "start-osd"
verify_patterns "the OSD's restart"
run qemu-io -f raw -c 'write -P 0x44 8M 1M' -c 'read -P 0x44 8M 1M' "$IMG" \
    >"$T/qio.out" || fail "write after the OSD's restart"
ok "data intact, and writes go on"

check "the data survives a killed monitor"
ceph_cluster kill-mon
ceph_cluster start-mon || fail "start-mon"
run qemu-io -f raw -c 'read -P 0x44 8M 1M' "$IMG" >"$T/qio.out" ||
    fail "read after the monitor's restart"
ok "data intact"

check "stop kills the daemons"
pids=$(cat "$CEPH_DIR"/run/*.pid)
ceph_cluster stop --keep || fail "stop"
for p in $pids; do
    wait_until 10 _pid_gone "$p" || fail "daemon $p still runs after stop"
done
ok "no daemon left"
