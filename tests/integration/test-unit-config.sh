#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The systemd units' configuration (contrib/systemd/, contrib/etc/): a
# unit whose /etc/blockport file is missing, or sets no BLOCKPORT_ARGS,
# fails to start with a message naming the file (its ExecStartPre= line,
# run here as systemd would run it, on a directory of ours), rather than
# systemd's generic error or a silent skip; and the example files
# installed in /etc/blockport are all commented out, while each example in
# them, uncommented, passes `blockport serve --check-config`.
source "$(dirname "$0")/lib.sh"
require_feature tls
require sh
ROOT=$(readlink -f "$(dirname "$0")/../..")
UNITS=$ROOT/contrib/systemd
ETC=$ROOT/contrib/etc

mkdir -p "$T/etc" "$T/lib" "$T/run"

# unit_line UNIT KEY: the value of KEY= in UNIT (continuation lines
# joined, as systemd joins them: the backslash becomes a space).
unit_line() {
    sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba' -e '}' "$1" | sed -n "s/^$2=//p"
}

# start_pre UNIT INSTANCE [BLOCKPORT_ARGS]: run UNIT's ExecStartPre= with
# %i = INSTANCE and /etc/blockport = $T/etc, in the environment systemd
# gives it (BLOCKPORT_ARGS from the EnvironmentFile, if it sets one).
# Sets RC and OUT (stdout and stderr).
start_pre() {
    local line
    local -a argv env=(PATH=/usr/sbin:/usr/bin:/sbin:/bin)
    line=$(unit_line "$1" ExecStartPre)
    [[ -n $line ]] || fail "$(basename "$1"): no ExecStartPre="
    # systemd's specifiers and "$$", then our directory.
    line=${line//%i/$2}
    line=${line//\$\$/\$}
    line=${line//\/etc\/blockport/$T/etc}
    [[ $line == "/bin/sh -c '"*"'" ]] || fail "ExecStartPre= is not /bin/sh -c '...': $line"
    # Single quotes, no backslashes: systemd and bash split it alike.
    eval "argv=($line)"
    [[ $# -ge 3 ]] && env+=("BLOCKPORT_ARGS=$3")
    RC=0
    OUT=$(env -i "${env[@]}" "${argv[@]}" 2>&1) || RC=$?
}

# check_unit UNIT INSTANCE CONF
check_unit() {
    local unit=$UNITS/$1 name=$1 conf=$3
    [[ -n $2 ]] && name=${1/@/@$2}
    grep -q '^ConditionPathExists=' "$unit" &&
        fail_soft "$1: ConditionPathExists= skips the unit in silence"
    [[ $(unit_line "$unit" EnvironmentFile) == "-/etc/blockport/$conf" ]] ||
        fail_soft "$1: EnvironmentFile= is not the optional -/etc/blockport/$conf"

    rm -f "$T/etc/${conf//%i/$2}"
    start_pre "$unit" "$2"
    ((RC != 0)) || fail_soft "$name: started without /etc/blockport/${conf//%i/$2}"
    grep -qF "$T/etc/${conf//%i/$2} is missing" <<<"$OUT" ||
        fail_soft "$name, no file: not a clear message: $OUT"
    ok "$name without its file: exit status $RC, \"$OUT\""

    cp "$ETC/instance.conf.example" "$T/etc/${conf//%i/$2}"
    start_pre "$unit" "$2" ""
    ((RC != 0)) || fail_soft "$name: started with no BLOCKPORT_ARGS"
    grep -qF "sets no BLOCKPORT_ARGS" <<<"$OUT" ||
        fail_soft "$name, no BLOCKPORT_ARGS: not a clear message: $OUT"
    ok "$name with no BLOCKPORT_ARGS: exit status $RC"

    start_pre "$unit" "$2" "--readonly null:1M"
    ((RC == 0)) && [[ -z $OUT ]] ||
        fail_soft "$name: a good file fails the check ($RC): $OUT"
    ok "$name with its file: starts"
}

check "blockport.service and blockport@NAME.service refuse a missing configuration"
check_unit blockport.service.in "" blockport.conf
check_unit blockport@.service.in demo %i.conf

########################################################################
check "the example files change nothing as installed"
for f in "$ETC"/*; do
    head -n 1 "$f" | grep -qx '# SPDX-License-Identifier: BSD-3-Clause' ||
        fail_soft "$(basename "$f"): no SPDX line first"
    if grep -vE '^[[:space:]]*(#|$)' "$f"; then
        fail_soft "$(basename "$f"): lines that are not comments"
    fi
done
rc=0
"$BLOCKPORT" serve --check-config --config "$ETC/exports.conf" >"$T/out" 2>&1 || rc=$?
((rc == 1)) && grep -q "no exports" "$T/out" ||
    fail_soft "exports.conf as installed: status $rc: $(cat "$T/out")"
ok "only comments; exports.conf declares no export"

########################################################################
check "each example, uncommented, passes serve --check-config"
# Its images, in our stand-in for /var/lib/blockport.
for i in vm1.qcow2 golden.qcow2 disk.qcow2 demo.qcow2; do
    "$BLOCKPORT" create -q -f qcow2 "$T/lib/$i" 1M || fail "create $i"
done
"$BLOCKPORT" create -q -f raw "$T/lib/os.raw" 1M || fail "create os.raw"
# A PSK file for the export that requires TLS.
printf 'alice:%s\n' "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$T/keys.psk"

# paths FILE: the example's paths moved into $T, NAME made "demo".
paths() {
    sed -e "s|/var/lib/blockport|$T/lib|g" -e "s|/etc/blockport|$T/etc|g" \
        -e "s|/run/blockport|$T/run|g" -e "s|NAME|demo|g" "$1"
}
# The lines of an example are those whose '#' has no space after it.
paths "$ETC/exports.conf" | sed -n 's/^#\([^ #]\)/\1/p' >"$T/etc/exports.conf"
cp "$T/etc/exports.conf" "$T/etc/demo.exports"
out=$("$BLOCKPORT" serve --check-config --tls on --tls-psk "$T/keys.psk" \
    --config "$T/etc/exports.conf" 2>&1) || fail_soft "exports.conf: $out"
for e in vm1 golden scratch; do
    grep -q "export '$e'" <<<"$out" || fail_soft "exports.conf: no export $e: $out"
done
ok "exports.conf: $(head -n 1 <<<"$out")"

n=0
for f in blockport.conf instance.conf.example; do
    while IFS= read -r args; do
        [[ $f == blockport.conf ]] && grep -qE -- '--(unix|port|bind|unix-mode)( |$)' <<<"$args" &&
            fail_soft "blockport.conf: $args: socket activation refuses these"
        [[ $args == *--config* ]] && args+=" --tls on --tls-psk $T/keys.psk"
        # shellcheck disable=SC2086
        out=$("$BLOCKPORT" serve --check-config $args 2>&1) ||
            fail_soft "$f: BLOCKPORT_ARGS=$args: $out"
        n=$((n + 1))
    done < <(paths "$ETC/$f" | sed -n 's/^#BLOCKPORT_ARGS=//p')
done
((n >= 5)) || fail_soft "only $n BLOCKPORT_ARGS examples found"
ok "$n BLOCKPORT_ARGS examples"
