#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The layer rules, checked on the sources before anything compiles:
#
#   cli -> server, frontend, formats -> core     (plugins -> formats, core)
#
# The per-layer include directories (CMakeLists.txt) already make a
# "LAYER/file.h" include the wrong way fail to compile; this catches what
# they cannot see: relative includes ("../"), which the compiler resolves
# from the including file's folder whatever the include path says.
# Usage: contrib/check-layers.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# What each folder may include, besides its own files.
declare -A allowed=(
  [core]="core"
  [formats]="core formats"
  [server]="core server"
  [frontend]="core frontend"
  [cli]="core formats server frontend cli"
  [plugins]="core formats plugins"
)

bad=0
for layer in "${!allowed[@]}"; do
  [ -d "$layer" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"${rest#*:}")
    [ -n "$inc" ] || continue
    case $inc in
    ../* | */../*)
      echo "$file:$line: relative include \"$inc\": write it from the top of the tree (\"LAYER/file.h\")" >&2
      bad=1
      continue
      ;;
    */*) top=${inc%%/*} ;;
    *) continue ;; # a file of the same folder
    esac
    case " ${allowed[$layer]} " in
    *" $top "*) ;;
    *)
      echo "$file:$line: $layer/ may not include $inc (allowed: ${allowed[$layer]})" >&2
      bad=1
      ;;
    esac
  done < <(grep -rn --include='*.c' --include='*.h' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$layer" || true)
done
exit $bad
