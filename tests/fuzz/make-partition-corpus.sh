#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Write the seed corpus of fuzz-partition: small disks (64 KiB) partitioned
# by sfdisk: MBR primaries, MBR with logical partitions, GPT, and a GPT
# whose primary header is damaged (so the backup is read).
#
#   tests/fuzz/make-partition-corpus.sh   # (re)writes tests/fuzz/corpus/partition/
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=$here/corpus/partition
command -v sfdisk >/dev/null || { echo "sfdisk (package fdisk) is needed" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/*

disk() { # disk NAME SFDISK-SCRIPT
  local f=$out/$1
  truncate -s 64K "$f"
  printf '%b' "$2" | sfdisk -q --no-reread --no-tell-kernel "$f" >/dev/null
}

disk mbr-primaries 'label: dos\nstart=4, size=20, type=83, bootable\nstart=30, size=40, type=7\n'
disk mbr-logicals 'label: dos\nstart=4, size=20, type=83\nstart=30, size=90, type=5\nstart=32, size=10, type=83\nstart=50, size=20, type=82\nstart=80, size=30, type=83\n'
disk gpt 'label: gpt\nfirst-lba: 34\nstart=40, size=20\nstart=64, size=8, name=swap\n'
cp "$out/gpt" "$out/gpt-backup"
printf '\xff' | dd of="$out/gpt-backup" bs=1 seek=$((512 + 20)) conv=notrunc status=none
echo "wrote $(ls "$out" | wc -l) seeds to $out"
