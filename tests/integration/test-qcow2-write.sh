#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# qcow2 writes through `blockport serve`, checked against QEMU's oracles:
# after each workload `qemu-img check` finds no corruption and no leak, and
# `qemu-img compare` finds the image equal to a raw shadow that received
# the same writes.  Covers cluster sizes 512 B (refcount table growth) to
# 2 MiB, refcount widths 1 to 64 bits, version 2, extended L2, a backing file,
# external data files (a raw one stays identical to the disk), a
# compressed image, an internal snapshot (which must stay intact), parallel
# fio writes with verification, and kill -9 in the middle of a write storm.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io fio

# The same qemu-io commands go to the export and to the shadow.
CMDS=(-c 'write -P 0x11 1000 4k' -c 'write -P 0x22 100k 200k'
      -c 'write -P 0x33 10M 1M' -c 'write -z 12M 64k' -c 'write -z 13M 1000'
      -c 'write -P 0x44 30M 2M' -c 'write -P 0x55 5000 3000'
      -c 'write -z -u 24M 1M' -c 'write -P 0x66 24M 4k')

# workload IMAGE SHADOW: write both, compare live and offline, check.
workload() {
  local img=$1 shadow=$2
  start_server "$img"
  run qemu-io -f raw "${CMDS[@]}" "$URI" >/dev/null || fail "qemu-io on $img"
  qemu-io -f raw "${CMDS[@]}" "$shadow" >/dev/null
  run qemu-img compare -f raw -F raw "$shadow" "$URI" ||
    fail "$img differs from its shadow while served"
  stop_server
  verify_image "$img" "$shadow"
}

verify_image() {
  local img=$1 shadow=$2 rc=0
  qemu-img check "$img" >"$T/check.txt" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$T/check.txt"; fail "qemu-img check $img: exit $rc"; }
  run qemu-img compare -F raw "$img" "$shadow" ||
    fail "$img differs from its shadow after shutdown"
}

check "fresh images of every geometry: qemu-io workload, check, compare"
for opts in cluster_size=512 cluster_size=4096,refcount_bits=1 \
            cluster_size=65536 cluster_size=2M,refcount_bits=64 \
            cluster_size=65536,refcount_bits=8 compat=0.10 lazy_refcounts=on \
            extended_l2=on extended_l2=on,cluster_size=2M; do
  rm -f "$T/e.qcow2" "$T/shadow.raw"
  qemu-img create -f qcow2 -o "$opts" "$T/e.qcow2" 40M >/dev/null
  truncate -s 40M "$T/shadow.raw"
  workload "$T/e.qcow2" "$T/shadow.raw"
  ok "$opts"
done

check "an overlay over a raw backing file (partial clusters copy on write)"
random_file "$T/base.raw" 32
cp "$T/base.raw" "$T/shadow.raw"
truncate -s 40M "$T/shadow.raw"
qemu-img create -f qcow2 -b base.raw -F raw "$T/ov.qcow2" 40M >/dev/null
workload "$T/ov.qcow2" "$T/shadow.raw"
ok "overlay"

check "an extended L2 overlay: writes into partly allocated subclusters"
cp "$T/base.raw" "$T/shadow.raw"
truncate -s 40M "$T/shadow.raw"
qemu-img create -f qcow2 -o extended_l2=on -b base.raw -F raw "$T/ext.qcow2" 40M >/dev/null
# qemu-io allocates single subclusters first; blockport then writes around them.
qemu-io -f qcow2 -c 'write -P 0x77 8k 4k' -c 'write -z 100k 2k' "$T/ext.qcow2" >/dev/null
qemu-io -f raw -c 'write -P 0x77 8k 4k' -c 'write -z 100k 2k' "$T/shadow.raw" >/dev/null
workload "$T/ext.qcow2" "$T/shadow.raw"
ok "extended L2 overlay"

