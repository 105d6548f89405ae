#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# qemu-io against blockport: random pattern writes (sync, FUA, aio), then
# pattern-verified reads from a fresh connection; write -z (with and without
# unmap) and discard; a write larger than the 32 MiB max payload.  Run on a
# raw file export and on a memory: export; the raw file is also verified
# directly after the server exits.
source "$(dirname "$0")/lib.sh"
require qemu-io truncate
require_py_nbd

MIB=128
SIZE=$((MIB * 1024 * 1024))
SEED=${QEMU_IO_SEED:-$RANDOM}
echo "random seed: $SEED (set QEMU_IO_SEED to reproduce)"

# Generate the command files.  The model tracks the expected content of
# every byte as intervals (value 0..255, or None = unspecified after discard).
"$PY" - "$SEED" "$SIZE" "$T" <<'EOF'
import random, sys
seed, size, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rnd = random.Random(seed)
K = 1024
M = 1024 * K

# Model: sorted list of [start, end, val] covering [0, size).
model = [[0, size, 0]]

def apply(s, e, v):
    global model
    out = []
    for a, b, x in model:
        if b <= s or a >= e:
            out.append([a, b, x])
            continue
        if a < s:
            out.append([a, s, x])
        if b > e:
            out.append([e, b, x])
    out.append([s, e, v])
    out.sort()
    merged = []
    for seg in out:
        if merged and merged[-1][1] == seg[0] and merged[-1][2] == seg[2]:
            merged[-1][1] = seg[1]
        else:
            merged.append(seg)
    model = merged

def verify_cmds():
    cmds = []
    for a, b, x in model:
        if x is None:
            continue
        # Split long reads so each stays well below the 32 MiB payload limit
        # and failures are localised.
        pos = a
        while pos < b:
            n = min(b - pos, 8 * M)
            cmds.append("read -q -P 0x%02x %d %d" % (x, pos, n))
            pos += n
    return cmds

SLOT = 256 * K
nslots = size // SLOT

