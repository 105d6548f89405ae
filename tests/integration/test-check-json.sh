#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport check --output=json against qemu-img check --output=json on the
# same images: clean ones (plain, fragmented, compressed, with a backing
# file), a leak, an OFLAG_COPIED corruption and a cluster whose refcount is
# 0: the same JSON object (parsed) and the same exit status, the JSON alone
# on stdout with each problem named on stderr; repairing them, the same
# JSON (with leaks-fixed, corruptions-fixed) and, as text, the same stdout
# (the summary of the repair) and stderr.  Also -f, -q, --output human and
# a wrong --output.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
META=$(cd "$(dirname "$0")" && pwd)/qcow2meta.py
cd "$T"

# same_json IMAGE: both checkers print the same object and exit the same.
same_json() {
    local qrc=0 brc=0
    qemu-img check --output=json "$1" >q.json 2>q.err || qrc=$?
    "$BLOCKPORT" check --output=json "$1" >b.json 2>b.err || brc=$?
    "$PY" - q.json b.json <<'PY' || { cat q.json b.json b.err; fail "$1: the JSON differs"; }
import json, sys
q, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if q == b else 1)
PY
    ((qrc == brc)) || fail "$1: exit $brc, qemu-img $qrc"
    ok "$1: same JSON, exit $brc"
}

check "clean images"
qemu-img create -q -f qcow2 plain.qcow2 64M
qemu-io -f qcow2 -c "write -P 1 0 3M" -c "write -z 8M 1M" plain.qcow2 >/dev/null
same_json plain.qcow2
qemu-img create -q -f qcow2 frag.qcow2 64M
for off in 48 32 16 0; do
    qemu-io -f qcow2 -c "write -P 2 ${off}M 64k" frag.qcow2 >/dev/null
done
same_json frag.qcow2
cp q.json frag.json
"$PY" -c 'print("blockport check " * 262144)' >text.raw # compressible
qemu-img convert -q -c -f raw -O qcow2 text.raw comp.qcow2
same_json comp.qcow2
grep -q compressed-clusters q.json || fail "comp.qcow2 has no compressed clusters"
grep -q fragmented-clusters frag.json || fail "frag.qcow2 is not fragmented"
random_file data.raw 4
qemu-img create -q -f qcow2 -b data.raw -F raw over.qcow2 4M
qemu-io -f qcow2 -c "write -P 3 1M 64k" over.qcow2 >/dev/null
same_json over.qcow2

check "a leak, an OFLAG_COPIED corruption, a refcount of 0 under data"
qemu-img create -q -f qcow2 base.qcow2 1M
qemu-io -f qcow2 -c "write -P 1 0 64k" base.qcow2 >/dev/null
eval "$("$PY" "$META" layout base.qcow2)"
cp base.qcow2 leak.qcow2
truncate -s $(((END + 1) * CS)) leak.qcow2
"$PY" "$META" poke leak.qcow2 $((RB + 2 * END))=$((1 << 48))
same_json leak.qcow2
grep -q "Leaked cluster $END" b.err || { cat b.err; fail "the leak is not named on stderr"; }
! grep -q "Leaked" b.json || fail "problem lines on stdout"

cp base.qcow2 copied.qcow2
entry=$("$PY" -c "
import struct
f = open('base.qcow2', 'rb'); f.seek($L2)
print(struct.unpack('>Q', f.read(8))[0] & ~(1 << 63))")
"$PY" "$META" poke copied.qcow2 "$L2=$entry"
same_json copied.qcow2
grep -q "OFLAG_COPIED" b.err || { cat b.err; fail "the COPIED error is not named"; }

cp base.qcow2 zero.qcow2
host=$((entry & 0x00fffffffffffe00))
# The data cluster's 16-bit refcount, in the 8 bytes starting at it.
"$PY" "$META" poke zero.qcow2 $((RB + 2 * (host / CS)))=0
same_json zero.qcow2

check "repairs: the JSON counts what was fixed; the summary is on stdout"
# same_repair MODE IMAGE [STDERR]: repairing copies of IMAGE, both
# checkers print the same JSON, as text the same stdout, and with STDERR the
# same stderr.  (Not after a rebuild of the refcounts: qemu-img names the
# old structure's clusters as it frees them, blockport's rebuild never
# counts them.)
same_repair() {
    local mode=$1 img=$2 stderr=${3:-} qrc=0 brc=0 f
    for f in json human; do
        cp "$img" q.qcow2
        cp "$img" b.qcow2
        qemu-img check --output=$f -r "$mode" q.qcow2 >q.$f 2>q.err || qrc=$?
        "$BLOCKPORT" check --output=$f -r "$mode" b.qcow2 >b.$f 2>b.err || brc=$?
        ((qrc == brc)) || fail "$img -r $mode --output=$f: exit $brc, qemu-img $qrc"
        [[ -z $stderr ]] || diff -u <(sed 's/^qemu-img: //' q.err) b.err ||
            fail "$img -r $mode --output=$f: stderr differs"
        ! grep -q "were found and repaired" b.err || fail "summary on stderr"
    done
    sed -i 's/q\.qcow2/b.qcow2/' q.json
    "$PY" - q.json b.json <<'PY' || { cat q.json b.json; fail "$img -r $mode: the JSON differs"; }
import json, sys
q, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(0 if q == b and ("leaks-fixed" in q or "corruptions-fixed" in q) else 1)
PY
    diff -u q.human b.human || fail "$img -r $mode: stdout differs"
    ok "$img -r $mode: same JSON (with what was fixed), same text on each stream"
}
same_repair leaks leak.qcow2 stderr
same_repair all copied.qcow2 stderr
same_repair all zero.qcow2

check "-f, -q, --output"
rc=0
"$BLOCKPORT" check --output=json -f raw data.raw >out 2>err || rc=$?
((rc == 63)) && [[ ! -s out ]] || fail "-f raw: exit $rc, stdout '$(cat out)'"
rc=0
"$BLOCKPORT" check -q leak.qcow2 >out 2>/dev/null || rc=$?
((rc == 3)) && [[ ! -s out ]] || fail "-q: exit $rc, stdout '$(cat out)'"
"$BLOCKPORT" check --output=human plain.qcow2 >out
grep -q "No errors were found on the image." out || fail "--output=human"
rc=0
"$BLOCKPORT" check --output=xml plain.qcow2 2>err || rc=$?
((rc == 1)) && grep -q "human or json" err || fail "--output=xml: $rc"
rc=0
cp leak.qcow2 b.qcow2
"$BLOCKPORT" check -q -r leaks b.qcow2 >out 2>/dev/null || rc=$?
((rc == 0)) && [[ ! -s out ]] || fail "-q -r leaks: exit $rc, stdout '$(cat out)'"
ok "-f raw exits 63, -q prints nothing (not even after a repair), human is the default, xml refused"
