#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of fuzz-vhost-user (stdlib only).

    tests/fuzz/make-vhost-user-corpus.py  # (re)writes tests/fuzz/corpus/vhost-user/

An input is vhost-user messages as they go on the wire (a header of
request, flags and size, then the payload); fuzz-vhost-user.c attaches the
descriptors each request carries (guest memory of 64 KiB per region, an
eventfd per kick, call or err).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "vhost-user")

GET_FEATURES, SET_FEATURES, SET_OWNER, RESET_OWNER, SET_MEM_TABLE = 1, 2, 3, 4, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM = 15, 16, 17
SET_VRING_ENABLE, GET_CONFIG, SET_CONFIG = 18, 24, 25
GET_INFLIGHT_FD, SET_INFLIGHT_FD = 31, 32
VERSION, NEED_REPLY = 0x1, 0x8
PROTOCOL = (1 << 0) | (1 << 3) | (1 << 9) | (1 << 12)
UVA = 0x7F0000000000


def msg(req, payload=b"", flags=VERSION, size=None):
    return struct.pack("<III", req, flags, len(payload) if size is None else size) + payload


def u64(req, v, flags=VERSION):
    return msg(req, struct.pack("<Q", v), flags)


def state(req, index, num):
    return msg(req, struct.pack("<II", index, num))


def mem_table(*regions):
    body = struct.pack("<II", len(regions), 0)
    for gpa, size, uva, off in regions:
        body += struct.pack("<QQQQ", gpa, size, uva, off)
    return msg(SET_MEM_TABLE, body)


def vring_addr(index, desc, used, avail):
    return msg(SET_VRING_ADDR, struct.pack("<IIQQQQ", index, 0, desc, used, avail, 0))


def inflight(req, size, offset, queues, qsize):
    return msg(req, struct.pack("<QQHH4x", size, offset, queues, qsize))


def config(offset, size):
    return msg(GET_CONFIG, struct.pack("<III", offset, size, 0) + bytes(size), size=12 + size)


HANDSHAKE = (msg(GET_FEATURES) + msg(GET_PROTOCOL_FEATURES)
             + u64(SET_PROTOCOL_FEATURES, PROTOCOL) + msg(GET_QUEUE_NUM)
             + msg(SET_OWNER) + u64(SET_FEATURES, (1 << 32) | (1 << 30)))

START_RING = (mem_table((0, 0x10000, UVA, 0))
              + state(SET_VRING_NUM, 0, 128) + state(SET_VRING_BASE, 0, 0)
              + vring_addr(0, UVA, UVA + 0x2000, UVA + 0x1000)
              + u64(SET_VRING_CALL, 0) + u64(SET_VRING_KICK, 0)
              + state(SET_VRING_ENABLE, 0, 1))

SEEDS = {
    "handshake": HANDSHAKE,
    "config": HANDSHAKE + config(0, 60) + config(20, 8) + config(250, 256),
    "start-stop-ring": HANDSHAKE + START_RING + state(GET_VRING_BASE, 0, 0),
    "two-regions": HANDSHAKE + mem_table((0, 0x8000, UVA, 0), (0x8000, 0x8000, UVA + 0x8000, 0x8000)),
    # A region larger than its file: rings in the part past the end.
    "region-past-the-file": HANDSHAKE + mem_table((0, 0x100000, UVA, 0x8000))
    + state(SET_VRING_NUM, 0, 128) + state(SET_VRING_BASE, 0, 0)
    + vring_addr(0, UVA + 0x20000, UVA + 0x22000, UVA + 0x21000)
    + u64(SET_VRING_CALL, 0) + u64(SET_VRING_KICK, 0) + state(SET_VRING_ENABLE, 0, 1),
    "inflight": HANDSHAKE + inflight(GET_INFLIGHT_FD, 0, 0, 2, 128)
    + inflight(SET_INFLIGHT_FD, 0x10000, 0, 2, 128) + START_RING,
    # An inflight region past the end of its file.
    "inflight-past-the-file": HANDSHAKE + inflight(SET_INFLIGHT_FD, 0x10000, 0x20000, 2, 128)
    + START_RING,
    "reply-ack": HANDSHAKE + u64(SET_FEATURES, 1 << 30, VERSION | NEED_REPLY)
    + msg(SET_VRING_NUM, b"\0" * 8, VERSION | NEED_REPLY) + msg(99, b"", VERSION | NEED_REPLY),
    "no-fd-and-reset": HANDSHAKE + u64(SET_VRING_KICK, 0x100) + u64(SET_VRING_ERR, 1)
    + msg(RESET_OWNER) + state(SET_VRING_NUM, 7, 128),
    "short-and-too-large": HANDSHAKE + msg(SET_VRING_ADDR, b"\0" * 4) + msg(SET_CONFIG, b"", size=4096),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
