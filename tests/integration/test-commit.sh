#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport commit against qemu-img commit on twin backing chains: the
# same data in the base afterwards, the image emptied the same way (or
# left alone with -d and -b), both clean for qemu-img check, the same
# progress lines and message, and the same refusals with the same words
# and exit status.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T"
# chain DIR [BASE-CREATE-ARGS]: DIR/base.qcow2 (1 MiB of data) under
# DIR/top.qcow2 (data over part of it, a zero cluster, data past it).
chain() {
    mkdir -p "$1"
    run qemu-img create -q -f qcow2 "$1/base.qcow2" 4M
    run qemu-io -c "write -P 1 0 1M" "$1/base.qcow2" >/dev/null
    run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$1/top.qcow2" ${2:-}
    run qemu-io -c "write -P 2 512k 1M" -c "write -z 3M 64k" \
        -c "write -P 3 2M 4k" "$1/top.qcow2" >/dev/null
}
# layout FILE: its map without host offsets, neighbours that say the same
# joined (where the data landed in the file is each program's own).
layout() {
    qemu-img map --output=json "$1" | "$PY" -c '
import json, sys
out = []
for e in json.load(sys.stdin):
    k = (e["depth"], e["present"], e["zero"], e["data"])
    if out and out[-1][0] == k:
        out[-1][1] += e["length"]
    else:
        out.append([k, e["length"]])
print(out)'
}
# same_result Q B FILE...: each FILE clean in both, equal, backing alike.
same_result() {
    local f
    for f in "${@:3}"; do
        qemu-img check -q "$1/$f" || fail "qemu-img check $1/$f"
        qemu-img check -q "$2/$f" || fail "qemu-img check $2/$f"
        qemu-img compare -q "$1/$f" "$2/$f" || fail "$f differs from qemu-img's"
        [[ $(qemu-img info --output=json "$1/$f" | grep -i backing) == \
            "$(qemu-img info --output=json "$2/$f" | grep -i backing | sed "s|$2/|$1/|")" ]] ||
            fail "$f: backing fields differ"
        [[ $(layout "$1/$f") == "$(layout "$2/$f")" ]] ||
            fail "$f: map differs from qemu-img's"
    done
}

check "commit into the backing file: the base holds the data, the image is empty"
chain q
chain b
out=$("$BLOCKPORT" commit -p b/top.qcow2) || fail "blockport commit failed"
run qemu-img commit -q q/top.qcow2
same_result q b top.qcow2 base.qcow2
[[ $(qemu-img map --output=json b/top.qcow2 | grep -c '"depth": 0') == 0 ]] ||
    fail "the image still maps clusters of its own"
[[ $out == "    (0.00/100%)"$'\r'*"    (100.00/100%)"$'\r'$'\n'"Image committed." ]] ||
    fail "progress and message: $(cat -A <<<"$out")"
[[ $(stat -c %s b/top.qcow2) == $(stat -c %s q/top.qcow2) ]] ||
    fail "the emptied image's file is not cut as qemu-img cuts it"
ok "same base, same empty image"

check "-d and -b leave the image as it is; -b commits through the chain"
for d in q b; do
    chain "$d"
    run qemu-img create -q -f qcow2 -b top.qcow2 -F qcow2 "$d/up.qcow2"
    run qemu-io -c "write -P 5 3M 128k" "$d/up.qcow2" >/dev/null
done
run qemu-img commit -q -b base.qcow2 q/up.qcow2
[[ -z $("$BLOCKPORT" commit -q -b base.qcow2 b/up.qcow2) ]] || fail "-q printed"
same_result q b up.qcow2 top.qcow2 base.qcow2
run qemu-img commit -q -d q/up.qcow2
run "$BLOCKPORT" commit -q -d b/up.qcow2
same_result q b up.qcow2 top.qcow2
ok "as qemu-img"

check "a raw base smaller than the image grows; a version 2 image is emptied"
for d in rq rb; do
    mkdir "$d"
    run qemu-img create -q -f raw "$d/base.raw" 1M
    run qemu-io -f raw -c "write -P 1 0 512k" "$d/base.raw" >/dev/null
    run qemu-img create -q -f qcow2 -o compat=0.10 -b base.raw -F raw "$d/top.qcow2" 4M
    run qemu-io -c "write -P 2 256k 1M" -c "write -P 3 3M 64k" "$d/top.qcow2" >/dev/null
done
run qemu-img commit -q rq/top.qcow2
run "$BLOCKPORT" commit rb/top.qcow2 >/dev/null
same_result rq rb top.qcow2
qemu-img compare -q -f raw -F raw rq/base.raw rb/base.raw || fail "raw bases differ"
[[ $(stat -c %s rb/base.raw) == 4194304 ]] || fail "the raw base did not grow"
ok "as qemu-img"

check "refusals: the same message and exit status"
chain r
run qemu-img create -q -f raw r/plain.raw 1M
same_error() { # ARGS...: the first line of stderr and the exit status
    local want got
    want=$(cd r && qemu-img commit "$@" 2>&1 >/dev/null | grep -v -e WARNING -e '^  ' | head -1; echo "exit ${PIPESTATUS[0]}")
    got=$(cd r && "$BLOCKPORT" commit "$@" 2>&1 >/dev/null | grep -v "warning:" | head -1; echo "exit ${PIPESTATUS[0]}")
    [[ ${want/qemu-img: /} == "${got/blockport commit: /}" ]] ||
        fail "commit $*: qemu-img said
$want
blockport said
$got"
}
same_error plain.raw
same_error -f raw top.qcow2
same_error base.qcow2
same_error -b nothere top.qcow2
same_error -b top.qcow2 top.qcow2
same_error -b plain.raw top.qcow2
same_error -t bogus top.qcow2
same_error -r abc top.qcow2
same_error
same_error top.qcow2 base.qcow2
qemu-io -c "sleep 20000" r/base.qcow2 >/dev/null 2>qemu-io.err &
track_pid $!
wait_until 10 write_locked r/base.qcow2 ||
    fail "qemu-io did not lock the base: $(cat qemu-io.err)"
"$BLOCKPORT" commit r/top.qcow2 2>err && fail "a locked base was written"
grep -q 'Failed to get .*lock' err || fail "locked base: $(cat err)"
qemu-img compare -q r/top.qcow2 q/top.qcow2 2>/dev/null && fail "the image was emptied"
ok "refused as qemu-img refuses"
