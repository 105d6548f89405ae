# SPDX-License-Identifier: BSD-3-Clause
"""A small vhost-user front end with a simulated virtio-blk guest (standard
library only), for testing `blockport vhost` without a VM.

It negotiates as QEMU 7.2 does, shares guest memory from a memfd as two
regions at non-zero file offsets (two adjacent in guest addresses, one far
above), lays out split rings, and plays the guest driver: writes
descriptors and avail entries, kicks, and waits for used entries on the
call eventfd.
"""

import mmap
import os
import select
import socket
import struct
import time

GET_FEATURES, SET_FEATURES, SET_OWNER = 1, 2, 3
SET_MEM_TABLE = 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL = 12, 13
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM = 15, 16, 17
SET_VRING_ENABLE, GET_CONFIG = 18, 24
GET_INFLIGHT_FD, SET_INFLIGHT_FD = 31, 32

F_PROTOCOL_FEATURES = 1 << 30
F_VERSION_1, F_INDIRECT, F_EVENT_IDX = 1 << 32, 1 << 28, 1 << 29
P_MQ, P_REPLY_ACK, P_CONFIG, P_INFLIGHT = 1 << 0, 1 << 3, 1 << 9, 1 << 12
NEED_REPLY, REPLY = 0x8, 0x4

BLK_F_RO, BLK_F_FLUSH, BLK_F_DISCARD, BLK_F_WRITE_ZEROES = 5, 9, 13, 14
T_IN, T_OUT, T_FLUSH, T_GET_ID, T_DISCARD, T_WRITE_ZEROES = 0, 1, 4, 8, 11, 13
S_OK, S_IOERR, S_UNSUPP = 0, 1, 2
D_NEXT, D_WRITE, D_INDIRECT = 1, 2, 4

MiB = 1 << 20
# Guest memory: (gpa, size, file offset).  The first two are adjacent in
# guest addresses, not in the file (nor in the back end's mappings).
REGIONS = [(0, 4 * MiB, 1 * MiB), (4 * MiB, 4 * MiB, 6 * MiB),
           (0x100000000, 1 * MiB, 11 * MiB)]
UVA = 0x7F0000000000  # the front end's "virtual addresses": gpa + UVA


class VhostError(Exception):
    pass


class Guest:
    """Guest memory in a memfd, addressed by guest-physical address."""

    def __init__(self):
        self.fd = os.memfd_create("guest", 0)
        size = max(off + sz for _, sz, off in REGIONS)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)

    def off(self, gpa, n=1):
        for base, size, off in REGIONS:
            if base <= gpa and gpa + n <= base + size:
                return off + gpa - base
        raise ValueError("guest address 0x%x not in one region" % gpa)

    def write(self, gpa, data):
        for i in range(len(data)):  # byte-wise: may cross regions
            self.map[self.off(gpa + i)] = data[i]

    def write_fast(self, gpa, data):
        o = self.off(gpa, len(data))
        self.map[o:o + len(data)] = data

    def read(self, gpa, n):
        return bytes(self.map[self.off(gpa + i)] for i in range(n))

    def read_fast(self, gpa, n):
        o = self.off(gpa, n)
        return bytes(self.map[o:o + n])

    def close(self):
        self.map.close()
        os.close(self.fd)


