#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# systemd integration of `blockport serve`: socket activation (LISTEN_PID,
# LISTEN_FDS) through systemd-socket-activate on TCP and Unix sockets, data
# through the passed sockets, a socket file we did not create left alone,
# LISTEN_* not inherited by children, usage errors when sockets are given
# twice, bad activation environments refused; readiness notification
# (NOTIFY_SOCKET, path and abstract): READY=1 once clients are accepted,
# STOPPING=1 at SIGTERM, a bad one only logged; the unit files verified.
source "$(dirname "$0")/lib.sh"
require nbdinfo qemu-img cmp

# systemd-socket-activate comes with Debian's `systemd` package
# (contrib/install-deps.sh installs it).
require systemd-socket-activate

# Variables systemd-socket-activate must pass on (it passes only PATH,
# HOME, TERM and what -E names).
_pass_env() {
    local v
    for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS NOTIFY_SOCKET ENVLOG; do
        [[ -n ${!v:-} ]] && printf -- '-E\n%s\n' "$v"
    done
    return 0
}

# activate ADDR... -- SERVE_ARGS...: blockport serve under
# systemd-socket-activate listening on each ADDR.  It execs blockport in
# place (on the first connection), so SERVER_PID is the server's pid.
activate() {
    local -a listen=() pass=()
    while [[ $1 != -- ]]; do listen+=(-l "$1"); shift; done
    shift
    mapfile -t pass < <(_pass_env)
    : >"$T/server.log"
    echo "+ systemd-socket-activate ${listen[*]} $BLOCKPORT serve $*" >>"$T/server.log"
    "${_env_reset[@]}" systemd-socket-activate "${listen[@]}" "${pass[@]}" \
        "$BLOCKPORT" serve "$@" </dev/null >>"$T/server.log" 2>&1 &
    SERVER_PID=$!
    local n=$((${#listen[@]} / 2))
    wait_until 5 eval '(($(grep -c "^Listening on" "$T/server.log") >= n)) || ! server_alive'
    (($(grep -c '^Listening on' "$T/server.log") >= n)) ||
        fail "systemd-socket-activate did not listen: $(cat "$T/server.log")"
}

# wait_exit STATUS: the server must exit by itself with STATUS.
wait_exit() {
    local want=$1 rc=0
    wait_until 10 _pid_gone "$SERVER_PID" ||
        fail "server still running, expected exit status $want"
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=
    [[ $rc -eq $want ]] || fail "exit status $rc, expected $want"
    check_sanitizer_reports "$T/server.log"
}

# Data through URI: qemu-img reads the image back, writes a new one in.
check_data() {
    local uri=$1
    run nbdinfo --size "$uri" | grep -qx $((8 * 1024 * 1024)) ||
        fail "nbdinfo: wrong size through $uri"
    run qemu-img convert -f raw -O raw "$uri" "$T/out.img" ||
        fail "qemu-img convert from $uri failed"
    cmp "$T/disk.img" "$T/out.img" || fail "data read through $uri differs"
    random_file "$T/new.img" 8
    run qemu-img convert -n -f raw -O raw "$T/new.img" "$uri" ||
        fail "qemu-img convert to $uri failed"
    ok "nbdinfo and qemu-img through $uri"
}

random_file "$T/disk.img" 8

########################################################################
check "socket activation on TCP"
PORT=$(_free_port)
activate "127.0.0.1:$PORT" -- "$T/disk.img"
check_data "nbd://127.0.0.1:$PORT"
grep -q "ready (socket-activated): tcp 127.0.0.1:$PORT" "$T/server.log" ||
    fail "no 'ready (socket-activated)' line in the log"
stop_server TERM
cmp "$T/new.img" "$T/disk.img" || fail "data written through TCP is not in the image"
ok "data written is in the image"

########################################################################
check "socket activation on a Unix socket; its file is not ours to remove"
random_file "$T/disk.img" 8
activate "$T/act.sock" -- "$T/disk.img"
check_data "nbd+unix:///?socket=$T/act.sock"
stop_server TERM
cmp "$T/new.img" "$T/disk.img" || fail "data written through Unix is not in the image"
[[ -S $T/act.sock ]] || fail "the server removed $T/act.sock, which systemd created"
ok "socket file left in place"
rm -f "$T/act.sock"

########################################################################
check "two activated sockets, Unix and TCP, with named exports"
random_file "$T/disk.img" 8
PORT=$(_free_port)
activate "$T/act.sock" "127.0.0.1:$PORT" -- -r disk="$T/disk.img"
run nbdinfo --size "nbd+unix:///disk?socket=$T/act.sock" | grep -qx 8388608 ||
    fail "Unix socket does not serve"
run nbdinfo --size "nbd://127.0.0.1:$PORT/disk" | grep -qx 8388608 ||
    fail "TCP socket does not serve"
grep -q "ready (socket-activated): unix $T/act.sock, tcp 127.0.0.1:$PORT" \
    "$T/server.log" || fail "both sockets not described in the log"
stop_server TERM
rm -f "$T/act.sock"

########################################################################
check "activated sockets and --unix/--port/--bind/--unix-mode: usage error"
for opt in "--unix $T/other.sock" "--port 10809" "--bind 127.0.0.1" \
    "--unix-mode 0600"; do
    # shellcheck disable=SC2086
    activate "$T/act.sock" -- $opt "$T/disk.img"
    # The connection starts the server, which refuses to run.
    run nbdinfo --size "nbd+unix:///?socket=$T/act.sock" >/dev/null 2>&1 &&
        fail "a client was served despite ${opt%% *}"
    wait_exit 1
    grep -q -- "${opt%% *} cannot be used with socket activation" "$T/server.log" ||
        fail "no clear message for ${opt%% *}: $(cat "$T/server.log")"
    [[ ! -e $T/other.sock ]] || fail "--unix socket created anyway"
    rm -f "$T/act.sock"
done
ok "exit status 1 with a clear message"

########################################################################
check "a bad activation environment is refused"
# bash's $$ becomes blockport's pid through exec.
for case in "abc:not a number" "17:at most 16 sockets" "1:fd 3 is not a socket"; do
    fds=${case%%:*} want=${case#*:}
    rc=0
    LISTEN_FDS=$fds bash -c 'export LISTEN_PID=$$; exec "$@" 3</dev/null' _ \
        "$BLOCKPORT" serve "$T/disk.img" >"$T/server.log" 2>&1 || rc=$?
    [[ $rc -eq 1 ]] || fail "LISTEN_FDS=$fds: exit status $rc, expected 1"
    grep -q "$want" "$T/server.log" || fail "LISTEN_FDS=$fds: $(cat "$T/server.log")"
    check_sanitizer_reports "$T/server.log"
done
# LISTEN_PID of another process: not ours, ignored (serves on --unix).
LISTEN_PID=1 LISTEN_FDS=1 start_server "$T/disk.img"
run nbdinfo --size "$URI" >/dev/null || fail "LISTEN_PID=1 was not ignored"
stop_server TERM
ok "malformed ones exit 1 with a message, another process's are ignored"

########################################################################
check "children inherit no LISTEN_* nor NOTIFY_SOCKET (nbdkit sh plugin)"
if has_feature plugins &&
    [[ -e $(pkg-config --variable=plugindir nbdkit 2>/dev/null)/nbdkit-sh-plugin.so ]]; then
    cat >"$T/plug.sh" <<'SH'
#!/bin/bash
case "$1" in
  config_complete) { echo "ENVLOG=$ENVLOG"; env | grep -E '^(LISTEN_|NOTIFY_SOCKET)' || :; } >"$ENVLOG" ;;
  get_size) echo 1048576 ;;
  open) echo "" ;;
  pread) head -c "$3" /dev/zero ;;
  *) exit 2 ;;
