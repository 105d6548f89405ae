#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The options serve, mount and vhost share (cli/options.c) have one name,
# one range and one help text: each command's --help shows the same lines
# for them, each refuses a value out of range with the same message and
# exit status 1, and the spellings mount and vhost had before (-C,
# --connections, --timeout) still work there.
source "$(dirname "$0")/lib.sh"
require ss
cd "$T"

# The shared options' lines of CMD's --help, without mount's and vhost's
# aliases, the default number of workers (which differs by design),
# --cache (mount's takes one more mode, page, for the mounted files) and
# --views-unix (mount's and vhost's: serve serves views itself).
shared_help() {
    "$BLOCKPORT" "$1" --help | sed -n '/^  -f, --format/,/^  -h, --help/p' |
        awk '/^      --(cache MODE|views-unix PATH)/ {skip = 1; next}
             skip && /^  (-|    --)/ {skip = 0}
             !skip' |
        grep -v -e '^  -C, --connections' -e '^      --timeout ' \
            -e '^  -h, --help' -e '^ *(default [0-9]*)$'
}

# mount and vhost, those built in (CMakeLists.txt BLOCKPORT_FUSE, _VHOST).
OTHERS=()
has_feature fuse && OTHERS+=(mount)
has_feature vhost && OTHERS+=(vhost)

check "the same --help lines for the shared options"
ref=$(shared_help serve)
[[ $(grep -c -e '--nbd-connections N' -e '--l2-cache-size' <<<"$ref") -eq 2 ]] ||
    fail "serve --help lacks the shared options: $ref"
for c in ${OTHERS[@]+"${OTHERS[@]}"}; do
    diff <(echo "$ref") <(shared_help $c) || fail "$c --help differs from serve's"
done
ok "$(wc -l <<<"$ref") lines, alike in serve, mount and vhost"

# refused CMD MESSAGE ARGS...: CMD ARGS exits 1 saying "blockport CMD:
# MESSAGE".
refused() {
    local cmd=$1 msg=$2 rc=0
    shift 2
    timeout -s KILL 10 "$BLOCKPORT" "$cmd" "$@" </dev/null >out.txt 2>&1 || rc=$?
    [[ $rc -eq 1 ]] || { cat out.txt; fail "$cmd $*: exit $rc, expected 1"; }
    grep -qxF "blockport $cmd: $msg" out.txt ||
        { cat out.txt; fail "$cmd $*: no 'blockport $cmd: $msg'"; }
    check_sanitizer_reports out.txt
}

# Each command's arguments after the options, so that only the option
# can be wrong.
declare -A ARGS=([serve]="memory:1M" [mount]="memory:1M $T/mnt"
                 [vhost]="-s $T/vhost.sock memory:1M")

check "out-of-range values: exit 1 and one message naming option and range"
n=0
for c in serve ${OTHERS[@]+"${OTHERS[@]}"}; do
    # shellcheck disable=SC2086
    {
    refused $c "--nbd-connections 17: expected a number in 0-16" --nbd-connections 17 ${ARGS[$c]}
    refused $c "--nbd-timeout 86401: expected a number in 0-86400" --nbd-timeout 86401 ${ARGS[$c]}
    refused $c "--workers 0: expected a number in 1-1024" -w 0 ${ARGS[$c]}
    refused $c "--l2-cache-size 1k: expected a size of at least 64K" --l2-cache-size 1k ${ARGS[$c]}
    refused $c "--log-level loud: expected error, warn, info or debug" --log-level loud ${ARGS[$c]}
    refused $c "-D nodot: expected NAME.FLAG=N" -D nodot ${ARGS[$c]}
    refused $c "--nbd-replay-limit lots: expected a size (4096, 512K, 64M, ...)" --nbd-replay-limit lots ${ARGS[$c]}
    }
    n=$((n + 7))
done
ok "$n refusals"

check "mount's and vhost's old spellings: the same ranges and messages"
for c in ${OTHERS[@]+"${OTHERS[@]}"}; do
    # shellcheck disable=SC2086
    {
    refused $c "--nbd-connections 17: expected a number in 0-16" -C 17 ${ARGS[$c]}
    refused $c "--nbd-connections 65: expected a number in 0-16" --connections 65 ${ARGS[$c]}
    refused $c "--nbd-timeout -1: expected a number in 0-86400" --timeout -1 ${ARGS[$c]}
    }
done
ok "-C, --connections and --timeout checked as --nbd-connections and --nbd-timeout"

# Whether the server has N client connections.
server_conns() { [[ $(ss -xp | grep -c "pid=$SERVER_PID,") -eq $1 ]]; }

