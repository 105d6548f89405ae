# SPDX-License-Identifier: BSD-3-Clause
"""A writer for test-nbd-replay.sh: eight streams of writes and zeroes
(with and without holes), one request in flight per stream, each stream
in its own slice of the disk, a flush every 16 of a stream's requests.
Runs until STOPFILE exists, then flushes, reads the disk back, checks it
against its model and writes the model to EXPECT.  PROGRESS holds the
count of requests answered.  Any error: printed, exit 1.

  replay-client.py URI SEED EXPECT PROGRESS STOPFILE"""

import os
import random
import sys

import nbd

uri, seed, expect, progress, stopfile = sys.argv[1:]
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
STREAMS = 8
piece = size // STREAMS // 65536 * 65536
model = bytearray(size)
rng = random.Random(int(seed))
done = 0


def new_request(s, n):
    """Stream s's n-th request: (kind, offset, data or length)."""
    base = s * piece
    if n % 16 == 15:
        return ("flush", 0, 0)
    if rng.random() < 0.85:
        length = rng.randrange(1, 129) * 512
        off = base + rng.randrange(0, (piece - length) // 512 + 1) * 512
        tag = ("%d:%d:%d " % (s, n, off)).encode()
        data = (tag * (length // len(tag) + 1))[:length]
        return ("write", off, data)
    length = rng.randrange(1, 5) * 65536
    off = base + rng.randrange(0, (piece - length) // 65536 + 1) * 65536
    return ("zero" if rng.random() < 0.5 else "zero-nohole", off, length)


def issue(req):
    kind, off, arg = req
    if kind == "write":
        return h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(arg)), off)
    if kind == "flush":
        return h.aio_flush()
    flags = nbd.CMD_FLAG_NO_HOLE if kind == "zero-nohole" else 0
    return h.aio_zero(arg, off, flags=flags)


def apply(req):
    kind, off, arg = req
    if kind == "write":
        model[off:off + len(arg)] = arg
    elif kind != "flush":
        model[off:off + arg] = bytes(arg)


def report():
    with open(progress + ".tmp", "w") as f:
        f.write("%d\n" % done)
    os.replace(progress + ".tmp", progress)


inflight = {}  # stream -> (cookie, request)
count = [0] * STREAMS
try:
    while True:
        stopping = os.path.exists(stopfile)
        for s in range(STREAMS):
            if s not in inflight and not stopping:
                req = new_request(s, count[s])
                count[s] += 1
                inflight[s] = (issue(req), req)
        if not inflight:
            break
        h.poll(1000)
        for s, (cookie, req) in list(inflight.items()):
            if h.aio_command_completed(cookie):  # raises on an error
                apply(req)
                del inflight[s]
                done += 1
                if done % 50 == 0:
                    report()
    h.flush()
    report()
    for off in range(0, size, 1 << 20):
        got = h.pread(1 << 20, off)
        if got != model[off:off + (1 << 20)]:
            for i in range(0, 1 << 20, 512):
                if got[i:i + 512] != model[off + i:off + i + 512]:
                    print("replay-client: sector %d differs" % ((off + i) // 512))
                    sys.exit(1)
except nbd.Error as e:
    print("replay-client: error after %d requests: %s" % (done, e))
    sys.exit(1)
with open(expect, "wb") as f:
    f.write(model)
print("replay-client: %d requests, read back equal" % done)
