# SPDX-License-Identifier: BSD-3-Clause
"""nbdwire: a small raw-socket NBD client for protocol-conformance tests.

Python 3 standard library only.  It speaks the fixed-newstyle handshake,
every option blockport knows (including NBD_OPT_EXTENDED_HEADERS), and the
transmission phase with compact or extended requests and simple,
structured or extended replies.  It is deliberately low level: nothing is
hidden, every reply is handed back as parsed, and malformed traffic can be
sent on purpose (see Client.send_raw).

Reference: NetworkBlockDevice/nbd doc/proto.md, plus the extended-headers
text of its extension-ext-header branch.  All wire integers are big-endian.
"""

import socket
import struct

# ---------------------------------------------------------------- constants

NBD_MAGIC = 0x4E42444D41474943          # "NBDMAGIC"
NBD_IHAVEOPT = 0x49484156454F5054       # "IHAVEOPT"
NBD_REP_MAGIC = 0x3E889045565A9

# Handshake flags (server) and client flags.
NBD_FLAG_FIXED_NEWSTYLE = 1 << 0
NBD_FLAG_NO_ZEROES = 1 << 1
NBD_FLAG_C_FIXED_NEWSTYLE = 1 << 0
NBD_FLAG_C_NO_ZEROES = 1 << 1

# Transmission flags.
NBD_FLAG_HAS_FLAGS = 1 << 0
NBD_FLAG_READ_ONLY = 1 << 1
NBD_FLAG_SEND_FLUSH = 1 << 2
NBD_FLAG_SEND_FUA = 1 << 3
NBD_FLAG_ROTATIONAL = 1 << 4
NBD_FLAG_SEND_TRIM = 1 << 5
NBD_FLAG_SEND_WRITE_ZEROES = 1 << 6
NBD_FLAG_SEND_DF = 1 << 7
NBD_FLAG_CAN_MULTI_CONN = 1 << 8
NBD_FLAG_SEND_RESIZE = 1 << 9
NBD_FLAG_SEND_CACHE = 1 << 10
NBD_FLAG_SEND_FAST_ZERO = 1 << 11
NBD_FLAG_BLOCK_STAT_PAYLOAD = 1 << 12

# Options.
NBD_OPT_EXPORT_NAME = 1
NBD_OPT_ABORT = 2
NBD_OPT_LIST = 3
NBD_OPT_STARTTLS = 5
NBD_OPT_INFO = 6
NBD_OPT_GO = 7
NBD_OPT_STRUCTURED_REPLY = 8
NBD_OPT_LIST_META_CONTEXT = 9
NBD_OPT_SET_META_CONTEXT = 10
NBD_OPT_EXTENDED_HEADERS = 11

# Option reply types.
NBD_REP_ACK = 1
NBD_REP_SERVER = 2
NBD_REP_INFO = 3
NBD_REP_META_CONTEXT = 4
NBD_REP_FLAG_ERROR = 1 << 31
NBD_REP_ERR_UNSUP = NBD_REP_FLAG_ERROR | 1
NBD_REP_ERR_POLICY = NBD_REP_FLAG_ERROR | 2
NBD_REP_ERR_INVALID = NBD_REP_FLAG_ERROR | 3
NBD_REP_ERR_PLATFORM = NBD_REP_FLAG_ERROR | 4
NBD_REP_ERR_TLS_REQD = NBD_REP_FLAG_ERROR | 5
NBD_REP_ERR_UNKNOWN = NBD_REP_FLAG_ERROR | 6
NBD_REP_ERR_SHUTDOWN = NBD_REP_FLAG_ERROR | 7
NBD_REP_ERR_BLOCK_SIZE_REQD = NBD_REP_FLAG_ERROR | 8
NBD_REP_ERR_TOO_BIG = NBD_REP_FLAG_ERROR | 9
NBD_REP_ERR_EXT_HEADER_REQD = NBD_REP_FLAG_ERROR | 10

# NBD_REP_INFO types.
NBD_INFO_EXPORT = 0
NBD_INFO_NAME = 1
NBD_INFO_DESCRIPTION = 2
NBD_INFO_BLOCK_SIZE = 3

