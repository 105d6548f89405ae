#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# A throw-away single-host Ceph cluster for tests and demos: one monitor,
# one OSD, pool size 1, cephx, 127.0.0.1 only, no mgr, no systemd, and
# everything (conf, keyrings, daemon data, logs, pid files, sockets) under
# one directory.
#
#   ceph-cluster.sh start DIR [--pool NAME] [--port-base N] [--store S]
#       Create and start a cluster in DIR (which must be absent or empty),
#       wait until pool NAME (default rbd) takes I/O, print the environment
#       lines (also in DIR/env) for rbd, qemu-img (rbd:POOL/IMG:conf=...)
#       and fio's rbd engine (CEPH_CONF).  Ports: 16 from N (default: a
#       free block picked at random).  S: bluestore (default; an 8 GiB
#       sparse file in DIR, keeps its data when the OSD is killed) or
#       memstore (in memory only: start-osd after kill-osd is refused).
#   ceph-cluster.sh stop DIR [--keep]   SIGKILL the daemons, remove DIR
#   ceph-cluster.sh kill-osd DIR | kill-mon DIR     SIGKILL one daemon
#   ceph-cluster.sh start-osd DIR | start-mon DIR   restart it on its data
#                                                   and wait for the pool
#   ceph-cluster.sh status DIR          exit 0 when the pool takes I/O
#
# Client timeouts are left to the callers (e.g. rados_osd_op_timeout).
# CEPH_START_TIMEOUT (seconds, default 60) bounds every wait.
set -euo pipefail

: "${CEPH_START_TIMEOUT:=60}"
PORTS=16 # mon v2, mon v1, then the OSD's (ms bind port min/max)

die() {
    echo "ceph-cluster: $*" >&2
    exit 1
}

usage() {
    sed -n '/^#   ceph-cluster.sh/,/^# CEPH_START/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# Every client command of ours: bounded, whatever the cluster does.
cl() {
    local tool=$1
    shift
    timeout --kill-after=2 "${CL_TIMEOUT:-20}" "$tool" -c "$CONF" "$@"
}

# _listening PORT: something listens on 127.0.0.1/0.0.0.0:PORT (TCP).
_listening() {
    local hex
    hex=$(printf ':%04X ' "$1")
    grep -q " [0-9A-F]*${hex}[0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

_block_free() {
    local p
    for ((p = $1; p < $1 + PORTS; p++)); do
        _listening "$p" && return 1
    done
    return 0
}

# A block of PORTS free ports, at random in 20000-59999 so that parallel
# clusters rarely try the same one.
pick_ports() {
    local base
    for _ in $(seq 1 50); do
        base=$((20000 + (RANDOM * 32768 + RANDOM) % 2500 * PORTS))
        if _block_free "$base"; then
            echo "$base"
            return 0
        fi
    done
    die "no free block of $PORTS ports found"
}

# Milliseconds since the epoch, and the time since T0 in seconds.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t / 1000)); }
since() {
    local ms=$(($(now_ms) - $1))
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

# wait_for SECONDS WHAT CMD...: run CMD until it succeeds or time is up.
wait_for() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || die "$what: not ready within ${secs}s (logs in $DIR/log)"
        sleep 0.2
    done
}

write_conf() {
    local fsid=$1 base=$2 store=$3
    cat >"$CONF" <<EOF
# Written by contrib/ceph-cluster.sh: a throw-away test cluster.
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$base,v1:127.0.0.1:$((base + 1))]
mon initial members = a
public addr = 127.0.0.1
ms bind ipv6 = false
ms bind port min = $((base + 2))
ms bind port max = $((base + PORTS - 1))
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $DIR/run
crash dir = $DIR/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon osd full ratio = 0.99
mon osd backfillfull ratio = 0.99
mon osd nearfull ratio = 0.99

[mon]
mon data = $DIR/mon.\$id
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log

[osd]
osd data = $DIR/osd.\$id
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
osd objectstore = $store
osd memory target = 1073741824
# memstore: count pages, not whole 4 MiB objects, and allow 8 GiB
# (the 1 GiB default fills up and then writes hang without an error).
memstore page set = true
memstore page size = 4096
memstore device bytes = 8589934592
# bluestore: a sparse 8 GiB file in the OSD's directory.
bluestore block create = true
bluestore block size = 8589934592
bluestore fsck on mkfs = false

[client]
keyring = $DIR/client.admin.keyring
EOF
}

make_keys() {
    {
    ceph-authtool "$DIR/mon.keyring" --create-keyring --gen-key -n mon. \
        --cap mon 'allow *'
    ceph-authtool "$DIR/client.admin.keyring" --create-keyring --gen-key \
        -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
        --cap mgr 'allow *' --cap mds 'allow *'
    ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/client.admin.keyring"
    } >>"$DIR/log/setup.out"
}

# Daemons fork into the background; their stdio goes to a file so that
# nobody waiting on our output waits for them.
run_mon() {
    rm -f "$DIR/run/mon.a.pid"
    ceph-mon -c "$CONF" -i a </dev/null >>"$DIR/log/daemons.out" 2>&1 ||
        die "ceph-mon failed to start (see $DIR/log)"
}

run_osd() {
    rm -f "$DIR/run/osd.0.pid"
    ceph-osd -c "$CONF" -i 0 </dev/null >>"$DIR/log/daemons.out" 2>&1 ||
        die "ceph-osd failed to start (see $DIR/log)"
}

make_mon() {
    local fsid=$1 base=$2
    monmaptool --create --fsid "$fsid" \
        --addv a "[v2:127.0.0.1:$base,v1:127.0.0.1:$((base + 1))]" "$DIR/monmap" >>"$DIR/log/setup.out"
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" \
        --keyring "$DIR/mon.keyring" >>"$DIR/log/daemons.out" 2>&1 ||
        die "ceph-mon --mkfs failed (see $DIR/log/daemons.out)"
    run_mon
}

# Register OSD 0 with the monitor, create the pool (before the OSD starts:
# its PGs are then created on the first boot), make the OSD's store.
make_osd() {
    local uuid secret id
    uuid=$(cat /proc/sys/kernel/random/uuid)
    secret=$(ceph-authtool --gen-print-key)
    printf '{"cephx_secret": "%s"}\n' "$secret" >"$DIR/osd-secret.json"
    id=$(CL_TIMEOUT=$CEPH_START_TIMEOUT cl ceph osd new "$uuid" -i "$DIR/osd-secret.json")
    rm -f "$DIR/osd-secret.json"
    [[ $id == 0 ]] || die "ceph osd new gave id '$id', expected 0"
    cl ceph osd pool create "$POOL" 8 8 >/dev/null 2>&1 ||
        die "could not create pool $POOL"
    mkdir -p "$DIR/osd.0"
    ceph-authtool "$DIR/osd.0/keyring" --create-keyring -n osd.0 --add-key "$secret" \
        >>"$DIR/log/setup.out"
    ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >>"$DIR/log/daemons.out" 2>&1 ||
        die "ceph-osd --mkfs failed (see $DIR/log)"
    run_osd
}

write_env() {
    {
        echo "export CEPH_CONF=$CONF"
        echo "export CEPH_CLUSTER_DIR=$DIR"
        echo "export CEPH_POOL=$POOL"
    } >"$DIR/env"
    cat "$DIR/env"
}

# A client that started while the OSD was away waits for it far longer
# than the OSD takes to come back: probe with short-lived ones.
pool_usable() {
    CL_TIMEOUT=4 cl rbd ls -p "$POOL" >/dev/null 2>&1
}

# Through the admin socket: no monitor, no network involved.
osd_active() {
    timeout 5 ceph --admin-daemon "$DIR/run/ceph-osd.0.asok" status 2>/dev/null |
        grep -q '"state": "active"'
}

wait_pool() {
    wait_for "$CEPH_START_TIMEOUT" "pool $POOL" pool_usable
}

cmd_start() {
    local base='' store=bluestore fsid t0
    POOL=rbd
    while (($#)); do
        case $1 in
        --pool) POOL=${2:?}; shift 2 ;;
        --port-base) base=${2:?}; shift 2 ;;
        --store) store=${2:?}; shift 2 ;;
        *) usage ;;
        esac
    done
    [[ $store == bluestore || $store == memstore ]] || die "--store: bluestore or memstore"
    if [[ -e $DIR && -n $(ls -A "$DIR") ]]; then
        die "$DIR is not empty"
    fi
    if [[ -n $base ]]; then
        _block_free "$base" || die "a port in $base-$((base + PORTS - 1)) is in use"
    else
        base=$(pick_ports)
    fi
    t0=$(now_ms)
    mkdir -p "$DIR"/{run,log,crash}
    # A start that fails leaves no daemon behind (DIR stays, for its logs).
    trap 'kill_daemon osd.0; kill_daemon mon.a' EXIT
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    echo "$POOL" >"$DIR/pool"
    echo "$store" >"$DIR/store"
    fsid=$(cat /proc/sys/kernel/random/uuid)
    write_conf "$fsid" "$base" "$store"
    make_keys
    make_mon "$fsid" "$base"
    make_osd
    CL_TIMEOUT=$CEPH_START_TIMEOUT cl rbd pool init "$POOL" ||
        die "rbd pool init $POOL failed (logs in $DIR/log)"
    wait_pool
    trap - EXIT
    echo "ceph-cluster: started in $(since "$t0") s" >&2
    write_env
}

