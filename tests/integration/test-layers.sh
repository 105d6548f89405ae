#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The layer rules (docs/ARCHITECTURE.md) are enforced by the build:
#  - a file of a layer that includes a header of a layer it may not use
#    does not compile (per-layer include directories), while the headers it
#    may use do: each probe target of tests/CMakeLists.txt is built here;
#  - contrib/check-layers.sh passes on the tree, and refuses a relative
#    include and a wrong-way include planted in a copy of it.
source "$(dirname "$0")/lib.sh"
require cmake
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${BLOCKPORT_TEST_TREE:-}
probes=$build/tests/layer-probes.txt
[ -n "$build" ] && [ -f "$probes" ] || skip "no build tree with layer probes"

check "each layer compiles the headers it may use and refuses the others"
for p in $(cat "$probes"); do
  want=${p%%:*} target=${p#*:}
  if timeout 120 cmake --build "$build" --target "$target" >"$T/out" 2>&1; then
    [ "$want" = ok ] || fail "$target compiled: the include should be refused"
  else
    [ "$want" = refused ] || { cat "$T/out"; fail "$target did not compile"; }
    grep -q "No such file or directory" "$T/out" ||
      { cat "$T/out"; fail "$target failed for another reason than the include"; }
  fi
  ok "$target: $want"
done

check "check-layers.sh passes on the tree"
run "$src/contrib/check-layers.sh" "$src" || fail "the tree breaks a layer rule"

check "check-layers.sh refuses relative and wrong-way includes"
mkdir -p "$T/tree"
cp -r "$src/core" "$src/formats" "$T/tree/"
echo '#include "../formats/formats.h"' >>"$T/tree/core/io.c"
! "$src/contrib/check-layers.sh" "$T/tree" 2>"$T/err" || fail "relative include accepted"
grep -q 'core/io.c:.*relative include "../formats/formats.h"' "$T/err" ||
  fail "no message naming the relative include: $(cat "$T/err")"
ok "relative include refused"
cp "$src/core/io.c" "$T/tree/core/io.c"
echo '#include "formats/formats.h"' >>"$T/tree/core/blockdev.h"
! "$src/contrib/check-layers.sh" "$T/tree" 2>"$T/err" || fail "wrong-way include accepted"
grep -q 'core/blockdev.h:.*core/ may not include formats/formats.h' "$T/err" ||
  fail "no message naming the wrong-way include: $(cat "$T/err")"
ok "wrong-way include refused"
