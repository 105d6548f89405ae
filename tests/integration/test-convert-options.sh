#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# convert's qemu-img options, with qemu-img as the oracle: -o (the format
# options qemu-img info then shows, preallocation, backing_file as -B),
# -o help; -n into an existing image (zeroes written over old data, or
# skipped with --target-is-zero), -n into a smaller image refused; -S 0
# allocating everything and -S SIZE leaving zero runs of SIZE sparse;
# -m and -W; a 1000-byte raw file becoming a 1024-byte qcow2 as qemu-img
# makes it; -C (copy_file_range); an external data file (-o data_file, data_file_raw).  Every
# copy is checked with qemu-img compare (and check).
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

info() { # IMAGE EXPR
    qemu-img info --output=json "$1" |
        "$PY" -c "import json,sys; j=json.load(sys.stdin); print($2)"
}
same() { # SRC DST [qcow2]
    run qemu-img compare -q "$1" "$2" || fail "$2 differs from $1"
    [[ ${3:-} != qcow2 ]] || run qemu-img check -q "$2" || fail "$2: check"
}

random_file data.raw 4
qemu-io -f raw -c "write -z 1M 1M" data.raw >/dev/null

check "-o: qcow2 options as qemu-img info shows them"
run "$BLOCKPORT" convert -O qcow2 \
    -o cluster_size=4k,extended_l2=off,compression_type=zstd,refcount_bits=8,lazy_refcounts=on \
    data.raw o1.qcow2
same data.raw o1.qcow2 qcow2
[[ $(info o1.qcow2 'j["cluster-size"]') == 4096 ]] || fail "cluster size"
[[ $(info o1.qcow2 'j["format-specific"]["data"]["compression-type"]') == zstd ]] ||
    fail "compression type"
[[ $(info o1.qcow2 'j["format-specific"]["data"]["refcount-bits"]') == 8 ]] ||
    fail "refcount bits"
[[ $(info o1.qcow2 'j["format-specific"]["data"]["lazy-refcounts"]') == True ]] ||
    fail "lazy refcounts"
run "$BLOCKPORT" convert -O qcow2 -o compat=0.10,cluster_size=16k data.raw o2.qcow2
same data.raw o2.qcow2 qcow2
[[ $(info o2.qcow2 'j["format-specific"]["data"]["compat"]') == 0.10 ]] ||
    fail "compat=0.10"
run "$BLOCKPORT" convert -O qcow2 -o extended_l2=on,cluster_size=64k data.raw o3.qcow2
same data.raw o3.qcow2 qcow2
[[ $(info o3.qcow2 'j["format-specific"]["data"]["extended-l2"]') == True ]] ||
    fail "extended_l2"
ok "cluster_size, compat, extended_l2, compression_type, refcount_bits, lazy_refcounts"

for p in metadata falloc full; do
    run "$BLOCKPORT" convert -O qcow2 -o preallocation=$p data.raw p-$p.qcow2
    same data.raw p-$p.qcow2 qcow2
done
for p in falloc full; do
    run "$BLOCKPORT" convert -O raw -o preallocation=$p data.raw p-$p.raw
    same data.raw p-$p.raw
    (($(stat -c %b p-$p.raw) * 512 >= 4 << 20)) || fail "raw $p: not allocated"
done
ok "preallocation for qcow2 (metadata, falloc, full) and raw (falloc, full)"

qemu-img create -q -f raw base.raw 4M
run "$BLOCKPORT" convert -O qcow2 -o backing_file=base.raw,backing_fmt=raw \
    data.raw ob.qcow2
same data.raw ob.qcow2 qcow2
[[ $(info ob.qcow2 'j["backing-filename"]') == base.raw ]] || fail "backing_file"
rc=0
"$BLOCKPORT" convert -O qcow2 -B other.raw -o backing_file=base.raw data.raw x.qcow2 \
    2>err || rc=$?
((rc == 1)) && grep -q disagree err || fail "-B and -o backing_file that differ: $rc"
ok "-o backing_file,backing_fmt as -B and -F"

check "-o data_file, data_file_raw: the data in an external file, as qemu-img makes it"
run "$BLOCKPORT" convert -O qcow2 -o data_file=od.data data.raw od.qcow2
same data.raw od.qcow2 qcow2
[[ -s od.data ]] || fail "no data file beside the image"
[[ $(info od.qcow2 'j["format-specific"]["data"]["data-file"]') == od.data ]] ||
    fail "data-file: $(info od.qcow2 'j["format-specific"]["data"]')"
