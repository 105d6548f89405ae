#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""contrib/backup/blockport-backup end to end, under a writer (issue 29).

usage: backupcheck.py SOCKET CONTROL RECIPE DIR

SOCKET serves (with --control CONTROL) an image whose 4 KiB block B holds
pattern(B, 0).  Two writers keep writing versions pattern(B, SEQ) while
the recipe takes a full backup and two incremental ones; then, the
writers stopped, a third incremental one.  Each restore must hold, block
by block, a version the image held at its checkpoint: no older than the
newest acknowledged before the recipe started, older than the first
submitted after it ended.  The last must equal the live image exactly.
"""
import struct
import subprocess
import sys
import threading
import time

import nbd

BS = 4096
WRITERS = 2


def pattern(block, seq):
    return struct.pack("<QQ", block, seq) * (BS // 16)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def connect():
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///?socket=" + SOCKET)
    return h


def writer(t, nblocks, stop, log):
    h = connect()
    seq = {}
    rnd = 777 + t
    while not stop.is_set():
        rnd = (rnd * 1103515245 + 12345) & 0x7FFFFFFF
        b = (rnd % (nblocks // WRITERS)) * WRITERS + t
        seq[b] = seq.get(b, 0) + 1
        t0 = time.monotonic()
        h.pwrite(pattern(b, seq[b]), b * BS)
        log.append((b, seq[b], t0, time.monotonic()))
        time.sleep(0.001)  # leave the recipe some of the CPU
    h.flush()
    h.shutdown()


def recipe(*args):
    t0 = time.monotonic()
    r = subprocess.run([RECIPE] + list(args), capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        fail("blockport-backup %s: %s" % (" ".join(args), r.stderr.strip()))
    print("  " + r.stdout.strip())
    return t0, time.monotonic()


def restored(name, nblocks):
    out = "%s/%s.raw" % (DIR, name)
    recipe("restore", DIR, name, out)
    with open(out, "rb") as f:
        data = f.read()
    if len(data) != nblocks * BS:
        fail("restore of %s has %d bytes" % (name, len(data)))
    return data


def check_point(name, data, writes, t_call, t_ret):
    lo, hi = {}, {}
    for b, s, t0, t1 in writes:
        if t1 < t_call:
            lo[b] = max(lo.get(b, 0), s)
        if t0 > t_ret:
            hi[b] = min(hi.get(b, 1 << 62), s)
    for b in range(len(data) // BS):
        got = data[b * BS:(b + 1) * BS]
        vb, vs = struct.unpack_from("<QQ", got)
        if vb != b or got != pattern(b, vs):
            fail("restore %s: block %d holds no version of it" % (name, b))
        if not lo.get(b, 0) <= vs < hi.get(b, 1 << 62):
            fail("restore %s: block %d holds version %d; acknowledged "
                 "before: %d, submitted after: %s"
                 % (name, b, vs, lo.get(b, 0), hi.get(b)))


SOCKET, CONTROL, RECIPE, DIR = sys.argv[1:5]
nblocks = connect().get_size() // BS
common = ["--control", CONTROL, "--socket", SOCKET]
stop = threading.Event()
logs = [[] for _ in range(WRITERS)]
ts = [threading.Thread(target=writer, args=(t, nblocks, stop, logs[t]))
      for t in range(WRITERS)]
for t in ts:
    t.start()
windows = {}
for kind, name in (("full", "b0"), ("inc", "b1"), ("inc", "b2")):
    n = sum(map(len, logs))
    deadline = time.monotonic() + 60
    while sum(map(len, logs)) < n + 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    windows[name] = recipe(kind, *common, DIR, name)
stop.set()
for t in ts:
    t.join()
windows["b3"] = recipe("inc", *common, DIR, "b3")
writes = [w for log in logs for w in log]
for name in ("b0", "b1", "b2", "b3"):
    check_point(name, restored(name, nblocks), writes, *windows[name])
live = connect()
data = b"".join(live.pread(min(4 << 20, nblocks * BS - o), o)
                for o in range(0, nblocks * BS, 4 << 20))
if restored("b3", nblocks) != data:
    fail("the last backup is not the live image")
print("ok: 4 backups taken under %d writes; every restore is its "
      "checkpoint's image; the last equals the live image" % len(writes))
