#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's commands work with the peers Debian 12 ships: each nbdkit
# plugin example of a ```sh block (`blockport serve --plugin ...`, and
# `nbdkit blockport ...` with the plugin built here) serves an export
# nbdinfo reads; contrib/quickstart.sh serves its demo on 127.0.0.1 only
# and says how to open it up.  (The man pages: test-man.sh; the bash
# completion: test-completion.sh.)
source "$(dirname "$0")/lib.sh"
require bash nbdinfo
ROOT=$(readlink -f "$(dirname "$0")/../..")

########################################################################
check "the README's nbdkit plugin examples"
# The lines of the README's sh blocks that serve a plugin.
mapfile -t examples < <(awk '/^```sh$/ { on = 1; next } /^```/ { on = 0 } on' "$ROOT/README.md" |
    grep -E '^(blockport serve --plugin|nbdkit blockport) ' | sort -u)
((${#examples[@]} >= 5)) || fail "only ${#examples[@]} plugin examples found in README.md"
plugindir=$(pkg-config --variable=plugindir nbdkit 2>/dev/null || true)
so=${BLOCKPORT_NBDKIT_PLUGIN:-$(dirname "$BLOCKPORT")/nbdkit-blockport-plugin.so}
# The files they name, in the directory they run in.
truncate -s 8M "$T/disk.img"
"$BLOCKPORT" create -q -f qcow2 "$T/disk.qcow2" 64M || fail "create disk.qcow2"
for ex in "${examples[@]}"; do
    # nbdinfo through --run, in both programs (nbdkit's $uri, our $uri).
    case $ex in
    blockport\ *)
        plugin=$(awk '{print $4}' <<<"$ex")
        if ! has_feature plugins; then
            skip_case "$ex: blockport was built without nbdkit plugins"
            continue
        fi
        if [[ ! -e $plugindir/nbdkit-$plugin-plugin.so ]]; then
            skip_case "$ex: nbdkit's $plugin plugin is not installed"
            continue
        fi
        cmd="\"\$BLOCKPORT\" ${ex#blockport } --run 'nbdinfo --size \"\$uri\"'"
        ;;
    nbdkit\ blockport\ *)
        require nbdkit
        [[ -f $so ]] || { skip_case "$ex: no $so"; continue; }
        cmd="nbdkit -U - \"\$so\" ${ex#nbdkit blockport } --run 'nbdinfo --size \"\$uri\"'"
        # A sanitizer build of the plugin needs its runtime loaded first.
        if [[ $(nm -D --undefined-only "$so") == *__asan_init* ]]; then
            cmd="env LD_PRELOAD=\"$(gcc -print-file-name=libasan.so)\" ASAN_OPTIONS=detect_leaks=0 $cmd"
        fi
        ;;
    esac
    out=$(cd "$T" && eval "timeout 60 $cmd" 2>"$T/err") ||
        fail_soft "README: '$ex' failed: $(cat "$T/err")"
    [[ $out =~ ^[1-9][0-9]*$ ]] || fail_soft "README: '$ex': nbdinfo said '$out'"
    ok "$ex: $out bytes"
done

########################################################################
check "contrib/quickstart.sh serves on 127.0.0.1 only, and says how to open it up"
qs=$ROOT/contrib/quickstart.sh
# The command it execs, continuation lines joined.
serve=$(sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "$qs" | grep '^exec .*blockport serve')
[[ -n $serve ]] || fail "quickstart.sh: no 'exec ... blockport serve' line"
[[ $serve =~ --bind\ 127\.0\.0\.1( |$) ]] || fail_soft "quickstart.sh: not bound to 127.0.0.1: $serve"
[[ $(grep -o -- '--bind' <<<"$serve" | wc -l) -eq 1 ]] || fail_soft "quickstart.sh: several --bind: $serve"
# The message: this machine only, and a command line without the --bind.
msg=$(sed -n '/^cat <<MSG$/,/^MSG$/p' "$qs")
prose=$(tr -s ' \n' '  ' <<<"$msg")
grep -q "this machine only" <<<"$prose" || fail_soft "quickstart.sh: does not say it serves this machine only"
grep -q "To let other machines in" <<<"$prose" || fail_soft "quickstart.sh: does not say how to open it up"
grep -E '^  build/blockport serve ' <<<"$msg" | grep -v -- '--bind 127' | grep -- '--allow' >/dev/null ||
    fail_soft "quickstart.sh: no example command serving other machines (with --allow)"
# A shared machine: the socket and the mount point are the user's own,
# and the message says how to unmount.
grep -q -- '--unix "$SOCK"' "$qs" && grep -q 'SOCK=.*$(id -u)' "$qs" ||
    fail_soft "quickstart.sh: the Unix socket is not per user"
grep -E '^  fusermount3 -u ' <<<"$msg" >/dev/null ||
    fail_soft "quickstart.sh: does not say how to unmount"
ok "$serve"

########################################################################
check "the README's serve table lists every option serve --help lists"
# Long options only: a short one always has its long twin in both.
help_opts=$("$BLOCKPORT" serve --help | grep -oE '^ +(-[a-zA-Z], )?--[a-z0-9-]+' |
    grep -oE -- '--[a-z0-9-]+' | grep -vx -- --help | sort -u)
table=$(awk '/^### `blockport serve/ { on = 1; next } /^### / { on = 0 } on' "$ROOT/README.md" |
    grep '^| `' | cut -d'|' -f2 | grep -oE -- '--[a-z0-9-]+' | sort -u)
[[ $(wc -l <<<"$help_opts") -ge 40 ]] || fail "serve --help: only $(wc -l <<<"$help_opts") options found"
missing=$(comm -23 <(echo "$help_opts") <(echo "$table"))
extra=$(comm -13 <(echo "$help_opts") <(echo "$table"))
[[ -z $missing ]] || fail_soft "README's serve table lacks:" $missing
[[ -z $extra ]] || fail_soft "README's serve table has options serve --help does not:" $extra
ok "$(wc -l <<<"$help_opts") options in both"

########################################################################
check "docs/CONFIG.md's error examples are what serve prints"
mapfile -t said < <(sed -n '/^## Errors$/,/^## /p' "$ROOT/docs/CONFIG.md" | grep '^blockport')
((${#said[@]} == 2)) || fail "CONFIG.md's Errors section: ${#said[@]} example lines, expected 2"
truncate -s 1M "$T/a.raw"
# Line 12: the misspelt key; lines 7 and 20: the export declared twice.
{ for i in $(seq 10); do echo "# line $i"; done; printf '[export os]\nreadonly = yes\n'; } >"$T/bad1.conf"
{ for i in $(seq 6); do echo "# line $i"; done
  printf '[export scratch]\npath = %s\n' "$T/a.raw"
  for i in $(seq 9 19); do echo "# line $i"; done
  printf '[export scratch]\npath = %s\n' "$T/a.raw"; } >"$T/bad2.conf"
for n in 1 2; do
    got=$(cd "$T" && "$BLOCKPORT" serve --check-config --config bad$n.conf 2>&1 >/dev/null |
        sed "s/bad$n\.conf/exports.conf/") || true # check-config exits 1
    [[ $got == "${said[n - 1]}" ]] || fail_soft "CONFIG.md says '${said[n - 1]}', serve says '$got'"
done
ok "both examples, word for word"
