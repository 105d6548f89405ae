#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# What every subcommand does alike, as users of qemu-img and nbdkit
# expect: --version answers (exit 0); an unknown option, a missing
# argument or a bad value is one or two lines on stderr, prefixed
# "blockport COMMAND:", naming the option, and pointing at --help instead
# of printing the whole help; --help prints it on stdout and exits 0.
source "$(dirname "$0")/lib.sh"
cd "$T"

mapfile -t COMMANDS < <("$BLOCKPORT" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')
((${#COMMANDS[@]} >= 9)) || fail "blockport --help lists ${#COMMANDS[@]} commands"
version=$("$BLOCKPORT" --version)

for c in "${COMMANDS[@]}"; do
    out=$("$BLOCKPORT" "$c" --version) || fail "$c --version: exit $?"
    [[ $out == "$version" ]] || fail "$c --version printed '$out'"
    part=$(command_part "$c")
    if [[ -n $part ]] && ! has_feature "$part"; then
        rc=0
        "$BLOCKPORT" "$c" --help >out.txt 2>err.txt || rc=$?
        [[ $rc -eq 1 && ! -s out.txt ]] && grep -q "^blockport $c: built without " err.txt ||
            { cat err.txt; fail "$c, built without $part: exit $rc"; }
        ok "$c: --version; built without $part, says so"
        continue
    fi
    "$BLOCKPORT" "$c" --help >help.txt || fail "$c --help: exit $?"
    grep -q "^Usage: blockport $c" help.txt || fail "$c --help: no usage"
    rc=0
    "$BLOCKPORT" "$c" --no-such-option x y >out.txt 2>err.txt || rc=$?
    ((rc != 0)) || fail "$c --no-such-option: exit 0"
    [[ ! -s out.txt ]] || fail "$c --no-such-option: output on stdout"
    grep -q "^blockport $c: .*no-such-option" err.txt ||
        { cat err.txt; fail "$c: the message does not name the option"; }
    grep -qx "Try 'blockport $c --help'." err.txt ||
        { cat err.txt; fail "$c: no pointer at --help"; }
    (($(wc -l <err.txt) <= 2)) || { cat err.txt; fail "$c: the whole help on a usage error"; }
    ok "$c: --version, --help, an unknown option"
done

# bad VALUE-NAMING-TEXT CMD ARGS...: a refused value, named with its option.
bad() {
    local want=$1 rc=0
    shift
    "$BLOCKPORT" "$@" >out.txt 2>err.txt || rc=$?
    ((rc != 0)) && grep -q -- "$want" err.txt && grep -q "^blockport $1: " err.txt ||
        { cat err.txt; fail "'$*': exit $rc, expected a message with '$want'"; }
}
bad "--port 99999" serve --port 99999 null:1M
bad "--max-connections 0" serve -c 0 null:1M
bad "--tls maybe" serve --tls maybe null:1M
if has_feature vhost; then bad "--queues 0" vhost --socket s --queues 0 null:1M; fi
if has_feature fuse; then bad "--threads 0" mount -t 0 null:1M mnt; fi
bad "--cache fast" serve --cache fast null:1M
bad "--aio native" serve --aio native null:1M
bad "invalid size '1MiB'" create x.img 1MiB
bad "--output must be human or json" map --output xml x.img
ok "bad values are named with their option"
rc=0
"$BLOCKPORT" frob 2>err.txt || rc=$?
((rc == 1)) && grep -q "^blockport: unknown command 'frob'" err.txt &&
    grep -qx "Try 'blockport --help'." err.txt || { cat err.txt; fail "an unknown command: exit $rc"; }
ok "an unknown command: named, and a pointer at --help"