check "extended L2: a small write allocates only the subclusters it touches"
# 64 KiB clusters, 2 KiB subclusters: 3000 bytes at 5000 touch subclusters
# 2-3 ([4096, 8192)); the rest of the cluster still reads from the backing
# file.  A zero write of whole subclusters sets zero bits only.
qemu-img create -f qcow2 -o extended_l2=on -b base.raw -F raw "$T/sc.qcow2" 40M >/dev/null
cp "$T/base.raw" "$T/shadow.raw"
truncate -s 40M "$T/shadow.raw"
SCMDS=(-c 'write -P 0x5a 5000 3000' -c 'write -z 1M 8k' -c 'write -z 2M 3000')
start_server "$T/sc.qcow2"
run qemu-io -f raw "${SCMDS[@]}" "$URI" >/dev/null || fail "qemu-io"
stop_server
qemu-io -f raw "${SCMDS[@]}" "$T/shadow.raw" >/dev/null
verify_image "$T/sc.qcow2" "$T/shadow.raw"
qemu-img map --output=json "$T/sc.qcow2" >"$T/scmap.json"
$PY - "$T/scmap.json" <<'P' || fail "subcluster allocation not as expected"
import json, sys
m = json.load(open(sys.argv[1]))
def at(off):
    return next(e for e in m if e["start"] <= off < e["start"] + e["length"])
top = lambda off: at(off)["depth"] == 0
assert not top(4095) and top(4096) and top(8191) and not top(8192), m[:6]
z = at(1 << 20)
assert z["depth"] == 0 and z["zero"] and not z["data"] and z["length"] == 8192, z
assert not top((1 << 20) + 8192), m
P
ok "only the touched subclusters are allocated; zero bits for zero writes"

check "external data files: plain, raw (kept raw), and over a backing file"
for variant in plain raw backing; do
  rm -f "$T/d.qcow2" "$T/d.data"
  # An absolute name: qemu-img looks for a relative one in its working
  # directory, blockport beside the image.
  case $variant in
  plain) opts=data_file=$T/d.data ;;
  raw) opts=data_file=$T/d.data,data_file_raw=on ;;
  backing) opts=data_file=$T/d.data,backing_file=base.raw,backing_fmt=raw ;;
  esac
  (cd "$T" && qemu-img create -f qcow2 -o "$opts" d.qcow2 40M >/dev/null)
  rm -f "$T/shadow.raw"
  if [ $variant = backing ]; then cp "$T/base.raw" "$T/shadow.raw"; fi
  truncate -s 40M "$T/shadow.raw"
  workload "$T/d.qcow2" "$T/shadow.raw"
  [ "$(wc -c <"$T/d.qcow2")" -lt $((1 << 20)) ] || fail "$variant: data went into the image file"
  if [ $variant = raw ]; then
    cmp "$T/d.data" "$T/shadow.raw" || fail "raw data file differs from the disk"
    qemu-img info "$T/d.qcow2" | grep -q "data file raw: true" || fail "raw bit lost"
  fi
  ok "$variant"
done

check "a compressed image: writes into compressed clusters"
qemu-img convert -c -O qcow2 "$T/base.raw" "$T/comp.qcow2"
cp "$T/base.raw" "$T/shadow.raw"
workload "$T/comp.qcow2" "$T/shadow.raw"
ok "compressed"

check "an internal snapshot stays intact while the active image is written"
qemu-img convert -O qcow2 "$T/base.raw" "$T/snap.qcow2"
qemu-img snapshot -c s1 "$T/snap.qcow2"
cp "$T/base.raw" "$T/shadow.raw"
workload "$T/snap.qcow2" "$T/shadow.raw"
cp "$T/snap.qcow2" "$T/revert.qcow2"
qemu-img snapshot -a s1 "$T/revert.qcow2"
verify_image "$T/revert.qcow2" "$T/base.raw"
ok "snapshot s1 still holds the original data"

# fio_verify IMAGE BS: 4 jobs of random writes (aligned to the smallest
# block size), then read back.
fio_verify() {
  start_server "$1"
  cat >"$T/v.fio" <<J
[global]
ioengine=nbd
uri=$URI
rw=randwrite
bsrange=$2
iodepth=32
numjobs=4
size=16M
offset_increment=16M
verify=crc32c
do_verify=1
verify_fatal=1
group_reporting=1
[v]
J
  (cd "$T" && run fio --output="$T/fio.out" v.fio) || { cat "$T/fio.out"; fail "fio verify $1"; }
  stop_server
  local rc=0; qemu-img check "$1" >"$T/check.txt" 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat "$T/check.txt"; fail "check after fio on $1: exit $rc"; }
}

check "4 fio jobs with crc32c verify on a fresh image"
qemu-img create -f qcow2 "$T/f.qcow2" 64M >/dev/null
fio_verify "$T/f.qcow2" 4k-64k
ok "fio verified, image clean"

check "4 fio jobs, unaligned to subclusters, on an extended L2 overlay"
qemu-img create -f qcow2 -o extended_l2=on -b base.raw -F raw "$T/fx.qcow2" 64M >/dev/null
fio_verify "$T/fx.qcow2" 1k-20k
ok "fio verified, image clean"

