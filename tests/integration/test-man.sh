#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The man pages (docs/man/, written by hand) against the program: a page
# for every command `blockport --help` lists (and for resize once the
# binary has it); each formats without a warning (groff -ww, man
# --warnings), has the sections a page needs (FILES for serve) and a SEE
# ALSO naming qemu-img, qemu-nbd, nbdkit and nbdinfo; every option a
# command's --help names is in its page's OPTIONS section, and so is every
# option the getopt table of the commands with one table (map, info, ...)
# accepts, so a page cannot fall behind an option added later.  The
# build's compressed copies (BUILD/man/*.1.gz) are those sources.
source "$(dirname "$0")/lib.sh"
require groff gzip
ROOT=$(readlink -f "$(dirname "$0")/../..")
MAN=$ROOT/docs/man

# opts_in_text: the options a text names, one a line: -X (one letter) and
# --long, each standing alone (not inside qemu-img, 0-86400 or QEMU's
# -object).
opts_in_text() {
    grep -oE '(^|[^A-Za-z0-9_-])--?[A-Za-z0-9][A-Za-z0-9-]*' |
        sed -E 's/^[^-]+//' | grep -E '^(-[A-Za-z0-9]|--[a-z0-9][a-z0-9-]+)$' |
        sort -u || true
}

# accepts CMD OPT: the command knows OPT (getopt says nothing of it when
# it comes first: the program then stops at --help, or at the missing
# arguments when OPT takes --help as its value).  "fusermount3 -u" in
# mount's --help is not mount's option.
accepts() {
    local -a cmd=()
    [[ -n $1 ]] && cmd=("$1")
    (cd "$T" && timeout 10 "$BLOCKPORT" "${cmd[@]}" "$2" --help </dev/null \
        >/dev/null 2>"$T/accepts.err") || true
    ! grep -E "unrecognized option|invalid option -- " "$T/accepts.err" >/dev/null
}

# page_text PAGE: the roff source as plain text: \- and \(hy are "-",
# font changes and the escapes \& \e \(aq dropped or made plain.
page_text() {
    sed -e 's/\\-/-/g' -e 's/\\(hy/-/g' -e 's/\\f[BIRP]//g' -e 's/\\f(CW//g' \
        -e 's/\\&//g' -e 's/\\e/\\/g' -e "s/\\\\(aq/'/g" "$1"
}

