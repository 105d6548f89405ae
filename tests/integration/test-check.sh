#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport check against qemu-img check, on clean, leaky, corrupted and
# dirty images; --repair and the repair of dirty images at a writable open.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io

# bp_check IMAGE [ARGS]: prints output, sets RC.
bp_check() {
  RC=0
  "$BLOCKPORT" check "$@" >"$T/bp.txt" 2>&1 || RC=$?
}
qemu_rc() { local rc=0; qemu-img check "$1" >"$T/q.txt" 2>&1 || rc=$?; echo $rc; }

check "clean images: both checkers say 0"
for opts in cluster_size=512 cluster_size=4096,refcount_bits=1 \
            refcount_bits=64 compat=0.10 extended_l2=on; do
  rm -f "$T/c.qcow2"
  qemu-img create -f qcow2 -o "$opts" "$T/c.qcow2" 32M >/dev/null
  qemu-io -f qcow2 -c 'write -P 1 0 3M' -c 'write -z 8M 1M' \
    -c 'write -P 2 20M 64k' "$T/c.qcow2" >/dev/null
  bp_check "$T/c.qcow2"
  [ $RC -eq 0 ] || { cat "$T/bp.txt"; fail "$opts: blockport check exit $RC"; }
  ok "$opts"
done

check "snapshots: shared clusters are counted once per L1 table"
qemu-img create -f qcow2 "$T/s.qcow2" 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 1 0 2M' "$T/s.qcow2" >/dev/null
qemu-img snapshot -c s1 "$T/s.qcow2"
qemu-io -f qcow2 -c 'write -P 2 1M 2M' "$T/s.qcow2" >/dev/null
qemu-img snapshot -c s2 "$T/s.qcow2"
bp_check "$T/s.qcow2"
[ $RC -eq 0 ] || { cat "$T/bp.txt"; fail "snapshots: exit $RC"; }
ok "clean with two snapshots"

check "a leak (a snapshot that 1-bit refcounts cannot hold): exit 3; --repair leaks mends it"
qemu-img create -f qcow2 -o refcount_bits=1 "$T/l.qcow2" 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 1 0 2M' "$T/l.qcow2" >/dev/null
qemu-img snapshot -c s1 "$T/l.qcow2" 2>/dev/null || true
[ "$(qemu_rc "$T/l.qcow2")" = 3 ] || skip "qemu-img did not leave the expected leak"
bp_check "$T/l.qcow2"
[ $RC -eq 3 ] || { cat "$T/bp.txt"; fail "leak: exit $RC, want 3"; }
grep -q "Leaked cluster" "$T/bp.txt" || fail "leak not named"
bp_check --repair leaks "$T/l.qcow2"
[ $RC -eq 0 ] || { cat "$T/bp.txt"; fail "--repair leaks: exit $RC"; }
[ "$(qemu_rc "$T/l.qcow2")" = 0 ] || { cat "$T/q.txt"; fail "qemu-img check after repair"; }
qemu-io -f qcow2 -r -c 'read -P 1 0 2M' "$T/l.qcow2" >/dev/null || fail "data after repair"
ok "leak found and mended"