# Requests.
NBD_REQUEST_MAGIC = 0x25609513
NBD_EXTENDED_REQUEST_MAGIC = 0x21E41C71
NBD_CMD_READ = 0
NBD_CMD_WRITE = 1
NBD_CMD_DISC = 2
NBD_CMD_FLUSH = 3
NBD_CMD_TRIM = 4
NBD_CMD_CACHE = 5
NBD_CMD_WRITE_ZEROES = 6
NBD_CMD_BLOCK_STATUS = 7

NBD_CMD_FLAG_FUA = 1 << 0
NBD_CMD_FLAG_NO_HOLE = 1 << 1
NBD_CMD_FLAG_DF = 1 << 2
NBD_CMD_FLAG_REQ_ONE = 1 << 3
NBD_CMD_FLAG_FAST_ZERO = 1 << 4
NBD_CMD_FLAG_PAYLOAD_LEN = 1 << 5

# Replies.
NBD_SIMPLE_REPLY_MAGIC = 0x67446698
NBD_STRUCTURED_REPLY_MAGIC = 0x668E33EF
NBD_EXTENDED_REPLY_MAGIC = 0x6E8A278C
NBD_REPLY_FLAG_DONE = 1 << 0
NBD_REPLY_TYPE_NONE = 0
NBD_REPLY_TYPE_OFFSET_DATA = 1
NBD_REPLY_TYPE_OFFSET_HOLE = 2
NBD_REPLY_TYPE_BLOCK_STATUS = 5
NBD_REPLY_TYPE_BLOCK_STATUS_EXT = 6
NBD_REPLY_TYPE_ERROR = (1 << 15) | 1
NBD_REPLY_TYPE_ERROR_OFFSET = (1 << 15) | 2

# base:allocation flags.
NBD_STATE_HOLE = 1 << 0
NBD_STATE_ZERO = 1 << 1

# Errors on the wire.
NBD_EPERM = 1
NBD_EIO = 5
NBD_ENOMEM = 12
NBD_EINVAL = 22
NBD_ENOSPC = 28
NBD_EOVERFLOW = 75
NBD_ENOTSUP = 95
NBD_ESHUTDOWN = 108

_REP_NAMES = {
    NBD_REP_ACK: "ACK", NBD_REP_SERVER: "SERVER", NBD_REP_INFO: "INFO",
    NBD_REP_META_CONTEXT: "META_CONTEXT",
    NBD_REP_ERR_UNSUP: "ERR_UNSUP", NBD_REP_ERR_POLICY: "ERR_POLICY",
    NBD_REP_ERR_INVALID: "ERR_INVALID", NBD_REP_ERR_PLATFORM: "ERR_PLATFORM",
    NBD_REP_ERR_TLS_REQD: "ERR_TLS_REQD", NBD_REP_ERR_UNKNOWN: "ERR_UNKNOWN",
    NBD_REP_ERR_SHUTDOWN: "ERR_SHUTDOWN",
    NBD_REP_ERR_BLOCK_SIZE_REQD: "ERR_BLOCK_SIZE_REQD",
    NBD_REP_ERR_TOO_BIG: "ERR_TOO_BIG",
    NBD_REP_ERR_EXT_HEADER_REQD: "ERR_EXT_HEADER_REQD",
}

_CHUNK_NAMES = {
    NBD_REPLY_TYPE_NONE: "NONE", NBD_REPLY_TYPE_OFFSET_DATA: "OFFSET_DATA",
    NBD_REPLY_TYPE_OFFSET_HOLE: "OFFSET_HOLE",
    NBD_REPLY_TYPE_BLOCK_STATUS: "BLOCK_STATUS",
    NBD_REPLY_TYPE_BLOCK_STATUS_EXT: "BLOCK_STATUS_EXT",
    NBD_REPLY_TYPE_ERROR: "ERROR", NBD_REPLY_TYPE_ERROR_OFFSET: "ERROR_OFFSET",
}


def rep_name(t):
    """Readable name of an option reply type (e.g. 'ERR_UNSUP')."""
    return _REP_NAMES.get(t, "0x%x" % t)


def chunk_name(t):
    """Readable name of a reply chunk type."""
    return _CHUNK_NAMES.get(t, "0x%x" % t)


