#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpora of the fuzz targets (stdlib only).

    tests/fuzz/make-corpus.py        # (re)writes tests/fuzz/corpus/*/

corpus/handshake/: client byte streams for fuzz-handshake (client flags,
then options); corpus/request/: request headers for fuzz-request.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

IHAVEOPT = 0x49484156454F5054
FIXED, NO_ZEROES = 1, 2

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS = 1, 2, 3, 5
OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY = 6, 7, 8
OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS = 9, 10, 11
INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 1, 2, 3

REQUEST_MAGIC, EXTENDED_REQUEST_MAGIC = 0x25609513, 0x21E41C71
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 5, 6, 7
FLAG_FUA, FLAG_NO_HOLE, FLAG_DF, FLAG_REQ_ONE = 1, 2, 4, 8
FLAG_FAST_ZERO, FLAG_PAYLOAD_LEN = 16, 32


def flags(f):
    return struct.pack(">I", f)


def option(opt, data=b""):
    return struct.pack(">QII", IHAVEOPT, opt, len(data)) + data


def info(name, reqs=()):
    n = name.encode()
    return (struct.pack(">I", len(n)) + n + struct.pack(">H", len(reqs)) +
            b"".join(struct.pack(">H", r) for r in reqs))


def meta(name, queries=()):
    n = name.encode()
    out = struct.pack(">I", len(n)) + n + struct.pack(">I", len(queries))
    for q in queries:
        out += struct.pack(">I", len(q)) + q.encode()
    return out


HANDSHAKE = {
    "go-plain": flags(FIXED | NO_ZEROES) + option(OPT_GO, info("disk")),
    "go-structured-contexts": (
        flags(FIXED) + option(OPT_STRUCTURED_REPLY) +
        option(OPT_SET_META_CONTEXT, meta("disk", ["base:allocation"])) +
        option(OPT_GO, info("disk", [INFO_NAME, INFO_DESCRIPTION,
                                     INFO_BLOCK_SIZE]))),
    "go-extended": (
        flags(FIXED | NO_ZEROES) + option(OPT_EXTENDED_HEADERS) +
        option(OPT_LIST_META_CONTEXT, meta("")) +
        option(OPT_SET_META_CONTEXT,
               meta("ro", ["base:allocation", "qemu:allocation-depth"])) +
        option(OPT_INFO, info("ro", [INFO_NAME])) + option(OPT_GO, info("ro"))),
    "export-name-oldstyle": flags(0) + option(OPT_EXPORT_NAME, b"disk"),
    "export-name-default": flags(FIXED | NO_ZEROES) + option(OPT_EXPORT_NAME),
    "list-and-abort": (
        flags(FIXED) + option(OPT_LIST) + option(OPT_STARTTLS) +
        option(99, b"xyz") + option(OPT_ABORT)),
    # Under --tls require (the fuzzer takes the policy from the length, and
    # the two bytes after GO make it 2 mod 3): refused before STARTTLS,
    # then a second STARTTLS, then served.
    "starttls-then-go": (
        flags(FIXED) + option(OPT_LIST) + option(OPT_GO, info("disk")) +
        option(OPT_STARTTLS) + option(OPT_STARTTLS) +
        option(OPT_STRUCTURED_REPLY) + option(OPT_GO, info("disk")) + b"\0\0"),
    "meta-prefixes": (
        flags(FIXED | NO_ZEROES) + option(OPT_STRUCTURED_REPLY) +
        option(OPT_LIST_META_CONTEXT, meta("disk", ["base:", "qemu:"])) +
        option(OPT_EXTENDED_HEADERS) + option(OPT_STRUCTURED_REPLY) +
        option(OPT_GO, info(""))),
    "malformed": (
        flags(FIXED) + option(OPT_INFO, b"\0\0\0\x10ab\0\0") +
        option(OPT_STRUCTURED_REPLY) +
        option(OPT_SET_META_CONTEXT, b"\0\0\0\0\0\0\0\x02\0\0\0\x05base:") +
        option(OPT_GO, info("nosuch")) + option(OPT_GO, info("disk"))),
}


def req(typ, fl=0, cookie=1, offset=0, length=4096, extended=False,
        payload=b""):
    if extended:
        hdr = struct.pack(">IHHQQQ", EXTENDED_REQUEST_MAGIC, fl, typ, cookie,
                          offset, length)
    else:
        hdr = struct.pack(">IHHQQI", REQUEST_MAGIC, fl, typ, cookie, offset,
                          length)
    return hdr + payload


def blocks(pattern):
    """4 KiB blocks, 'd' data and 'z' zero, after a request header."""
    out = req(CMD_READ, length=len(pattern) * 4096)
    for i, c in enumerate(pattern):
        out += (bytes([i + 1]) * 4096) if c == "d" else bytes(4096)
    return out


REQUEST = {
    "read": req(CMD_READ, cookie=0x1122334455667788, offset=4096),
    "read-df-fua": req(CMD_READ, FLAG_DF | FLAG_FUA, length=512),
    "write": req(CMD_WRITE, FLAG_FUA, offset=512, length=16,
                 payload=b"0123456789abcdef"),
    "flush": req(CMD_FLUSH, length=0),
    "trim": req(CMD_TRIM, offset=1 << 20, length=1 << 20),
    "cache": req(CMD_CACHE, length=65536),
    "write-zeroes": req(CMD_WRITE_ZEROES, FLAG_NO_HOLE | FLAG_FAST_ZERO,
                        length=8192),
    "block-status": req(CMD_BLOCK_STATUS, FLAG_REQ_ONE, length=1 << 30),
    "disc": req(CMD_DISC, length=0),
    "ext-read": req(CMD_READ, extended=True, offset=12000, length=345),
    "ext-write-payload": req(CMD_WRITE, FLAG_PAYLOAD_LEN, extended=True,
                             length=8, payload=b"ABCDEFGH"),
    "ext-block-status-payload": req(
        CMD_BLOCK_STATUS, FLAG_PAYLOAD_LEN, extended=True, length=16,
        payload=struct.pack(">QII", 4096, 1, 2)),
    "past-end": req(CMD_WRITE, offset=(1 << 64) - 512, length=1024),
    "zero-runs": blocks("dzd"),
}


def write(kind, files):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    for name, data in sorted(files.items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"{d}: {len(files)} inputs")


def main():
    if len(sys.argv) != 1:
        sys.exit(__doc__)
    write("handshake", HANDSHAKE)
    write("request", REQUEST)


if __name__ == "__main__":
    main()
