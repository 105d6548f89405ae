#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# blockport commit, rebase and convert against qemu-img's on the same files: a
# 4 GiB qcow2 chain (a base with 2 GiB of random data, an overlay holding
# 512 MiB written by qemu-io, 16 MiB every 128 MiB over the whole disk),
# and a new backing file that differs from the base in 512 MiB.
#   commit          the overlay into the base, emptied afterwards
#   rebase          safe mode onto the new backing file (compares 4 GiB,
#                   copies what differs)
#   rebase -b ""    flatten: everything the base shows copied in
#   convert         the whole chain (4 GiB virtual, 2 GiB of data) into a
#                   new qcow2, with each tool's default cache mode (qemu-img
#                   never syncs its output, blockport syncs at the end),
#                   then both with -t writeback (both sync) and both with
#                   -t unsafe (neither does)
# Twin copies of the files: each round one tool works on set a, the other
# on set b, the order swapped every round, the sets restored between runs.
# Prints mean seconds per tool and the ratio qemu-img / blockport (higher
# is better for blockport).  Each blockport result is checked against
# qemu-img's with qemu-img compare.
# ONLY=REGEX runs the rows whose names match; VERBOSE=1 prints each run's
# time on stderr.
# usage: contrib/bench/commit-rebase-bench.sh [ROUNDS] [BLOCKPORT]
set -euo pipefail
ROUNDS=${1:-2}
BP=$(readlink -f "${2:-$(dirname "$0")/../../build/blockport}")
source "$(dirname "$0")/lib.sh"
bench_require qemu-img
bench_workdir commit-rebase-bench
cd "$W"

# scatter FILE COUNT MIB STRIDE: COUNT runs of MIB MiB of random data,
# one every STRIDE MiB.
scatter() {
  local i
  for ((i = 0; i < $2; i++)); do
    dd if=/dev/urandom of="$1" bs=1M seek=$((i * $4)) count="$3" conv=notrunc status=none
  done
}
truncate -s 4G in.raw
dd if=/dev/urandom of=in.raw bs=1M count=2048 conv=notrunc status=none
cp --sparse=always in.raw new.raw
scatter new.raw 8 64 512
mkdir t
qemu-img convert -O qcow2 in.raw t/base.qcow2
qemu-img convert -O qcow2 new.raw t/new.qcow2
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 t/top.qcow2
writes=()
for ((i = 0; i < 32; i++)); do writes+=(-c "write -P $((i + 1)) $((i * 128))M 16M"); done
qemu-io "${writes[@]}" t/top.qcow2 >/dev/null
rm -f in.raw new.raw

restore() { # SET FILE...: the set's files as made, no convert output left
  local f
  mkdir -p "$1"
  for f in "${@:2}"; do cp t/"$f" "$1/$f"; done
  # Removing the last round's 2 GiB output is not the next convert's work.
  rm -f "$1/out.qcow2"
}
restore a base.qcow2 top.qcow2 new.qcow2
restore b base.qcow2 top.qcow2 new.qcow2
sync

secs() { # each run starts with no dirty pages left by the one before
  local t0 t1
  sync
  t0=$(date +%s.%N)
  "$@" >/dev/null || { echo "failed in $PWD: $*" >&2; return 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}'
}

# row NAME CHECKED-FILE RESTORED-FILES -- ARGS...: ARGS run by each tool
# (in the set's directory) ROUNDS times.
row() {
  local name=$1 checked=$2 files=$3 r set_bp set_q tb=0 tq=0 t runs_bp= runs_q=
  shift 4
  [[ $name =~ ${ONLY:-.} ]] || return 0
  for ((r = 0; r < ROUNDS; r++)); do
    if ((r % 2 == 0)); then set_bp=a set_q=b; else set_bp=b set_q=a; fi
    # shellcheck disable=SC2086 # $files is words
    restore "$set_bp" $files && restore "$set_q" $files
    if ((r % 2 == 0)); then
      t=$(cd "$set_bp" && secs "$BP" "$@") || exit 1; tb=$(awk -v a="$tb" -v b="$t" 'BEGIN{print a + b}'); runs_bp+=" $t"
      t=$(cd "$set_q" && secs qemu-img "$@") || exit 1; tq=$(awk -v a="$tq" -v b="$t" 'BEGIN{print a + b}'); runs_q+=" $t"
    else
      t=$(cd "$set_q" && secs qemu-img "$@") || exit 1; tq=$(awk -v a="$tq" -v b="$t" 'BEGIN{print a + b}'); runs_q+=" $t"
      t=$(cd "$set_bp" && secs "$BP" "$@") || exit 1; tb=$(awk -v a="$tb" -v b="$t" 'BEGIN{print a + b}'); runs_bp+=" $t"
    fi
    qemu-img compare -q "$set_bp/$checked" "$set_q/$checked" ||
      { echo "$name: blockport's $checked differs from qemu-img's"; exit 1; }
  done
  [ -n "${VERBOSE:-}" ] && echo "  $name: blockport$runs_bp / qemu-img$runs_q" >&2
  printf '%-22s blockport %6.2f s | qemu-img %6.2f s | ratio %s\n' "$name" \
    "$(awk -v t="$tb" -v n="$ROUNDS" 'BEGIN{print t / n}')" \
    "$(awk -v t="$tq" -v n="$ROUNDS" 'BEGIN{print t / n}')" "$(ratio "$tq" "$tb")"
}

row "commit" base.qcow2 "base.qcow2 top.qcow2" -- commit top.qcow2
row "rebase (safe)" top.qcow2 "top.qcow2" -- rebase -b new.qcow2 -F qcow2 top.qcow2
row "rebase -b \"\" (flatten)" top.qcow2 "top.qcow2" -- rebase -b "" top.qcow2
row "convert (defaults)" out.qcow2 "top.qcow2" -- convert -O qcow2 top.qcow2 out.qcow2
row "convert -t writeback" out.qcow2 "top.qcow2" -- convert -t writeback -O qcow2 top.qcow2 out.qcow2
row "convert -t unsafe" out.qcow2 "top.qcow2" -- convert -t unsafe -O qcow2 top.qcow2 out.qcow2