def rand_range(slot):
    base = slot * SLOT
    kind = rnd.random()
    if kind < 0.4:          # sector aligned
        off = rnd.randrange(0, SLOT // 2, 512)
        ln = rnd.randrange(512, SLOT // 2, 512)
    elif kind < 0.7:        # 4k aligned
        off = rnd.randrange(0, SLOT // 2, 4096)
        ln = rnd.randrange(4096, SLOT // 2, 4096)
    else:                   # byte granular
        off = rnd.randrange(0, SLOT // 2)
        ln = rnd.randrange(1, SLOT // 2)
    return base + off, ln

def pattern():
    return rnd.randrange(1, 256)

# Phase 1: writes.  Synchronous writes may overlap (they are ordered);
# aio writes go to slots nobody else touches in this phase.
slots = list(range(nslots))
rnd.shuffle(slots)
sync_slots = slots[:90]
aio_slots = slots[90:130]
w1 = []
for i in range(160):
    slot = rnd.choice(sync_slots)
    off, ln = rand_range(slot)
    p = pattern()
    flag = "-f " if rnd.random() < 0.3 else ""
    w1.append("write -q %s-P 0x%02x %d %d" % (flag, p, off, ln))
    apply(off, off + ln, p)
for slot in aio_slots:
    off, ln = rand_range(slot)
    p = pattern()
    w1.append("aio_write -q -P 0x%02x %d %d" % (p, off, ln))
    apply(off, off + ln, p)
w1.append("aio_flush")
w1.append("flush")
# Whole first and last sectors / bytes of the device.
w1.append("write -q -P 0x11 0 512")
apply(0, 512, 0x11)
w1.append("write -q -P 0x22 %d 4096" % (size - 4096))
apply(size - 4096, size, 0x22)
w1.append("write -q -P 0x33 %d 1" % (size - 1))
apply(size - 1, size, 0x33)
v1 = verify_cmds()

# Phase 2: write -z, write -z -u, discard, and a 40 MiB write.
w2 = []
touched = sync_slots + aio_slots
for i in range(30):
    slot = rnd.choice(touched)
    off, ln = rand_range(slot)
    flags = rnd.choice(["", "-u ", "-f ", "-u -f "])
    w2.append("write -q -z %s%d %d" % (flags, off, ln))
    apply(off, off + ln, 0)
for i in range(20):
    slot = rnd.choice(touched)
    off, ln = rand_range(slot)
    w2.append("discard -q %d %d" % (off, ln))
    apply(off, off + ln, None)
# A single request bigger than the 32 MiB maximum payload: the client has
# to split it, the server must accept the pieces.
big_off = 3 * M + 512
w2.append("write -q -P 0x5c %d %d" % (big_off, 40 * M))
apply(big_off, big_off + 40 * M, 0x5c)
# Zero a range inside it, unaligned at both ends.
w2.append("write -q -z %d %d" % (big_off + 5 * M + 3, 2 * M + 5))
apply(big_off + 5 * M + 3, big_off + 7 * M + 8, 0)
w2.append("flush")
v2 = verify_cmds()

for name, cmds in (("w1", w1), ("v1", v1), ("w2", w2), ("v2", v2)):
    with open("%s/%s.cmds" % (outdir, name), "w") as f:
        f.write("\n".join(cmds) + "\n")
print("phase1: %d writes, %d verify reads; phase2: %d ops, %d verify reads"
      % (len(w1), len(v1), len(w2), len(v2)))
EOF

# qemu_io_cmds TARGET CMDFILE [qemu-io options...]
qemu_io_cmds() {
    local target=$1 file=$2
    shift 2
    local -a args=()
    local line
    while IFS= read -r line; do
        [[ -n $line ]] && args+=(-c "$line")
    done <"$file"
    echo "+ qemu-io $* <$(wc -l <"$file") commands from $(basename "$file")> $target" >&2
    local rc=0
    timeout --kill-after=5 "$CMD_TIMEOUT" qemu-io "$@" "${args[@]}" "$target" \
        >"$T/qemu-io.out" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]] || grep -qiE 'fail|error|mismatch' "$T/qemu-io.out"; then
        head -n 40 "$T/qemu-io.out" >&2
        fail "qemu-io $(basename "$file") on $target: exit $rc (output above)"
    fi
}

truncate -s $SIZE "$T/disk.img"
start_server "$T/disk.img" "mem=memory:$SIZE"

for uri in "$URI" "$(export_uri mem)"; do
    check "qemu-io random pattern writes (sync, FUA, aio) on $uri"
    qemu_io_cmds "$uri" "$T/w1.cmds" -f raw
    ok "writes succeeded"
    check "pattern-verified reads from a new connection on $uri"
    qemu_io_cmds "$uri" "$T/v1.cmds" -f raw
    ok "all patterns and zero gaps verified"
    check "write -z (unmap/FUA variants), discard, 40 MiB write on $uri"
    qemu_io_cmds "$uri" "$T/w2.cmds" -f raw
    ok "zero/discard/large writes succeeded"
    check "verify after zero/discard on $uri (neighbours of discards intact)"
    qemu_io_cmds "$uri" "$T/v2.cmds" -f raw
    ok "verified"
done

check "qemu-io negative control: a wrong pattern is detected"
rc=0
timeout 60 qemu-io -f raw -c "read -q -P 0x11 0 512" -c "read -q -P 0x12 0 512" "$URI" \
    >"$T/neg.out" 2>&1 || rc=$?
cat "$T/neg.out"
grep -q "Pattern verification failed" "$T/neg.out" || fail "wrong pattern not reported"
[[ $rc -ne 0 ]] || fail "qemu-io exited 0 despite a pattern failure"
ok "mismatch reported"

stop_server

check "raw backing file holds the same data after server exit"
qemu_io_cmds "$T/disk.img" "$T/v2.cmds" -f raw
ok "backing file verified"

echo "PASS"
