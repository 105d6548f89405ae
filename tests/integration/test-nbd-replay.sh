#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Lossless, invisible restarts of the server behind an NBD source
# (formats/nbd.c's replay log).  A front `blockport serve` exports
# nbd+unix:///?socket=up.sock, served by an upstream `blockport serve` of a
# qcow2 image, which keeps new clusters' metadata in its cache until a
# flush.  A client writes and zeroes through the front while the upstream
# is killed (-9) and restarted, three times: the client sees no error and
# reads back what it wrote, and the image holds every acknowledged write
# (qemu-img compare), leaks only (qemu-img check).  With the bound tiny,
# the flush after a loss fails and the log says how many bytes were past
# it.  An upstream back with another size, or without the export, fails
# requests and gets nothing replayed.
# The same restarts under a mount of the NBD URI.
source "$(dirname "$0")/lib.sh"
require qemu-img
require_py_nbd
HERE=$(dirname "$(readlink -f "$0")")
cd "$T"
UP="nbd+unix:///?socket=$T/up.sock"
UP_PID=

start_up() { # IMAGE...
  rm -f up.pid
  "$BLOCKPORT" serve --unix "$T/up.sock" --pid-file "$T/up.pid" "$@" \
    2>>up.log &
  UP_PID=$!
  track_pid $UP_PID
  wait_file 10 up.pid $UP_PID || { cat up.log; fail "upstream did not start"; }
}

kill_up() {
  kill -KILL $UP_PID
  wait $UP_PID 2>/dev/null || true
}

# check_image IMAGE EXPECT: the content equal, qemu-img check leaks only.
check_image() {
  run qemu-img compare -f qcow2 -F raw "$1" "$2" ||
    fail "the image lacks acknowledged writes"
  local rc=0
  qemu-img check "$1" >check.txt 2>&1 || rc=$?
  if [[ $rc -ne 0 && ! ($rc -eq 3 && $(grep -c "ERROR" check.txt) -eq 0) ]]; then
    cat check.txt
    fail "qemu-img check: exit $rc"
  fi
  echo "  qemu-img check: exit $rc ($(grep -o "[0-9]* leaked clusters" check.txt || echo "no leaks"))"
}

progress() { cat progress 2>/dev/null || echo 0; }
past() { (($(progress) >= $1)); }

check "kill -9 of the upstream mid-writes, restarted, three times: no error, nothing lost"
qemu-img create -f qcow2 disk.qcow2 64M >/dev/null
start_up disk.qcow2
start_server --nbd-timeout 30 "$UP"
rm -f stop progress
"$PY" "$HERE/replay-client.py" "$URI" 1 expect.raw progress stop \
  >client.out 2>&1 &
client=$!
track_pid $client
goal=0
for round in 1 2 3; do
  goal=$((goal + 300))
  wait_until 120 past $goal || { cat client.out; fail "the client stalled at $(progress)"; }
  kill_up
  start_up disk.qcow2 # at once: well within 2 s
  echo "  round $round: upstream killed and restarted after $(progress) requests"
done
goal=$((goal + 300))
wait_until 120 past $goal || { cat client.out; fail "the client stalled after the restarts"; }
touch stop
wait $client || { cat client.out; fail "the client saw an error"; }
cat client.out
grep -q "sent .* again after the loss" "$T/server.log" ||
  fail "no replay logged"
stop_server
kill -TERM $UP_PID
wait $UP_PID || fail "the upstream exited with $?"
check_image disk.qcow2 expect.raw
ok "no error reached the client; the image holds every acknowledged write"

check "--nbd-replay-limit 4k: the flush after a loss fails, saying how much"
qemu-img create -f qcow2 small.qcow2 64M >/dev/null
start_up small.qcow2
start_server --nbd-replay-limit 4k "$UP"
cat >tiny.py <<'PYEOF'
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
if sys.argv[2] == "write":
    for i in range(16):
        h.pwrite(bytes([i + 1]) * 65536, i * 65536)
    print("written")
