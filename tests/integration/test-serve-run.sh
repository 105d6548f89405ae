#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# serve --run CMD (nbdkit's captive mode) and serve --fork (qemu-nbd's):
# --run sets $uri, $nbd, $unixsocket, $port, $exportname and $tls as nbdkit
# does, serves on a private Unix socket when no address is given, stops
# when the command exits and exits with its status (0, 3, 127 for a
# missing command, 128 + N for a signal); qemu-img convert "$nbd" copies the
# image exactly; a server stopped first takes the command with it.  --fork
# returns once clients can connect, with the pid file naming a server in a
# session of its own; a failed start returns non-zero and leaves no pid
# file.
source "$(dirname "$0")/lib.sh"
require qemu-img nbdinfo
cd "$T"
random_file img 8

check "--run: variables, a private socket, the command's exit status"
rc=0
"$BLOCKPORT" serve -f raw img --run '
    [ -S "$unixsocket" ] || exit 10
    [ "$uri" = "nbd+unix:///?socket=$unixsocket" ] || exit 11
    [ "$nbd" = "$uri" ] || exit 12
    [ -z "$port" ] && [ -z "$exportname" ] && [ -z "$tls" ] || exit 13
    echo "$unixsocket" >sockpath
    [ "$(nbdinfo --size "$uri")" = 8388608 ] || exit 14
    exit 3' 2>log || rc=$?
((rc == 3)) || { cat log; fail "--run exited $rc, expected the command's 3"; }
dir=$(dirname "$(cat sockpath)")
[[ ! -e $dir ]] || fail "the private directory $dir is left behind"
ok "variables as nbdkit sets them; exit status 3 passed on; $dir removed"

rc=0
"$BLOCKPORT" serve -f raw img --run 'exit 0' 2>log || rc=$?
((rc == 0)) || { cat log; fail "--run 'exit 0' exited $rc"; }
rc=0
"$BLOCKPORT" serve -f raw img --run 'no-such-command-here' 2>log || rc=$?
((rc == 127)) || { cat log; fail "a missing command: $rc, expected 127"; }
rc=0
"$BLOCKPORT" serve -f raw img --run 'kill -9 $$' 2>log || rc=$?
((rc == 137)) || { cat log; fail "a command killed by SIGKILL: $rc, expected 137"; }
ok "exit statuses 0, 127 and 128 + 9"

check "--run 'qemu-img convert \$nbd ...' copies the image"
run "$BLOCKPORT" serve -f raw -r img \
    --run 'qemu-img convert -f raw -O qcow2 "$nbd" out.qcow2' ||
    fail "captive qemu-img convert failed"
run qemu-img compare -f raw -F qcow2 img out.qcow2 || fail "the copy differs"
ok "qemu-img convert through \$nbd"

check "--run with --port: \$port and a TCP URI"
port=$(_free_port)
rc=0
"$BLOCKPORT" serve -f raw img -p "$port" -b 127.0.0.1 --run '
    [ "$port" = '"$port"' ] || exit 20
    [ -z "$unixsocket" ] || exit 21
    [ "$uri" = "nbd://127.0.0.1:'"$port"'/" ] || exit 22
    [ "$(nbdinfo --size "$uri")" = 8388608 ] || exit 23' 2>log || rc=$?
((rc == 0)) || { cat log; fail "--run with --port: $rc"; }
ok "\$port and nbd://127.0.0.1:$port/"

check "a server stopped first takes the command with it"
"$BLOCKPORT" serve -f raw img --pid-file "$T/pid" \
    --run 'echo $$ >cmdpid; exec sleep 60' 2>log &
srv=$!
track_pid "$srv"
wait_until 10 test -s cmdpid || fail "the command did not start"
wait_until 10 test -s pid || fail "no pid file"
kill -TERM "$(cat pid)"
rc=0
wait "$srv" || rc=$?
((rc == 128 + 15)) || { cat log; fail "exit $rc, expected 143 (the command's SIGTERM)"; }
! kill -0 "$(cat cmdpid)" 2>/dev/null || fail "the command still runs"
[[ ! -e pid ]] || fail "the pid file is left behind"
ok "SIGTERM to the server: the command got SIGTERM, exit 143"

rc=0
"$BLOCKPORT" serve -f raw img --run true --fork 2>log || rc=$?
((rc == 1)) && grep -q "no --fork" log || { cat log; fail "--run with --fork: $rc"; }
ok "--run with --fork refused"

check "--fork: back once ready, the server in its own session"
rc=0
run "$BLOCKPORT" serve -f raw --unix "$T/sock" --pid-file "$T/pid" --fork img ||
    fail "--fork exited $?"
[[ -s pid ]] || fail "no pid file when --fork returned"
spid=$(cat pid)
track_pid "$spid"
[[ -S sock ]] || fail "no socket when --fork returned"
[[ $(nbdinfo --size "nbd+unix:///?socket=$T/sock") == 8388608 ]] ||
    fail "the forked server does not answer"
[[ $(ps -o sid= -p "$spid" | tr -d ' ') == "$spid" ]] ||
    fail "the server is not the leader of its own session"
kill -TERM "$spid"
wait_until 10 _pid_gone "$spid" || fail "the forked server did not stop"
[[ ! -e pid && ! -e sock ]] || fail "pid file or socket left behind"
ok "--fork: ready on return, own session, stops on SIGTERM"

rc=0
"$BLOCKPORT" serve -f raw --unix "$T/sock" --pid-file "$T/pid" --fork \
    "$T/missing.img" 2>log || rc=$?
((rc != 0)) || fail "--fork with a missing image exited 0"
[[ ! -e pid ]] || fail "a pid file for a server that failed"
grep -q "missing.img" log || { cat log; fail "the reason is not on stderr"; }
ok "--fork: a failed start exits $rc with the reason and no pid file"
