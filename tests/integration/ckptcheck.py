#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checkpoints of a live export, checked against a model (issue 29).

usage: ckptcheck.py SOCKET CONTROL BLOCKPORT

SOCKET serves an image whose 4 KiB block B holds pattern(B, 0) (see
make-image below), with --control CONTROL.  Steps:
  1. Four writers (one connection each, disjoint blocks) write versions
     pattern(B, SEQ) while checkpoint c1 is taken; each records when it
     submitted and when it saw each write acknowledged.  The view "@c1"
     must hold, for every block, a version no older than the newest one
     acknowledged before the checkpoint was asked for and older than the
     first one submitted after it answered.  The live export holds the
     last version of every block.
  2. With the writers stopped: checkpoint c2; a known set of writes,
     zeroes and trims; checkpoint c3.  "@c2" equals the image as it was at
     c2 (read before the changes); "@c3"'s qemu:dirty-bitmap:c2 marks
     exactly the granules changed, "@c2"'s qemu:dirty-bitmap:c1 at least
     the blocks step 1 wrote after c1.
  3. `list` shows the three checkpoints; release frees a view's fleece
     and drops the export.
Prints what it checked; exits 1 on the first mismatch.
"""
import json
import struct
import subprocess
import sys
import threading
import time

import nbd

BS = 4096
GRAN = 64 << 10
WRITERS = 4


def pattern(block, seq):
    return struct.pack("<QQ", block, seq) * (BS // 16)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def ctl(args, ok=True):
    r = subprocess.run([BP, "ctl", CONTROL] + args, capture_output=True,
                       text=True, timeout=60)
    if ok and r.returncode != 0:
        fail("ctl %s: %s" % (" ".join(args), r.stderr.strip()))
    return json.loads(r.stdout) if r.returncode == 0 else r.stderr


def connect(export="", contexts=()):
    h = nbd.NBD()
    for c in contexts:
        h.add_meta_context(c)
    h.set_export_name(export)
    h.connect_uri("nbd+unix:///%s?socket=%s" % (export, SOCKET))
    return h


def read_all(h):
    size = h.get_size()
    out = bytearray()
    step = 4 << 20
    for off in range(0, size, step):
        out += h.pread(min(step, size - off), off)
    return bytes(out)


def writer(t, nblocks, stop, log):
    h = connect()
    seq = {}
    rnd = 12345 + t
    while not stop.is_set():
        rnd = (rnd * 1103515245 + 12345) & 0x7FFFFFFF
        b = (rnd % (nblocks // WRITERS)) * WRITERS + t
        s = seq.get(b, 0) + 1
        seq[b] = s
        t0 = time.monotonic()
        h.pwrite(pattern(b, s), b * BS)
        log.append((b, s, t0, time.monotonic()))
    h.shutdown()


def step1(nblocks):
    stop = threading.Event()
    logs = [[] for _ in range(WRITERS)]
    ts = [threading.Thread(target=writer, args=(t, nblocks, stop, logs[t]))
          for t in range(WRITERS)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 60
    while sum(map(len, logs)) < 1500 and time.monotonic() < deadline:
        time.sleep(0.01)
    t_call = time.monotonic()
    ans = ctl(["checkpoint", "c1"])
    t_ret = time.monotonic()
    if ans.get("view") != "@c1" or "base:allocation" not in ans["contexts"]:
        fail("checkpoint c1 answered %r" % ans)
    if any(c.startswith("qemu:dirty-bitmap:") for c in ans["contexts"]):
        fail("the first checkpoint offers a bitmap: %r" % ans["contexts"])
    n_at = sum(map(len, logs))
    while sum(map(len, logs)) < n_at + 1500 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in ts:
        t.join()
    writes = [w for log in logs for w in log]
    lo, hi, last, after = {}, {}, {}, set()
    for b, s, t0, t1 in writes:
        if t1 < t_call:
            lo[b] = max(lo.get(b, 0), s)
        if t0 > t_ret:
            hi[b] = min(hi.get(b, 1 << 62), s)
            after.add(b)
        last[b] = max(last.get(b, 0), s)
    view = read_all(connect("@c1"))
    for b in range(nblocks):
        got = view[b * BS:(b + 1) * BS]
        vb, vs = struct.unpack_from("<QQ", got)
        if got != pattern(vb, vs) or vb != b:
            fail("@c1 block %d holds no version of it" % b)
        if not lo.get(b, 0) <= vs < hi.get(b, 1 << 62):
            fail("@c1 block %d holds version %d; acknowledged before: %d, "
                 "submitted after: %s" % (b, vs, lo.get(b, 0), hi.get(b)))
    live = read_all(connect())
    for b in range(nblocks):
        want = pattern(b, last.get(b, 0))
        if live[b * BS:(b + 1) * BS] != want:
            fail("live block %d lost its last write" % b)
    print("ok: @c1 is the image at the checkpoint (%d writes, %d of them "
          "acknowledged before, %d submitted after); the live export kept "
          "every write" % (len(writes), sum(1 for w in writes if w[3] < t_call),
                           sum(1 for w in writes if w[2] > t_ret)))
    return after


def dirty_granules(h, ctx, size):
    got = set()
    off = 0
    while off < size:
        ext = []

        def cb(meta, o, entries, err):
            if meta == ctx:
                ext.extend(entries)
            return 0
        h.block_status(min(size - off, 1 << 30), off, cb)
        if not ext:
            fail("no extents for %s at %d" % (ctx, off))
        for i in range(0, len(ext), 2):
            n, flags = ext[i], ext[i + 1]
            if flags & 1:
                if off % GRAN or n % GRAN and off + n != size:
                    fail("%s extent %d+%d is not in granules" % (ctx, off, n))
                got.update(range(off // GRAN, (off + n + GRAN - 1) // GRAN))
            off += n
    return got


def step2(nblocks, after_c1):
    size = nblocks * BS
    at_c2 = read_all(connect())
    ans = ctl(["checkpoint", "c2"])
    if "qemu:dirty-bitmap:c1" not in ans["contexts"]:
        fail("checkpoint c2 offers no qemu:dirty-bitmap:c1: %r" % ans)
    h = connect()
    changed = set()
    for i, b in enumerate(range(3, nblocks, 997)):
        h.pwrite(pattern(b, 1 << 40 | i), b * BS)
        changed.add(b * BS // GRAN)
    h.zero(3 * GRAN, 5 * GRAN)
    changed.update(range(5, 8))
    h.trim(2 * GRAN, 40 * GRAN)
    changed.update(range(40, 42))
    h.zero(100, 61 * GRAN - 50)  # unaligned, across granules 60 and 61
    changed.update({60, 61})
    h.flush()
    h.shutdown()
    ans = ctl(["checkpoint", "c3"])
    v2 = connect("@c2", ["qemu:dirty-bitmap:c1"])
    if read_all(v2) != at_c2:
        fail("@c2 is not the image as it was at c2")
    d1 = dirty_granules(v2, "qemu:dirty-bitmap:c1", size)
    missing = {b * BS // GRAN for b in after_c1} - d1
    if missing:
        fail("@c2's bitmap c1 misses granules written after c1: %s"
             % sorted(missing)[:10])
    v3 = connect("@c3", ["qemu:dirty-bitmap:c2"])
    d2 = dirty_granules(v3, "qemu:dirty-bitmap:c2", size)
    if d2 != changed:
        fail("@c3's bitmap c2 marks %s, expected %s"
             % (sorted(d2 ^ changed)[:10], sorted(changed)[:10]))
    print("ok: @c2 equals the image at c2 after %d changes; bitmap c2 marks "
          "exactly the %d granules changed; bitmap c1 covers the %d blocks "
          "written after c1" % (len(changed), len(d2), len(after_c1)))


def step3():
    ans = ctl(["list"])
    names = [c["name"] for c in ans["checkpoints"]]
    if names[-3:] != ["c1", "c2", "c3"]:
        fail("list shows %r" % names)
    c = {c["name"]: c for c in ans["checkpoints"]}
    if c["c2"].get("previous") != "c1" or not c["c3"]["recording"]:
        fail("list: %r" % ans)
    if c["c2"]["fleece-bytes"] == 0:
        fail("view @c2 holds no fleece after the writes: %r" % c["c2"])
    before = ans["fleece-bytes"]
    ctl(["release", "c2"])
    ans = ctl(["list"])
    c = {c["name"]: c for c in ans["checkpoints"]}
    if "c2" in c and c["c2"].get("view"):
        fail("c2 still has a view after release: %r" % c["c2"])
    if ans["fleece-bytes"] >= before:
        fail("release freed no fleece (%d then %d)"
             % (before, ans["fleece-bytes"]))
    try:
        connect("@c2")
        fail("export @c2 still offered after release")
    except nbd.Error:
        pass
    err = ctl(["release", "c2"], ok=False)
    if "no view" not in err:
        fail("second release: %r" % err)
    print("ok: list shows c1..c3; release freed %d bytes of fleece and "
          "dropped @c2" % (before - ans["fleece-bytes"]))


SOCKET, CONTROL, BP = sys.argv[1:4]
size = connect().get_size()
after = step1(size // BS)
step2(size // BS, after)
step3()
