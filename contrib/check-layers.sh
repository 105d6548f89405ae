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
#
# Two more rules the compiler cannot see: core/source.h (what a source
# implements) is for sources only, never included by server/, frontend/
# or cli/; and the core and the ways out name no format: core/, server/
# and frontend/ hold no string literal that is a format's name (the
# format table in formats/ answers every question about formats).
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
# Only sources include the implementers' header.
while IFS= read -r hit; do
  rest=${hit#*:}
  echo "${hit%%:*}:${rest%%:*}: includes core/source.h, which is for sources (formats/, core/); use core/blockdev.h or core/open.h" >&2
  bad=1
done < <(grep -rn --include='*.c' --include='*.h' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*"core/source\.h"' \
  server frontend cli 2>/dev/null || true)

# Format names as string literals, outside comments.  Allowed, with why:
format_names='raw|qcow2|nbd|rbd|null|memory|nbdkit'
allow=(
  # "rbd" names the optional part RBD as the CMake option and --version
  # do, not the format.
  'core/features.c:"rbd"'
  # JSON's literal null, not the null format.
  'core/control-json.c:"null"'
)
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  code=$(sed -e 's@/\*.*\*/@@g' -e 's@//.*@@' <<<"${rest#*:}")
  case $code in
  [[:space:]]\** | \** | /\**) continue ;; # inside a comment block
  esac
  for lit in $(grep -oE "\"($format_names)\"" <<<"$code"); do
    case " ${allow[*]} " in
    *" $file:$lit "*) continue ;;
    esac
    echo "$file:$line: names the format $lit: only formats/ knows formats (ask the format table in core/open.h)" >&2
    bad=1
  done
done < <(grep -rnE --include='*.c' --include='*.h' "\"($format_names)\"" \
  core server frontend 2>/dev/null || true)
exit $bad