(($(stat -c %s od.qcow2) < 1 << 20)) || fail "the data went into the image"
run "$BLOCKPORT" convert -O qcow2 -o data_file=or.data,data_file_raw=on data.raw or.qcow2
same data.raw or.qcow2 qcow2
cmp data.raw or.data || fail "the raw data file is not the disk"
[[ $(info or.qcow2 'j["format-specific"]["data"]["data-file-raw"]') == True ]] ||
    fail "data-file-raw not set"
ok "data_file, data_file_raw"

"$BLOCKPORT" convert -O qcow2 -o help >help.txt || fail "-o help: exit $?"
grep -q "^  cluster_size=" help.txt && grep -q "^  preallocation=" help.txt ||
    fail "-o help: $(cat help.txt)"
rc=0
"$BLOCKPORT" convert -O raw -o cluster_size=4k data.raw x.raw 2>err || rc=$?
((rc == 1)) && grep -q "raw images do not take the option 'cluster_size'" err ||
    fail "raw with cluster_size: $rc"
ok "-o help; an option the format does not take is refused"

check "-C: copy offloading (copy_file_range) into raw, as qemu-img -C"
run qemu-img create -q -f qcow2 cq.qcow2 4M
run qemu-io -c "write -P 1 0 1M" -c "write -P 2 3M 512k" cq.qcow2 >/dev/null
head -c 1M <(yes blockport) >text.raw
run qemu-img convert -c -O qcow2 text.raw cz.qcow2
for src in data.raw cq.qcow2 cz.qcow2; do
    rm -f oc.raw
    if command -v strace >/dev/null; then
        # LeakSanitizer cannot run under ptrace.
        ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
            strace -f -qq -e trace=copy_file_range -o trace.txt "$BLOCKPORT" convert -C -O raw "$src" oc.raw ||
            fail "-C $src"
        calls=$(grep -c "^[0-9]* *copy_file_range" trace.txt || true)
        # Compressed clusters are not in a file as they read: through memory.
        if [[ $src == cz.qcow2 ]]; then ((calls == 0)); else ((calls > 0)); fi ||
            fail "-C $src: $calls copy_file_range calls"
    else
        run "$BLOCKPORT" convert -C -O raw "$src" oc.raw
    fi
    same "$src" oc.raw
done
run "$BLOCKPORT" convert -C -O qcow2 data.raw oc.qcow2
same data.raw oc.qcow2 qcow2
for bad in "-S 4k" "-c"; do
    rc=0
    # shellcheck disable=SC2086 # two words or one
    "$BLOCKPORT" convert -C $bad -O qcow2 data.raw x.qcow2 2>err || rc=$?
    ((rc == 1)) && grep -q "Cannot enable copy offloading when ${bad%% *} is used" err ||
        fail "-C $bad: exit $rc, $(cat err)"
done
ok "-C: raw and qcow2 sources, compressed clusters through memory, -S and -c refused"

check "-n: into an existing image"
random_file old.raw 4
run "$BLOCKPORT" convert -n -O raw data.raw old.raw
same data.raw old.raw
qemu-img create -q -f qcow2 old.qcow2 8M
qemu-io -f qcow2 -c "write -P 0x77 0 8M" old.qcow2 >/dev/null
run "$BLOCKPORT" convert -n -O qcow2 data.raw old.qcow2
run qemu-img compare -q -f raw -F qcow2 data.raw old.qcow2 &&
    fail "compare should see the 0x77 past the source's end"
qemu-io -f qcow2 -r -c "read -P 0 1M 1M" -c "read -P 0x77 4M 4M" old.qcow2 >/dev/null ||
    fail "-n into qcow2: the zero range or the tail is wrong"
run qemu-img check -q old.qcow2 || fail "old.qcow2: check"
truncate -s 4M zero.raw
run "$BLOCKPORT" convert -n --target-is-zero -O raw data.raw zero.raw
same data.raw zero.raw
qemu-img create -q -f raw small.raw 1M
rc=0
"$BLOCKPORT" convert -n -O raw data.raw small.raw 2>err || rc=$?
((rc == 1)) && grep -q "smaller than the source" err || fail "-n into a smaller image: $rc"
rc=0
"$BLOCKPORT" convert --target-is-zero -O raw data.raw y.raw 2>err || rc=$?
((rc == 1)) && grep -q "needs -n" err || fail "--target-is-zero without -n: $rc"
rc=0
"$BLOCKPORT" convert -n -o cluster_size=4k -O qcow2 data.raw old.qcow2 2>err || rc=$?
((rc == 1)) && grep -q "no effect with -n" err || fail "-o with -n: $rc"
ok "-n writes zeroes over old data; --target-is-zero; refusals"

