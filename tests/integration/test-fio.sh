#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# fio's nbd engine against blockport: 4 jobs (= 4 connections), iodepth 32,
# randrw with crc32c verification; also a verify-only pass that must catch a
# deliberately corrupted block (so we know verification really runs).
source "$(dirname "$0")/lib.sh"
require fio
require_py_nbd
fio --enghelp=nbd >/dev/null 2>&1 || skip "fio has no nbd engine"

SIZE=$((64 * 1024 * 1024))
truncate -s $SIZE "$T/disk.img"
# Few workers: the 4 x 32 in-flight requests must queue, not deadlock.
start_server --workers 2 "$T/disk.img" "mem=memory:$SIZE"

# run_fio NAME JOBFILE [noverify]: run fio, fail on non-zero exit or any job
# error; unless "noverify", require that verification reads happened.
run_fio() {
    local name=$1 job=$2 mode=${3:-verify} rc=0
    echo "+ fio $job" >&2
    sed 's/^/    /' "$job"
    (cd "$T" && timeout --kill-after=5 120 fio --aux-path="$T" --output-format=json \
        --output="$T/$name.json" "$job") >"$T/$name.out" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
        cat "$T/$name.out" >&2
        grep -iE 'verify|error|bad' "$T/$name.json" 2>/dev/null | head -20 >&2 || true
        fail "fio $name exited with status $rc"
    fi
    "$PY" - "$T/$name.json" "$mode" <<'EOF' || fail "fio $name reported errors"
import json, sys
d = json.load(open(sys.argv[1]))
jobs = d["jobs"]
tot_r = tot_w = 0
for j in jobs:
    if j.get("error"):
        raise SystemExit("job %s: error %r" % (j["jobname"], j["error"]))
    tot_r += j["read"]["io_bytes"]
    tot_w += j["write"]["io_bytes"]
    # do_verify re-reads every block the job wrote, so a job must read at
    # least as much as it wrote.
    if sys.argv[2] == "verify" and j["write"]["io_bytes"] and j["read"]["io_bytes"] < j["write"]["io_bytes"]:
        raise SystemExit("job %s read %d < wrote %d: verification did not run"
                         % (j["jobname"], j["read"]["io_bytes"], j["write"]["io_bytes"]))
print("  %d job(s): read %d MiB, wrote %d MiB, no errors" % (len(jobs), tot_r >> 20, tot_w >> 20))
if tot_w == 0 and sys.argv[2] != "verifyonly":
    raise SystemExit("nothing was written")
EOF
}

for uri in "$URI" "$(export_uri mem)"; do
    for bs in bs=4k bsrange=4k-1M; do
        check "fio randrw $bs verify=crc32c, 4 jobs x iodepth 32 on $uri"
        cat >"$T/randrw.fio" <<EOF
[global]
ioengine=nbd
uri=$uri
rw=randrw
rwmixread=50
$bs
iodepth=32
numjobs=4
size=16M
offset_increment=16M
verify=crc32c
do_verify=1
verify_fatal=1
verify_dump=0
verify_state_save=0
runtime=40

[randrw]
EOF
        run_fio randrw "$T/randrw.fio"
        ok "fio randrw + verify passed"
    done
done

check "fio write then verify_only on a separate run (sequential 1 MiB blocks)"
cat >"$T/seqw.fio" <<EOF
[global]
ioengine=nbd
uri=$URI
bs=1M
iodepth=16
size=32M
verify=crc32c
verify_fatal=1
verify_state_save=0
randrepeat=1
[seq]
rw=write
do_verify=0
EOF
run_fio seqw "$T/seqw.fio" noverify
sed -e 's/^do_verify=0/verify_only=1/' "$T/seqw.fio" >"$T/seqv.fio"
run_fio seqv "$T/seqv.fio" verifyonly
ok "verify_only pass succeeded on untouched data"

check "negative control: verify_only must fail after corrupting one block"
run "$PY" -c '
import sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\xa5" * 4096, 5 * 1048576 + 8192)
h.flush(); h.shutdown()
' "$URI" || fail "could not corrupt a block"
rc=0
(cd "$T" && timeout --kill-after=5 120 fio --aux-path="$T" "$T/seqv.fio") >"$T/neg.out" 2>&1 || rc=$?
grep -iE 'verify|bad' "$T/neg.out" | head -5 || true
[[ $rc -ne 0 ]] || fail "fio verify_only passed on corrupted data (verification not effective)"
ok "corruption detected (fio exit $rc)"

stop_server
echo "PASS"
