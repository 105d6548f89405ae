#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""blockport vhost without a VM: a vhost-user front end and guest driver in
Python (vhostuser.py) against the real binary.

Run:  BLOCKPORT=/path/to/blockport /usr/bin/python3 test-vhost.py [CASE...]

Each case starts `blockport vhost` on a socket in a temporary directory
(sources: memory:, or an NBD URI served by `blockport serve` or nbdkit),
negotiates as QEMU does, pushes virtio-blk requests through a ring in
memfd guest memory, and stops the back end with SIGTERM, expecting exit
status 0.  Prints "ok NAME" / "FAIL NAME: why" / "skip NAME: why" per
case.  Exit status: 0 all passed, 1 any failure, 77 when BLOCKPORT is
unusable.
"""

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import casetest  # noqa: E402
import vhostuser as vu  # noqa: E402
from casetest import Failure, Skip, check, eq  # noqa: E402
from vhostuser import (  # noqa: E402
    BlkDriver, Frontend, Guest, Queue, S_IOERR, S_OK, S_UNSUPP, T_DISCARD,
    T_FLUSH, T_GET_ID, T_IN, T_OUT, T_WRITE_ZEROES)

BLOCKPORT = os.environ.get("BLOCKPORT", "")
MiB = 1 << 20


class Env:
    """Processes and files of one case, cleaned up whatever happens."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bp-vhost-")
        self.procs = []
        self.closers = []

    def path(self, name):
        return os.path.join(self.dir, name)

    def start(self, argv, ready_path, name, extra_env=None):
        log = open(self.path(name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                             env=extra_env)
        p.log_path = self.path(name + ".log")
        self.procs.append(p)
        deadline = time.time() + 20
        while not os.path.exists(ready_path):
            if p.poll() is not None or time.time() > deadline:
                raise Failure("%s did not start: %s" % (name, self.log(p)))
            time.sleep(0.02)
        return p

    def log(self, p, tail=2000):
        """The end of p's log (all of it with tail=0)."""
        with open(p.log_path) as f:
            return f.read()[-tail:]

    def vhost(self, source, *opts, name="vhost"):
        sock, pid = self.path(name + ".sock"), self.path(name + ".pid")
        if os.path.exists(pid):
            os.unlink(pid)
        p = self.start([BLOCKPORT, "vhost", "--socket", sock, "--pid-file",
                        pid, *opts, source], pid, name)
        p.sock = sock
        return p

    def nbd_serve(self, *args, extra_env=None):
        sock, pid = self.path("nbd.sock"), self.path("nbd.pid")
        self.start([BLOCKPORT, "serve", "--unix", sock, "--pid-file", pid,
                    *args], pid, "serve", extra_env)
        return "nbd+unix:///?socket=" + sock

    def stop(self, p, want=0):
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failure("no exit 30 s after SIGTERM: " + self.log(p))
        if want is not None and rc != want:
            raise Failure("exit status %d: %s" % (rc, self.log(p)))

    def cleanup(self):
        for c in reversed(self.closers):
            try:
                c()
            except Exception:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def session(env, sock, num=128, guest=None, queue=None, inflight=None,
            new_inflight=False, base=0):
    """Connect, negotiate, share memory, start queue 0, as QEMU does.
    GUEST and QUEUE continue a previous session's (a reconnect);
    INFLIGHT is a region to hand back, NEW_INFLIGHT asks for one."""
    fe = Frontend(sock)
    env.closers.append(fe.close)
    features = fe.negotiate()
    fe.set_u64(vu.SET_FEATURES, features)
    if new_inflight:
        inflight = fe.get_inflight(1, num) + (1, num)
        env.closers.append(lambda: os.close(inflight[0]))
    if inflight is not None:
        fe.set_inflight(*inflight)
    g = guest
    if g is None:
        g = Guest()
        env.closers.append(g.close)
    q = queue
    if q is None:
        q = Queue(g, 0, num)
        env.closers.append(q.close)
    fe.set_mem_table(g)
    fe.start_queue(q, features, base=base)
    fe.inflight = inflight
    return fe, g, q, BlkDriver(q), features


def pattern(n, seed):
    r = random.Random(seed)
    return bytes(r.getrandbits(8) for _ in range(n))


# ---- cases ----

def case_negotiation_and_config(env):
    p = env.vhost("memory:64M", "--queues", "4", "--serial", "disk-42")
    fe = Frontend(p.sock)
    env.closers.append(fe.close)
    f = fe.negotiate()
    for bit, name in [(vu.F_VERSION_1, "VERSION_1"),
                      (vu.F_INDIRECT, "INDIRECT_DESC"),
                      (vu.F_EVENT_IDX, "EVENT_IDX"),
                      (1 << vu.BLK_F_FLUSH, "FLUSH"),
                      (1 << vu.BLK_F_DISCARD, "DISCARD"),
                      (1 << vu.BLK_F_WRITE_ZEROES, "WRITE_ZEROES")]:
        check(f & bit, "feature %s missing" % name)
    check(not f & (1 << vu.BLK_F_RO), "RO offered on a writable disk")
    want = vu.P_MQ | vu.P_REPLY_ACK | vu.P_CONFIG | vu.P_INFLIGHT
    eq(fe.backend_protocol & want, want, "protocol features")
    eq(fe.queues, 4, "GET_QUEUE_NUM")
    cfg = fe.config()
    eq(struct.unpack_from("<Q", cfg)[0], 64 * MiB // 512, "capacity")
    eq(struct.unpack_from("<I", cfg, 20)[0], 512, "blk_size")
    eq(struct.unpack_from("<H", cfg, 34)[0], 4, "num_queues")
    eq(fe.config(4, 20), cfg[20:24], "a config read at an offset")
    fe.close()
    env.stop(p)


def case_read_write_across_regions(env):
    p = env.vhost("memory:64M", "--serial", "disk-42")
    fe, g, q, blk, _ = session(env, p.sock)
    data = pattern(8192, 1)
    cross = 4 * MiB - 3000  # the buffer spans regions 0 and 1
    eq(blk.run(0, T_OUT, 2048, data=data, buf=cross), (S_OK, 1), "write")
    g.write(cross, bytes(8192))
    eq(blk.run(1, T_IN, 2048, nbytes=8192, buf=cross), (S_OK, 8193), "read")
    eq(g.read(cross, 8192), data, "data read back")
    # The same through the high region, one piece.
    high = 0x100000000 + 4096
    eq(blk.run(2, T_IN, 2048, nbytes=8192, buf=high)[0], S_OK, "read high")
    eq(g.read_fast(high, 8192), data, "data read back (high region)")
    status, n = blk.run(3, T_GET_ID, 0, nbytes=20)
    eq((status, n), (S_OK, 21), "GET_ID")
    eq(g.read_fast(blk.slot_data(3), 20), b"disk-42".ljust(20, b"\0"),
       "serial")
    eq(blk.run(4, T_FLUSH, 0)[0], S_OK, "flush")
    eq(blk.run(5, T_IN, 64 * MiB // 512, nbytes=512)[0], S_IOERR,
       "read past the end")
    eq(blk.run(6, 0x77, 0, nbytes=512)[0], S_UNSUPP, "unknown type")
    rng = struct.pack("<QII", 2048 + 8, 4, 1)  # 2 KiB, unmap allowed
    eq(blk.run(7, T_WRITE_ZEROES, 0, data=rng)[0], S_OK, "write zeroes")
    eq(blk.run(8, T_IN, 2048, nbytes=8192)[0], S_OK, "read after zeroes")
    got = g.read_fast(blk.slot_data(8), 8192)
    eq(got, data[:4096] + bytes(2048) + data[6144:], "zeroed range")
    rng = struct.pack("<QII", 0, 16, 0)
    eq(blk.run(9, T_DISCARD, 0, data=rng)[0], S_OK, "discard")
    fe.close()
    env.stop(p)


def scrape(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def sample(text, name):
    """The value of the series NAME (with its labels) in TEXT, or None."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def case_metrics(env):
    """vhost --metrics: the guest's requests by type, under its socket."""
    if not shutil.which("qemu-img"):
        raise Skip("no qemu-img")
    img = env.path("disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", img, "16M"],
                   check=True)
    port = free_port()
    p = env.vhost(img, "--metrics", "127.0.0.1:%d" % port)
    fe, g, q, blk, _ = session(env, p.sock)
    eq(blk.run(0, T_OUT, 0, data=pattern(8192, 3))[0], S_OK, "write")
    eq(blk.run(1, T_IN, 0, nbytes=4096)[0], S_OK, "read")
    eq(blk.run(2, T_FLUSH, 0)[0], S_OK, "flush")
    eq(blk.run(3, 0x77, 0, nbytes=512)[0], S_UNSUPP, "unknown type")
    text = scrape("http://127.0.0.1:%d/metrics" % port)
    lab = 'socket="%s"' % p.sock
    want = {
        'blockport_vhost_requests_total{%s,cmd="write"}' % lab: 1,
        'blockport_vhost_requests_total{%s,cmd="read"}' % lab: 1,
        'blockport_vhost_requests_total{%s,cmd="flush"}' % lab: 1,
        'blockport_vhost_requests_total{%s,cmd="other"}' % lab: 1,
        'blockport_vhost_request_errors_total{%s,cmd="other"}' % lab: 1,
        'blockport_vhost_written_bytes_total{%s}' % lab: 8192,
        'blockport_vhost_read_bytes_total{%s}' % lab: 4096,
        'blockport_vhost_requests_in_flight{%s}' % lab: 0,
        'blockport_vhost_size_bytes{%s}' % lab: 16 * MiB,
    }
    for name, value in want.items():
        eq(sample(text, name), value, name)
    misses = sample(text, 'blockport_qcow2_l2_cache_misses_total{%s}' % lab)
    check(misses is not None and misses >= 1, "L2 cache misses: %s" % misses)
    # The dashboard's vhost row asks for nothing the scrape lacks.
    scraped = env.path("scrape.txt")
    with open(scraped, "w") as f:
        f.write(text)
    grafana = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "..", "..", "contrib", "grafana")
    r = subprocess.run([sys.executable,
                        os.path.join(grafana, "check-dashboard.py"), "--only",
                        "blockport_vhost_",
                        os.path.join(grafana, "blockport-dashboard.json"),
                        scraped], capture_output=True, text=True)
    eq(r.returncode, 0, "check-dashboard: " + r.stderr)
    fe.close()
    env.stop(p)


def case_queue_depth_over_nbd(env):
    uri = env.nbd_serve("memory:64M")
    p = env.vhost(uri, "--connections", "2")
    fe, g, q, blk, _ = session(env, p.sock, num=256)
    depth, size = 64, 4096
    blocks = [pattern(size, 100 + i) for i in range(depth)]
    for i in range(depth):  # all offered before one kick
        blk.submit(i, T_OUT, i * 16, data=blocks[i], kick=False)
    os.eventfd_write(q.kick, 1)
    used = q.reap(depth)
    eq(sorted(u[0] for u in used), list(range(depth)), "write heads")
    check(all(blk.status(i) == S_OK for i in range(depth)), "write status")
    for i in range(depth):
        g.write_fast(blk.slot_data(i), bytes(size))
        blk.submit(i, T_IN, i * 16, nbytes=size, kick=False)
    os.eventfd_write(q.kick, 1)
    used = q.reap(depth)
    eq(sorted(u[0] for u in used), list(range(depth)), "read heads")
    for i in range(depth):
        eq(blk.status(i), S_OK, "read %d status" % i)
        if g.read_fast(blk.slot_data(i), size) != blocks[i]:
            raise Failure("read %d returned other data" % i)
    fe.close()
    env.stop(p)


def case_nbdkit_plugin(env):
    if not os.path.exists("/usr/lib/x86_64-linux-gnu/nbdkit/plugins/"
                          "nbdkit-pattern-plugin.so"):
        raise Skip("nbdkit's pattern plugin is not installed")
    # argv: vhost ... --plugin pattern size=64M
    p = env.vhost("size=64M", "--plugin", "pattern")
    fe, g, q, blk, f = session(env, p.sock)
    eq(blk.run(0, T_IN, 2048, nbytes=4096)[0], S_OK, "read")
    got = g.read_fast(blk.slot_data(0), 4096)
    want = b"".join(struct.pack(">Q", 2048 * 512 + 8 * i) for i in range(512))
    eq(got, want, "the pattern plugin's bytes")
    fe.close()
    env.stop(p)


def case_readonly(env):
    p = env.vhost("memory:1M", "--readonly")
    fe, g, q, blk, f = session(env, p.sock)
    check(f & (1 << vu.BLK_F_RO), "RO not offered")
    check(not f & (1 << vu.BLK_F_WRITE_ZEROES), "WRITE_ZEROES offered")
    eq(blk.run(0, T_OUT, 0, data=bytes(512))[0], S_IOERR, "write")
    eq(blk.run(1, T_IN, 0, nbytes=512)[0], S_OK, "read")
    fe.close()
    env.stop(p)


def case_next_front_end(env):
    """Stop the ring, disconnect; a second front end gets the same disk."""
    p = env.vhost("memory:1M")
    fe, g, q, blk, _ = session(env, p.sock)
    data = pattern(4096, 7)
    eq(blk.run(0, T_OUT, 8, data=data)[0], S_OK, "write")
    eq(blk.run(1, T_IN, 8, nbytes=4096)[0], S_OK, "read")
    eq(fe.stop_queue(q), 2, "GET_VRING_BASE")
    fe.close()
    fe, g, q, blk, _ = session(env, p.sock)
    eq(blk.run(0, T_IN, 8, nbytes=4096)[0], S_OK, "read again")
    eq(g.read_fast(blk.slot_data(0), 4096), data, "data after reconnect")
    fe.close()
    env.stop(p)


def case_front_end_gone_cancels_waiting_reads(env):
    """The front end goes away while its reads wait for a lost NBD server:
    they are cancelled at once, not after the server's 60 s time-out,
    without a completion in the ring (the next front end submits them
    again), and the next front end is served."""
    uri = env.nbd_serve("memory:1M")
    srv = env.procs[-1]
    p = env.vhost(uri, "--nbd-timeout", "60", "--verbose")
    fe, g, q, blk, _ = session(env, p.sock)
    eq(blk.run(0, T_IN, 0, nbytes=4096)[0], S_OK, "read before the loss")
    srv.kill()
    srv.wait()
    check(casetest.wait_until(
        10, lambda: "no connection left" in env.log(p, 0)),
        "the loss was not noticed: %s" % env.log(p))
    for i in range(4):
        blk.submit(i, T_IN, i * 8, nbytes=4096)
    # Each request read off the ring is logged at debug level.
    check(casetest.wait_until(
        10, lambda: env.log(p, 0).count(": type 0, 4096 bytes") >= 5),
        "the reads were not taken: %s" % env.log(p))
    fe.close()
    check(casetest.wait_until(
        10, lambda: "cancelled with the front end" in env.log(p, 0)
        and "front end gone" in env.log(p, 0)),
        "the reads were not cancelled: %s" % env.log(p))
    eq(q.used_idx(), 1, "no completion written after the front end left")
    fe, g, q, blk, _ = session(env, p.sock)
    fe.close()
    env.stop(p)


def case_malformed_chains(env):
    p = env.vhost("memory:1M")
    fe, g, q, blk, _ = session(env, p.sock)
    # A loop, a buffer outside guest memory, a header too short.
    q.set_desc(0, blk.HDR, 16, vu.D_NEXT, 1)
    q.set_desc(1, blk.STATUS, 1, vu.D_WRITE | vu.D_NEXT, 0)
    q.offer(0)
    eq(len(q.reap(1)), 1, "loop completed")
    g.write_fast(blk.HDR, struct.pack("<IIQ", T_IN, 0, 0))
    q.set_desc(0, blk.HDR, 16, vu.D_NEXT, 1)
    q.set_desc(1, 0x900000, 512, vu.D_WRITE | vu.D_NEXT, 2)
    q.set_desc(2, blk.STATUS, 1, vu.D_WRITE)
    q.offer(0)
    q.reap(1)
    eq(g.read_fast(blk.STATUS, 1)[0], S_IOERR, "outside guest memory")
    eq(blk.run(3, T_IN, 0, nbytes=512)[0], S_OK, "a good request after")
    fe.close()
    env.stop(p)


def case_restart_resubmits_inflight(env):
    """kill -9 with reads in flight; the next blockport resubmits them."""
    # The reads wait in the server's fault-injection delay.  (nbdkit's delay
    # filter was used first, but nbdkit 1.32 can abort with "raw_send_socket:
    # Assertion `sock >= 0'" when its client dies mid-read, so the second
    # vhost found no server.)
    img = env.path("disk.raw")
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    srv_env = dict(os.environ, BLOCKPORT_FAULTS="op=read,err=none,delay=2000")
    # Enough workers that all four reads sleep at once.
    uri = env.nbd_serve("--workers", "8", "--format", "raw", img,
                        extra_env=srv_env)
    srv = env.procs[-1]
    p = env.vhost(uri)
    fe, g, q, blk, _ = session(env, p.sock, new_inflight=True)
    data = [pattern(4096, 50 + i) for i in range(4)]
    for i in range(4):
        eq(blk.run(i, T_OUT, i * 8, data=data[i])[0], S_OK, "write %d" % i)
    for i in range(4):
        g.write_fast(blk.slot_data(i), bytes(4096))
        blk.submit(i, T_IN, i * 8, nbytes=4096)
    # Kill once all four reads wait in the server's delay (it logs each).
    check(casetest.wait_until(
        10, lambda: env.log(srv, 0).count("fault injected: delay") >= 4),
        "the reads did not reach the server: %s" % env.log(srv))
    p.kill()
    p.wait()
    eq(q.used_idx(), 4, "used entries before the crash")
    fe.close()
    p = env.vhost(uri)
    # QEMU restores last_avail_idx from the used index and hands back the
    # same memory, rings and inflight region.
    fe, _, _, _, _ = session(env, p.sock, guest=g, queue=q,
                             inflight=fe.inflight, base=q.used_idx())
    got = q.reap(4, timeout=20)
    eq(sorted(u[0] for u in got), [0, 1, 2, 3], "resubmitted heads")
    for i in range(4):
        eq(blk.status(i), S_OK, "status %d" % i)
        if g.read_fast(blk.slot_data(i), 4096) != data[i]:
            raise Failure("resubmitted read %d returned other data" % i)
    fe.close()
    env.stop(p)


def case_qcow2_overlay_over_nbd(env):
    """A qcow2 overlay whose backing file is a read-only blockport export:
    reads reach the base, a partial-cluster write and a discard stay in
    the overlay, and QEMU, opening the overlay over the same URI, agrees."""
    if not shutil.which("qemu-img"):
        raise Skip("qemu-img not installed")
    golden, ov = env.path("golden.raw"), env.path("ov.qcow2")
    base = pattern(MiB, 7) * 4
    with open(golden, "wb") as f:
        f.write(base)
    uri = env.nbd_serve("--readonly", golden)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                    "-b", uri, ov], check=True)
    p = env.vhost(ov)
    fe, g, q, blk, _ = session(env, p.sock)
    eq(blk.run(0, T_IN, 2048, nbytes=8192)[0], S_OK, "read of the base")
    eq(g.read_fast(blk.slot_data(0), 8192), base[MiB:MiB + 8192],
       "the base's bytes")
    data = pattern(1024, 8)
    eq(blk.run(1, T_OUT, 2049, data=data)[0], S_OK, "partial-cluster write")
    rng = struct.pack("<QII", 3 * MiB // 512, 128, 0)  # 64 KiB
    eq(blk.run(2, T_DISCARD, 0, data=rng)[0], S_OK, "discard")
    eq(blk.run(3, T_FLUSH, 0)[0], S_OK, "flush")
    fe.close()
    env.stop(p)
    want = bytearray(base)
    want[2049 * 512:2049 * 512 + 1024] = data
    # A discard in an overlay reads as zeroes (qemu-img, QEMU's view).
    out = env.path("out.raw")
    subprocess.run(["qemu-img", "convert", "-f", "qcow2", "-O", "raw", ov,
                    out], check=True)
    with open(out, "rb") as f:
        got = f.read()
    eq(len(got), len(want), "size")
    cow = slice(MiB, MiB + 64 * 1024)
    eq(got[cow], bytes(want[cow]), "the written cluster kept the rest")
    dis = slice(3 * MiB, 3 * MiB + 64 * 1024)
    check(got[dis] in (bytes(64 * 1024), base[dis]), "discarded range")
    want[dis] = got[dis]
    check(got == bytes(want), "QEMU's view of the overlay")


CASES = [(n[5:], f) for n, f in sorted(globals().items())
         if n.startswith("case_")]


def run_case(fn, make_env=None):
    """Run case FN in a fresh environment (MAKE_ENV(), default Env())."""
    env = (make_env or Env)()
    try:
        fn(env)
    except Exception as e:
        # The logs of every process the case started, after its FAIL line.
        e.details = []
        for p in env.procs:
            e.details.append("--- log of %s" % " ".join(p.args[:2]))
            e.details += env.log(p).splitlines()
        raise
    finally:
        env.cleanup()


def main():
    if not casetest.blockport_usable(BLOCKPORT):
        return 77
    if "vhost" not in casetest.built_with(BLOCKPORT):
        print("SKIP: blockport was built without vhost")
        return 77
    return casetest.run(CASES, sys.argv[1:], run_case)


if __name__ == "__main__":
    sys.exit(main())
