#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of fuzz-virtq (stdlib only).

    tests/fuzz/make-virtq-corpus.py     # (re)writes tests/fuzz/corpus/virtq/

An input is 4 parameter bytes (queue size exponent, ring flags, starting
avail index, disk size in 4 KiB units) and then guest memory: region A at
guest 0x0-0x3fff, region B at 0x4000-0x7fff (see fuzz-virtq.c).  The rings
are at fixed addresses in region A.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "virtq")

DESC, AVAIL, USED = 0x0, 0x400, 0x600
HDR, DATA, STATUS, TABLE = 0x1000, 0x1200, 0x1F00, 0x2000
NEXT, WRITE, INDIRECT = 1, 2, 4
T_IN, T_OUT, T_FLUSH, T_GET_ID, T_DISCARD, T_ZEROES = 0, 1, 4, 8, 11, 13
EVENT_IDX, F_INDIRECT = 1, 2


class Guest:
    def __init__(self, num=8):
        self.num = num
        self.mem = bytearray(0x8000)
        self.avail = 0

    def put(self, addr, data):
        self.mem[addr:addr + len(data)] = data

    def desc(self, i, addr, length, flags=0, nxt=0, table=DESC):
        self.put(table + 16 * i, struct.pack("<QIHH", addr, length, flags, nxt))

    def header(self, addr, type_, sector):
        self.put(addr, struct.pack("<IIQ", type_, 0, sector))

    def offer(self, head):
        self.put(AVAIL + 4 + 2 * (self.avail % self.num), struct.pack("<H", head))
        self.avail += 1
        self.put(AVAIL + 2, struct.pack("<H", self.avail))

    def request(self, head, type_, sector, data_len, writes, hdr=HDR):
        self.header(hdr, type_, sector)
        self.desc(head, hdr, 16, NEXT, head + 1)
        self.desc(head + 1, DATA, data_len, NEXT | (WRITE if writes else 0),
                  head + 2)
        self.desc(head + 2, STATUS + head, 1, WRITE)
        self.offer(head)

    def write(self, name, flags=EVENT_IDX | F_INDIRECT, disk_4k=16):
        exp = self.num.bit_length() - 1
        mem = bytes(self.mem).rstrip(b"\0")
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes([exp, flags, 0, disk_4k]) + mem)


def main():
    os.makedirs(OUT, exist_ok=True)

    g = Guest()
    g.request(0, T_IN, 8, 4096, True)
    g.write("read")

    g = Guest()
    g.header(HDR, T_OUT, 0)
    g.desc(0, HDR, 16, NEXT, 1)
    g.desc(1, DATA, 512, NEXT, 2)
    g.desc(2, DATA + 0x400, 1024, NEXT, 3)
    g.desc(3, STATUS, 1, WRITE)
    g.offer(0)
    g.write("write-two-pieces")

    g = Guest()
    g.header(HDR, T_OUT, 2)
    g.desc(0, HDR, 16, NEXT, 1, table=TABLE)
    g.desc(1, DATA, 512, NEXT, 2, table=TABLE)
    g.desc(2, STATUS, 1, WRITE, table=TABLE)
    g.desc(5, TABLE, 48, INDIRECT)
    g.offer(5)
    g.write("indirect")

    g = Guest()
    g.header(HDR, T_IN, 0)
    g.desc(0, HDR, 16, NEXT, 1)
    g.desc(1, 0x3F00, 0x200, WRITE | NEXT, 2)  # crosses into region B
    g.desc(2, STATUS, 1, WRITE)
    g.offer(0)
    g.write("cross-region")

    g = Guest()
    g.desc(0, HDR, 16, NEXT, 1)
    g.desc(1, STATUS, 1, WRITE | NEXT, 0)
    g.offer(0)
    g.write("loop")

    g = Guest()
    g.header(HDR, T_DISCARD, 0)
    g.put(HDR + 16, struct.pack("<QII", 0, 8, 0) + struct.pack("<QII", 64, 8, 0))
    g.desc(0, HDR, 48, NEXT, 1)
    g.desc(1, STATUS, 1, WRITE)
    g.offer(0)
    g.header(HDR + 0x100, T_ZEROES, 0)
    g.put(HDR + 0x110, struct.pack("<QII", 16, 8, 1))
    g.desc(2, HDR + 0x100, 32, NEXT, 3)
    g.desc(3, STATUS + 2, 1, WRITE)
    g.offer(2)
    g.write("discard-zeroes", disk_4k=64)

    g = Guest()
    g.request(0, T_GET_ID, 0, 20, True)
    g.header(HDR + 0x40, T_FLUSH, 0)
    g.desc(3, HDR + 0x40, 16, NEXT, 4)
    g.desc(4, STATUS + 3, 1, WRITE)
    g.offer(3)
    g.request(5, 99, 0, 16, False, hdr=HDR + 0x80)
    g.write("get-id-flush-unsupported")

    # Inflight state in the second half of region B: heads 2 and 6 in
    # flight, 2 popped first.
    g = Guest()
    g.request(0, T_IN, 0, 512, True)
    region = struct.pack("<QHHHH", 0, 1, 8, 0, 0)
    for h in range(8):
        inflight = 1 if h in (2, 6) else 0
        counter = {2: 5, 6: 9}.get(h, 0)
        region += struct.pack("<B5xHQ", inflight, 0, counter)
    g.put(0x6000, region)
    g.write("inflight")


if __name__ == "__main__":
    main()