esac
SH
    chmod +x "$T/plug.sh"
    PORT=$(_free_port)
    ENVLOG=$T/envlog NOTIFY_SOCKET=@blockport-none-$$ activate "127.0.0.1:$PORT" -- --plugin sh "$T/plug.sh"
    run nbdinfo --size "nbd://127.0.0.1:$PORT" | grep -qx 1048576 ||
        fail "sh plugin not served"
    stop_server TERM
    grep -q "^ENVLOG=$T/envlog" "$T/envlog" || fail "the plugin script did not run"
    if grep -E '^(LISTEN_|NOTIFY_SOCKET)' "$T/envlog"; then
        fail "LISTEN_* or NOTIFY_SOCKET reached a child"
    fi
    ok "the plugin's script saw neither"
else
    echo "  (no nbdkit plugins in blockport, or nbdkit sh plugin not installed: not checked)"
fi

########################################################################
# Readiness notification: a datagram listener as NOTIFY_SOCKET.
cat >"$T/notify.py" <<'PY'
import socket, sys
addr, out, target = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("\0" + addr[1:] if addr.startswith("@") else addr)
s.settimeout(120)

def connect_now():
    # At READY=1 the server must accept at once: one try, no retry.
    c = socket.socket(socket.AF_UNIX)
    try:
        c.connect(target)
        greeting = b""
        while len(greeting) < 8:
            b = c.recv(8 - len(greeting))
            if not b:
                break
            greeting += b
        return "ok" if greeting == b"NBDMAGIC" else repr(greeting)
    except OSError as e:
        return str(e)
    finally:
        c.close()

with open(out, "a", buffering=1) as f:
    f.write("bound\n")
    while True:
        lines = s.recv(4096).decode().split("\n")
        for line in lines:
            f.write("msg " + line + "\n")
        if "READY=1" in lines and target != "-":
            f.write("connect at READY: " + connect_now() + "\n")
        if "STOPPING=1" in lines:
            break
PY

# listen_notify ADDR TARGET: start the listener, wait until it is bound.
listen_notify() {
    : >"$T/notify.out"
    "$PY" "$T/notify.py" "$1" "$T/notify.out" "$2" 2>>"$T/notify.out" &
    NOTIFY_PID=$!
    track_pid "$NOTIFY_PID"
    wait_for_line bound
}

