#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Injected I/O faults (BLOCKPORT_FAULTS, core/fault.h) and a real full
# disk: the client gets the error with its errno, the server keeps serving,
# and a qcow2 image that runs out of space in the middle of allocating
# stays consistent under qemu-img check, with its flushed data intact.
source "$(dirname "$0")/lib.sh"
require qemu-img qemu-io
cd "$T"

# qio URI ARGS...: run qemu-io on the export, output in qio.txt, exit
# status in QIO_RC.
qio() {
  local uri=$1
  shift
  QIO_RC=0
  qemu-io -f raw "$@" "$uri" >qio.txt 2>&1 || QIO_RC=$?
}

check "raw: reads of one range fail with EIO, the rest of the disk works"
truncate -s 8M r.raw
BLOCKPORT_FAULTS="op=read,from=1048576,to=2097152" start_server r.raw
qio "$URI" -c 'read 0 64k'
grep -q "read 65536/65536" qio.txt || { cat qio.txt; fail "a healthy read failed"; }
qio "$URI" -c 'read 1M 4k'
grep -q "Input/output error" qio.txt || { cat qio.txt; fail "no EIO"; }
qio "$URI" -c 'write -P 7 1M 4k'
grep -q "wrote 4096/4096" qio.txt || { cat qio.txt; fail "writes should pass"; }
server_alive || fail "server died"
grep -q "fault injected: read at 1048576" "$T/server.log" || fail "fault not logged"
stop_server
ok "EIO on reads in [1M, 2M) only; logged; server alive"

check "raw: one write fails with ENOSPC, the next succeeds; a failed flush is EIO"
BLOCKPORT_FAULTS="op=write,err=ENOSPC,count=1" start_server r.raw
qio "$URI" -c 'write -P 1 0 4k'
grep -q "No space left on device" qio.txt || { cat qio.txt; fail "no ENOSPC"; }
qio "$URI" -c 'write -P 1 0 4k'
grep -q "wrote 4096/4096" qio.txt || { cat qio.txt; fail "second write failed"; }
stop_server
# (qemu-io flushes when it closes: the first flush is the one it asks for.)
BLOCKPORT_FAULTS="op=sync,count=1" start_server r.raw
qio "$URI" -c 'flush'
[ $QIO_RC -ne 0 ] || { cat qio.txt; fail "flush did not fail"; }
grep -q "fdatasync: Input/output error" "$T/server.log" || fail "flush error not logged"
qio "$URI" -c 'flush' -c 'read -P 1 0 4k'
[ $QIO_RC -eq 0 ] && ! grep -qi "error\|fail" qio.txt || { cat qio.txt; fail "after the fault"; }
stop_server
ok "errno passed through; one-shot faults stop"

check "qcow2: ENOSPC in the middle of allocating: errors, then a consistent image"
qemu-img create -f qcow2 q.qcow2 64M >/dev/null
qemu-io -f qcow2 -c 'write -P 0x3c 0 2M' q.qcow2 >/dev/null
# Let the first write's refcounts and data through (a run of clusters
# takes one write of each), then fail every write: the second write's
# allocation.
BLOCKPORT_FAULTS="op=write,err=ENOSPC,after=2" start_server q.qcow2
qio "$URI" -c 'write -P 0x5a 4M 8M' -c 'write -P 0x5b 20M 1M'
grep -q "No space left on device" qio.txt || { cat qio.txt; fail "no ENOSPC"; }
qio "$URI" -c 'read -P 0x3c 0 2M'
[ $QIO_RC -eq 0 ] && qio_completed qio.txt 1 || { cat qio.txt; fail "old data changed"; }
server_alive || fail "server died"
# The image refuses writes once its metadata could not be written, so the
# final flush fails too and the server says so in its exit status.
STOP_EXPECT=1 stop_server
grep -q "refusing further writes" "$T/server.log" || fail "no log line"
rc=0; qemu-img check q.qcow2 >check.txt 2>&1 || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat check.txt; fail "check exit $rc after ENOSPC"; }
qemu-io -f qcow2 -r -c 'read -P 0x3c 0 2M' q.qcow2 >qio.txt 2>&1 &&
  qio_completed qio.txt 1 || { cat qio.txt; fail "flushed data lost"; }
# Without faults the image is writable again.
start_server q.qcow2
qio "$URI" -c 'write -P 0x77 30M 1M' -c 'read -P 0x77 30M 1M'
[ $QIO_RC -eq 0 ] && qio_completed qio.txt 2 || { cat qio.txt; fail "image not writable after"; }
stop_server
rc=0; qemu-img check q.qcow2 >check.txt 2>&1 || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat check.txt; fail "check exit $rc"; }
ok "no corruption (check exit $rc), data intact, writable again"

check "qcow2: a failing sync point fails the flush and no later write lands"
qemu-img create -f qcow2 s.qcow2 16M >/dev/null
BLOCKPORT_FAULTS="op=sync,count=1" start_server s.qcow2
qio "$URI" -c 'write -P 1 0 64k' -c 'flush'
[ $QIO_RC -ne 0 ] || { cat qio.txt; fail "flush should fail"; }
qio "$URI" -c 'write -P 2 1M 64k'
grep -q "Input/output error" qio.txt || { cat qio.txt; fail "image should refuse writes"; }
qio "$URI" -c 'read 0 64k'
grep -q "read 65536/65536" qio.txt || { cat qio.txt; fail "reads should still work"; }
STOP_EXPECT=1 stop_server
rc=0; qemu-img check s.qcow2 >check.txt 2>&1 || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat check.txt; fail "check exit $rc"; }
ok "EIO, reads still served, image consistent"

check "qcow2 on a full filesystem (a 6 MiB tmpfs)"
mkdir -p small
if ! mount -t tmpfs -o size=6M tmpfs small 2>/dev/null; then
  skip_case "cannot mount a tmpfs here" # the last case: the others passed
  exit 0
fi
# Unmount before lib.sh's cleanup removes $T, keeping the exit status.
trap '_rc=$?; umount -l "$T/small" 2>/dev/null; (exit $_rc); _cleanup' EXIT
qemu-img create -f qcow2 small/f.qcow2 64M >/dev/null
qemu-io -f qcow2 -c 'write -P 0x11 0 1M' small/f.qcow2 >/dev/null
lines=$(wc -l <"$T/server.log")
start_server small/f.qcow2
qio "$URI" -c 'write -P 0x22 8M 16M'
grep -q "No space left on device" qio.txt || { cat qio.txt; fail "no ENOSPC from a full disk"; }
server_alive || fail "server died"
# A data write that fails leaves the image writable; a metadata write that
# fails makes it refuse writes, and then the final flush fails too.
want=0
tail -n +$((lines + 1)) "$T/server.log" | grep "refusing further writes" >/dev/null && want=1
STOP_EXPECT=$want stop_server
rc=0; qemu-img check small/f.qcow2 >check.txt 2>&1 || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat check.txt; fail "check exit $rc on a full disk"; }
qemu-io -f qcow2 -r -c 'read -P 0x11 0 1M' small/f.qcow2 >qio.txt 2>&1 &&
  qio_completed qio.txt 1 || { cat qio.txt; fail "data lost on a full disk"; }
umount small
trap _cleanup EXIT
ok "ENOSPC to the client; image consistent (check exit $rc)"
