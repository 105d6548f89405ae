#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""qcow2 metadata for tests, independent of blockport's own code.

  qcow2meta.py layout IMG          shell assignments: CS (cluster size),
                                   END (clusters in the file), L1, RT
                                   (refcount table), RB (first refcount
                                   block), L2 (L2 table of L1[0]), ESIZE
                                   (L2 entry size), SNAPT, SL1, SL2 (snapshot
                                   table, first snapshot's L1 and its first
                                   L2), BMDIR, BMT (bitmap directory, first
                                   bitmap table); 0 when absent
  qcow2meta.py poke IMG OFF=VAL... write 8-byte big-endian VALs at OFFs;
                                   VAL is numbers and names or-ed with |:
                                   COPIED (bit 63), ZERO (bit 0)
  qcow2meta.py same ORIG IMG [OFF+LEN...]
                                   exit 1, naming the differences, unless
                                   every cluster that held metadata in ORIG
                                   holds the same bytes in IMG, except the
                                   header's feature fields (incompatible,
                                   autoclear), the refcounts of clusters
                                   allocated since (past ORIG's end) and
                                   the byte ranges given
  qcow2meta.py sum IMG OFF         sha256 of the cluster at OFF
See qemu docs/interop/qcow2.rst for the layout."""
import hashlib
import struct
import sys

MASK = 0x00FFFFFFFFFFFE00


def be64(b, o):
    return struct.unpack_from(">Q", b, o)[0]


def be32(b, o):
    return struct.unpack_from(">I", b, o)[0]


class Image:
    def __init__(self, path):
        self.b = open(path, "rb").read()
        b = self.b
        self.version = be32(b, 4)
        self.cb = be32(b, 20)
        self.cs = 1 << self.cb
        self.l1_size, self.l1 = be32(b, 36), be64(b, 40)
        self.rt, self.rt_clusters = be64(b, 48), be32(b, 56)
        self.nb_snap, self.snapt = be32(b, 60), be64(b, 64)
        v3 = self.version >= 3
        self.incompat = be64(b, 72) if v3 else 0
        self.autoclear = be64(b, 88) if v3 else 0
        self.rc_order = be32(b, 96) if v3 else 4
        self.hdr_len = be32(b, 100) if v3 else 72
        self.esize = 16 if self.incompat & 16 else 8
        self.end = (len(b) + self.cs - 1) // self.cs

    def u64(self, off):
        return be64(self.b, off) if off + 8 <= len(self.b) else 0

    def table(self, off, n):
        """Cluster offsets held by N 8-byte entries at OFF."""
        out = []
        for i in range(n):
            e = self.u64(off + 8 * i) & MASK
            if e and e % self.cs == 0 and e < len(self.b):
                out.append(e)
        return out

    def snapshots(self):
        """[(l1 offset, l1 size)] and the table's length."""
        out, o = [], self.snapt
        for _ in range(self.nb_snap):
            l1, l1n = be64(self.b, o), be32(self.b, o + 8)
            idn, namen = struct.unpack_from(">HH", self.b, o + 12)
            extra = be32(self.b, o + 36)
            out.append((l1, l1n))
            o += (40 + extra + idn + namen + 7) & ~7
        return out, o - self.snapt

    def bitmaps(self):
        """(directory offset, size, [(table offset, entries)])."""
        if not self.autoclear & 1:
            return 0, 0, []
        o = self.hdr_len
        while o + 8 <= self.cs:
            t, n = be32(self.b, o), be32(self.b, o + 4)
            if t == 0:
                break
            if t == 0x23852875:
                nb = be32(self.b, o + 8)
                size, d = be64(self.b, o + 16), be64(self.b, o + 24)
                tabs, p = [], d
                for _ in range(nb):
                    tabs.append((be64(self.b, p), be32(self.b, p + 8)))
                    ns, ex = struct.unpack_from(">HI", self.b, p + 18)
                    p += (24 + ns + ex + 7) & ~7
                return d, size, tabs
            o += 8 + ((n + 7) & ~7)
        return 0, 0, []

    def in_use_flags(self):
        """File offsets of the byte holding each bitmap's IN_USE flag."""
        d, _, tabs = self.bitmaps()
        out, p = [], d
        for _ in tabs:
            out.append(p + 15)  # flags: big-endian u32 at 12, bit 0
            ns, ex = struct.unpack_from(">HI", self.b, p + 18)
            p += (24 + ns + ex + 7) & ~7
        return out

    def clusters(self, off, length):
        return range(off // self.cs, (off + max(length, 1) - 1) // self.cs + 1)

    def metadata(self):
        """{cluster index: what} for every cluster holding metadata."""
        m = {0: "header"}

        def add(off, length, what):
            for c in self.clusters(off, length):
                m.setdefault(c, what)

        add(self.l1, self.l1_size * 8, "L1")
        for l2 in self.table(self.l1, self.l1_size):
            add(l2, self.cs, "L2")
        add(self.rt, self.rt_clusters * self.cs, "refcount table")
        for rb in self.table(self.rt, self.rt_clusters * self.cs // 8):
            add(rb, self.cs, "refcount block")
        snaps, used = self.snapshots()
        if self.nb_snap:
            add(self.snapt, used, "snapshot table")
        for l1, n in snaps:
            add(l1, n * 8, "snapshot L1")
            for l2 in self.table(l1, n):
                add(l2, self.cs, "snapshot L2")
        d, size, tabs = self.bitmaps()
        if d:
            add(d, size, "bitmap directory")
        for t, n in tabs:
            add(t, n * 8, "bitmap table")
            for c in self.table(t, n):
                add(c, self.cs, "bitmap data")
        return m


def layout(path):
    im = Image(path)
    l2s = im.table(im.l1, im.l1_size)
    rbs = im.table(im.rt, im.rt_clusters * im.cs // 8)
    snaps, _ = im.snapshots()
    sl1 = snaps[0][0] if snaps else 0
    sl2 = im.table(sl1, snaps[0][1]) if snaps else []
    bmdir, _, tabs = im.bitmaps()
    v = dict(CS=im.cs, END=im.end, L1=im.l1, RT=im.rt,
             RB=rbs[0] if rbs else 0, L2=l2s[0] if l2s else 0,
             ESIZE=im.esize, SNAPT=im.snapt if im.nb_snap else 0, SL1=sl1,
             SL2=sl2[0] if sl2 else 0, BMDIR=bmdir,
             BMT=tabs[0][0] if tabs else 0)
    for k, x in v.items():
        print(f"{k}={x}")


NAMES = {"COPIED": 1 << 63, "ZERO": 1}


def poke(path, items):
    with open(path, "r+b") as f:
        for item in items:
            off, val = item.split("=")
            v = 0
            for part in val.split("|"):
                v |= NAMES[part] if part in NAMES else int(part, 0)
            f.seek(int(off, 0))
            f.write(struct.pack(">Q", v))


def refcounts_before(im, blk, end):
    """The refcount entries of BLK (one block) for clusters below END."""
    bits = 1 << im.rc_order
    per = im.cs * 8 // bits
    return blk[: min(per, end) * bits // 8] if bits >= 8 else blk


def blank(data, base, ranges):
    """DATA (file bytes from BASE) with RANGES [(off, len)] zeroed."""
    d = bytearray(data)
    for off, n in ranges:
        lo, hi = max(off - base, 0), min(off + n - base, len(d))
        if lo < hi:
            d[lo:hi] = bytes(hi - lo)
    return bytes(d)


def same(orig_path, path, allowed):
    ranges = [tuple(int(x, 0) for x in a.split("+")) for a in allowed]
    orig, now = Image(orig_path), Image(path)
    rbs = set(c * orig.cs for c, w in orig.metadata().items()
              if w == "refcount block")
    bad = []
    for c, what in sorted(orig.metadata().items()):
        a = blank(orig.b[c * orig.cs:(c + 1) * orig.cs], c * orig.cs, ranges)
        b = blank(now.b[c * orig.cs:(c + 1) * orig.cs], c * orig.cs, ranges)
        if c == 0:  # feature fields may change: corrupt bit, autoclear
            a, b = a[:72] + a[80:88] + a[96:], b[:72] + b[80:88] + b[96:]
        if what == "bitmap directory":
            # A writable open marks the bitmaps in use (as QEMU does); a
            # refused write leaves them so.  Nothing else may change.
            a, b = bytearray(a), bytearray(b)
            for f in orig.in_use_flags():
                if c * orig.cs <= f < (c + 1) * orig.cs:
                    a[f - c * orig.cs] &= 0xFE
                    b[f - c * orig.cs] &= 0xFE
            a, b = bytes(a), bytes(b)
        if c * orig.cs in rbs:
            # Index of this block in the table decides whose refcounts it
            # holds; new clusters (past ORIG's end) may gain refcounts.
            idx = orig.table(orig.rt, orig.rt_clusters * orig.cs // 8)
            first = idx.index(c * orig.cs) * (orig.cs * 8 >> orig.rc_order)
            end = max(orig.end - first, 0)
            a, b = refcounts_before(orig, a, end), refcounts_before(orig, b, end)
        if hashlib.sha256(a).digest() != hashlib.sha256(b).digest():
            bad.append(f"cluster {c} ({what}) changed")
    for line in bad:
        print(line)
    return 1 if bad else 0


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "layout":
        layout(args[0])
    elif cmd == "poke":
        poke(args[0], args[1:])
    elif cmd == "same":
        sys.exit(same(args[0], args[1], args[2:]))
    elif cmd == "sum":
        im = Image(args[0])
        off = int(args[1], 0) // im.cs * im.cs
        print(hashlib.sha256(im.b[off:off + im.cs]).hexdigest())
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
