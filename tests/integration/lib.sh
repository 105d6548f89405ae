# SPDX-License-Identifier: BSD-3-Clause
# Shared helpers for blockport integration tests.  Source it from a test:
#
#   #!/bin/bash
#   source "$(dirname "$0")/lib.sh"
#   require qemu-img
#   start_server "$T/disk.img"
#   ...
#   stop_server
#
# Exit codes follow the automake/ctest convention: 0 pass, 1 fail, 77 skip.
# The binary under test is taken from $BLOCKPORT.
#
# Provides:
#   T            private temporary directory, removed on exit
#   PY           a python3 that has the libnbd "nbd" module (/usr/bin/python3)
#   require CMD...            skip (77) unless every CMD is available
#   fail MSG...               print MSG and exit 1
#   fail_soft MSG...          record a failure, keep going; the test exits 1
#                             at the end (use for independent checks)
#   skip MSG...               print MSG and exit 77 (the test's main case
#                             cannot run here)
#   skip_case MSG...          say that one sub-case is skipped, and why; the
#                             test goes on
#   check MSG...              print "CHECK: MSG" (what is being tested)
#   ok MSG...                 print "  ok: MSG"
#   run CMD...                print and run CMD with a timeout
#   start_server [ARGS...]    serve on a unix socket; sets SOCK URI SERVER_PID
#   start_server_tcp [ARGS...] serve on a free 127.0.0.1 port; sets PORT URI
#                             SERVER_PID
#   export_uri NAME           URI of export NAME on the current server
#   server_alive              true if the current server process still runs
#   stop_server [SIG]         SIGTERM (or SIG) the server, require exit
#                             status 0 (or $STOP_EXPECT) and no sanitizer
#                             report in its log
#   check_sanitizer_reports FILE  fail on ASan/LSan/UBSan/TSan reports in FILE
#   track_pid PID             kill PID and its descendants (and wait) on
#                             exit; whatever else the test started and left
#                             running is killed then too
#   wait_until SECONDS CMD... run CMD every 0.05 s until it succeeds (return
#                             0) or SECONDS (may be fractional) have passed
#                             (return 1); use it instead of sleeping
#   wait_file SECONDS FILE [PID]  wait until FILE is not empty (return 0),
#                             PID (if given) has exited or SECONDS passed
#                             (return 1)
#   kill_tree PID             SIGKILL PID and every descendant, even those in
#                             other sessions (fio's job processes), and reap
#   random_file FILE MIB      FILE of MIB MiB of random data
#   mute_server SOCKET        a Unix socket that accepts and never answers;
#                             each accepted connection adds a line to
#                             SOCKET.accepted
#   ceph_cluster_start [ARGS...]  skip (77) without the Ceph packages;
#                             start a throw-away cluster in $T/ceph
#                             (contrib/ceph-cluster.sh start, ARGS passed
#                             on), stopped on exit; exports CEPH_CONF and
#                             sets CEPH_DIR, CEPH_POOL
#   ceph_cluster CMD          contrib/ceph-cluster.sh CMD $CEPH_DIR
#                             (kill-osd, start-osd, kill-mon, start-mon,
#                             status, stop)
#   require_qemu_rbd          skip (77) unless qemu-img has the rbd driver
#                             (qemu-block-extra)
#   fio_verify URI            fio (nbd engine): 4 jobs write 8 MiB each of
#                             4k-64k random blocks 16 MiB apart, iodepth 16,
#                             and read them back (crc32c); fail on any error
#
# Everything is safe under `set -euo pipefail`.

# shellcheck shell=bash disable=SC2034
set -euo pipefail

# Reset so "set -u" is happy and the caller's environment cannot leak in.
SERVER_PID=
SOCK=
PORT=
URI=
_TRACKED_PIDS=()
CEPH_DIR=
CEPH_POOL=
declare -A _TRACKED_START=()
_SOFT_FAILURES=()

