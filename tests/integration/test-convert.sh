#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport convert: raw and qcow2 out of raw, qcow2 chains, compressed and
# memory sources; the result equals the source (qemu-img compare), passes
# qemu-img check, and stays sparse where the source reads as zeroes.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

mkdir sub
qemu-img create -f raw sub/base.raw 24M >/dev/null
qemu-io -f raw -c 'write -P 1 0 4M' -c 'write -P 2 20M 64k' sub/base.raw >/dev/null
qemu-img create -f qcow2 -b base.raw -F raw sub/mid.qcow2 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 3 2M 1M' -c 'write -z 21M 64k' sub/mid.qcow2 >/dev/null
qemu-img create -f qcow2 -o cluster_size=4096 -b sub/mid.qcow2 -F qcow2 top.qcow2 40M >/dev/null
qemu-io -f qcow2 -c 'write -P 4 100k 8k' -c 'write -P 5 39M 4k' top.qcow2 >/dev/null
head -c 3M /dev/urandom >rnd.raw; truncate -s 8M rnd.raw
qemu-img convert -c -O qcow2 -o compression_type=zstd rnd.raw comp.qcow2

check "every source to raw and to qcow2: identical, clean, sparse"
for src in sub/base.raw sub/mid.qcow2 top.qcow2 rnd.raw comp.qcow2; do
  for of in raw qcow2; do
    rm -f "out.$of"
    run "$BLOCKPORT" convert -O "$of" "$src" "out.$of" || fail "convert $src -> $of"
    run qemu-img compare -f "$of" "out.$of" "$src" || fail "$src -> $of differs"
    if [ "$of" = qcow2 ]; then
      rc=0; qemu-img check out.qcow2 >check.txt 2>&1 || rc=$?
      [ $rc -eq 0 ] || { cat check.txt; fail "$src -> qcow2: check exit $rc"; }
    fi
  done
  ok "$src"
done
# top.qcow2 holds about 7.1 MiB of data in 40 MiB: the raw copy stays sparse.
"$BLOCKPORT" convert -O raw top.qcow2 sparse.raw
used=$(( $(stat -c %b sparse.raw) * 512 ))
[ $used -lt $((12 << 20)) ] || fail "raw copy not sparse: $used bytes allocated"
ok "sparse: $used bytes allocated for 40 MiB"

check "-c: compressed clusters that QEMU reads, checks and maps"
(for i in $(seq 1 3000); do echo "line $i of some compressible text"; done
 head -c 1M /dev/urandom) >text.raw
truncate -s 8M text.raw
for src in text.raw top.qcow2; do
  rm -f c.qcow2
  run "$BLOCKPORT" convert -c -O qcow2 "$src" c.qcow2 || fail "convert -c $src"
  run qemu-img compare c.qcow2 "$src" || fail "$src -> compressed differs"
  rc=0; qemu-img check c.qcow2 >check.txt 2>&1 || rc=$?
  [ $rc -eq 0 ] || { cat check.txt; fail "compressed $src: check exit $rc"; }
  grep -Eq '[1-9][0-9.]*% compressed clusters' check.txt || { cat check.txt; fail "nothing compressed"; }
  # And blockport reads its own compressed clusters back.
  rm -f back.raw
  "$BLOCKPORT" convert -O raw c.qcow2 back.raw
  run qemu-img compare -f raw back.raw "$src" || fail "read back differs"
  ok "$src: $(grep -o '[0-9.]*% compressed clusters' check.txt)"
done
rc=0; "$BLOCKPORT" convert -c -O raw text.raw x.raw 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "-c with -O raw: exit $rc"

check "runs of whole clusters: each refcount width, over a snapshot"
# A write covering several clusters that need allocating takes one run of
# host clusters and updates their refcounts together, block by block.
head -c 6M /dev/urandom >run.raw; truncate -s 9M run.raw
for o in refcount_bits=1,cluster_size=512 refcount_bits=4,cluster_size=1024 \
  refcount_bits=16,cluster_size=512 refcount_bits=64,cluster_size=4096 refcount_bits=8; do
  rm -f run.qcow2
  run "$BLOCKPORT" convert -O qcow2 -o "$o" run.raw run.qcow2 || fail "convert -o $o"
  run qemu-img check -q run.qcow2 || fail "-o $o: check"
  run qemu-img compare -q run.raw run.qcow2 || fail "-o $o: differs"
done
# Over data shared with a snapshot and a compressed cluster: the snapshot
# keeps its data, the old clusters lose the active image's reference.
rm -f run.qcow2
qemu-img create -q -f qcow2 run.qcow2 9M
qemu-io -c "write -P 7 0 5M" -c "write -c -P 8 5M 64k" run.qcow2 >/dev/null
qemu-img snapshot -c s1 run.qcow2
qemu-io -c "write -P 9 1M 64k" run.qcow2 >/dev/null
run "$BLOCKPORT" convert -n -O qcow2 run.raw run.qcow2 || fail "convert -n"
run qemu-img check -q run.qcow2 || fail "over a snapshot: check"
run qemu-img compare -q run.raw run.qcow2 || fail "over a snapshot: differs"
qemu-img convert -l snapshot.name=s1 -O raw run.qcow2 snap.raw
qemu-io -f raw -c "read -P 7 0 5M" -c "read -P 8 5M 64k" snap.raw | grep -q "verification failed" &&
  fail "the snapshot's data changed"
ok "clean and equal"

check "a memory: source and a null: source"
"$BLOCKPORT" convert -O qcow2 memory:16M mem.qcow2 || fail "convert memory:"
"$BLOCKPORT" convert -O raw null:16M null.raw || fail "convert null:"
[ "$(stat -c %s null.raw)" = $((16 << 20)) ] || fail "null.raw size"
ok "pseudo-devices"

check "errors: missing source, bad output format, unwritable destination"
rc=0; "$BLOCKPORT" convert -O raw missing.qcow2 x.raw 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "missing source: exit $rc"
rc=0; "$BLOCKPORT" convert -O vmdk rnd.raw x.vmdk 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "bad -O: exit $rc"
rc=0; "$BLOCKPORT" convert -O raw rnd.raw /nonexistent/x.raw 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "unwritable destination: exit $rc"
ok "refused"