check "a corruption (refcount 0 under a used cluster): exit 2; leaks-only repair cannot rebuild (1, as qemu-img), --repair all mends"
qemu-img create -f qcow2 "$T/k.qcow2" 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 3 0 1M' "$T/k.qcow2" >/dev/null
# Zero the refcount of the first data cluster: its host offset from the L2.
"$PY" - "$T/k.qcow2" <<'PYEOF'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(104)
cb = struct.unpack(">I", h[20:24])[0]; cs = 1 << cb
l1 = struct.unpack(">Q", h[40:48])[0]; rt = struct.unpack(">Q", h[48:56])[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2); data = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(rt); blk = struct.unpack(">Q", f.read(8))[0]
f.seek(blk + (data // cs) * 2); f.write(b"\0\0")
PYEOF
[ "$(qemu_rc "$T/k.qcow2")" = 2 ] || { cat "$T/q.txt"; fail "patch did not corrupt"; }
bp_check "$T/k.qcow2"
[ $RC -eq 2 ] || { cat "$T/bp.txt"; fail "corruption: exit $RC, want 2"; }
bp_check --repair leaks "$T/k.qcow2"
[ $RC -eq 1 ] || { cat "$T/bp.txt"; fail "leaks-only repair: exit $RC, want 1"; }
grep -q "need to rebuild" "$T/bp.txt" || { cat "$T/bp.txt"; fail "no reason given"; }
bp_check --repair all "$T/k.qcow2"
[ $RC -eq 0 ] || { cat "$T/bp.txt"; fail "--repair all: exit $RC"; }
[ "$(qemu_rc "$T/k.qcow2")" = 0 ] || { cat "$T/q.txt"; fail "qemu-img check after repair"; }
qemu-io -f qcow2 -r -c 'read -P 3 0 1M' "$T/k.qcow2" >/dev/null || fail "data after repair"
ok "corruption found and mended"

check "a wrong COPIED flag: exit 2 from both checkers; --repair all sets it right"
qemu-img create -f qcow2 "$T/o.qcow2" 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 7 0 1M' "$T/o.qcow2" >/dev/null
"$PY" - "$T/o.qcow2" <<'PYEOF'
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(104)
l1 = struct.unpack(">Q", h[40:48])[0]
f.seek(l1); l2 = struct.unpack(">Q", f.read(8))[0] & 0x00fffffffffffe00
f.seek(l2); e = struct.unpack(">Q", f.read(8))[0]
f.seek(l2); f.write(struct.pack(">Q", e & ~(1 << 63)))
PYEOF
[ "$(qemu_rc "$T/o.qcow2")" = 2 ] || { cat "$T/q.txt"; fail "patch did not clear COPIED"; }
bp_check "$T/o.qcow2"
[ $RC -eq 2 ] || { cat "$T/bp.txt"; fail "COPIED: exit $RC, want 2"; }
grep -q OFLAG_COPIED "$T/bp.txt" || fail "COPIED error not named"
bp_check --repair all "$T/o.qcow2"
[ $RC -eq 0 ] || { cat "$T/bp.txt"; fail "--repair all: exit $RC"; }
[ "$(qemu_rc "$T/o.qcow2")" = 0 ] || { cat "$T/q.txt"; fail "qemu-img check after repair"; }
ok "COPIED found and set right"

check "a dirty image (lazy refcounts, killed): check reports it; serving it writable repairs it first"
qemu-img create -f qcow2 -o lazy_refcounts=on "$T/d.qcow2" 32M >/dev/null
qemu-io -f qcow2 -c 'write -P 4 0 3M' -c 'write -P 5 10M 64k' -c flush \
  -c 'sigraise 9' "$T/d.qcow2" >/dev/null 2>&1 || true
qemu-img info --output=json "$T/d.qcow2" | grep -q "\"dirty-flag\": true" || skip "qemu-io left no dirty image"
bp_check "$T/d.qcow2"
[ $RC -eq 2 ] || { cat "$T/bp.txt"; fail "dirty: exit $RC, want 2"; }
start_server "$T/d.qcow2"
run qemu-io -f raw -c 'write -P 6 20M 1M' "$URI" >/dev/null || fail "write to a dirty image"
stop_server
grep -q "repairing the refcounts" "$T/server.log" || fail "no repair logged"
[ "$(qemu_rc "$T/d.qcow2")" = 0 ] || { cat "$T/q.txt"; fail "qemu-img check after serving"; }
qemu-img info --output=json "$T/d.qcow2" >"$T/info.json" || fail "qemu-img info after serving"
grep -q '"dirty-flag": false' "$T/info.json" || { cat "$T/info.json"; fail "still dirty"; }
qemu-io -f qcow2 -r -c 'read -P 4 0 3M' -c 'read -P 5 10M 64k' \
  -c 'read -P 6 20M 1M' "$T/d.qcow2" >"$T/r.txt" || fail "data after repair"
qio_completed "$T/r.txt" 3 || { cat "$T/r.txt"; fail "data after repair differs"; }
ok "dirty image repaired at open, data intact"

check "no metadata to check (raw, an NBD URI): exit 63 as qemu-img; missing: 1"
truncate -s 1M "$T/raw.img"
bp_check "$T/raw.img"
[ $RC -eq "$(qemu_rc "$T/raw.img")" ] && [ $RC -eq 63 ] ||
  fail "raw image: exit $RC, want 63"
grep -q "raw image has no metadata" "$T/bp.txt" || { cat "$T/bp.txt"; fail "message"; }
start_server "$T/raw.img"
bp_check "$URI"
[ $RC -eq 63 ] || fail "NBD URI: exit $RC, want 63"
grep -q "NBD export" "$T/bp.txt" || { cat "$T/bp.txt"; fail "message"; }
stop_server
bp_check "$T/nonexistent.qcow2"
[ $RC -eq 1 ] || fail "missing file: exit $RC, want 1"
grep -q "No such file" "$T/bp.txt" || { cat "$T/bp.txt"; fail "message"; }
ok "refused, with reasons"

check "usage errors exit 1, as qemu-img's (2 and 3 mean corruptions and leaks only)"
qemu-img create -q -f qcow2 "$T/u.qcow2" 1M
for args in "" "--repair bogus $T/u.qcow2" "$T/u.qcow2 $T/u.qcow2" "--bogus $T/u.qcow2"; do
  # shellcheck disable=SC2086
  bp_check $args
  [ $RC -eq 1 ] || { cat "$T/bp.txt"; fail "'check $args': exit $RC, want 1"; }
  grep -q "Try 'blockport check --help'" "$T/bp.txt" || { cat "$T/bp.txt"; fail "'check $args': no pointer at --help"; }
done
bp_check --help
[ $RC -eq 0 ] || fail "--help: exit $RC"
ok "usage errors: 1"
