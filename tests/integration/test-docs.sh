#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The man pages and the bash completion agree with the program: a page
# for every command `blockport --help` lists (gen-man.sh finds them in the
# summary lines; help2man fills each page from the command's own --help,
# so the options need no check), and the completion offers the commands
# and a command's options.
source "$(dirname "$0")/lib.sh"
require help2man bash
ROOT=$(readlink -f "$(dirname "$0")/../..")

check "a man page per command"
"$ROOT/contrib/gen-man.sh" "$BLOCKPORT" "$T/man" || fail "gen-man.sh"
cmds=$("$BLOCKPORT" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')
[ -n "$cmds" ] || fail "no commands in blockport --help"
[ -s "$T/man/blockport.1" ] || fail "no blockport.1"
for c in $cmds; do
  page=$T/man/blockport-$c.1
  [ -s "$page" ] || fail "no page for $c"
  grep -q "^\.TH BLOCKPORT-$(tr a-z A-Z <<<"$c") " "$page" || fail "$c: title"
done
ok "$(wc -w <<<"$cmds") command pages"

check "bash completion"
out=$(PATH="$(dirname "$BLOCKPORT"):$PATH" bash -c '
  source "$1"
  COMP_WORDS=(blockport se); COMP_CWORD=1; _blockport; echo "${COMPREPLY[*]}"
  COMP_WORDS=(blockport serve --tls-); COMP_CWORD=2; _blockport; echo "${COMPREPLY[*]}"
  COMP_WORDS=(blockport serve --tls ""); COMP_CWORD=3; _blockport; echo "${COMPREPLY[*]}"
' _ "$ROOT/contrib/bash-completion/blockport")
grep -qx "serve" <<<"$(sed -n 1p <<<"$out")" || fail "commands: $out"
sed -n 2p <<<"$out" | grep -q -- "--tls-certs" || fail "options: $out"
[ "$(sed -n 3p <<<"$out")" = "off on require" ] || fail "--tls values: $out"
ok "commands, options and values"