class Queue:
    """A split ring in the first region, queue QI of NUM entries."""

    def __init__(self, guest, qi, num=128):
        self.g, self.qi, self.num = guest, qi, num
        base = 0x10000 + qi * 0x10000
        self.desc, self.avail = base, base + 16 * num
        self.used = (self.avail + 6 + 2 * num + 3) & ~3
        self.avail_idx = 0
        self.used_seen = 0
        self.kick = os.eventfd(0, os.EFD_NONBLOCK)
        self.call = os.eventfd(0, os.EFD_NONBLOCK)
        self.g.write_fast(base, bytes(0x10000))
        self.free = list(range(num))

    def set_desc(self, i, addr, length, flags=0, nxt=0, table=None):
        at = (self.desc if table is None else table) + 16 * i
        self.g.write_fast(at, struct.pack("<QIHH", addr, length, flags, nxt))

    def offer(self, head, kick=True):
        slot = self.avail + 4 + 2 * (self.avail_idx % self.num)
        self.g.write_fast(slot, struct.pack("<H", head))
        self.avail_idx = (self.avail_idx + 1) & 0xFFFF
        self.g.write_fast(self.avail + 2, struct.pack("<H", self.avail_idx))
        if kick:
            os.eventfd_write(self.kick, 1)

    def used_idx(self):
        return struct.unpack("<H", self.g.read_fast(self.used + 2, 2))[0]

    def set_used_event(self, v):
        self.g.write_fast(self.avail + 4 + 2 * self.num, struct.pack("<H", v))

    def reap(self, want, timeout=10):
        """Wait for WANT more used entries; return [(id, len)]."""
        out, deadline = [], time.time() + timeout
        while len(out) < want:
            while self.used_seen != self.used_idx() and len(out) < want:
                at = self.used + 4 + 8 * (self.used_seen % self.num)
                out.append(struct.unpack("<II", self.g.read_fast(at, 8)))
                self.used_seen = (self.used_seen + 1) & 0xFFFF
            # Ask for an interrupt at the next entry (EVENT_IDX).
            self.set_used_event(self.used_seen)
            if len(out) >= want:
                break
            left = deadline - time.time()
            if left <= 0:
                raise VhostError("timed out with %d of %d used entries"
                                 % (len(out), want))
            if select.select([self.call], [], [], min(left, 0.2))[0]:
                os.eventfd_read(self.call)
        return out

    def close(self):
        os.close(self.kick)
        os.close(self.call)