check "-S: sparse granularity"
# Sixteen 4 KiB blocks of data, one per 64 KiB, in an 8 MiB file.
truncate -s 8M dots.raw
for i in $(seq 0 15); do
    qemu-io -f raw -c "write -P 0x5$((i % 10)) $((i * 65536 + 8192)) 4k" dots.raw >/dev/null
done
run "$BLOCKPORT" convert -S 0 -O raw dots.raw s0.raw
same dots.raw s0.raw
(($(stat -c %b s0.raw) * 512 >= 8 << 20)) || fail "-S 0: $(stat -c %b s0.raw) blocks"
run "$BLOCKPORT" convert -S 4k -O raw dots.raw s4k.raw
same dots.raw s4k.raw
run "$BLOCKPORT" convert -S 64k -O raw dots.raw s64k.raw
same dots.raw s64k.raw
a4=$(($(stat -c %b s4k.raw) * 512))
a64=$(($(stat -c %b s64k.raw) * 512))
((a4 <= 16 * 4096 + 65536)) || fail "-S 4k allocated $a4 bytes for 64 KiB of data"
((a64 >= 16 * 65536)) || fail "-S 64k allocated only $a64 bytes: grains not whole"
run qemu-img convert -S 4k -O raw dots.raw q4k.raw
aq=$(($(stat -c %b q4k.raw) * 512))
((a4 <= aq + 65536)) || fail "-S 4k: $a4 bytes allocated, qemu-img $aq"
run "$BLOCKPORT" convert -S 0 -O qcow2 dots.raw s0.qcow2
same dots.raw s0.qcow2 qcow2
[[ $(info s0.qcow2 'j["actual-size"] >= 8 << 20') == True ]] || fail "-S 0 qcow2 not allocated"
ok "-S 0 allocates everything; -S 4k leaves $a4 bytes allocated (qemu-img $aq), -S 64k $a64"

check "-m, -W, and a size that is not whole sectors"
run "$BLOCKPORT" convert -m 1 -W -O qcow2 data.raw m1.qcow2
same data.raw m1.qcow2 qcow2
head -c 1000 /dev/urandom >odd.raw
run "$BLOCKPORT" convert -O qcow2 odd.raw odd.qcow2
run qemu-img convert -O qcow2 odd.raw q-odd.qcow2
[[ $(info odd.qcow2 'j["virtual-size"]') == "$(info q-odd.qcow2 'j["virtual-size"]')" ]] ||
    fail "1000-byte raw: $(info odd.qcow2 'j["virtual-size"]') bytes, qemu-img $(info q-odd.qcow2 'j["virtual-size"]')"
run qemu-img compare -q odd.qcow2 q-odd.qcow2 || fail "odd.qcow2 differs from qemu-img's"
ok "-m 1 -W; 1000 bytes become $(info odd.qcow2 'j["virtual-size"]'), as with qemu-img"

check "several sources, concatenated, as qemu-img convert concatenates them"
run qemu-img create -q -f qcow2 c1.qcow2 1M
run qemu-io -c "write -P 1 0 1M" c1.qcow2 >/dev/null
head -c 1000000 /dev/urandom >c2.raw # not whole sectors
run qemu-img create -q -f qcow2 c3.qcow2 3M
run qemu-io -c "write -P 3 2M 64k" c3.qcow2 >/dev/null
for fmt in raw qcow2; do
    run qemu-img convert c1.qcow2 c2.raw c3.qcow2 -O $fmt q-cat.$fmt
    run "$BLOCKPORT" convert c1.qcow2 c2.raw c3.qcow2 -O $fmt cat.$fmt
    run qemu-img compare -q q-cat.$fmt cat.$fmt || fail "$fmt: not qemu-img's"
    [[ $(info cat.$fmt 'j["virtual-size"]') == "$(info q-cat.$fmt 'j["virtual-size"]')" ]] ||
        fail "$fmt: size $(info cat.$fmt 'j["virtual-size"]')"