PY=/usr/bin/python3
# Timeout (seconds) for individual client commands run through `run`.
: "${CMD_TIMEOUT:=120}"
# Seconds to wait for the server's pid file.
: "${SERVER_START_TIMEOUT:=10}"
# Seconds to wait for the server to exit after SIGTERM.
: "${SERVER_STOP_TIMEOUT:=30}"

_lib_name=$(basename "$0")

fail() {
    echo "FAIL [$_lib_name]: $*" >&2
    exit 1
}

fail_soft() {
    echo "FAIL (continuing) [$_lib_name]: $*" >&2
    _SOFT_FAILURES+=("$*")
}

skip() {
    echo "SKIP [$_lib_name]: $*" >&2
    exit 77
}

# A sub-case that cannot run here: said on stdout (beside the CHECK lines)
# and stderr, so a reader of either sees what was not tested.
skip_case() {
    echo "  SKIP (this case only): $*"
    echo "SKIP (one case) [$_lib_name]: $*" >&2
}

check() {
    echo "CHECK: $*"
}

ok() {
    echo "  ok: $*"
}

# Is PID a live (non-zombie) process?  No subshell: wait_until calls it often.
_pid_alive() {
    local pid=$1 line state
    [[ -n $pid ]] || return 1
    read -r line 2>/dev/null <"/proc/$pid/stat" || return 1
    # Field 3 of /proc/PID/stat is the state; the command name (field 2)
    # may contain spaces, so strip up to the last ')'.
    state=${line##*) }
    state=${state%% *}
    [[ -n $state && $state != Z && $state != X ]]
}

server_alive() {
    _pid_alive "$SERVER_PID"
}

# The start time is kept so that cleanup never signals a recycled pid.
track_pid() {
    local line
    local -a fld=()
    read -r line 2>/dev/null <"/proc/$1/stat" && read -ra fld <<<"${line##*) }"
    _TRACKED_PIDS+=("$1")
    _TRACKED_START[$1]=${fld[19]:-gone}
}

_pid_gone() {
    ! _pid_alive "$1"
}

# _lock_range_free FILE START LEN: no open file holds an OFD lock on bytes
# [START, START+LEN) of FILE (F_OFD_GETLK, which takes no lock itself).
_lock_range_free() {
    "$PY" - "$@" <<'EOF'
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
start, length = int(sys.argv[2]), int(sys.argv[3])
fl = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
res = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, fl)
sys.exit(0 if struct.unpack("hh4xqqi4x", res)[0] == fcntl.F_UNLCK else 1)
EOF
}

# write_locked FILE: some process holds QEMU's lock byte for the write
# permission (101) of FILE, as qemu-io does once it has opened FILE
# read-write.  A test waits on this, not on `qemu-img info` failing: that
# info takes its own shared lock and, polled while qemu-io opens the image,
# makes qemu-io's open fail.
write_locked() {
    ! _lock_range_free "$1" 101 1
}

# file_unlocked FILE: no open file holds a QEMU-style lock byte (100-299)
# of FILE.  A process killed with in-flight io_uring requests keeps its OFD
# locks until the kernel tears the ring down, a moment after it is reaped.
file_unlocked() {
    _lock_range_free "$1" 100 200
}