check "kill -9 during a write storm: no corruption (leaks allowed), flushed data intact"
cat >"$T/storm.fio" <<J
[global]
ioengine=nbd
uri=nbd+unix:///?socket=$T/sock
rw=randwrite
bs=4k-128k
iodepth=32
numjobs=2
size=32M
time_based=1
runtime=20
[s]
J
for i in $(seq 1 12); do
  # A tracker that never got going (a loaded machine) must not leave the
  # previous round's log behind.
  rm -f "$T/k.qcow2" "$T/durable.txt"
  qemu-img create -f qcow2 -o cluster_size=$((4096 << (i % 3 * 2))) "$T/k.qcow2" 64M >/dev/null
  # Data written and flushed before the storm must survive the kill.
  qemu-io -f qcow2 -c 'write -P 0x7e 60M 1M' "$T/k.qcow2" >/dev/null
  start_server "$T/k.qcow2"
  # fio's job processes may sit in a call to the dead server, in sessions
  # of their own: kill_tree ends them all.
  (cd "$T" && exec fio storm.fio >/dev/null 2>&1) &
  storm=$!
  track_pid $storm
  # And so must every write acknowledged before a completed FLUSH: the
  # tracker writes 16 blocks of 4 KiB in [40M, 56M) per round with a
  # pattern naming the round, flushes, and only then logs the round.
  "$PY" - "$URI" "$T/durable.txt" >/dev/null 2>&1 <<'PYEOF' &
import sys, nbd, os
h = nbd.NBD()
h.connect_uri(sys.argv[1])
log = open(sys.argv[2], "w")
rnd = 0
while True:
    rnd += 1
    blocks = [(40 << 20) + ((rnd * 7919 + k * 104729) % 4096) * 4096
              for k in range(16)]
    for b in blocks:
        h.pwrite(bytes([rnd % 250 + 1]) * 4096, b)
    h.flush()
    log.write("%d\n" % rnd)
    log.flush()
    os.fsync(log.fileno())
PYEOF
  tracker=$!
  track_pid $tracker
  # The moment of the crash, at random (not a wait for anything).
  sleep "0.$((3 + RANDOM % 7))"
  kill -9 "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  kill_tree $storm
  kill_tree $tracker
  SERVER_PID=
  rc=0; qemu-img check "$T/k.qcow2" >"$T/check.txt" 2>&1 || rc=$?
  # 0 clean, 3 leaks only; 2 (corruption) or anything else fails.
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat "$T/check.txt"; fail "kill $i: check exit $rc"; }
  run qemu-io -f qcow2 -r -c 'read -P 0x7e 60M 1M' "$T/k.qcow2" >/dev/null ||
    fail "kill $i: data flushed before serving lost"
  qemu-img convert -O raw "$T/k.qcow2" "$T/k.raw"
  # Each block must hold the pattern of the last logged round that wrote
  # it, or of the round in flight at the kill (written, maybe flushed, not
  # yet logged).  The storm stays below 32M, the tracker at 40M and above.
  n=$("$PY" - "$T/durable.txt" "$T/k.raw" <<'PYEOF'
import os, sys
rounds = [int(x) for x in open(sys.argv[1]).read().split()] if os.path.exists(sys.argv[1]) else []
last = max(rounds) if rounds else 0
def blocks(r):
    return [(40 << 20) + ((r * 7919 + k * 104729) % 4096) * 4096 for k in range(16)]
want = {}
for r in range(1, last + 1):
    for b in blocks(r):
        want[b] = {r % 250 + 1}
# The round in flight may or may not have landed; a block it alone wrote
# may still be zero.
for b in blocks(last + 1):
    want.setdefault(b, {0}).add((last + 1) % 250 + 1)
img = open(sys.argv[2], "rb").read()
bad = 0
for b, pats in want.items():
    data = img[b:b + 4096]
    if data.count(data[0]) == 4096 and data[0] in pats:
        continue
    bad += 1
    print("block %d holds %r..., want one of %r" % (b, data[:4], pats), file=sys.stderr)
print(len(want) if not bad else -bad)
PYEOF
)
  [ "${n:--1}" -ge 0 ] || fail "kill $i: flushed writes lost ($n)"
  verified=$((${verified:-0} + n))
  ok "kill $i: check exit $rc, $n flushed blocks verified"
done
# A tracker that never flushed anything would make all of this vacuous.
[ "$verified" -gt 1000 ] || fail "only $verified flushed blocks were checked"
