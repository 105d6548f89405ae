#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The layer rules (docs/ARCHITECTURE.md) are enforced by the build:
#  - a file of a layer that includes a header of a layer it may not use
#    does not compile (per-layer include directories), while the headers it
#    may use do: tests/layers/probe.c is compiled here with each layer's
#    include directories as the build computed them, and one probe is built
#    through cmake end to end;
#  - contrib/check-layers.sh passes on the tree, and refuses a relative
#    include and a wrong-way include planted in a copy of it.
source "$(dirname "$0")/lib.sh"
require cmake
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${BLOCKPORT_TEST_TREE:-}
probes=$build/tests/layer-probes.txt
[ -n "$build" ] && [ -f "$probes" ] || skip "no build tree with layer probes"

cc=$(cat "$build/tests/layer-compiler.txt")
check "each layer compiles the headers it may use and refuses the others"
while read -r want layer header; do
  incs=()
  while read -r d; do [ -n "$d" ] && incs+=("-I$d"); done \
    <"$build/tests/layer-includes-$layer.txt"
  what="$layer/ including $header"
  if "$cc" -std=c17 -D_GNU_SOURCE "${incs[@]}" "-DPROBE_HEADER=\"$header\"" \
    -c -o "$T/probe.o" "$src/tests/layers/probe.c" >"$T/out" 2>&1; then
    [ "$want" = ok ] || fail "$what compiled: the include should be refused"
  else
    [ "$want" = refused ] || { cat "$T/out"; fail "$what did not compile"; }
    grep -q "$header: No such file or directory" "$T/out" ||
      { cat "$T/out"; fail "$what failed for another reason than the include"; }
  fi
  ok "$what: $want"
done <"$probes"

check "the build itself refuses a core file that includes a format header"
run cmake --build "$build" --target layer-probe-core-formats \
  >"$T/out" 2>&1 && fail "cmake built the probe"
grep -q 'formats/formats.h: No such file or directory' "$T/out" ||
  { cat "$T/out"; fail "the build failed for another reason"; }
ok "refused: $(grep -m1 'formats/formats.h' "$T/out")"

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
