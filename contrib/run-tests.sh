#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The whole test suite: build normally and with ASan+UBSan, run every unit
# and integration test under both, then each fuzzer briefly.
# Usage: contrib/run-tests.sh      (FUZZ_SECONDS=N to change the fuzz time)
#
# Installs nothing: contrib/install-deps.sh --tests does (the README's
# test command runs both).  What is missing is named before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v dpkg-query >/dev/null; then
  if ! missing=$(contrib/install-deps.sh --tests --check); then
    echo "run-tests: missing packages: $missing" >&2
    echo "run-tests: install them with: contrib/install-deps.sh --tests" >&2
    exit 1
  fi
else
  echo "run-tests: no dpkg-query: not checking for the test tools (Debian 12 is what is tested)" >&2
fi
JOBS=$(nproc)

echo "== build (RelWithDebInfo)"
# Tests on, whatever an earlier configuration (the quick start's) said.
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLOCKPORT_WERROR=ON \
  -DBLOCKPORT_TESTS=ON >/dev/null
cmake --build build -j"$JOBS"
echo "== build (ASan + UBSan)"
cmake -B build-asan -DCMAKE_BUILD_TYPE=Debug -DBLOCKPORT_SANITIZE=ON \
  -DBLOCKPORT_WERROR=ON -DBLOCKPORT_TESTS=ON >/dev/null
cmake --build build-asan -j"$JOBS"

status=0
echo "== tests (RelWithDebInfo)"
(cd build && ctest --output-on-failure -j2) || status=1
echo "== tests (ASan + UBSan; the text checks ran above)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j2 -LE text) || status=1

if [ -x tests/fuzz/run.sh ]; then
  echo "== fuzz (${FUZZ_SECONDS:-20} s per target)"
  tests/fuzz/run.sh "${FUZZ_SECONDS:-20}" || status=1
fi
exit $status