if has_feature vhost; then
  check "--connections, -C and --nbd-connections reach the NBD source"
  start_server memory:64M
  for opts in "--connections 2 --timeout 5" "-C 3" "--nbd-connections 2 --nbd-timeout 5"; do
      want=${opts#* } want=${want%% *}
      rm -f vh.pid
      # shellcheck disable=SC2086
      "$BLOCKPORT" vhost -s "$T/vh.sock" $opts -P vh.pid "$URI" >vh.log 2>&1 &
      vh=$!
      track_pid $vh
      wait_file 10 vh.pid $vh || { cat vh.log; fail "vhost $opts did not start"; }
      wait_until 5 server_conns "$want" ||
          fail "vhost $opts: $(ss -xp | grep -c "pid=$SERVER_PID,") connections, expected $want"
      kill $vh
      wait $vh || { cat vh.log; fail "vhost $opts exited with $?"; }
      wait_until 5 server_conns 0 || fail "vhost $opts: connections left"
      check_sanitizer_reports vh.log
      ok "vhost $opts: $want connections"
  done
else
  skip_case "built without vhost: the NBD source's connections through vhost not tried"
fi

# Options only a format knows pass through the command line and the
# config file untouched (--source-option, option =); the format judges
# them when the source opens.
check "--source-option and option =: the format's keys only, and they take effect"
"$BLOCKPORT" create -f qcow2 x.qcow2 1M >/dev/null
rc=0
"$BLOCKPORT" serve --check-config --source-option timeout=5 x.qcow2 >out.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF "qcow2: unknown option 'timeout' (known: l2-cache-size, snapshot, snapshot.id, snapshot.name)" out.txt ||
    { cat out.txt; fail "a qcow2 image took timeout=5 (exit $rc)"; }
printf '[export a]\npath = x.qcow2\noption = connections=2\n' >bad.conf
rc=0
"$BLOCKPORT" serve --check-config --config bad.conf >out.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qF "bad.conf:1: export 'a': qcow2: unknown option 'connections'" out.txt ||
    { cat out.txt; fail "option = connections=2 on a qcow2 image: exit $rc"; }
rc=0
"$BLOCKPORT" convert -O raw --source-option timeout=5 x.qcow2 y.raw >out.txt 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -qxF "blockport convert: qcow2: unknown option 'timeout' (known: l2-cache-size, snapshot, snapshot.id, snapshot.name)" out.txt ||
    { cat out.txt; fail "convert: a qcow2 SRC took timeout=5 (exit $rc)"; }
"$BLOCKPORT" convert -O raw --source-option l2-cache-size=1M x.qcow2 y.raw >out.txt 2>&1 ||
    { cat out.txt; fail "convert: l2-cache-size=1M refused on a qcow2 SRC"; }
# The format flags stay defaults for the formats that know them.
"$BLOCKPORT" serve --check-config --source-option l2-cache-size=1M \
    --nbd-timeout 5 --rbd-lock wait x.qcow2 >out.txt 2>&1 ||
    { cat out.txt; fail "l2-cache-size=1M and the NBD and RBD flags refused on qcow2"; }
check_sanitizer_reports out.txt
[[ -n $SERVER_PID ]] || start_server memory:64M
# serve_nbd N ARGS...: a second server over the NBD source $URI opens N
# connections to it.
serve_nbd() {
    local want=$1
    shift
    rm -f s2.pid
    "$BLOCKPORT" serve --unix "$T/s2.sock" -P s2.pid "$@" >s2.log 2>&1 &
    local s2=$!
    track_pid $s2
    wait_file 10 s2.pid $s2 || { cat s2.log; fail "serve $* did not start"; }
    wait_until 5 server_conns "$want" ||
        fail "serve $*: $(ss -xp | grep -c "pid=$SERVER_PID,") connections, expected $want"
    kill $s2
    wait $s2 || { cat s2.log; fail "serve $* exited with $?"; }
    wait_until 5 server_conns 0 || fail "serve $*: connections left"
    check_sanitizer_reports s2.log
}
serve_nbd 2 --source-option connections=2 "$URI"
printf '[export a]\npath = %s\noption = timeout=5\noption = connections=3\n' "$URI" >nbd.conf
serve_nbd 3 --config nbd.conf
ok "refused on qcow2 naming the format and the key; connections=2 and 3 reach the NBD source"

check "a reload that changes an export's options opens its source again"
rm -f s2.pid
"$BLOCKPORT" serve --unix "$T/s2.sock" -P s2.pid --config nbd.conf >s2.log 2>&1 &
s2=$!
track_pid $s2
wait_file 10 s2.pid $s2 || { cat s2.log; fail "serve --config nbd.conf did not start"; }
wait_until 5 server_conns 3 || fail "$(ss -xp | grep -c "pid=$SERVER_PID,") connections, expected 3"
sed -i 's/connections=3/connections=2/' nbd.conf
kill -HUP $s2
wait_until 10 server_conns 2 ||
    { cat s2.log; fail "after the reload: $(ss -xp | grep -c "pid=$SERVER_PID,") connections, expected 2"; }
kill $s2
wait $s2 || { cat s2.log; fail "serve --config nbd.conf exited with $?"; }
check_sanitizer_reports s2.log
ok "connections=3, then 2 after SIGHUP"
