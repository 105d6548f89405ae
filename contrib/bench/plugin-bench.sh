#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit plugins served by blockport against the same plugins under nbdkit,
# side by side in one run.
#
# Workload: fio's nbd engine over a Unix socket, 4k random read/write
# 75/25, iodepth 64, one connection (the origin workload of
# serve-bench.sh), on a 1 GiB RAM disk written once beforehand.
# Servers: blockport serve --plugin memory / nbdkit memory (both
# PARALLEL), and the same for the overlap test plugin with
# model=serialize_all_requests delay=0 when it is built.
#
# usage: contrib/bench/plugin-bench.sh [SECONDS-PER-RUN] [BUILD-DIR] [ROUNDS]
# Each round runs blockport then nbdkit on the memory plugin; the ratio
# printed last is the median of the rounds' ratios.  Numbers move ±20%
# between runs on a busy machine: compare within a run.
set -euo pipefail
RT=${1:-10}
BUILD=$(readlink -f "${2:-$(dirname "$0")/../../build}")
BP=$BUILD/blockport
ROUNDS=${3:-1}
source "$(dirname "$0")/lib.sh"
bench_require fio nbdkit nbdcopy
bench_workdir plugin-bench
SOCK=$W/s.sock
URI="nbd+unix:///?socket=$SOCK"
fio_job "$W/randrw.fio" ioengine=nbd "uri=$URI" group_reporting=1

declare -A IOPS
measure() { # name cmd...
  local name=$1
  shift
  start_server "$SOCK" "$@"
  # Fill the disk first, so reads find data as writes would leave it.
  head -c 1G /dev/zero | tr '\0' '\1' | nbdcopy - "$URI"
  fio_run "$W/randrw.fio"
  stop_server
  IOPS[$name]=$FIO_IOPS
  printf '%-32s %9s IOPS\n' "$name" "${IOPS[$name]}"
}

echo "blockport: $BP ($("$BP" --version)); nbdkit $(nbdkit --version | cut -d' ' -f2); $(nproc) CPUs; $RT s per run"
RATIOS=()
for r in $(seq "$ROUNDS"); do
  measure "blockport --plugin memory" "$BP" serve -u "$SOCK" --plugin memory size=1G
  measure "nbdkit memory" nbdkit -f -U "$SOCK" memory size=1G
  RATIOS+=("$(ratio "${IOPS[blockport --plugin memory]}" "${IOPS[nbdkit memory]}")")
done
OV=$BUILD/tests/nbdkit-overlap2-plugin.so
if [ -f "$OV" ]; then
  P=(model=serialize_all_requests delay=0 size=1G)
  measure "blockport --plugin overlap (s_a_r)" "$BP" serve -u "$SOCK" --plugin "$OV" "${P[@]}"
  measure "nbdkit overlap (s_a_r)" nbdkit -f -U "$SOCK" "$OV" "${P[@]}"
fi
echo "memory plugin, blockport / nbdkit per round: ${RATIOS[*]}"
printf '%s\n' "${RATIOS[@]}" | sort -n |
  awk '{ v[NR] = $1 } END { printf "median: %.2fx\n", v[int((NR + 1) / 2)] }'
