#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Build the libFuzzer targets and run each for SECONDS (default 60).
#
#   tests/fuzz/run.sh [SECONDS]
#
# Runs from the source tree's root; builds into build-fuzz/ (or $BUILD_DIR).
# Every saved regression input is replayed first.  Exits non-zero if a
# target crashes, leaks, trips a sanitizer or fails one of its checks; the
# crashing input is left in the work directory (see the output) and should
# be copied to tests/fuzz/regressions/<target>/.
set -euo pipefail

seconds=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD_DIR:-$root/build-fuzz}
targets=(fuzz-handshake fuzz-request fuzz-qcow2 fuzz-qcow2-info fuzz-qcow2-header fuzz-partition
         fuzz-virtq fuzz-config fuzz-probe fuzz-rbd-spec fuzz-metrics-http
         fuzz-control fuzz-vhost-user fuzz-nbd-uri)

cmake -S "$root" -B "$build" -DBLOCKPORT_FUZZ=ON -DBLOCKPORT_TESTS=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBLOCKPORT_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
for t in "${targets[@]}"; do
  name=${t#fuzz-}
  work=$build/fuzz-work/$name
  mkdir -p "$work/corpus" "$work/artifacts"
  exe=$build/tests/fuzz/$t

  # Saved crashes must stay fixed.
  regressions=$here/regressions/$name
  if compgen -G "$regressions/*" >/dev/null; then
    echo "== $t: replaying $(ls "$regressions" | wc -l) regression input(s)"
    if ! "$exe" -runs=1 "$regressions"/*; then
      echo "FAIL: $t regression input crashes"
      status=1
      continue
    fi
  fi

  echo "== $t: fuzzing for ${seconds}s"
  # New inputs go to the work corpus; the seeds stay untouched.
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
      "$work/corpus" "$here/corpus/$name" 2>"$work/log"; then
    tail -n 60 "$work/log"
    echo "FAIL: $t found a problem; inputs in $work/artifacts/"
    ls -l "$work/artifacts/"
    status=1
  else
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+[[:space:]]+DONE)' \
      "$work/log" || tail -n 3 "$work/log"
  fi
done
exit $status