else:
    try:
        h.flush()
        print("flush ok")
    except nbd.Error as e:
        print("flush error: %s" % e)
PYEOF
[[ $(run "$PY" tiny.py "$URI" write) == written ]] || fail "writes failed"
kill_up
start_up small.qcow2
r=$(run "$PY" tiny.py "$URI" flush)
[[ $r == "flush error"* ]] || fail "the flush after the loss: $r"
grep -q "lost [0-9]* bytes of acknowledged writes: past --nbd-replay-limit" \
  "$T/server.log" || fail "no log line with the bytes past the bound"
grep -o "lost [0-9]* bytes" "$T/server.log" | tail -1 | sed 's/^/  /'
r=$(run "$PY" tiny.py "$URI" flush)
[[ $r == "flush ok" ]] || fail "the next flush: $r"
stop_server
kill_up
ok "EIO at the next flush, once, with the bytes past the bound logged"

check "the upstream back with another size: requests fail with EIO, no replay"
qemu-img create -f qcow2 a.qcow2 64M >/dev/null
qemu-img create -f qcow2 b.qcow2 32M >/dev/null
start_up a.qcow2
start_server --nbd-timeout 30 "$UP"
cat >one.py <<'PYEOF'
import nbd, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
t = time.monotonic()
try:
    if sys.argv[2] == "write":
        h.pwrite(b"x" * 4096, 0)
    else:
        h.pread(4096, 0)
    print("ok")
except nbd.Error as e:
    print("error %.1f %s" % (time.monotonic() - t, e))
PYEOF
[[ $(run "$PY" one.py "$URI" write) == ok ]] || fail "write before the loss"
mark=$(wc -l <"$T/server.log")
since_mark() { tail -n +$((mark + 1)) "$T/server.log" | grep "$1" >/dev/null; }
kill_up
start_up b.qcow2
for op in write read; do
  r=$(run "$PY" one.py "$URI" $op)
  [[ $r == error* ]] || fail "$op from the other export: $r"
  awk -v t="$(cut -d' ' -f2 <<<"$r")" 'BEGIN{exit !(t < 10)}' ||
    fail "$op failed only after $r s: it should not wait for the time-out"
  echo "  $op: $r"
done
since_mark "the export came back as another" || fail "no log of the other export"
! since_mark "sent .* again after the loss" || fail "replayed into the other export"
kill_up
mark=$(wc -l <"$T/server.log")
start_up a.qcow2
# Requests fail at once until a connection finds the right export again.
wait_until 10 since_mark "re-established" || fail "no reconnection to the export"
r=$(run "$PY" one.py "$URI" read)
[[ $r == ok ]] || fail "read once the export is back: $r"
since_mark "sent 1 acknowledged" || fail "the write was not sent again to the right export"
stop_server
kill -TERM $UP_PID
wait $UP_PID || true
ok "refused and failed at once; accepted again when it is back"

check "the upstream back without the export: requests fail with EIO, no replay"
start_up one=b.qcow2 two=a.qcow2
start_server --nbd-timeout 30 "nbd+unix:///two?socket=$T/up.sock"
[[ $(run "$PY" one.py "$URI" write) == ok ]] || fail "write before the loss"
mark=$(wc -l <"$T/server.log")
kill_up
start_up one=b.qcow2
wait_until 10 since_mark "without the export" || fail "no log of the missing export"
r=$(run "$PY" one.py "$URI" read)
[[ $r == error* ]] || fail "read without the export: $r"
awk -v t="$(cut -d' ' -f2 <<<"$r")" 'BEGIN{exit !(t < 10)}' ||
  fail "the read failed only after $r s: it should not wait for the time-out"
! since_mark "sent .* again after the loss" || fail "replayed into another export"
kill_up
mark=$(wc -l <"$T/server.log")
start_up one=b.qcow2 two=a.qcow2
wait_until 10 since_mark "re-established" || fail "no reconnection to the export"
[[ $(run "$PY" one.py "$URI" read) == ok ]] || fail "read once the export is back"
since_mark "sent 1 acknowledged" || fail "the write was not sent again to the export"
stop_server
kill -TERM $UP_PID
wait $UP_PID || true
ok "failed at once; replayed once the export is back"

