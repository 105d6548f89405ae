#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Crash safety under load: one qcow2 overlay over a qcow2 backing file,
# served again and again and killed with SIGKILL at a random moment twenty
# times.  Each life has five clients: fio doing random reads, writes (with
# flushes) and trims across the backed region, and two flush trackers
# (flush-tracker.py) that log only what a completed FLUSH covered.  After
# each kill `qemu-img check` finds no corruption (leaks allowed) and every
# block a tracker flushed reads back.  Odd lives run with --cache none.
source "$(dirname "$0")/lib.sh"
require qemu-img fio
TRACKER=$(dirname "$(readlink -f "$0")")/flush-tracker.py
cd "$T"
KILLS=${SOAK_KILLS:-20}

random_file base.raw 32
qemu-img convert -f raw -O qcow2 base.raw base.qcow2
qemu-img create -f qcow2 -b base.qcow2 -F qcow2 soak.qcow2 1G >/dev/null

cat >storm.fio <<J
[global]
ioengine=nbd
uri=nbd+unix:///?socket=$T/sock
size=40M
time_based=1
runtime=30
[rw]
rw=randrw
bsrange=4k-128k
iodepth=16
numjobs=2
fsync=32
[trim]
rw=randtrim
bsrange=64k-1M
iodepth=4
J

verified=0
for i in $(seq 1 "$KILLS"); do
  # Every other life with --cache none: guest data with O_DIRECT (and the
  # core's aligner), metadata buffered.
  mode=()
  ((i % 2)) && mode=(--cache none)
  start_server "${mode[@]}" soak.qcow2
  # fio's job processes may sit in a call to the dead server, in sessions
  # of their own: kill_tree ends them all.
  fio storm.fio >/dev/null 2>&1 &
  storm=$!
  track_pid $storm
  # Two trackers per life, each in a fresh 16 MiB past the backing file,
  # which reads as zeroes until they write it.
  t1=$(((64 + (i - 1) * 32) << 20))
  t2=$((t1 + (16 << 20)))
  "$PY" "$TRACKER" run "$URI" log1 $t1 $i >/dev/null 2>&1 &
  p1=$!
  "$PY" "$TRACKER" run "$URI" log2 $t2 $((i + 100)) >/dev/null 2>&1 &
  p2=$!
  track_pid $p1
  track_pid $p2
  # The moment of the crash, at random (not a wait for anything).
  sleep "$((RANDOM % 2)).$((RANDOM % 10))"
  kill -9 "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
  for p in $storm $p1 $p2; do
    kill_tree "$p"
  done
  rc=0; qemu-img check soak.qcow2 >check.txt 2>&1 || rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || { cat check.txt; fail "kill $i: check exit $rc"; }
  qemu-img convert -O raw soak.qcow2 soak.raw
  n1=$("$PY" "$TRACKER" verify log1 soak.raw $t1 $i)
  n2=$("$PY" "$TRACKER" verify log2 soak.raw $t2 $((i + 100)))
  [ "${n1:--1}" -ge 0 ] && [ "${n2:--1}" -ge 0 ] ||
    fail "kill $i: flushed writes lost ($n1, $n2)"
  verified=$((verified + n1 + n2))
  rm -f log1 log2 soak.raw
  ok "kill $i: check exit $rc, $((n1 + n2)) flushed blocks verified"
done
[ "$verified" -gt $((KILLS * 100)) ] ||
  fail "only $verified flushed blocks checked: the trackers hardly ran"
# The backing file was never written.
qemu-img compare -f raw -F qcow2 base.raw base.qcow2 >/dev/null || fail "backing file changed"
ok "$KILLS kills, $verified flushed blocks verified, backing file intact"
