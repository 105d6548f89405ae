#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Fuzz every libFuzzer target for longer than CI does (default 10 minutes
# each).  A thin wrapper over tests/fuzz/run.sh, which builds the targets,
# replays the saved regression inputs and reports what it finds.
#
#   contrib/fuzz.sh [SECONDS-PER-TARGET]
set -euo pipefail
exec "$(dirname "$0")/../tests/fuzz/run.sh" "${1:-600}"