check "through mount: kill -9 of the upstream under O_DIRECT writes, twice"
if [[ $(id -u) -ne 0 ]] || ! can_mount; then
  skip_case "mount needs FUSE in blockport, root, /dev/fuse and fusermount3"
else
  MNT=$T/mnt
  mkdir -p "$MNT"
  is_mounted() { awk -v m="$MNT" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }
  trap 'rc=$?; set +e; is_mounted && fusermount3 -u -z "$MNT"; (exit $rc); _cleanup' EXIT
  qemu-img create -f qcow2 m.qcow2 64M >/dev/null
  start_up m.qcow2
  rm -f mount.pid stop progress
  "${_env_reset[@]}" "$BLOCKPORT" mount --foreground -P mount.pid "$UP" "$MNT" \
    </dev/null >>mount.log 2>&1 &
  mpid=$!
  track_pid $mpid
  wait_file 15 mount.pid $mpid || { cat mount.log; fail "mount not live"; }
  cat >mwriter.py <<'PYEOF'
import mmap, os, random, sys, time
path, expect, progress, stop = sys.argv[1:]
# The test kills the upstream while the writer is parked after write N
# (the number in the file "park"; N is 8 past an fsync), so that
# acknowledged writes no flush has made safe are waiting to be replayed.
def park(n):
    try:
        with open("park") as f:
            at = int(f.read())
    except (OSError, ValueError):
        return
    if n != at:
        return
    open("parked", "w").close()
    while os.path.exists("park"):
        time.sleep(0.01)
fd = os.open(path, os.O_RDWR | os.O_DIRECT)
size = os.lseek(fd, 0, os.SEEK_END)
model = bytearray(size)
buf = mmap.mmap(-1, 1 << 17)
rng = random.Random(7)
n = 0
try:
    while not os.path.exists(stop):
        length = rng.randrange(1, 33) * 4096
        off = rng.randrange(0, (size - length) // 4096) * 4096
        data = (b"%d:%d " % (n, off)) * (length // 8)
        data = (data + bytes(length))[:length]
        buf[:length] = data
        os.pwritev(fd, [memoryview(buf)[:length]], off)
        model[off:off + length] = data
        n += 1
        park(n)
        if n % 16 == 0:
            os.fsync(fd)
            with open(progress, "w") as f:
                f.write("%d\n" % n)
    os.fsync(fd)
except OSError as e:
    print("mwriter: error after %d writes: %s" % (n, e))
    sys.exit(1)
with open(expect, "wb") as f:
    f.write(model)
print("mwriter: %d writes" % n)
PYEOF
  "$PY" mwriter.py "$MNT/disk" mexpect.raw progress stop >mwriter.out 2>&1 &
  w=$!
  track_pid $w
  goal=0
  for round in 1 2; do
    goal=$((goal + 200))
    # Parked at write 16k + 8: 8 acknowledged writes since the last fsync.
    rm -f parked
    echo $(((goal / 16 + 1) * 16 + 8)) >park
    wait_until 120 test -e parked || { cat mwriter.out mount.log; fail "the writer stalled"; }
    kill_up
    rm park
    start_up m.qcow2
  done
  goal=$((goal + 200))
  wait_until 120 past $goal || { cat mwriter.out; fail "the writer stalled after the restarts"; }
  touch stop
  wait $w || { cat mwriter.out; tail -20 mount.log; fail "the writer saw an error"; }
  cat mwriter.out
  grep -q "sent .* again after the loss" mount.log || fail "no replay logged by the mount"
  fusermount3 -u "$MNT"
  wait $mpid || fail "mount exited with $?"
  check_sanitizer_reports mount.log
  kill -TERM $UP_PID
  wait $UP_PID || true
  check_image m.qcow2 mexpect.raw
  ok "no error reached the writer; the image holds every write"
fi
check_sanitizer_reports "$T/up.log"
