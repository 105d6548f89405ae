#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The bash completion (contrib/bash-completion/blockport), driven as bash
# drives it (COMP_WORDS, COMP_CWORD, COMP_LINE, then the function) in a
# plain bash, without bash-completion's helpers and, where that package
# is installed, with them: it offers the commands; for each command, only
# options that its --help names and the program accepts (getopt does not
# call them unrecognized), and every such option; the formats, cache and
# AIO modes, --tls and --output values; the export names of the --config
# file on the line (quoted ones too); files for images and file options,
# directories for --tls-certs, and nothing for a number.
source "$(dirname "$0")/lib.sh"
require bash
ROOT=$(readlink -f "$(dirname "$0")/../..")
COMPLETION=$ROOT/contrib/bash-completion/blockport

# The driver: one bash, as a user's shell is, that sources the completion
# (after bash-completion's own script when $WITH_BC names it) and answers
# queries from a FIFO: a line with the number of words, the words one a
# line; it completes the last one and answers with COMPREPLY one a line
# and a line holding only an RS character.
cat >"$T/drive.sh" <<'EOF'
[[ -n ${WITH_BC:-} ]] && source "$WITH_BC"
source "$COMPLETION"
while IFS= read -r n; do
    COMP_WORDS=()
    for ((i = 0; i < n; i++)); do
        IFS= read -r w
        COMP_WORDS+=("$w")
    done
    COMP_CWORD=$((n - 1))
    COMP_LINE="${COMP_WORDS[*]}"
    COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    # The queries come on stdin: a command the completion runs (blockport
    # --help) must not read the ones queued behind this one.
    _blockport </dev/null
    ((${#COMPREPLY[@]})) && printf '%s\n' "${COMPREPLY[@]}"
    printf '\036\n'
done
EOF
# start_driver: a driver for this mode (WITH_BC), on fds 7 and 8.  Each
# driver has FIFOs of its own: a driver that has not yet seen the end of
# its queries must not read the next one's.
DRIVERS=0
start_driver() {
    DRIVERS=$((DRIVERS + 1))
    local q=$T/queries.$DRIVERS a=$T/answers.$DRIVERS
    mkfifo "$q" "$a"
    (cd "$T/work" && COMPLETION=$COMPLETION exec bash --norc --noprofile "$T/drive.sh" \
        <"$q" >"$a" 2>>"$T/driver.err") &
    DRIVER_PID=$!
    track_pid "$DRIVER_PID"
    exec 7>"$q" 8<"$a"
}
stop_driver() {
    exec 7>&- 8<&-
    wait_until 10 _pid_gone "$DRIVER_PID" || fail "the completion driver did not exit"
}

# comp WORD...: what completing the last word (after "blockport") offers.
comp() {
    local line
    printf '%s\n' $(($# + 1)) "$BLOCKPORT" "$@" >&7
    while IFS= read -r -t 60 line <&8; do
        [[ $line == $'\036' ]] && return 0
        printf '%s\n' "$line"
    done
    fail "the completion did not answer [$*]: $(cat "$T/driver.err")"
}

# expect_exactly DESCRIPTION WANT... -- WORD...: the offer, sorted, is WANT.
expect_exactly() {
    local desc=$1 got want
    shift
    local -a w=()
    while [[ $1 != -- ]]; do w+=("$1"); shift; done
    shift
    got=$(comp "$@" | sort | tr '\n' ' ')
    want=
    ((${#w[@]} == 0)) || want=$(printf '%s\n' "${w[@]}" | sort | tr '\n' ' ')
    [[ $got == "$want" ]] || fail_soft "$desc: [${*}] offered [$got], expected [$want]"
}

# opts_in_text: the options a text names (as test-man.sh reads them).
opts_in_text() {
    grep -oE '(^|[^A-Za-z0-9_-])--?[A-Za-z0-9][A-Za-z0-9-]*' |
        sed -E 's/^[^-]+//' | grep -E '^(-[A-Za-z0-9]|--[a-z0-9][a-z0-9-]+)$' |
        sort -u || true
}

# accepts CMD OPT: getopt does not refuse OPT (see test-man.sh); asked
# once per CMD and OPT.
declare -A _accepts=()
accepts() {
    local key="$1 $2"
    if [[ -z ${_accepts[$key]:-} ]]; then
        (cd "$T" && timeout 10 "$BLOCKPORT" "$1" "$2" --help </dev/null \
            >/dev/null 2>"$T/accepts.err") || true
        if grep -E "unrecognized option|invalid option -- " "$T/accepts.err" >/dev/null; then
            _accepts[$key]=no
        else
            _accepts[$key]=yes
        fi
    fi
    [[ ${_accepts[$key]} == yes ]]
}

mkdir -p "$T/work/certs.d" "$T/work/sub"
: >"$T/work/disk.qcow2"
: >"$T/work/pid.file"
cat >"$T/work/exports.conf" <<'EOF'
# comment
[export vm1]
path = a.qcow2
  [export   golden  ]
path = b.qcow2
[export "odd ] \"name\""]
path = c.qcow2
EOF

cmds=$("$BLOCKPORT" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')
[[ -n $cmds ]] || fail "no commands in blockport --help"

modes=("plain bash (compgen -f)")
bc=/usr/share/bash-completion/bash_completion
if [[ -r $bc ]]; then
    modes+=("bash-completion ($bc)")
else
    skip_case "bash-completion is not installed: _filedir not tried"
fi

for mode in "${modes[@]}"; do
    if [[ $mode == bash-completion* ]]; then export WITH_BC=$bc; else unset WITH_BC; fi
    start_driver

    ####################################################################
    check "$mode: the commands"
    # shellcheck disable=SC2086
    expect_exactly "commands" $cmds --help --version -- ""
    expect_exactly "commands" serve -- se
    ok "$(wc -w <<<"$cmds") commands, --help and --version"

    ####################################################################
    # (What options are offered does not depend on bash-completion.)
    if [[ $mode == plain* ]]; then
    check "$mode: each command's options are its own, and all of them"
    n=0
    for c in $cmds; do
        part=$(command_part "$c")
        [[ -z $part ]] || has_feature "$part" || continue # no --help to hold to
        help=$("$BLOCKPORT" "$c" --help)
        in_help=$(opts_in_text <<<"$help")
        offered=$(comp "$c" -)
        [[ -n $offered ]] || fail_soft "$c: no option offered"
        for o in $offered; do
            grep -qxF -- "$o" <<<"$in_help" || fail_soft "$c: offers $o, which its --help does not name"
            accepts "$c" "$o" || fail_soft "$c: offers $o, which blockport $c refuses"
            n=$((n + 1))
        done
        for o in $in_help; do
            accepts "$c" "$o" || continue
            grep -qxF -- "$o" <<<"$offered" || fail_soft "$c: does not offer $o (in its --help)"
        done
        # Long options only, once "--" is typed.
        offered=$(comp "$c" --)
        [[ -n $offered ]] && grep -v -- '^--' <<<"$offered" && fail_soft "$c: '--' offers short options"
    done
    ok "$n options offered, each in --help and accepted"
    fi

    ####################################################################
    check "$mode: option values"
    fmts=(raw qcow2)
    cache=(none writeback writethrough directsync unsafe)
    for w in "serve -f" "serve --format" "mount -f" "vhost --format" "info -f" \
        "map -f" "check -f" "create -f" "create -F" "create --backing-format" \
        "convert -f" "convert -O" "convert -F" "compare -f" "compare -F"; do
        # shellcheck disable=SC2086
        expect_exactly "formats" "${fmts[@]}" -- $w ""
    done
    expect_exactly "formats" qcow2 -- convert -O q
    for w in "serve --cache" "vhost --cache" "convert -t" "convert -T" "compare -T"; do
        # shellcheck disable=SC2086
        expect_exactly "cache modes" "${cache[@]}" -- $w ""
    done
    expect_exactly "mount's cache modes" "${cache[@]}" page -- mount --cache ""
    expect_exactly "--aio" io_uring threads -- serve --aio ""
    expect_exactly "--tls" off on require -- serve --tls ""
    expect_exactly "--output" human json -- check --output ""
    expect_exactly "--output" json -- map --output j
    # --output=VALUE, split at '=' by bash or not.
    expect_exactly "--output=" human json -- info --output = ""
    expect_exactly "--output=" json -- info --output = j
    expect_exactly "--output=j" --output=json -- info --output=j
    expect_exactly "--repair" leaks all -- check --repair ""
    expect_exactly "--rbd-lock" fail wait none -- serve --rbd-lock ""
    expect_exactly "--preallocation" off metadata falloc full -- resize --preallocation ""
    expect_exactly "--metrics" 127.0.0.1:9100 "[::1]:9100" -- serve --metrics ""
    # -o KEY=VALUE,...: bash splits the words at '='.
    expect_exactly "create -o (raw)" preallocation= size= -- create -o ""
    expect_exactly "create -o (qcow2)" compat= compression_type= -- create -f qcow2 -o comp
    expect_exactly "-o after a comma" 1.1,lazy_refcounts= -- create -f qcow2 -o compat = 1.1,la
    expect_exactly "-o a bool's values" on off -- create -f qcow2 -o lazy_refcounts = ""
    expect_exactly "-o allowed values" off metadata falloc full -- convert -O qcow2 -o preallocation = ""
    expect_exactly "-o compat" 0.10 1.1 -- measure -O qcow2 -o cluster_size = 64k,compat = ""
    expect_exactly "amend -o (qcow2's amend keys)" compat= -- amend -o comp
    expect_exactly "amend -o, no creation keys" -- amend -o cluster
    expect_exactly "amend -o data_file_raw" on off -- amend -o data_file_raw = ""
    expect_exactly "--log-level" error warn info debug -- mount --log-level ""
    # A value nothing can guess: nothing, rather than files.
    for w in "serve --port" "serve -w" "mount -t" "vhost -q" "convert -m" "serve --allow"; do
        part=$(command_part "${w%% *}")
        [[ -z $part ]] || has_feature "$part" || continue # no --help to read it from
        # shellcheck disable=SC2086
        expect_exactly "no value for ${w#* }" -- $w ""
    done
    ok "formats, cache and AIO modes, --tls, --output, --repair, -o, --preallocation, --metrics; nothing for numbers"

    ####################################################################
    check "$mode: export names from the --config file on the line"
    expect_exactly "exports" vm1 golden 'odd\ \]\ \"name\"' -- \
        serve --config exports.conf --readonly-export ""
    expect_exactly "exports" golden -- serve --config exports.conf -r --readonly-export g
    expect_exactly "exports (--config=)" vm1 -- serve --config=exports.conf --readonly-export v
    expect_exactly "no --config, no names" -- serve --readonly-export ""
    ok "plain and quoted names, after --config FILE and --config=FILE"

    ####################################################################
    check "$mode: files and directories"
    expect_exactly "an image" disk.qcow2 -- info d
    expect_exactly "convert's DST" disk.qcow2 -- convert -O raw disk.qcow2 d
    expect_exactly "--pid-file" pid.file -- serve --pid-file p
    expect_exactly "--config" exports.conf -- serve --config e
    expect_exactly "--tls-certs (directories)" certs.d -- serve --tls-certs c
    # Whole answers are read before grep looks at them: a grep that stops
    # early would leave the rest in the FIFO for the next query.
    offered=$(comp serve --tls-certs "")
    grep -qx disk.qcow2 <<<"$offered" && fail_soft "--tls-certs offers a file"
    plugindir=$(pkg-config --variable=plugindir nbdkit 2>/dev/null || true)
    if [[ -e $plugindir/nbdkit-memory-plugin.so ]]; then
        expect_exactly "--plugin" memory -- serve --plugin memo
    fi
    ok "files, directories and plugin names"
    stop_driver
done
