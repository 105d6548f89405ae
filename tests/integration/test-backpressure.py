#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Back-pressure delays requests and never loses them.

A client may pipeline far more requests than --max-requests or
--max-inflight-bytes admit.  The server stops parsing at the limit, and
must start again, from what it already buffered, as soon as replies free
budget: the client may have sent everything it will send.  nbdload sends
thousands of requests (1 KiB and 1 MiB, reads and writes) past each limit,
on memory, raw and qcow2 exports, over Unix and TCP sockets and TLS, with
simple, structured and extended replies, and counts every reply and checks
every byte read.  Small reads are sent whole before the first reply is
read, as the NBD reference test client does.

Run:  BLOCKPORT=/path/to/blockport /usr/bin/python3 test-backpressure.py \
          [CASE...]
Exit status: 0 all passed, 1 any failure, 77 when BLOCKPORT is unusable.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import casetest  # noqa: E402
import nbdload  # noqa: E402
import nbdwire as nw  # noqa: E402
from casetest import Failure, Skip, check  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
BLOCKPORT = os.environ.get("BLOCKPORT", "")

# Small enough that every batch runs into them many times over.
LIMITS = {
    "max-requests": ["--max-requests", "8"],
    "max-inflight-bytes": ["--max-inflight-bytes", "64K"],
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """`blockport serve` of one export 'd', on a Unix socket or TCP."""

    def __init__(self, tmpdir, image, options, tcp=False):
        self.tmpdir = tmpdir
        self.image = image
        self.options = options
        self.tcp = tcp
        self.proc = None

    def start(self):
        for _ in range(5):
            if self._start_once():
                return self
        raise Failure("the server did not start: %s" % self.log_tail())

    def _start_once(self):
        self.sock = os.path.join(self.tmpdir, "s.sock")
        self.pidfile = os.path.join(self.tmpdir, "s.pid")
        self.logfile = os.path.join(self.tmpdir, "s.log")
        for f in (self.pidfile, self.sock):
            if os.path.exists(f):
                os.unlink(f)
        self.port = free_port() if self.tcp else None
        listen = (["--bind", "127.0.0.1", "--port", str(self.port)]
                  if self.tcp else ["--unix", self.sock])
        argv = ([BLOCKPORT, "serve"] + listen + ["--pid-file", self.pidfile] +
                self.options + ["d=" + self.image])
        self.log = open(self.logfile, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.exists(self.pidfile) and os.path.getsize(self.pidfile):
                return True
            if self.proc.poll() is not None:
                self.log.close()
                return False  # a TCP port taken meanwhile: try another
            time.sleep(0.02)
        raise Failure("no pid file after 10 s: %s" % self.log_tail())

    def log_tail(self, n=400):
        try:
            with open(self.logfile, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return "(no log)"

    def connect(self, style="simple", tls_ca=None):
        return nbdload.connect(unix=None if self.tcp else self.sock,
                               tcp=("127.0.0.1", self.port) if self.tcp
                               else None,
                               export="d", style=style, tls_ca=tls_ca)

    def stop(self):
        p, self.proc = self.proc, None
        if p is None:
            return 0
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        self.log.close()
        return rc


def batch(srv, what, ops, style="simple", order="send-first", tls_ca=None):
    """Run OPS on a fresh connection; every reply must come, error-free,
    with the right data."""
    c = srv.connect(style, tls_ca)
    try:
        res = nbdload.run(c.sock, ops, extended=style == "extended",
                          order=order, deadline=30)
    finally:
        nbdload.disconnect(c)
    if not res.ok:
        raise Failure("%s (%s replies, %s): %s; server log: %s"
                      % (what, style, order, res.summary(), srv.log_tail()))


def interleave(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def workload(srv, tls_ca=None):
    """Small writes, then small reads sent whole before any reply is read
    (in each reply style), then 1 MiB writes, then 1 MiB reads mixed with
    small writes, and those read back."""
    w, r = nbdload.writes, nbdload.reads
    batch(srv, "4096 writes of 1 KiB", w(0, KiB, 4096, seed=1),
          order="concurrent", tls_ca=tls_ca)
    for style in ("simple", "structured", "extended"):
        batch(srv, "4096 reads of 1 KiB", r(0, KiB, 4096, seed=1), style,
              tls_ca=tls_ca)
    batch(srv, "16 writes of 1 MiB", w(8 * MiB, MiB, 16, seed=2), "extended",
          order="concurrent", tls_ca=tls_ca)
    mixed = interleave(r(8 * MiB, MiB, 16, seed=2),
                       w(32 * MiB, KiB, 2048, seed=3))
    batch(srv, "16 reads of 1 MiB among 2048 writes of 1 KiB", mixed,
          "structured", order="concurrent", tls_ca=tls_ca)
    batch(srv, "2048 reads of 1 KiB", r(32 * MiB, KiB, 2048, seed=3),
          "extended", tls_ca=tls_ca)


def make_image(tmpdir, kind):
    if kind == "memory":
        return "memory:64M"
    path = os.path.join(tmpdir, "disk." + kind)
    if kind == "raw":
        with open(path, "wb") as f:
            f.truncate(64 * MiB)
        return path
    if not shutil.which("qemu-img"):
        raise Skip("qemu-img not found")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", path, "64M"],
                   check=True)
    return path


def run_workloads(tmpdir, kind, tcp):
    """Each limit on its own server; the raw and qcow2 requests go
    through the worker pool, memory ones complete inline."""
    for limit, opts in LIMITS.items():
        image = make_image(tmpdir, kind)
        srv = Server(tmpdir, image, opts + ["--workers", "4"], tcp).start()
        try:
            workload(srv)
        except Failure as e:
            raise Failure("%s: %s" % (limit, e))
        finally:
            rc = srv.stop()
        check(rc == 0, "%s: the server exited with status %r: %s"
              % (limit, rc, srv.log_tail()))
        if kind != "memory":
            os.unlink(image)


CASES = []


def case(fn):
    CASES.append((fn.__name__, fn))
    return fn


@case
def memory_unix(t):
    run_workloads(t, "memory", False)


@case
def memory_tcp(t):
    run_workloads(t, "memory", True)


@case
def raw_unix(t):
    run_workloads(t, "raw", False)


@case
def raw_tcp(t):
    run_workloads(t, "raw", True)


@case
def qcow2_unix(t):
    run_workloads(t, "qcow2", False)


@case
def qcow2_tcp(t):
    run_workloads(t, "qcow2", True)


def make_certs(t):
    """A CA and a server certificate for localhost; returns (dir for
    --tls-certs, the CA certificate)."""
    if not shutil.which("certtool"):
        raise Skip("certtool not found")
    d = os.path.join(t, "certs")
    os.mkdir(d)

    def tool(*args, template=None):
        if template:
            tpl = os.path.join(d, "tpl")
            with open(tpl, "w") as f:
                f.write("\n".join(template) + "\nexpiration_days = 2\n")
            args += ("--template", tpl)
        subprocess.run(["certtool"] + list(args), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    p = lambda name: os.path.join(d, name)  # noqa: E731
    tool("--generate-privkey", "--outfile", p("ca-key.pem"))
    tool("--generate-self-signed", "--load-privkey", p("ca-key.pem"),
         "--outfile", p("ca-cert.pem"),
         template=["cn = nbdload CA", "ca", "cert_signing_key"])
    tool("--generate-privkey", "--outfile", p("server-key.pem"))
    tool("--generate-certificate", "--load-privkey", p("server-key.pem"),
         "--load-ca-certificate", p("ca-cert.pem"),
         "--load-ca-privkey", p("ca-key.pem"), "--outfile",
         p("server-cert.pem"),
         template=["cn = localhost", "dns_name = localhost", "tls_www_server",
                   "encryption_key", "signing_key"])
    return d, p("ca-cert.pem")


@case
def tls_unix(t):
    """GnuTLS decrypts whole records: requests held back at the limit may
    sit in its buffer as well as in the server's."""
    casetest.require_feature(BLOCKPORT, "tls")
    certs, ca = make_certs(t)
    for limit, opts in LIMITS.items():
        srv = Server(t, "memory:64M",
                     opts + ["--tls", "on", "--tls-certs", certs]).start()
        try:
            workload(srv, tls_ca=ca)
        except Failure as e:
            raise Failure("%s: %s" % (limit, e))
        finally:
            rc = srv.stop()
        check(rc == 0, "%s: the server exited with status %r" % (limit, rc))


def run_case(fn):
    tmp = tempfile.mkdtemp(prefix="bp-backpressure-")
    try:
        fn(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if not casetest.blockport_usable(BLOCKPORT):
        return 77
    return casetest.run(CASES, argv, run_case,
                        expected=(nw.ProtocolError, nw.Closed, OSError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