# _NOW: microseconds since the epoch.  No subshell: see _children_of.
_now_us() {
    _NOW=${EPOCHREALTIME/[.,]/}
    _NOW=$((10#$_NOW))
}

wait_until() {
    local _wu_secs=$1 _wu_whole _wu_frac= _wu_deadline
    shift
    _wu_whole=${_wu_secs%%.*}
    [[ $_wu_secs == *.* ]] && _wu_frac=${_wu_secs#*.}
    _wu_frac=${_wu_frac}000000
    _now_us
    _wu_deadline=$((_NOW + 10#${_wu_whole:-0} * 1000000 + 10#${_wu_frac:0:6}))
    while :; do
        if "$@"; then
            return 0
        fi
        _now_us
        ((_NOW < _wu_deadline)) || break
        sleep 0.05
    done
    # One last try: the condition may have come true during the last nap.
    "$@"
}

_file_or_gone() {
    [[ -s $1 ]] || { [[ -n ${2:-} ]] && _pid_gone "$2"; }
}

wait_file() {
    wait_until "$1" _file_or_gone "$2" "${3:-}"
    [[ -s $2 ]]
}

# _children_of PID...: set _KIDS to the live descendants of the PIDs (not
# the PIDs themselves) and _START[pid] to their start times.  Pure bash, so
# that no helper process of ours turns up in the list.
_children_of() {
    local -A parent=()
    local f line pid
    local -a fld
    _START=()
    for f in /proc/[0-9]*/stat; do
        line=
        read -r line 2>/dev/null <"$f" || continue
        pid=${f#/proc/}
        pid=${pid%/stat}
        # Fields after the command name: state ppid ... starttime (22nd).
        read -ra fld <<<"${line##*) }"
        [[ ${fld[0]:-Z} == [ZX] ]] && continue
        parent[$pid]=${fld[1]:-}
        _START[$pid]=${fld[19]:-}
    done
    _KIDS=()
    local -a pending=("$@")
    local p c
    while ((${#pending[@]})); do
        p=${pending[0]}
        pending=("${pending[@]:1}")
        for c in "${!parent[@]}"; do
            if [[ ${parent[$c]} == "$p" ]]; then
                _KIDS+=("$c")
                pending+=("$c")
            fi
        done
    done
}
declare -A _START=()

# _same_process PID START: PID is still the process that started at START
# (not a recycled pid).
_same_process() {
    local line
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    local -a fld
    read -ra fld <<<"${line##*) }"
    [[ ${fld[19]:-} == "$2" ]]
}

# SIGKILL PID and all its descendants.  They are stopped first, until no new
# one appears, so that none forks or leaves unnoticed while we look; fio's
# job processes call setsid(), so killing a process group is not enough.
kill_tree() {
    local root=$1 n=-1 p
    [[ -n $root ]] || return 0
    local -a all=("$root")
    while ((${#all[@]} != n)); do
        n=${#all[@]}
        for p in "${all[@]}"; do kill -STOP "$p" 2>/dev/null || true; done
        _children_of "$root"
        all=("$root" "${_KIDS[@]}")
    done
    for p in "${all[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait "$root" 2>/dev/null || true
}

# _stop_pid PID: SIGTERM, then after 2 s SIGKILL for whatever is left of
# it and of the processes it had started (even those orphaned meanwhile).
_stop_pid() {
    local p=$1 q
    _children_of "$p"
    local -a tree=("${_KIDS[@]}")
    local -A start=()
    for q in "${tree[@]}"; do start[$q]=${_START[$q]}; done
    kill -TERM "$p" 2>/dev/null || true
    wait_until 2 _pid_gone "$p" || true
    kill_tree "$p"
    for q in "${tree[@]}"; do
        if _same_process "$q" "${start[$q]}"; then
            kill -KILL "$q" 2>/dev/null || true
        fi
    done
}

# Whatever the test started and left running: named, then killed.
_reap_leftovers() {
    local p cmd
    _children_of $$
    ((${#_KIDS[@]})) || return 0
    for p in "${_KIDS[@]}"; do
        local -a argv=()
        mapfile -d '' -t argv 2>/dev/null <"/proc/$p/cmdline" || true
        cmd="${argv[*]}"
        echo "cleanup: killing leftover process $p ($cmd)" >&2
        kill -STOP "$p" 2>/dev/null || true
    done
    _children_of $$
    for p in "${_KIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${_KIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

_dump_log() {
    if [[ -n ${T:-} && -s $T/server.log ]]; then
        echo "---- server log ($T/server.log, last 60 lines) ----" >&2
        tail -n 60 "$T/server.log" >&2 || true
        echo "---- end of server log ----" >&2
    fi
}

_cleanup() {
    local rc=$?
    set +e
    if [[ ${#_SOFT_FAILURES[@]} -gt 0 && ( $rc -eq 0 || $rc -eq 77 ) ]]; then
        echo "FAIL [$_lib_name]: ${#_SOFT_FAILURES[@]} check(s) failed:" >&2
        printf '  - %s\n' "${_SOFT_FAILURES[@]}" >&2
        rc=1
    fi
    _ceph_cleanup
    local p
    for p in "${_TRACKED_PIDS[@]}"; do
        if _same_process "$p" "${_TRACKED_START[$p]}"; then
            _stop_pid "$p"
        fi
    done
    if [[ -n $SERVER_PID ]] && _pid_alive "$SERVER_PID"; then
        kill -TERM "$SERVER_PID" 2>/dev/null
        wait_until 5 _pid_gone "$SERVER_PID"
        _pid_alive "$SERVER_PID" && kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    _reap_leftovers
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        _dump_log
    fi
    if [[ -n ${T:-} && -d $T ]]; then
        if [[ -n ${KEEP_TMP:-} ]]; then
            echo "keeping $T" >&2
        else
            rm -rf "$T"
        fi
    fi
    exit $rc
}

T=$(mktemp -d "${TMPDIR:-/tmp}/blockport-it.XXXXXX")
trap _cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

require() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || skip "required command '$c' not found"
    done
}

require_py_nbd() {
    [[ -x $PY ]] || skip "$PY not found"
    "$PY" -c 'import nbd' 2>/dev/null || skip "$PY lacks the nbd (libnbd) module"
}

if [[ -z ${BLOCKPORT:-} ]]; then
    skip "BLOCKPORT is not set"
fi
if [[ ! -x $BLOCKPORT || -d $BLOCKPORT ]]; then
    skip "BLOCKPORT=$BLOCKPORT is not an executable file"
fi

# The optional parts blockport was built with (core/features.h), as
# `blockport --version` lists them: "rbd fuse vhost plugins tls io_uring".
BUILT_WITH=" $("$BLOCKPORT" --version | sed -n 's/^built with: //p') "
# has_feature PART: whether it was built in.
has_feature() {
    [[ $BUILT_WITH == *" $1 "* ]]
}
# can_mount: blockport mount can run here (built with FUSE, /dev/fuse,
# fusermount3).
can_mount() {
    has_feature fuse && [[ -c /dev/fuse ]] && command -v fusermount3 >/dev/null
}
# command_part CMD: the optional part the command needs, if any.
command_part() {
    case $1 in
    mount) echo fuse ;;
    vhost) echo vhost ;;
    esac
}
# require_feature PART...: skip (77) unless each was built in.
require_feature() {
    local f
    for f in "$@"; do
        has_feature "$f" || skip "blockport was built without $f"
    done
}

# nbdsh runs "python3 -m nbd" with whatever python3 comes first on PATH,
# which may be one without the libnbd bindings.  Shadow it with a wrapper
# that uses $PY.
if [[ -x $PY ]] && command -v nbdsh >/dev/null 2>&1; then
    mkdir -p "$T/bin"
    printf '#!/bin/bash\nexec -a nbdsh %q -m nbd "$@"\n' "$PY" >"$T/bin/nbdsh"
    chmod +x "$T/bin/nbdsh"
    PATH=$T/bin:$PATH
fi

run() {
    echo "+ $*" >&2
    timeout --kill-after=5 "$CMD_TIMEOUT" "$@"
}

# Start the server in the background.  Arguments after the common ones are
# passed through (options and images).  SIGINT/SIGQUIT are reset to their
# default dispositions: a non-interactive shell would otherwise start
# background jobs with them ignored.
_env_reset=()
if env --default-signal=INT true 2>/dev/null; then
    # shellcheck disable=SC2054
    _env_reset=(env --default-signal=INT,QUIT)
fi

# _launch ADDR_ARGS... -- SERVE_ARGS...
_launch() {
    local -a addr=()
    while [[ $1 != -- ]]; do addr+=("$1"); shift; done
    shift
    rm -f "$T/pid"
    echo "+ $BLOCKPORT serve ${addr[*]} --pid-file $T/pid $*" | tee -a "$T/server.log"
    "${_env_reset[@]}" "$BLOCKPORT" serve "${addr[@]}" --pid-file "$T/pid" "$@" \
        </dev/null >>"$T/server.log" 2>&1 &
    SERVER_PID=$!
}

# Wait for the pid file.  Returns 0 when up, 1 if the server died, fails the
# test on timeout.
_started_or_dead() {
    [[ -s $T/pid ]] || _pid_gone "$SERVER_PID"
}

_wait_started() {
    local rc
    if ! wait_until "$SERVER_START_TIMEOUT" _started_or_dead; then
        _dump_log
        fail "server did not write its pid file within ${SERVER_START_TIMEOUT}s"
    fi
    [[ -s $T/pid ]] && return 0
    rc=0
    wait "$SERVER_PID" || rc=$?
    echo "server exited with status $rc before writing its pid file" >&2
    SERVER_PID=
    return 1
}

_pid_file_is_server() {
    [[ $(tr -d '[:space:]' <"$T/pid") == "$SERVER_PID" ]]
}

# The pid file may be caught half written: give it a moment to complete.
_check_pid_file() {
    wait_until 2 _pid_file_is_server ||
        fail "pid file contains '$(cat "$T/pid")', expected server pid $SERVER_PID"
}

start_server() {
    [[ -z $SERVER_PID ]] || fail "start_server: a server is already running"
    SOCK=$T/sock
    PORT=
    _launch --unix "$SOCK" -- "$@"
    if ! _wait_started; then
        _dump_log
        fail "server failed to start"
    fi
    _check_pid_file
    [[ -S $SOCK ]] || fail "pid file written but $SOCK is not a socket"
    URI="nbd+unix:///?socket=$SOCK"
}

_free_port() {
    "$PY" - <<'EOF'
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

start_server_tcp() {
    [[ -z $SERVER_PID ]] || fail "start_server_tcp: a server is already running"
    SOCK=
    local attempt
    for attempt in 1 2 3 4 5; do
        PORT=$(_free_port)
        _launch --bind 127.0.0.1 --port "$PORT" -- "$@"
        if _wait_started; then
            _check_pid_file
            URI="nbd://127.0.0.1:$PORT"
            return 0
        fi
        echo "server failed to start on port $PORT (attempt $attempt)" >&2
        cat "$T/server.log" >&2
    done
    fail "could not start a TCP server"
}

# URI of a named export on the running server.
export_uri() {
    local name=$1
    if [[ -n $SOCK ]]; then
        echo "nbd+unix:///$name?socket=$SOCK"
    else
        echo "nbd://127.0.0.1:$PORT/$name"
    fi
}

# Send SIGNAL (default TERM) and require exit status 0 within the timeout.
stop_server() {
    local sig=${1:-TERM}
    [[ -n $SERVER_PID ]] || fail "stop_server: no server running"
    _pid_alive "$SERVER_PID" || {
        local rc=0
        wait "$SERVER_PID" || rc=$?
        SERVER_PID=
        _dump_log
        fail "server died before stop_server (exit status $rc)"
    }
    kill -"$sig" "$SERVER_PID"
    if ! wait_until "$SERVER_STOP_TIMEOUT" _pid_gone "$SERVER_PID"; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=
        _dump_log
        fail "server did not exit within ${SERVER_STOP_TIMEOUT}s of SIG$sig"
    fi
    local rc=0
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=
    local want=${STOP_EXPECT:-0}
    if [[ $rc -ne $want ]]; then
        _dump_log
        fail "server exited with status $rc after SIG$sig (expected $want)"
    fi
    check_sanitizer_reports "$T/server.log"
    ok "server exited with status $rc after SIG$sig"
}

# check_sanitizer_reports FILE: fail if FILE holds an ASan/LSan/UBSan/TSan
# report (UBSan and halt_on_error=0 builds keep running after a report).
check_sanitizer_reports() {
    if grep -qE 'ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:|WARNING: ThreadSanitizer' "$1"; then
        grep -nE -A20 'ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:|WARNING: ThreadSanitizer' "$1" | head -60 >&2
        fail "sanitizer report in $1"
    fi
}

# qio_completed FILE N: qemu-io's output in FILE reports N transfers done
# in full ("read 4096/4096 bytes", "wrote ..."), and nothing failed: the
# absence of a failure message alone also passes a run that did nothing.
qio_completed() {
    local done
    done=$(grep -cE '^(read|wrote) ([0-9]+)/\2 bytes' "$1" || true)
    [[ $done -eq $2 ]] && ! grep -qiE 'failed|error' "$1"
}

# random_file FILE MIB
random_file() {
    head -c "$(($2 * 1024 * 1024))" /dev/urandom >"$1"
}

fio_verify() {
    cat >"$T/verify.fio" <<EOF
[global]
ioengine=nbd
uri=$1
rw=randwrite
bs=4k-64k
iodepth=16
numjobs=4
size=8M
offset_increment=16M
verify=crc32c
do_verify=1
verify_fatal=1
[v]
EOF
    (cd "$T" && run fio --output="$T/fio.out" "$T/verify.fio") ||
        { cat "$T/fio.out"; fail "fio verify on $1"; }
}

_CEPH_SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../contrib" && pwd)/ceph-cluster.sh

require_qemu_rbd() {
    require qemu-img
    qemu-img --help 2>/dev/null | grep -q '^Supported formats:.* rbd' ||
        skip "qemu-img has no rbd driver (package qemu-block-extra)"
}

ceph_cluster() {
    [[ -n $CEPH_DIR ]] || fail "ceph_cluster $1: no cluster started"
    echo "+ ceph-cluster.sh $1 $CEPH_DIR" >&2
    "$_CEPH_SCRIPT" "$1" "$CEPH_DIR" "${@:2}"
}

# The daemons detach from us: cleanup kills them by their pid files.  The
# directory stays in $T (KEEP_TMP=1 keeps the logs).
_ceph_cleanup() {
    [[ -n $CEPH_DIR && -d $CEPH_DIR ]] || return 0
    "$_CEPH_SCRIPT" stop "$CEPH_DIR" --keep ||
        echo "cleanup: ceph-cluster.sh stop $CEPH_DIR failed" >&2
}

ceph_cluster_start() {
    require ceph-mon ceph-osd ceph-authtool monmaptool ceph rbd
    [[ -z $CEPH_DIR ]] || fail "ceph_cluster_start: a cluster is already running"
    # A port found free can be taken by a parallel test before the
    # monitor binds it ("Address already in use"): a new cluster, on new
    # ports, is tried then, three times at most.
    local attempt
    for attempt in 1 2 3; do
        CEPH_DIR=$T/ceph
        echo "+ ceph-cluster.sh start $CEPH_DIR $*" >&2
        "$_CEPH_SCRIPT" start "$CEPH_DIR" "$@" >"$T/ceph-start.out" && break
        tail -n 30 "$CEPH_DIR"/log/*.log >&2 2>/dev/null || true
        local raced=
        grep -qs "Address already in use" "$CEPH_DIR"/log/*.log && raced=1
        "$_CEPH_SCRIPT" stop "$CEPH_DIR" --keep >/dev/null 2>&1 || true
        [[ -n $raced && $attempt -lt 3 ]] || fail "could not start a Ceph cluster"
        mv "$CEPH_DIR" "$T/ceph.failed.$attempt"
        echo "  Ceph cluster start $attempt lost a port race; again" >&2
    done
    CEPH_POOL=$(<"$CEPH_DIR/pool")
    export CEPH_CONF=$CEPH_DIR/ceph.conf
}

# mute_server SOCKET: a Unix socket that accepts and then says nothing, as
# a hung server (stopped at cleanup).  Each connection it accepts adds a
# line to SOCKET.accepted, so a test can wait for the client to arrive.
mute_server() {
    "$PY" -c '
import signal, socket, sys
signal.alarm(600)
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
held = []
with open(sys.argv[1] + ".accepted", "a") as log:
    while True:
        held.append(s.accept()[0])
        log.write("accepted\n")
        log.flush()' "$1" &
    track_pid $!
    wait_until 5 test -S "$1" || fail "mute_server: no socket at $1"
}