class Frontend:
    def __init__(self, path, timeout=30):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.protocol = 0

    def close(self):
        self.s.close()

    def send(self, req, payload=b"", fds=(), need_reply=False):
        flags = 1 | (NEED_REPLY if need_reply else 0)
        data = struct.pack("<III", req, flags, len(payload)) + payload
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                struct.pack("%di" % len(fds), *fds))] if fds else []
        self.s.sendmsg([data], anc)

    def recv(self, req):
        msg, anc, _, _ = self.s.recvmsg(4096, socket.CMSG_SPACE(4 * 8))
        if len(msg) < 12:
            raise VhostError("short reply to %d" % req)
        r, flags, size = struct.unpack_from("<III", msg)
        while len(msg) < 12 + size:
            more = self.s.recv(12 + size - len(msg))
            if not more:
                raise VhostError("connection closed")
            msg += more
        if r != req or not flags & REPLY:
            raise VhostError("reply %d (flags 0x%x) to %d" % (r, flags, req))
        fds = []
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds += struct.unpack("%di" % (len(data) // 4), data)
        return msg[12:12 + size], fds

    def call(self, req, payload=b"", fds=()):
        self.send(req, payload, fds)
        return self.recv(req)

    def get_u64(self, req):
        return struct.unpack("<Q", self.call(req)[0])[0]

    def set(self, req, payload=b"", fds=()):
        """A request without a reply of its own: acknowledged if REPLY_ACK
        was negotiated; raises on a non-zero acknowledgement."""
        ack = bool(self.protocol & P_REPLY_ACK)
        self.send(req, payload, fds, need_reply=ack)
        if ack:
            v = struct.unpack("<Q", self.recv(req)[0])[0]
            if v:
                raise VhostError("request %d failed" % req)

    def set_u64(self, req, v, fds=()):
        self.set(req, struct.pack("<Q", v), fds)

    def negotiate(self, extra_features=0):
        self.features = self.get_u64(GET_FEATURES)
        if not self.features & F_PROTOCOL_FEATURES:
            raise VhostError("no protocol features")
        want = P_MQ | P_REPLY_ACK | P_CONFIG | P_INFLIGHT
        self.backend_protocol = self.get_u64(GET_PROTOCOL_FEATURES)
        self.set_u64(SET_PROTOCOL_FEATURES, self.backend_protocol & want)
        self.protocol = self.backend_protocol & want
        self.queues = self.get_u64(GET_QUEUE_NUM)
        self.set(SET_OWNER)
        return self.features

    def config(self, size=60, offset=0):
        data, _ = self.call(GET_CONFIG, struct.pack("<III", offset, size, 0)
                            + bytes(size))
        if len(data) != 12 + size:
            raise VhostError("GET_CONFIG answered %d bytes" % len(data))
        return data[12:]

    def get_inflight(self, queues, qsize):
        data, fds = self.call(GET_INFLIGHT_FD,
                              struct.pack("<QQHH4x", 0, 0, queues, qsize))
        size, off, _, _ = struct.unpack("<QQHH4x", data)
        if len(fds) != 1:
            raise VhostError("GET_INFLIGHT_FD without a descriptor")
        return fds[0], size, off

    def set_inflight(self, fd, size, off, queues, qsize):
        self.set(SET_INFLIGHT_FD, struct.pack("<QQHH4x", size, off, queues,
                                              qsize), [fd])

    def set_mem_table(self, guest):
        payload = struct.pack("<II", len(REGIONS), 0)
        for gpa, size, off in REGIONS:
            payload += struct.pack("<QQQQ", gpa, size, gpa + UVA, off)
        self.set(SET_MEM_TABLE, payload, [guest.fd] * len(REGIONS))

    def start_queue(self, q, features, base=0):
        self.set(SET_VRING_NUM, struct.pack("<II", q.qi, q.num))
        self.set(SET_VRING_BASE, struct.pack("<II", q.qi, base))
        self.set(SET_VRING_ADDR, struct.pack(
            "<IIQQQQ", q.qi, 0, q.desc + UVA, q.used + UVA, q.avail + UVA, 0))
        self.set_u64(SET_VRING_KICK, q.qi, [q.kick])
        self.set_u64(SET_VRING_CALL, q.qi, [q.call])
        self.set(SET_VRING_ENABLE, struct.pack("<II", q.qi, 1))

    def stop_queue(self, q):
        data, _ = self.call(GET_VRING_BASE, struct.pack("<II", q.qi, 0))
        return struct.unpack("<II", data)[1]


class BlkDriver:
    """virtio-blk requests on a Queue: header, data, status in guest
    memory at fixed slots per descriptor head."""

    HDR, STATUS, DATA = 0x100000, 0x180000, 0x200000  # in region 0

    def __init__(self, q):
        self.q = q
        self.g = q.g
        self.data_size = 16384  # per slot

    def slot_data(self, head):
        return self.DATA + head * self.data_size

    def submit(self, head, type_, sector, data=None, nbytes=0, buf=None,
               kick=True):
        """HEAD's chain: header, one data buffer (at BUF, default the
        slot), status.  Uses descriptors head*3 .. head*3+2 of a ring of at
        least 3x the heads in use."""
        g, q = self.g, self.q
        d0, d1, d2 = head, head + q.num // 3, head + 2 * (q.num // 3)
        hdr = self.HDR + 16 * head
        g.write_fast(hdr, struct.pack("<IIQ", type_, 0, sector))
        g.write_fast(self.STATUS + head, b"\xee")
        addr = self.slot_data(head) if buf is None else buf
        if data is not None:
            g.write(addr, data)
            nbytes = len(data)
        writes = type_ in (T_IN, T_GET_ID)
        q.set_desc(d0, hdr, 16, D_NEXT, d1 if nbytes else d2)
        q.set_desc(d1, addr, nbytes, D_NEXT | (D_WRITE if writes else 0), d2)
        q.set_desc(d2, self.STATUS + head, 1, D_WRITE)
        q.offer(d0, kick)
        return d0

    def status(self, head):
        return self.g.read_fast(self.STATUS + head, 1)[0]

    def run(self, head, type_, sector, data=None, nbytes=0, buf=None):
        self.submit(head, type_, sector, data, nbytes, buf)
        (used,) = self.q.reap(1)
        if used[0] != head:
            raise VhostError("used entry %d, expected %d" % (used[0], head))
        return self.status(head), used[1]
