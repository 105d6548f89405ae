# SPDX-License-Identifier: BSD-3-Clause
"""A server started as nbdkit -s is: the client's socket on its standard
input and output.  Serves one client through libnbd's connect_socket,
writes and reads, disconnects, and checks that the server then exits by
itself (nbdkit: "After stdin closes, the server exits").

usage: nbdkit_single.py SERVER-ARGV...   prints "size SIZE exit STATUS"
"""
import socket
import subprocess
import sys
import time

import nbd

ours, theirs = socket.socketpair()
p = subprocess.Popen(sys.argv[1:], stdin=theirs, stdout=theirs)
theirs.close()
h = nbd.NBD()
h.connect_socket(ours.detach())
size = h.get_size()
h.pwrite(b"single", 4096)
if h.pread(6, 4096) != b"single":
    sys.exit("read back differs")
h.shutdown()
deadline = time.monotonic() + 20
while p.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
if p.poll() is None:
    p.kill()
    sys.exit("the server did not exit after its client left")
print("size %d exit %d" % (size, p.returncode))