# wait_for_line LINE: LINE appears in the listener's output within 10 s.
wait_for_line() {
    wait_until 10 grep -qxF -- "$1" "$T/notify.out" ||
        fail "notify listener: no '$1' within 10 s: $(cat "$T/notify.out")"
}

check "NOTIFY_SOCKET (path): READY=1 once accepting, STOPPING=1 at SIGTERM"
listen_notify "$T/notify.sock" "$T/sock"
NOTIFY_SOCKET=$T/notify.sock start_server "$T/disk.img"
wait_for_line "msg READY=1"
wait_for_line "connect at READY: ok"
wait_for_line "msg STATUS=Serving 1 export on unix $T/sock"
ok "READY=1 with a status, and the server accepted at once"
run nbdinfo --size "$URI" | grep -qx 8388608 || fail "nbdinfo after READY=1"
grep -q "^msg STOPPING=1" "$T/notify.out" && fail "STOPPING=1 before SIGTERM"
stop_server TERM
wait_for_line "msg STOPPING=1"
wait "$NOTIFY_PID" || fail "notify listener failed: $(cat "$T/notify.out")"
ok "STOPPING=1 at SIGTERM"

check "NOTIFY_SOCKET with --config: SIGHUP sends RELOADING=1, then READY=1"
printf '[export a]\npath = %s\n' "$T/disk.img" >"$T/exports.conf"
rm -f "$T/notify.sock"
listen_notify "$T/notify.sock" -
NOTIFY_SOCKET=$T/notify.sock start_server --config "$T/exports.conf"
wait_for_line "msg STATUS=Serving 1 export on unix $T/sock"
printf '[export b]\npath = null:1M\n' >>"$T/exports.conf"
kill -HUP "$SERVER_PID"
wait_for_line "msg RELOADING=1"
wait_for_line "msg STATUS=Serving 2 exports"
[[ $(grep -c "^msg READY=1" "$T/notify.out") -eq 2 ]] ||
    fail "expected READY=1 at startup and after the reload: $(cat "$T/notify.out")"
stop_server TERM
wait_for_line "msg STOPPING=1"
wait "$NOTIFY_PID" || fail "notify listener failed: $(cat "$T/notify.out")"
ok "RELOADING=1, READY=1 and the new export count"

check "NOTIFY_SOCKET (abstract '@') with socket activation"
name="@blockport-test-$$-$RANDOM"
listen_notify "$name" -
PORT=$(_free_port)
NOTIFY_SOCKET=$name activate "127.0.0.1:$PORT" -- "$T/disk.img"
run nbdinfo --size "nbd://127.0.0.1:$PORT" | grep -qx 8388608 ||
    fail "nbdinfo through the activated socket"
# (That READY=1 comes only once clients are accepted is checked above.)
wait_for_line "msg READY=1"
wait_for_line "msg STATUS=Serving 1 export on tcp 127.0.0.1:$PORT"
stop_server TERM
wait_for_line "msg STOPPING=1"
wait "$NOTIFY_PID" || fail "notify listener failed: $(cat "$T/notify.out")"
ok "READY=1, STATUS and STOPPING=1 through an abstract socket"

check "a bad or absent NOTIFY_SOCKET is logged and does not stop the server"
for ns in "relative/notify" "$T/nobody-listens"; do
    NOTIFY_SOCKET=$ns start_server "$T/disk.img"
    run nbdinfo --size "$URI" | grep -qx 8388608 || fail "NOTIFY_SOCKET=$ns: not serving"
    stop_server TERM
    grep -q "NOTIFY_SOCKET" "$T/server.log" || fail "NOTIFY_SOCKET=$ns: no warning"
    : >"$T/server.log"
done
ok "served, with a warning"

########################################################################
check "unit files (contrib/systemd/): systemd-analyze verify is clean"
if command -v systemd-analyze >/dev/null 2>&1; then
    src=$(cd "$(dirname "$0")/../../contrib/systemd" && pwd)
    mkdir -p "$T/units"
    for u in blockport@.service blockport.service; do
        sed "s|@CMAKE_INSTALL_FULL_BINDIR@/blockport|$BLOCKPORT|" \
            "$src/$u.in" >"$T/units/$u"
    done
    cp "$src/blockport.socket" "$T/units/"
    cp "$T/units/blockport@.service" "$T/units/blockport@demo.service"
    # --man=no: Documentation= names pages installed with the package, not
    # here (contrib/package-check.sh verifies the installed units with them).
    out=$(cd "$T/units" && systemd-analyze verify --man=no ./blockport@demo.service \
        ./blockport.service ./blockport.socket 2>&1) ||
        fail "systemd-analyze verify failed: $out"
    [[ -z $out ]] || fail "systemd-analyze verify: $out"
    grep -q '^Type=notify$' "$T/units/blockport.service" ||
        fail "blockport.service is not Type=notify"
    ok "no warnings"
else
    echo "  (systemd-analyze not installed: not checked)"
fi