def rep_is_error(t):
    return bool(t & NBD_REP_FLAG_ERROR)


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow."""


class Closed(EOFError):
    """The peer closed the connection."""


# ----------------------------------------------------------------- messages


class OptionReply:
    """One reply to an option: option, reply type, raw data."""

    __slots__ = ("option", "type", "data")

    def __init__(self, option, rtype, data):
        self.option = option
        self.type = rtype
        self.data = data

    @property
    def is_error(self):
        return rep_is_error(self.type)

    @property
    def is_final(self):
        return self.type == NBD_REP_ACK or self.is_error

    def __repr__(self):
        return "OptionReply(opt=%d, %s, %d bytes)" % (
            self.option, rep_name(self.type), len(self.data))


class OptionResult:
    """Every reply to one option; .final is the last (ACK or an error)."""

    def __init__(self, option, replies):
        self.option = option
        self.replies = replies
        self.final = replies[-1]
        # Filled in by the helpers that parse replies.
        self.exports = []          # LIST: [(name, description)]
        self.contexts = {}         # META_CONTEXT: {name: id}
        self.info = {}             # INFO/GO: parsed NBD_REP_INFO items

    @property
    def type(self):
        return self.final.type

    @property
    def ok(self):
        return self.final.type == NBD_REP_ACK

    def __repr__(self):
        return "OptionResult(opt=%d, final=%s, %d replies)" % (
            self.option, rep_name(self.final.type), len(self.replies))


class Chunk:
    """One reply message of any of the three kinds.

    kind is 'simple', 'structured' or 'extended'.  For a simple reply,
    type is None, error is the error field, flags is DONE and data is the
    read payload (if any).  For chunks, the payload is parsed by type:
      OFFSET_DATA: .data_offset, .data
      OFFSET_HOLE: .data_offset, .hole_length
      BLOCK_STATUS/_EXT: .context_id, .extents [(length, flags)], .count
      ERROR/ERROR_OFFSET: .error, .message, (.error_offset)
    .hdr_offset is the header's offset field (extended chunks only).
    """

    def __init__(self, kind, flags, rtype, cookie, payload,
                 hdr_offset=None, error=0):
        self.kind = kind
        self.flags = flags
        self.type = rtype
        self.cookie = cookie
        self.payload = payload
        self.hdr_offset = hdr_offset
        self.error = error
        self.message = b""
        self.error_offset = None
        self.data_offset = None
        self.data = b""
        self.hole_length = None
        self.context_id = None
        self.extents = []
        self.count = None
        if kind != "simple":
            self._parse()
        else:
            self.data = payload

    @property
    def done(self):
        return bool(self.flags & NBD_REPLY_FLAG_DONE)

    @property
    def is_error(self):
        if self.kind == "simple":
            return self.error != 0
        return bool(self.type & 0x8000)

    def _need(self, n, what):
        if len(self.payload) < n:
            raise ProtocolError("%s chunk payload too short: %d < %d" %
                                (what, len(self.payload), n))

    def _parse(self):
        p = self.payload
        t = self.type
        if t == NBD_REPLY_TYPE_NONE:
            if p:
                raise ProtocolError("NONE chunk with %d bytes payload" % len(p))
        elif t == NBD_REPLY_TYPE_OFFSET_DATA:
            self._need(9, "OFFSET_DATA")
            self.data_offset = struct.unpack(">Q", p[:8])[0]
            self.data = p[8:]
        elif t == NBD_REPLY_TYPE_OFFSET_HOLE:
            if len(p) != 12:
                raise ProtocolError("OFFSET_HOLE chunk payload %d != 12" % len(p))
            self.data_offset, self.hole_length = struct.unpack(">QI", p)
        elif t == NBD_REPLY_TYPE_BLOCK_STATUS:
            if len(p) < 12 or (len(p) - 4) % 8:
                raise ProtocolError("BLOCK_STATUS chunk bad length %d" % len(p))
            self.context_id = struct.unpack(">I", p[:4])[0]
            self.extents = [struct.unpack(">II", p[i:i + 8])
                            for i in range(4, len(p), 8)]
            self.count = len(self.extents)
        elif t == NBD_REPLY_TYPE_BLOCK_STATUS_EXT:
            if len(p) < 24 or (len(p) - 8) % 16:
                raise ProtocolError("BLOCK_STATUS_EXT chunk bad length %d"
                                    % len(p))
            self.context_id, self.count = struct.unpack(">II", p[:8])
            self.extents = [struct.unpack(">QQ", p[i:i + 16])
                            for i in range(8, len(p), 16)]
            if self.count and self.count != len(self.extents):
                raise ProtocolError(
                    "BLOCK_STATUS_EXT count %d but %d descriptors"
                    % (self.count, len(self.extents)))
        elif t & 0x8000:
            self._need(6, "error")
            self.error, msglen = struct.unpack(">IH", p[:6])
            if t == NBD_REPLY_TYPE_ERROR_OFFSET:
                if len(p) != 6 + msglen + 8:
                    raise ProtocolError("ERROR_OFFSET chunk length %d, "
                                        "message length %d" % (len(p), msglen))
                self.message = p[6:6 + msglen]
                self.error_offset = struct.unpack(">Q", p[6 + msglen:])[0]
            else:
                if len(p) < 6 + msglen:
                    raise ProtocolError("ERROR chunk length %d, message "
                                        "length %d" % (len(p), msglen))
                self.message = p[6:6 + msglen]
        # Unknown non-error types are kept raw; tests decide.

    def __repr__(self):
        if self.kind == "simple":
            return "Chunk(simple, cookie=%d, error=%d, %d bytes)" % (
                self.cookie, self.error, len(self.data))
        s = "Chunk(%s, %s, flags=%d, cookie=%d" % (
            self.kind, chunk_name(self.type), self.flags, self.cookie)
        if self.hdr_offset is not None:
            s += ", hdr_offset=%d" % self.hdr_offset
        if self.type in (NBD_REPLY_TYPE_OFFSET_DATA,):
            s += ", offset=%d, %d bytes" % (self.data_offset, len(self.data))
        elif self.type == NBD_REPLY_TYPE_OFFSET_HOLE:
            s += ", offset=%d, hole=%d" % (self.data_offset, self.hole_length)
        elif self.type in (NBD_REPLY_TYPE_BLOCK_STATUS,
                           NBD_REPLY_TYPE_BLOCK_STATUS_EXT):
            s += ", ctx=%d, extents=%r" % (self.context_id, self.extents[:8])
        elif self.is_error:
            s += ", error=%d, msg=%r" % (self.error, self.message)
        return s + ")"


class Reply:
    """Every chunk received for one cookie, in arrival order."""

    def __init__(self, request):
        self.request = request     # the Request it answers
        self.chunks = []

    @property
    def cookie(self):
        return self.request.cookie

    @property
    def done(self):
        return bool(self.chunks) and self.chunks[-1].done

    @property
    def error(self):
        """The errno of the reply (first error chunk or simple error); 0
        if none."""
        for c in self.chunks:
            if c.is_error:
                return c.error
        return 0

    @property
    def error_chunks(self):
        return [c for c in self.chunks if c.is_error]

    @property
    def kinds(self):
        return set(c.kind for c in self.chunks)

    def types(self):
        return [c.type for c in self.chunks]

    def content(self, base=None, length=None):
        """Reassemble a read reply into bytes.  OFFSET_HOLE is zeroes.
        Raises ProtocolError for overlap, gaps or chunks out of range."""
        req = self.request
        if base is None:
            base = req.offset
        if length is None:
            length = req.length
        if len(self.chunks) == 1 and self.chunks[0].kind == "simple":
            return self.chunks[0].data
        buf = bytearray(length)
        spans = []
        for c in self.chunks:
            if c.type == NBD_REPLY_TYPE_OFFSET_DATA:
                start, n = c.data_offset, len(c.data)
            elif c.type == NBD_REPLY_TYPE_OFFSET_HOLE:
                start, n = c.data_offset, c.hole_length
            else:
                continue
            if start < base or start + n > base + length:
                raise ProtocolError("chunk [%d,+%d) outside request [%d,+%d)"
                                    % (start, n, base, length))
            spans.append((start, n))
            if c.type == NBD_REPLY_TYPE_OFFSET_DATA:
                buf[start - base:start - base + n] = c.data
        spans.sort()
        pos = base
        for start, n in spans:
            if start < pos:
                raise ProtocolError("content chunks overlap at %d" % start)
            if start > pos:
                raise ProtocolError("content gap [%d,%d)" % (pos, start))
            pos = start + n
        if pos != base + length:
            raise ProtocolError("content ends at %d, expected %d"
                                % (pos, base + length))
        return bytes(buf)

    def extents(self):
        """{context_id: [(length, flags)]} from the status chunks."""
        out = {}
        for c in self.chunks:
            if c.type in (NBD_REPLY_TYPE_BLOCK_STATUS,
                          NBD_REPLY_TYPE_BLOCK_STATUS_EXT):
                if c.context_id in out:
                    raise ProtocolError("two status chunks for context %d"
                                        % c.context_id)
                out[c.context_id] = list(c.extents)
        return out

    def __repr__(self):
        return "Reply(cookie=%d, %r)" % (self.cookie, self.chunks)


class Request:
    __slots__ = ("cookie", "type", "flags", "offset", "length", "extended",
                 "payload")

    def __init__(self, cookie, rtype, flags, offset, length, extended,
                 payload):
        self.cookie = cookie
        self.type = rtype
        self.flags = flags
        self.offset = offset
        self.length = length
        self.extended = extended
        self.payload = payload

    def __repr__(self):
        return "Request(cookie=%d, type=%d, flags=0x%x, off=%d, len=%d%s)" % (
            self.cookie, self.type, self.flags, self.offset, self.length,
            ", ext" if self.extended else "")


# -------------------------------------------------------------------- client


class Client:
    """One NBD connection.

    Typical use:
        c = Client.unix(path)
        c.handshake()
        c.opt_extended_headers()          # or c.opt_structured_reply()
        c.opt_set_meta_context("", ["base:allocation"])
        c.opt_go("")
        r = c.read(0, 4096)
        data = r.content()
    """

    def __init__(self, sock, timeout=10.0):
        self.sock = sock
        self.sock.settimeout(timeout)
        self.handshake_flags = None
        self.no_zeroes = False
        self.structured = False        # NBD_OPT_STRUCTURED_REPLY acked
        self.extended = False          # NBD_OPT_EXTENDED_HEADERS acked
        self.transmission = False
        self.export_size = None
        self.tflags = None
        self.contexts = {}             # from the last SET_META_CONTEXT
        self.next_cookie = 1
        self.pending = {}              # cookie -> Request
        self.replies = {}              # cookie -> Reply (in progress)
        self.finished = {}             # cookie -> Reply (DONE received)
        self.log = []                  # chunks in arrival order

    # -- connecting

    @classmethod
    def unix(cls, path, timeout=10.0):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(path)
        return cls(s, timeout)

    @classmethod
    def tcp(cls, host, port, timeout=10.0):
        s = socket.create_connection((host, port), timeout)
        return cls(s, timeout)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- raw I/O

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                got = self.sock.recv(min(n - len(buf), 1 << 20))
            except ConnectionResetError:
                got = b""
            if not got:
                raise Closed("connection closed after %d of %d bytes"
                             % (len(buf), n))
            buf += got
        return bytes(buf)

    def is_closed(self, wait=2.0):
        """True if the peer closes the connection (EOF or reset) within
        wait seconds without sending anything; False if the connection is
        still open then.  Raises ProtocolError if data arrives."""
        old = self.sock.gettimeout()
        self.sock.settimeout(wait)
        try:
            got = self.sock.recv(1)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        finally:
            self.sock.settimeout(old)
        if got:
            raise ProtocolError("unexpected data %r while waiting for close"
                                % got)
        return True

    def drain_until_closed(self, wait=5.0, limit=1 << 20):
        """Read and discard whatever arrives until the peer closes.
        Returns (closed, received_bytes); closed is False if the
        connection is still open wait seconds after the last data."""
        old = self.sock.gettimeout()
        self.sock.settimeout(wait)
        got = bytearray()
        try:
            while len(got) < limit:
                try:
                    b = self.sock.recv(65536)
                except socket.timeout:
                    return False, bytes(got)
                except (ConnectionResetError, BrokenPipeError):
                    return True, bytes(got)
                if not b:
                    return True, bytes(got)
                got += b
            return False, bytes(got)
        finally:
            self.sock.settimeout(old)

    # -- handshake

    def handshake(self, client_flags=NBD_FLAG_C_FIXED_NEWSTYLE |
                  NBD_FLAG_C_NO_ZEROES):
        """Read the newstyle greeting and send client flags; return the
        16-bit handshake flags."""
        magic, opt_magic, hflags = struct.unpack(">QQH", self.recv_exact(18))
        if magic != NBD_MAGIC:
            raise ProtocolError("bad NBDMAGIC 0x%x" % magic)
        if opt_magic != NBD_IHAVEOPT:
            raise ProtocolError("not newstyle: 0x%x" % opt_magic)
        self.handshake_flags = hflags
        self.send_raw(struct.pack(">I", client_flags))
        self.no_zeroes = bool(client_flags & NBD_FLAG_C_NO_ZEROES and
                              hflags & NBD_FLAG_NO_ZEROES)
        return hflags

    def send_option(self, option, data=b""):
        self.send_raw(struct.pack(">QII", NBD_IHAVEOPT, option, len(data)) +
                      data)

    def recv_option_reply(self):
        magic, option, rtype, length = struct.unpack(">QIII",
                                                     self.recv_exact(20))
        if magic != NBD_REP_MAGIC:
            raise ProtocolError("bad option reply magic 0x%x" % magic)
        data = self.recv_exact(length) if length else b""
        return OptionReply(option, rtype, data)

    def option(self, option, data=b""):
        """Send an option and read replies up to the final one (ACK or
        error).  Checks that each reply names the option sent."""
        self.send_option(option, data)
        replies = []
        while True:
            r = self.recv_option_reply()
            if r.option != option:
                raise ProtocolError("reply for option %d to option %d"
                                    % (r.option, option))
            replies.append(r)
            if r.is_final:
                return OptionResult(option, replies)

    # -- option helpers

    def opt_abort(self):
        """NBD_OPT_ABORT; returns the reply (expected ACK), or None if the
        server closed the connection without replying."""
        self.send_option(NBD_OPT_ABORT)
        try:
            return self.recv_option_reply()
        except Closed:
            return None

    def opt_starttls(self):
        return self.option(NBD_OPT_STARTTLS)

    def opt_structured_reply(self):
        res = self.option(NBD_OPT_STRUCTURED_REPLY)
        if res.ok:
            self.structured = True
        return res

    def opt_extended_headers(self):
        res = self.option(NBD_OPT_EXTENDED_HEADERS)
        if res.ok:
            self.extended = True
        return res

    def opt_list(self):
        """NBD_OPT_LIST; result.exports = [(name, description)] where
        description is whatever follows the name (may be '')."""
        res = self.option(NBD_OPT_LIST)
        for r in res.replies:
            if r.type != NBD_REP_SERVER:
                continue
            if len(r.data) < 4:
                raise ProtocolError("NBD_REP_SERVER too short")
            n = struct.unpack(">I", r.data[:4])[0]
            if 4 + n > len(r.data):
                raise ProtocolError("NBD_REP_SERVER name length %d > %d"
                                    % (n, len(r.data) - 4))
            res.exports.append((r.data[4:4 + n].decode("utf-8"),
                                r.data[4 + n:].decode("utf-8")))
        return res

    @staticmethod
    def _name_and_infos(name, infos):
        nb = name.encode("utf-8") if isinstance(name, str) else name
        data = struct.pack(">I", len(nb)) + nb
        data += struct.pack(">H", len(infos))
        for i in infos:
            data += struct.pack(">H", i)
        return data

    @staticmethod
    def parse_info(data):
        """Parse one NBD_REP_INFO payload into (info_type, dict)."""
        if len(data) < 2:
            raise ProtocolError("NBD_REP_INFO too short")
        itype = struct.unpack(">H", data[:2])[0]
        body = data[2:]
        if itype == NBD_INFO_EXPORT:
            if len(body) != 10:
                raise ProtocolError("NBD_INFO_EXPORT length %d" % len(data))
            size, tflags = struct.unpack(">QH", body)
            return itype, {"size": size, "tflags": tflags}
        if itype == NBD_INFO_NAME:
            return itype, {"name": body.decode("utf-8")}
        if itype == NBD_INFO_DESCRIPTION:
            return itype, {"description": body.decode("utf-8")}
        if itype == NBD_INFO_BLOCK_SIZE:
            if len(body) != 12:
                raise ProtocolError("NBD_INFO_BLOCK_SIZE length %d" % len(data))
            mn, pref, mx = struct.unpack(">III", body)
            return itype, {"min_block": mn, "pref_block": pref,
                           "max_block": mx}
        return itype, {"raw": body}

    def _info_or_go(self, option, name, infos):
        res = self.option(option, self._name_and_infos(name, infos))
        for r in res.replies:
            if r.type == NBD_REP_INFO:
                itype, d = self.parse_info(r.data)
                res.info.setdefault("types", []).append(itype)
                res.info.update(d)
        return res

    def opt_info(self, name="", infos=()):
        return self._info_or_go(NBD_OPT_INFO, name, list(infos))

    def opt_go(self, name="", infos=(NBD_INFO_BLOCK_SIZE,)):
        """NBD_OPT_GO; on ACK enters transmission and records export size
        and transmission flags."""
        res = self._info_or_go(NBD_OPT_GO, name, list(infos))
        if res.ok:
            if "size" not in res.info:
                raise ProtocolError("GO acked without NBD_INFO_EXPORT")
            self.export_size = res.info["size"]
            self.tflags = res.info["tflags"]
            self.transmission = True
        return res

    def opt_export_name(self, name=""):
        """NBD_OPT_EXPORT_NAME: returns (size, tflags); raises Closed if
        the server refuses (it must close the connection)."""
        nb = name.encode("utf-8")
        self.send_option(NBD_OPT_EXPORT_NAME, nb)
        n = 10 if self.no_zeroes else 134
        data = self.recv_exact(n)
        size, tflags = struct.unpack(">QH", data[:10])
        if not self.no_zeroes and data[10:] != bytes(124):
            raise ProtocolError("EXPORT_NAME reserved bytes not zero")
        self.export_size, self.tflags = size, tflags
        self.transmission = True
        return size, tflags

    def _meta(self, option, name, queries):
        nb = name.encode("utf-8")
        data = struct.pack(">I", len(nb)) + nb + struct.pack(">I",
                                                             len(queries))
        for q in queries:
            qb = q.encode("utf-8")
            data += struct.pack(">I", len(qb)) + qb
        res = self.option(option, data)
        for r in res.replies:
            if r.type == NBD_REP_META_CONTEXT:
                if len(r.data) < 4:
                    raise ProtocolError("NBD_REP_META_CONTEXT too short")
                cid = struct.unpack(">I", r.data[:4])[0]
                cname = r.data[4:].decode("utf-8")
                if cname in res.contexts:
                    raise ProtocolError("context %r listed twice" % cname)
                res.contexts[cname] = cid
        return res

    def opt_list_meta_context(self, name="", queries=()):
        return self._meta(NBD_OPT_LIST_META_CONTEXT, name, list(queries))

    def opt_set_meta_context(self, name="", queries=()):
        res = self._meta(NBD_OPT_SET_META_CONTEXT, name, list(queries))
        if res.ok:
            self.contexts = dict(res.contexts)
        return res

    # -- transmission: sending

    def new_cookie(self):
        c = self.next_cookie
        self.next_cookie += 1
        return c

    def send_request(self, rtype, offset=0, length=0, flags=0, payload=b"",
                     cookie=None, extended=None, track=True):
        """Send one request; returns its cookie.

        extended=None uses the negotiated header style.  For WRITE the
        length defaults to len(payload) and, with extended headers,
        NBD_CMD_FLAG_PAYLOAD_LEN is set (the spec says it MUST be).  For
        other commands with a payload, pass the flag yourself."""
        if extended is None:
            extended = self.extended
        if cookie is None:
            cookie = self.new_cookie()
        if rtype == NBD_CMD_WRITE and extended:
            flags |= NBD_CMD_FLAG_PAYLOAD_LEN
        if extended:
            hdr = struct.pack(">IHHQQQ", NBD_EXTENDED_REQUEST_MAGIC, flags,
                              rtype, cookie, offset, length)
        else:
            hdr = struct.pack(">IHHQQI", NBD_REQUEST_MAGIC, flags, rtype,
                              cookie, offset, length)
        req = Request(cookie, rtype, flags, offset, length, extended, payload)
        if track and rtype != NBD_CMD_DISC:
            self.pending[cookie] = req
            self.replies[cookie] = Reply(req)
        self.send_raw(hdr + payload)
        return cookie

    # -- transmission: receiving

    def recv_chunk(self):
        """Read one reply message of whatever kind arrives; file it under
        its cookie and return it."""
        magic = struct.unpack(">I", self.recv_exact(4))[0]
        if magic == NBD_SIMPLE_REPLY_MAGIC:
            error, cookie = struct.unpack(">IQ", self.recv_exact(12))
            req = self.pending.get(cookie)
            if req is None:
                raise ProtocolError("simple reply for unknown cookie %d"
                                    % cookie)
            data = b""
            if req.type == NBD_CMD_READ and error == 0:
                data = self.recv_exact(req.length)
            chunk = Chunk("simple", NBD_REPLY_FLAG_DONE, None, cookie, data,
                          error=error)
        elif magic == NBD_STRUCTURED_REPLY_MAGIC:
            flags, rtype, cookie, length = struct.unpack(
                ">HHQI", self.recv_exact(16))
            payload = self.recv_exact(length) if length else b""
            chunk = Chunk("structured", flags, rtype, cookie, payload)
        elif magic == NBD_EXTENDED_REPLY_MAGIC:
            flags, rtype, cookie, offset, length = struct.unpack(
                ">HHQQQ", self.recv_exact(28))
            if length > (1 << 32):
                raise ProtocolError("extended reply payload %d too big"
                                    % length)
            payload = self.recv_exact(length) if length else b""
            chunk = Chunk("extended", flags, rtype, cookie, payload,
                          hdr_offset=offset)
        else:
            raise ProtocolError("bad reply magic 0x%08x" % magic)
        self.log.append(chunk)
        reply = self.replies.get(chunk.cookie)
        if reply is None:
            raise ProtocolError("reply chunk for cookie %d not in flight: %r"
                                % (chunk.cookie, chunk))
        reply.chunks.append(chunk)
        if chunk.done:
            del self.replies[chunk.cookie]
            del self.pending[chunk.cookie]
            self.finished[chunk.cookie] = reply
        return chunk

    def wait(self, cookie):
        """Read until the reply for cookie is complete; return it."""
        while cookie not in self.finished:
            if cookie not in self.replies:
                raise KeyError("cookie %d was never sent" % cookie)
            self.recv_chunk()
        return self.finished.pop(cookie)

    def wait_all(self, cookies):
        """Read until every cookie's reply is complete; {cookie: Reply}."""
        out = {}
        for c in cookies:
            out[c] = self.wait(c)
        return out

    def request(self, rtype, offset=0, length=0, flags=0, payload=b"",
                **kw):
        return self.wait(self.send_request(rtype, offset, length, flags,
                                           payload, **kw))

    # -- command helpers (send and wait)

    def read(self, offset, length, flags=0):
        return self.request(NBD_CMD_READ, offset, length, flags)

    def write(self, offset, data, flags=0):
        return self.request(NBD_CMD_WRITE, offset, len(data), flags, data)

    def flush(self):
        return self.request(NBD_CMD_FLUSH)

    def trim(self, offset, length, flags=0):
        return self.request(NBD_CMD_TRIM, offset, length, flags)

    def write_zeroes(self, offset, length, flags=0):
        return self.request(NBD_CMD_WRITE_ZEROES, offset, length, flags)

    def cache(self, offset, length):
        return self.request(NBD_CMD_CACHE, offset, length)

    def block_status(self, offset, length, flags=0, context_ids=None):
        """NBD_CMD_BLOCK_STATUS.  With context_ids (extended headers and
        NBD_FLAG_BLOCK_STAT_PAYLOAD only) the request carries the payload
        (u64 effect length, u32 ids...) and NBD_CMD_FLAG_PAYLOAD_LEN."""
        if context_ids is None:
            return self.request(NBD_CMD_BLOCK_STATUS, offset, length, flags)
        payload = struct.pack(">Q", length)
        for i in context_ids:
            payload += struct.pack(">I", i)
        return self.request(NBD_CMD_BLOCK_STATUS, offset, len(payload),
                            flags | NBD_CMD_FLAG_PAYLOAD_LEN, payload)

    def disconnect(self):
        """NBD_CMD_DISC (no reply), then close."""
        try:
            self.send_request(NBD_CMD_DISC, track=False)
        except OSError:
            pass
        self.close()
