#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport map --json (and --output=json) prints exactly what qemu-img map
# --output=json prints, on images made by QEMU: allocated, sparse, zero and compressed clusters,
# preallocation, a depth-3 chain with a short backing file, raw files.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

mkdir sub
qemu-img create -f raw sub/base.raw 16M >/dev/null
qemu-io -f raw -c 'write -P 1 0 4M' -c 'write -P 2 10M 64k' sub/base.raw >/dev/null
qemu-img create -f qcow2 -b base.raw -F raw sub/mid.qcow2 24M >/dev/null
qemu-io -f qcow2 -c 'write -P 3 2M 1M' -c 'write -z 12M 64k' sub/mid.qcow2 >/dev/null
qemu-img create -f qcow2 -o cluster_size=4096 -b sub/mid.qcow2 -F qcow2 top.qcow2 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 4 100k 8k' -c 'write -z -u 3M 64k' -c 'write -P 5 30M 4k' top.qcow2 >/dev/null
qemu-img create -f qcow2 -o preallocation=metadata pre.qcow2 8M >/dev/null
qemu-io -f qcow2 -c 'write -P 6 1M 64k' pre.qcow2 >/dev/null
head -c 4M /dev/urandom >data.raw; truncate -s 8M data.raw
qemu-img convert -c -O qcow2 data.raw comp.qcow2
qemu-img create -f qcow2 -o extended_l2=on ext.qcow2 8M >/dev/null
qemu-io -f qcow2 -c 'write -P 7 4k 4k' -c 'write -z 64k 2k' ext.qcow2 >/dev/null
# A preallocated cluster written in its middle: data between two holes of
# the host file, split as qemu-img splits it.
qemu-img create -f qcow2 -o preallocation=metadata hole.qcow2 1M >/dev/null
qemu-io -f qcow2 -c 'write -P 8 8k 4k' hole.qcow2 >/dev/null
# An external data file: the file column names it.
qemu-img create -f qcow2 -o data_file=ext.data df.qcow2 4M >/dev/null
qemu-io -f qcow2 -c 'write -P 9 64k 128k' -c 'write -P 9 1M 4k' df.qcow2 >/dev/null
head -c 1M <(yes blockport) >text.raw
qemu-img convert -c -O qcow2 text.raw ctext.qcow2

check "blockport map --json equals qemu-img map --output=json"
for img in sub/base.raw sub/mid.qcow2 top.qcow2 pre.qcow2 data.raw comp.qcow2 ext.qcow2 \
    hole.qcow2 df.qcow2 ctext.qcow2; do
  "$BLOCKPORT" map --json "$img" >bp.json || fail "blockport map $img failed"
  qemu-img map --output=json "$img" >q.json
  diff -u q.json bp.json || fail "$img: maps differ"
  ok "$img"
done

check "the human table names the same files and offsets"
"$BLOCKPORT" map top.qcow2 >bp.txt
qemu-img map top.qcow2 >q.txt
diff -u <(tr -s ' ' <q.txt) <(tr -s ' ' <bp.txt) || fail "tables differ"
ok "table"

check "the table: zeroes left out, the data file named, compressed clusters refused"
for img in hole.qcow2 df.qcow2 pre.qcow2; do
  "$BLOCKPORT" map "$img" >bp.txt || fail "map $img"
  qemu-img map "$img" >q.txt
  diff -u <(tr -s ' ' <q.txt) <(tr -s ' ' <bp.txt) || fail "$img: tables differ"
done
rc=0; "$BLOCKPORT" map ctext.qcow2 >bp.txt 2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "compressed clusters" err.txt || fail "compressed clusters in a table: exit $rc"
ok "as qemu-img's"

check "an NBD source: offsets and the export's name as qemu-img map gives them"
require qemu-nbd
for img in sub/base.raw top.qcow2; do
  qemu-nbd -r -t -k "$T/qn.sock" "$img" &
  qpid=$!
  track_pid $qpid
  wait_until 10 test -S "$T/qn.sock" || fail "qemu-nbd did not start"
  U="nbd+unix:///?socket=$T/qn.sock"
  "$BLOCKPORT" map --output=json "$U" >bp.json || fail "map --output=json $U"
  qemu-img map --output=json "$U" >q.json
  diff -u q.json bp.json || fail "$img over NBD: maps differ"
  "$BLOCKPORT" map "$U" >bp.txt || fail "map $U"
  qemu-img map "$U" >q.txt
  diff -u <(tr -s ' ' <q.txt) <(tr -s ' ' <bp.txt) || fail "$img over NBD: tables differ"
  kill $qpid
  wait $qpid 2>/dev/null || true
  rm -f "$T/qn.sock"
done
ok "the same as qemu-img's"

check "a missing image: exit 1"
rc=0; "$BLOCKPORT" map nonexistent.qcow2 2>err.txt || rc=$?
[ $rc -eq 1 ] || fail "exit $rc"
ok "refused"

check "qemu-img's spelling: --output=json and --output=human"
for img in top.qcow2 comp.qcow2; do
  "$BLOCKPORT" map --output=json "$img" >bp.json || fail "--output=json $img"
  qemu-img map --output=json "$img" >q.json
  diff -u q.json bp.json || fail "$img: --output=json differs"
  "$BLOCKPORT" map --output human "$img" >bp.txt || fail "--output human $img"
  qemu-img map --output=human "$img" >q.txt
  diff -u <(tr -s ' ' <q.txt) <(tr -s ' ' <bp.txt) || fail "$img: --output human differs"
done
rc=0; "$BLOCKPORT" map --output=xml top.qcow2 2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "human or json" err.txt || fail "--output=xml: exit $rc"
ok "--output=json, --output human, --output=xml refused"

check "--start-offset and --max-length: the same runs as qemu-img's"
for range in "--start-offset=1M --max-length=3M" "--start-offset=65536 --max-length=70000" \
    "--start-offset=500k" "--max-length=100G" "--start-offset=1 --max-length=1" \
    "--start-offset=1G" "--max-length=0"; do
  for out in json human; do
    # shellcheck disable=SC2086 # $range is words
    qemu-img map --output=$out $range top.qcow2 >q.out
    # shellcheck disable=SC2086
    "$BLOCKPORT" map --output=$out $range top.qcow2 >bp.out || fail "map $range"
    diff -u <(tr -s ' ' <q.out) <(tr -s ' ' <bp.out) || fail "map --output=$out $range differs"
  done
done
rc=0; "$BLOCKPORT" map --start-offset=-1 top.qcow2 2>err.txt || rc=$?
[ $rc -eq 1 ] && grep -q "start offset" err.txt || fail "--start-offset=-1: exit $rc"
ok "the same runs; a negative offset refused"
