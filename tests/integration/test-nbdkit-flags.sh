#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdkit's flags on blockport serve, held to nbdkit's documented behaviour
# (nbdkit(1), nbdkit-captive(1)) and, where nbdkit is here, to nbdkit
# itself: -s, --exit-with-parent, -e with --run, -U - and -U SOCKET,
# --foreground, -t, --dump-config, and a --run that keeps quiet.
source "$(dirname "$0")/lib.sh"
require nbdinfo
require_py_nbd
cd "$T"
HAVE_NBDKIT=false
command -v nbdkit >/dev/null && HAVE_NBDKIT=true

check "-s: one client on standard input, then exit"
got=$("$PY" "$(dirname "$0")/nbdkit_single.py" "$BLOCKPORT" serve -s memory:1M 2>s.err) ||
    { cat s.err; fail "serve -s"; }
[[ $got == "size 1048576 exit 0" ]] || fail "serve -s: $got"
if $HAVE_NBDKIT; then
    want=$("$PY" "$(dirname "$0")/nbdkit_single.py" nbdkit -s memory 1M) ||
        fail "nbdkit -s"
    [[ $got == "$want" ]] || fail "serve -s: $got, nbdkit -s: $want"
fi
rc=0
"$BLOCKPORT" serve -s memory:1M </dev/null 2>err || rc=$?
[[ $rc == 1 ]] && grep -q "standard input is not a socket" err ||
    { cat err; fail "serve -s on /dev/null: exit $rc"; }
rc=0
"$BLOCKPORT" serve -s -u x.sock memory:1M </dev/null 2>err || rc=$?
[[ $rc == 1 ]] && grep -q -- "--single serves standard input: no --unix" err ||
    { cat err; fail "serve -s -u: exit $rc"; }
ok "served and gone, as nbdkit -s; refused without a socket or with -u"

check "--exit-with-parent: the parent goes, the server follows"
# The server's parent is this bash -c; SIGKILL leaves it no say.
bash -c "\"$BLOCKPORT\" serve --exit-with-parent -u '$T/p.sock' --pid-file '$T/p.pid' memory:1M 2>'$T/p.err' & wait" &
parent=$!
track_pid "$parent"
wait_file 10 p.pid "$parent" || fail "the server did not start"
srv=$(cat p.pid)
track_pid "$srv"
kill -9 "$parent"
wait "$parent" 2>/dev/null || true
wait_until 20 _pid_gone "$srv" || fail "the server outlived its parent"
rc=0
"$BLOCKPORT" serve --exit-with-parent --fork memory:1M 2>err || rc=$?
[[ $rc == 1 ]] && grep -q -- "--exit-with-parent keeps the server in the foreground" err ||
    { cat err; fail "--exit-with-parent --fork: exit $rc"; }
ok "stopped with its parent; refused with --fork"

check "-e NAME and -U - under --run, quiet"
run_vars='echo "$exportname"; echo "$uri" | sed "s/?socket=.*//"; nbdinfo --size "$uri"'
"$BLOCKPORT" serve -U - -e foo --run "$run_vars" memory:1M >out 2>err ||
    { cat out err; fail "serve -U - -e foo --run"; }
printf 'foo\nnbd+unix:///foo\n1048576\n' | cmp -s - out || { cat out; fail "--run's variables"; }
[[ ! -s err ]] || { cat err; fail "serve --run logged (nbdkit's --run does not)"; }
if $HAVE_NBDKIT; then
    nbdkit -U - -e foo memory 1M --run "$run_vars" >want 2>&1 || fail "nbdkit --run"
    cmp -s want out || { diff want out; fail "--run's output differs from nbdkit's"; }
fi
"$BLOCKPORT" serve --log-level info --run true memory:1M 2>err || fail "serve --log-level info --run true"
grep -q "info: ready" err || { cat err; fail "--log-level info --run logged nothing"; }
! grep -q "signal" err || { cat err; fail "--run's own SIGTERM was logged"; }
ok "\$exportname, \$uri and a private socket as nbdkit's; no log unless asked"

check "-U SOCKET: pointed to --unix"
rc=0
"$BLOCKPORT" serve -r -U "$T/n.sock" memory:1M 2>err || rc=$?
[[ $rc == 1 ]] && grep -q -- "use -u/--unix $T/n.sock" err ||
    { cat err; fail "-U SOCKET: exit $rc"; }
rc=0
"$BLOCKPORT" serve -U memory:1M 2>err || rc=$?
[[ $rc == 1 ]] && grep -q -- "--force-share needs --readonly.*nbdkit's -U SOCKET, use -u/--unix" err ||
    { cat err; fail "-U without -r: exit $rc"; }
ok "both name --unix"

check "--foreground, -t, --dump-config, --version"
"$BLOCKPORT" serve --foreground -t 4 --run 'nbdinfo --size "$uri"' memory:1M >out ||
    fail "--foreground -t 4"
[[ $(cat out) == 1048576 ]] || fail "--foreground -t 4: $(cat out)"
rc=0
"$BLOCKPORT" serve -t 0 memory:1M 2>err || rc=$?
[[ $rc == 1 ]] && grep -q -- "--threads 0: expected a number in 1-1024" err ||
    { cat err; fail "-t 0: exit $rc"; }
rc=0
"$BLOCKPORT" serve --foreground --fork memory:1M 2>err || rc=$?
[[ $rc == 1 ]] || fail "--foreground --fork: exit $rc"
"$BLOCKPORT" serve --dump-config >dump || fail "--dump-config"
sort -c dump || fail "--dump-config not sorted by key, as nbdkit's"
version=$("$BLOCKPORT" --version | sed -n 's/^blockport //p')
for kv in name=blockport "version=$version" "version_major=${version%%.*}" \
    exit_with_parent=yes "binary=$(readlink -f "$BLOCKPORT")" host_os=linux-gnu; do
    grep -qx -- "$kv" dump || { cat dump; fail "--dump-config lacks $kv"; }
done
for part in rbd fuse vhost plugins tls io_uring; do
    has_feature "$part" && want=yes || want=no
    grep -qx "$part=$want" dump || { cat dump; fail "--dump-config: $part is not $want"; }
done
if $HAVE_NBDKIT; then
    # The keys both have mean the same: nbdkit's own where they apply.
    for k in exit_with_parent host_cpu host_os; do
        [[ $(grep "^$k=" dump) == "$(nbdkit --dump-config | grep "^$k=")" ]] ||
            fail "--dump-config's $k differs from nbdkit's"
    done
fi
"$BLOCKPORT" serve --version | grep -qx "blockport $version" || fail "serve --version"
ok "accepted, checked, and the build's configuration as nbdkit prints its own"