# section PAGE NAME: the plain text of section NAME (up to the next .SH).
section() {
    page_text "$1" | awk -v want=".SH $2" '
        /^\.SH / { gsub(/"/, ""); on = ($0 == want); next }
        on'
}

# has_opt TEXT-FILE OPT: OPT stands alone in the text.
has_opt() {
    grep -qE -- "(^|[^A-Za-z0-9_-])$2([^A-Za-z0-9-]|\$)" "$1"
}

cmds=$("$BLOCKPORT" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')
[[ -n $cmds ]] || fail "no commands in blockport --help"
if ! grep -qx resize <<<"$cmds"; then
    if "$BLOCKPORT" resize --help >/dev/null 2>&1; then
        cmds+=$'\nresize'
    else
        skip_case "resize: the binary has no resize command yet; its page is linted only"
    fi
fi

########################################################################
check "every page formats without warnings"
pages=("$MAN"/*.1)
((${#pages[@]} > 1)) || fail "no pages in $MAN"
for p in "${pages[@]}"; do
    head -n 1 "$p" | grep -qx '\.\\" SPDX-License-Identifier: BSD-3-Clause' ||
        fail_soft "$(basename "$p"): the first line is not the SPDX comment"
    out=$(groff -man -ww -z "$p" 2>&1) || fail_soft "$(basename "$p"): groff failed"
    [[ -z $out ]] || fail_soft "$(basename "$p"): groff: $out"
    if command -v man >/dev/null 2>&1; then
        out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null) ||
            fail_soft "$(basename "$p"): man -l failed"
        [[ -z $out ]] || fail_soft "$(basename "$p"): man --warnings: $out"
    fi
done
ok "${#pages[@]} pages"

########################################################################
check "a page per command, with its sections and SEE ALSO"
for c in "" $cmds; do
    name=blockport${c:+-$c}
    p=$MAN/$name.1
    [[ -s $p ]] || { fail_soft "no page $name.1 for '$c'"; continue; }
    upper=$(tr a-z A-Z <<<"$name")
    page_text "$p" | grep "^\.TH $upper 1 " >/dev/null || fail_soft "$name.1: .TH is not '$upper 1'"
    section "$p" NAME | grep "^$name - ." >/dev/null || fail_soft "$name.1: NAME is not '$name - ...'"
    want=(NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES "SEE ALSO")
    [[ $c == serve ]] && want+=(FILES)
    for s in "${want[@]}"; do
        [[ -n $(section "$p" "$s") ]] || fail_soft "$name.1: no (or an empty) $s section"
    done
    see=$(section "$p" "SEE ALSO" | tr -d '\n')
    for ref in "qemu-img (1)" "qemu-nbd (8)" "nbdkit (1)" "nbdinfo (1)"; do
        grep -qF ".BR $ref" <<<"${see//.BR/$'\n'.BR}" ||
            fail_soft "$name.1: SEE ALSO lacks ${ref/ /}"
    done
    if [[ -n $c ]]; then
        grep -qF ".BR blockport (1)" <<<"${see//.BR/$'\n'.BR}" ||
            fail_soft "$name.1: SEE ALSO lacks blockport(1)"
    else
        for o in $cmds; do
            grep -qF ".BR blockport-$o (1)" <<<"${see//.BR/$'\n'.BR}" ||
                fail_soft "blockport.1: SEE ALSO lacks blockport-$o(1)"
        done
    fi
done
# serve's FILES: the configuration and the units.
files=$(section "$MAN/blockport-serve.1" FILES)
for f in /etc/blockport/blockport.conf /etc/blockport/NAME.conf \
    /etc/blockport/exports.conf blockport.service blockport@.service blockport.socket; do
    grep -qF "$f" <<<"$files" || fail_soft "blockport-serve.1: FILES lacks $f"
done
ok "$(wc -w <<<"$cmds") commands and blockport(1)"

########################################################################
check "every option of --help (that the command accepts) is in the page's OPTIONS"
n=0
for c in "" $cmds; do
    name=blockport${c:+-$c}
    [[ -s $MAN/$name.1 ]] || continue
    part=$(command_part "$c")
    if [[ -n $part ]] && ! has_feature "$part"; then
        skip_case "$c: built without $part, no --help to hold its page to"
        continue
    fi
    section "$MAN/$name.1" OPTIONS >"$T/options.txt"
    # shellcheck disable=SC2086
    opts=$("$BLOCKPORT" $c --help | opts_in_text)
    [[ -n $opts ]] || fail_soft "'blockport $c --help' names no option"
    for o in $opts; do
        accepts "$c" "$o" || continue
        has_opt "$T/options.txt" "$o" || fail_soft "$name.1: OPTIONS lacks $o (in its --help)"
        n=$((n + 1))
    done
done
ok "$n options"

########################################################################
check "every option of a command's getopt table is in its page (map's too)"
# Commands whose cli/CMD.c holds their one option table and getopt string;
# serve, mount and vhost share theirs (cli/options.c) and are held to
# their --help above.
n=0
for c in $cmds; do
    src=$ROOT/cli/$c.c
    [[ -f $src && $(grep -c 'struct option' "$src") -eq 1 ]] || continue
    case $c in serve | mount | vhost) continue ;; esac
    # A leading '+' or '-' is getopt's ordering flag, not an option.
    shorts=$(grep -oE 'getopt_long\(argc, argv, "[^"]*"' "$src" | sed -E 's/.*"[+-]?(.*)"/\1/' | tr -d ':')
    longs=$(grep -oE '\{"[a-z0-9-]+", *(no|required|optional)_argument' "$src" |
        sed -E 's/\{"([^"]*)".*/\1/')
    [[ -n $shorts && -n $longs ]] || { fail_soft "cli/$c.c: no getopt table found"; continue; }
    section "$MAN/blockport-$c.1" OPTIONS >"$T/options.txt"
    for o in $(fold -w1 <<<"$shorts" | sed 's/^/-/') $(sed 's/^/--/' <<<"$longs"); do
        has_opt "$T/options.txt" "$o" || fail_soft "blockport-$c.1: OPTIONS lacks $o (cli/$c.c accepts it)"
        n=$((n + 1))
    done
    [[ $c == map ]] && map_checked=1
done
[[ -n ${map_checked:-} ]] || fail_soft "map's option table was not checked"
ok "$n options"

########################################################################
check "the build's compressed pages are the sources"
gzdir=$(dirname "$BLOCKPORT")/man
if compgen -G "$gzdir/*.1.gz" >/dev/null; then
    for p in "${pages[@]}"; do
        gz=$gzdir/$(basename "$p").gz
        [[ -f $gz ]] || { fail_soft "no $gz"; continue; }
        gzip -dc "$gz" | cmp -s - "$p" || fail_soft "$gz is not $(basename "$p")"
    done
    ok "${#pages[@]} in $gzdir"
else
    skip_case "no $gzdir/*.1.gz beside \$BLOCKPORT"
fi
