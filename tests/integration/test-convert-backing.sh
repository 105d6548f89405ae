#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport convert -B BACKING [-F FMT]: a qcow2 copy that names BACKING
# as its backing file and holds only the clusters where the source differs
# from it.  The oracle is qemu-img convert -B: both results read the same
# (qemu-img compare), pass qemu-img check, and ours allocates no more; a
# local file (relative names too) and an NBD URI as BACKING.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

# base.raw: 24 MiB, patterns and a hole; top.qcow2 over it: new data, a
# write of what the base already holds, zeroes over base data, a discard.
qemu-img create -f raw base.raw 24M >/dev/null
qemu-io -f raw -c 'write -P 1 0 8M' -c 'write -P 2 16M 4M' base.raw >/dev/null
qemu-img create -f qcow2 -F raw -b base.raw top.qcow2 >/dev/null
qemu-io -f qcow2 -c 'write -P 3 1M 100k' -c 'write -P 1 2M 1M' \
  -c 'write -z 4M 128k' -c 'discard 17M 64k' -c 'write -P 4 10M 4k' \
  -c 'write -P 5 23M 1M' top.qcow2 >/dev/null

# allocated IMAGE: bytes the top layer of IMAGE holds (data or zero flags).
allocated() {
  qemu-img map --output=json "$1" | "$PY" -c '
import json, sys
print(sum(e["length"] for e in json.load(sys.stdin) if e["depth"] == 0))'
}

# same_as_qemu NAME SRC BACKING [FMT]: blockport's and qemu-img's convert -B
# of SRC over BACKING agree.
same_as_qemu() {
  local name=$1 src=$2 backing=$3 fmt=${4:-raw}
  rm -f "b-$name.qcow2" "q-$name.qcow2"
  run "$BLOCKPORT" convert -O qcow2 -B "$backing" -F "$fmt" "$src" "b-$name.qcow2" ||
    fail "$name: blockport convert -B"
  run qemu-img convert -O qcow2 -B "$backing" -F "$fmt" "$src" "q-$name.qcow2" ||
    fail "$name: qemu-img convert -B"
  run qemu-img compare "b-$name.qcow2" "q-$name.qcow2" || fail "$name: results differ"
  run qemu-img compare "b-$name.qcow2" "$src" || fail "$name: differs from the source"
  run qemu-img check "b-$name.qcow2" >/dev/null || fail "$name: qemu-img check"
  qemu-img info "b-$name.qcow2" >info.txt
  grep -qxF "backing file: $backing" info.txt && grep -qx "backing file format: $fmt" info.txt ||
    { cat info.txt; fail "$name: backing file not recorded"; }
  B_ALLOC=$(allocated "b-$name.qcow2")
  Q_ALLOC=$(allocated "q-$name.qcow2")
  ((B_ALLOC <= Q_ALLOC)) || fail "$name: $B_ALLOC bytes allocated, qemu-img $Q_ALLOC"
}

check "an overlay over a local raw base"
same_as_qemu local top.qcow2 base.raw
# Changed: 1M+100k (2 clusters), 4M zeroes (2), 17M (1), 10M (1), 23M (16);
# 2M..3M equals the base and is left out (qemu-img copies it).
((B_ALLOC == 22 * 65536)) || fail "$B_ALLOC bytes allocated, want $((22 * 65536))"
ok "same content as qemu-img's; $B_ALLOC bytes allocated, qemu-img $Q_ALLOC"

check "a flat source: only the clusters that differ from the base"
cp base.raw flat.raw
qemu-io -f raw -c 'write -P 9 5M 512' -c 'write -P 9 20M 64k' flat.raw >/dev/null
same_as_qemu flat flat.raw base.raw
((B_ALLOC == 2 * 65536)) || fail "$B_ALLOC bytes allocated, want 2 clusters"
ok "2 clusters allocated; qemu-img $Q_ALLOC bytes"

check "a relative backing name is relative to the output"
mkdir -p sub
rm -f sub/rel.qcow2
run "$BLOCKPORT" convert -O qcow2 -B ../base.raw -F raw top.qcow2 sub/rel.qcow2 ||
  fail "convert -B ../base.raw"
run qemu-img compare sub/rel.qcow2 top.qcow2 || fail "relative backing"
ok "opened from the output's directory"

check "an NBD URI as the backing file"
"$BLOCKPORT" serve --readonly --unix "$T/base.sock" --pid-file "$T/base.pid" \
  -f raw base.raw 2>base.log &
track_pid $!
wait_file 10 base.pid || { cat base.log; fail "base server"; }
BASE="nbd+unix:///?socket=$T/base.sock"
same_as_qemu nbd top.qcow2 "$BASE"
((B_ALLOC == 22 * 65536)) || fail "$B_ALLOC bytes allocated over NBD"
ok "same content as qemu-img's over $BASE"

check "refusals leave an existing output alone"
echo keep >dst.qcow2
for args in "-O raw -B base.raw" "-O qcow2 -F raw" "-O qcow2 -B missing.raw" \
  "-O qcow2 -B base.raw -F vmdk" "-O qcow2 -B dst.qcow2"; do
  rc=0
  # shellcheck disable=SC2086
  "$BLOCKPORT" convert $args top.qcow2 dst.qcow2 2>err.txt || rc=$?
  [[ $rc -eq 1 ]] || { cat err.txt; fail "convert $args: exit $rc"; }
  [[ $(cat dst.qcow2) == keep ]] || fail "convert $args touched the output"
done
ok "refused: exit 1, the output untouched"
