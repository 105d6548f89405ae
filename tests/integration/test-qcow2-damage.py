#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Damaged qcow2 images written through blockport and, on a twin copy,
through qemu-io (issue 32).

Each case makes an image with qemu-img/qemu-io, damages a few metadata bytes
as an attacker would, then runs the same operations (write, read, zero,
trim, flush) through `blockport serve` (writable, over NBD) and through
qemu-io on the twin.  Then:
  - blockport stays up and exits 0 on SIGTERM;
  - "same" cases: every operation ends as QEMU's does (ok, or the same
    errno; after QEMU's image turns unusable, ENOMEDIUM, nothing more is
    compared), and the corrupt bit (incompatible bit 1) is set on
    blockport's copy exactly when QEMU sets it on its own;
  - every case: no byte of guest data outside the damaged clusters and the
    ranges written changed (read back through qemu-nbd, QEMU's reader, so
    that blockport is not its own judge), reads with an expected pattern
    returned it, and `qemu-img check` finds no more corruptions on
    blockport's copy than on QEMU's.
Run: BLOCKPORT=/path/to/blockport /usr/bin/python3 test-qcow2-damage.py
[CASE...]"""
import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import casetest  # noqa: E402
from casetest import Failure, check, eq  # noqa: E402

BLOCKPORT = os.environ.get("BLOCKPORT", "")
CS = 65536
SIZE = 16 << 20
NCL = SIZE // CS
MASK = 0x00FFFFFFFFFFFE00
COPIED, COMPRESSED, ZERO = 1 << 63, 1 << 62, 1
M = 1 << 20
ERRNAMES = {os.strerror(e): name for e, name in errno.errorcode.items()}
TMP = None


def run(*args, ok=(0,)):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if ok is not None and p.returncode not in ok:
        raise Failure("%s: exit %d: %s" % (" ".join(args), p.returncode,
                                            p.stderr.strip()))
    return p


# ------------------------------------------------------------ base images

def make_bases():
    """The healthy images every case starts from, and their guest data."""
    d = os.path.join(TMP, "base")
    os.mkdir(d)
    img = os.path.join(d, "healthy.qcow2")
    run("qemu-img", "create", "-q", "-f", "qcow2", "-o",
        "cluster_size=%d" % CS, img, str(SIZE))
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 %d" % (2 * CS),
        "-c", "write -P 0x55 %d %d" % (5 * CS, CS),
        "-c", "write -P 0x64 %d %d" % (100 * CS, 2 * CS),
        "-c", "write -P 0xee %d %d" % (SIZE - CS, CS), img)
    ext = os.path.join(d, "extl2.qcow2")
    run("qemu-img", "create", "-q", "-f", "qcow2", "-o",
        "cluster_size=%d,extended_l2=on" % CS, ext, str(SIZE))
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 %d" % CS,
        "-c", "write -P 0x22 %d %d" % (2 * CS, CS),
        "-c", "write -P 0x33 %d 2048" % (3 * CS),
        "-c", "write -P 0x55 %d %d" % (5 * CS, CS), ext)
    # Compressed: data at 0 (256 KiB) and at 4 MiB (128 KiB), as issue 32.
    raw = os.path.join(d, "src.raw")
    text = b"blockport damaged image, compressible. " * 8000
    with open(raw, "wb") as f:
        f.truncate(SIZE)
        f.write(text[:256 * 1024])
        f.seek(4 * M)
        f.write(text[:128 * 1024])
    comp = os.path.join(d, "comp.qcow2")
    run("qemu-img", "convert", "-c", "-O", "qcow2", "-o",
        "cluster_size=%d" % CS, raw, comp)
    return {"healthy": img, "extl2": ext, "comp": comp}


def guest_data(img):
    raw = img + ".raw"
    if not os.path.exists(raw):
        run("qemu-img", "convert", "-O", "raw", img, raw)
    return open(raw, "rb").read()


# ------------------------------------------------------------ damage

class Qcow2:
    """Byte edits of one image file (docs/interop/qcow2.rst)."""

    def __init__(self, path):
        self.path = path
        self.b = bytearray(open(path, "rb").read())
        self.cb = self.u32(20)
        self.l1 = self.u64(40)
        self.rt = self.u64(48)
        self.ext = bool(self.u64(72) & 16)
        self.l2_bits = self.cb - (4 if self.ext else 3)
        self.size = len(self.b)

    def u32(self, o):
        return struct.unpack_from(">I", self.b, o)[0]

    def u64(self, o):
        return struct.unpack_from(">Q", self.b, o)[0]

    def put64(self, o, v):
        struct.pack_into(">Q", self.b, o, v & (2 ** 64 - 1))

    def l2_table(self):
        return self.u64(self.l1) & MASK

    def l2_pos(self, cluster):
        return self.l2_table() + (16 if self.ext else 8) * cluster

    def entry(self, cluster):
        return self.u64(self.l2_pos(cluster))

    def host(self, cluster):
        return self.entry(cluster) & MASK

    def set_entry(self, cluster, v):
        self.put64(self.l2_pos(cluster), v)

    def set_bitmap(self, cluster, v):
        self.put64(self.l2_pos(cluster) + 8, v)

    def rc_pos(self, host):
        """Byte offset of HOST's 16-bit refcount (the default width)."""
        per = (1 << self.cb) * 8 // 16
        c = host >> self.cb
        block = self.u64(self.rt + 8 * (c // per)) & ~0x1FF
        return block + 2 * (c % per)

    def set_refcount(self, host, v):
        struct.pack_into(">H", self.b, self.rc_pos(host), v)

    def compressed(self, off, sectors):
        x = 62 - (self.cb - 8)
        return COMPRESSED | (sectors << x) | off

    def save(self):
        with open(self.path, "r+b") as f:
            f.write(self.b)


# ------------------------------------------------------------ operations

def qemu_io_cmd(op):
    k = op[0]
    if k == "w":
        return "write -P 0x%x %d %d" % (op[3], op[1], op[2])
    if k == "r":
        pat = "-P 0x%x " % op[3] if len(op) > 3 else ""
        return "read %s%d %d" % (pat, op[1], op[2])
    if k == "z":
        return "write -z %d %d" % (op[1], op[2])
    if k == "t":
        return "discard %d %d" % (op[1], op[2])
    return "flush"


def run_qemu(img, ops):
    """The outcome of each op through qemu-io: "ok", "mismatch" or an
    errno name."""
    args = ["qemu-io", "-f", "qcow2"]
    for op in ops:
        args += ["-c", qemu_io_cmd(op)]
    lines = run(*args, img, ok=None).stdout.splitlines()
    out, i = [], 0
    for op in ops:
        got = "ok"
        if i < len(lines) and "failed" in lines[i] and ":" in lines[i]:
            msg = lines[i].split(":", 1)[1].strip()
            got = ERRNAMES.get(msg, msg)
            i += 1
        elif i < len(lines) and lines[i].startswith("Pattern verification"):
            got = "mismatch"
            i += 3
        elif op[0] != "f":
            i += 2  # "wrote/read N/N bytes at offset O" and the timing line
        out.append(got)
    return out


def serve(img, sock, pidfile, log):
    p = subprocess.Popen([BLOCKPORT, "serve", "-f", "qcow2", "--unix", sock,
                          "--pid-file", pidfile, img],
                         stdout=log, stderr=subprocess.STDOUT)
    up = casetest.wait_until(20, lambda: os.path.exists(pidfile) or
                             p.poll() is not None)
    check(up and p.poll() is None, "blockport serve did not start")
    return p


def bp_op(h, op):
    import nbd
    try:
        if op[0] == "w":
            h.pwrite(bytes([op[3]]) * op[2], op[1])
        elif op[0] == "r":
            got = h.pread(op[2], op[1])
            if len(op) > 3 and got != bytes([op[3]]) * op[2]:
                return "mismatch"
        elif op[0] == "z":
            h.zero(op[2], op[1])
        elif op[0] == "t":
            h.trim(op[2], op[1])
        else:
            h.flush()
    except nbd.Error as e:
        return e.errno or "error"
    return "ok"


def run_blockport(img, ops):
    import nbd
    sock, pidfile = img + ".sock", img + ".pid"
    logpath = img + ".log"
    with open(logpath, "w") as log:
        p = serve(img, sock, pidfile, log)
        try:
            h = nbd.NBD()
            h.connect_unix(sock)
            out = [bp_op(h, op) for op in ops]
            h.shutdown()
            check(p.poll() is None, "blockport exited during the operations")
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
    text = open(logpath).read()
    check("Sanitizer" not in text and "runtime error" not in text,
          "sanitizer report: " + text[-2000:])
    # The final flush of an image found corrupt fails, and says so.
    if rc != 0 and not (rc == 1 and "marking image as corrupt" in text):
        raise Failure("blockport exited %d: %s" % (rc, text[-1500:]))
    return out


# ------------------------------------------------------------ judging

def corrupt_bit(img):
    with open(img, "rb") as f:
        f.seek(72)
        return bool(struct.unpack(">Q", f.read(8))[0] & 2)


def read_clusters(img):
    """Each guest cluster as QEMU reads it (qemu-nbd, read-only), or None
    where the read fails."""
    import nbd
    sock, pidfile = img + ".qsock", img + ".qpid"
    run("qemu-nbd", "-r", "-f", "qcow2", "--fork", "-k", sock,
        "--pid-file", pidfile, img)
    out = []
    try:
        h = nbd.NBD()
        h.connect_unix(sock)
        for c in range(NCL):
            try:
                out.append(h.pread(CS, c * CS))
            except nbd.Error:
                out.append(None)
        h.shutdown()
    finally:
        try:
            os.kill(int(open(pidfile).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    return out


def expected(base, damaged, ops, results):
    """Guest data after OPS ended as RESULTS: None for clusters whose
    contents are not known (damaged and not rewritten whole, or touched by
    a failed write)."""
    model = [bytearray(base[c * CS:(c + 1) * CS]) for c in range(NCL)]
    known = [c not in damaged for c in range(NCL)]
    for op, res in zip(ops, results):
        if op[0] not in "wzt":
            continue
        off, n = op[1], op[2]
        for c in range(off // CS, (off + n - 1) // CS + 1):
            lo, hi = max(off, c * CS), min(off + n, (c + 1) * CS)
            if res != "ok" or op[0] == "t":  # trimmed: unspecified
                known[c] = False
                continue
            fill = op[3] if op[0] == "w" else 0
            model[c][lo - c * CS:hi - c * CS] = bytes([fill]) * (hi - lo)
            if hi - lo == CS:
                known[c] = True
    return [bytes(m) if k else None for m, k in zip(model, known)]


def check_json(img):
    p = run("qemu-img", "check", "--output=json", img, ok=None)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"check-errors": 1}


def verdict(j):
    """qemu-img check's verdict, worst last: clean, leaks, corruptions,
    check errors."""
    return (3 if j.get("check-errors") else 2 if j.get("corruptions") else
            1 if j.get("leaks") else 0)


def judge(case, base, bp_img, q_img, bp_res, q_res):
    names = [qemu_io_cmd(op) for op in case["ops"]]
    if case.get("same", True):
        for name, b, q in zip(names, bp_res, q_res):
            if q == "ENOMEDIUM":
                break  # QEMU's image is unusable after a fatal corruption
            eq(b, q, "%s: blockport vs QEMU" % name)
        eq(corrupt_bit(bp_img), corrupt_bit(q_img), "corrupt bit (QEMU's)")
    for name, b in zip(names, bp_res):
        check(b != "mismatch", "%s read other data than written" % name)
    want = expected(base, case["damaged"], case["ops"], bp_res)
    got = read_clusters(bp_img)
    for c in range(NCL):
        if want[c] is not None:
            check(got[c] is not None, "cluster %d: unreadable" % c)
            check(got[c] == want[c], "cluster %d changed (first bytes %s, "
                  "want %s)" % (c, got[c][:4].hex(), want[c][:4].hex()))
    bj, qj = check_json(bp_img), check_json(q_img)
    check(verdict(bj) <= verdict(qj),
          "qemu-img check: blockport's copy %s, QEMU's %s" % (bj, qj))
    print("#   %s: blockport %s, qemu %s, corruptions %s/%s" % (
        case["name"], bp_res, q_res, bj.get("corruptions", 0),
        qj.get("corruptions", 0)))


def run_case(case):
    d = tempfile.mkdtemp(dir=TMP)
    src = BASES[case.get("base", "healthy")]
    base = guest_data(src)
    bp_img, q_img = os.path.join(d, "bp.qcow2"), os.path.join(d, "q.qcow2")
    shutil.copy(src, bp_img)
    im = Qcow2(bp_img)
    case["damage"](im)
    im.save()
    shutil.copy(bp_img, q_img)
    q_res = run_qemu(q_img, case["ops"])
    bp_res = run_blockport(bp_img, case["ops"])
    judge(case, base, bp_img, q_img, bp_res, q_res)


# ------------------------------------------------------------ cases

def W(off, n, pat):
    return ("w", off, n, pat)


def R(off, n, pat=None):
    return ("r", off, n) if pat is None else ("r", off, n, pat)


F = ("f",)


def unaligned(c, flags=0):
    return lambda im: im.set_entry(c, im.entry(c) + 512 | flags)


def point(c, where, flags=COPIED):
    """Guest cluster C's data at the offset WHERE(im) returns."""
    return lambda im: im.set_entry(c, where(im) | flags)


def compressed_past_eof(im):
    # 255 extra sectors from 100 bytes before the end of the file.
    im.set_entry(0, im.compressed(im.size - 100, 255))


def huge_extent(im):
    e = im.entry(2)
    x = 62 - (im.cb - 8)
    im.set_entry(2, e | (((1 << (62 - x)) - 1) << x))


def refcount(c, v):
    return lambda im: im.set_refcount(im.host(c), v)


def compressed_over(c, where):
    """Guest cluster C compressed, its 64 KiB extent at WHERE(im)."""
    return lambda im: im.set_entry(c, im.compressed(where(im), 127))


END = lambda im: (im.size + CS - 1) // CS * CS  # noqa: E731
CASES = [
    # Issue 32's reproductions.
    dict(name="l2-data-unaligned", damage=unaligned(0), damaged={0},
         ops=[W(0, CS, 0xAA), R(CS, CS, 0x11), F]),
    dict(name="l2-zero-flag-unaligned", damage=unaligned(0, ZERO),
         damaged={0}, ops=[W(0, CS, 0xAA), R(CS, CS, 0x11), F]),
    dict(name="compressed-extent-past-eof", base="comp",
         damage=compressed_past_eof, damaged={0},
         ops=[W(0, CS, 0xAA), W(4 * M + 4096, 4096, 0xBB), F, R(0, CS, 0xAA),
              W(2 * CS, CS, 0xCC), ("z", 4 * M, CS), W(4 * M + CS, 4096, 0xDD),
              F, R(0, CS, 0xAA)]),
    dict(name="l2-data-far-past-eof", damage=point(5, lambda im: 1 << 40),
         damaged={5},
         ops=[R(5 * CS, CS, 0), W(5 * CS + 4096, 4096, 0xCC),
              R(5 * CS + 4096, 4096, 0xCC), R(5 * CS, 4096, 0),
              W(50 * CS, CS, 0xDD), F, R(50 * CS, CS, 0xDD)]),
    dict(name="extl2-alloc-and-zero", base="extl2",
         damage=lambda im: im.set_bitmap(0, 1 | 1 << 32 | 0xFFFFFFFF),
         damaged={0}, ops=[W(0, 2048, 0xAA), R(2 * CS, CS, 0x22), F]),
    dict(name="extl2-alloc-in-unallocated", base="extl2",
         damage=lambda im: im.set_bitmap(7, 1), damaged={7},
         ops=[W(7 * CS, 2048, 0xAA), R(2 * CS, CS, 0x22), F]),
    dict(name="l1-entry-unaligned",
         damage=lambda im: im.put64(im.l1, im.u64(im.l1) + 512),
         damaged=set(range(NCL)), ops=[R(0, 4096), W(5 * CS, 4096, 0xAA), F]),
    # Our own, chosen as an attacker would.
    dict(name="write-spans-bad-then-good", damage=unaligned(0), damaged={0},
         ops=[W(CS // 2, CS, 0xAA), R(CS + CS // 2, CS // 2, 0x11), F]),
    dict(name="write-spans-good-then-bad", damage=unaligned(1), damaged={1},
         ops=[W(CS // 2, CS, 0xAA), R(5 * CS, CS, 0x55), F]),
    dict(name="l2-reserved-bits", damage=lambda im: im.set_entry(
        0, im.entry(0) | 0x2), damaged={0}, same=False,
         ops=[W(0, 4096, 0xAA), R(CS, CS, 0x11), F]),
    dict(name="extl2-zero-flag-bit0", base="extl2", same=False,
         damage=lambda im: im.set_entry(2, im.entry(2) | 1), damaged={2},
         ops=[W(2 * CS, 2048, 0xAA), R(0, CS, 0x11), F]),
    dict(name="extl2-data-unaligned", base="extl2", damage=unaligned(2),
         damaged={2}, ops=[W(2 * CS + 4096, 4096, 0xAA), R(0, CS, 0x11), F]),
    dict(name="extl2-subcluster-write-unaligned", base="extl2",
         damage=unaligned(3), damaged={3},
         ops=[W(3 * CS + 4096, 2048, 0xAA), R(2 * CS, CS, 0x22), F]),
    dict(name="extl2-zero-bits-unallocated-valid", base="extl2",
         damage=lambda im: im.set_bitmap(9, 0xFFFFFFFF << 32), damaged=set(),
         ops=[R(9 * CS, CS, 0), W(9 * CS + 2048, 2048, 0xAA),
              R(9 * CS, 2048, 0), F]),
    dict(name="data-on-l1-table", damage=point(0, lambda im: im.l1),
         damaged={0}, ops=[W(0, 4096, 0xAA), R(5 * CS, CS, 0x55), F]),
    dict(name="data-on-refcount-block",
         damage=point(0, lambda im: im.rc_pos(0) & ~(CS - 1)), damaged={0},
         ops=[W(0, 4096, 0xAA), R(5 * CS, CS, 0x55), F]),
    dict(name="data-on-own-l2-table", damage=point(0, Qcow2.l2_table),
         damaged={0}, ops=[W(0, 4096, 0xAA), R(5 * CS, CS, 0x55), F]),
    dict(name="data-on-refcount-table", damage=point(0, lambda im: im.rt),
         damaged={0}, ops=[W(0, 4096, 0xAA), R(5 * CS, CS, 0x55), F]),
    # QEMU writes in place past the end, then allocates the same cluster
    # for new data; blockport must keep both.
    dict(name="data-just-past-eof", damage=point(5, END), damaged={5},
         same=False,
         ops=[W(5 * CS, 4096, 0xCC), W(50 * CS, CS, 0xDD), F,
              R(5 * CS, 4096, 0xCC), R(50 * CS, CS, 0xDD)]),
    # A compressed extent laid over another cluster's data: overwriting it
    # must not free that data for the next allocation.
    dict(name="compressed-over-live-data", same=False,
         damage=compressed_over(0, lambda im: im.host(5)), damaged={0},
         ops=[W(0, CS, 0xAA), F, W(60 * CS, CS, 0xDD), F, R(5 * CS, CS, 0x55),
              R(60 * CS, CS, 0xDD)]),
    dict(name="compressed-over-l1-table", same=False,
         damage=compressed_over(0, lambda im: im.l1), damaged={0},
         ops=[W(0, CS, 0xAA), F, W(60 * CS, CS, 0xDD), F,
              R(5 * CS, CS, 0x55)]),
    dict(name="compressed-over-header", same=False,
         damage=lambda im: im.set_entry(0, im.compressed(0x100, 127)),
         damaged={0}, ops=[W(0, CS, 0xAA), F, W(60 * CS, CS, 0xDD), F,
                           R(5 * CS, CS, 0x55)]),
    dict(name="compressed-extent-huge", base="comp", damage=huge_extent,
         damaged=set(), same=False,  # QEMU loses the write to cluster 2
         ops=[W(2 * CS, CS, 0xAA), W(4 * M, CS, 0xBB), F, R(4 * M, CS, 0xBB),
              R(2 * CS, CS, 0xAA), W(8 * M, CS, 0xCC), F]),
    dict(name="refcount-zero-live-cluster", damage=refcount(5, 0),
         damaged=set(), same=False,
         ops=[W(5 * CS, 4096, 0xCC), ("t", 5 * CS, CS), W(40 * CS, CS, 0xDD),
              F, R(CS, CS, 0x11), R(40 * CS, CS, 0xDD)]),
    dict(name="refcount-two-copied", damage=refcount(5, 2), damaged=set(),
         ops=[W(5 * CS, 4096, 0xCC), F, R(5 * CS, 4096, 0xCC)]),
    dict(name="copied-cleared", damage=lambda im: im.set_entry(
        5, im.entry(5) & ~COPIED), damaged=set(),
         ops=[W(5 * CS, 4096, 0xCC), F, R(5 * CS + 4096, 4096, 0x55)]),
    dict(name="zero-alloc-valid", damage=lambda im: im.set_entry(
        1, im.entry(1) | ZERO), damaged={1},
         ops=[R(CS, CS, 0), W(CS, 4096, 0xAA), R(CS + 4096, 4096, 0), F]),
    dict(name="l1-entry-past-eof", same=False,
         damage=lambda im: im.put64(im.l1, 1 << 40 | COPIED),
         damaged=set(range(NCL)), ops=[R(0, 4096), W(0, 4096, 0xAA), F]),
]


def header_exceeds_cluster():
    """header_length past the first cluster: refused, as QEMU refuses it."""
    d = tempfile.mkdtemp(dir=TMP)
    img = os.path.join(d, "h.qcow2")
    shutil.copy(BASES["healthy"], img)
    with open(img, "r+b") as f:
        f.seek(100)
        f.write(struct.pack(">I", CS + 8))
    q = run("qemu-io", "-f", "qcow2", "-c", "read 0 512", img, ok=None)
    check("exceeds cluster size" in q.stderr + q.stdout,
          "qemu-io: " + q.stderr)
    for args in (["serve", "-f", "qcow2", "--unix", img + ".s", img],
                 ["serve", "-r", "-f", "qcow2", "--unix", img + ".s", img],
                 ["check", img], ["info", img]):
        p = subprocess.run([BLOCKPORT] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=10)
        check(p.returncode not in (0, 2, 3) and p.returncode < 128,
              "%s: exit %d" % (args[0], p.returncode))
        check("cluster size" in p.stdout, "%s: %s" % (args[0], p.stdout))


def case_fn(case):
    return lambda: run_case(case)


def main():
    global TMP, BASES
    if not casetest.blockport_usable(BLOCKPORT):
        return 77
    for tool in ("qemu-img", "qemu-io", "qemu-nbd"):
        if not shutil.which(tool):
            print("SKIP: %s is not installed" % tool)
            return 77
    try:
        import nbd  # noqa: F401
    except ImportError:
        print("SKIP: python3-libnbd is not installed")
        return 77
    TMP = tempfile.mkdtemp(prefix="blockport-damage.")
    try:
        BASES = make_bases()
        cases = [(c["name"], case_fn(c)) for c in CASES]
        cases.append(("header-exceeds-cluster", header_exceeds_cluster))

        return casetest.run(cases, sys.argv[1:], lambda fn: fn())
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


BASES = {}
if __name__ == "__main__":
    sys.exit(main())
