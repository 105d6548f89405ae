#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The backup recipe (contrib/backup/blockport-backup, docs/BACKUP.md) end
# to end on a small image while two writers keep writing: a full backup,
# two incremental ones, then one more with the writers stopped; each
# restore is the image at its checkpoint (backupcheck.py's model), the
# last the live image; the backup files pass qemu-img check.
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

check "after a restart the next backup must be a full one"
stop_server
start_server --control "$T/ctl.sock" --fleece-dir "$T/fleece" -f qcow2 disk.qcow2
rc=0
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" inc --control "$T/ctl.sock" --socket "$SOCK" \
    backups b4 >out.txt 2>err.txt || rc=$?
[[ $rc -ne 0 ]] && grep -q "full backup" err.txt ||
    fail "an incremental backup after a restart: $rc $(cat out.txt err.txt)"
BLOCKPORT=$BLOCKPORT "$PY" "$RECIPE" full --control "$T/ctl.sock" --socket "$SOCK" \
    backups b5 >/dev/null || fail "a full backup after a restart"
stop_server
ok "refused with a message naming a full backup; a full one works"
