#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""nbdload: a pipelining load generator for NBD servers.

It sends a whole batch of requests without waiting for any reply and then
accounts for every reply: each cookie answered exactly once, without an
error, and every read returning the bytes the batch (or an earlier one)
wrote.  Two orders:

  send-first  every request (headers and write payloads) is on the wire
              before the first reply is read, as the NBD reference test
              client does.  Possible only while the server can keep
              reading, i.e. while its replies fit the socket buffers
              (small reads, writes of any size).
  concurrent  everything is still sent without waiting for replies, but
              replies are read as they come, so neither side can block the
              other on full socket buffers (large reads with writes).

One thread drives a non-blocking socket with select(), so a TLS session
(ssl.SSLSocket) works as well as a plain one.  The handshake goes through
nbdwire.  Data is a pattern that names its own offset: every big-endian
64-bit word holds (absolute offset + seed), so a byte that lands in the
wrong place, or a header taken for payload, shows.

As a command:
  nbdload.py --unix PATH [--export NAME] [--extended|--structured]
             [--order send-first|concurrent] [--count N] [--size BYTES]
             [--write] [--offset BYTES] [--seed N]
prints a summary and exits 0 if every reply arrived as expected, 1 if not.
"""

import argparse
import array
import select
import socket
import ssl
import struct
import sys
import time

import nbdwire as nw

KiB = 1024
MiB = 1024 * KiB

SIMPLE_MAGIC = nw.NBD_SIMPLE_REPLY_MAGIC
STRUCTURED_MAGIC = nw.NBD_STRUCTURED_REPLY_MAGIC
EXTENDED_MAGIC = nw.NBD_EXTENDED_REPLY_MAGIC


def pattern(offset, length, seed=1):
    """The bytes that belong at [offset, offset+length) for SEED; offset
    and length are multiples of 8."""
    words = array.array("Q", range(offset + seed, offset + seed + length, 8))
    if sys.byteorder == "little":
        words.byteswap()
    return words.tobytes()


class Op:
    """One request of a batch: READ (checked against the pattern of SEED)
    or WRITE (of the pattern of SEED)."""

    __slots__ = ("cmd", "offset", "length", "seed")

    def __init__(self, cmd, offset, length, seed=1):
        self.cmd = cmd
        self.offset = offset
        self.length = length
        self.seed = seed

    def __repr__(self):
        name = "READ" if self.cmd == nw.NBD_CMD_READ else "WRITE"
        return "%s(%d+%d)" % (name, self.offset, self.length)


def reads(offset, size, count, seed=1):
    """COUNT reads of SIZE bytes, back to back from OFFSET."""
    return [Op(nw.NBD_CMD_READ, offset + i * size, size, seed)
            for i in range(count)]


def writes(offset, size, count, seed=1):
    """COUNT writes of SIZE bytes, back to back from OFFSET."""
    return [Op(nw.NBD_CMD_WRITE, offset + i * size, size, seed)
            for i in range(count)]


class Result:
    """What came back for a batch."""

    def __init__(self, nops):
        self.nops = nops
        self.answered = 0
        self.errors = {}        # cookie -> NBD error
        self.bad_data = []      # cookies of reads with wrong content
        self.problems = []      # protocol violations, as text
        self.missing = []       # cookies never answered (filled at the end)
        self.sent_bytes = 0
        self.total_bytes = 0
        self.elapsed = 0.0

    @property
    def ok(self):
        return (self.answered == self.nops and not self.errors and
                not self.bad_data and not self.problems)

    def summary(self):
        s = ("%d of %d requests answered, %d errors, %d reads with wrong "
             "data, sent %d of %d bytes, %.2f s"
             % (self.answered, self.nops, len(self.errors),
                len(self.bad_data), self.sent_bytes, self.total_bytes,
                self.elapsed))
        if self.missing:
            s += "; unanswered cookies %s" % _cookie_list(self.missing)
        if self.errors:
            some = sorted(self.errors.items())[:5]
            s += "; errors %s" % ", ".join("%d:%d" % kv for kv in some)
        if self.problems:
            s += "; " + "; ".join(self.problems[:3])
        return s


def _cookie_list(cookies):
    head = ", ".join(str(c) for c in cookies[:8])
    return head + (" ... (%d)" % len(cookies) if len(cookies) > 8 else "")


def encode(ops, extended):
    """The wire bytes of the whole batch; cookie i+1 is ops[i]."""
    parts = []
    for i, op in enumerate(ops):
        flags, payload = 0, b""
        if op.cmd == nw.NBD_CMD_WRITE:
            payload = pattern(op.offset, op.length, op.seed)
            if extended:
                flags |= nw.NBD_CMD_FLAG_PAYLOAD_LEN
        if extended:
            parts.append(struct.pack(">IHHQQQ", nw.NBD_EXTENDED_REQUEST_MAGIC,
                                     flags, op.cmd, i + 1, op.offset,
                                     op.length))
        else:
            parts.append(struct.pack(">IHHQQI", nw.NBD_REQUEST_MAGIC, flags,
                                     op.cmd, i + 1, op.offset, op.length))
        parts.append(payload)
    return b"".join(parts)


class _Replies:
    """Parses replies of any kind out of a byte stream."""

    def __init__(self, ops, res):
        self.ops = ops
        self.res = res
        self.buf = bytearray()
        self.done = [False] * len(ops)
        self.covered = [0] * len(ops)   # read bytes seen in chunks

    def _op(self, cookie):
        if 1 <= cookie <= len(self.ops) and not self.done[cookie - 1]:
            return self.ops[cookie - 1]
        self.res.problems.append("reply for cookie %d, which is not in "
                                 "flight" % cookie)
        return None

    def _finish(self, cookie, error):
        op = self.ops[cookie - 1]
        self.done[cookie - 1] = True
        self.res.answered += 1
        if error:
            self.res.errors[cookie] = error
            return
        got = self.covered[cookie - 1]
        if op.cmd == nw.NBD_CMD_READ and got != op.length:
            self.res.problems.append("read cookie %d: %d of %d bytes in its "
                                     "chunks" % (cookie, got, op.length))

    def _check_data(self, cookie, offset, data):
        op = self.ops[cookie - 1]
        if (offset < op.offset or offset + len(data) > op.offset + op.length
                or data != pattern(offset, len(data), op.seed)):
            if cookie not in self.res.bad_data:
                self.res.bad_data.append(cookie)
        self.covered[cookie - 1] += len(data)

    def _simple(self):
        if len(self.buf) < 16:
            return 0
        _, error, cookie = struct.unpack_from(">IIQ", self.buf)
        op = self._op(cookie)
        if op is None:
            return -1
        n = 16
        if op.cmd == nw.NBD_CMD_READ and error == 0:
            if len(self.buf) < 16 + op.length:
                return 0
            data = bytes(self.buf[16:16 + op.length])
            self._check_data(cookie, op.offset, data)
            n += op.length
        self._finish(cookie, error)
        return n

    def _chunk(self, hdr, extended):
        if len(self.buf) < hdr:
            return 0
        if extended:
            _, flags, ctype, cookie, _, length = struct.unpack_from(
                ">IHHQQQ", self.buf)
        else:
            _, flags, ctype, cookie, length = struct.unpack_from(
                ">IHHQI", self.buf)
        if length > 64 * MiB:
            self.res.problems.append("chunk of %d bytes" % length)
            return -1
        if len(self.buf) < hdr + length:
            return 0
        if self._op(cookie) is None:
            return -1
        p = bytes(self.buf[hdr:hdr + length])
        error = 0
        if ctype == nw.NBD_REPLY_TYPE_OFFSET_DATA and length >= 8:
            self._check_data(cookie, struct.unpack(">Q", p[:8])[0], p[8:])
        elif ctype == nw.NBD_REPLY_TYPE_OFFSET_HOLE and length == 12:
            off, n = struct.unpack(">QI", p)
            self._check_data(cookie, off, bytes(n))
        elif ctype & 0x8000 and length >= 4:
            error = struct.unpack(">I", p[:4])[0]
        elif ctype != nw.NBD_REPLY_TYPE_NONE:
            self.res.problems.append("cookie %d: unexpected chunk type %d"
                                     % (cookie, ctype))
        if error:
            self.res.errors[cookie] = error
        if flags & nw.NBD_REPLY_FLAG_DONE:
            self._finish(cookie, self.res.errors.get(cookie, 0))
        return hdr + length

    def feed(self, data):
        """Take received bytes; False once the stream cannot be parsed.
        (Deleting from the front of a bytearray is cheap in CPython.)"""
        self.buf += data
        while len(self.buf) >= 4:
            magic = struct.unpack_from(">I", self.buf)[0]
            if magic == SIMPLE_MAGIC:
                n = self._simple()
            elif magic == STRUCTURED_MAGIC:
                n = self._chunk(20, False)
            elif magic == EXTENDED_MAGIC:
                n = self._chunk(32, True)
            else:
                self.res.problems.append("bad reply magic 0x%08x" % magic)
                return False
            if n < 0:
                return False
            if n == 0:
                break
            del self.buf[:n]
        return True


def _readable(sock, timeout):
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    r, _, _ = select.select([sock], [], [], timeout)
    return bool(r)


def _recv(sock):
    """Bytes available now: b'' at EOF, None if nothing yet."""
    try:
        return sock.recv(1 << 20)
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return None
    except (ConnectionResetError, BrokenPipeError):
        return b""


def _send(sock, view):
    try:
        return sock.send(view[:1 << 20])
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return 0


def run(sock, ops, extended=False, order="send-first", deadline=60.0):
    """Send OPS on SOCK (past the handshake) and read their replies.
    Returns a Result; the connection is left as it is (the caller closes
    it).  Gives up after DEADLINE seconds."""
    assert order in ("send-first", "concurrent")
    res = Result(len(ops))
    out = memoryview(encode(ops, extended))
    res.total_bytes = len(out)
    parser = _Replies(ops, res)
    sock.setblocking(False)
    t0 = time.monotonic()
    end = t0 + deadline
    eof = False
    while res.answered < len(ops) and not eof and not res.problems:
        now = time.monotonic()
        if now >= end:
            break
        sending = res.sent_bytes < len(out)
        reading = order == "concurrent" or not sending
        if sending:
            w = [sock]
            r = [sock] if reading else []
            if reading and _readable(sock, 0):
                r_ready, w_ready = [sock], []
            else:
                r_ready, w_ready, _ = select.select(r, w, [],
                                                    min(1.0, end - now))
            if w_ready:
                res.sent_bytes += _send(sock, out[res.sent_bytes:])
        else:
            r_ready = [sock] if _readable(sock, min(1.0, end - now)) else []
        if r_ready:
            data = _recv(sock)
            if data == b"":
                eof = True
                res.problems.append("the server closed the connection")
            elif data and not parser.feed(data):
                break
    res.elapsed = time.monotonic() - t0
    res.missing = [i + 1 for i, d in enumerate(parser.done) if not d]
    return res


def connect(unix=None, tcp=None, export="", style="simple", tls_ca=None,
            timeout=10.0):
    """A connection in transmission: nbdwire's handshake over a Unix or
    TCP socket, STARTTLS first when TLS_CA (a CA certificate file) is
    given, then the reply style ('simple', 'structured', 'extended') and
    NBD_OPT_GO.  Returns the nbdwire.Client; its .sock is what run()
    takes."""
    if unix:
        c = nw.Client.unix(unix, timeout)
    else:
        c = nw.Client.tcp(tcp[0], tcp[1], timeout)
    c.handshake()
    if tls_ca:
        res = c.opt_starttls()
        if not res.ok:
            raise nw.ProtocolError("STARTTLS: %s" % nw.rep_name(res.type))
        ctx = ssl.create_default_context(cafile=tls_ca)
        ctx.check_hostname = False
        c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
    if style == "extended":
        res = c.opt_extended_headers()
    elif style == "structured":
        res = c.opt_structured_reply()
    if style != "simple" and not res.ok:
        raise nw.ProtocolError("%s replies: %s" % (style,
                                                   nw.rep_name(res.type)))
    res = c.opt_go(export)
    if not res.ok:
        raise nw.ProtocolError("NBD_OPT_GO %r: %s" % (export,
                                                      nw.rep_name(res.type)))
    return c


def disconnect(c):
    """NBD_CMD_DISC, then close (the socket may be non-blocking now)."""
    try:
        c.sock.setblocking(True)
        c.sock.settimeout(5)
        c.send_request(nw.NBD_CMD_DISC, track=False)
    except OSError:
        pass
    c.close()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix", metavar="PATH")
    where.add_argument("--tcp", metavar="HOST:PORT")
    ap.add_argument("--export", default="")
    ap.add_argument("--tls-ca", metavar="FILE",
                    help="STARTTLS, trusting this CA certificate")
    style = ap.add_mutually_exclusive_group()
    style.add_argument("--structured", action="store_const", dest="style",
                       const="structured")
    style.add_argument("--extended", action="store_const", dest="style",
                       const="extended")
    ap.add_argument("--order", choices=("send-first", "concurrent"),
                    default="send-first")
    ap.add_argument("--count", type=int, default=4096)
    ap.add_argument("--size", type=int, default=KiB,
                    help="bytes per request (a multiple of 8)")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--write", action="store_true",
                    help="write the pattern instead of reading it back")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=60.0)
    a = ap.parse_args(argv)
    tcp = None
    if a.tcp:
        host, _, port = a.tcp.rpartition(":")
        tcp = (host.strip("[]"), int(port))
    make = writes if a.write else reads
    ops = make(a.offset, a.size, a.count, a.seed)
    c = connect(a.unix, tcp, a.export, a.style or "simple", a.tls_ca)
    res = run(c.sock, ops, a.style == "extended", a.order, a.deadline)
    disconnect(c)
    print(res.summary())
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