done
run qemu-img convert -f raw c1.qcow2 c2.raw -O raw q-cat-f.raw
run "$BLOCKPORT" convert -f raw c1.qcow2 c2.raw -O raw cat-f.raw
cmp q-cat-f.raw cat-f.raw || fail "-f raw applies to every source"
for args in "-B c1.qcow2" "--bitmaps"; do
    # shellcheck disable=SC2086 # $args is words
    want=$(qemu-img convert $args c1.qcow2 c2.raw -O qcow2 x.qcow2 2>&1; echo "exit $?")
    # shellcheck disable=SC2086
    got=$("$BLOCKPORT" convert $args c1.qcow2 c2.raw -O qcow2 x.qcow2 2>&1; echo "exit $?")
    [[ $want == "${got//blockport convert: /qemu-img: }" ]] ||
        fail "$args with two sources: qemu-img: $want / blockport: $got"
done
ok "raw and qcow2 outputs, -f for all, -B and --bitmaps refused"

check "-r RATE: the copy is held to the rate"
head -c 2M /dev/urandom >r.raw
start=$(date +%s%N)
run "$BLOCKPORT" convert -r 2M -O raw r.raw r-out.raw
ms=$((($(date +%s%N) - start) / 1000000))
cmp r.raw r-out.raw || fail "-r: the copy differs"
((ms >= 800)) || fail "-r 2M copied 2 MiB in $ms ms" # the last 256k at 875 ms
run "$BLOCKPORT" convert -r 0 -O raw r.raw r0.raw
for rate in abc -5; do
    want=$(qemu-img convert -r $rate -O raw r.raw x.raw 2>&1; echo "exit $?")
    got=$("$BLOCKPORT" convert -r $rate -O raw r.raw x.raw 2>&1; echo "exit $?")
    [[ $want == "${got//blockport convert: /qemu-img: }" ]] ||
        fail "-r $rate: qemu-img: $want / blockport: $got"
done
ok "2 MiB at 2M/s took $ms ms; -r 0 is no limit; bad rates refused alike"

check "--salvage: unreadable ranges become zeroes, with qemu-img's warnings"
if ! nbdkit --dump-plugin pattern >/dev/null 2>&1 ||
    ! nbdkit --filter=ddrescue null --dump-plugin >/dev/null 2>&1; then
    skip_case "nbdkit's pattern plugin or ddrescue filter is missing"
else
    # Bad: 64 KiB at 1 MiB and 4 KiB at 1.125 MiB (a ddrescue map).
    printf '%s\n' "# Mapfile" "0x00000000 +" "0x00000000 0x00100000 +" \
        "0x00100000 0x00010000 -" "0x00110000 0x00010000 +" \
        "0x00120000 0x00001000 -" "0x00121000 0x002DF000 +" >bad.map
    nbdkit -f -U "$T/bad.sock" --filter=ddrescue pattern 4M \
        ddrescue-mapfile="$T/bad.map" 2>nbdkit.log &
    track_pid $!
    wait_until 10 test -S "$T/bad.sock" || fail "nbdkit did not start"
    src="nbd+unix:///?socket=$T/bad.sock"
    for q in "" -q; do
        rcq=0 rcb=0
        qemu-img convert $q --salvage -f raw "$src" -O raw q-salv.raw 2>q.err || rcq=$?
        "$BLOCKPORT" convert $q --salvage -f raw "$src" -O raw salv.raw 2>b.err || rcb=$?
        ((rcq == 0 && rcb == 0)) || fail "--salvage $q: exit $rcq / $rcb"
        cmp q-salv.raw salv.raw || fail "--salvage $q: not qemu-img's copy"
        diff q.err <(sed 's/^blockport convert: /qemu-img: /' b.err) >/dev/null ||
            fail "--salvage $q: warnings: $(diff q.err <(sed 's/^blockport convert: /qemu-img: /' b.err) | head -5)"
    done
    [[ $(grep -c "warning: error while reading offset" q.err) == 0 ]] || fail "-q"
    run "$BLOCKPORT" convert -q --salvage -f raw "$src" c1.qcow2 -O qcow2 salv.qcow2
    run qemu-img convert -q --salvage -f raw "$src" c1.qcow2 -O qcow2 q-salv.qcow2
    run qemu-img compare -q q-salv.qcow2 salv.qcow2 || fail "--salvage, two sources"
    rc=0
    "$BLOCKPORT" convert -f raw "$src" -O raw x.raw 2>err || rc=$?
    ((rc == 1)) && grep -q "Input/output error" err || fail "without --salvage: exit $rc"
    ok "the same copy and warnings as qemu-img (exit 0), -q silent; without it, exit 1"
fi
