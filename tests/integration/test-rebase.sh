#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport rebase against qemu-img rebase on twin backing chains: safe
# mode onto another image, onto an image of the old chain, onto nothing
# (-b ""), and -u; the image reads as before (safe mode), both clean for
# qemu-img check, equal, with the same backing fields; the same progress
# lines; and the same refusals with the same words and exit status.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

cd "$T"
# template DIR [TOP-CREATE-ARGS]: DIR/base.qcow2 under DIR/mid.qcow2 under DIR/top.qcow2, and
# DIR/new.qcow2 and DIR/new.raw that agree with base.qcow2 in part.
template() {
    mkdir -p "$1"
    run qemu-img create -q -f qcow2 "$1/base.qcow2" 4M
    run qemu-io -c "write -P 1 0 2M" "$1/base.qcow2" >/dev/null
    run qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 "$1/mid.qcow2"
    run qemu-io -c "write -P 3 1M 64k" -c "write -z 1536k 64k" "$1/mid.qcow2" >/dev/null
    run qemu-img create -q -f qcow2 -b mid.qcow2 -F qcow2 "$1/top.qcow2" ${2:-}
    run qemu-io -c "write -P 2 512k 64k" -c "write -P 4 3M 4k" "$1/top.qcow2" >/dev/null
    run qemu-img create -q -f qcow2 "$1/new.qcow2" 2M
    run qemu-io -c "write -P 1 0 1M" -c "write -P 9 1536k 128k" "$1/new.qcow2" >/dev/null
    run qemu-img convert -O raw "$1/new.qcow2" "$1/new.raw"
    cp "$1/top.qcow2" "$1/orig.qcow2" # what the image read before
}
template tmpl
template tmpl2 "-o compat=0.10"
# chain DIR [TEMPLATE]: a copy of a template (relative backing names)
chain() {
    cp -r "${2:-tmpl}" "$1"
}
backing_fields() {
    qemu-img info --output=json "$1" | grep '"backing-filename' || true
}
# same Q B: B/top.qcow2 as qemu-img made Q/top.qcow2, and (safe mode)
# reading as it read.
same() {
    qemu-img check -q "$1/top.qcow2" || fail "qemu-img check $1/top.qcow2"
    qemu-img check -q "$2/top.qcow2" || fail "qemu-img check $2/top.qcow2"
    qemu-img compare -q "$1/top.qcow2" "$2/top.qcow2" || fail "$2: differs from qemu-img's"
    [[ $(backing_fields "$1/top.qcow2") == "$(backing_fields "$2/top.qcow2")" ]] ||
        fail "$2: backing fields differ: $(backing_fields "$2/top.qcow2")"
}

check "safe mode: onto another image, an image of the chain, a raw file, nothing"
n=0
for args in "-b new.qcow2 -F qcow2" "-b base.qcow2 -F qcow2" "-b mid.qcow2 -F qcow2" \
    "-b new.raw -F raw" "-b ''" "-b '' -F qcow2"; do
    n=$((n + 1))
    chain "q$n"
    chain "b$n"
    (cd "q$n" && eval qemu-img rebase "$args" top.qcow2) || fail "qemu-img rebase $args"
    (cd "b$n" && eval '"$BLOCKPORT"' rebase "$args" top.qcow2) || fail "blockport rebase $args"
    same "q$n" "b$n"
    qemu-img compare -q "b$n/orig.qcow2" "b$n/top.qcow2" || fail "$args: the image reads otherwise"
done
ok "the same images, reading as before"

check "-u changes the header only; -p prints qemu-img's progress lines"
chain qu
chain bu
run qemu-img rebase -u -b gone.qcow2 -F qcow2 qu/top.qcow2
run "$BLOCKPORT" rebase -u -b gone.qcow2 -F qcow2 bu/top.qcow2
[[ $(backing_fields qu/top.qcow2) == "$(backing_fields bu/top.qcow2)" ]] ||
    fail "-u: backing fields differ"
cmp -s qu/top.qcow2 bu/top.qcow2 || fail "-u: the header differs from qemu-img's"
run qemu-img rebase -u -b base.qcow2 -F qcow2 qu/mid.qcow2
run "$BLOCKPORT" rebase -u -q -b base.qcow2 -F qcow2 bu/mid.qcow2
cmp -s qu/mid.qcow2 bu/mid.qcow2 || fail "-u: the header differs from qemu-img's"
chain bp tmpl2
out=$("$BLOCKPORT" rebase -p -b new.qcow2 -F qcow2 bp/top.qcow2) || fail "rebase -p"
[[ $out == "    (0.00/100%)"$'\r'*"    (100.00/100%)"$'\r' ]] ||
    fail "progress: $(cat -A <<<"$out")"
qemu-img compare -q bp/orig.qcow2 bp/top.qcow2 || fail "version 2: the image reads otherwise"
ok "as qemu-img"

check "refusals: the same message and exit status"
for d in r rb; do # qemu-img writes before some of its refusals: twins
    chain "$d"
done
run qemu-img create -q -f raw r/plain.raw 1M
run qemu-img create -q -f qcow2 -o cluster_size=512 r/small.qcow2 1M
cp r/plain.raw r/small.qcow2 rb/
same_error() { # ARGS...: the first line of stderr and the exit status
    local want got
    want=$(cd r && qemu-img rebase "$@" 2>&1 >/dev/null | grep -v -e WARNING -e '^  ' | head -1; echo "exit ${PIPESTATUS[0]}")
    got=$(cd rb && "$BLOCKPORT" rebase "$@" 2>&1 >/dev/null | grep -v "warning:" | head -1; echo "exit ${PIPESTATUS[0]}")
    [[ ${want/qemu-img: /} == "${got/blockport rebase: /}" ]] ||
        fail "rebase $*: qemu-img said
$want
blockport said
$got"
}
long=$(printf 'b%.0s' {1..377})
same_error -u -b "$long" -F qcow2 small.qcow2
same_error -u -b "${long}${long}${long}" -F qcow2 top.qcow2
same_error -b new.qcow2 top.qcow2
same_error -u -b new.qcow2 top.qcow2
same_error -b new.qcow2 -F foo top.qcow2
same_error -f raw -b new.qcow2 -F qcow2 plain.raw
same_error -f raw -b '' plain.raw
same_error -t bogus -b new.qcow2 -F qcow2 top.qcow2
same_error -T bogus -b new.qcow2 -F qcow2 top.qcow2
same_error top.qcow2
same_error -b new.qcow2
same_error -b new.qcow2 -F qcow2 top.qcow2 mid.qcow2
cmp -s rb/top.qcow2 rb/orig.qcow2 || fail "a refused rebase changed the image"
ok "refused as qemu-img refuses"