# kill_daemon NAME: SIGKILL it by its pid file and wait until it is gone.
kill_daemon() {
    local pidf=$DIR/run/$1.pid pid
    [[ -s $pidf ]] || return 0
    pid=$(<"$pidf")
    # The pid file may be stale: only kill a ceph daemon.
    if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == ceph-* ]]; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_for 20 "$1 exit" _gone "$pid"
    fi
    rm -f "$pidf"
}

_gone() {
    [[ ! -e /proc/$1 ]] || [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == Z ]]
}

load_dir() {
    [[ -f $DIR/ceph.conf ]] || die "$DIR holds no cluster (no ceph.conf)"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    POOL=$(<"$DIR/pool")
}

cmd_stop() {
    local keep=
    [[ ${1:-} == --keep ]] && keep=1
    [[ -d $DIR ]] || return 0
    DIR=$(cd "$DIR" && pwd)
    kill_daemon osd.0
    kill_daemon mon.a
    [[ -n $keep ]] || rm -rf "$DIR"
}

cmd_start_osd() {
    local t0
    [[ $(<"$DIR/store") != memstore ]] ||
        die "memstore keeps no data across a kill; start the cluster with --store bluestore"
    kill_daemon osd.0
    t0=$(now_ms)
    run_osd
    wait_for "$CEPH_START_TIMEOUT" "osd.0" osd_active
    wait_pool
    echo "ceph-cluster: osd.0 back in $(since "$t0") s" >&2
}

cmd_start_mon() {
    kill_daemon mon.a
    run_mon
    wait_pool
}

main() {
    (($# >= 2)) || usage
    local cmd=$1
    DIR=$2
    shift 2
    case $cmd in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) load_dir && { pool_usable || exit 1; } ;;
    kill-osd) load_dir && kill_daemon osd.0 ;;
    kill-mon) load_dir && kill_daemon mon.a ;;
    start-osd) load_dir && cmd_start_osd ;;
    start-mon) load_dir && cmd_start_mon ;;
    *) usage ;;
    esac
}

main "$@"
