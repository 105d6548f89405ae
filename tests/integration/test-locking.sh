#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Image locks that QEMU honours: blockport and QEMU's tools (qemu-img,
# qemu-io, qemu-nbd) refuse each other's images in use for writing, with
# their usual messages, unless a reader passes -U; readers share; backing
# files are shared by two overlays served by two processes; kill -9 and a
# config reload that drops an image release its lock, a reload that keeps
# it keeps it.  Every image is checked by qemu-img check afterwards.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io qemu-nbd
cd "$T"

# Serve in the background on socket NAME.sock; wait for its pid file.
# Sets BG_PID.  Fails the test if it does not start.
bg_serve() {
    local name=$1
    shift
    rm -f "$T/$name.pid"
    "$BLOCKPORT" serve -u "$T/$name.sock" -P "$T/$name.pid" "$@" \
        >"$T/$name.log" 2>&1 &
    BG_PID=$!
    track_pid "$BG_PID"
    wait_file 20 "$T/$name.pid" "$BG_PID" && return 0
    _pid_alive "$BG_PID" || { cat "$T/$name.log"; fail "$name did not start"; }
    fail "$name: no pid file after 20 s"
}

# Stop a background process and wait until it is gone.
bg_stop() {
    kill -"${2:-TERM}" "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    wait_until 30 _pid_gone "$1" || fail "process $1 did not exit"
}

# Start qemu-nbd serving ARGS on q.sock; sets QPID.
start_qemu_nbd() {
    rm -f "$T/q.sock" "$T/q.pid"
    qemu-nbd -k "$T/q.sock" --pid-file "$T/q.pid" "$@" 2>qemu-nbd.log &
    QPID=$!
    track_pid "$QPID"
    # Its socket is there before the image is open (and locked); the pid
    # file comes after.
    wait_file 20 "$T/q.pid" "$QPID" && return 0
    _pid_alive "$QPID" || { cat qemu-nbd.log; grep . /proc/locks; fail "qemu-nbd exited"; }
    fail "qemu-nbd did not start"
}

# expect_refused WHAT PATTERN CMD...: CMD exits 1 with PATTERN in stderr.
expect_refused() {
    local what=$1 pattern=$2 rc=0
    shift 2
    # A command that wrongly succeeds (a server) must not hang the test.
    timeout 30 "$@" >out.txt 2>err.txt </dev/null || rc=$?
    if [[ $rc -ne 1 ]] || ! grep -q -- "$pattern" err.txt; then
        cat err.txt
        fail_soft "$what: exit $rc (expected 1 and /$pattern/)"
        return
    fi
    ok "$what: refused: $(head -c 160 err.txt | tr '\n' ' ')"
}

# expect_ok WHAT CMD...
expect_ok() {
    local what=$1 rc=0
    shift
    timeout 60 "$@" >out.txt 2>err.txt </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then
        cat err.txt
        fail_soft "$what: exit $rc (expected 0)"
        return
    fi
    ok "$what"
}

qemu-img create -q -f qcow2 disk.qcow2 64M
qemu-io -f qcow2 -c 'write -P 0x5a 0 1M' disk.qcow2 >/dev/null

check "blockport serving read-write: QEMU's tools refuse unless -U"
bg_serve rw -f qcow2 disk.qcow2
expect_refused "qemu-img info" 'Failed to get shared "write" lock' qemu-img info disk.qcow2
expect_ok "qemu-img info -U" qemu-img info -U disk.qcow2
expect_refused "qemu-io write" 'Failed to get "write" lock' qemu-io -f qcow2 -c 'write 0 512' disk.qcow2
expect_ok "qemu-io -r -U read" qemu-io -r -U -f qcow2 -c 'read -P 0x5a 0 1M' disk.qcow2
expect_refused "qemu-nbd" 'Failed to get "write" lock' qemu-nbd -k "$T/q0.sock" -f qcow2 disk.qcow2

check "blockport serving read-write: a second blockport is refused, naming the file"
expect_refused "second serve" 'disk.qcow2: Failed to get "write" lock' \
    "$BLOCKPORT" serve -u "$T/x.sock" disk.qcow2
expect_refused "second serve --readonly" 'disk.qcow2: Failed to get shared "write" lock' \
    "$BLOCKPORT" serve -u "$T/x.sock" --readonly disk.qcow2
if has_feature fuse; then
    expect_refused "mount" 'Failed to get "write" lock' \
        "$BLOCKPORT" mount --foreground disk.qcow2 "$T/mnt.file"
fi
for tool in info map check; do
    expect_refused "$tool" 'Failed to get shared "write" lock' "$BLOCKPORT" "$tool" disk.qcow2
    expect_ok "$tool -U" "$BLOCKPORT" "$tool" -U disk.qcow2
done
expect_refused "convert source" 'Failed to get shared "write" lock' \
    "$BLOCKPORT" convert -O raw disk.qcow2 copy.raw
expect_ok "convert -U" "$BLOCKPORT" convert -U -O raw disk.qcow2 copy.raw
expect_refused "convert onto it" 'Failed to get' \
    "$BLOCKPORT" convert -O qcow2 copy.raw disk.qcow2
expect_refused "create over it" 'Failed to get' \
    "$BLOCKPORT" create -f qcow2 disk.qcow2 1M
expect_refused "check --repair -U" 'force-share' \
    "$BLOCKPORT" check -U --repair all disk.qcow2
expect_refused "serve -U without --readonly" 'force-share' \
    "$BLOCKPORT" serve -u "$T/x.sock" -U disk.qcow2
