#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Build (only build: no tests) with -Werror in each COMPILER/BUILD_TYPE
# configuration, so that a warning any of them gives is caught here and not
# in someone else's build.  Each goes to build-matrix/COMPILER-TYPE.
#
#   contrib/build-matrix.sh [COMPILER/TYPE | minimal]...
#
# Default: gcc and clang, each Debug, Release and RelWithDebInfo.
# "minimal": gcc, RelWithDebInfo, every optional part off (RBD, FUSE,
# vhost, nbdkit plugins, TLS, io_uring; README "Building and testing").
set -euo pipefail
cd "$(dirname "$0")/.."
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
  configs=(gcc/Debug gcc/Release gcc/RelWithDebInfo
           clang/Debug clang/Release clang/RelWithDebInfo)
fi

failed=()
MINIMAL=(-DBLOCKPORT_RBD=OFF -DBLOCKPORT_FUSE=OFF -DBLOCKPORT_VHOST=OFF
         -DBLOCKPORT_PLUGINS=OFF -DBLOCKPORT_TLS=OFF -DBLOCKPORT_IO_URING=OFF)
for config in "${configs[@]}"; do
  options=()
  if [ "$config" = minimal ]; then
    cc=gcc type=RelWithDebInfo dir=build-matrix/minimal options=("${MINIMAL[@]}")
  else
    cc=${config%%/*}
    type=${config#*/}
    dir=build-matrix/$cc-${type,,}
  fi
  echo "== build ($cc, $type${options:+, every optional part off})"
  mkdir -p "$dir"
  # The log is shown only when the build fails: with -Werror a warning is a
  # failure.
  if ! { cmake -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE="$type" \
           -DBLOCKPORT_WERROR=ON "${options[@]}" && cmake --build "$dir" -j"$(nproc)"; } \
       >"$dir/build.log" 2>&1; then
    cat "$dir/build.log"
    failed+=("$config")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "build-matrix: failed: ${failed[*]}" >&2
  exit 1
fi
