#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The backup recipe (contrib/backup/blockport-backup, docs/BACKUP.md) end
# to end on a small image while two writers keep writing: a full backup,
# two incremental ones, then one more with the writers stopped; each
# restore is the image at its checkpoint (backupcheck.py's model), the
# last the live image; the backup files pass qemu-img check.  After a
# restart an incremental backup works on qcow2 (its checkpoint bitmaps are
# in the image) and is refused on raw (they were in the server's memory).
source "$(dirname "$0")/lib.sh"
require qemu-img
"$PY" -c 'import nbd' 2>/dev/null || skip "python3 libnbd (nbd module) missing"
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$T"
RECIPE=$(readlink -f "$HERE/../../contrib/backup/blockport-backup")

"$PY" - pattern.raw <<'PY'
import struct, sys
with open(sys.argv[1], "wb") as f:
    for b in range(8192):  # 32 MiB
        f.write(struct.pack("<QQ", b, 0) * 256)
PY
qemu-img convert -f raw -O qcow2 pattern.raw disk.qcow2
rm -f pattern.raw
mkdir fleece backups

check "full and incremental backups under writers restore each checkpoint"
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
BLOCKPORT=$BLOCKPORT timeout 600 "$PY" "$HERE/backupcheck.py" "$SOCK" \
    "$T/ctl.sock" "$RECIPE" "$T/backups" || fail "backupcheck.py failed"
for f in backups/*.qcow2; do
    qemu-img check -q "$f" || fail "qemu-img check $f"
done
ok "4 backups, each restore its checkpoint's image"

check "after a restart of a qcow2 server an incremental backup works"
stop_server
qemu-img info disk.qcow2 | grep -q "name: b3" ||
    fail "the image keeps no bitmap b3: $(qemu-img info disk.qcow2)"
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
qemu-io -f raw -c 'write -P 0x77 5M 100k' "$URI" >/dev/null ||
    fail "write through the restarted server"
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" inc --control "$T/ctl.sock" --socket "$SOCK" \
    backups b4 >/dev/null || fail "an incremental backup after a restart"
stop_server
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" restore backups b4 b4.raw >/dev/null ||
    fail "restore b4"
qemu-img compare -q -f raw -F qcow2 b4.raw disk.qcow2 ||
    fail "the incremental backup after a restart is not the image"
qemu-img check -q backups/b4.qcow2 || fail "qemu-img check backups/b4.qcow2"
ok "b4 incremental on b3 across the restart, restored equal to the image"

check "after a restart of a raw server the next backup must be a full one"
qemu-img convert -f qcow2 -O raw disk.qcow2 disk.raw
mkdir rawbackups
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f raw disk.raw
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" full --control "$T/ctl.sock" --socket "$SOCK" \
    rawbackups r0 >/dev/null || fail "a full backup of a raw image"
stop_server
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f raw disk.raw
rc=0
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" inc --control "$T/ctl.sock" --socket "$SOCK" \
    rawbackups r1 >out.txt 2>err.txt || rc=$?
[[ $rc -ne 0 ]] && grep -q "full backup" err.txt ||
    fail "an incremental backup after a restart: $rc $(cat out.txt err.txt)"
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" full --control "$T/ctl.sock" --socket "$SOCK" \
    rawbackups r2 >/dev/null || fail "a full backup after a restart"
stop_server
ok "refused with a message naming a full backup; a full one works"