bg_serve ro-share --readonly -U disk.qcow2
ok "serve --readonly -U starts beside the writer"
bg_stop "$BG_PID"
nbdsh_write=$(cat <<'EOF'
h.pwrite(b"\x77" * 65536, 1 << 20)
h.flush()
EOF
)
"$PY" -c "
import nbd
h = nbd.NBD()
h.connect_uri('nbd+unix:///?socket=$T/rw.sock')
$nbdsh_write
h.shutdown()
" || fail "write through the server"
bg_stop "$(cat rw.pid)"
qemu-img check -q disk.qcow2 || fail "qemu-img check after serving"
qemu-io -f qcow2 -c 'read -P 0x77 1M 64k' disk.qcow2 | grep -q 'read 65536' ||
    fail "the write is not in the image"
ok "the image is intact and holds the write (qemu-img check clean)"

check "QEMU holding the image: blockport refuses, readers share"
start_qemu_nbd -f qcow2 disk.qcow2
expect_refused "serve beside qemu-nbd" 'disk.qcow2: Failed to get "write" lock' \
    "$BLOCKPORT" serve -u "$T/x.sock" disk.qcow2
expect_refused "info beside qemu-nbd" 'Failed to get shared "write" lock' \
    "$BLOCKPORT" info disk.qcow2
expect_ok "info -U beside qemu-nbd" "$BLOCKPORT" info -U disk.qcow2
bg_stop "$QPID"
qemu-io -r -f qcow2 -c 'sleep 3000' disk.qcow2 >/dev/null &
rpid=$!
track_pid "$rpid"
wait_until 20 grep -q "disk.qcow2\|$(stat -c %i disk.qcow2)" /proc/locks || fail "qemu-io took no lock"
bg_serve ro --readonly disk.qcow2
ok "serve --readonly shares with a qemu-io reader"
expect_refused "serve read-write beside a reader" 'Failed to get "write" lock' \
    "$BLOCKPORT" serve -u "$T/x.sock" disk.qcow2
bg_stop "$BG_PID"
bg_stop "$rpid"

check "a backing file shared by two overlays served by two processes"
qemu-img create -q -f qcow2 -b disk.qcow2 -F qcow2 a.qcow2
qemu-img create -q -f qcow2 -b disk.qcow2 -F qcow2 b.qcow2
bg_serve ova a.qcow2
pa=$BG_PID
bg_serve ovb b.qcow2
pb=$BG_PID
ok "two servers on two overlays of one base"
expect_refused "serve the base read-write" 'disk.qcow2: Failed to get' \
    "$BLOCKPORT" serve -u "$T/x.sock" disk.qcow2
expect_refused "qemu-io write to the base" 'Failed to get "write" lock' \
    qemu-io -f qcow2 -c 'write 0 512' disk.qcow2
expect_ok "qemu-img info of the base (a reader)" qemu-img info disk.qcow2
bg_stop "$pa"
bg_stop "$pb"

check "kill -9 releases the lock"
bg_serve k disk.qcow2
bg_stop "$BG_PID" KILL
expect_ok "qemu-io writes after the kill" qemu-io -f qcow2 -c 'write -P 0x33 2M 4k' disk.qcow2
qemu-img check -q disk.qcow2 || fail "qemu-img check after kill -9"

check "a raw image served read-write is locked too"
qemu-img create -q -f raw disk.raw 16M
bg_serve raw -f raw disk.raw
expect_refused "qemu-io write to the raw image" 'Failed to get' \
    qemu-io -f raw -c 'write 0 512' disk.raw
bg_stop "$BG_PID"

check "a reload keeps the lock of an image it keeps, releases one it drops"
cat >exports.conf <<EOF
[export disk]
path = disk.qcow2
format = qcow2
EOF
bg_serve cfg --config exports.conf
cpid=$BG_PID
sed -i 's/^format = qcow2/format = qcow2\ndescription = reloaded/' exports.conf
kill -HUP "$cpid"
wait_until 20 grep -q "reload" cfg.log || { cat cfg.log; fail "no reload in the log"; }
expect_refused "qemu-img info after a reload that keeps the image" \
    'Failed to get shared "write" lock' qemu-img info disk.qcow2
# Read-only -> read-write on reload, with nobody connected: the image is
# reopened and locked for writing.
cat >exports.conf <<EOF
[export disk]
path = disk.qcow2
format = qcow2
read-only = yes
EOF
kill -HUP "$cpid"
reads() { qemu-io -r -f qcow2 -c 'read 0 512' disk.qcow2 >/dev/null 2>&1; }
wait_until 20 reads || { cat cfg.log; fail "a read-only reload still refuses readers"; }
ok "read-only after the reload: qemu-io -r reads"
sed -i '/read-only/d' exports.conf
kill -HUP "$cpid"
info_refused() { ! qemu-img info disk.qcow2 >/dev/null 2>&1; }
wait_until 20 info_refused ||
    { cat cfg.log; fail "read-write after the reload, yet qemu-img info opens it"; }
ok "read-write again after the reload: qemu-img info refused"
cat >exports.conf <<EOF
[export other]
path = memory:1M
EOF
kill -HUP "$cpid"
writes() { qemu-io -f qcow2 -c 'write 0 512' disk.qcow2 >/dev/null 2>&1; }
wait_until 20 writes || { cat cfg.log; fail "the dropped image stays locked"; }
ok "a reload that drops the image releases it"
bg_stop "$cpid"
qemu-img check -q disk.qcow2 || fail "qemu-img check at the end"
ok "qemu-img check clean"

