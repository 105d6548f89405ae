#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A client that knows which of its writes must survive a crash.

  flush-tracker.py run URI LOG BASE SEED    write, flush, log; until killed
  flush-tracker.py verify LOG IMAGE.raw BASE SEED

run: each round writes 16 blocks of 4 KiB at pseudo-random places in the
16 MiB at BASE with a byte naming the round, flushes, and only then appends
the round to LOG (fsynced).  verify: every block must hold the byte of the
last logged round that wrote it, or of the round in flight when the server
died (written, maybe flushed, not yet logged), which may also have left the
block as the earlier round had it.  Prints the number of blocks checked, or
-N for N bad blocks (each described on stderr).
"""
import os
import sys

BLOCK = 4096
SPAN = 4096  # blocks in the tracked region (16 MiB)


def blocks(base, seed, rnd):
    return [base + ((rnd * 7919 + k * 104729 + seed * 31) % SPAN) * BLOCK
            for k in range(16)]


def pattern(rnd):
    return rnd % 250 + 1


def run(uri, log_path, base, seed):
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri)
    log = open(log_path, "w")
    rnd = 0
    while True:
        rnd += 1
        for b in blocks(base, seed, rnd):
            h.pwrite(bytes([pattern(rnd)]) * BLOCK, b)
        h.flush()
        log.write("%d\n" % rnd)
        log.flush()
        os.fsync(log.fileno())


def verify(log_path, image, base, seed):
    rounds = []
    if os.path.exists(log_path):
        rounds = [int(x) for x in open(log_path).read().split()]
    last = max(rounds) if rounds else 0
    want = {}
    for r in range(1, last + 1):
        for b in blocks(base, seed, r):
            want[b] = {pattern(r)}
    # Unwritten blocks read as whatever lay below: the caller passes a
    # region that starts out as zeroes.
    for b in blocks(base, seed, last + 1):
        want.setdefault(b, {0}).add(pattern(last + 1))
    bad = 0
    with open(image, "rb") as f:
        for b, pats in sorted(want.items()):
            f.seek(b)
            data = f.read(BLOCK)
            if len(data) == BLOCK and data.count(data[0]) == BLOCK \
                    and data[0] in pats:
                continue
            bad += 1
            print("block %d holds %r..., want one of %r"
                  % (b, data[:4], sorted(pats)), file=sys.stderr)
    print(len(want) if not bad else -bad)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        verify(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
