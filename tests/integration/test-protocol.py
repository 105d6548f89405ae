#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""NBD protocol-conformance tests for blockport.

Run:  BLOCKPORT=/path/to/blockport /usr/bin/python3 test-protocol.py [CASE...]

Each case starts its own server(s) on a Unix socket in a temporary
directory, talks raw NBD to it through nbdwire (standard library only, so
extended headers can be tested without a recent libnbd or QEMU), and stops
it with SIGTERM, expecting exit status 0.  Prints "ok NAME" or
"FAIL NAME: why" per case and a closing "N passed, M failed, K skipped"
line.
Exit status: 0 all passed, 1 any failure, 77 when BLOCKPORT is unusable
or no case passed (all skipped).
"""

import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import casetest  # noqa: E402
import nbdwire as nw  # noqa: E402
from casetest import Failure, check, eq  # noqa: E402
from nbdwire import (  # noqa: E402
    NBD_CMD_FLAG_DF, NBD_CMD_FLAG_FUA, NBD_CMD_READ, NBD_CMD_WRITE,
    NBD_STATE_HOLE, NBD_STATE_ZERO, Client, ProtocolError, rep_name)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MAX_PAYLOAD = 32 * MiB

BLOCKPORT = os.environ.get("BLOCKPORT", "")


def rep_eq(res, want, what):
    """res is an OptionResult or OptionReply; compare its reply type."""
    if res.type != want:
        raise Failure("%s: got %s, want %s" % (what, rep_name(res.type),
                                               rep_name(want)))


# ------------------------------------------------------------ checked client


class TClient(Client):
    """A Client whose every completed reply is checked against the rules
    that hold for all replies in the negotiated mode."""

    def wait(self, cookie):
        r = Client.wait(self, cookie)
        check_shape(self, r)
        return r


def check_shape(c, r):
    req = r.request
    chunks = r.chunks
    check(chunks, "no reply for cookie %d" % req.cookie)
    for i, ch in enumerate(chunks):
        last = i == len(chunks) - 1
        check(ch.done == last,
              "cookie %d: DONE flag on chunk %d of %d (%r)"
              % (req.cookie, i + 1, len(chunks), ch))
        if c.extended:
            check(ch.kind == "extended",
                  "extended headers negotiated but got a %s reply (%r)"
                  % (ch.kind, ch))
            check(ch.hdr_offset == req.offset,
                  "extended reply header offset %d != request offset %d "
                  "(%r)" % (ch.hdr_offset, req.offset, ch))
        elif c.structured:
            check(ch.kind in ("simple", "structured"),
                  "got a %s reply with structured replies (%r)"
                  % (ch.kind, ch))
            if ch.kind == "simple":
                check(len(chunks) == 1, "simple reply mixed with chunks")
                check(req.type != NBD_CMD_READ or ch.error != 0,
                      "successful READ answered with a simple reply")
        else:
            check(ch.kind == "simple",
                  "structured replies not negotiated but got a %s reply "
                  "(%r)" % (ch.kind, ch))
        if ch.kind != "simple" and ch.type & 0x8000:
            check(len(ch.message) <= 4096, "error message > 4096 bytes")
        if ch.kind != "simple" and ch.type in (
                nw.NBD_REPLY_TYPE_BLOCK_STATUS,
                nw.NBD_REPLY_TYPE_BLOCK_STATUS_EXT):
            for ln, _ in ch.extents:
                check(ln > 0, "zero-length extent in %r" % ch)
        if ch.kind == "extended":
            check(ch.type != nw.NBD_REPLY_TYPE_BLOCK_STATUS,
                  "compact BLOCK_STATUS chunk with extended headers (%r)"
                  % ch)
        elif ch.kind == "structured":
            check(ch.type != nw.NBD_REPLY_TYPE_BLOCK_STATUS_EXT,
                  "BLOCK_STATUS_EXT without extended headers (%r)" % ch)
    if r.error == 0 and req.type == NBD_CMD_READ:
        r.content()  # raises ProtocolError on gaps/overlaps/out of range


# -------------------------------------------------------------------- server


class Server:
    """`blockport serve` on a Unix socket in tmpdir."""

    seq = 0

    def __init__(self, tmpdir, images, options=(), tcp=None):
        Server.seq += 1
        n = Server.seq
        self.tmpdir = tmpdir
        self.sock = os.path.join(tmpdir, "s%d.sock" % n)
        self.pidfile = os.path.join(tmpdir, "s%d.pid" % n)
        self.logfile = os.path.join(tmpdir, "s%d.log" % n)
        self.tcp = tcp
        listen = (["--bind", tcp[0], "--port", str(tcp[1])] if tcp
                  else ["--unix", self.sock])
        self.argv = ([BLOCKPORT, "serve"] + listen +
                     ["--pid-file", self.pidfile] + list(options) +
                     list(images))
        self.proc = None

    def start(self):
        self.log = open(self.logfile, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.exists(self.pidfile):
                with open(self.pidfile) as f:
                    content = f.read()
                if content.strip():
                    self.pid_content = content
                    return self
            rc = self.proc.poll()
            if rc is not None:
                raise Failure("server exited with status %d before writing "
                              "its pid file: %s" % (rc, self.log_tail()))
            time.sleep(0.02)
        raise Failure("no pid file after 10 s: %s" % self.log_tail())

    def log_tail(self, n=300):
        try:
            with open(self.logfile, "rb") as f:
                data = f.read()
        except OSError:
            return "(no log)"
        text = data[-n:].decode("utf-8", "replace").strip()
        return "log: %r" % text if text else "(empty log)"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def conn_threads(self):
        """The names of the server's connection threads (bp-conn-ID, one
        per open connection, IDs counting from 1)."""
        names = set()
        task = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(task):
            try:
                with open("%s/%s/comm" % (task, tid)) as f:
                    name = f.read().strip()
            except OSError:
                continue  # the thread just ended
            if name.startswith("bp-conn-"):
                names.add(name)
        return names

    def stop(self):
        """SIGTERM; returns the exit status (None if it had to be
        killed)."""
        if self.proc is None:
            return 0
        p, self.proc = self.proc, None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.log.close()
                return None
        self.log.close()
        return p.returncode

    def connect(self, timeout=10.0):
        if self.tcp:
            return TClient.tcp(self.tcp[0], self.tcp[1], timeout)
        return TClient.unix(self.sock, timeout)

    def client(self, export="", structured=False, extended=False,
               meta=(), infos=(nw.NBD_INFO_BLOCK_SIZE,)):
        """Connect, handshake, negotiate and GO; returns the client."""
        c = self.connect()
        c.handshake()
        if extended:
            rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK,
                   "NBD_OPT_EXTENDED_HEADERS")
        if structured:
            rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK,
                   "NBD_OPT_STRUCTURED_REPLY")
        if meta:
            res = c.opt_set_meta_context(export, list(meta))
            rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT %r" % (meta,))
            eq(sorted(res.contexts), sorted(meta), "selected contexts")
        res = c.opt_go(export, infos)
        rep_eq(res, nw.NBD_REP_ACK, "NBD_OPT_GO %r" % export)
        return c

    def __enter__(self):
        return self.start()

    def __exit__(self, etype, exc, tb):
        tail = self.log_tail()
        rc = self.stop()
        if etype is None:
            if rc is None:
                raise Failure("server did not exit within 10 s of SIGTERM")
            if rc != 0:
                raise Failure("server exited with status %d after SIGTERM; "
                              "%s" % (rc, tail))
        elif etype is not None and isinstance(exc, Exception):
            # Keep the original failure but add the log for context.
            exc.details = ["server " + tail]
        return False


CASES = []


def case(fn):
    CASES.append(fn)
    return fn


# ------------------------------------------------------------------ helpers


def ok_reply(r, what):
    if r.error:
        raise Failure("%s failed: errno %d (%r)" % (what, r.error, r.chunks))
    return r


def err_reply(r, errno, what):
    if r.error != errno:
        raise Failure("%s: got errno %d, want %d (%r)"
                      % (what, r.error, errno, r.chunks))
    return r


def pattern(n, seed):
    """n deterministic non-zero bytes."""
    base = bytes((seed * 31 + i * 7 + 1) % 251 + 1 for i in range(4096))
    reps = n // len(base) + 1
    return (base * reps)[:n]


def status_map(c, ctx_id, start, end, chunk_limit=None):
    """Walk [start, end) with BLOCK_STATUS for ctx_id; return a list of
    (offset, length, flags).  Loops because the server may answer with
    less than the requested length."""
    out = []
    pos = start
    limit = chunk_limit or (1 << 63 if c.extended else 0xFFFFFFFF)
    while pos < end:
        r = ok_reply(c.block_status(pos, min(end - pos, limit)),
                     "BLOCK_STATUS at %d" % pos)
        ex = r.extents()
        check(ctx_id in ex, "no status chunk for context %d (got %r)"
              % (ctx_id, r.chunks))
        check(ex[ctx_id], "empty extent list")
        for ln, fl in ex[ctx_id]:
            out.append((pos, ln, fl))
            pos += ln
        check(pos <= c.export_size, "extents run past end of export: %d > "
              "%d" % (pos, c.export_size))
    return out


def flags_over(smap, a, b):
    """The set of flags of the extents that overlap [a, b)."""
    s = set()
    for off, ln, fl in smap:
        if off < b and off + ln > a:
            s.add(fl)
    return s


def fmt_map(smap, limit=12):
    return ", ".join("[%d+%d]=%d" % e for e in smap[:limit]) + (
        " ..." if len(smap) > limit else "")


def make_file(tmpdir, name, size, data_at=()):
    path = os.path.join(tmpdir, name)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in data_at:
            f.seek(off)
            f.write(data)
    return path


# -------------------------------------------------------------------- cases


@case
def pid_file(t):
    with Server(t, ["memory:1M"]) as s:
        eq(s.pid_content.strip(), str(s.proc.pid), "pid file content")
        c = s.connect()
        c.handshake()
        c.close()


@case
def handshake_flags(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        hf = c.handshake()
        check(hf & nw.NBD_FLAG_FIXED_NEWSTYLE, "FIXED_NEWSTYLE not set "
              "(flags 0x%x)" % hf)
        check(hf & nw.NBD_FLAG_NO_ZEROES, "NO_ZEROES not set (0x%x)" % hf)
        eq(hf & ~3, 0, "undefined handshake flag bits")
        # The connection is usable after the handshake.
        rep_eq(c.opt_list(), nw.NBD_REP_ACK, "LIST after handshake")
        c.close()
        # A client flag the server does not know: the server MUST close.
        c = s.connect()
        c.handshake(client_flags=nw.NBD_FLAG_C_FIXED_NEWSTYLE | (1 << 20))
        try:
            c.send_option(nw.NBD_OPT_LIST)
            closed = c.is_closed(5)
        except (OSError, ProtocolError):
            closed = True
        check(closed, "server did not close after unknown client flag "
              "bit 20")
        c.close()
        # Server still serving.
        c = s.client()
        ok_reply(c.read(0, 512), "read after bad-flags client")
        c.disconnect()


@case
def export_name_option(t):
    path = make_file(t, "d.img", 2 * MiB, [(4096, b"NBDTEST")])
    with Server(t, ["memory:1M", "disk=" + path]) as s:
        # Old-style entry with NO_ZEROES: 10 bytes of size+flags.
        c = s.connect()
        c.handshake()
        size, tf = c.opt_export_name("disk")
        eq(size, 2 * MiB, "EXPORT_NAME size")
        check(tf & nw.NBD_FLAG_HAS_FLAGS, "HAS_FLAGS not set")
        check(not tf & nw.NBD_FLAG_SEND_DF, "SEND_DF set without "
              "structured replies")
        r = ok_reply(c.read(4096, 7), "read after EXPORT_NAME")
        eq(r.content(), b"NBDTEST", "data")
        c.disconnect()
        # Without NO_ZEROES: 124 zero bytes follow (checked in client).
        c = s.connect()
        c.handshake(client_flags=nw.NBD_FLAG_C_FIXED_NEWSTYLE)
        size, tf = c.opt_export_name("")
        eq(size, 1 * MiB, "default export size")
        ok_reply(c.read(0, 512), "read default export")
        c.disconnect()
        # EXPORT_NAME after EXTENDED_HEADERS: extended replies.
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK, "EXTENDED_HEADERS")
        size, tf = c.opt_export_name("disk")
        eq(size, 2 * MiB, "EXPORT_NAME size")
        check(tf & nw.NBD_FLAG_SEND_DF, "SEND_DF clear with extended headers")
        r = ok_reply(c.read(4096, 7), "extended read after EXPORT_NAME")
        eq(r.kinds, {"extended"}, "reply kinds")
        eq(r.content(), b"NBDTEST", "data")
        c.disconnect()
        # Unknown name: server must close the connection.
        c = s.connect()
        c.handshake()
        c.send_option(nw.NBD_OPT_EXPORT_NAME, b"no-such-export")
        check(c.is_closed(5), "server kept the connection after "
              "EXPORT_NAME of an unknown export")


@case
def list_exports(t):
    path = make_file(t, "d.img", 1 * MiB)
    with Server(t, ["first=memory:64M", "disk=" + path,
                    "zero=null:1G"]) as s:
        c = s.connect()
        c.handshake()
        res = c.opt_list()
        rep_eq(res, nw.NBD_REP_ACK, "LIST final reply")
        for r in res.replies[:-1]:
            rep_eq(r, nw.NBD_REP_SERVER, "LIST intermediate reply")
        names = [n for n, _ in res.exports]
        eq(len(names), len(set(names)), "export names unique in %r" % names)
        for n in ("first", "disk", "zero"):
            check(n in names, "export %r missing from LIST %r" % (n, names))
        extra = set(names) - {"first", "disk", "zero", ""}
        check(not extra, "unexpected exports %r" % extra)
        # A LIST with data is invalid.
        res = c.option(nw.NBD_OPT_LIST, b"junk")
        rep_eq(res, nw.NBD_REP_ERR_INVALID, "LIST with data")
        # Still usable.
        rep_eq(c.opt_go("zero"), nw.NBD_REP_ACK, "GO after LIST")
        eq(c.export_size, 1 * GiB, "null export size")
        r = ok_reply(c.read(GiB - 4096, 4096), "read null export")
        eq(r.content(), bytes(4096), "null export reads zero")
        c.disconnect()


@case
def info_known_export(t):
    path = make_file(t, "d.img", 3 * MiB + 512)
    with Server(t, ["memory:64M", "disk=" + path]) as s:
        c = s.connect()
        c.handshake()
        res = c.opt_info("disk", [nw.NBD_INFO_BLOCK_SIZE, nw.NBD_INFO_NAME])
        rep_eq(res, nw.NBD_REP_ACK, "INFO disk")
        for r in res.replies[:-1]:
            rep_eq(r, nw.NBD_REP_INFO, "INFO intermediate reply")
        info = res.info
        check(nw.NBD_INFO_EXPORT in info.get("types", []),
              "no NBD_INFO_EXPORT in %r" % info)
        eq(info.get("size"), 3 * MiB + 512, "export size")
        check(info["tflags"] & nw.NBD_FLAG_HAS_FLAGS, "HAS_FLAGS clear")
        check(nw.NBD_INFO_BLOCK_SIZE in info["types"],
              "no NBD_INFO_BLOCK_SIZE though requested")
        eq(info["max_block"], MAX_PAYLOAD, "maximum block size")
        mn, pref = info["min_block"], info["pref_block"]
        check(mn >= 1 and mn & (mn - 1) == 0 and mn <= 65536,
              "minimum block size %d not a power of 2 <= 64K" % mn)
        check(pref >= max(mn, 512) and pref & (pref - 1) == 0,
              "preferred block size %d invalid" % pref)
        check(pref <= info["max_block"], "preferred > maximum")
        if nw.NBD_INFO_NAME in info["types"]:
            eq(info["name"], "disk", "NBD_INFO_NAME")
        # INFO does not end negotiation; the default export is the first.
        res = c.opt_info("", [])
        rep_eq(res, nw.NBD_REP_ACK, "INFO default export")
        eq(res.info.get("size"), 64 * MiB, "default export size")
        rep_eq(c.opt_go("disk"), nw.NBD_REP_ACK, "GO after INFO")
        eq(c.export_size, 3 * MiB + 512, "GO size")
        ok_reply(c.read(3 * MiB, 512), "read last sector")
        c.disconnect()


@case
def info_repeated_requests_answered_once(t):
    # A request list that names one kind 30,000 times (60 KB, under the
    # option size limit) gets one reply of that kind, as from qemu-nbd.
    # A description is given: without one none is sent, as qemu-nbd -D.
    with Server(t, ["memory:64M", "disk=memory:1M"],
                ["--description", "a test disk"]) as s:
        c = s.connect()
        c.handshake()
        for kind in (nw.NBD_INFO_BLOCK_SIZE, nw.NBD_INFO_NAME,
                     nw.NBD_INFO_DESCRIPTION, nw.NBD_INFO_EXPORT):
            res = c.opt_info("disk", [kind] * 30000)
            rep_eq(res, nw.NBD_REP_ACK, "INFO asking for %d 30,000 times"
                   % kind)
            types = res.info["types"]
            eq(len(types), len(set(types)), "INFO replies for %d 30,000 "
               "times: %d replies of kinds %r" % (kind, len(types),
                                                  sorted(set(types))))
            check(kind in types, "kind %d not answered" % kind)
        mixed = [nw.NBD_INFO_NAME, nw.NBD_INFO_DESCRIPTION,
                 nw.NBD_INFO_BLOCK_SIZE, nw.NBD_INFO_EXPORT] * 7000
        res = c.opt_go("disk", mixed)
        rep_eq(res, nw.NBD_REP_ACK, "GO with four kinds 7,000 times each")
        eq(sorted(res.info["types"]),
           [nw.NBD_INFO_EXPORT, nw.NBD_INFO_NAME, nw.NBD_INFO_DESCRIPTION,
            nw.NBD_INFO_BLOCK_SIZE], "kinds of INFO replies to GO")
        eq(res.info["name"], "disk", "NBD_INFO_NAME")
        eq(res.info["description"], "a test disk", "NBD_INFO_DESCRIPTION")
        ok_reply(c.read(0, 512), "read after GO")
        c.disconnect()


@case
def info_unknown_export(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_info("no-such-export"), nw.NBD_REP_ERR_UNKNOWN,
               "INFO unknown export")
        rep_eq(c.opt_go("no-such-export"), nw.NBD_REP_ERR_UNKNOWN,
               "GO unknown export")
        # Malformed INFO: name length beyond the option data.
        res = c.option(nw.NBD_OPT_INFO, struct.pack(">I", 100) + b"ab")
        rep_eq(res, nw.NBD_REP_ERR_INVALID, "INFO with bad name length")
        # Over-long name (> 4096 bytes).
        res = c.opt_info("a" * 5000)
        check(res.type in (nw.NBD_REP_ERR_INVALID, nw.NBD_REP_ERR_TOO_BIG,
                           nw.NBD_REP_ERR_UNKNOWN),
              "INFO with a 5000-byte name: %s" % rep_name(res.type))
        # Unknown info request types are ignored.
        res = c.opt_info("", [99, nw.NBD_INFO_BLOCK_SIZE])
        rep_eq(res, nw.NBD_REP_ACK, "INFO requesting info type 99")
        check(99 not in res.info["types"], "server answered info type 99")
        eq(res.info.get("max_block"), MAX_PAYLOAD, "max block")
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO after failures")
        ok_reply(c.read(0, 512), "read")
        c.disconnect()


@case
def unknown_option(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        c.handshake()
        res = c.option(99, b"some option data")
        rep_eq(res, nw.NBD_REP_ERR_UNSUP, "option 99")
        eq(res.final.option, 99, "reply option field")
        res = c.option(0x7FFFFFF0)
        rep_eq(res, nw.NBD_REP_ERR_UNSUP, "option 0x7ffffff0")
        rep_eq(c.opt_list(), nw.NBD_REP_ACK, "LIST after unknown option")
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO after unknown option")
        ok_reply(c.read(0, 4096), "read")
        c.disconnect()


@case
def starttls_policy(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_starttls(), nw.NBD_REP_ERR_POLICY, "STARTTLS")
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO after STARTTLS refusal")
        ok_reply(c.read(0, 512), "read")
        c.disconnect()


@case
def meta_context_requires_structured(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        c.handshake()
        res = c.opt_set_meta_context("", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ERR_INVALID, "SET_META_CONTEXT before "
               "STRUCTURED_REPLY")
        eq(res.contexts, {}, "contexts returned with the error")
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        res = c.opt_set_meta_context("", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT after "
               "STRUCTURED_REPLY")
        eq(list(res.contexts), ["base:allocation"], "contexts")
        res = c.opt_set_meta_context("no-such-export", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ERR_UNKNOWN, "SET_META_CONTEXT unknown export")
        c.close()


@case
def list_meta_context(t):
    with Server(t, ["memory:1M", "other=memory:2M"]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        res = c.opt_list_meta_context("", ["base:"])
        rep_eq(res, nw.NBD_REP_ACK, "LIST_META_CONTEXT base:")
        eq(sorted(res.contexts), ["base:allocation"], "base: contexts")
        res = c.opt_list_meta_context("other", ["qemu:"])
        rep_eq(res, nw.NBD_REP_ACK, "LIST_META_CONTEXT qemu:")
        eq(sorted(res.contexts), ["qemu:allocation-depth"], "qemu: contexts")
        res = c.opt_list_meta_context("", [])
        rep_eq(res, nw.NBD_REP_ACK, "LIST_META_CONTEXT (all)")
        eq(sorted(res.contexts), ["base:allocation", "qemu:allocation-depth"],
           "all contexts")
        res = c.opt_list_meta_context("", ["base:allocation",
                                           "x-nosuch:thing"])
        rep_eq(res, nw.NBD_REP_ACK, "LIST_META_CONTEXT exact")
        eq(sorted(res.contexts), ["base:allocation"], "exact query")
        res = c.opt_set_meta_context("", ["x-nosuch:", "bogus"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT of unknown contexts")
        eq(res.contexts, {}, "unknown contexts selected")
        res = c.opt_set_meta_context("", ["qemu:allocation-depth",
                                          "base:allocation"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT both")
        eq(sorted(res.contexts), ["base:allocation", "qemu:allocation-depth"],
           "both selected")
        check(len(set(res.contexts.values())) == 2, "context ids not "
              "distinct: %r" % res.contexts)
        c.close()


@case
def extended_headers_negotiation(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.connect()
        c.handshake()
        res = c.option(nw.NBD_OPT_EXTENDED_HEADERS, b"x")
        rep_eq(res, nw.NBD_REP_ERR_INVALID, "EXTENDED_HEADERS with data")
        rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK, "EXTENDED_HEADERS")
        # Meta contexts need no STRUCTURED_REPLY once extended headers are on.
        res = c.opt_set_meta_context("", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT with extended headers")
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO")
        check(c.tflags & nw.NBD_FLAG_SEND_DF, "SEND_DF not advertised with "
              "extended headers (tflags 0x%x)" % c.tflags)
        # Every reply is an extended chunk, offset echoed (TClient checks).
        r = ok_reply(c.flush(), "FLUSH")
        eq(r.chunks[0].kind, "extended", "reply kind")
        eq(r.chunks[0].type, nw.NBD_REPLY_TYPE_NONE, "FLUSH chunk type")
        r = err_reply(c.request(NBD_CMD_READ, 64 * MiB, 512), nw.NBD_EINVAL,
                      "read past end")
        eq(r.chunks[-1].hdr_offset, 64 * MiB, "error chunk header offset")
        c.disconnect()


@case
def extended_write_read(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(extended=True)
        data = pattern(MiB + 4096, 3)
        off = 5 * MiB + 4096
        r = ok_reply(c.write(off, data), "extended WRITE of %d" % len(data))
        eq(r.chunks[0].type, nw.NBD_REPLY_TYPE_NONE, "write reply type")
        r = ok_reply(c.read(off - 256 * KiB, len(data) + 512 * KiB),
                     "extended READ")
        types = set(ch.type for ch in r.chunks)
        check(types <= {nw.NBD_REPLY_TYPE_OFFSET_DATA,
                        nw.NBD_REPLY_TYPE_OFFSET_HOLE},
              "unexpected chunk types %r" % r.chunks)
        got = r.content()
        eq(got[:256 * KiB], bytes(256 * KiB), "zeroes before the write")
        check(got[256 * KiB:256 * KiB + len(data)] == data,
              "read back differs from written data")
        eq(got[256 * KiB + len(data):], bytes(256 * KiB),
           "zeroes after the write")
        # The 64-bit length field: a length with the high word set must
        # not be truncated to its low 32 bits (here 2^32 + 4096 would
        # become 4096 and "succeed").
        r = c.request(nw.NBD_CMD_WRITE_ZEROES, 0, (1 << 32) + 4096)
        check(r.error != 0, "WRITE_ZEROES of 4 GiB + 4 KiB on a 64 MiB "
              "export succeeded (length truncated to 32 bits?)")
        r = ok_reply(c.read(off, 4096), "read after failed zero")
        eq(r.content(), data[:4096], "data intact")
        c.disconnect()


def _big_status(c, ctx, size):
    smap = status_map(c, ctx, 0, size)
    return smap


@case
def extended_large_zero_trim(t):
    size = 8 * GiB
    with Server(t, ["memory:8G"]) as s:
        c = s.client(extended=True, meta=["base:allocation"])
        eq(c.export_size, size, "export size")
        check(c.tflags & nw.NBD_FLAG_SEND_WRITE_ZEROES, "no WRITE_ZEROES")
        check(c.tflags & nw.NBD_FLAG_SEND_TRIM, "no TRIM")
        ctx = c.contexts["base:allocation"]
        blk = 64 * KiB
        spots = [0, 2 * GiB, 6 * GiB, size - blk]
        for i, off in enumerate(spots):
            ok_reply(c.write(off, pattern(blk, i + 10)), "write at %d" % off)
        # One request covering the whole 8 GiB export: needs 64-bit length.
        r = ok_reply(c.block_status(0, size), "BLOCK_STATUS 8 GiB")
        ch = [x for x in r.chunks if x.context_id == ctx]
        eq(len(ch), 1, "status chunks for base:allocation")
        eq(ch[0].type, nw.NBD_REPLY_TYPE_BLOCK_STATUS_EXT, "status chunk "
           "type")
        smap = _big_status(c, ctx, size)
        for off in spots:
            eq(flags_over(smap, off, off + blk), {0},
               "flags of data at %d (%s)" % (off, fmt_map(smap)))
        check(flags_over(smap, blk, 2 * GiB) ==
              {NBD_STATE_HOLE | NBD_STATE_ZERO},
              "initial hole not reported: %s" % fmt_map(smap))
        # WRITE_ZEROES of 5 GiB (> 4 GiB) over the data at 2 GiB.
        zlen = 5 * GiB
        ok_reply(c.write_zeroes(blk, zlen), "WRITE_ZEROES 5 GiB")
        r = ok_reply(c.read(2 * GiB, blk), "read zeroed data")
        eq(r.content(), bytes(blk), "zeroed data reads back")
        smap = _big_status(c, ctx, size)
        zf = flags_over(smap, blk, blk + zlen)
        check(all(f & NBD_STATE_ZERO for f in zf),
              "zeroed range not ZERO: %s" % fmt_map(smap))
        eq(zf, {NBD_STATE_HOLE | NBD_STATE_ZERO},
           "zeroed range flags on a memory export (%s)" % fmt_map(smap))
        eq(flags_over(smap, 0, blk), {0}, "data before the zeroed range")
        eq(flags_over(smap, 6 * GiB, 6 * GiB + blk), {0},
           "data at 6 GiB before trim (%s)" % fmt_map(smap))
        # TRIM of 5 GiB - 64 KiB (> 4 GiB) over the data at 6 GiB.
        tstart = 3 * GiB
        tlen = size - blk - tstart
        ok_reply(c.trim(tstart, tlen), "TRIM %d" % tlen)
        smap = _big_status(c, ctx, size)
        tf = flags_over(smap, 6 * GiB, 6 * GiB + blk)
        check(all(f & NBD_STATE_HOLE for f in tf),
              "trimmed data at 6 GiB not a hole: %s" % fmt_map(smap))
        eq(flags_over(smap, size - blk, size), {0},
           "data in the last 64 KiB after trim (%s)" % fmt_map(smap))
        r = ok_reply(c.read(size - blk, blk), "read last block")
        eq(r.content(), pattern(blk, 13), "last block data")
        r = ok_reply(c.read(0, blk), "read first block")
        eq(r.content(), pattern(blk, 10), "first block data")
        c.disconnect()


@case
def block_status_payload_filter(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(extended=True, meta=["base:allocation",
                                          "qemu:allocation-depth"])
        check(c.tflags & nw.NBD_FLAG_BLOCK_STAT_PAYLOAD,
              "BLOCK_STAT_PAYLOAD not advertised (tflags 0x%x)" % c.tflags)
        base = c.contexts["base:allocation"]
        depth = c.contexts["qemu:allocation-depth"]
        ok_reply(c.write(MiB, pattern(64 * KiB, 1)), "write")
        r = ok_reply(c.block_status(0, 4 * MiB), "status, both contexts")
        eq(sorted(r.extents()), sorted([base, depth]), "contexts answered")
        for only, name in ((depth, "depth"), (base, "base")):
            r = ok_reply(c.block_status(0, 4 * MiB, context_ids=[only]),
                         "status with payload selecting %s" % name)
            ex = r.extents()
            eq(sorted(ex), [only], "contexts answered when selecting %s "
               "(%r)" % (name, r.chunks))
            pos = 0
            flags_at_1m = None
            for ln, fl in ex[only]:
                if pos <= MiB < pos + ln:
                    flags_at_1m = fl
                pos += ln
            want = 1 if only == depth else 0
            eq(flags_at_1m, want, "%s flags at 1 MiB" % name)
        # Effect length comes from the payload: 64 KiB at 1 MiB, REQ_ONE.
        r = ok_reply(c.request(nw.NBD_CMD_BLOCK_STATUS, MiB, 12,
                               nw.NBD_CMD_FLAG_PAYLOAD_LEN |
                               nw.NBD_CMD_FLAG_REQ_ONE,
                               struct.pack(">QI", 32 * KiB, base)),
                     "REQ_ONE status with payload")
        ex = r.extents()
        eq(sorted(ex), [base], "contexts answered")
        eq(len(ex[base]), 1, "REQ_ONE descriptors")
        check(ex[base][0][0] <= 32 * KiB,
              "REQ_ONE extent %d longer than payload effect length 32 KiB"
              % ex[base][0][0])
        # The connection still works.
        r = ok_reply(c.read(MiB, 4096), "read")
        eq(r.content(), pattern(64 * KiB, 1)[:4096], "data")
        c.disconnect()


@case
def block_status_payload_invalid(t):
    # Spec (extension-ext-header): unknown or duplicate ids, or a payload
    # that is not 8 + 4n bytes: consume the payload, fail with EINVAL.
    with Server(t, ["memory:64M"]) as s:
        c = s.client(extended=True, meta=["base:allocation",
                                          "qemu:allocation-depth"])
        base = c.contexts["base:allocation"]
        depth = c.contexts["qemu:allocation-depth"]
        unknown = max(base, depth) + 1000
        err_reply(c.block_status(0, MiB, context_ids=[unknown]),
                  nw.NBD_EINVAL, "payload with an unknown context id")
        r = ok_reply(c.read(0, 512), "read after unknown id")
        err_reply(c.request(nw.NBD_CMD_BLOCK_STATUS, 0, 10,
                            nw.NBD_CMD_FLAG_PAYLOAD_LEN, bytes(10)),
                  nw.NBD_EINVAL, "payload of 10 bytes")
        r = ok_reply(c.read(0, 512), "read after 10-byte payload")
        err_reply(c.block_status(0, MiB, context_ids=[base, base]),
                  nw.NBD_EINVAL, "payload with a duplicate context id")
        r = ok_reply(c.read(0, 512), "read after duplicate ids")
        eq(r.content(), bytes(512), "data")
        c.disconnect()


def _send_untracked_reply(c, cookie, rtype, offset, length, hdr):
    """Send HDR as the raw request COOKIE and expect a reply to it."""
    req = nw.Request(cookie, rtype, 0, offset, length, True, b"")
    c.pending[cookie] = req
    c.replies[cookie] = nw.Reply(req)
    c.send_raw(hdr)


@case
def extended_write_without_payload_len(t):
    """Extended headers: a WRITE MUST set NBD_CMD_FLAG_PAYLOAD_LEN; without
    it "there is no payload after the header" (proto.md).  The server
    refuses it with EINVAL and reads the next bytes as the next request,
    never as data."""
    with Server(t, ["memory:1M"]) as s:
        c = s.client(extended=True)
        ok_reply(c.write(0, pattern(4096, 7)), "write")
        for flags in (0, NBD_CMD_FLAG_FUA):
            ck = c.new_cookie()
            _send_untracked_reply(c, ck, NBD_CMD_WRITE, 0, 32, struct.pack(
                ">IHHQQQ", nw.NBD_EXTENDED_REQUEST_MAGIC, flags,
                NBD_CMD_WRITE, ck, 0, 32))
            rd = c.send_request(NBD_CMD_READ, 0, 4096)
            err_reply(c.wait(ck), nw.NBD_EINVAL,
                      "WRITE without PAYLOAD_LEN (flags 0x%x)" % flags)
            r = ok_reply(c.wait(rd), "READ sent right after it")
            eq(r.content(), pattern(4096, 7),
               "data (the READ header was written to the disk?)")
        c.disconnect()


@case
def extended_payload_over_maximum_disconnects(t):
    """Extended headers, NBD_CMD_FLAG_PAYLOAD_LEN with a length above the
    advertised maximum payload: "a server SHOULD initiate hard disconnect"
    (proto.md), not read and discard it.  Requests before it are answered;
    other connections carry on."""
    with Server(t, ["memory:64M"]) as s:
        keep = s.client(extended=True)
        for cmd in (NBD_CMD_WRITE, NBD_CMD_READ, nw.NBD_CMD_BLOCK_STATUS):
            c = s.connect()
            c.handshake()
            rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK, "EXTENDED")
            res = c.opt_go("", [nw.NBD_INFO_BLOCK_SIZE])
            rep_eq(res, nw.NBD_REP_ACK, "GO")
            mx = res.info["max_block"]
            ok_reply(c.write(0, pattern(4096, 8)), "write")
            rd = c.send_request(NBD_CMD_READ, 0, 4096)
            try:
                c.send_raw(struct.pack(
                    ">IHHQQQ", nw.NBD_EXTENDED_REQUEST_MAGIC,
                    nw.NBD_CMD_FLAG_PAYLOAD_LEN, cmd, 999, 0, mx + 1)
                    + b"p" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server hung up while the payload was going out
            r = ok_reply(c.wait(rd), "READ before the overlong request")
            eq(r.content(), pattern(4096, 8), "data")
            t0 = time.monotonic()
            closed, got = c.drain_until_closed(wait=5)
            check(closed, "command %d with a %d-byte payload (max %d): the "
                  "connection is still open" % (cmd, mx + 1, mx))
            eq(got, b"", "reply to the overlong request")
            check(time.monotonic() - t0 < 3, "closed only after %.1f s"
                  % (time.monotonic() - t0))
            c.close()
        # At the maximum itself, a payload is read and refused (or served).
        r = keep.request(NBD_CMD_READ, 0, 16, nw.NBD_CMD_FLAG_PAYLOAD_LEN,
                         bytes(16))
        err_reply(r, nw.NBD_EINVAL, "READ with a 16-byte payload")
        r = ok_reply(keep.read(0, 4096), "read on the other connection")
        eq(r.content(), pattern(4096, 8), "data")
        keep.disconnect()


def _allocation_file(t):
    """A 2 MiB sparse file with 64 KiB of data at 1 MiB."""
    return make_file(t, "d.img", 2 * MiB, [(MiB, pattern(64 * KiB, 5))])


def _check_allocation(c, ctx):
    """base:allocation of _allocation_file() as the client sees it."""
    smap = status_map(c, ctx, 0, 2 * MiB)
    eq(flags_over(smap, MiB, MiB + 64 * KiB), {0}, "status of the data")
    eq(flags_over(smap, 0, 4096), {NBD_STATE_HOLE | NBD_STATE_ZERO},
       "status at 0 (%s)" % fmt_map(smap))


@case
def meta_context_kept_through_export_name(t):
    # proto.md: BLOCK_STATUS may be used when the last SET_META_CONTEXT
    # named "the same export name that was ultimately selected for
    # transmission phase", by NBD_OPT_GO or NBD_OPT_EXPORT_NAME.
    with Server(t, ["memory:1M", "disk=" + _allocation_file(t)]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        res = c.opt_set_meta_context("disk", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT disk")
        c.opt_export_name("disk")
        eq(c.export_size, 2 * MiB, "export size")
        _check_allocation(c, res.contexts["base:allocation"])
        c.disconnect()
        # Contexts chosen for another export do not follow EXPORT_NAME.
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        rep_eq(c.opt_set_meta_context("", ["base:allocation"]),
               nw.NBD_REP_ACK, "SET_META_CONTEXT of the default export")
        c.opt_export_name("disk")
        err_reply(c.block_status(0, 4096), nw.NBD_EINVAL,
                  "BLOCK_STATUS with contexts of another export")
        c.disconnect()


@case
def meta_context_kept_through_extended_headers(t):
    # Only STARTTLS makes the server forget SET_META_CONTEXT; choosing the
    # header style afterwards does not.
    with Server(t, ["disk=" + _allocation_file(t)]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        res = c.opt_set_meta_context("disk", ["base:allocation"])
        rep_eq(res, nw.NBD_REP_ACK, "SET_META_CONTEXT disk")
        rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK, "EXTENDED_HEADERS")
        rep_eq(c.opt_go("disk"), nw.NBD_REP_ACK, "GO disk")
        check(c.tflags & nw.NBD_FLAG_BLOCK_STAT_PAYLOAD, "BLOCK_STAT_PAYLOAD "
              "not advertised with a context (tflags 0x%x)" % c.tflags)
        _check_allocation(c, res.contexts["base:allocation"])
        c.disconnect()


@case
def extended_and_structured_interplay(t):
    with Server(t, ["memory:64M"]) as s:
        # Structured first, then extended: extended wins.
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK,
               "EXTENDED_HEADERS after STRUCTURED_REPLY")
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO")
        r = ok_reply(c.read(0, 4096), "read")
        eq(r.kinds, {"extended"}, "reply kinds")
        c.disconnect()
        # Extended first, then structured: no downgrade.
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_extended_headers(), nw.NBD_REP_ACK, "EXTENDED_HEADERS")
        res = c.option(nw.NBD_OPT_STRUCTURED_REPLY)
        check(res.type in (nw.NBD_REP_ERR_EXT_HEADER_REQD, nw.NBD_REP_ACK),
              "STRUCTURED_REPLY after EXTENDED_HEADERS: %s"
              % rep_name(res.type))
        rep_eq(c.opt_go(""), nw.NBD_REP_ACK, "GO")
        r = ok_reply(c.read(0, 4096), "read")
        eq(r.kinds, {"extended"}, "reply kinds after a late STRUCTURED_REPLY")
        c.disconnect()


@case
def block_stat_payload_flag_rules(t):
    # ext-header spec, NBD_FLAG_BLOCK_STAT_PAYLOAD: MUST NOT be advertised
    # without extended headers; SHOULD NOT be advertised by GO or
    # EXPORT_NAME when no meta context was negotiated.
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True, meta=["base:allocation"])
        check(not c.tflags & nw.NBD_FLAG_BLOCK_STAT_PAYLOAD,
              "BLOCK_STAT_PAYLOAD advertised without extended headers")
        c.disconnect()
        c = s.client(extended=True, meta=["base:allocation"])
        check(c.tflags & nw.NBD_FLAG_BLOCK_STAT_PAYLOAD,
              "BLOCK_STAT_PAYLOAD not advertised with extended headers "
              "and a meta context")
        c.disconnect()
        c = s.client(extended=True)
        check(not c.tflags & nw.NBD_FLAG_BLOCK_STAT_PAYLOAD,
              "GO advertised BLOCK_STAT_PAYLOAD (tflags 0x%x) although no "
              "meta context was negotiated" % c.tflags)
        c.disconnect()


def _read_holes(t, extended):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=not extended, extended=extended)
        check(c.tflags & nw.NBD_FLAG_SEND_DF, "SEND_DF not advertised")
        data = pattern(64 * KiB, 7)
        ok_reply(c.write(128 * KiB, data), "write")
        r = ok_reply(c.read(0, 256 * KiB), "read")
        want = bytes(128 * KiB) + data + bytes(64 * KiB)
        eq(r.content() == want, True, "read content matches")
        holes = [ch for ch in r.chunks
                 if ch.type == nw.NBD_REPLY_TYPE_OFFSET_HOLE]
        check(holes, "no OFFSET_HOLE chunk for unwritten areas: %r"
              % r.chunks)
        for ch in r.chunks:
            if ch.type == nw.NBD_REPLY_TYPE_OFFSET_DATA:
                lo, hi = ch.data_offset, ch.data_offset + len(ch.data)
                check(lo >= 128 * KiB and hi <= 192 * KiB,
                      "OFFSET_DATA [%d,%d) covers an unwritten area" % (lo,
                                                                        hi))
        # An entirely unwritten range: holes only.
        r = ok_reply(c.read(10 * MiB, 128 * KiB), "read of a hole")
        eq(set(ch.type for ch in r.chunks), {nw.NBD_REPLY_TYPE_OFFSET_HOLE},
           "chunk types for an unwritten range")
        eq(r.content(), bytes(128 * KiB), "hole content")
        # DF: exactly one OFFSET_DATA chunk covering the whole request.
        r = ok_reply(c.read(0, 256 * KiB, NBD_CMD_FLAG_DF), "read with DF")
        eq(len(r.chunks), 1, "chunks with DF (%r)" % r.chunks)
        ch = r.chunks[0]
        eq(ch.type, nw.NBD_REPLY_TYPE_OFFSET_DATA, "DF chunk type")
        eq(ch.data_offset, 0, "DF chunk offset")
        eq(len(ch.data), 256 * KiB, "DF chunk length")
        check(ch.data == want, "DF read content differs")
        r = ok_reply(c.read(10 * MiB, 4096, NBD_CMD_FLAG_DF),
                     "DF read of a hole")
        eq([ch.type for ch in r.chunks], [nw.NBD_REPLY_TYPE_OFFSET_DATA],
           "DF hole read chunk types")
        c.disconnect()


@case
def read_holes_structured(t):
    _read_holes(t, extended=False)


@case
def read_holes_extended(t):
    _read_holes(t, extended=True)


@case
def past_end_errors(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True)
        end = 64 * MiB
        r = err_reply(c.read(end - 512, 1024), nw.NBD_EINVAL,
                      "read crossing the end")
        check(any(ch.is_error for ch in r.chunks), "no error chunk")
        err_reply(c.read(end, 512), nw.NBD_EINVAL, "read at the end")
        err_reply(c.read(1 << 62, 512), nw.NBD_EINVAL, "read at 2^62")
        err_reply(c.write(end - 512, pattern(1024, 1)), nw.NBD_ENOSPC,
                  "write crossing the end")
        err_reply(c.write((1 << 64) - 512, pattern(1024, 2)), nw.NBD_ENOSPC,
                  "write whose end wraps past 2^64")
        # The refused payloads were consumed: the stream is still in sync.
        r = ok_reply(c.write(end - 512, pattern(512, 3)), "write last sector")
        r = ok_reply(c.read(end - 512, 512), "read last sector")
        eq(r.content(), pattern(512, 3), "last sector")
        c.disconnect()


@case
def readonly_eperm(t):
    path = make_file(t, "ro.img", MiB, [(0, b"RO-DATA")])
    with Server(t, [path], options=["--readonly"]) as s:
        c = s.client(structured=True)
        check(c.tflags & nw.NBD_FLAG_READ_ONLY, "READ_ONLY not advertised "
              "(0x%x)" % c.tflags)
        err_reply(c.write(0, b"x" * 512), nw.NBD_EPERM, "write")
        if c.tflags & nw.NBD_FLAG_SEND_FUA:
            err_reply(c.write(0, b"y" * 512, NBD_CMD_FLAG_FUA), nw.NBD_EPERM,
                      "FUA write")
        if c.tflags & nw.NBD_FLAG_SEND_WRITE_ZEROES:
            err_reply(c.write_zeroes(0, 4096), nw.NBD_EPERM, "write zeroes")
        if c.tflags & nw.NBD_FLAG_SEND_TRIM:
            err_reply(c.trim(0, 4096), nw.NBD_EPERM, "trim")
        r = ok_reply(c.read(0, 7), "read")
        eq(r.content(), b"RO-DATA", "data unchanged")
        c.disconnect()
        # Simple replies too.
        c = s.client()
        err_reply(c.write(0, b"z" * 512), nw.NBD_EPERM, "simple-reply write")
        r = ok_reply(c.read(0, 7), "read")
        eq(r.content(), b"RO-DATA", "data unchanged")
        c.disconnect()
    with open(path, "rb") as f:
        eq(f.read(7), b"RO-DATA", "file content after read-only session")


@case
def refused_write_answered_after_payload(t):
    """The error reply to a refused write comes only once its payload has
    been read: libnbd drops (and disconnects on) a reply that arrives while
    it is still sending the request."""
    with Server(t, ["memory:1M"], options=["--readonly"]) as s:
        for mode in ("simple", "structured"):
            c = s.client(structured=mode == "structured")
            payload = pattern(65536, 9)
            cookie = c.new_cookie()
            req = nw.Request(cookie, nw.NBD_CMD_WRITE, 0, 0, len(payload),
                             False, payload)
            c.pending[cookie] = req
            c.replies[cookie] = nw.Reply(req)
            c.send_raw(struct.pack(">IHHQQI", nw.NBD_REQUEST_MAGIC, 0,
                                   nw.NBD_CMD_WRITE, cookie, 0, len(payload))
                       + payload[:1000])
            ready, _, _ = select.select([c.sock], [], [], 0.5)
            check(not ready, "%s: the reply came before the payload" % mode)
            c.send_raw(payload[1000:])
            err_reply(c.wait(cookie), nw.NBD_EPERM, mode + " write")
            ok_reply(c.read(0, 512), mode + " read after the refused write")
            c.disconnect()


@case
def unknown_command(t):
    with Server(t, ["memory:64M"]) as s:
        for mode in ("simple", "structured", "extended"):
            c = s.client(structured=mode == "structured",
                         extended=mode == "extended")
            ok_reply(c.write(0, pattern(4096, 5)), "write")
            err_reply(c.request(42, 0, 4096), nw.NBD_EINVAL,
                      "%s: command 42" % mode)
            err_reply(c.request(42, 8192, 0), nw.NBD_EINVAL,
                      "%s: command 42 again" % mode)
            r = ok_reply(c.read(0, 4096), "%s: read after command 42" % mode)
            eq(r.content(), pattern(4096, 5), "%s: data" % mode)
            c.disconnect()


def _pipelining(t, extended):
    # A raw file, so that requests go through the worker threads and can
    # complete out of order.
    path = make_file(t, "p.img", 64 * MiB)
    with Server(t, [path], options=["--workers", "4"]) as s:
        c = s.client(structured=not extended, extended=extended)
        # Preload regions to read back.
        blk = 64 * KiB
        for i in range(16):
            ok_reply(c.write(i * blk, pattern(blk, 100 + i)), "preload")
        sent = {}
        errors = []

        def sender():
            # From a second thread, so that neither side can block the
            # other on full socket buffers (1 MiB goes each way).
            try:
                for i in range(32):
                    k = i // 2
                    if i % 2 == 0:
                        ck = c.new_cookie()
                        sent[ck] = ("read", k)
                        c.send_request(NBD_CMD_READ, k * blk, blk, cookie=ck)
                    else:
                        ck = c.new_cookie()
                        sent[ck] = ("write", k)
                        c.send_request(NBD_CMD_WRITE, 4 * MiB + k * blk, blk,
                                       payload=pattern(blk, 200 + k),
                                       cookie=ck)
            except Exception as e:  # reported below
                errors.append(e)

        th = threading.Thread(target=sender)
        th.start()
        order = []
        try:
            while len(order) < 32:
                ch = c.recv_chunk()  # raises on a cookie not in flight
                if ch.done:
                    order.append(ch.cookie)
        finally:
            th.join(20)
        check(not errors, "sending failed: %r" % errors)
        eq(len(sent), 32, "distinct cookies")
        eq(sorted(order), sorted(sent), "cookies answered")
        check(not c.is_closed(0.3), "connection closed after the batch")
        for ck in order:
            r = c.finished.pop(ck)
            check_shape(c, r)
            kind, k = sent[ck]
            ok_reply(r, "%s %d" % (kind, k))
            if kind == "read":
                check(r.content() == pattern(blk, 100 + k),
                      "pipelined read %d returned wrong data" % k)
        for k in range(16):
            r = ok_reply(c.read(4 * MiB + k * blk, blk), "verify")
            check(r.content() == pattern(blk, 200 + k),
                  "pipelined write %d not stored" % k)
        c.disconnect()
        return order


@case
def pipelining_structured(t):
    _pipelining(t, False)


@case
def pipelining_extended(t):
    _pipelining(t, True)


@case
def bad_magic_closes_only_that_connection(t):
    with Server(t, ["memory:64M"]) as s:
        a = s.client(structured=True)
        b = s.client(structured=True)
        ok_reply(b.write(0, pattern(4096, 9)), "B write")
        bad = struct.pack(">IHHQQI", 0xDEADBEEF, 0, NBD_CMD_READ, 77, 0, 512)
        a.send_raw(bad)
        closed, _junk = a.drain_until_closed(5)
        check(closed, "server kept the connection open after a request "
              "with magic 0xdeadbeef")
        a.close()
        r = ok_reply(b.read(0, 4096), "B read after A's bad magic")
        eq(r.content(), pattern(4096, 9), "B data")
        c = s.client(extended=True)
        # An extended-magic request on a compact connection and vice versa
        # are bad magics too.
        c.send_raw(struct.pack(">IHHQQI", nw.NBD_REQUEST_MAGIC, 0,
                               NBD_CMD_READ, 5, 0, 512) + bytes(4))
        check(c.drain_until_closed(5)[0], "compact request on an "
              "extended-headers "
              "connection was not rejected by closing")
        c.close()
        r = ok_reply(b.read(0, 4096), "B read again")
        eq(r.content(), pattern(4096, 9), "B data")
        b.disconnect()


@case
def truncated_request(t):
    with Server(t, ["memory:64M"]) as s:
        keep = s.client(structured=True)
        ok_reply(keep.write(0, pattern(4096, 4)), "write")
        # Half a header, then close.
        c = s.client(structured=True)
        hdr = struct.pack(">IHHQQI", nw.NBD_REQUEST_MAGIC, 0, NBD_CMD_READ, 1,
                          0, 512)
        c.send_raw(hdr[:14])
        c.close()
        # Header of a write with only part of its payload, then close.
        c = s.client(extended=True)
        c.send_raw(struct.pack(">IHHQQQ", nw.NBD_EXTENDED_REQUEST_MAGIC,
                               nw.NBD_CMD_FLAG_PAYLOAD_LEN, NBD_CMD_WRITE, 2,
                               0, 65536) + b"q" * 1000)
        c.close()
        # Half an option header during the handshake, then close.
        c = s.connect()
        c.handshake()
        c.send_raw(struct.pack(">QI", nw.NBD_IHAVEOPT, nw.NBD_OPT_GO))
        c.close()
        # Close in the middle of the greeting.
        c = s.connect()
        c.recv_exact(4)
        c.close()
        # Every connection but the first has been cleaned up.
        casetest.wait_until(10, lambda: not s.alive() or
                            s.conn_threads() == {"bp-conn-1"})
        check(s.alive(), "server died: %s" % s.log_tail())
        eq(s.conn_threads(), {"bp-conn-1"}, "connection threads left")
        n = s.client(structured=True)
        r = ok_reply(n.read(0, 4096), "new connection read")
        eq(r.content(), pattern(4096, 4), "data (the partial write must not "
           "have landed)")
        r = ok_reply(keep.read(0, 4096), "existing connection read")
        eq(r.content(), pattern(4096, 4), "data")
        n.disconnect()
        keep.disconnect()


@case
def opt_abort(t):
    with Server(t, ["memory:1M"]) as s:
        c = s.connect()
        c.handshake()
        rep_eq(c.opt_structured_reply(), nw.NBD_REP_ACK, "STRUCTURED_REPLY")
        r = c.opt_abort()
        check(r is not None, "no reply to NBD_OPT_ABORT (connection closed)")
        eq(r.option, nw.NBD_OPT_ABORT, "reply option")
        rep_eq(r, nw.NBD_REP_ACK, "NBD_OPT_ABORT")
        eq(r.data, b"", "ABORT reply data")
        check(c.is_closed(5), "server did not close after ABORT")
        c.close()
        c = s.client()
        ok_reply(c.read(0, 512), "read after another client's ABORT")
        c.disconnect()


@case
def simple_replies(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client()
        check(not c.tflags & nw.NBD_FLAG_SEND_DF, "SEND_DF advertised "
              "without structured replies (tflags 0x%x)" % c.tflags)
        data = pattern(128 * KiB, 11)
        r = ok_reply(c.write(4096, data), "write")
        eq(r.chunks[0].kind, "simple", "write reply kind")
        r = ok_reply(c.read(0, 4096 + len(data) + 4096), "read")
        eq(r.chunks[0].kind, "simple", "read reply kind")
        check(r.content() == bytes(4096) + data + bytes(4096),
              "simple read content")
        r = err_reply(c.read(64 * MiB, 512), nw.NBD_EINVAL, "read past end")
        eq(r.chunks[0].data, b"", "error reply carries no data")
        # Stream still in sync after the error (no data followed it).
        r = ok_reply(c.read(4096, 16), "read after error")
        eq(r.content(), data[:16], "data")
        # Pipelined simple replies.
        cks = [c.send_request(NBD_CMD_READ, 4096 + i * 4096, 4096)
               for i in range(8)]
        rs = c.wait_all(cks)
        for i, ck in enumerate(cks):
            check(rs[ck].content() == data[i * 4096:(i + 1) * 4096],
                  "pipelined simple read %d" % i)
        c.disconnect()


@case
def max_payload_read_write(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True)
        data = pattern(MAX_PAYLOAD, 21)
        ok_reply(c.write(MiB, data), "32 MiB write")
        r = ok_reply(c.read(MiB, MAX_PAYLOAD), "32 MiB read")
        check(r.content() == data, "32 MiB read back differs")
        for ch in r.chunks:
            check(len(ch.payload) <= MAX_PAYLOAD + 8,
                  "chunk payload %d exceeds max" % len(ch.payload))
        c.disconnect()


@case
def flush_and_fua(t):
    path = make_file(t, "f.img", 4 * MiB)
    with Server(t, [path]) as s:
        c = s.client(structured=True)
        check(c.tflags & nw.NBD_FLAG_SEND_FLUSH, "SEND_FLUSH not advertised")
        check(c.tflags & nw.NBD_FLAG_SEND_FUA, "SEND_FUA not advertised")
        d1 = pattern(64 * KiB, 31)
        d2 = pattern(8192, 32)
        ok_reply(c.write(0, d1), "write")
        ok_reply(c.flush(), "FLUSH")
        ok_reply(c.write(MiB, d2, NBD_CMD_FLAG_FUA), "FUA write")
        if c.tflags & nw.NBD_FLAG_SEND_WRITE_ZEROES:
            ok_reply(c.write_zeroes(4096, 4096, NBD_CMD_FLAG_FUA),
                     "FUA write zeroes")
            d1 = d1[:4096] + bytes(4096) + d1[8192:]
        with open(path, "rb") as f:
            got1 = f.read(len(d1))
            f.seek(MiB)
            got2 = f.read(len(d2))
        check(got1 == d1, "flushed data not in the image file")
        check(got2 == d2, "FUA data not in the image file")
        r = ok_reply(c.read(0, len(d1)), "read")
        check(r.content() == d1, "read back after flush")
        ok_reply(c.flush(), "second FLUSH")
        c.disconnect()


@case
def block_status_base_allocation(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True, meta=["base:allocation"])
        ctx = c.contexts["base:allocation"]
        ok_reply(c.write(MiB, pattern(64 * KiB, 41)), "write 64K at 1M")
        r = ok_reply(c.block_status(0, 4 * MiB), "BLOCK_STATUS")
        eq([ch.kind for ch in r.chunks], ["structured"], "reply chunks")
        eq(r.chunks[0].type, nw.NBD_REPLY_TYPE_BLOCK_STATUS, "chunk type")
        smap = status_map(c, ctx, 0, 64 * MiB)
        eq(flags_over(smap, MiB, MiB + 64 * KiB), {0},
           "flags of the written chunk (%s)" % fmt_map(smap))
        eq(flags_over(smap, 0, MiB), {NBD_STATE_HOLE | NBD_STATE_ZERO},
           "flags before (%s)" % fmt_map(smap))
        eq(flags_over(smap, MiB + 64 * KiB, 64 * MiB),
           {NBD_STATE_HOLE | NBD_STATE_ZERO}, "flags after (%s)"
           % fmt_map(smap))
        # REQ_ONE: one descriptor, not longer than asked.
        r = ok_reply(c.block_status(MiB - 4096, 8192,
                                    nw.NBD_CMD_FLAG_REQ_ONE), "REQ_ONE")
        ex = r.extents()[ctx]
        eq(len(ex), 1, "REQ_ONE descriptors")
        eq(ex[0], (4096, NBD_STATE_HOLE | NBD_STATE_ZERO), "REQ_ONE extent")
        # Beyond the end: EINVAL.
        err_reply(c.block_status(64 * MiB, 4096), nw.NBD_EINVAL,
                  "status past end")
        c.disconnect()
        # BLOCK_STATUS without a selected context is an error (EINVAL).
        c = s.client(structured=True)
        err_reply(c.block_status(0, 4096), nw.NBD_EINVAL,
                  "status without contexts")
        ok_reply(c.read(0, 512), "read after status error")
        c.disconnect()


@case
def block_status_allocation_depth(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True, meta=["qemu:allocation-depth"])
        ctx = c.contexts["qemu:allocation-depth"]
        ok_reply(c.write(2 * MiB, pattern(64 * KiB, 51)), "write")
        smap = status_map(c, ctx, 0, 8 * MiB)
        eq(flags_over(smap, 2 * MiB, 2 * MiB + 64 * KiB), {1},
           "depth of data (%s)" % fmt_map(smap))
        # A device with no backing layer provides its holes itself: depth
        # 1 everywhere, as qemu-nbd -A reports for a sparse raw file.
        eq(flags_over(smap, 0, 2 * MiB), {1}, "depth of hole before (%s)"
           % fmt_map(smap))
        eq(flags_over(smap, 2 * MiB + 64 * KiB, 8 * MiB), {1},
           "depth of hole after (%s)" % fmt_map(smap))
        c.disconnect()


@case
def compact_status_large_export(t):
    # 32-bit extent lengths on an 8 GiB export: no zero-length or
    # wrapped extents, and the walk must cover the whole export.
    size = 8 * GiB
    with Server(t, ["memory:8G"]) as s:
        c = s.client(structured=True, meta=["base:allocation",
                                            "qemu:allocation-depth"])
        base = c.contexts["base:allocation"]
        depth = c.contexts["qemu:allocation-depth"]
        ok_reply(c.write(5 * GiB, pattern(64 * KiB, 61)), "write at 5 GiB")
        r = ok_reply(c.block_status(0, 0xFFFFFFFF), "status 4 GiB - 1")
        for cid, ex in r.extents().items():
            total = sum(ln for ln, _ in ex)
            check(0 < total, "empty answer for context %d" % cid)
        smap = status_map(c, base, 0, size)
        eq(smap[-1][0] + smap[-1][1], size, "walk ends at the export end")
        eq(flags_over(smap, 5 * GiB, 5 * GiB + 64 * KiB), {0},
           "data at 5 GiB (%s)" % fmt_map(smap))
        eq(flags_over(smap, 0, 5 * GiB), {NBD_STATE_HOLE | NBD_STATE_ZERO},
           "hole below 5 GiB (%s)" % fmt_map(smap))
        eq(flags_over(smap, 5 * GiB + 64 * KiB, size),
           {NBD_STATE_HOLE | NBD_STATE_ZERO}, "hole above (%s)"
           % fmt_map(smap))
        dmap = status_map(c, depth, 4 * GiB, size)
        eq(flags_over(dmap, 5 * GiB, 5 * GiB + 64 * KiB), {1},
           "depth at 5 GiB (%s)" % fmt_map(dmap))
        c.disconnect()


@case
def unaligned_io(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True)
        ok_reply(c.write(65535, b"ABC"), "write across a 64K boundary")
        ok_reply(c.write(3 * 65536 - 1, pattern(65538, 3)),
                 "write spanning three 64K chunks")
        r = ok_reply(c.read(65534, 5), "read")
        eq(r.content(), b"\0ABC\0", "bytes around the boundary")
        r = ok_reply(c.read(3 * 65536 - 2, 65540), "read")
        check(r.content() == b"\0" + pattern(65538, 3) + b"\0",
              "unaligned multi-chunk data")
        if c.tflags & nw.NBD_FLAG_SEND_WRITE_ZEROES:
            ok_reply(c.write_zeroes(65536, 1), "zero one byte")
            r = ok_reply(c.read(65535, 3), "read")
            eq(r.content(), b"A\0C", "one byte zeroed")
        c.disconnect()


@case
def multi_conn_consistency(t):
    with Server(t, ["memory:64M"]) as s:
        a = s.client(structured=True)
        b = s.client(extended=True)
        check(a.tflags & nw.NBD_FLAG_CAN_MULTI_CONN,
              "CAN_MULTI_CONN not advertised (the test relies on it)")
        ok_reply(a.write(MiB, pattern(8192, 71)), "write on A")
        ok_reply(a.flush(), "flush on A")
        r = ok_reply(b.read(MiB, 8192), "read on B")
        check(r.content() == pattern(8192, 71), "B does not see A's write")
        ok_reply(b.trim(MiB, 64 * KiB), "trim on B")
        ok_reply(b.flush(), "flush on B")
        r = ok_reply(a.read(MiB, 8192), "read on A")
        check(r.content() in (bytes(8192), pattern(8192, 71)),
              "read after trim returned neither old data nor zeroes")
        a.disconnect()
        b.disconnect()


@case
def disconnect_with_requests_in_flight(t):
    with Server(t, ["memory:64M"]) as s:
        c = s.client(structured=True)
        cks = [c.send_request(NBD_CMD_WRITE, MiB + i * 65536, 65536,
                              payload=bytes([i + 1]) * 65536)
               for i in range(16)]
        c.send_request(nw.NBD_CMD_DISC, track=False)
        done = 0
        try:
            while True:
                ch = c.recv_chunk()
                ok_reply(c.finished[ch.cookie], "write before DISC")
                done += 1
        except nw.Closed:
            pass
        eq(done, 16, "replies to the writes sent before NBD_CMD_DISC")
        eq(sorted(c.finished), sorted(cks), "cookies answered")
        c.close()
        d = s.client(structured=True)
        r = ok_reply(d.read(MiB, 16 * 65536), "read back")
        data = r.content()
        for i in range(16):
            check(data[i * 65536:(i + 1) * 65536] == bytes([i + 1]) * 65536,
                  "write %d before DISC not stored" % i)
        d.disconnect()


@case
def max_connections(t):
    with Server(t, ["memory:64M"], options=["--max-connections", "2"]) as s:
        a = s.client()
        b = s.client()
        c = s.connect()
        try:
            c.handshake()
            res = c.opt_list()
            refused = res.type == nw.NBD_REP_ERR_SHUTDOWN or rep_is_err(res)
        except (nw.Closed, OSError):
            refused = True
        check(refused, "third connection accepted with --max-connections 2")
        c.close()
        ok_reply(a.read(0, 512), "first connection still works")
        a.disconnect()
        deadline = time.monotonic() + 5
        while True:
            try:
                d = s.client()
                break
            except (nw.Closed, OSError, ProtocolError) as e:
                if time.monotonic() > deadline:
                    raise Failure("no new connection accepted after one of "
                                  "two closed: %s" % e)
                time.sleep(0.05)
        ok_reply(d.read(0, 512), "new connection works")
        ok_reply(b.read(0, 512), "second connection still works")
        d.disconnect()
        b.disconnect()


@case
def sigterm_with_open_connections(t):
    s = Server(t, ["memory:64M"])
    s.start()
    try:
        a = s.client(extended=True)
        ok_reply(a.write(0, pattern(4096, 1)), "write")
        b = s.connect()
        b.handshake()          # parked in negotiation
        check(casetest.wait_until(10, lambda: len(s.conn_threads()) == 2),
              "connection threads: %r" % s.conn_threads())
        t0 = time.monotonic()
        rc = s.stop()
        check(rc is not None, "server ignored SIGTERM for 10 s with open "
              "connections")
        eq(rc, 0, "exit status after SIGTERM with open connections")
        check(time.monotonic() - t0 < 5, "shutdown took %.1f s"
              % (time.monotonic() - t0))
        a.close()
        b.close()
    finally:
        s.stop()


@case
def client_never_reads_replies(t):
    """A client that queues many large reads and never reads a reply must
    cost the others nothing: its replies wait in its own socket."""
    size = 64 << 20
    data = pattern(1 << 20, 91)
    img = make_file(t, "busy.img", size,
                    [(i << 20, data) for i in range(size >> 20)])
    with Server(t, [img], options=["--workers", "2"]) as s:
        a = s.client(extended=True)
        # 120 reads: past the server's 64 MiB in-flight budget, so it also
        # stops reading A; few enough that A's own sends do not block.
        for i in range(120):
            a.send_request(nw.NBD_CMD_READ, (i % 64) << 20, 1 << 20,
                           track=False)
        b = s.client(extended=True)
        t0 = time.monotonic()
        for i in range(50):
            ok_reply(b.write(i * 4096, pattern(4096, i)), "write on B")
            r = ok_reply(b.read(i * 4096, 4096), "read on B")
            check(r.content() == pattern(4096, i), "data on B")
        check(time.monotonic() - t0 < 5, "B was slowed down by A: %.1f s"
              % (time.monotonic() - t0))
        c = s.client()
        ok_reply(c.read(size - 4096, 4096), "read on a third connection")
        a.close()
        ok_reply(b.flush(), "flush on B after A went away")
        b.disconnect()
        c.disconnect()


@case
def tcp_listener(t):
    import socket
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with Server(t, ["memory:64M"], tcp=("127.0.0.1", port)) as s:
        c = s.client(extended=True)
        ok_reply(c.write(0, pattern(65536, 81)), "write over TCP")
        r = ok_reply(c.read(0, 65536), "read over TCP")
        check(r.content() == pattern(65536, 81), "TCP data")
        c.disconnect()


def rep_is_err(res):
    return nw.rep_is_error(res.type)


# --------------------------------------------------------------------- main


def run_case(fn):
    tmp = tempfile.mkdtemp(prefix="bp-proto-")
    try:
        fn(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if not casetest.blockport_usable(BLOCKPORT):
        return 77
    return casetest.run([(f.__name__, f) for f in CASES], argv, run_case,
                        expected=(ProtocolError, nw.Closed, OSError,
                                  struct.error, KeyError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
