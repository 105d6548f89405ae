#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The bash completion agrees with the program: it offers the commands
# and a command's options.  (The man pages: test-man.sh.)
source "$(dirname "$0")/lib.sh"
require bash
ROOT=$(readlink -f "$(dirname "$0")/../..")

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
